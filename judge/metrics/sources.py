"""Metrics on the retrieved passages themselves, no judge needed: redundancy and authority.

``near_dup@k`` and ``sites@k`` (:mod:`judge.metrics.redundancy`), ``authority@k`` and
``low_quality@k`` (:mod:`judge.metrics.authority`, from ``MetricPolicy.authority``) read the
passages' text and url in the engine's rank order. The judge's verdicts play no part: they
are the same whatever it said, cost no call, are never made undefined by an unparsed verdict,
and have nothing for human labels to correct. Without ``@k`` they cover the whole list.

Direction: :data:`LOWER_IS_BETTER` names the metrics where a rise is a regression
(``near_dup``, ``low_quality``); thresholds, ``judge compare`` and history read it through
:func:`lower_is_better`.
"""

from __future__ import annotations

import re
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
    "LOWER_IS_BETTER",
    "SOURCE_METRICS",
    "SourceMetric",
    "lower_is_better",
    "needs_no_judge",
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
    """What a metric reads per passage, and its value over the top k's features."""

    features: Features
    value: Callable[[Sequence[Any], MetricPolicy], float | None]
    lower_is_better: bool = False


SOURCE_METRICS: dict[str, SourceMetric] = {
    "near_dup": SourceMetric(_duplicates, lambda top, _: near_dup_rate(top), True),
    "sites": SourceMetric(_sites, lambda top, _: distinct_sites(top)),
    "authority": SourceMetric(_tiers, lambda top, p: authority_score(top, p.authority.scores)),
    "low_quality": SourceMetric(_tiers, lambda top, _: low_quality_share(top), True),
}
LOWER_IS_BETTER = frozenset(name for name, m in SOURCE_METRICS.items() if m.lower_is_better)

_BASE = re.compile(r"^([a-z0-9_.]+?)(?:@\d+)?$")


def _base(name: str) -> str | None:
    match = _BASE.match(name)
    return match.group(1) if match else None


def lower_is_better(name: str) -> bool:
    """True for a metric name (``near_dup@10``) whose rise is a regression; any other name,
    known or not (``ndcg@10``, ``pooled_ndcg``), is higher-is-better."""
    return _base(name) in LOWER_IS_BETTER


def needs_no_judge(name: str) -> bool:
    """True for a metric computed from the passages alone (see the module doc)."""
    return _base(name) in SOURCE_METRICS


def source_metrics(
    parsed: Sequence[tuple[str, str, int | None]],
    queries: Sequence[Query],
    policy: MetricPolicy,
) -> dict[str, FloatArray]:
    """Per ``(name, base, k)``, one value per query (NaN: undefined) over its top
    ``m = min(k, n)`` passages. Each kind of feature is computed once, to the deepest k asked."""
    out: dict[str, FloatArray] = {}
    cached: dict[Features, list[list[Any]]] = {}
    for feature in dict.fromkeys(SOURCE_METRICS[base].features for _, base, _ in parsed):
        ks = [k for _, base, k in parsed if SOURCE_METRICS[base].features is feature]
        depth = None if None in ks else max(k for k in ks if k is not None)
        cached[feature] = feature(queries, policy, depth)
    for name, base, k in parsed:
        metric = SOURCE_METRICS[base]
        values = [metric.value(per[:k], policy) for per in cached[metric.features]]
        out[name] = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    return out
