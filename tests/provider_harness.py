"""Shared by the provider tests: sample requests, one-call helpers and the protocols table.

Each entry of :data:`PROTOCOLS` builds a real provider (through the registry and its
preset) against a :class:`~tests.servers.ScriptedServer` and makes one call with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from judge.providers import make_chat_provider, make_rerank_provider, resolve_spec
from judge.providers.base import (
    ChatProvider,
    ChatRequest,
    Completion,
    Message,
    ProviderSpec,
    RerankProvider,
    RerankRequest,
    RerankResult,
    SamplingParams,
)
from tests.servers import ScriptedServer

T = TypeVar("T")

OPENAI_PATH = "/v1/chat/completions"
DASHSCOPE_PATH = "/api/v1/services/aigc/text-generation/generation"
DASHSCOPE_RERANK_PATH = "/api/v1/services/rerank/text-rerank/text-rerank"

CHAT = ChatRequest(
    model="judge-model",
    messages=(
        Message(role="system", content="You judge relevance."),
        Message(role="user", content="<query>cats</query> <passage>Cats purr.</passage>"),
    ),
)
RERANK = RerankRequest(
    model="rerank-model", query="black cat", documents=("a dog", "black cat sleeps", "a cat")
)
FULL_PARAMS = SamplingParams(
    temperature=0.3,
    top_p=0.9,
    max_tokens=64,
    seed=7,
    stop=("\n\n",),
    logprobs=True,
    top_logprobs=3,
    response_format="json_object",
    extra_body={"top_k": 5},
)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def complete(provider: ChatProvider, *requests: ChatRequest) -> list[Completion]:
    """Answers to ``requests`` in turn, then the provider closed, all in one event loop."""

    async def go() -> list[Completion]:
        try:
            return [await provider.complete(request, timeout=5) for request in requests]
        finally:
            await provider.aclose()

    return run(go())


def rerank(provider: RerankProvider, request: RerankRequest) -> RerankResult:
    async def go() -> RerankResult:
        try:
            return await provider.rerank(request, timeout=5)
        finally:
            await provider.aclose()

    return run(go())


def chat_spec(server: ScriptedServer, kind: str = "openai", **fields: Any) -> ProviderSpec:
    base = server.openai_base_url if kind == "openai" else server.dashscope_base_url
    return ProviderSpec.model_validate({"kind": kind, "base_url": base, **fields})


@dataclass(frozen=True)
class Protocol:
    """How to build one provider against a server and make one call through it."""

    path: str
    make: Callable[[ScriptedServer], Any]
    call: Callable[[Any, float | None], Awaitable[Completion | RerankResult]]


def _complete(provider: Any, timeout: float | None) -> Awaitable[Completion]:
    return provider.complete(CHAT, timeout=timeout)  # type: ignore[no-any-return]


def _rerank(provider: Any, timeout: float | None) -> Awaitable[RerankResult]:
    return provider.rerank(RERANK, timeout=timeout)  # type: ignore[no-any-return]


PROTOCOLS = {
    "openai": Protocol(
        OPENAI_PATH,
        lambda s: make_chat_provider(resolve_spec("openai", {"base_url": s.openai_base_url})),
        _complete,
    ),
    "dashscope": Protocol(
        DASHSCOPE_PATH,
        lambda s: make_chat_provider(resolve_spec("dashscope", {"base_url": s.dashscope_base_url})),
        _complete,
    ),
    "dashscope-rerank": Protocol(
        DASHSCOPE_RERANK_PATH,
        lambda s: make_rerank_provider(
            resolve_spec("dashscope-rerank", {"base_url": s.dashscope_base_url})
        ),
        _rerank,
    ),
    "cohere": Protocol(
        "/v1/rerank",
        lambda s: make_rerank_provider(resolve_spec("cohere", {"base_url": s.url})),
        _rerank,
    ),
}


async def call_once(
    protocol: Protocol, server: ScriptedServer, timeout: float | None = 5.0
) -> tuple[Completion | RerankResult | None, BaseException | None, Any]:
    """(result, exception, provider) of one call; the provider is closed afterwards."""
    provider = protocol.make(server)
    try:
        return await protocol.call(provider, timeout), None, provider
    except Exception as exc:
        return None, exc, provider
    finally:
        await provider.aclose()
