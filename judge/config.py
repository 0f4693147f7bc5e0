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
    [metrics.authority]  source tiers: rules per tier, scores, defaults (judge/tiers.py)
    [thresholds] min / max metric values, max drop against a baseline, max unparsed rate
    [prices.MODEL]  USD per million prompt / completion tokens
    [nuggets]    opt-in coverage: nugget creation and assignment (path: a nugget file)
    [credibility]  opt-in: the judge grades each passage's source
    [telemetry]  OpenTelemetry spans: include_text (judge/calling/telemetry.py)
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from judge.errors import ConfigError
from judge.schema import BUILTIN_SCALES, MetricPolicy, Record, Scale
from judge.sections import (
    DEFAULT_PARAMS,
    CascadeSection,
    CredibilitySection,
    DatasetSection,
    JudgeSection,
    NuggetsSection,
    Price,
    ProviderSection,
    RerankSection,
    RunSection,
    ScaleSection,
    TelemetrySection,
    ThresholdsSection,
    aspect_metric_problem,
    with_dimension_defaults,
)

__all__ = [
    "DEFAULT_PARAMS",
    "CascadeSection",
    "CredibilitySection",
    "DatasetSection",
    "JudgeSection",
    "NuggetsSection",
    "Price",
    "ProviderSection",
    "RerankSection",
    "RunConfig",
    "RunSection",
    "ScaleSection",
    "TelemetrySection",
    "ThresholdsSection",
    "load_config",
    "parse_override",
    "set_config_value",
    "user_cache_dir",
]


class RunConfig(Record):
    judge: JudgeSection = JudgeSection()
    provider: ProviderSection = ProviderSection()
    rerank: RerankSection | None = None
    scales: dict[str, ScaleSection] = Field(default_factory=dict)
    dataset: DatasetSection = DatasetSection()
    run: RunSection = RunSection()
    metrics: MetricPolicy = MetricPolicy()
    thresholds: ThresholdsSection = ThresholdsSection()
    nuggets: NuggetsSection = NuggetsSection()
    credibility: CredibilitySection = CredibilitySection()
    telemetry: TelemetrySection = TelemetrySection()
    prices: dict[str, Price] = Field(default_factory=dict)
    # Where the config came from (for messages); not part of any fingerprint.
    source: str | None = None
    # The command line's settings over the file (--set and the flags), paths made absolute: a
    # run's run.json keeps them, so its summary can be made again as the run made it.
    overrides: dict[str, Any] = Field(default_factory=dict)

    def scale(self, key: str = "judge.scale") -> Scale:
        """The scale ``judge.scale`` names (``key``: the setting that named it, for the
        error)."""
        name = self.judge.scale if key == "judge.scale" else self.dataset.label_scale or ""
        if name in self.scales:
            section = self.scales[name]
            try:
                return Scale(name=name, threshold=section.threshold, labels=section.labels)
            except ValidationError as exc:
                raise ConfigError(f"{self.source}: [scales.{name}]: {_first_error(exc)}") from None
        if name in BUILTIN_SCALES:
            return Scale.named(name)
        known = sorted({*BUILTIN_SCALES, *self.scales})
        raise ConfigError(f"{self.source}: {key} '{name}' is not one of {known}")

    def label_scale(self) -> Scale:
        """The scale of the human labels (default: the judge's)."""
        if self.dataset.label_scale is None:
            return self.scale()
        return self.scale("dataset.label_scale")

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

    def metric_names(self) -> tuple[str, ...]:
        """The metrics a run of this config computes: ``[metrics] names`` and the defaults of
        the dimensions turned on (``[nuggets]``, ``[credibility]``) that it names none of."""
        on = (s.DEFAULT for s in (self.nuggets, self.credibility) if s.enabled)
        return with_dimension_defaults(self.metrics.names, on)

    def fingerprint(self) -> dict[str, Any]:
        """What must match for a run directory to be resumed (everything that changes answers)."""
        aspects = {
            "nuggets": self.nuggets.model_dump(mode="json") if self.nuggets.enabled else None,
            "credibility": self.credibility.enabled or None,
        }
        return {
            "judge": self.judge.model_dump(mode="json"),
            "provider": self.provider.overrides(),
            "rerank": self.rerank.model_dump(mode="json") if self.rerank else None,
            "scale": self.scale().model_dump(mode="json"),
            "repeats": self.run.repeats,
            # Only when on, so a run directory made without them still resumes.
            **({"aspects": aspects} if any(aspects.values()) else {}),
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
        if err["type"] == "extra_forbidden":  # a misspelt key: say so, and what it may be
            parts.append(f"{loc}: unknown key{_did_you_mean(exc, err['loc'])}")
            continue
        parts.append(f"{loc}: {err['msg'].removeprefix('Value error, ')}")
    more = len(exc.errors()) - len(parts)
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


def _did_you_mean(exc: ValidationError, loc: tuple[int | str, ...]) -> str:
    """`` (did you mean 'repeats'?)`` for a key close to one the table takes, else ''."""
    table: Any = RunConfig
    for part in loc[:-1]:  # down to the record the key was given in (an optional one too)
        field = getattr(table, "model_fields", {}).get(part)
        kinds = [getattr(field, "annotation", None)]
        kinds += list(typing.get_args(kinds[0]))
        records = [k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)]
        if not records:
            return ""
        table = records[0]
    known = list(getattr(table, "model_fields", {}))
    given = str(loc[-1])
    close = difflib.get_close_matches(given, known, n=3, cutoff=0.6)
    # Two letters swapped ("modle") is one slip, as one letter dropped is: of the close keys,
    # one that holds the same letters as the key given comes first ("model", not "mode").
    close.sort(key=lambda k: sorted(k) != sorted(given))
    return f" (did you mean '{close[0]}'?)" if close else ""


def _blamed(exc: ValidationError, source: str, overrides: dict[str, Any]) -> str:
    """Where the first error's value came from: the config file, or the ``--set`` (an
    override) that set it (its error was blamed on the file, which never said it)."""
    loc = [str(p) for p in exc.errors()[0]["loc"]]
    for key in overrides:
        parts = _key_path(key)
        if len(parts) < 2:  # a whole table (the pytest plugin's [tool.judge]): not a --set
            continue
        if loc[: len(parts)] == parts or parts[: len(loc)] == loc:
            return f"--set {key}"
    return source


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
    ("nuggets", "path"),
)


def _relative_to(folder: Path, data: dict[str, Any]) -> None:
    for table, key in _PATH_KEYS:
        section = data.get(table)
        value = section.get(key) if isinstance(section, dict) else None
        if isinstance(value, str) and value:
            home = os.path.expanduser(value)  # "~/runs": the user's, as a shell would say
            absolute = home if Path(home).is_absolute() else os.path.normpath(folder / value)
            section[key] = absolute  # type: ignore[index]


def _toml_text(raw: bytes) -> str:
    """A TOML file's text: UTF-8, a leading byte-order mark dropped (editors on Windows write
    one; tomllib read it as "Invalid statement at line 1, column 1")."""
    return raw.decode("utf-8").removeprefix("\ufeff")


def _utf16(raw: bytes) -> str:
    """ ", saved as UTF-16" when ``raw`` starts with a UTF-16 byte-order mark, else ""."""
    return ", saved as UTF-16" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else ""


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a TOML config and apply dotted overrides (``{"run.repeats": 3}``)."""
    data: dict[str, Any] = {}
    source = "<defaults>"
    if path is not None:
        source = str(path)
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
            data = tomllib.loads(_toml_text(raw))
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{path}: not UTF-8 (byte {exc.start + 1}: {raw[exc.start : exc.start + 1]!r}"
                f"){_utf16(raw)}; TOML is UTF-8"
            ) from None
        except (ValueError, RecursionError) as exc:  # absurd nesting
            raise ConfigError(f"{path}: not a readable TOML file: {type(exc).__name__}") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    if path is not None:
        _relative_to(Path(path).parent, data)
    given: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        if isinstance(value, str) and tuple(key.split(".")) in _PATH_KEYS:
            value = os.path.expanduser(value)  # from the command line: the current folder's
            given[key] = os.path.abspath(value) if value else value
        else:
            given[key] = value
        _set_dotted(data, key, value)
    data["source"] = source
    data["overrides"] = given
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{_blamed(exc, source, overrides or {})}: {_first_error(exc)}") from None
    config.metrics.check_scale(config.scale(), source)  # custom scales, grade_cuts: early
    if problem := aspect_metric_problem(config.metrics.names, config.nuggets, config.credibility):
        raise ConfigError(f"{source}: {problem}")
    primary, names = config.metrics.primary, config.metrics.names
    if not names:  # a run of no metric says nothing of its engines
        said = [f"--set {k}" for k in overrides or {} if k == "metrics.names"]
        raise ConfigError(
            f"{said[0] if said else f'{source}: metrics.names'}: empty: name at least one "
            "metric (leave it out for the defaults)"
        )
    if primary is not None and primary not in names:  # it would be passed over in silence
        said = [f"--set {k}" for k in overrides or {} if k in ("metrics.primary", "metrics.names")]
        raise ConfigError(
            f"{said[0] if said else f'{source}: metrics.primary'}: '{primary}' is not one of "
            f"[metrics] names ({', '.join(names)}): add it there, or choose one of them"
        )
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
