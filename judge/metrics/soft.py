"""Soft label-free metrics: expectations over the judge's probability of relevance.

A thresholded metric keeps only the judge's arg-max label and throws its confidence away. With
logprobs each passage at rank ``i`` has ``p_i = P(relevant)``; treating the passages' relevance
as independent Bernoulli(``p_i``) draws gives expected values that use that confidence, and
that equal the thresholded metrics exactly when every ``p_i`` is 0 or 1:

- ``soft_precision@k = E[P@k] = sum_{i <= k} p_i / k`` (exact; without ``@k`` divided by n);
- ``soft_ap@k = E[sum_{i <= k} rel_i P@i] / E[R]``, with
  ``E[rel_i P@i] = p_i (1 + sum_{j < i} p_j) / i`` and ``E[R] = sum_{i <= n} p_i`` (the whole
  list, TREC's convention as for ``ap``): a ratio of expectations, the usual estimator of
  expected AP (Yilmaz and Aslam's inferred AP uses the same form); undefined when ``E[R] = 0``;
- ``soft_ndcg@k = sum_{i <= k} p_i / log2(i + 1)`` over the same sum for the ``p`` sorted
  descending (the ideal list of these gains, as ``ndcg`` does with grades).

A list with a passage that has no probability gets undefined soft metrics (NaN), never a guess.
"""

from __future__ import annotations

import numpy as np

from judge.metrics.ranked import BoolArray, FloatArray, discounts, div

__all__ = ["soft_ap", "soft_ndcg", "soft_precision"]


def _view(p: FloatArray, inside: BoolArray) -> tuple[FloatArray, BoolArray]:
    """Probabilities with 0 in padding, and which rows have one for every listed passage."""
    complete: BoolArray = np.asarray(~(np.isnan(p) & inside).any(axis=1), dtype=np.bool_)
    probs: FloatArray = np.where(inside & ~np.isnan(p), p, 0.0)
    return probs, complete


def soft_precision(p: FloatArray, inside: BoolArray, k: int | None) -> FloatArray:
    """``sum_{i <= k} p_i / k`` (without k: ``/ n``, undefined for an empty list)."""
    probs, complete = _view(p, inside)
    total = probs[:, :k].sum(axis=1)
    den = inside.sum(axis=1, dtype=np.float64) if k is None else np.full(len(total), float(k))
    return np.where(complete, div(total, den), np.nan)


def soft_ap(p: FloatArray, inside: BoolArray, k: int | None) -> FloatArray:
    """``sum_{i <= k} p_i (1 + sum_{j < i} p_j) / i`` over ``sum_{i <= n} p_i``."""
    probs, complete = _view(p, inside)
    before = np.cumsum(probs, axis=1) - probs
    ranks = np.arange(1, probs.shape[1] + 1, dtype=np.float64)
    terms = probs * (1.0 + before) / ranks
    return np.where(complete, div(terms[:, :k].sum(axis=1), probs.sum(axis=1)), np.nan)


def soft_ndcg(p: FloatArray, inside: BoolArray, k: int | None) -> FloatArray:
    """``sum_{i <= k} p_i d_i`` over the same for ``p`` sorted descending, ``d_i = 1/log2(i+1)``."""
    probs, complete = _view(p, inside)
    disc = discounts(probs.shape[1])
    ideal = -np.sort(-probs, axis=1)
    dcg = (probs * disc)[:, :k].sum(axis=1)
    return np.where(complete, div(dcg, (ideal * disc)[:, :k].sum(axis=1)), np.nan)
