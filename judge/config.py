"""RunConfig: a TOML file (stdlib tomllib) plus command-line overrides.

Every table is a frozen record with unknown keys rejected, so a typo in a config is an
error naming the key, not a silently ignored setting. Relative paths in a config file are
taken from the file's folder; paths on the command line from the current directory.

Sections::

    [judge]      provider, model, scale, mode, language, template, template_dir, ...
    [judge.params]   sampling: temperature, max_tokens, logprobs, response_format, ...
    [judge.cascade]  the reranker labels the passages it is sure of, the LLM the band between
    [provider]   overrides of the provider preset: base_url, api_key_env, extra_body, ...
    [rerank]     optional rerank provider for rerank_* metrics
    [scales.NAME]  custom scales: threshold + labels [{name, grade, description, aliases}]
    [dataset]    path, columns, max_passage_chars, or a TREC run + passage store
    [run]        out, repeats, concurrency, timeouts, retries, rate limits, sample, budget, cache
    [metrics]    names, gain, unjudged, undefined_ap, relevance_threshold, grade_cuts
    [thresholds] min metric values, max drop against a baseline, max error/unparsed rate
    [prices.MODEL]  USD per million prompt / completion tokens
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from judge.errors import ConfigError
from judge.schema import (
    BUILTIN_SCALES,
    MetricPolicy,
    Record,
    SamplingParams,
    Scale,
    ScaleLabel,
    Usage,
)

Share = Annotated[float, Field(ge=0, le=1)]
# What judge asks for unless a config says otherwise: deterministic, with logprobs (for the
# probability of relevance) where the endpoint supports them.
DEFAULT_PARAMS = SamplingParams(temperature=0.0, max_tokens=512, logprobs=True, top_logprobs=5)


class CascadeSection(Record):
    """``[judge.cascade]`` (judging/cascade.py): reranker scores in [low, high) go to the LLM
    judge; lower ones get the scale's lowest label, the rest its highest. The band, one way:
    ``low`` and ``high``; ``quantiles`` of the run's scores; ``max_error`` on its human labels."""

    low: Share | None = None
    high: Share | None = None
    quantiles: tuple[Share, Share] | None = None
    max_error: float | None = Field(default=None, gt=0, lt=0.5)

    @model_validator(mode="after")
    def _one_band(self) -> CascadeSection:
        ways = [name for name, value in self if value is not None]
        if ways not in (["low", "high"], ["quantiles"], ["max_error"]):
            raise ValueError(f"set the band one way: low and high, quantiles or max_error: {ways}")
        low, high = self.quantiles or (self.low, self.high)
        if low is not None and high is not None and low > high:
            names = ("quantiles[0]", "quantiles[1]") if self.quantiles else ("low", "high")
            raise ValueError(f"{names[0]} {low} is above {names[1]} {high}")
        return self


class JudgeSection(Record):
    provider: str = "openai"
    model: str = "gpt-4o-mini"
    scale: str = "binary"
    mode: Literal["pointwise", "listwise"] = "pointwise"
    language: Literal["en", "zh"] = "en"
    # Explicit template name; default is "<scale>.<mode>.<language>".
    template: str | None = None
    template_dir: str | None = None
    verdict_first: bool = False
    max_reason_words: int = Field(default=30, ge=1)
    # False: ask for the verdict alone, without a reason. On a local llama.cpp server, whose
    # logprobs cost grows with every generated token, this is several times faster.
    reasons: bool = True
    # One re-ask carrying the validation error when an answer does not parse.
    reask: bool = True
    # The model's context window in tokens: passages are cut (visibly) so that every request
    # fits. None: the embedded judge's own n_ctx, otherwise not enforced.
    context_tokens: int | None = Field(default=None, ge=256)
    params: SamplingParams = DEFAULT_PARAMS
    # Opt-in: the [rerank] provider decides the passages it is sure of (see CascadeSection).
    cascade: CascadeSection | None = None

    @field_validator("params", mode="before")
    @classmethod
    def _over_defaults(cls, value: Any) -> Any:
        """A partial [judge.params] table changes only the keys it names."""
        if isinstance(value, dict):
            return {**DEFAULT_PARAMS.model_dump(exclude_defaults=True), **value}
        return value


class ProviderSection(Record):
    """Overrides of the preset named by ``judge.provider`` (see judge.providers.PRESETS)."""

    kind: Literal["openai", "dashscope", "rerank", "embedded", "embedded-rerank"] | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    supports_json_mode: bool | None = None
    supports_logprobs: bool | None = None
    extra_body: dict[str, Any] | None = None
    options: dict[str, Any] | None = None
    # Calls in flight to this provider (0 = [run] concurrency).
    concurrency: int = Field(default=0, ge=0)

    def overrides(self) -> dict[str, Any]:
        """The preset fields this table sets ([rerank]'s provider and model name no field)."""
        return self.model_dump(exclude_none=True, exclude={"concurrency", "provider", "model"})


class RerankSection(ProviderSection):
    provider: str
    model: str


class ScaleSection(Record):
    threshold: int
    labels: tuple[ScaleLabel, ...]


class DatasetSection(Record):
    path: str | None = None
    columns: dict[str, str] = Field(default_factory=dict)
    # The scale the rows' human labels use, when it is not the judge's (e.g. 0-3 labels
    # with a yes/no judge: a label counts as relevant at that scale's threshold).
    label_scale: str | None = None
    max_passage_chars: int = Field(default=8000, ge=0)
    # A TREC run + passage store + query texts instead of JSONL rows.
    trec_run: str | None = None
    passage_store: str | None = None
    queries: str | None = None


class RunSection(Record):
    out: str = "runs/latest"
    repeats: int = Field(default=1, ge=1)
    # Calls in flight: a hard ceiling. The limit starts at it (at most 64) and adapts to the
    # provider (halved on 429s and rising latency, grown one slot per round) unless
    # adaptive_concurrency = false keeps it fixed.
    concurrency: int = Field(default=64, ge=1)
    adaptive_concurrency: bool = True
    timeout_s: float = Field(default=60.0, gt=0)
    max_attempts: int = Field(default=6, ge=1)
    # Backoff: random in [0, base * 2^(attempt-1)], capped; a Retry-After is honoured (capped).
    backoff_base_s: float = Field(default=0.5, ge=0)
    max_backoff_s: float = Field(default=60.0, gt=0)
    requests_per_minute: float = Field(default=0.0, ge=0)
    tokens_per_minute: float = Field(default=0.0, ge=0)
    sample: int = Field(default=0, ge=0)
    seed: int = 0
    max_cost: float = Field(default=0.0, ge=0)
    max_tokens: int = Field(default=0, ge=0)
    # Stop with exit 3 once this share of finished passages has status "error".
    abort_error_rate: float = Field(default=0.5, ge=0, le=1)
    cache: str | None = None  # default: <user cache dir>/judge/cache.sqlite
    history: str | None = None  # default: <user cache dir>/judge/history.sqlite
    progress_interval_s: float = Field(default=10.0, gt=0)
    # Charts in report.html (drawing them is most of the time a cached re-run takes).
    charts: bool = True
    # After SIGINT/SIGTERM/SIGHUP, seconds the calls in flight get to finish before they are
    # cancelled (their units stay unfinished and resume on the next run).
    grace_s: float = Field(default=10.0, ge=0)


class ThresholdsSection(Record):
    min: dict[str, float] = Field(default_factory=dict)
    max_drop: dict[str, float] = Field(default_factory=dict)
    baseline: str | None = None
    # Defaults fail a run (exit 1) when more than 10% of verdicts are errors or unparsed.
    max_unparsed_rate: float = Field(default=0.1, ge=0, le=1)
    # Fail a run (exit 1) when the judge is degenerate (one label for nearly every passage, or
    # probabilities too flat to rank; see judge.analysis.health). Off: the report warns only.
    fail_on_degenerate_judge: bool = False


class Price(Record):
    prompt: float = Field(ge=0)  # USD per 1M prompt tokens
    completion: float = Field(ge=0)  # USD per 1M completion tokens

    def cost(self, usage: Usage) -> float:
        """USD for ``usage`` at this price: the one place a cost is computed."""
        return (usage.prompt_tokens * self.prompt + usage.completion_tokens * self.completion) / 1e6


class RunConfig(Record):
    judge: JudgeSection = JudgeSection()
    provider: ProviderSection = ProviderSection()
    rerank: RerankSection | None = None
    scales: dict[str, ScaleSection] = Field(default_factory=dict)
    dataset: DatasetSection = DatasetSection()
    run: RunSection = RunSection()
    metrics: MetricPolicy = MetricPolicy()
    thresholds: ThresholdsSection = ThresholdsSection()
    prices: dict[str, Price] = Field(default_factory=dict)
    # Where the config came from (for messages); not part of any fingerprint.
    source: str | None = None

    def scale(self) -> Scale:
        name = self.judge.scale
        if name in self.scales:
            section = self.scales[name]
            try:
                return Scale(name=name, threshold=section.threshold, labels=section.labels)
            except ValidationError as exc:
                raise ConfigError(f"{self.source}: [scales.{name}]: {_first_error(exc)}") from None
        if name in BUILTIN_SCALES:
            return Scale.named(name)
        known = sorted({*BUILTIN_SCALES, *self.scales})
        raise ConfigError(f"{self.source}: judge.scale '{name}' is not one of {known}")

    def label_scale(self) -> Scale:
        """The scale of the human labels (default: the judge's)."""
        name = self.dataset.label_scale
        if name is None:
            return self.scale()
        judge = self.judge.model_copy(update={"scale": name})
        return self.model_copy(update={"judge": judge}).scale()

    def comparable_label_scale(self) -> Scale:
        """The human labels' scale, if the judge's verdicts can be compared with it: equal
        scales, or a binary judge (other labels map through relevance); else ConfigError."""
        scale, labels = self.scale(), self.label_scale()
        if labels != scale and not scale.is_binary:
            raise ConfigError(
                f"{self.source}: labels on scale '{labels.name}' cannot be compared with the "
                f"{scale.name} judge; only a binary judge maps other labels through relevance"
            )
        return labels

    def price(self) -> Price | None:
        return self.prices.get(self.judge.model)

    def cache_path(self) -> Path:
        return Path(self.run.cache) if self.run.cache else user_cache_dir() / "cache.sqlite"

    def history_path(self) -> Path:
        return Path(self.run.history) if self.run.history else user_cache_dir() / "history.sqlite"

    def fingerprint(self) -> dict[str, Any]:
        """What must match for a run directory to be resumed (everything that changes answers)."""
        return {
            "judge": self.judge.model_dump(mode="json"),
            "provider": self.provider.overrides(),
            "rerank": self.rerank.model_dump(mode="json") if self.rerank else None,
            "scale": self.scale().model_dump(mode="json"),
            "repeats": self.run.repeats,
        }


def user_cache_dir() -> Path:
    """$JUDGE_CACHE_DIR, else $XDG_CACHE_HOME/judge, else ~/.cache/judge."""
    if os.environ.get("JUDGE_CACHE_DIR"):
        return Path(os.environ["JUDGE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "judge"


def _first_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{loc}: {err['msg'].removeprefix('Value error, ')}")
    more = len(exc.errors()) - len(parts)
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


# key=value, where the key may hold quoted parts containing "=" or ".".
_OVERRIDE = re.compile(r"""^((?:[^="']|"[^"]*"|'[^']*')+)=(.*)$""", re.S)


def _key_path(dotted: str) -> list[str]:
    """A TOML dotted key as its parts: ``prices."gpt-4.1".prompt`` -> prices, gpt-4.1, prompt."""
    try:
        node: Any = tomllib.loads(f"{dotted} = 0")
    except tomllib.TOMLDecodeError:
        raise ConfigError(f"override '{dotted}': not a TOML key (quote parts with dots)") from None
    parts = []
    while isinstance(node, dict):
        (key, node), *_ = node.items()
        parts.append(key)
    return parts


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = _key_path(dotted)
    node = data
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override '{dotted}': '{key}' is not a table")
        node = child
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``section.key=value`` with the value read as TOML (falls back to a bare string).

    The key is a TOML dotted key, so quoted parts keep dots and ``=``:
    ``prices."gpt-4.1"={prompt=2, completion=8}``.
    """
    split = _OVERRIDE.match(text)
    if split is None:
        raise ConfigError(f"override '{text}' must look like section.key=value")
    key, raw = split.group(1).strip(), split.group(2)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    _key_path(key)  # a malformed key is named now, not as a missing table later
    return key, value


# Paths a config file holds; relative ones are taken from the file's own folder, so a config
# means the same wherever `judge` runs. Paths given on the command line stay relative to the
# current directory.
_PATH_KEYS = (
    ("dataset", "path"),
    ("dataset", "trec_run"),
    ("dataset", "passage_store"),
    ("dataset", "queries"),
    ("run", "out"),
    ("run", "cache"),
    ("run", "history"),
    ("thresholds", "baseline"),
    ("judge", "template_dir"),
)


def _relative_to(folder: Path, data: dict[str, Any]) -> None:
    for table, key in _PATH_KEYS:
        section = data.get(table)
        value = section.get(key) if isinstance(section, dict) else None
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            section[key] = os.path.normpath(folder / value)  # type: ignore[index]


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a TOML config and apply dotted overrides (``{"run.repeats": 3}``)."""
    data: dict[str, Any] = {}
    source = "<defaults>"
    if path is not None:
        source = str(path)
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from None
        except (ValueError, RecursionError) as exc:  # undecodable bytes, absurd nesting
            raise ConfigError(f"{path}: not a readable TOML file: {type(exc).__name__}") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    if path is not None:
        _relative_to(Path(path).parent, data)
    for key, value in (overrides or {}).items():
        _set_dotted(data, key, value)
    data["source"] = source
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_first_error(exc)}") from None
    config.metrics.check_scale(config.scale(), source)  # custom scales, grade_cuts: early
    return config


def set_config_value(path: Path, dotted: str, value: Any) -> None:
    """Set one key of a TOML config file in place, keeping its comments and layout."""
    import tomlkit  # only this writer needs it

    try:
        doc = tomlkit.parse(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot update the config: {exc}") from None
    *tables, key = _key_path(dotted)
    node: Any = doc
    for name in tables:
        if name not in node:
            node[name] = tomlkit.table()
        node = node[name]
    node[key] = value
    path.write_text(tomlkit.dumps(doc), encoding="utf-8")
