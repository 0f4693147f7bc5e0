"""What the label-free and label-based ranking metrics share: the ranked view and its maths.

A batch of ranked lists is an ``n_queries x width`` matrix, position ``i`` (0-based) being rank
``i + 1``, plus an int array of list lengths. :class:`Ranked` marks which ranks are relevant
(False in padding). Precision, hit and MRR here read only that, so both metric families
(:mod:`judge.metrics`, :mod:`judge.labels`) register the same functions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "BoolArray",
    "FloatArray",
    "IntArray",
    "Ranked",
    "discounts",
    "div",
    "hit",
    "mrr",
    "precision",
    "precision_at_rank",
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
