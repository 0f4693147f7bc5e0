"""Human-corrected metrics: prediction-powered inference over queries with and without labels.

The judge scores every query; people have labelled a few. Three estimates of a metric's mean,
each with a 95% normal-approximation CI:

- **judge only**: the mean of the judge's values over every query (precise, possibly biased);
- **human only**: the mean of the values computed from human labels, on the labelled queries
  (unbiased, wide with few labels);
- **PPI++** (Angelopoulos, Bates, Fannjiang, Jordan, Zrnic, Science 2023; power tuning from
  Angelopoulos, Duchi, Zrnic 2023), over all queries. With ``f`` the judge's values and ``y``
  the human ones on the n labelled queries, ``f_u`` the judge's on the N others::

      theta = lam * mean(f_u) + mean(y - lam * f)
      se^2  = var(lam * f_u) / N + var(y - lam * f) / n          (population variances)
      lam   = cov(y, f) / ((1 + n / N) var(f, f_u))   clipped to [0, 1]

  ``lam = 1`` is plain PPI, ``lam = 0`` the human-only estimate: the tuned ``lam`` is never
  worse than either in large samples. The judge's bias is corrected by the labelled queries;
  its precision is borrowed from the rest.

These are the formulas of the ``ppi_py`` package's ``ppi_mean_ci`` (checked against it in
tests); written here in numpy because that package pulls in numba, pandas, statsmodels and
scikit-learn, heavy for a runtime dependency.

A labelled query is one whose every passage carries a human label; a query whose metric is
undefined (by the judge or by the labels) is left out of that metric's estimates.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import NormalDist

import numpy as np
from numpy.typing import ArrayLike

from judge.metrics.compute import metrics_for_queries
from judge.metrics.facts import needs_judge
from judge.schema import JudgedQuery, MetricPolicy, Record, Scale, Verdict

__all__ = ["Estimate", "MetricPPI", "human_verdicts", "ppi_mean", "ppi_metrics"]


class Estimate(Record):
    mean: float
    ci_low: float
    ci_high: float
    n: int

    @property
    def width(self) -> float:
        return self.ci_high - self.ci_low


class MetricPPI(Record):
    """One metric three ways; ``narrower`` = 1 - PPI width / human-only width."""

    metric: str
    judge_only: Estimate | None
    human_only: Estimate | None
    corrected: Estimate | None
    lam: float | None
    n_labelled: int
    n_unlabelled: int

    @property
    def narrower(self) -> float | None:
        if self.corrected is None or self.human_only is None or self.human_only.width == 0:
            return None
        return 1.0 - self.corrected.width / self.human_only.width


def _z(confidence: float) -> float:
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def _clt(values: np.ndarray, confidence: float) -> Estimate | None:
    if values.size == 0:
        return None
    mean = float(values.mean())
    half = _z(confidence) * float(values.std()) / np.sqrt(values.size)
    return _bounded(
        Estimate(mean=mean, ci_low=mean - half, ci_high=mean + half, n=int(values.size))
    )


def _bounded(estimate: Estimate) -> Estimate:
    """A normal interval of a metric in [0, 1] cut to [0, 1]: past it, it says nothing (a hit
    rate of 0.89 with an upper bound of 1.09)."""
    if not 0.0 <= estimate.mean <= 1.0:
        return estimate
    low, high = max(0.0, estimate.ci_low), min(1.0, estimate.ci_high)
    return estimate.model_copy(update={"ci_low": low, "ci_high": high})


def ppi_mean(
    y: ArrayLike,
    f: ArrayLike,
    f_unlabelled: ArrayLike,
    *,
    confidence: float = 0.95,
    lam: float | None = None,
) -> tuple[Estimate, float] | None:
    """PPI++ estimate of the mean of ``y`` and its CI, with the ``lam`` used (see the module
    docstring). None without labelled pairs or without unlabelled values."""
    yl, fl, fu = (np.asarray(a, dtype=np.float64) for a in (y, f, f_unlabelled))
    n, big_n = yl.size, fu.size
    if n < 2 or big_n < 2:
        return None
    if lam is None:
        theta1 = fu.mean() + (yl - fl).mean()
        g, gh = yl - theta1, fl - theta1
        cov = float(((g - g.mean()) * (gh - gh.mean())).sum()) / n
        var = float(np.var(np.concatenate([gh, fu - theta1]), ddof=1))
        lam = 0.0 if var == 0 else float(np.clip(cov / ((1 + n / big_n) * var), 0.0, 1.0))
    theta = float(lam * fu.mean() + (yl - lam * fl).mean())
    se = float(np.sqrt(np.var(lam * fu) / big_n + np.var(yl - lam * fl) / n))
    half = _z(confidence) * se
    return _bounded(
        Estimate(mean=theta, ci_low=theta - half, ci_high=theta + half, n=n + big_n)
    ), lam


def human_verdicts(jq: JudgedQuery, scale: Scale) -> list[Verdict] | None:
    """The human labels of a query as ok verdicts on ``scale``; None unless every passage
    has one (labels must already be on the judge's scale)."""
    labels = jq.query.labels or {}
    if not jq.query.passages or any(p.id not in labels for p in jq.query.passages):
        return None
    return [
        Verdict(
            passage_id=p.id,
            rank=rank,
            status="ok",
            label=scale.by_grade(labels[p.id]).name,
            grade=labels[p.id],
            relevant=scale.relevant(labels[p.id]),
        )
        for rank, p in enumerate(jq.query.passages, start=1)
    ]


def ppi_metrics(
    results: Sequence[JudgedQuery],
    names: Sequence[str],
    scale: Scale,
    policy: MetricPolicy = MetricPolicy(),
    *,
    confidence: float = 0.95,
) -> list[MetricPPI]:
    """Each metric judge-only, human-only and PPI-corrected over ``results`` (one row per
    query, engine and repeat; repeats count as separate draws)."""
    human = [human_verdicts(jq, scale) for jq in results]
    labelled = [i for i, h in enumerate(human) if h is not None]
    gold = metrics_for_queries(
        names, [(results[i].query, human[i] or []) for i in labelled], scale, policy
    )
    judged = metrics_for_queries(names, [(jq.query, jq.verdicts) for jq in results], scale, policy)
    is_labelled = set(labelled)
    out = []
    for name in names:
        pairs = [
            (g[name], judged[i][name])
            for i, g in zip(labelled, gold, strict=True)
            if g[name] is not None and judged[i][name] is not None
        ]
        rest = [
            value
            for i, row in enumerate(judged)
            if i not in is_labelled and (value := row[name]) is not None
        ]
        every = np.array([row[name] for row in judged if row[name] is not None], dtype=float)
        y = np.array([p[0] for p in pairs], dtype=float)
        f = np.array([p[1] for p in pairs], dtype=float)
        tuned = ppi_mean(y, f, rest, confidence=confidence)
        out.append(
            MetricPPI(
                metric=name,
                judge_only=_clt(every, confidence),
                human_only=_clt(y, confidence),
                corrected=tuned[0] if tuned else None,
                lam=tuned[1] if tuned else None,
                n_labelled=len(pairs),
                n_unlabelled=len(rest),
            )
        )
    return out


def ppi_by_engine(
    results: Sequence[JudgedQuery], names: Sequence[str], scale: Scale, policy: MetricPolicy
) -> dict[str, tuple[MetricPPI, ...]]:
    """:func:`ppi_metrics` per engine over the label-free metrics of ``names``, when any
    query carries human labels (else none)."""
    if not any(jq.query.labels for jq in results):
        return {}
    free = [n for n in names if needs_judge(n)]
    by_engine: dict[str, list[JudgedQuery]] = {}
    for jq in results:
        by_engine.setdefault(jq.query.engine, []).append(jq)
    return {
        engine: tuple(ppi_metrics(rows, free, scale, policy))
        for engine, rows in sorted(by_engine.items())
    }
