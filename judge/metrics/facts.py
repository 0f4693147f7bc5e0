"""One table of what is known about every metric: :data:`METRICS`, a row per base name.

A metric's name is a base and an optional cutoff, ``base@k`` (``ndcg@10``, ``label.recall@5``,
``near_dup``); every metric takes one, and without it covers the whole list. The names double
as report columns. A row (:class:`Metric`) says, once:

- ``kernel``: the pure function computing it, with its formula in its docstring;
- ``family``: what the kernel reads. ``label-free``: the judge's grades (:mod:`.ranked`);
  ``rerank``: per-passage scores in [0, 1], a reranker's or else the verdicts' probabilities
  (:mod:`.ranked`); ``soft``: the verdicts' P(relevant) (:mod:`.soft`); ``label``: which
  passages match the row's expected ids or texts (:mod:`.label_based`); ``source``: the
  passages' text and urls (:mod:`.sources`); ``coverage``: nugget supports and credibility
  grades (:mod:`.coverage`). :mod:`.compute` hands each family its input;
- ``better``: ``"lower"`` where a rise is a regression (``near_dup``, ``low_quality``):
  thresholds (``max``, ``max_drop`` as a rise), history and ``judge compare`` turn round;
- ``needs_judge``: whether a judge call feeds it (not for ``label`` and ``source``).

:func:`parse_metric_name` checks a name and says what is wrong with it. :func:`metric_of`,
:func:`family_of`, :func:`lower_is_better` and :func:`needs_judge` answer for any name and never
raise: a name without a row (a pooled one, ``pooled_ndcg@5``) has no family, needs no judge
here and is higher-is-better. The unknown-name error lists the bases in the table's order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, Literal, TypeVar

from judge.errors import ConfigError
from judge.metrics import coverage, label_based, ranked, soft, sources
from judge.schema import MetricPolicy

__all__ = [
    "METRICS",
    "Better",
    "Family",
    "Metric",
    "family_of",
    "lower_is_better",
    "metric_of",
    "needs_judge",
    "parse_metric_name",
]

Family = Literal["label-free", "rerank", "soft", "label", "source", "coverage"]
Better = Literal["higher", "lower"]
K = TypeVar("K")

# label.* read the row's expected ids or texts, source metrics the passages: no judge call.
_JUDGED: frozenset[Family] = frozenset({"label-free", "rerank", "soft", "coverage"})
_NAME = re.compile(r"^([a-z0-9_.]+?)(?:@(\d+))?$")


@dataclass(frozen=True)
class Metric(Generic[K]):
    """One metric's facts: its base name, what it reads, its kernel and its direction."""

    name: str
    family: Family
    kernel: K
    better: Better = "higher"
    unit: bool = True  # its values lie in [0, 1] (not so a count: sites)

    @property
    def needs_judge(self) -> bool:
        return self.family in _JUDGED


_ROWS: tuple[Metric[Any], ...] = (
    Metric("relevancy_mean", "label-free", ranked.relevancy_mean),
    Metric("relevancy_max", "label-free", ranked.relevancy_max),
    Metric("ap", "label-free", ranked.ap),
    Metric("ndcg", "label-free", ranked.ndcg),
    Metric("precision", "label-free", ranked.precision),
    Metric("hit", "label-free", ranked.hit),
    Metric("mrr", "label-free", ranked.mrr),
    Metric("rerank_mean", "rerank", ranked.rerank_mean),
    Metric("rerank_max", "rerank", ranked.rerank_max),
    Metric("rerank_median", "rerank", ranked.rerank_median),
    Metric("soft_precision", "soft", ranked.over_scores(soft.soft_precision)),
    Metric("soft_ap", "soft", ranked.over_scores(soft.soft_ap)),
    Metric("soft_ndcg", "soft", ranked.over_scores(soft.soft_ndcg)),
    Metric("label.hit_rate", "label", ranked.hit),
    Metric("label.hit_rate_granular", "label", label_based.recall),
    Metric("label.mrr", "label", ranked.mrr),
    Metric("label.mrr_granular", "label", label_based.mrr_granular),
    Metric("label.precision", "label", ranked.precision),
    Metric("label.recall", "label", label_based.recall),
    Metric("label.f1", "label", label_based.f1),
    Metric("label.ap", "label", label_based.label_ap),
    Metric("label.ndcg", "label", label_based.label_ndcg),
    Metric("near_dup", "source", sources.NEAR_DUP, better="lower"),
    Metric("sites", "source", sources.SITES, unit=False),
    Metric("authority", "source", sources.AUTHORITY),
    Metric("low_quality", "source", sources.LOW_QUALITY, better="lower"),
    Metric("coverage", "coverage", coverage.coverage_at),
    Metric("wcoverage", "coverage", coverage.wcoverage_at),
    Metric("alpha_ndcg", "coverage", coverage.alpha_ndcg_at),
    Metric("err_ia", "coverage", coverage.err_ia_at),
    Metric("credibility", "coverage", coverage.credibility_at),
)
METRICS: Mapping[str, Metric[Any]] = MappingProxyType({m.name: m for m in _ROWS})


def parse_metric_name(name: str) -> tuple[str, int | None]:
    """Split a canonical name: ``"ndcg@10" -> ("ndcg", 10)``, ``"ap" -> ("ap", None)``.

    Raises ConfigError naming the metric and listing the valid ones when it is unknown.
    """
    match = _NAME.match(name)
    if match and match.group(1) in METRICS:
        k = None if match.group(2) is None else int(match.group(2))
        if k is None or k >= 1:
            return match.group(1), k
        raise ConfigError(f"metric '{name}': the cutoff after '@' must be at least 1")
    hint, tidy = "", name.strip().lower()
    if tidy != name and (fixed := _NAME.match(tidy)) and fixed.group(1) in METRICS:
        hint = f" (did you mean '{tidy}'?)"
    raise ConfigError(
        f"unknown metric '{name}'{hint}; valid metrics: {', '.join(METRICS)}; "
        "each may take a cutoff '@k'"
    )


def metric_of(name: str) -> Metric[Any] | None:
    """The row of ``name``'s base (``near_dup@10``: near_dup's); None for any other name."""
    match = _NAME.match(name)
    return METRICS.get(match.group(1)) if match else None


def family_of(name: str) -> Family | None:
    """What the metric ``name`` reads (see the module doc); None for a name without a row."""
    metric = metric_of(name)
    return None if metric is None else metric.family


def lower_is_better(name: str) -> bool:
    """True for a metric name (``near_dup@10``) whose rise is a regression; any other name,
    known or not (``ndcg@10``, ``pooled_ndcg``), is higher-is-better."""
    metric = metric_of(name)
    return metric is not None and metric.better == "lower"


def needs_judge(name: str) -> bool:
    """True for a metric a judge call feeds; False for ``label.*``, source metrics and names
    without a row."""
    metric = metric_of(name)
    return metric is not None and metric.needs_judge


# The metrics a verdict compares engines on first, in order of preference.
RANK_BASES = ("ndcg", "ap", "soft_ndcg", "precision", "mrr", "hit", "relevancy_mean")


def primary_metric(names: Sequence[str], chosen: str | None = None) -> str | None:
    """The metric engines are compared on first: ``chosen`` when it is among ``names``, else
    ``ndcg@10``, else the first rank metric (by :data:`RANK_BASES`), else the first name."""
    if chosen is not None and chosen in names:
        return chosen
    if "ndcg@10" in names:
        return "ndcg@10"
    for base in RANK_BASES:
        found = next((n for n in names if n.split("@")[0] == base), None)
        if found is not None:
            return found
    return names[0] if names else None


def primary_named(policy: MetricPolicy) -> MetricPolicy:
    """``policy`` with its primary metric said outright (:func:`primary_metric` of its own
    names): a summary's, so that rows of an earlier config, holding other metrics beside
    the config's, never choose it (a rerun with other names had led its verdict with a
    metric the config no longer named)."""
    if policy.primary is not None:
        return policy
    return policy.model_copy(update={"primary": primary_metric(policy.names)})
