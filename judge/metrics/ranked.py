"""Ranked lists as matrices, and the label-free kernels over the judge's grades.

A batch of ranked lists is an ``n_queries x width`` matrix, position ``i`` (0-based) being rank
``i + 1``, plus an int array of list lengths. :class:`Ranked` marks which ranks are relevant
(False in padding). Precision, hit and MRR read only that, so the label-free and the
``label.*`` rows of :data:`judge.metrics.facts.METRICS` name the same functions.
:class:`Graded` adds the judge's grades (``rel_i`` the raw grade at rank ``i``, relevant when
``rel_i >= threshold``) and per-passage scores, which the other label-free kernels here read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from judge.schema import Gain, UndefinedAP

__all__ = [
    "BoolArray",
    "FloatArray",
    "Graded",
    "IntArray",
    "Ranked",
    "ap",
    "discounts",
    "div",
    "hit",
    "mrr",
    "ndcg",
    "over_scores",
    "precision",
    "precision_at_rank",
    "relevancy_max",
    "relevancy_mean",
    "rerank_max",
    "rerank_mean",
    "rerank_median",
]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


def div(num: FloatArray, den: FloatArray) -> FloatArray:
    """``num / den`` element-wise, NaN where ``den == 0`` (0/0 is undefined), without warnings."""
    out = np.full(np.broadcast(num, den).shape, np.nan)
    np.divide(num, den, out=out, where=den != 0)
    return out


def discounts(width: int) -> FloatArray:
    """``1 / log2(i + 1)`` for ranks ``i = 1..width``."""
    return 1.0 / np.log2(np.arange(2, width + 2, dtype=np.float64))


def precision_at_rank(rel: BoolArray) -> FloatArray:
    """``P@i = (relevant in the top i) / i`` for every rank ``i`` of every row."""
    return np.cumsum(rel, axis=1) / np.arange(1, rel.shape[1] + 1)


@dataclass(frozen=True)
class Ranked:
    """What every metric sees: which ranks are relevant (False in padding) and list lengths."""

    rel: BoolArray
    lengths: IntArray


def precision(r: Ranked, k: int | None) -> FloatArray:
    """``P@k = (relevant in the top k) / k``, dividing by ``k`` even when ``k > n`` (trec_eval);
    without ``@k``: relevant / n, undefined for an empty list."""
    hits = r.rel[:, :k].sum(axis=1, dtype=np.float64)
    return div(hits, r.lengths.astype(np.float64)) if k is None else hits / k


def hit(r: Ranked, k: int | None) -> FloatArray:
    """``1`` if any of the top k is relevant, else ``0``."""
    return np.asarray(r.rel[:, :k].any(axis=1), dtype=np.float64)


def mrr(r: Ranked, k: int | None) -> FloatArray:
    """``1 / rank`` of the first relevant passage in the top k; ``0`` when there is none
    (trec_eval's recip_rank)."""
    rel = r.rel[:, :k]
    return np.where(rel.any(axis=1), 1.0 / (np.argmax(rel, axis=1) + 1.0), 0.0)


@dataclass(frozen=True)
class Graded(Ranked):
    """Judged lists: grades 0 where padded, optional per-passage scores (NaN where absent)."""

    grades: FloatArray
    inside: BoolArray
    max_grade: int
    gain: Gain
    undefined_ap: UndefinedAP
    scores: FloatArray | None


def relevancy_mean(g: Graded, k: int | None) -> FloatArray:
    """``mean_{i <= min(k, n)} rel_i / max_grade``; undefined for an empty list."""
    count = g.inside[:, :k].sum(axis=1, dtype=np.float64)
    return div(g.grades[:, :k].sum(axis=1), count) / g.max_grade


def relevancy_max(g: Graded, k: int | None) -> FloatArray:
    """``max_{i <= min(k, n)} rel_i / max_grade``; undefined for an empty list."""
    best = np.max(g.grades[:, :k], axis=1, where=g.inside[:, :k], initial=-np.inf)
    return np.where(np.isfinite(best), best / g.max_grade, np.nan)


def ap(g: Graded, k: int | None) -> FloatArray:
    """``AP@k = sum_{i <= k, rel_i >= t} P@i / R`` with ``R`` = relevant in the *whole* list.

    TREC convention, also for ``@k``: grades [0,1,0,0,1,1] give AP@3 = 0.5 / 3. Undefined when
    ``R = 0`` (0 instead with ``undefined_ap="zero"``, which is what trec_eval reports).
    """
    summed = np.where(g.rel, precision_at_rank(g.rel), 0.0)[:, :k].sum(axis=1)
    value = div(summed, g.rel.sum(axis=1, dtype=np.float64))
    return np.nan_to_num(value, nan=0.0) if g.undefined_ap == "zero" else value


def ndcg(g: Graded, k: int | None) -> FloatArray:
    """``DCG@k / IDCG@k``, ``DCG@k = sum_{i <= k} gain(rel_i) / log2(i + 1)``.

    ``gain(r) = r`` (linear, trec_eval's) or ``2^r - 1`` (exponential); the ideal list is the
    same judged grades sorted descending. Undefined when ``IDCG = 0`` (nothing graded above 0).
    """
    gains = g.grades if g.gain == "linear" else np.exp2(g.grades) - 1.0
    disc = discounts(gains.shape[1])
    ideal = -np.sort(-gains, axis=1)
    return div((gains * disc)[:, :k].sum(axis=1), (ideal * disc)[:, :k].sum(axis=1))


def _score_view(g: Graded, k: int | None) -> tuple[FloatArray, BoolArray]:
    if g.scores is None:
        empty = np.full((g.grades.shape[0], 1), np.nan)
        return empty, np.zeros(empty.shape, dtype=bool)
    scores = g.scores[:, :k]
    return scores, ~np.isnan(scores) & g.inside[:, :k]


def rerank_mean(g: Graded, k: int | None) -> FloatArray:
    """``mean_i s_i`` over the per-passage scores ``s_i`` in [0, 1] present in the top k."""
    scores, ok = _score_view(g, k)
    return div(np.where(ok, scores, 0.0).sum(axis=1), ok.sum(axis=1, dtype=np.float64))


def rerank_max(g: Graded, k: int | None) -> FloatArray:
    """``max_i s_i`` over the scores present in the top k."""
    scores, ok = _score_view(g, k)
    best = np.max(scores, axis=1, where=ok, initial=-np.inf)
    return np.where(np.isfinite(best), best, np.nan)


def rerank_median(g: Graded, k: int | None) -> FloatArray:
    """Median of the scores present in the top k (mean of the middle two for an even count)."""
    scores, ok = _score_view(g, k)
    ordered = np.sort(np.where(ok, scores, np.inf), axis=1)
    count = ok.sum(axis=1)
    lo = np.take_along_axis(ordered, np.maximum(count - 1, 0)[:, None] // 2, axis=1)[:, 0]
    hi = np.take_along_axis(ordered, (count // 2)[:, None], axis=1)[:, 0]
    return np.where(count > 0, (lo + hi) / 2.0, np.nan)


def over_scores(
    kernel: Callable[[FloatArray, BoolArray, int | None], FloatArray],
) -> Callable[[Graded, int | None], FloatArray]:
    """A kernel over probabilities (:mod:`judge.metrics.soft`) as one over a Graded's scores,
    which are the verdicts' probabilities there (NaN without)."""

    def metric(g: Graded, k: int | None) -> FloatArray:
        if g.scores is None:
            return np.full(g.grades.shape[0], np.nan)
        return kernel(g.scores, g.inside, k)

    metric.__doc__ = kernel.__doc__
    return metric
