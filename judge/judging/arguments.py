"""``Judge(...)``'s arguments read into its records: the ``[judge]`` settings record from its
keywords, the dimensions' tables, the provider preset's overrides, the limits and the metric
policy. Each misuse is one ConfigError naming the argument, and a keyword that belongs in
another argument (``price`` in ``limits``, ``temperature`` in ``params``) says which.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from judge.calling.cache import Cache
from judge.calling.limits import Limits
from judge.config import JudgeSection
from judge.errors import ConfigError
from judge.judging.context import preset_context
from judge.judging.dimensions import DIMENSIONS
from judge.metrics.facts import parse_metric_name
from judge.providers import resolve_spec
from judge.providers.base import ChatProvider, ProviderSpec
from judge.schema import MetricPolicy, Scale

# The keywords Judge(...) reads into its settings record, besides provider and model.
_SETTINGS = frozenset(JudgeSection.model_fields) - {"provider", "model"}
_DIMENSION_NAMES = frozenset(d.name for d in DIMENSIONS)


def check_kinds(provider: object, model: object, scale: object, cache: object) -> None:
    """ConfigError naming the argument when one is of a kind Judge cannot read (an int as the
    provider had failed deep inside, as an AttributeError)."""
    kinds: tuple[tuple[str, object, tuple[type, ...], str], ...] = (
        ("cache", cache, (str, Path, Cache, type(None)), "a path or a Cache"),
        (
            "provider",
            provider,
            (str, ProviderSpec, ChatProvider, JudgeSection),
            "a preset name, a ProviderSpec, a ChatProvider or a JudgeSection",
        ),
        ("model", model, (str, type(None)), "a model name"),
        ("scale", scale, (str, Scale, type(None)), "a scale name or a Scale"),
    )
    for name, value, allowed, what in kinds:
        if not isinstance(value, allowed):
            raise ConfigError(f"Judge: {name}: expected {what}, got {type(value).__name__}")


# Keywords users give Judge that belong in one of its arguments: said where (they had been
# refused as unknown provider settings, and a max_cost's hint named price= as a keyword).
_ELSEWHERE = {
    **dict.fromkeys(
        ("price", "max_cost", "concurrency", "timeout_s", "max_attempts", "requests_per_minute"),
        "is a limit: Judge(..., limits={...}) or Limits(...)",
    ),
    **dict.fromkeys(
        ("temperature", "top_p", "seed", "logprobs", "top_logprobs", "stop"),
        "is a sampling setting: Judge(..., params={...})",
    ),
    "max_tokens": "is a sampling setting (params={'max_tokens': ...}) or, as a token budget, "
    "a limit (limits={'max_tokens': ...})",
}


def read_knobs(
    provider: object, model: str | None, scale: str | Scale | None, knobs: Mapping[str, Any]
) -> tuple[JudgeSection, dict[str, Any], dict[str, Any]]:
    """Judge's keywords as its settings record (given whole, or the keywords validated into
    it: ConfigError naming each bad one), the dimensions' tables by name, and the provider
    preset's overrides (every other keyword)."""
    settings = {k: v for k, v in knobs.items() if k in _SETTINGS}
    sections = {k: v for k, v in knobs.items() if k in _DIMENSION_NAMES}
    overrides = {k: v for k, v in knobs.items() if k not in _SETTINGS | _DIMENSION_NAMES}
    if misplaced := [f"{k} {_ELSEWHERE[k]}" for k in overrides if k in _ELSEWHERE]:
        raise ConfigError(f"Judge: {'; '.join(misplaced)}")
    if isinstance(provider, JudgeSection):
        if model is not None or settings:
            raise ConfigError("Judge(settings): give the settings record alone, or keywords")
        return provider, sections, overrides
    data = {k: str(v) if isinstance(v, Path) else v for k, v in settings.items()}
    data["provider"] = provider if isinstance(provider, str) else "custom"
    if model is not None:
        data["model"] = model
    if scale is not None:
        data["scale"] = scale if isinstance(scale, str) else scale.name
    try:
        return JudgeSection.model_validate(data), sections, overrides
    except ValidationError as exc:
        raise ConfigError(f"Judge: {problems(exc, 'settings')}") from None


def problems(exc: ValidationError, whole: str, prefix: str = "") -> str:
    """A validation error's problems on one line, each named by its field (``prefix`` before
    it; ``whole`` for the record's own checks)."""
    return "; ".join(
        f"{prefix + '.'.join(map(str, e['loc'])) if e['loc'] else whole}: "
        f"{e['msg'].removeprefix('Value error, ')}"
        for e in exc.errors()
    )


def with_window(
    settings: JudgeSection, named: object, overrides: Mapping[str, Any]
) -> JudgeSection:
    """``settings`` with the context window its provider preset declares (the embedded
    server's), when it gives none: as :meth:`Judge.from_config` fills it in."""
    if settings.context_tokens is not None or not isinstance(named, str | ProviderSpec):
        return settings
    window = preset_context(resolve_spec(named, overrides) if isinstance(named, str) else named)
    return settings.model_copy(update={"context_tokens": window}) if window else settings


def as_limits(limits: Limits | Mapping[str, Any] | None) -> Limits | None:
    """``limits`` as given, or a mapping of its fields checked as a Limits (one ConfigError
    naming each bad field: a dollar cap without a price, a concurrency of 0, ...)."""
    if limits is None or isinstance(limits, Limits):
        return limits
    if not isinstance(limits, Mapping):
        raise ConfigError(
            f"Judge: limits: expected a Limits or a dict, got {type(limits).__name__}"
        )
    try:
        return Limits.model_validate(dict(limits))
    except ValidationError as exc:
        raise ConfigError(f"Judge: {problems(exc, 'limits', 'limits.')}") from None


def as_policy(metrics: str | Sequence[str] | MetricPolicy) -> MetricPolicy:
    """``metrics`` as a policy, every name checked before anything is judged (one name given
    as a string is one metric, not its characters)."""
    if not isinstance(metrics, MetricPolicy):
        if not isinstance(metrics, str | Iterable) or isinstance(metrics, Mapping):
            raise ConfigError(
                f"Judge: metrics: expected metric names or a MetricPolicy, got "
                f"{type(metrics).__name__}"
            )
        names = (metrics,) if isinstance(metrics, str) else tuple(metrics)
        if not all(isinstance(n, str) for n in names):
            raise ConfigError(f"Judge: metrics: expected metric names, got {list(names)!r}")
        try:
            metrics = MetricPolicy(names=names)
        except ValidationError as exc:
            raise ConfigError(f"Judge: {problems(exc, 'metrics', 'metrics.')}") from None
    for name in metrics.names:
        parse_metric_name(name)  # ConfigError: unknown, with the valid names
    return metrics
