"""Older summary.json files in the current schema's shape, so they still load as baselines.

:func:`judge.report.summary.load_summary` hands a version-1 file's JSON to :func:`from_v1`
with the empty tables of the current records (:class:`V1Defaults`, built from their fields
so a new field is filled too); this module imports nothing from the summary, so the summary
can import it. A file of any version without ``health`` (written before the judge's health
was measured) is given an unknown health by the loader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from judge.schema import BUILTIN_SCALES, Scale

__all__ = ["V1Defaults", "from_v1"]


@dataclass(frozen=True)
class V1Defaults:
    """What a version-1 file may leave out, as the current schema's tables."""

    schema_version: int
    counts: dict[str, Any]
    usage: dict[str, Any]
    engine: dict[str, Any]
    metric: dict[str, Any]


def _table(data: dict[str, Any], key: str, defaults: dict[str, Any]) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ValueError(f"'{key}' is not a table")
    return {**defaults, **value}


def from_v1(data: dict[str, Any], defaults: V1Defaults) -> dict[str, Any]:
    """A version-1 summary in this schema's shape, for old files kept as baselines.

    Version 1 kept the policy as top-level "gain" and "unjudged_policy" (its "undefined_ap"
    was not recorded: the default is assumed) and wrote ``"run": {}`` for no run outcome;
    early writers left out "dataset", "gain" and each engine's "majority_vote". What a file
    does not say (a hand-written baseline may give only engine means) is filled with empty
    values: zero counts and tokens, no stability per engine, no checks. Raises ValueError or
    TypeError for a table of the wrong type.
    """
    config = _table(data, "config", {"source": None, "judge": {}, "provider": {}, "rerank": None})
    if config.get("scale") is None:  # the built-in scale the stability names, else binary
        named = str(_table(data, "stability", {}).get("scale"))
        config["scale"] = BUILTIN_SCALES.get(named, Scale.binary)()
    scale = Scale.model_validate(config["scale"])
    counts = _table(data, "counts", defaults.counts)
    config.setdefault("repeats", counts["repeats"] or 1)
    engines = _table(data, "engines", {})
    engines = {engine: _table(engines, engine, defaults.engine) for engine in engines}
    for body in engines.values():
        body["metrics"] = {m: defaults.metric | v for m, v in _table(body, "metrics", {}).items()}
    names = data.get("metric_names") or sorted({m for b in engines.values() for m in b["metrics"]})
    gain, unjudged = data.get("gain", "linear"), data.get("unjudged_policy", "undefined")
    policy = {"names": names, "gain": gain, "unjudged": unjudged}
    level = "nominal" if scale.is_binary else "ordinal"
    stability = {"scale": scale.name, "alpha_level": level, "alpha": None, "n_boot": 2000}
    return {
        "schema_version": defaults.schema_version,
        "judge_version": data.get("judge_version", "unknown"),
        "created": data.get("created", ""),
        "config": config,
        "dataset": data.get("dataset"),
        "policy": policy,
        "metric_names": names,
        "counts": counts,
        "usage": _table(data, "usage", defaults.usage),
        "run": data.get("run") or None,
        "engines": engines,
        "stability": _table(data, "stability", stability | {"seed": 0, "engines": {}}),
        "thresholds": _table(data, "thresholds", {"checks": [], "breached": 0, "breaches": []}),
    }
