"""Provider registry and presets: a name in a config -> a ProviderSpec -> a provider object.

::

    resolve_spec("dashscope-compatible", {"base_url": ...})  -> ProviderSpec
    make_chat_provider(spec)    kinds openai, dashscope, embedded  -> ChatProvider
    make_rerank_provider(spec)  kinds rerank, dashscope, embedded-rerank  -> RerankProvider

An OpenAI-compatible endpoint is a preset (or a ``kind="openai"`` spec with a ``base_url``),
never new code. Provider modules are imported on first use: the openai and dashscope SDKs
each take about half a second to import, and a run needs at most one of them.

What the adapters share (error classification, API keys, sampling fields) lives in
:mod:`judge.providers.base`, the only module an adapter imports from this package.

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
from typing import Any, get_args

from pydantic import ValidationError

from judge.errors import ConfigError, ProviderConfigError
from judge.providers.base import (
    ChatProvider,
    ProviderSpec,
    RerankProvider,
    planning_only,
)

__all__ = [
    "KINDS",
    "NEUTRAL_SAMPLING",
    "PRESETS",
    "make_chat_provider",
    "make_rerank_provider",
    "planning_only",
    "rerank_provider",
    "resolve_spec",
]

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

KINDS: tuple[str, ...] = get_args(ProviderSpec.model_fields["kind"].annotation)
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


def _embedded_chat(spec: ProviderSpec) -> ChatProvider:
    """The embedded judge, its llama.cpp penalties off unless the spec's extra_body says, and
    JSON schemas spelled the one way its llama-cpp-python server reads them."""
    from judge.providers.embedded.provider import make_embedded_chat_provider

    extra_body = {**NEUTRAL_SAMPLING["embedded"], **spec.extra_body}
    update = {"extra_body": extra_body, "schema_spelling": "json_object"}
    return make_embedded_chat_provider(spec.model_copy(update=update))


def _http_rerank(spec: ProviderSpec) -> RerankProvider:
    from judge.providers.rerank import HTTPRerankProvider

    return HTTPRerankProvider(spec)


def _dashscope_rerank(spec: ProviderSpec) -> RerankProvider:
    from judge.providers.dashscope import DashScopeRerankProvider

    return DashScopeRerankProvider(spec)


_CHAT: dict[str, Callable[[ProviderSpec], ChatProvider]] = {
    "openai": _openai_chat,
    "dashscope": _dashscope_chat,
    "embedded": _embedded_chat,
}


def _embedded_rerank(spec: ProviderSpec) -> RerankProvider:
    from judge.providers.embedded.rerank import make_embedded_rerank_provider

    return make_embedded_rerank_provider(spec)


_RERANK: dict[str, Callable[[ProviderSpec], RerankProvider]] = {
    "rerank": _http_rerank,
    "dashscope": _dashscope_rerank,
    "embedded-rerank": _embedded_rerank,
}


def make_chat_provider(spec: ProviderSpec) -> ChatProvider:
    """A chat provider for ``spec.kind``; ProviderConfigError for a kind that cannot chat."""
    factory = _CHAT.get(spec.kind)
    if factory is None:
        raise ProviderConfigError(
            f"provider kind '{spec.kind}' is not a chat model (chat kinds: {', '.join(_CHAT)})"
        )
    return factory(spec)


def make_rerank_provider(spec: ProviderSpec) -> RerankProvider:
    """A reranker for ``spec.kind``; ProviderConfigError for a kind that cannot rerank."""
    factory = _RERANK.get(spec.kind)
    if factory is None:
        raise ProviderConfigError(
            f"provider kind '{spec.kind}' is not a reranker (rerank kinds: {', '.join(_RERANK)})"
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
