"""Provider registry and presets: a name in a config -> a ProviderSpec -> a provider object.

::

    resolve_spec("dashscope-compatible", {"base_url": ...})  -> ProviderSpec
    make_chat_provider(spec)    kinds openai, dashscope, embedded  -> ChatProvider
    make_rerank_provider(spec)  kinds rerank, dashscope            -> RerankProvider

An OpenAI-compatible endpoint is a preset (or a ``kind="openai"`` spec with a ``base_url``),
never new code. Provider modules are imported on first use: the openai and dashscope SDKs
each take about half a second to import, and a run needs at most one of them.

Also here, shared by the provider modules: :class:`ProviderStatusError`,
:func:`status_decision` (HTTP status -> RetryDecision), :func:`classify_by_type`,
:func:`read_api_key` and :func:`response_format`.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, get_args

from pydantic import ValidationError

from judge.errors import ProviderConfigError, ProviderError, ResponseError
from judge.providers.base import (
    ChatProvider,
    ProviderSpec,
    RerankProvider,
    RetryDecision,
    SamplingParams,
)

__all__ = [
    "KINDS",
    "PRESETS",
    "ProviderStatusError",
    "classify_by_type",
    "make_chat_provider",
    "make_rerank_provider",
    "read_api_key",
    "resolve_spec",
    "response_format",
    "status_decision",
]

_DASHSCOPE = "https://dashscope.aliyuncs.com"

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
    "local": ProviderSpec(kind="openai", base_url="http://localhost:8000/v1"),
    # Ollama's OpenAI layer takes json_object; logprobs are not assumed there.
    "ollama": ProviderSpec(
        kind="openai", base_url="http://localhost:11434/v1", supports_logprobs=False
    ),
    "llamacpp": ProviderSpec(kind="openai", base_url="http://localhost:8080/v1"),
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


class ProviderStatusError(ProviderError):
    """The provider answered with an HTTP error status (the message is the provider's)."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        retry_after: float | None = None,
        request_id: str | None = None,
    ) -> None:
        self.status = status
        self.retry_after = retry_after
        self.request_id = request_id
        suffix = f" (request_id {request_id})" if request_id else ""
        super().__init__(f"HTTP {status}: {message}{suffix}")


def status_decision(status: int, retry_after: float | None = None) -> RetryDecision:
    """429 -> rate_limit; 408, 409 and 5xx -> server; any other status -> client (final)."""
    if status == 429:
        return RetryDecision(retry=True, kind="rate_limit", retry_after=retry_after)
    if status in (408, 409) or status >= 500:
        return RetryDecision(retry=True, kind="server", retry_after=retry_after)
    return RetryDecision(retry=False, kind="client")


ErrorTable = Sequence[tuple[type[BaseException] | tuple[type[BaseException], ...], RetryDecision]]

_COMMON: ErrorTable = (
    (ProviderConfigError, RetryDecision(retry=False, kind="config")),
    (TimeoutError, RetryDecision(retry=True, kind="timeout")),
    (ConnectionError, RetryDecision(retry=True, kind="connection")),
    ((ResponseError, json.JSONDecodeError), RetryDecision(retry=True, kind="protocol")),
)


def classify_by_type(exc: BaseException, table: ErrorTable = ()) -> RetryDecision:
    """An HTTP status decides via :func:`status_decision`; otherwise the first matching
    entry of ``table``, then of the common table (timeouts, dropped connections, bodies
    that are not the protocol's JSON); anything else is "unexpected" and final."""
    if isinstance(exc, ProviderStatusError):
        return status_decision(exc.status, exc.retry_after)
    for types, decision in (*table, *_COMMON):
        if isinstance(exc, types):
            return decision
    return RetryDecision(retry=False, kind="unexpected")


_PLANNING: ContextVar[bool] = ContextVar("judge_planning", default=False)


@contextlib.contextmanager
def planning_only() -> Iterator[None]:
    """Build providers that will never be called (``--dry-run``, ``judge render``).

    Inside, a missing API key is not an error: the provider gets a placeholder it never sends,
    so a user can estimate cost or inspect prompts before handing over a key. A provider's
    identity (and so every cache key) does not depend on the key.
    """
    token = _PLANNING.set(True)
    try:
        yield
    finally:
        _PLANNING.reset(token)


def read_api_key(spec: ProviderSpec, placeholder: str = "not-needed") -> str:
    """The key from ``spec.api_key_env``; ``placeholder`` when the endpoint needs none.

    Raises ProviderConfigError naming the variable (never a value) when it is unset or empty,
    except under :func:`planning_only`.
    """
    if spec.api_key_env is None:
        return placeholder
    key = os.environ.get(spec.api_key_env, "").strip()
    if not key and _PLANNING.get():
        return "planning-only-never-sent"
    if not key:
        raise ProviderConfigError(
            f"environment variable {spec.api_key_env} is not set; the {spec.kind} provider "
            f"at {spec.base_url or 'its default URL'} needs an API key from it"
        )
    return key


def sampling_fields(params: SamplingParams, spec: ProviderSpec) -> dict[str, Any]:
    """The request fields both chat protocols share (OpenAI body, DashScope parameters).

    Fields left unset are not sent; logprobs and response_format only where the endpoint
    supports them; ``params.omit`` removes fields; extra_body (spec, then request) goes last.
    """
    fields: dict[str, Any] = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_tokens": params.max_tokens,
        "seed": params.seed,
        "stop": list(params.stop) if params.stop else None,
    }
    if spec.supports_logprobs and params.logprobs:
        fields["logprobs"] = True
        fields["top_logprobs"] = params.top_logprobs
    if spec.supports_json_mode:
        fields["response_format"] = response_format(params)
    sent = {k: v for k, v in fields.items() if v is not None and k not in params.omit}
    return {**sent, **spec.extra_body, **params.extra_body}


def response_format(params: SamplingParams) -> dict[str, Any] | None:
    """The ``response_format`` request field for ``params`` (None: plain text), as both the
    OpenAI and the DashScope protocols spell it.

    ``json_schema`` takes a bare JSON schema or OpenAI's ``{"name", "schema"}`` wrapper;
    without a schema it degrades to ``json_object``.
    """
    if params.response_format == "json_schema" and params.json_schema is not None:
        schema = params.json_schema
        named = {"name", "schema"} <= schema.keys()
        return {
            "type": "json_schema",
            "json_schema": schema if named else {"name": "verdict", "schema": schema},
        }
    if params.response_format is not None:
        return {"type": "json_object"}
    return None


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
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ProviderConfigError(f"provider '{name_or_kind}': {problems}") from None


def _openai_chat(spec: ProviderSpec) -> ChatProvider:
    from judge.providers.openai_compat import OpenAICompatProvider

    return OpenAICompatProvider(spec)


def _dashscope_chat(spec: ProviderSpec) -> ChatProvider:
    from judge.providers.dashscope import DashScopeProvider

    return DashScopeProvider(spec)


def _embedded_chat(spec: ProviderSpec) -> ChatProvider:
    from judge.providers.embedded import make_embedded_chat_provider

    return make_embedded_chat_provider(spec)


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
_RERANK: dict[str, Callable[[ProviderSpec], RerankProvider]] = {
    "rerank": _http_rerank,
    "dashscope": _dashscope_rerank,
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
