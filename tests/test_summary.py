"""summary.json: majority-vote metrics, counts and the threshold checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from judge.config import load_config
from judge.metrics import metrics_for_queries
from judge.schema import JudgedQuery, Passage, Query, Scale, Verdict
from judge.summary import build_summary

BINARY = Scale.binary()
QUERY = Query(
    query_id="q",
    query="x",
    engine="e",
    passages=tuple(Passage(id=f"p{i}", text=f"t{i}") for i in range(3)),
)


def judged(grades: list[int | None], repeat: int) -> JudgedQuery:
    verdicts = tuple(
        Verdict(passage_id=f"p{i}", rank=i + 1, status="error", error="boom")
        if g is None
        else Verdict(
            passage_id=f"p{i}",
            rank=i + 1,
            status="ok",
            label="yes" if g else "no",
            grade=g,
            relevant=bool(g),
        )
        for i, g in enumerate(grades)
    )
    metrics = metrics_for_queries(["ap", "relevancy_mean"], [(QUERY, verdicts)], BINARY)[0]
    return JudgedQuery(
        query=QUERY, repeat=repeat, scale="binary", verdicts=verdicts, metrics=metrics
    )


def test_majority_vote_metrics_across_repeats() -> None:
    config = load_config(None, {"metrics.names": ["ap", "relevancy_mean"]})
    results = [judged([1, 0, 1], 0), judged([1, 1, 0], 1), judged([1, 0, 0], 2)]
    summary = build_summary(config, results, n_boot=50)
    vote = summary["engines"]["e"]["majority_vote"]
    # Votes per passage: p0 3x yes, p1 1 of 3, p2 1 of 3 -> [yes, no, no].
    assert vote["ap"] == pytest.approx(1.0)
    assert vote["relevancy_mean"] == pytest.approx(1 / 3)
    # The per-repeat mean differs from the vote: (5/6 + 1 + 1) / 3 for ap.
    assert summary["engines"]["e"]["metrics"]["ap"]["mean"] == pytest.approx((5 / 6 + 1 + 1) / 3)
    assert summary["counts"]["verdicts"] == 9 and summary["counts"]["ok"] == 9


def test_thresholds_min_drop_and_error_rate(tmp_path: Path) -> None:
    baseline = tmp_path / "base.json"
    baseline.write_text(
        json.dumps({"engines": {"e": {"metrics": {"ap": {"mean": 1.0}}}}}), encoding="utf-8"
    )
    config = load_config(
        None,
        {
            "metrics.names": ["ap", "relevancy_mean"],
            "thresholds.min": {"relevancy_mean": 0.9},
            "thresholds.max_drop": {"ap": 0.05},
            "thresholds.baseline": str(baseline),
            "thresholds.max_error_rate": 0.1,
        },
    )
    summary = build_summary(config, [judged([0, 1, None], 0)], n_boot=50)
    breached = {c["check"] for c in summary["thresholds"]["breaches"]}
    # 1 error in 3 verdicts > 10%; relevancy_mean undefined (< 0.9 fails); ap undefined vs 1.0.
    assert breached == {"error_rate", "min relevancy_mean", "drop ap"}


def test_missing_baseline_is_noted_not_fatal(tmp_path: Path) -> None:
    config = load_config(
        None,
        {
            "metrics.names": ["ap"],
            "thresholds.max_drop": {"ap": 0.05},
            "thresholds.baseline": str(tmp_path / "nope.json"),
        },
    )
    summary = build_summary(config, [judged([1, 0, 1], 0)], n_boot=50)
    notes = [c for c in summary["thresholds"]["checks"] if c["check"] == "baseline"]
    assert notes and "not found" in notes[0]["note"]
    assert summary["thresholds"]["breached"] == 0
