"""summary.json: the machine-readable result of a run, and the threshold checks on it.

``SCHEMA_VERSION`` is bumped whenever a field changes meaning or moves. The summary holds
counts (ok / unparsed / error — never folded into "not relevant"), usage and cost, per-engine
metric means with repeat stability and bootstrap CIs, label flips, Krippendorff's alpha,
agreement with human labels where rows carry them, and which thresholds were breached.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from judge import __version__
from judge.config import RunConfig
from judge.errors import ConfigError, InputError
from judge.schema import JudgedQuery
from judge.stability import majority_vote, stability_report

SCHEMA_VERSION = 1


def _mean(values: Iterable[float | None]) -> float | None:
    defined = [v for v in values if v is not None]
    return sum(defined) / len(defined) if defined else None


def _rate(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def counts(results: Sequence[JudgedQuery]) -> dict[str, Any]:
    status: Counter[str] = Counter(v.status for jq in results for v in jq.verdicts)
    total = sum(status.values())
    return {
        "queries": len({(jq.query.query_id, jq.query.engine) for jq in results}),
        "query_ids": len({jq.query.query_id for jq in results}),
        "engines": sorted({jq.query.engine for jq in results}),
        "repeats": len({jq.repeat for jq in results}),
        "judged_units": len(results),
        "verdicts": total,
        "ok": status["ok"],
        "unparsed": status["unparsed"],
        "error": status["error"],
        "error_rate": _rate(status["error"], total),
        "unparsed_rate": _rate(status["unparsed"], total),
        "empty_queries": sum(1 for jq in results if not jq.verdicts),
        "cached_verdicts": sum(1 for jq in results for v in jq.verdicts if v.cached),
    }


def usage(results: Sequence[JudgedQuery], config: RunConfig) -> dict[str, Any]:
    prompt = sum(jq.usage.prompt_tokens for jq in results)
    completion = sum(jq.usage.completion_tokens for jq in results)
    n = sum(len(jq.verdicts) for jq in results)
    price = config.price()
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "prompt_tokens_per_passage": _rate(prompt, n),
        "completion_tokens_per_passage": _rate(completion, n),
        # What these results cost at list price, cached answers included (what a cold run pays).
        "cost_usd": (prompt * price.prompt + completion * price.completion) / 1e6
        if price
        else None,
    }


def build_summary(
    config: RunConfig,
    results: Sequence[JudgedQuery],
    *,
    run: dict[str, Any] | None = None,
    n_boot: int = 2000,
) -> dict[str, Any]:
    scale = config.scale()
    names = list(config.metrics.names)
    present = {name for jq in results for name in jq.metrics}
    names += sorted(present - set(names))
    results = labels_on_scale(results, config)
    report = stability_report(results, names, scale, n_boot=n_boot, seed=config.run.seed)
    voted = majority_vote(
        results,
        names,
        scale,
        gain=config.metrics.gain,
        unjudged=config.metrics.unjudged,
        undefined_ap=config.metrics.undefined_ap,
    )
    engines: dict[str, Any] = {}
    for engine, est in report.engines.items():
        engines[engine] = {
            # Metrics of the majority-vote verdicts across repeats (ties -> the lower grade).
            "majority_vote": {
                name: _mean(jq.metrics.get(name) for jq in voted if jq.query.engine == engine)
                for name in names
            },
            "n_queries": est.n_queries,
            "n_repeats": est.n_repeats,
            "metrics": {
                name: {
                    "mean": ms.mean,
                    "ci_low": ms.ci_low,
                    "ci_high": ms.ci_high,
                    "std_across_repeats": ms.std,
                    "max_rel_diff": ms.max_rel_diff,
                    "per_repeat": list(ms.per_repeat),
                    "n_defined": ms.n_defined,
                    "n_undefined": ms.n_undefined,
                }
                for name, ms in est.metrics.items()
            },
        }
    summary: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "judge_version": __version__,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "config": {"source": config.source, **config.fingerprint()},
        "dataset": config.dataset.path or config.dataset.trec_run,
        "gain": config.metrics.gain,
        "metric_names": names,
        "unjudged_policy": config.metrics.unjudged,
        "counts": counts(results),
        "usage": usage(results, config),
        "run": run or {},
        "engines": engines,
        "stability": report.model_dump(mode="json"),
    }
    summary["thresholds"] = check_thresholds(config, summary)
    return summary


def labels_on_scale(results: Sequence[JudgedQuery], config: RunConfig) -> list[JudgedQuery]:
    """Human labels expressed on the judge's scale.

    Labels on another scale are mapped through relevance: a binary judge compares with
    ``label >= label_scale.threshold``. A graded judge cannot be compared with coarser labels.
    """
    scale, label_scale = config.scale(), config.label_scale()
    if label_scale == scale:
        return list(results)
    if not scale.is_binary:
        raise ConfigError(
            f"{config.source}: labels on scale '{label_scale.name}' cannot be compared with "
            f"the {scale.name} judge; only a binary judge maps other labels through relevance"
        )
    out = []
    for jq in results:
        labels = jq.query.labels
        if labels:
            mapped = {pid: int(label_scale.relevant(g)) for pid, g in labels.items()}
            jq = jq.model_copy(update={"query": jq.query.model_copy(update={"labels": mapped})})
        out.append(jq)
    return out


def load_summary(path: str | Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("summary file not found", file=str(path)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"not a JSON summary: {exc}", file=str(path)) from None
    if not isinstance(data, dict) or "engines" not in data:
        raise InputError("not a judge summary.json (no 'engines')", file=str(path))
    return data


def check_thresholds(config: RunConfig, summary: dict[str, Any]) -> dict[str, Any]:
    """Compare the summary with [thresholds]; a breach makes ``judge run`` exit 1."""
    th = config.thresholds
    checks: list[dict[str, Any]] = []

    def check(name: str, value: float | None, limit: float, ok: bool, **extra: Any) -> None:
        checks.append({"check": name, "value": value, "limit": limit, "ok": ok, **extra})

    c = summary["counts"]
    check("error_rate", c["error_rate"], th.max_error_rate, c["error_rate"] <= th.max_error_rate)
    check(
        "unparsed_rate",
        c["unparsed_rate"],
        th.max_unparsed_rate,
        c["unparsed_rate"] <= th.max_unparsed_rate,
    )
    for engine, data in summary["engines"].items():
        for metric, minimum in th.min.items():
            mean = data["metrics"].get(metric, {}).get("mean")
            check(
                f"min {metric}", mean, minimum, mean is not None and mean >= minimum, engine=engine
            )
    if th.baseline and th.max_drop and not Path(th.baseline).exists():
        # The first night has no baseline yet: say so in the report instead of failing.
        checks.append(
            {
                "check": "baseline",
                "value": None,
                "limit": None,
                "ok": True,
                "note": f"{th.baseline} not found: drop checks skipped",
            }
        )
    elif th.baseline and th.max_drop:
        base = load_summary(th.baseline)
        for engine, data in summary["engines"].items():
            for metric, max_drop in th.max_drop.items():
                now = data["metrics"].get(metric, {}).get("mean")
                before = (
                    base["engines"].get(engine, {}).get("metrics", {}).get(metric, {}).get("mean")
                )
                if before is None:
                    continue
                drop = before - now if now is not None else None
                check(
                    f"drop {metric}",
                    drop,
                    max_drop,
                    drop is not None and drop <= max_drop,
                    engine=engine,
                    baseline=before,
                    current=now,
                )
    breaches = [c for c in checks if not c["ok"]]
    return {"checks": checks, "breached": len(breaches), "breaches": breaches}
