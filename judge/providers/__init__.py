"""Provider registry and presets: a name in a config -> a ProviderSpec -> a provider object.

::

    resolve_spec("dashscope-compatible", {"base_url": ...})  -> ProviderSpec
    make_chat_provider(spec)    kinds openai, dashscope, embedded  -> ChatProvider
    make_rerank_provider(spec)  kinds rerank, dashscope, embedded-rerank, embedded-fused
                                -> RerankProvider
    ADAPTERS[spec.kind]         what the kind offers: chat, rerank, a Batch API (or why not),
                                a model of its own on this machine, its context window

An OpenAI-compatible endpoint is a preset (or a ``kind="openai"`` spec with a ``base_url``),
never new code. Provider modules are imported on first use: the openai and dashscope SDKs
each take about half a second to import, and a run needs at most one of them.

A new wire protocol is its adapter module (importing only :mod:`judge.providers.base`, where
what the adapters share lives: error classification, API keys, sampling fields, rerank
fields) and one :class:`Adapter` entry in :data:`ADAPTERS`, whose key is added to the one
list of kinds, :data:`judge.schema.ProviderKind`. Nothing else asks which kind a provider is:
batch mode, Ray shards and context fitting read the entry, and what it leaves out is off.

Neutral sampling on local servers (issue 19). Local servers penalise repetition unless told
not to, and a judge's answer repeats by design: after ``"verdict": "yes"`` the next passage's
``yes`` is penalised, so listwise verdicts alternate with position instead of following the
passages. The local presets therefore switch every repetition penalty off, spelt the way each
server reads it and never with a field the server refuses (:data:`NEUTRAL_SAMPLING`):

==================  ================================  ======================================
preset / kind       fields sent                       why these and no others
==================  ================================  ======================================
``llamacpp``        ``repeat_penalty`` 1,             llama.cpp's ``llama-server`` reads all
                    ``frequency_penalty`` 0,          four per request; ``repeat_penalty``
                    ``presence_penalty`` 0,           was 1.1 by default in older builds and
                    ``dry_multiplier`` 0              ``--repeat-penalty`` sets it server-
                                                      wide. Unknown fields are ignored. Also
                                                      right for llama-cpp-python's server,
                                                      which ignores ``dry_multiplier``.
``embedded``        ``repeat_penalty`` 1,             llama-cpp-python's server (what the
                    ``frequency_penalty`` 0,          embedded judge runs) defaults to 1.1
                    ``presence_penalty`` 0            over the last 64 tokens; its pydantic
                                                      request ignores unknown fields.
``local``           ``repetition_penalty`` 1,         vLLM's name; an unset one is taken from
                    ``frequency_penalty`` 0,          the model's generation_config.json
                    ``presence_penalty`` 0            (1.05-1.1 for Qwen2.5). vLLM before PR
                                                      #10463 (Nov 2024) answered 400 to any
                                                      unknown field, so ``repeat_penalty`` is
                                                      never sent here.
``ollama``          ``frequency_penalty`` 0,          the only penalties Ollama's /v1 layer
                    ``presence_penalty`` 0            maps; its ``repeat_penalty`` (1.1) is
                                                      set only by a Modelfile
                                                      (``PARAMETER repeat_penalty 1``) or its
                                                      native API.
==================  ================================  ======================================

Presets carry these in ``extra_body``, so ``[provider] extra_body`` overrides them key by key and
``[judge.params] extra_body`` overrides both; the embedded kind gets them beneath its spec's
``extra_body`` when the registry builds it. Whatever a spec adds to the request body is part of
the provider's identity (:meth:`ProviderSpec.body_fingerprint`) and so of every cache key: a
changed setting never reuses an answer given under the old one. ``openai`` and the DashScope
presets get none of this: hosted APIs apply no penalty unless asked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import ValidationError

from judge.errors import ConfigError, ProviderConfigError
from judge.providers.base import (
    ChatProvider,
    ProviderSpec,
    RerankProvider,
    planning_only,
)
from judge.providers.embedded import EMBEDDED_CONTEXT
from judge.schema import ProviderKind

__all__ = [
    "ADAPTERS",
    "EMBEDDED_CONTEXT",
    "KINDS",
    "NEUTRAL_SAMPLING",
    "PRESETS",
    "Adapter",
    "context_window",
    "judges_by_score",
    "make_chat_provider",
    "make_rerank_provider",
    "planning_only",
    "rerank_provider",
    "resolve_spec",
    "why_no_batch",
]

P = TypeVar("P", ChatProvider, RerankProvider)

_DASHSCOPE = "https://dashscope.aliyuncs.com"

# OpenAI's own names, which all four servers read: 0 is no penalty.
_OPENAI_PENALTIES_OFF = {"frequency_penalty": 0.0, "presence_penalty": 0.0}
# Per server, the request fields that switch its repetition penalties off (see the table in
# the module docstring for the sources, and why each server gets only what it accepts).
NEUTRAL_SAMPLING: dict[str, dict[str, Any]] = {
    "llamacpp": {**_OPENAI_PENALTIES_OFF, "repeat_penalty": 1.0, "dry_multiplier": 0.0},
    "embedded": {**_OPENAI_PENALTIES_OFF, "repeat_penalty": 1.0},
    "vllm": {**_OPENAI_PENALTIES_OFF, "repetition_penalty": 1.0},
    "ollama": dict(_OPENAI_PENALTIES_OFF),
}

PRESETS: dict[str, ProviderSpec] = {
    "openai": ProviderSpec(
        kind="openai", base_url="https://api.openai.com/v1", api_key_env="OPENAI_API_KEY"
    ),
    "dashscope": ProviderSpec(
        kind="dashscope", base_url=f"{_DASHSCOPE}/api/v1", api_key_env="DASHSCOPE_API_KEY"
    ),
    "dashscope-compatible": ProviderSpec(
        kind="openai",
        base_url=f"{_DASHSCOPE}/compatible-mode/v1",
        api_key_env="DASHSCOPE_API_KEY",
        # Qwen3 hybrid models think by default; a judge wants the label, not an essay.
        extra_body={"enable_thinking": False},
        supports_logprobs=True,
    ),
    # vLLM (and SGLang) honour response_format json_object and logprobs.
    "local": ProviderSpec(
        kind="openai",
        base_url="http://localhost:8000/v1",
        extra_body=NEUTRAL_SAMPLING["vllm"],
    ),
    # Ollama's OpenAI layer takes json_object; logprobs are not assumed there.
    "ollama": ProviderSpec(
        kind="openai",
        base_url="http://localhost:11434/v1",
        supports_logprobs=False,
        extra_body=NEUTRAL_SAMPLING["ollama"],
    ),
    "llamacpp": ProviderSpec(
        kind="openai",
        base_url="http://localhost:8080/v1",
        extra_body=NEUTRAL_SAMPLING["llamacpp"],
    ),
    "cohere": ProviderSpec(
        kind="rerank", base_url="https://api.cohere.com", api_key_env="CO_API_KEY"
    ),
    "dashscope-rerank": ProviderSpec(
        kind="dashscope", base_url=f"{_DASHSCOPE}/api/v1", api_key_env="DASHSCOPE_API_KEY"
    ),
}

# Presets of a kind with a Batch API for servers that run on the user's machine, which have
# none: batch mode refuses them, naming the server. (An endpoint given only as kind="openai" and
# a base_url is taken at its word, as every OpenAI-compatible setting is.)
_LOCAL_SERVERS = {
    "local": "vLLM's OpenAI server",
    "ollama": "Ollama",
    "llamacpp": "llama.cpp's server",
}
# Overrides of these fields are merged into the preset's dict rather than replacing it.
_MERGED_FIELDS = ("extra_body", "options")


def resolve_spec(name_or_kind: str, overrides: Mapping[str, Any]) -> ProviderSpec:
    """The preset (or bare kind) named, with a config's overrides applied.

    ``extra_body`` and ``options`` overrides are merged key by key into the preset's;
    every other field is replaced.
    """
    preset = PRESETS.get(name_or_kind)
    if preset is None:
        if name_or_kind not in KINDS:
            raise ProviderConfigError(
                f"unknown provider '{name_or_kind}': presets are {', '.join(sorted(PRESETS))}; "
                f"kinds are {', '.join(KINDS)}"
            )
        preset = ProviderSpec.model_validate({"kind": name_or_kind})
    unknown = sorted(set(overrides) - set(ProviderSpec.model_fields))
    if unknown:
        raise ProviderConfigError(
            f"provider '{name_or_kind}': unknown setting(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(ProviderSpec.model_fields)}"
        )
    merged = preset.model_dump()
    for name, value in overrides.items():
        if name in _MERGED_FIELDS and isinstance(value, Mapping):
            merged[name] = {**merged[name], **value}
        else:
            merged[name] = value
    try:
        return ProviderSpec.model_validate(merged)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg'].removeprefix('Value error, ')}"
            for err in exc.errors()
        )
        raise ProviderConfigError(f"provider '{name_or_kind}': {problems}") from None


def _openai_chat(spec: ProviderSpec) -> ChatProvider:
    from judge.providers.openai_compat import OpenAICompatProvider

    return OpenAICompatProvider(spec)


def _dashscope_chat(spec: ProviderSpec) -> ChatProvider:
    from judge.providers.dashscope import DashScopeProvider

    return DashScopeProvider(spec)


def _dashscope_rerank(spec: ProviderSpec) -> RerankProvider:
    from judge.providers.dashscope import DashScopeRerankProvider

    return DashScopeRerankProvider(spec)


def _http_rerank(spec: ProviderSpec) -> RerankProvider:
    from judge.providers.rerank import HTTPRerankProvider

    return HTTPRerankProvider(spec)


def _embedded_chat(spec: ProviderSpec) -> ChatProvider:
    """The embedded judge, its llama.cpp penalties off unless the spec's extra_body says, and
    JSON schemas spelled the one way its llama-cpp-python server reads them."""
    from judge.providers.embedded.provider import make_embedded_chat_provider

    extra_body = {**NEUTRAL_SAMPLING["embedded"], **spec.extra_body}
    update = {"extra_body": extra_body, "schema_spelling": "json_object"}
    return make_embedded_chat_provider(spec.model_copy(update=update))


def _embedded_window(spec: ProviderSpec) -> int | None:
    """The embedded server's n_ctx: ``options.n_ctx``, else its default; None for an n_ctx
    that is not a whole number (the server refuses it anyway)."""
    n_ctx = spec.options.get("n_ctx", EMBEDDED_CONTEXT)
    return int(n_ctx) if isinstance(n_ctx, int | str) and str(n_ctx).isdigit() else None


def _embedded_rerank(spec: ProviderSpec) -> RerankProvider:
    from judge.providers.embedded.rerank import make_embedded_rerank_provider

    return make_embedded_rerank_provider(spec)


def _embedded_fused(spec: ProviderSpec) -> RerankProvider:
    from judge.providers.embedded.fused import make_fused_rerank_provider

    return make_fused_rerank_provider(spec)


def _no_window(spec: ProviderSpec) -> int | None:
    return None


def _any_options(spec: ProviderSpec) -> None:
    """The embedded judge's options go to its llama.cpp server as they are."""


def _no_options(spec: ProviderSpec) -> None:
    if spec.options:
        raise ProviderConfigError(
            f"provider kind '{spec.kind}' takes no options (got {', '.join(sorted(spec.options))})"
        )


def _openai_options(spec: ProviderSpec) -> None:
    from judge.providers.openai_compat import check_options

    check_options(spec)


def _embedded_rerank_options(spec: ProviderSpec) -> None:
    from judge.providers.embedded.rerank import check_options

    check_options(spec)


def _embedded_fused_options(spec: ProviderSpec) -> None:
    from judge.providers.embedded.fused import check_options

    check_options(spec)


@dataclass(frozen=True, kw_only=True)
class Adapter:
    """One provider kind: how its providers are built and what it offers.

    What an entry does not declare, the kind does not have: a new kind has no Batch API, runs
    no model of its own and has no known context window until its entry says so. Callers ask
    the entry and never keep lists of kinds, so nothing is assumed of a provider that lacks it.
    The entries, not the adapter modules, declare this: reading it must not import an SDK.
    """

    # Builds a chat model / a reranker from a spec; None: the kind is not one.
    chat: Callable[[ProviderSpec], ChatProvider] | None = None
    rerank: Callable[[ProviderSpec], RerankProvider] | None = None
    # Whether its chat providers speak the OpenAI Batch API (openai_compat.py's wire) and, if
    # not, why not, in the words batch mode refuses it with.
    batch_api: bool = False
    no_batch_api: str = "its adapter declares no Batch API"
    # Its model runs on this machine, started by us: every process (each Ray shard) has its
    # own, so its concurrency is not split between shards.
    runs_locally: bool = False
    # The option (``[provider] options``) that sets how many CPU threads its local model runs:
    # a Ray shard asks Ray for that many CPUs and sets it to what it gets.
    threads_option: str | None = None
    # Its context window in tokens for a spec (passages are cut to fit it); None: not known.
    context_window: Callable[[ProviderSpec], int | None] = _no_window
    # Refuses ``[provider] options`` its factory would refuse (ProviderConfigError), without
    # building anything: judge validate and the checks before a run's first call ask it.
    check_options: Callable[[ProviderSpec], None] = _no_options
    # A reranker named as the judge ("judge by score", judging/cascade.py): the score at and
    # above which a passage is relevant, and the echo check's floor (None: no check), in the
    # units of its scores. Used when the config gives no [judge.cascade].
    score_cut: float = 0.5
    echo_floor: float | None = None
    # The languages its model serves (None: not known, nothing is said about it).
    languages: tuple[str, ...] | None = None

    def why_no_batch(self) -> str | None:
        """Why the kind has no Batch API; None when it has one."""
        if self.chat is None:
            return "a reranker is not a chat model"
        return None if self.batch_api else self.no_batch_api


# Every provider kind, with what it offers: one entry each (keyed by judge.schema.ProviderKind).
ADAPTERS: dict[ProviderKind, Adapter] = {
    "openai": Adapter(chat=_openai_chat, batch_api=True, check_options=_openai_options),
    "dashscope": Adapter(
        chat=_dashscope_chat,
        rerank=_dashscope_rerank,
        no_batch_api="DashScope's native API has none; its compatible mode has "
        '(provider = "dashscope-compatible")',
    ),
    "rerank": Adapter(rerank=_http_rerank),
    "embedded": Adapter(
        chat=_embedded_chat,
        no_batch_api="the embedded judge answers on this machine",
        runs_locally=True,
        threads_option="n_threads",
        context_window=_embedded_window,
        check_options=_any_options,
    ),
    # MiniLM's clipped cosine: 0.55 and 0.11 are where its calibrated probability (fused.py)
    # crosses 0.5 and 0.15, the fused judge's cut and echo floor.
    "embedded-rerank": Adapter(
        rerank=_embedded_rerank,
        check_options=_embedded_rerank_options,
        runs_locally=True,
        score_cut=0.55,
        echo_floor=0.11,
        languages=("en",),
    ),
    # Calibrated probabilities: the cut at 0.5. The echo floor of a judge by score labels an
    # echoed passage by its masked score: the probability MiniLM gives what the passage says
    # besides the query's words (the "en:content" fusion, whatever scores the rest). Chosen on
    # the tune forms within the 0.01 of clean AUC a defence may cost, with the cross-encoder
    # alone: on the TREC dev set, floor 0.34 costs 0.005 (0.772 -> 0.767) and cuts sprinkled
    # query words from 67% flips to 47%; 0.38 costs 0.013. For the default English pair it
    # costs 0.004 (0.750 -> 0.746) (bench/bench_echo.py --score-judge, bench/bench_quality.py).
    # A judge by score can still be bought by echo: the cascade with an LLM is the defence
    # (docs/JUDGING.md).
    "embedded-fused": Adapter(
        rerank=_embedded_fused,
        check_options=_embedded_fused_options,
        runs_locally=True,
        score_cut=0.5,
        echo_floor=0.34,
        languages=("en", "zh"),
    ),
}
KINDS: tuple[ProviderKind, ...] = tuple(ADAPTERS)


def context_window(spec: ProviderSpec) -> int | None:
    """The context window ``spec``'s kind declares for it (the embedded server's n_ctx), or
    None when it is not known."""
    return ADAPTERS[spec.kind].context_window(spec)


def why_no_batch(name: str, spec: ProviderSpec) -> str | None:
    """Why the provider ``name`` (a preset or a kind, resolved to ``spec``) has no Batch API:
    its kind's reason, else its preset's local server; None when it has one."""
    return ADAPTERS[spec.kind].why_no_batch() or _LOCAL_SERVERS.get(name)


def judges_by_score(spec: ProviderSpec) -> bool:
    """Whether ``spec`` named as the judge judges by score: its kind reranks and cannot chat."""
    adapter = ADAPTERS[spec.kind]
    return adapter.chat is None and adapter.rerank is not None


def make_chat_provider(spec: ProviderSpec) -> ChatProvider:
    """A chat provider for ``spec.kind``; ProviderConfigError for a kind that cannot chat."""
    return _built(spec, ADAPTERS[spec.kind].chat, "chat", "a chat model")


def make_rerank_provider(spec: ProviderSpec) -> RerankProvider:
    """A reranker for ``spec.kind``; ProviderConfigError for a kind that cannot rerank."""
    return _built(spec, ADAPTERS[spec.kind].rerank, "rerank", "a reranker")


def _built(
    spec: ProviderSpec,
    factory: Callable[[ProviderSpec], P] | None,
    role: Literal["chat", "rerank"],
    what: str,
) -> P:
    if factory is None:
        kinds = ", ".join(k for k, a in ADAPTERS.items() if getattr(a, role) is not None)
        raise ProviderConfigError(
            f"provider kind '{spec.kind}' is not {what} ({role} kinds: {kinds})"
        )
    return factory(spec)


def rerank_provider(
    rerank: str | ProviderSpec | RerankProvider | None, model: str | None
) -> RerankProvider | None:
    """The reranker a Judge is given (a provider name, a spec or a provider), or None."""
    if rerank is None:
        return None
    if model is None:
        raise ConfigError("rerank_model is required with a rerank provider")
    if isinstance(rerank, ProviderSpec):
        return make_rerank_provider(rerank)
    if isinstance(rerank, str):
        return make_rerank_provider(resolve_spec(rerank, {}))
    return rerank
