"""Reasons that match verdicts: what the relevance templates ask a reason to say, and the
stance reader bench/bench_reasons.py measures reason/verdict consistency with."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

from judge.judging.prompts import load_template
from judge.schema import Passage, Scale

BENCH = Path(__file__).resolve().parents[1] / "bench"
RELEVANCE = [
    f"{scale}.{mode}.{lang}.j2"
    for scale in ("binary", "graded")
    for mode in ("pointwise", "listwise")
    for lang in ("en", "zh")
]
REASON_LINE = {"en": "answers the query, or what it lacks, and agrees with", "zh": "或缺少什么"}


@pytest.fixture(scope="module")
def reader() -> ModuleType:
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(BENCH))
        return importlib.import_module("bench_reasons")


def system(name: str, **options: object) -> str:
    template = load_template(name, mark="^")
    scale = Scale.binary() if name.startswith("binary") else Scale.graded()
    passage = Passage(id="1", text="Paris is the capital of France.")
    if ".pointwise." in name:
        messages = template.render_pointwise("capital of france", passage, scale, **options)
    else:
        messages = template.render_listwise("capital of france", [passage], scale, **options)
    return messages[0].content


@pytest.mark.parametrize("name", RELEVANCE)
@pytest.mark.parametrize("verdict_first", [False, True])
def test_a_reason_is_told_to_say_how_the_passage_answers_and_to_agree(
    name: str, verdict_first: bool
) -> None:
    """The 0.5B judge's reasons said "does not provide..." beside "yes", and in Chinese talked
    about instructions: every relevance template says what a reason is for, after the
    untrusted-data line and before the answer's shape."""
    text = system(name, verdict_first=verdict_first)
    line = REASON_LINE[name.split(".")[2]]
    assert line in text
    untrusted = text.index("不可信" if name.endswith(".zh.j2") else "ntrusted data")
    assert untrusted < text.index(line) < text.index('"reason"')


@pytest.mark.parametrize("name", RELEVANCE)
def test_without_reasons_nothing_is_said_about_them(name: str) -> None:
    assert REASON_LINE[name.split(".")[2]] not in system(name, reasons=False)


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
