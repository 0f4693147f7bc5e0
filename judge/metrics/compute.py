"""Metrics by name over padded matrices, one pass for all queries: each family's input is
built once and handed to the kernels that :data:`judge.metrics.facts.METRICS` names.

Ranked lists are held as an ``n_queries x width`` float matrix plus an int array of lengths
(see :func:`pad`); position ``i`` (0-based) is rank ``i + 1``. Every metric returns one float
per query, NaN meaning *undefined* (never silently 0). Names are canonical strings that double
as report columns: a base name, optionally ``@k`` (``ndcg@10``, ``label.recall@5``).

Label-free metrics (:func:`compute_label_free`: the ``label-free``, ``rerank`` and ``soft``
families) read the judge's grades; ``rel_i`` is the raw grade at rank ``i`` and a passage is
relevant when ``rel_i >= threshold``. Label-based metrics (:func:`compute_label_based`, names
prefixed ``label.``) read which retrieved passages match the row's expected ids or texts
(:func:`match_expected`). Source metrics read the passages' text and urls alone, coverage
metrics the nugget supports and credibility grades. :func:`metrics_for_queries` ties them all
to the records. Where a formula divides 0 by 0 the value is undefined (NaN).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from judge.errors import ConfigError
from judge.metrics.coverage import Aspects, aspect_values
from judge.metrics.cuts import cut_grade
from judge.metrics.facts import METRICS, Family, Metric, parse_metric_name
from judge.metrics.label_based import ExpectedMatch, Matched, match_expected, normalise_text
from judge.metrics.ranked import BoolArray, FloatArray, Graded, IntArray
from judge.metrics.sources import source_metrics
from judge.schema import (
    DEFAULT_METRICS,
    Gain,
    JudgedQuery,
    MetricPolicy,
    Query,
    Scale,
    UndefinedAP,
    Unjudged,
    Verdict,
)

__all__ = [
    "DEFAULT_METRICS",
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
    "match_expected",
    "metrics_for_queries",
    "normalise_text",
    "pad",
    "parse_metric_name",
]

# The families whose kernels read a Graded (the judge's grades, scores or probabilities).
_GRADED: frozenset[Family] = frozenset({"label-free", "rerank", "soft"})
Parsed = list[tuple[str, Metric[Any], int | None]]


def _parse(names: Sequence[str]) -> Parsed:
    """``(name, its row, its cutoff)`` per name; ConfigError for an unknown one."""
    parsed: Parsed = []
    for name in names:
        base, k = parse_metric_name(name)
        parsed.append((name, METRICS[base], k))
    return parsed


def pad(lists: Sequence[Sequence[float | None]]) -> tuple[FloatArray, IntArray]:
    """Stack ragged lists into an ``n x max_len`` float matrix, NaN for padding and for None."""
    lengths = np.fromiter((len(row) for row in lists), dtype=np.int64, count=len(lists))
    width = int(lengths.max(initial=0))
    matrix = np.full((len(lists), width), np.nan)
    flat = np.array(list(itertools.chain.from_iterable(lists)), dtype=np.float64)
    matrix[np.arange(width) < lengths[:, None]] = flat
    return matrix, lengths


def _split(names: Sequence[str], label: bool) -> Parsed:
    parsed = _parse(names)
    families: Collection[Family] = {"label"} if label else _GRADED
    wrong = [name for name, metric, _ in parsed if metric.family not in families]
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
    graded = Graded(
        clean >= threshold, lengths, clean, inside, max_grade, gain, undefined_ap, scores
    )
    undefined = missing.any(axis=1) if unjudged == "undefined" else np.zeros(len(lengths), bool)
    out: dict[str, FloatArray] = {}
    for name, metric, k in parsed:
        out[name] = np.where(undefined, np.nan, metric.kernel(graded, k))
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
        name: np.where(expected > 0, metric.kernel(matched, k), np.nan)
        for name, metric, k in parsed
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


# The signal on a verdict whose grade the [metrics] cut changed (relevance_threshold on its
# P(relevant), grade_cuts on its expected grade): its label is then not the judge's words.
RECUT = "recut"


def counted(
    results: Sequence[JudgedQuery], scale: Scale, policy: MetricPolicy
) -> Sequence[JudgedQuery]:
    """``results`` with each verdict labelled by the grade its metrics count it with
    (:func:`_grade`), flagged :data:`RECUT` where that is not the judge's label: so the
    report, the qrels and the agreement with human labels say what the metrics counted. The
    same sequence when the policy sets no cut (or changes nothing)."""
    if policy.relevance_threshold is None and policy.grade_cuts is None:
        return results
    out: list[JudgedQuery] = []
    for jq in results:
        verdicts = [_recut(v, scale, policy) for v in jq.verdicts]
        changed = any(a is not b for a, b in zip(verdicts, jq.verdicts, strict=True))
        out.append(jq.model_copy(update={"verdicts": tuple(verdicts)}) if changed else jq)
    return out


def rescored(
    results: Sequence[JudgedQuery], scale: Scale, policy: MetricPolicy
) -> list[JudgedQuery]:
    """``results`` with every query's metrics computed again from its verdicts (and its
    reranker scores, coverage and credibility) under ``policy``: a summary made again with
    another config (a cut written by ``judge calibrate --write``) counts what it says, not
    the metrics the run stored under its own."""
    values = metrics_for_queries(
        policy.names,
        [(jq.query, jq.verdicts) for jq in results],
        scale,
        policy,
        [jq.rerank_scores for jq in results],
        [Aspects(coverage=jq.coverage, credibility=jq.credibility) for jq in results],
    )
    return [jq.model_copy(update={"metrics": m}) for jq, m in zip(results, values, strict=True)]


def _recut(verdict: Verdict, scale: Scale, policy: MetricPolicy) -> Verdict:
    grade = _grade(verdict, scale, policy)
    if grade is None or grade == verdict.grade:
        return verdict
    label = scale.by_grade(grade)
    signals = verdict.signals if RECUT in verdict.signals else (*verdict.signals, RECUT)
    update = {"grade": grade, "label": label.name, "relevant": scale.relevant(grade)}
    return verdict.model_copy(update={**update, "signals": signals})


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
    parsed = _parse(names)
    label = [n for n, metric, _ in parsed if metric.family == "label"]
    free = [n for n, metric, _ in parsed if metric.family in _GRADED]
    ordered = [sorted(verdicts, key=lambda v: v.rank) for _, verdicts in queries]
    grades, lengths = pad([[_grade(v, scale, policy) for v in vs] for vs in ordered])
    probs, _ = pad([[v.probability for v in vs] for vs in ordered])
    options: dict[str, Any] = {"max_grade": scale.max_grade, "threshold": scale.threshold}
    options |= policy.model_dump(include={"gain", "unjudged", "undefined_ap"})
    reranked = [n for n, m, _ in parsed if rerank_scores is not None and m.family == "rerank"]
    own = [n for n in free if n not in reranked]
    values = compute_label_free(own, grades, lengths, probabilities=probs, **options)
    sourced = [(n, m.kernel, k) for n, m, k in parsed if m.family == "source"]
    values |= source_metrics(sourced, [query for query, _ in queries], policy)
    aspected = [(n, m.kernel, k) for n, m, k in parsed if m.family == "coverage"]
    values |= aspect_values(aspected, aspects or [None] * len(queries))
    if reranked:
        assert rerank_scores is not None
        scores, _ = pad(
            [
                [v.probability if by_id is None else by_id.get(v.passage_id) for v in vs]
                for vs, by_id in zip(ordered, rerank_scores, strict=True)
            ]
        )
        clipped = np.clip(scores, 0.0, 1.0)  # read as P(relevant), as health says (NaN stays)
        values |= compute_label_free(reranked, grades, lengths, probabilities=clipped, **options)
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
