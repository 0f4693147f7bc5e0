"""What every provider speaks: requests, completions, and error classification.

Providers make exactly one call per ``complete``/``rerank`` and never retry: the runner is
the one retry authority (DESIGN rule 2). A provider only *classifies* what went wrong via
``classify(exc) -> RetryDecision``.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import Field

from judge.schema import Record, Usage

Role = Literal["system", "user", "assistant"]
OmittableParam = Literal[
    "temperature",
    "top_p",
    "max_tokens",
    "seed",
    "stop",
    "logprobs",
    "top_logprobs",
    "response_format",
]


class Message(Record):
    role: Role
    content: str


class SamplingParams(Record):
    """Everything besides the messages that changes the answer (all part of the cache key)."""

    temperature: float = 0.0
    top_p: float | None = None
    max_tokens: int | None = 512
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    # "json_object", "json_schema" or None (plain text).
    response_format: Literal["json_object", "json_schema"] | None = None
    json_schema: dict[str, Any] | None = None
    stop: tuple[str, ...] | None = None
    # Provider-specific body fields (e.g. {"enable_thinking": false}); passed through verbatim.
    extra_body: dict[str, Any] = Field(default_factory=dict)
    # Request fields never to send, e.g. ["temperature", "max_tokens"] for reasoning models
    # that accept only their defaults (put "max_completion_tokens" in extra_body instead).
    omit: tuple[OmittableParam, ...] = ()


class ChatRequest(Record):
    model: str
    messages: tuple[Message, ...]
    params: SamplingParams = SamplingParams()


class TopLogprob(Record):
    token: str
    logprob: float


class TokenLogprob(Record):
    token: str
    logprob: float
    top: tuple[TopLogprob, ...] = ()


class Completion(Record):
    """One answer from a chat provider (what the cache stores)."""

    text: str
    model: str = ""
    finish_reason: str | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None
    usage: Usage = Usage()


class RerankRequest(Record):
    model: str
    query: str
    documents: tuple[str, ...]
    top_n: int | None = None


class RerankResult(Record):
    """Relevance score in [0, 1] per input document, in the input order."""

    scores: tuple[float, ...]
    model: str = ""
    usage: Usage = Usage()


class RetryDecision(Record):
    """How the runner should treat an exception from a provider call."""

    retry: bool
    kind: str  # "rate_limit", "server", "timeout", "connection", "client", "protocol", ...
    retry_after: float | None = None  # seconds, from a Retry-After header when present


@runtime_checkable
class ChatProvider(Protocol):
    """A chat model behind some wire protocol."""

    @property
    def identity(self) -> str:
        """What distinguishes this endpoint's answers (kind + base URL), for the cache key."""
        ...

    async def complete(self, request: ChatRequest, *, timeout: float | None) -> Completion: ...

    def classify(self, exc: BaseException) -> RetryDecision: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class RerankProvider(Protocol):
    """A reranker: one relevance score per document."""

    @property
    def identity(self) -> str: ...

    async def rerank(self, request: RerankRequest, *, timeout: float | None) -> RerankResult: ...

    def classify(self, exc: BaseException) -> RetryDecision: ...

    async def aclose(self) -> None: ...


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP date); None if absent/bad."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    from datetime import datetime
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def request_key(identity: str, request: ChatRequest | RerankRequest, repeat: int) -> str:
    """Content address of a call: everything that changes the answer, plus the repeat index.

    Timeouts, concurrency and API keys are deliberately not part of it (DESIGN rule 3).
    """
    payload = {
        "identity": identity,
        "request": request.model_dump(mode="json"),
        "repeat": repeat,
    }
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class ProviderSpec(Record):
    """A provider as configured: a preset name or kind, plus overrides from the config.

    An OpenAI-compatible endpoint is only this (kind="openai" + base_url), never new code.
    """

    kind: Literal["openai", "dashscope", "rerank", "embedded"] = "openai"
    base_url: str | None = None
    # Name of the environment variable holding the key; the key itself is never stored.
    api_key_env: str | None = None
    # Whether the endpoint honours response_format / logprobs (many local servers differ).
    supports_json_mode: bool = True
    supports_logprobs: bool = True
    # Merged into every request's extra_body (e.g. {"enable_thinking": False}).
    extra_body: dict[str, Any] = Field(default_factory=dict)
    # For kind="embedded": extra llama.cpp server options.
    options: dict[str, Any] = Field(default_factory=dict)
