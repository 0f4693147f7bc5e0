"""[thresholds] checks of a run's summary: minimum and maximum metric means, the unparsed
rate, the drop (or rise) against a baseline summary, and a degenerate judge. A breach makes
``judge run`` exit 1."""

from __future__ import annotations

from pathlib import Path

from judge.config import RunConfig
from judge.metrics.facts import lower_is_better
from judge.report.summary import Check, Summary, ThresholdResult, load_summary

__all__ = ["check_thresholds"]


def check_thresholds(config: RunConfig, summary: Summary) -> ThresholdResult:
    """Compare the summary with [thresholds]; a breach makes ``judge run`` exit 1."""
    th, c = config.thresholds, summary.counts
    checks = [_at_most("unparsed_rate", c.unparsed_rate, th.max_unparsed_rate)]
    for engine, data in summary.engines.items():
        for kind, metric, limit in th.bounds():
            mean = data.mean(metric)
            ok = mean is not None and (mean >= limit if kind == "min" else mean <= limit)
            check = Check(check=f"{kind} {metric}", value=mean, limit=limit, ok=ok, engine=engine)
            checks.append(check)
    if th.baseline and th.max_drop and not Path(th.baseline).exists():
        # The first night has no baseline yet: say so in the report instead of failing.
        note = f"{th.baseline} not found: drop checks skipped"
        checks.append(Check(check="baseline", value=None, limit=None, ok=True, note=note))
    elif th.baseline and th.max_drop:
        checks += _drop_checks(summary, load_summary(th.baseline), th.max_drop)
    if th.fail_on_degenerate_judge:  # no value or limit: the note says why (analysis.health)
        problems = " ".join(summary.health.problems) or "not degenerate"
        ok = not summary.health.degenerate
        checks.append(Check(check="degenerate judge", value=None, limit=None, ok=ok, note=problems))
    return ThresholdResult.of(checks)


def _at_most(name: str, value: float, limit: float) -> Check:
    return Check(check=name, value=value, limit=limit, ok=value <= limit)


def _drop_checks(summary: Summary, base: Summary, max_drop: dict[str, float]) -> list[Check]:
    """Each engine's fall against the baseline (rise: lower-is-better), per metric it has."""
    checks = []
    for engine, data in summary.engines.items():
        for metric, limit in max_drop.items():
            before = base.engines[engine].mean(metric) if engine in base.engines else None
            if before is None:
                continue
            now, rise = data.mean(metric), lower_is_better(metric)
            drop = (now - before if rise else before - now) if now is not None else None
            checks.append(
                Check(
                    check=f"{'rise' if rise else 'drop'} {metric}",
                    value=drop,
                    limit=limit,
                    ok=drop is not None and drop <= limit,
                    engine=engine,
                    baseline=before,
                    current=now,
                )
            )
    return checks
