"""Ranking metrics as pure numpy functions over padded matrices, one pass for all queries.

Ranked lists are held as an ``n_queries x width`` float matrix plus an int array of lengths
(see :func:`pad`); position ``i`` (0-based) is rank ``i + 1``. Every metric returns one float
per query, NaN meaning *undefined* (never silently 0). Names are canonical strings that double
as report columns: a base name, optionally ``@k`` (``ndcg@10``, ``label.recall@5``).

Label-free metrics (:func:`compute_label_free`) read the judge's grades; ``rel_i`` is the raw
grade at rank ``i`` and a passage is relevant when ``rel_i >= threshold``. Label-based metrics
(:func:`compute_label_based`, names prefixed ``label.``, :mod:`.label_based`) read which
retrieved passages match the row's expected ids or texts (:func:`match_expected`). Source
metrics (``near_dup``, ``sites``, ``authority``, ``low_quality``: :mod:`.sources`) read the
passages' text and urls alone. :func:`metrics_for_queries` ties all three to the records.
Where a formula divides 0 by 0 the value is undefined (NaN).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from judge.errors import ConfigError
from judge.metrics import soft
from judge.metrics.coverage import ASPECT_METRICS, Aspects, aspect_values
from judge.metrics.cuts import cut_grade
from judge.metrics.label_based import (
    LABEL_BASED,
    ExpectedMatch,
    Matched,
    match_expected,
    normalise_text,
)
from judge.metrics.ranked import (
    BoolArray,
    FloatArray,
    IntArray,
    Ranked,
    discounts,
    div,
    hit,
    mrr,
    precision,
    precision_at_rank,
)
from judge.metrics.sources import SOURCE_METRICS, source_metrics
from judge.schema import (
    DEFAULT_METRICS,
    Gain,
    MetricPolicy,
    Query,
    Scale,
    UndefinedAP,
    Unjudged,
    Verdict,
)

__all__ = [
    "DEFAULT_METRICS",
    "LABEL_BASED",
    "LABEL_FREE",
    "BoolArray",
    "ExpectedMatch",
    "FloatArray",
    "Gain",
    "IntArray",
    "MetricPolicy",
    "UndefinedAP",
    "Unjudged",
    "compute_label_based",
    "compute_label_free",
    "is_label_based",
    "match_expected",
    "metrics_for_queries",
    "normalise_text",
    "pad",
    "parse_metric_name",
]

_NAME = re.compile(r"^([a-z0-9_.]+?)(?:@(\d+))?$")


@dataclass(frozen=True)
class _Graded(Ranked):
    """Judged lists for label-free metrics: grades 0 where padded, optional reranker scores."""

    grades: FloatArray
    inside: BoolArray
    max_grade: int
    gain: Gain
    undefined_ap: UndefinedAP
    scores: FloatArray | None


def _relevancy_mean(g: _Graded, k: int | None) -> FloatArray:
    """``mean_{i <= min(k, n)} rel_i / max_grade``; undefined for an empty list."""
    count = g.inside[:, :k].sum(axis=1, dtype=np.float64)
    return div(g.grades[:, :k].sum(axis=1), count) / g.max_grade


def _relevancy_max(g: _Graded, k: int | None) -> FloatArray:
    """``max_{i <= min(k, n)} rel_i / max_grade``; undefined for an empty list."""
    best = np.max(g.grades[:, :k], axis=1, where=g.inside[:, :k], initial=-np.inf)
    return np.where(np.isfinite(best), best / g.max_grade, np.nan)


def _ap(g: _Graded, k: int | None) -> FloatArray:
    """``AP@k = sum_{i <= k, rel_i >= t} P@i / R`` with ``R`` = relevant in the *whole* list.

    TREC convention, also for ``@k``: grades [0,1,0,0,1,1] give AP@3 = 0.5 / 3. Undefined when
    ``R = 0`` (0 instead with ``undefined_ap="zero"``, which is what trec_eval reports).
    """
    summed = np.where(g.rel, precision_at_rank(g.rel), 0.0)[:, :k].sum(axis=1)
    ap = div(summed, g.rel.sum(axis=1, dtype=np.float64))
    return np.nan_to_num(ap, nan=0.0) if g.undefined_ap == "zero" else ap


def _ndcg(g: _Graded, k: int | None) -> FloatArray:
    """``DCG@k / IDCG@k``, ``DCG@k = sum_{i <= k} gain(rel_i) / log2(i + 1)``.

    ``gain(r) = r`` (linear, trec_eval's) or ``2^r - 1`` (exponential); the ideal list is the
    same judged grades sorted descending. Undefined when ``IDCG = 0`` (nothing graded above 0).
    """
    gains = g.grades if g.gain == "linear" else np.exp2(g.grades) - 1.0
    disc = discounts(gains.shape[1])
    ideal = -np.sort(-gains, axis=1)
    return div((gains * disc)[:, :k].sum(axis=1), (ideal * disc)[:, :k].sum(axis=1))


def _score_view(g: _Graded, k: int | None) -> tuple[FloatArray, BoolArray]:
    if g.scores is None:
        empty = np.full((g.grades.shape[0], 1), np.nan)
        return empty, np.zeros(empty.shape, dtype=bool)
    scores = g.scores[:, :k]
    return scores, ~np.isnan(scores) & g.inside[:, :k]


def _rerank_mean(g: _Graded, k: int | None) -> FloatArray:
    """``mean_i s_i`` over the per-passage scores ``s_i`` in [0, 1] present in the top k."""
    scores, ok = _score_view(g, k)
    return div(np.where(ok, scores, 0.0).sum(axis=1), ok.sum(axis=1, dtype=np.float64))


def _rerank_max(g: _Graded, k: int | None) -> FloatArray:
    """``max_i s_i`` over the scores present in the top k."""
    scores, ok = _score_view(g, k)
    best = np.max(scores, axis=1, where=ok, initial=-np.inf)
    return np.where(np.isfinite(best), best, np.nan)


def _rerank_median(g: _Graded, k: int | None) -> FloatArray:
    """Median of the scores present in the top k (mean of the middle two for an even count)."""
    scores, ok = _score_view(g, k)
    ordered = np.sort(np.where(ok, scores, np.inf), axis=1)
    count = ok.sum(axis=1)
    lo = np.take_along_axis(ordered, np.maximum(count - 1, 0)[:, None] // 2, axis=1)[:, 0]
    hi = np.take_along_axis(ordered, (count // 2)[:, None], axis=1)[:, 0]
    return np.where(count > 0, (lo + hi) / 2.0, np.nan)


def _soft(
    kernel: Callable[[FloatArray, BoolArray, int | None], FloatArray],
) -> Callable[[_Graded, int | None], FloatArray]:
    """A :mod:`judge.metrics.soft` kernel over the verdicts' probabilities (NaN without)."""

    def metric(g: _Graded, k: int | None) -> FloatArray:
        if g.scores is None:
            return np.full(g.grades.shape[0], np.nan)
        return kernel(g.scores, g.inside, k)

    metric.__doc__ = kernel.__doc__
    return metric


LABEL_FREE: dict[str, Callable[[_Graded, int | None], FloatArray]] = {
    "relevancy_mean": _relevancy_mean,
    "relevancy_max": _relevancy_max,
    "ap": _ap,
    "ndcg": _ndcg,
    "precision": precision,
    "hit": hit,
    "mrr": mrr,
    "rerank_mean": _rerank_mean,
    "rerank_max": _rerank_max,
    "rerank_median": _rerank_median,
    "soft_precision": _soft(soft.soft_precision),
    "soft_ap": _soft(soft.soft_ap),
    "soft_ndcg": _soft(soft.soft_ndcg),
}


def parse_metric_name(name: str) -> tuple[str, int | None]:
    """Split a canonical name: ``"ndcg@10" -> ("ndcg", 10)``, ``"ap" -> ("ap", None)``.

    Raises ConfigError naming the metric and listing the valid ones when it is unknown.
    """
    match, known = _NAME.match(name), {*LABEL_FREE, *LABEL_BASED, *SOURCE_METRICS, *ASPECT_METRICS}
    if match and match.group(1) in known:
        k = None if match.group(2) is None else int(match.group(2))
        if k is None or k >= 1:
            return match.group(1), k
        raise ConfigError(f"metric '{name}': the cutoff after '@' must be at least 1")
    valid = ", ".join([*LABEL_FREE, *LABEL_BASED, *SOURCE_METRICS, *ASPECT_METRICS])
    hint, tidy = "", name.strip().lower()
    if tidy != name and (fixed := _NAME.match(tidy)) and fixed.group(1) in known:
        hint = f" (did you mean '{tidy}'?)"
    raise ConfigError(
        f"unknown metric '{name}'{hint}; valid metrics: {valid}; each may take a cutoff '@k'"
    )


def is_label_based(name: str) -> bool:
    """True for a ``label.`` metric (needs expected ids or texts), after checking the name."""
    return parse_metric_name(name)[0] in LABEL_BASED


def pad(lists: Sequence[Sequence[float | None]]) -> tuple[FloatArray, IntArray]:
    """Stack ragged lists into an ``n x max_len`` float matrix, NaN for padding and for None."""
    lengths = np.fromiter((len(row) for row in lists), dtype=np.int64, count=len(lists))
    width = int(lengths.max(initial=0))
    matrix = np.full((len(lists), width), np.nan)
    flat = np.array(list(itertools.chain.from_iterable(lists)), dtype=np.float64)
    matrix[np.arange(width) < lengths[:, None]] = flat
    return matrix, lengths


def _split(names: Sequence[str], label: bool) -> list[tuple[str, str, int | None]]:
    parsed = [(name, *parse_metric_name(name)) for name in names]
    wrong = [name for name, base, _ in parsed if base not in (LABEL_BASED if label else LABEL_FREE)]
    if wrong:
        kind = "label-free" if label else "label-based"
        raise ConfigError(f"metrics {wrong} are {kind} or source metrics: use metrics_for_queries")
    return parsed


def _widen(matrix: FloatArray) -> FloatArray:
    """At least one column, so that row reductions are defined for all-empty batches."""
    if matrix.shape[1]:
        return matrix
    return np.full((matrix.shape[0], 1), np.nan)


def compute_label_free(
    names: Sequence[str],
    grades: FloatArray,
    lengths: IntArray,
    *,
    max_grade: int,
    threshold: int,
    gain: Gain = "linear",
    probabilities: FloatArray | None = None,
    unjudged: Unjudged = "undefined",
    undefined_ap: UndefinedAP = "nan",
) -> dict[str, FloatArray]:
    """Label-free metrics from raw grades (NaN where unjudged), one array per name.

    A query with an unjudged passage inside its length has every metric undefined (NaN) with
    ``unjudged="undefined"``; with ``"skip"`` the unjudged passages are dropped and the rest
    keep their order, so metrics are over the judged passages only. ``probabilities`` (same
    shape, NaN where absent) feed the ``rerank_*`` metrics, NaN when not given.
    """
    parsed = _split(names, label=False)
    grades = _widen(np.asarray(grades, dtype=np.float64))
    lengths = np.asarray(lengths, dtype=np.int64)
    scores = None if probabilities is None else _widen(np.asarray(probabilities, np.float64))
    if scores is not None and scores.shape != grades.shape:
        raise ValueError(f"probabilities {scores.shape} and grades {grades.shape} differ")
    inside = np.arange(grades.shape[1]) < lengths[:, None]
    missing = np.isnan(grades) & inside
    if unjudged == "skip":
        keep = inside & ~missing
        order = np.argsort(~keep, axis=1, kind="stable")
        grades = np.take_along_axis(grades, order, axis=1)
        scores = None if scores is None else np.take_along_axis(scores, order, axis=1)
        lengths = keep.sum(axis=1)
        inside = np.arange(grades.shape[1]) < lengths[:, None]
    clean = np.where(inside & ~np.isnan(grades), grades, 0.0)
    graded = _Graded(
        clean >= threshold, lengths, clean, inside, max_grade, gain, undefined_ap, scores
    )
    undefined = missing.any(axis=1) if unjudged == "undefined" else np.zeros(len(lengths), bool)
    out: dict[str, FloatArray] = {}
    for name, base, k in parsed:
        values = LABEL_FREE[base](graded, k)
        out[name] = np.where(undefined, np.nan, values)
    return out


def compute_label_based(
    names: Sequence[str],
    relevant: BoolArray,
    lengths: IntArray,
    n_expected: IntArray,
    *,
    found_rank: FloatArray | None = None,
) -> dict[str, FloatArray]:
    """Label-based metrics, one array per name; undefined where a query has no expected items.

    ``relevant`` marks retrieved passages that match an expected item. ``found_rank`` (n x E,
    NaN-padded) gives, per distinct expected item, the 1-based rank it was first found at (NaN
    if not found); without it each relevant passage counts as one distinct expected item.
    """
    parsed = _split(names, label=True)
    rel = np.asarray(relevant, dtype=bool)
    rel = rel if rel.shape[1] else np.zeros((rel.shape[0], 1), dtype=bool)
    lengths = np.asarray(lengths, dtype=np.int64)
    rel = rel & (np.arange(rel.shape[1]) < lengths[:, None])
    if found_rank is None:
        found_rank = np.where(rel, np.arange(1.0, rel.shape[1] + 1), np.nan)
    expected = np.asarray(n_expected, dtype=np.float64)
    matched = Matched(rel, lengths, np.asarray(found_rank, dtype=np.float64), expected)
    return {
        name: np.where(expected > 0, LABEL_BASED[base](matched, k), np.nan)
        for name, base, k in parsed
    }


def _grade(verdict: Verdict, scale: Scale, policy: MetricPolicy) -> int | None:
    """The grade a verdict counts with: its label's; with ``policy.grade_cuts`` on a graded
    scale, ``g_j`` for ``j = #{i: c_i <= E[g]}`` of its expected grade (:mod:`.cuts`); with
    ``policy.relevance_threshold`` on a binary scale, 1 when ``P(relevant) >= threshold``.
    Without an expected grade or a probability, the label's."""
    if verdict.status != "ok":
        return None
    if policy.grade_cuts is not None and verdict.expected_grade is not None:
        return cut_grade(verdict.expected_grade, policy.grade_cuts, scale)
    cut = policy.relevance_threshold
    if cut is None or verdict.probability is None:
        return verdict.grade
    if not scale.is_binary:
        raise ConfigError(
            f"metrics.relevance_threshold needs a binary scale, not '{scale.name}' "
            "(a graded judge's cut points come from its labels)"
        )
    return int(verdict.probability >= cut)


def metrics_for_queries(
    names: Sequence[str],
    queries: Sequence[tuple[Query, Sequence[Verdict]]],
    scale: Scale,
    policy: MetricPolicy = MetricPolicy(),
    rerank_scores: Sequence[dict[str, float] | None] | None = None,
    aspects: Sequence[Aspects | None] | None = None,
) -> list[dict[str, float | None]]:
    """Per-query metric dicts (None = undefined) from each query's verdicts, in rank order;
    ``names`` are the metrics wanted (often ``policy.names``), the policy says how.

    A verdict gives its grade when ``status == "ok"`` and is unjudged otherwise; its
    ``probability`` feeds ``soft_*`` (and, with ``relevance_threshold``, the grade itself;
    with ``grade_cuts``, the expected grade does) and ``rerank_*``, unless the query has a
    reranker's scores (``rerank_scores``, by passage id, aligned with ``queries``): then
    ``rerank_*`` come from those. Label-based names are None for a query without expected
    ids or texts; they and the source metrics (:mod:`.sources`) never depend on the verdicts.
    Coverage and credibility (:mod:`.coverage`) read ``aspects``, aligned (None without).
    """
    policy.check_scale(scale)
    parsed = [(n, *parse_metric_name(n)) for n in names]
    sourced = [p for p in parsed if p[1] in SOURCE_METRICS]
    label = [n for n, base, _ in parsed if base in LABEL_BASED]
    free = [n for n, base, _ in parsed if base in LABEL_FREE]
    ordered = [sorted(verdicts, key=lambda v: v.rank) for _, verdicts in queries]
    grades, lengths = pad([[_grade(v, scale, policy) for v in vs] for vs in ordered])
    probs, _ = pad([[v.probability for v in vs] for vs in ordered])
    options: dict[str, Any] = {"max_grade": scale.max_grade, "threshold": scale.threshold}
    options |= policy.model_dump(include={"gain", "unjudged", "undefined_ap"})
    reranked = [n for n in free if rerank_scores is not None and n.startswith("rerank_")]
    own = [n for n in free if n not in reranked]
    values = compute_label_free(own, grades, lengths, probabilities=probs, **options)
    values |= source_metrics(sourced, [query for query, _ in queries], policy)
    values |= aspect_values(parsed, aspects or [None] * len(queries))
    if reranked:
        assert rerank_scores is not None
        scores, _ = pad(
            [
                [v.probability if by_id is None else by_id.get(v.passage_id) for v in vs]
                for vs, by_id in zip(ordered, rerank_scores, strict=True)
            ]
        )
        values |= compute_label_free(reranked, grades, lengths, probabilities=scores, **options)
    if label:
        matches = [match_expected(query) for query, _ in queries]
        rows = [i for i, m in enumerate(matches) if m is not None]
        known = [m for m in matches if m is not None]
        rel, hit_lengths = pad([m.relevant for m in known])
        ranks, n_expected = pad([m.found_ranks for m in known])
        found = compute_label_based(label, rel == 1.0, hit_lengths, n_expected, found_rank=ranks)
        for name in label:
            values[name] = np.full(len(queries), np.nan)
            values[name][rows] = found[name]
    return [
        {name: None if np.isnan(v := float(values[name][i])) else v for name in names}
        for i in range(len(queries))
    ]
