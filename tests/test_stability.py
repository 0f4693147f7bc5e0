"""Statistics of repeated judging over judged records, pinned with hand-computed values."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from judge.analysis.stability import (
    StabilityReport,
    by_engine,
    human_agreement,
    krippendorff_alpha,
    majority_vote,
    metric_stability,
    passage_flips,
    stability_report,
)
from judge.errors import InputError
from judge.schema import JudgedQuery, Passage, Query, Scale, Verdict, VerdictStatus

BINARY = Scale.binary()
GRADED = Scale.graded()
NAN = math.nan


def verdict(
    pid: str, rank: int, grade: int | str, scale: Scale = GRADED, prob: float | None = None
) -> Verdict:
    """An ok verdict for an int grade; 'error' / 'unparsed' for a failed one."""
    if isinstance(grade, str):
        status: VerdictStatus = "error" if grade == "error" else "unparsed"
        return Verdict(passage_id=pid, rank=rank, status=status)
    return Verdict(
        passage_id=pid,
        rank=rank,
        status="ok",
        label=scale.by_grade(grade).name,
        grade=grade,
        relevant=scale.relevant(grade),
        probability=prob,
    )


def judged(
    qid: str,
    repeat: int,
    grades: dict[str, int | str],
    *,
    engine: str = "e1",
    scale: Scale = GRADED,
    metrics: dict[str, float | None] | None = None,
    labels: dict[str, int] | None = None,
    probs: dict[str, float] | None = None,
) -> JudgedQuery:
    query = Query(
        query_id=qid,
        query=f"question {qid}",
        engine=engine,
        passages=tuple(Passage(id=pid, text=f"text {pid}") for pid in grades),
        labels=labels,
    )
    verdicts = tuple(
        verdict(pid, rank, g, scale, (probs or {}).get(pid))
        for rank, (pid, g) in enumerate(grades.items(), start=1)
    )
    return JudgedQuery(
        query=query, repeat=repeat, scale=scale.name, verdicts=verdicts, metrics=metrics or {}
    )


def metric_rows(
    values: Mapping[str, Sequence[float | None]], engine: str = "e1"
) -> list[JudgedQuery]:
    """One row per (query, repeat) carrying only the metric ``ap``."""
    return [
        judged(qid, r, {"p": 1}, engine=engine, metrics={"ap": v})
        for qid, per_repeat in values.items()
        for r, v in enumerate(per_repeat)
    ]


# --- metric stability ----------------------------------------------------------------------


def test_metric_stability_hand_values() -> None:
    rows = metric_rows(
        {"q1": [1.0, 0.5, 1.0], "q2": [0.5, 0.5, 0.5], "q3": [None, None, 0.0], "q4": [None] * 3}
    )
    stats = metric_stability(rows, ["ap"])["ap"]
    assert stats.engine == "e1"
    assert stats.repeats == (0, 1, 2)
    assert stats.per_repeat == pytest.approx((0.75, 0.5, 0.5))
    # Over queries, each its mean over the repeats defining it (the CI's, and judge compare's):
    # q3, defined once, weighs as much as q1; the repeats' means' mean, 0.5833, had not.
    assert stats.mean == pytest.approx((2.5 / 3 + 0.5 + 0.0) / 3)
    assert stats.std == pytest.approx(math.sqrt((1 / 36 + 2 / 144) / 2))
    assert (stats.min, stats.max) == (0.5, 0.75)
    assert stats.max_rel_diff == pytest.approx(1 / 3)
    assert (stats.n_defined, stats.n_partial, stats.n_undefined) == (3, 1, 1)


def test_relative_difference_with_zero_means() -> None:
    both_zero = metric_stability(metric_rows({"q": [0.0, 0.0]}), ["ap"])["ap"]
    assert both_zero.max_rel_diff == 0.0
    one_zero = metric_stability(metric_rows({"q": [0.0, 0.4]}), ["ap"])["ap"]
    assert one_zero.max_rel_diff == pytest.approx(1.0)


def test_bootstrap_ci_reproducible_contains_mean_and_has_normal_width() -> None:
    rng = np.random.default_rng(3)
    values = {f"q{i}": [float(v)] * 2 for i, v in enumerate(rng.random(40))}
    rows = metric_rows(values)
    first = metric_stability(rows, ["ap"], n_boot=4000, seed=11)["ap"]
    again = metric_stability(rows, ["ap"], n_boot=4000, seed=11)["ap"]
    other = metric_stability(rows, ["ap"], n_boot=4000, seed=12)["ap"]
    assert first == again
    assert (first.ci_low, first.ci_high) != (other.ci_low, other.ci_high)
    assert first.ci_low is not None and first.ci_high is not None and first.mean is not None
    assert first.ci_low < first.mean < first.ci_high
    per_query = np.array([v[0] for v in values.values()])
    normal_width = 2 * 1.96 * per_query.std(ddof=1) / math.sqrt(per_query.size)
    assert first.ci_high - first.ci_low == pytest.approx(normal_width, rel=0.15)


def test_single_repeat_has_zero_spread() -> None:
    stats = metric_stability(metric_rows({"q1": [0.2], "q2": [0.6]}), ["ap", "ndcg"])
    assert stats["ap"].std == 0.0
    assert stats["ap"].max_rel_diff == 0.0
    assert stats["ap"].mean == pytest.approx(0.4)
    missing = stats["ndcg"]
    assert missing.mean is None and missing.ci_low is None and missing.n_undefined == 2


def test_metric_stability_refuses_mixed_engines_and_by_engine_splits() -> None:
    rows = metric_rows({"q": [0.1]}, engine="b") + metric_rows({"q": [0.3]}, engine="a")
    with pytest.raises(ValueError, match="one engine"):
        metric_stability(rows, ["ap"])
    groups = by_engine(rows)
    assert list(groups) == ["a", "b"]
    assert metric_stability(groups["a"], ["ap"])["ap"].mean == pytest.approx(0.3)


# --- flips and majority vote ----------------------------------------------------------------


def test_flip_rate_and_pairwise_disagreement() -> None:
    rows = [
        judged("q1", 0, {"a": 3, "b": 2, "c": 0, "d": 1}),
        judged("q1", 1, {"a": 3, "b": 3, "c": 2, "d": "error"}),
        judged("q1", 2, {"a": 3, "b": 3, "c": "unparsed", "d": "error"}),
    ]
    flips = passage_flips(rows, GRADED)
    assert (flips.n_passages, flips.n_single, flips.n_flipped) == (3, 1, 2)
    assert flips.flip_rate == pytest.approx(2 / 3)
    # a: 0, b: 1 - 2/6, c: 1.
    assert flips.pairwise_disagreement == pytest.approx((0 + 2 / 3 + 1) / 3)
    # Only c crosses the relevance threshold (2); b moves between 2 and 3.
    assert flips.relevance_flip_rate == pytest.approx(1 / 3)
    top = flips.most_unstable
    assert [p.passage_id for p in top] == ["c", "b"]
    assert top[0].grades == {0: 1, 2: 1} and top[0].n_failed == 1
    assert top[1].grades == {2: 1, 3: 2}


def test_flips_with_one_repeat_or_identical_labels() -> None:
    single = passage_flips([judged("q", 0, {"a": 1, "b": 0}, scale=BINARY)])
    assert single.n_passages == 0 and single.flip_rate is None and single.n_single == 2
    same = [judged("q", r, {"a": 1, "b": 0}, scale=BINARY) for r in range(3)]
    stable = passage_flips(same)
    assert stable.flip_rate == 0.0 and stable.pairwise_disagreement == 0.0
    assert stable.most_unstable == ()


def test_majority_vote_breaks_ties_low_and_averages_probabilities() -> None:
    rows = [
        judged("q", 0, {"a": 1, "b": 1, "c": "error"}, scale=BINARY, probs={"a": 0.9, "b": 0.7}),
        judged("q", 1, {"a": 1, "b": 0, "c": "unparsed"}, scale=BINARY, probs={"a": 0.7}),
        judged("q", 2, {"a": 0, "b": 1, "c": "error"}, scale=BINARY),
        judged("q", 3, {"a": 1, "b": 0, "c": "error"}, scale=BINARY, probs={"b": 0.1}),
    ]
    [vote] = majority_vote(rows)
    assert vote.repeat == 0 and vote.metrics == {}
    a, b, c = vote.verdicts
    assert (a.grade, a.label, a.relevant) == (1, "yes", True)
    assert a.probability == pytest.approx(0.8)
    assert (b.grade, b.label, b.relevant) == (0, "no", False)
    assert b.reason is not None and "tie" in b.reason
    assert b.probability == pytest.approx(0.4)
    assert c.status == "unparsed" and c.grade is None


def test_majority_vote_recomputes_requested_metrics() -> None:
    rows = [judged("q", r, {"a": g, "b": 0}, scale=BINARY) for r, g in enumerate([1, 1, 0])]
    [vote] = majority_vote(rows, ["precision@2", "mrr"], BINARY)
    assert vote.metrics == {"precision@2": pytest.approx(0.5), "mrr": pytest.approx(1.0)}
    with pytest.raises(ValueError, match="scale"):
        majority_vote(rows, ["mrr"])


# --- agreement with humans -----------------------------------------------------------------


def _binary_labelled() -> list[JudgedQuery]:
    labels = {"p1": 1, "p2": 1, "p3": 0, "p4": 0}
    return [
        judged(
            "q",
            0,
            {"p1": 1, "p2": 0, "p3": 0, "p4": 1},
            scale=BINARY,
            labels=labels,
            probs={"p1": 0.9, "p2": 0.4, "p3": 0.2, "p4": 0.6},
        ),
        judged(
            "q",
            1,
            {"p1": 1, "p2": 1, "p3": 0, "p4": "error"},
            scale=BINARY,
            labels=labels,
            probs={"p1": 0.8, "p2": 0.6, "p3": 0.1},
        ),
    ]


def test_binary_agreement_per_judgement_and_majority() -> None:
    agreement = human_agreement(_binary_labelled(), BINARY)
    assert agreement is not None
    each = agreement.per_judgement
    assert agreement.n_failed == 1 and each.n == 7
    assert each.labels == ("no", "yes")
    assert each.confusion == ((2, 1), (1, 3))
    assert each.accuracy == pytest.approx(5 / 7)
    assert each.kappa == pytest.approx(10 / 24)
    assert each.relevance_kappa == pytest.approx(10 / 24)
    # positives .9 .4 .8 .6 vs negatives .2 .6 .1: 3 + 2 + 3 + 2.5 wins of 12.
    assert each.auc == pytest.approx(10.5 / 12)
    vote = agreement.majority
    assert vote.n == 4 and vote.confusion == ((1, 1), (1, 1))
    assert vote.kappa == pytest.approx(0.0)
    # Mean probabilities: positives .85 .5 vs negatives .15 .6.
    assert vote.auc == pytest.approx(3 / 4)


def test_graded_agreement_weighted_kappa_and_relevance() -> None:
    labels = {"a": 3, "b": 2, "c": 0, "d": 1}
    rows = [judged("q", 0, {"a": 3, "b": 3, "c": 0, "d": 0}, labels=labels)]
    agreement = human_agreement(rows, GRADED)
    assert agreement is not None
    stats = agreement.per_judgement
    assert stats.labels == ("unrelated", "related", "partial", "answers")
    assert stats.confusion[2][3] == 1 and stats.confusion[1][0] == 1
    assert stats.accuracy == pytest.approx(0.5)
    assert stats.kappa == pytest.approx(1 / 3)
    assert stats.weighted_kappa == pytest.approx(2 / 3)
    assert stats.relevance_accuracy == 1.0 and stats.relevance_kappa == pytest.approx(1.0)
    assert stats.auc is None and stats.n_with_probability == 0


def test_agreement_none_without_labels_and_rejects_off_scale_grades() -> None:
    assert human_agreement([judged("q", 0, {"a": 1})], GRADED) is None
    bad = [judged("q", 0, {"a": 1}, labels={"a": 7})]
    with pytest.raises(InputError, match="not on scale"):
        human_agreement(bad, GRADED)


# --- the bundled report ---------------------------------------------------------------------


def test_stability_report_per_engine_and_round_trips_json() -> None:
    rows = _binary_labelled() + [
        judged("q", r, {"x": g, "y": 0}, engine="e2", scale=BINARY, metrics={"mrr": m})
        for r, (g, m) in enumerate([(1, 1.0), (0, None), (1, 1.0)])
    ]
    report = stability_report(rows, ["mrr"], BINARY, n_boot=200, seed=5)
    assert report.alpha_level == "nominal"
    assert list(report.engines) == ["e1", "e2"]
    e1, e2 = report.engines["e1"], report.engines["e2"]
    assert e1.majority_ties == 1 and e1.agreement is not None and e2.agreement is None
    assert e2.metrics["mrr"].per_repeat == (1.0, None, 1.0)
    assert e2.flips.n_flipped == 1 and e2.n_repeats == 3
    # Units in first-seen order: e1's p1..p4 (two repeats), then e2's x and y.
    pooled = np.array([[1, 1, NAN], [0, 1, NAN], [0, 0, NAN], [1, NAN, NAN], [1, 0, 1], [0, 0, 0]])
    assert report.alpha == pytest.approx(krippendorff_alpha(pooled, "nominal"))
    assert StabilityReport.model_validate_json(report.model_dump_json()) == report


def test_stability_report_uses_ordinal_alpha_for_graded_and_checks_scale() -> None:
    rows = [judged("q", r, {"a": 3, "b": g}) for r, g in enumerate([0, 1])]
    report = stability_report(rows, [], GRADED, n_boot=10)
    assert report.alpha_level == "ordinal"
    # Units a (3, 3) and b (0, 1): n_0, n_1, n_3 = 1, 1, 2 (n = 4); observed o_01 = o_10 = 1.
    # Ordinal delta^2: (0,1) = (2 - 1)^2 = 1, (0,3) = (4 - 1.5)^2, (1,3) = (3 - 1.5)^2.
    expected = 2 * (1 * 1 * 1.0 + 1 * 2 * 2.5**2 + 1 * 2 * 1.5**2)
    assert report.alpha == pytest.approx(1 - 3 * 2 / expected)
    with pytest.raises(InputError, match="scale"):
        stability_report(rows, [], BINARY)
