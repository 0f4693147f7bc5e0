"""The tables of a run config, one frozen record each (unknown keys rejected); prices.

`judge.config` assembles them into `RunConfig` and loads TOML; the names are re-exported there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from judge.schema import (
    ProviderKind,
    Record,
    SamplingParams,
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
    ``low`` and ``high``; ``quantiles`` of the run's scores; ``max_error`` on its human labels.
    ``echo_floor`` (judging/echo.py): a passage above the band is labelled relevant by the
    reranker only when its score with the query's own words masked reaches this floor; else it
    goes to the LLM, flagged ``echo``. 0 (or None) turns the check off: the reranker's score
    alone decides."""

    low: Share | None = None
    high: Share | None = None
    quantiles: tuple[Share, Share] | None = None
    max_error: float | None = Field(default=None, gt=0, lt=0.5)
    echo_floor: Share | None = 0.45

    @model_validator(mode="after")
    def _one_band(self) -> CascadeSection:
        ways = [
            name
            for name, value in self
            if value is not None and name in ("low", "high", "quantiles", "max_error")
        ]
        if ways not in (["low", "high"], ["quantiles"], ["max_error"]):
            raise ValueError(f"set the band one way: low and high, quantiles or max_error: {ways}")
        low, high = self.quantiles or (self.low, self.high)
        if low is not None and high is not None and low > high:
            names = ("quantiles[0]", "quantiles[1]") if self.quantiles else ("low", "high")
            raise ValueError(f"{names[0]} {low} is above {names[1]} {high}")
        return self


# Presets of servers a user runs: they serve their own models, none of them the default's.
_OWN_MODEL_SERVERS = {"local": "vLLM", "ollama": "Ollama", "llamacpp": "llama.cpp"}


class JudgeSection(Record):
    provider: str = "openai"
    # OpenAI's; a server the user runs (local, ollama, llamacpp) must be told its own.
    model: str = Field(default="gpt-4o-mini", min_length=1)
    scale: str = "binary"
    mode: Literal["pointwise", "listwise"] = "pointwise"
    # Listwise: passages one request holds at most; a longer list is judged in windows of this
    # many, each fitted to the context window (one request for 3,000 passages had been cut to
    # a few words each, its answer cut off at max_tokens).
    # None: LIST_SIZE (unset, it is no setting of a run's fingerprint: a run directory made
    # before the setting existed resumes).
    list_size: int | None = Field(default=None, ge=1, le=1000, strict=True)
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
    # Text aimed at the judge (forged fences and verdicts, instructions to it, the query stuffed
    # in): "flag" finds it and leaves it in place (each passage's "aimed", the verdict's signal
    # "aimed"); "cut" takes it out first (each passage's "removed", signal "sanitised"); "off"
    # looks for none. true and false, as older configs say, mean "flag" and "off".
    sanitise: Literal["flag", "cut", "off"] = "flag"
    # How passages are set apart from the prompt: "datamark" joins each passage's words with
    # "^" inside its fence (spotlighting: instructions in a passage stop reading as the
    # prompt's own; ~1.8x the passage's tokens); "fence": the <passage> fence alone.
    spotlight: Literal["datamark", "fence"] = "datamark"
    params: SamplingParams = DEFAULT_PARAMS
    # Opt-in: the [rerank] provider decides the passages it is sure of (see CascadeSection).
    cascade: CascadeSection | None = None

    @model_validator(mode="after")
    def _model_for_own_server(self) -> JudgeSection:
        """A server the user runs is not sent the default OpenAI model name: it would answer
        every request 404 (vLLM, Ollama), or judge with whatever it has loaded under a name
        the reports would carry (llama.cpp)."""
        server = _OWN_MODEL_SERVERS.get(self.provider)
        if server is not None and "model" not in self.model_fields_set:
            raise ValueError(
                f"model: not set, and provider '{self.provider}' is a server you run ({server}): "
                f"name the model it serves (its GET /v1/models lists them); the default, "
                f"'{self.model}', is OpenAI's"
            )
        return self

    @field_validator("sanitise", mode="before")
    @classmethod
    def _sanitise_bool(cls, value: Any) -> Any:
        """Older configs' booleans: true (it cut, then) now flags; nothing is cut unasked."""
        if isinstance(value, bool):
            return "flag" if value else "off"
        return value

    @field_validator("params", mode="before")
    @classmethod
    def _over_defaults(cls, value: Any) -> Any:
        """A partial [judge.params] table changes only the keys it names."""
        if isinstance(value, dict):
            return {**DEFAULT_PARAMS.model_dump(exclude_defaults=True), **value}
        return value


class ProviderSection(Record):
    """Overrides of the preset named by ``judge.provider`` (see judge.providers.PRESETS)."""

    kind: ProviderKind | None = None
    base_url: str | None = None
    api_key_env: str | None = Field(default=None, min_length=1)  # "" named no variable
    supports_json_mode: bool | None = None
    supports_logprobs: bool | None = None
    schema_spelling: Literal["json_schema", "json_object"] | None = None
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


# Characters of a passage judged: the rest is cut (``[dataset] max_passage_chars``; 0: none).
DEFAULT_PASSAGE_CHARS = 8000


class DatasetSection(Record):
    path: str | None = None
    # The file's columns onto the dataset fields, or a preset's name ("ragas", "ragas-legacy",
    # "phoenix", "pyterrier": judge/data/frames.py), checked when the file is read.
    columns: dict[str, str] | str = Field(default_factory=dict)
    # The scale the rows' human labels use, when it is not the judge's (e.g. 0-3 labels
    # with a yes/no judge: a label counts as relevant at that scale's threshold).
    label_scale: str | None = None
    max_passage_chars: int = Field(default=DEFAULT_PASSAGE_CHARS, ge=0, strict=True)
    # A TREC run + passage store + query texts instead of JSONL rows.
    trec_run: str | None = None
    passage_store: str | None = None
    queries: str | None = None


class RunSection(Record):
    # Counts and switches are strict: `concurrency = true` was read as 1, `"4"` as 4 and
    # `repeats = 3.0` as 3; a TOML integer or boolean is asked for, and said so.
    out: str = "runs/latest"
    repeats: int = Field(default=1, ge=1, le=1000, strict=True)
    # Calls in flight: a hard ceiling. The limit starts at it (at most 64) and adapts to the
    # provider (halved on 429s and rising latency, grown one slot per round) unless
    # adaptive_concurrency = false keeps it fixed.
    concurrency: int = Field(default=64, ge=1, strict=True)
    adaptive_concurrency: bool = Field(default=True, strict=True)
    timeout_s: float = Field(default=60.0, gt=0)
    # One attempt's deadline: a hung request is abandoned then and retried (a fault, not a
    # reason to lower the concurrency). 0 = drawn from the provider's recent answers: 4 x their
    # p95, at least 1 s, doubled on each retry of a call, at most timeout_s (timeout_s until 20
    # answers are in, and for a model on this machine).
    attempt_timeout_s: float = Field(default=0.0, ge=0)
    # Hedging: an attempt without an answer after 2 x the recent p95 (at least 0.2 s) gets a
    # second identical request; the first answer wins, both are counted and paid, a hedge is
    # never sent past the budget. At most this share of the requests are hedges (0 = none).
    hedge_share: float = Field(default=0.05, ge=0, le=0.5)
    max_attempts: int = Field(default=6, ge=1, strict=True)
    # Backoff: random in [0, base * 2^(attempt-1)], capped; a Retry-After is honoured (capped).
    backoff_base_s: float = Field(default=0.5, ge=0)
    max_backoff_s: float = Field(default=60.0, gt=0)
    requests_per_minute: float = Field(default=0.0, ge=0)
    tokens_per_minute: float = Field(default=0.0, ge=0)
    sample: int = Field(default=0, ge=0, strict=True)
    seed: int = Field(default=0, strict=True, ge=0)
    max_cost: float = Field(default=0.0, ge=0)
    max_tokens: int = Field(default=0, ge=0, strict=True)
    # Stop with exit 3 once this share of finished passages has status "error".
    abort_error_rate: float = Field(default=0.5, ge=0, le=1)
    cache: str | None = None  # default: <user cache dir>/judge/cache.sqlite
    history: str | None = None  # default: <user cache dir>/judge/history.sqlite
    progress_interval_s: float = Field(default=10.0, gt=0)
    # Charts in report.html (drawing them is most of the time a cached re-run takes).
    charts: bool = Field(default=True, strict=True)
    # After SIGINT/SIGTERM/SIGHUP, seconds the calls in flight get to finish before they are
    # cancelled (their units stay unfinished and resume on the next run).
    grace_s: float = Field(default=10.0, ge=0)
    # Batch mode (`judge run --batch`, judge/run/batch.py): first-round requests go through the
    # provider's Batch API at its batch price, within 24 h; the run then reads them from the cache.
    batch: bool = Field(default=False, strict=True)
    # What a batch left without a usable answer (unparsed, failed, expired, cancelled): asked in
    # real time at list price, or in one follow-up batch first (what that leaves: real time).
    batch_followup: Literal["realtime", "batch"] = "realtime"
    # Seconds between a batch's status checks: the first wait, growing by half each check up to
    # the cap (a batch takes minutes to hours; tests make these small).
    batch_poll_s: float = Field(default=30.0, gt=0)
    batch_max_poll_s: float = Field(default=600.0, gt=0)
    # Sharding on Ray (`judge run --ray`, judge/run/ray_run.py): "local" starts a Ray instance
    # here, "auto" / "ray://HOST:PORT" / "HOST:PORT" joins a cluster; None: one process. Shards
    # (queries split by a stable hash of query_id): 0 = one per CPU the cluster has.
    ray: str | None = None
    ray_shards: int = Field(default=0, ge=0, strict=True)

    @model_validator(mode="after")
    def _no_zero_budget(self) -> RunSection:
        for key in ("max_cost", "max_tokens"):
            if key in self.model_fields_set and getattr(self, key) == 0:
                raise ValueError(
                    f"{key}: 0 caps nothing (leave it out for no budget); give a cap above 0"
                )
        return self


class ThresholdsSection(Record):
    min: dict[str, float] = Field(default_factory=dict)
    # Upper bounds on a mean, for lower-is-better metrics such as near_dup@10, low_quality@10.
    max: dict[str, float] = Field(default_factory=dict)
    # Worst allowed fall against the baseline; for a lower-is-better metric, the worst rise.
    max_drop: dict[str, float] = Field(default_factory=dict)
    baseline: str | None = None
    # Defaults fail a run (exit 1) when more than 10% of verdicts are errors or unparsed, or
    # of an engine's queries are left without the primary metric by unparsed verdicts.
    max_unparsed_rate: float = Field(default=0.1, ge=0, le=1)
    # Fail a run (exit 1) when the judge is degenerate (one label for nearly every passage, or
    # probabilities too flat to rank; see judge.analysis.health). Off: the report warns only.
    fail_on_degenerate_judge: bool = False

    def bounds(self) -> list[tuple[str, str, float]]:
        """Every bound on a metric's mean: ("min" or "max", metric, limit)."""
        return [*(("min", *i) for i in self.min.items()), *(("max", *i) for i in self.max.items())]


class Price(Record):
    prompt: float = Field(ge=0)  # USD per 1M prompt tokens
    completion: float = Field(ge=0)  # USD per 1M completion tokens
    # Through the provider's Batch API (`judge run --batch`): batch_prompt / batch_completion
    # when given, else these prices times batch_factor (OpenAI and DashScope: half).
    batch_factor: float = Field(default=0.5, gt=0, le=1)
    batch_prompt: float | None = Field(default=None, ge=0)
    batch_completion: float | None = Field(default=None, ge=0)

    def batch(self) -> Price:
        """The price of the same tokens through the provider's Batch API."""
        f = self.batch_factor
        prompt = self.prompt * f if self.batch_prompt is None else self.batch_prompt
        completion = self.completion * f if self.batch_completion is None else self.batch_completion
        return Price(prompt=prompt, completion=completion, batch_factor=1.0)

    def cost(self, usage: Usage) -> float:
        """USD for ``usage`` at this price: the one place a cost is computed."""
        return (usage.prompt_tokens * self.prompt + usage.completion_tokens * self.completion) / 1e6


# Metric base names each opt-in dimension computes (judge.metrics.coverage holds the formulas).
NUGGET_METRICS = ("coverage", "wcoverage", "alpha_ndcg", "err_ia")
CREDIBILITY_METRICS = ("credibility",)


class NuggetsSection(Record):
    """``[nuggets]`` (judging/nuggets.py): per query, the nuggets a complete answer needs,
    written once from every engine's pooled passages (or read from ``path``), then which
    passages support which. ``enabled`` is the switch that costs calls; with it on and no
    nugget metric in ``[metrics] names``, ``DEFAULT`` ones are computed."""

    DEFAULT: ClassVar[tuple[str, ...]] = tuple(f"{name}@10" for name in NUGGET_METRICS)

    enabled: bool = False
    # A nugget file (JSONL, one NuggetSet per line) used as given; queries it lacks get the
    # judge's. Each run writes the set it used to <out>/nuggets.jsonl, to give back here.
    path: str | None = None
    # At most this many nuggets per query (vital ones kept first).
    max_nuggets: int = Field(default=10, ge=1, le=30)
    # Pooled passages shown to the judge writing the nuggets (interleaved by rank across
    # engines, duplicates dropped) and the tokens their text may take together.
    pool_passages: int = Field(default=20, ge=1)
    pool_tokens: int = Field(default=6000, ge=256)
    # Passages per assignment call at most (fewer when the context window needs it).
    group_passages: int = Field(default=20, ge=1)


class CredibilitySection(Record):
    """``[credibility]`` (judging/credibility.py): the judge grades each passage's source
    0 low, 1 medium, 2 high with a reason, from its URL, title and text."""

    DEFAULT: ClassVar[tuple[str, ...]] = tuple(f"{name}@10" for name in CREDIBILITY_METRICS)

    enabled: bool = False


class TelemetrySection(Record):
    """``[telemetry]`` (judge/calling/telemetry.py): OpenTelemetry spans, emitted when the
    process has a tracer provider (``pip install 'judge[otel]'``)."""

    # Queries, passages, prompts, answers and reasons in the spans; off, spans carry ids,
    # labels, scores, tokens and timings only.
    include_text: bool = False


def with_dimension_defaults(
    names: Sequence[str], defaults: Iterable[tuple[str, ...]]
) -> tuple[str, ...]:
    """``names`` and, for each turned-on dimension's ``defaults``, those metrics when ``names``
    has none of their bases: the metrics a run computes (judging/dimensions.py)."""
    out = list(names)
    for group in defaults:
        bases = {d.split("@")[0] for d in group}
        if not any(n.split("@")[0] in bases for n in out):
            out += group
    return tuple(out)


def aspect_metric_problem(
    names: tuple[str, ...], nuggets: NuggetsSection, credibility: CredibilitySection
) -> str | None:
    """Why ``names`` cannot be computed: a nugget or credibility metric whose dimension is off
    (it would be undefined for every query, and turning a dimension on costs calls)."""
    for name in names:
        base = name.split("@")[0]
        for bases, table, on in (
            (NUGGET_METRICS, "nuggets", nuggets.enabled),
            (CREDIBILITY_METRICS, "credibility", credibility.enabled),
        ):
            if base in bases and not on:
                return f"metrics.names: '{name}' needs [{table}] enabled = true"
    return None
