"""Coverage, diversity and credibility metrics from a query's nugget support and source grades.

Notation, per judged query: ``N`` its nugget set, ``V`` the vital nuggets in it (the rest are
"okay"), passages ``p_1..p_n`` in the engine's order, and ``S_i`` the nuggets ``p_i``
supports (:class:`judge.aspects.Support`). A cutoff ``@k`` looks at ``p_1..p_min(k, n)``; no
cutoff, at the whole list. ``c_j(i) = #{l < i : j in S_l}`` counts the passages above rank
``i`` that already supported nugget ``j``.

A support that is not ``ok`` (unparsed or error) is never "supports nothing": any such
passage among those a metric reads makes the metric undefined (None), whatever
``[metrics] unjudged`` says, since scoring around it would count its nuggets as missed.
Credibility follows the same rule with its grades.

The diversity metrics treat nuggets as the aspects (intents) of the TREC Web diversity task,
with uniform intent weights and ``alpha = ALPHA``; they equal ndeval's (TREC's reference
implementation, through ir_measures' ``alpha_nDCG@k`` / ``ERR_IA@k``) where ndeval is
defined; the tests hold them to it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from judge.aspects import CREDIBILITY_MAX, Aspects, Coverage, Credibility
from judge.metrics.ranked import FloatArray

__all__ = [
    "ALPHA",
    "OKAY_WEIGHT",
    "AspectMetric",
    "Aspects",
    "alpha_ndcg_at",
    "aspect_values",
    "coverage_at",
    "credibility_at",
    "err_ia_at",
    "wcoverage_at",
]

# Redundancy intolerance of alpha-nDCG and ERR-IA: TREC's (and ndeval's) default.
ALPHA = 0.5
# A nugget's weight in wcoverage: vital 1, okay this.
OKAY_WEIGHT = 0.5

AspectMetric = Callable[[Aspects, int | None], float | None]


def _supported(coverage: Coverage | None, k: int | None) -> list[frozenset[str]] | None:
    """``S_1..S_min(k, n)``; None when one of them is not ``ok`` (or there is no coverage)."""
    if coverage is None:
        return None
    top = coverage.supports[:k]
    if any(s.status != "ok" or s.nuggets is None for s in top):
        return None
    return [frozenset(s.nuggets or ()) for s in top]


def coverage_at(a: Aspects, k: int | None) -> float | None:
    """``coverage@k = |V ∩ (S_1 ∪ ... ∪ S_k)| / |V|``: the share of vital nuggets some passage
    in the top k supports. Undefined when the set has no vital nugget."""
    sets = _supported(a.coverage, k)
    if sets is None or a.coverage is None:
        return None
    vital = {n.id for n in a.coverage.nuggets if n.vital}
    if not vital:
        return None
    found = frozenset().union(*sets)
    return len(vital & found) / len(vital)


def wcoverage_at(a: Aspects, k: int | None) -> float | None:
    """``wcoverage@k = sum_{j in N ∩ (S_1 ∪ ... ∪ S_k)} w_j / sum_{j in N} w_j`` with ``w_j = 1``
    for a vital nugget and ``OKAY_WEIGHT`` (0.5) for an okay one. Undefined for an empty set."""
    sets = _supported(a.coverage, k)
    if sets is None or a.coverage is None or not a.coverage.nuggets:
        return None
    found = frozenset().union(*sets)
    weights = {n.id: 1.0 if n.vital else OKAY_WEIGHT for n in a.coverage.nuggets}
    return sum(w for j, w in weights.items() if j in found) / sum(weights.values())


def _gains(sets: Sequence[frozenset[str]], alpha: float) -> list[float]:
    """``G_i = sum_{j in S_i} (1 - alpha)^{c_j(i)}``: a nugget's gain shrinks each time a
    higher passage has already supported it."""
    seen: dict[str, int] = {}
    gains = []
    for s in sets:
        gains.append(sum((1.0 - alpha) ** seen.get(j, 0) for j in s))
        for j in s:
            seen[j] = seen.get(j, 0) + 1
    return gains


def _ideal(ids: Sequence[str], sets: Sequence[frozenset[str]], alpha: float) -> list[float]:
    """The gains of the greedy ideal order of the same passages: at each rank the passage
    with the largest gain given those above it, ties to the larger passage id (ndeval's
    greedy approximation of an NP-hard optimum, and its tie rule)."""
    left = list(zip(ids, sets, strict=True))
    seen: dict[str, int] = {}
    gains = []
    while left:
        scored = [(sum((1.0 - alpha) ** seen.get(j, 0) for j in s), pid, s) for pid, s in left]
        best = max(scored, key=lambda t: (t[0], t[1]))
        gains.append(best[0])
        left = [(pid, s) for pid, s in left if pid != best[1]]
        for j in best[2]:
            seen[j] = seen.get(j, 0) + 1
    return gains


def _dcg(gains: Sequence[float], k: int | None) -> float:
    return sum(g / math.log2(i + 2) for i, g in enumerate(gains[:k]))


def alpha_ndcg_at(a: Aspects, k: int | None, alpha: float = ALPHA) -> float | None:
    """``alpha-nDCG@k = alpha-DCG@k / alpha-DCG@k(ideal)`` (Clarke et al., SIGIR 2008) with
    ``alpha-DCG@k = sum_{i <= k} G_i / log2(i + 1)`` and ``G_i`` as in :func:`_gains`; the
    ideal is the greedy reordering of the same list's passages (:func:`_ideal`), as this
    package's ``ndcg`` takes its ideal from the same judged list: it scores how well the
    engine orders what it found for novelty, and ``coverage@k`` how much it found. Every
    passage of the list must be ``ok``; undefined when none supports a nugget."""
    whole = _supported(a.coverage, None)
    if whole is None or a.coverage is None:
        return None
    ideal = _dcg(_ideal([s.passage_id for s in a.coverage.supports], whole, alpha), k)
    return _dcg(_gains(whole, alpha), k) / ideal if ideal > 0 else None


def err_ia_at(a: Aspects, k: int | None, alpha: float = ALPHA) -> float | None:
    """Intent-aware ERR (Chapelle et al., CIKM 2009) over the nuggets, uniform weights, each
    passage supporting nugget ``j`` stopping a user after ``j`` with probability ``alpha``::

        ERR-IA@k = (alpha / |N|) * sum_{i <= k} (1 / i) * G_i

    normalised as ndeval normalises it, by its value for a list whose every passage supports
    every nugget: ``(alpha / |N|) * |N| * sum_{i <= k} (1 / i) (1 - alpha)^(i - 1)``, so

        err_ia@k = sum_{i <= k} G_i / i  /  (|N| * sum_{i <= k} (1 - alpha)^(i - 1) / i)

    in [0, 1]. ``|N|`` counts every nugget of the set (ndeval: every subtopic with a relevant
    document). ndeval leaves ERR-IA@1 unnormalised (its loop starts at rank 2); this does not.
    Undefined for an empty set."""
    sets = _supported(a.coverage, k)
    if sets is None or a.coverage is None or not a.coverage.nuggets:
        return None
    raw = sum(g / (i + 1) for i, g in enumerate(_gains(sets, alpha)))
    depth = len(sets) if k is None else k
    best = sum((1.0 - alpha) ** i / (i + 1) for i in range(depth))
    return raw / (len(a.coverage.nuggets) * best) if best > 0 else None


def credibility_at(a: Aspects, k: int | None) -> float | None:
    """``credibility@k = mean_{i <= k} grade_i / CREDIBILITY_MAX``: the judge's source grades
    (0 low, 1 medium, 2 high) of the top k, in [0, 1]. Undefined for an empty list, or when
    a grade in the top k is missing (unparsed or error)."""
    top: Sequence[Credibility] = (a.credibility or ())[:k]
    if not top or any(c.status != "ok" or c.grade is None for c in top):
        return None
    return sum(c.grade or 0 for c in top) / (len(top) * CREDIBILITY_MAX)


def aspect_values(
    parsed: Sequence[tuple[str, AspectMetric, int | None]], aspects: Sequence[Aspects | None]
) -> dict[str, FloatArray]:
    """The value per query of each ``(name, kernel, k)`` (NaN where undefined, or where the
    query's dimension was not judged)."""
    empty = Aspects()
    return {
        name: np.array(
            [np.nan if (v := kernel(a or empty, k)) is None else v for a in aspects],
            dtype=np.float64,
        )
        for name, kernel, k in parsed
    }
