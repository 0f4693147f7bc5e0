"""Cut points on a graded judge's expected grade that agree best with human grades.

Given per passage the judge's expected grade ``E[g]`` and a human grade on the same scale,
:func:`best_cuts` chooses ``c_1 < ... < c_G`` (grade ``g_j``, ``j = #{i: c_i <= E[g]}``, as
:mod:`judge.metrics.cuts` applies them) maximising linear-weighted Cohen's kappa, the weights
``|g_a - g_b| / (g_max - g_min)`` of :func:`judge.analysis.reliability.cohen_kappa`.

Why coordinate ascent. Kappa is a step function of the cuts (no gradient), and not separable:
its chance term couples every cut through the marginals, so no dynamic programme or per-cut
choice is exact, and an exhaustive grid is ``O(M^G)``. Ordinal regression or isotonic fits
maximise a likelihood or squared error, not the agreement the report shows. So: start from
the rounding cuts (midpoints between grades) and from the cuts that give the judge the humans'
grade distribution (quantiles of E[g]); then, one cut at a time, try every candidate between
its neighbours and keep the best, scoring all candidates of a cut in one vectorised pass;
sweep until nothing moves. Candidates: ``G`` evenly spaced points in each gap between
consecutive distinct E[g] (so several cuts can share a gap and leave a grade empty), over at
most ``MAX_CANDIDATES`` values thinned by quantile. A move never lowers kappa, so the search
stops, in a few sweeps; it can stop short of the optimum (on small noisy samples, rarely,
by a few hundredths of kappa against an exhaustive search; the tests measure it).
Ties go to the candidate nearest the rounding cut, so data that says nothing leaves the
uncalibrated cuts. This is the "optimised rounder" used for quadratic-kappa targets, made
exhaustive per coordinate; scipy and scikit-learn have no kappa-maximising cut search.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from judge.analysis.reliability import cohen_kappa
from judge.metrics.cuts import cut_index, midpoint_cuts

__all__ = ["MAX_CANDIDATES", "best_cuts", "grade_kappa"]

MAX_CANDIDATES = 400
_MAX_SWEEPS = 50
_TIE = 1e-12

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


def _table(judge_idx: IntArray, human_idx: IntArray, k: int) -> FloatArray:
    """Confusion counts, rows the judge's grade position, columns the human's."""
    return np.bincount(judge_idx * k + human_idx, minlength=k * k).reshape(k, k).astype(float)


def grade_kappa(judge_idx: IntArray, human_idx: IntArray, grades: Sequence[int]) -> float | None:
    """Linear-weighted kappa of two raters' grades, given as positions in ``grades``."""
    table = _table(judge_idx, human_idx, len(grades))
    return cohen_kappa(table, values=[float(g) for g in grades])


def _kappas(tables: FloatArray, weights: FloatArray) -> FloatArray:
    """Weighted kappa of each ``tables[m]`` (as cohen_kappa), -inf where undefined."""
    n = tables.sum(axis=(1, 2))
    observed = (tables * weights).sum(axis=(1, 2)) / n
    rows, cols = tables.sum(axis=2), tables.sum(axis=1)
    chance = np.einsum("mi,ij,mj->m", rows, weights, cols) / n**2
    with np.errstate(divide="ignore", invalid="ignore"):
        kappa = 1.0 - observed / chance
    return np.where(chance > 0, kappa, -np.inf)


def _candidates(expected: FloatArray, n_cuts: int) -> FloatArray:
    """``n_cuts`` evenly spaced points in each gap between consecutive distinct values (and
    below and above them all), so that several cuts can share a gap and leave a grade empty;
    the values thinned by quantile to at most MAX_CANDIDATES first."""
    values = np.unique(expected)
    if values.size > MAX_CANDIDATES:
        values = np.unique(np.quantile(values, np.linspace(0, 1, MAX_CANDIDATES)))
    edges = np.concatenate([[values[0] - 1.0], values, [values[-1] + 1.0]])
    steps = np.arange(1, n_cuts + 1) / (n_cuts + 1)
    return (edges[:-1, None] + np.diff(edges)[:, None] * steps).ravel()


def _move(
    j: int,
    cuts: list[float],
    expected: FloatArray,
    human_idx: IntArray,
    pool: FloatArray,
    weights: FloatArray,
    home: float,
) -> float:
    """The best value of cut ``j`` with the others fixed (ties: nearest ``home``)."""
    k = weights.shape[0]
    lo = cuts[j - 1] if j > 0 else -np.inf
    hi = cuts[j + 1] if j + 1 < len(cuts) else np.inf
    options = np.unique(np.append(pool[(pool > lo) & (pool < hi)], [cuts[j]]))
    inside = (expected >= lo) & (expected < hi)
    fixed = _table(cut_index(expected[~inside], cuts), human_idx[~inside], k)
    # Inside (lo, hi) a passage is at position j (cut j at or below it) or j - 1.
    e, h = expected[inside], human_idx[inside]
    below = np.stack([np.searchsorted(np.sort(e[h == c]), options) for c in range(k)], axis=1)
    tables = np.broadcast_to(fixed, (options.size, k, k)).copy()
    tables[:, j, :] += below
    tables[:, j + 1, :] += np.bincount(h, minlength=k) - below
    scores = _kappas(tables, weights)
    tied = options[scores >= scores.max() - _TIE]
    return float(tied[np.argmin(np.abs(tied - home))])


def _ascend(
    start: Sequence[float],
    expected: FloatArray,
    human_idx: IntArray,
    grades: Sequence[int],
) -> list[float]:
    """Coordinate ascent from ``start`` until a sweep moves no cut."""
    home = midpoint_cuts(grades)
    values = np.asarray(grades, dtype=np.float64)
    weights = np.abs(np.subtract.outer(values, values)) / (values.max() - values.min())
    pool = _candidates(expected, len(home))
    cuts = list(start)
    for _ in range(_MAX_SWEEPS):
        before = list(cuts)
        for j in range(len(cuts)):
            cuts[j] = _move(j, cuts, expected, human_idx, pool, weights, home[j])
        if cuts == before:
            break
    return cuts


def _matching(expected: FloatArray, human_idx: IntArray, k: int) -> list[float] | None:
    """Cuts giving the judge the humans' grade shares (None when ties make them collide)."""
    shares = np.cumsum(np.bincount(human_idx, minlength=k))[:-1] / human_idx.size
    ordered = np.sort(expected)
    at = np.clip(np.round(shares * ordered.size).astype(int), 1, ordered.size - 1)
    cuts = (ordered[at - 1] + ordered[at]) / 2
    return [float(c) for c in cuts] if np.all(np.diff(cuts) > 0) else None


def best_cuts(
    expected: FloatArray, human_idx: IntArray, grades: Sequence[int]
) -> tuple[float, ...]:
    """The kappa-maximising cuts on ``expected`` (see the module docstring); ``human_idx``
    holds each human grade's position in ``grades`` (sorted, lowest first)."""

    def score(cuts: Sequence[float]) -> float:
        kappa = grade_kappa(cut_index(expected, cuts), human_idx, grades)
        return -np.inf if kappa is None else kappa

    best = _ascend(midpoint_cuts(grades), expected, human_idx, grades)
    other = _matching(expected, human_idx, len(grades))
    if other is not None:
        second = _ascend(other, expected, human_idx, grades)
        if score(second) > score(best) + _TIE:
            best = second
    return tuple(best)
