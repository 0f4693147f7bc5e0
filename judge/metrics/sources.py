"""Metrics on the retrieved passages themselves, no judge needed: redundancy and authority.

``near_dup@k`` and ``sites@k`` (:mod:`judge.metrics.redundancy`), ``authority@k`` and
``low_quality@k`` (:mod:`judge.metrics.authority`, from ``MetricPolicy.authority``) read the
passages' text and url in the engine's rank order. The judge's verdicts play no part: they
are the same whatever it said, cost no call, are never made undefined by an unparsed verdict,
and have nothing for human labels to correct. Without ``@k`` they cover the whole list.
Which are lower-is-better is said in their rows of :data:`judge.metrics.facts.METRICS`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from judge.metrics.authority import authority_score, low_quality_share, tier_list
from judge.metrics.hosts import site_of
from judge.metrics.ranked import FloatArray
from judge.metrics.redundancy import distinct_sites, near_dup_rate, near_duplicates
from judge.schema import MetricPolicy, Query

__all__ = [
    "AUTHORITY",
    "LOW_QUALITY",
    "NEAR_DUP",
    "SITES",
    "SourceMetric",
    "source_metrics",
]

# Per query, one value per passage of its top ``depth`` (None: all), computed once per call.
Features = Callable[[Sequence[Query], MetricPolicy, int | None], list[list[Any]]]


def _duplicates(queries: Sequence[Query], _: MetricPolicy, depth: int | None) -> list[list[Any]]:
    # A passage's flag depends only on those above it: the top ``depth`` serve every k <= depth.
    return [near_duplicates([p.text for p in q.passages[:depth]]) for q in queries]


def _sites(queries: Sequence[Query], _: MetricPolicy, depth: int | None) -> list[list[Any]]:
    return [[site_of(p.url) for p in q.passages[:depth]] for q in queries]


def _tiers(queries: Sequence[Query], policy: MetricPolicy, depth: int | None) -> list[list[Any]]:
    tiers = tier_list(policy.authority)
    return [[tiers.tier_of(p.url) for p in q.passages[:depth]] for q in queries]


@dataclass(frozen=True)
class SourceMetric:
    """A source metric's kernel: what it reads per passage, and its value over the top k's."""

    features: Features
    value: Callable[[Sequence[Any], MetricPolicy], float | None]


NEAR_DUP = SourceMetric(_duplicates, lambda top, _: near_dup_rate(top))
SITES = SourceMetric(_sites, lambda top, _: distinct_sites(top))
AUTHORITY = SourceMetric(_tiers, lambda top, p: authority_score(top, p.authority.scores))
LOW_QUALITY = SourceMetric(_tiers, lambda top, _: low_quality_share(top))


def source_metrics(
    parsed: Sequence[tuple[str, SourceMetric, int | None]],
    queries: Sequence[Query],
    policy: MetricPolicy,
) -> dict[str, FloatArray]:
    """Per ``(name, kernel, k)``, one value per query (NaN: undefined) over its top
    ``m = min(k, n)`` passages. Each kind of feature is computed once, to the deepest k asked."""
    out: dict[str, FloatArray] = {}
    cached: dict[Features, list[list[Any]]] = {}
    for feature in dict.fromkeys(metric.features for _, metric, _ in parsed):
        ks = [k for _, metric, k in parsed if metric.features is feature]
        depth = None if None in ks else max(k for k in ks if k is not None)
        cached[feature] = feature(queries, policy, depth)
    for name, metric, k in parsed:
        values = [metric.value(per[:k], policy) for per in cached[metric.features]]
        out[name] = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    return out
