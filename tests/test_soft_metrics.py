"""Soft metrics from P(relevant): exact expectations where the formula says so (checked by
enumerating every outcome), the thresholded metrics when probabilities are 0/1, undefined
without probabilities; and the relevance threshold on P(relevant)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from judge.errors import ConfigError
from judge.metrics.compute import compute_label_free, metrics_for_queries
from judge.metrics.soft import soft_ap, soft_ndcg, soft_precision
from judge.schema import MetricPolicy, Passage, Query, Scale, Verdict

P = [0.9, 0.2, 0.6, 0.0, 0.7]


def _outcomes(p: list[float]) -> list[tuple[tuple[int, ...], float]]:
    """Every relevance outcome of independent Bernoulli(p_i) passages, with its probability."""
    out = []
    for rel in itertools.product((0, 1), repeat=len(p)):
        weight = float(np.prod([pi if r else 1 - pi for r, pi in zip(rel, p, strict=True)]))
        out.append((rel, weight))
    return out


def _row(p: list[float]) -> tuple[np.ndarray, np.ndarray]:
    probs = np.array([p], dtype=np.float64)
    return probs, np.ones_like(probs, dtype=bool)


@pytest.mark.parametrize("k", [None, 1, 3, 7])
def test_soft_precision_is_the_exact_expected_precision(k: int | None) -> None:
    expected = 0.0
    for rel, w in _outcomes(P):
        top = rel[:k]
        expected += w * sum(top) / (k if k is not None else len(rel))
    assert soft_precision(*_row(P), k)[0] == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("k", [None, 2, 4])
def test_soft_ap_is_the_ratio_of_expectations(k: int | None) -> None:
    # E[sum_{i<=k} rel_i P@i] / E[R], by enumeration.
    num = den = 0.0
    for rel, w in _outcomes(P):
        hits = np.cumsum(rel)
        num += w * sum(rel[i] * hits[i] / (i + 1) for i in range(len(rel))[:k])
        den += w * sum(rel)
    assert soft_ap(*_row(P), k)[0] == pytest.approx(num / den, abs=1e-12)


def test_hand_computed_values() -> None:
    p = [0.5, 1.0]
    # soft AP = [0.5*(1+0)/1 + 1.0*(1+0.5)/2] / 1.5 = (0.5 + 0.75) / 1.5
    assert soft_ap(*_row(p), None)[0] == pytest.approx(1.25 / 1.5)
    # soft nDCG = (0.5 + 1/log2 3) / (1 + 0.5/log2 3)
    l3 = np.log2(3)
    assert soft_ndcg(*_row(p), None)[0] == pytest.approx((0.5 + 1 / l3) / (1 + 0.5 / l3))


def test_zero_one_probabilities_give_the_thresholded_metrics() -> None:
    rng = np.random.default_rng(7)
    grades = rng.integers(0, 2, size=(200, 9)).astype(np.float64)
    lengths = rng.integers(0, 10, size=200)
    inside = np.arange(9) < lengths[:, None]
    grades = np.where(inside, grades, np.nan)
    names = ["ap", "ap@3", "ndcg", "ndcg@5", "precision@5", "precision"]
    soft = ["soft_" + n for n in names]
    hard = compute_label_free(names, grades, lengths, max_grade=1, threshold=1)
    got = compute_label_free(soft, grades, lengths, max_grade=1, threshold=1, probabilities=grades)
    for n, s in zip(names, soft, strict=True):
        np.testing.assert_allclose(got[s], hard[n], atol=1e-12, equal_nan=True)


def _verdicts(probs: list[float | None], labels: list[str]) -> list[Verdict]:
    scale = Scale.binary()
    out = []
    for i, (p, label) in enumerate(zip(probs, labels, strict=True), start=1):
        grade = scale.snap(label).grade  # type: ignore[union-attr]
        out.append(
            Verdict(
                passage_id=f"p{i}",
                rank=i,
                status="ok",
                label=label,
                grade=grade,
                relevant=grade == 1,
                probability=p,
            )
        )
    return out


QUERY = Query(
    query_id="q", query="x", passages=tuple(Passage(id=f"p{i}", text="t") for i in (1, 2, 3))
)


def test_soft_metrics_are_undefined_without_every_probability() -> None:
    verdicts = _verdicts([0.8, None, 0.3], ["yes", "no", "no"])
    row = metrics_for_queries(["soft_ap", "ap"], [(QUERY, verdicts)], Scale.binary())[0]
    assert row["soft_ap"] is None and row["ap"] == 1.0


def test_relevance_threshold_decides_relevance_from_the_probability() -> None:
    # The judge said yes to all three, but only the first was likely relevant.
    verdicts = _verdicts([0.9, 0.55, 0.52], ["yes", "yes", "yes"])
    names = ["precision", "ap"]
    plain = metrics_for_queries(names, [(QUERY, verdicts)], Scale.binary())[0]
    cut = MetricPolicy(relevance_threshold=0.6)
    strict = metrics_for_queries(names, [(QUERY, verdicts)], Scale.binary(), cut)[0]
    assert plain["precision"] == 1.0
    assert strict["precision"] == pytest.approx(1 / 3) and strict["ap"] == 1.0
    with pytest.raises(ConfigError, match="binary scale"):
        metrics_for_queries(names, [(QUERY, verdicts)], Scale.graded(), cut)


def test_reranker_scores_feed_only_the_rerank_metrics() -> None:
    """With a reranker beside the judge, rerank_* come from its scores, while the soft
    metrics and a relevance threshold keep using the judge's own P(relevant)."""
    verdicts = _verdicts([0.9, 0.2, 0.7], ["yes", "no", "yes"])
    passage_ids = [v.passage_id for v in verdicts]
    scores = dict(zip(passage_ids, [0.1, 0.95, 0.3], strict=True))
    names = ["rerank_max", "soft_precision", "precision"]
    cut = MetricPolicy(relevance_threshold=0.8)
    (row,) = metrics_for_queries(names, [(QUERY, verdicts)], Scale.binary(), cut, [scores])
    assert row["rerank_max"] == pytest.approx(0.95)
    assert row["soft_precision"] == pytest.approx((0.9 + 0.2 + 0.7) / 3)
    assert row["precision"] == pytest.approx(1 / 3)  # only 0.9 passes the 0.8 cut
    # Without the reranker's scores for a query, rerank_* fall back to the judge's.
    (alone,) = metrics_for_queries(names, [(QUERY, verdicts)], Scale.binary(), cut, [None])
    assert alone["rerank_max"] == pytest.approx(0.9)
