"""Real remote APIs, for a developer with a key. Skipped without one (and in CI, which has
none and no network). These never run against anything but the provider named."""

from __future__ import annotations

import os

import pytest

from judge.judging.judge import Judge

QUERY = "what are the signs of anaemia in puppies?"
PASSAGES = [
    "Anaemic puppies have pale gums, tire quickly and breathe fast.",
    "Our shop sells dog collars in twelve colours.",
]


def needs(variable: str) -> None:
    if not os.environ.get(variable):
        pytest.skip(f"live test: set {variable} to run it")


@pytest.mark.live
def test_openai_judges_an_obvious_pair() -> None:
    needs("OPENAI_API_KEY")
    with Judge(
        provider="openai", model=os.environ.get("JUDGE_LIVE_OPENAI_MODEL", "gpt-4o-mini")
    ) as j:
        jq = j.judge(QUERY, PASSAGES)
    assert [v.status for v in jq.verdicts] == ["ok", "ok"]
    assert [v.label for v in jq.verdicts] == ["yes", "no"]
    assert jq.verdicts[0].probability is not None and jq.verdicts[0].probability > 0.5


@pytest.mark.live
def test_dashscope_native_judges_an_obvious_pair_in_chinese() -> None:
    needs("DASHSCOPE_API_KEY")
    with Judge(provider="dashscope", model="qwen-plus", language="zh", scale="graded") as j:
        jq = j.judge("小狗贫血的表现", ["幼犬贫血时牙龈苍白、容易疲倦。", "今天天气晴朗。"])
    assert [v.status for v in jq.verdicts] == ["ok", "ok"]
    grades = [v.grade for v in jq.verdicts]
    assert grades[0] is not None and grades[1] is not None and grades[0] > grades[1]
