"""The stance reader bench/bench_reasons.py measures reason/verdict consistency with."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def reader() -> ModuleType:
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(BENCH))
        return importlib.import_module("bench_reasons")


@pytest.mark.parametrize(
    ("reason", "stance"),
    [
        ("The passage clearly states that Paris is the capital.", "relevant"),
        ("It explains how long to boil an egg.", "relevant"),
        ("The passage does not provide the boiling time.", "not_relevant"),
        ("Irrelevant: it is about football.", "not_relevant"),
        ("The passage only mentions eggs in passing.", "not_relevant"),
        ("The passage contains no instructions to the judge.", "instructions"),
        ("文本介绍了长城的长度。", "relevant"),
        ("文本中没有提及高血压的症状", "not_relevant"),
        ("这段文本与查询无关", "not_relevant"),
        ("文本中没有指令，", "instructions"),
        # A reason quoting the passage copies its datamarks: that is no talk of instructions.
        ("光合作用的产物是有机肥料和^有机蔬菜。", "unclear"),
        ("", "unclear"),
        ("The passage", "unclear"),
    ],
)
def test_the_stance_reader(reader: ModuleType, reason: str, stance: str) -> None:
    assert reader.stance(reason) == stance
