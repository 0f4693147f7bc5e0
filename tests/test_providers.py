"""Providers through the real SDKs and HTTP clients against loopback protocol servers."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import httpx2
import pytest

from judge.errors import ProviderConfigError, ResponseError
from judge.providers import PRESETS, make_chat_provider, make_rerank_provider, resolve_spec
from judge.providers.base import (
    ChatProvider,
    ChatRequest,
    Completion,
    Message,
    ProviderSpec,
    RerankProvider,
    RerankRequest,
    RerankResult,
    RetryDecision,
    SamplingParams,
)
from judge.providers.openai_compat import OpenAICompatProvider
from judge.providers.rerank import HTTPRerankProvider, rerank_endpoint, scores_in_input_order
from tests.servers import (
    CUT,
    DROP,
    EMPTY,
    MALFORMED,
    SERVER_ERROR,
    TRUNCATED,
    WRONG_SHAPE,
    Answer,
    Fault,
    ScriptedServer,
    Tok,
    keyword_responder,
    rate_limit,
)

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


# --- requests we send ------------------------------------------------------------------


def test_openai_sends_every_sampling_param_and_merged_extra_body(
    server: ScriptedServer, fake_key: str
) -> None:
    spec = chat_spec(server, api_key_env="OPENAI_API_KEY", extra_body={"enable_thinking": False})
    provider = make_chat_provider(spec)
    complete(provider, CHAT.model_copy(update={"params": FULL_PARAMS}))
    (sent,) = server.requests
    assert sent.path == OPENAI_PATH
    assert sent.headers["authorization"] == f"Bearer {fake_key}"
    assert sent.body == {
        "model": "judge-model",
        "messages": [
            {"role": "system", "content": "You judge relevance."},
            {"role": "user", "content": "<query>cats</query> <passage>Cats purr.</passage>"},
        ],
        "temperature": 0.3,
        "top_p": 0.9,
        "max_tokens": 64,
        "seed": 7,
        "stop": ["\n\n"],
        "logprobs": True,
        "top_logprobs": 3,
        "response_format": {"type": "json_object"},
        "enable_thinking": False,
        "top_k": 5,
    }


def test_omitted_params_are_not_sent_for_reasoning_models(
    server: ScriptedServer, fake_key: str
) -> None:
    spec = chat_spec(server, api_key_env="OPENAI_API_KEY")
    params = FULL_PARAMS.model_copy(
        update={
            "omit": ("temperature", "max_tokens", "logprobs", "top_logprobs"),
            "extra_body": {"max_completion_tokens": 256},
        }
    )
    complete(make_chat_provider(spec), CHAT.model_copy(update={"params": params}))
    body = server.bodies()[0]
    for gone in ("temperature", "max_tokens", "logprobs", "top_logprobs"):
        assert gone not in body
    assert body["max_completion_tokens"] == 256 and body["seed"] == 7


def test_dashscope_compatible_preset_turns_thinking_off(
    server: ScriptedServer, fake_key: str
) -> None:
    spec = resolve_spec("dashscope-compatible", {"base_url": server.openai_base_url})
    provider = make_chat_provider(spec)
    complete(provider, CHAT)
    assert server.bodies()[0]["enable_thinking"] is False


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "object"}, {"name": "verdict", "schema": {"type": "object"}}),
        ({"name": "v", "schema": {"type": "object"}}, {"name": "v", "schema": {"type": "object"}}),
    ],
)
def test_openai_json_schema_is_wrapped_once(
    server: ScriptedServer, schema: dict[str, Any], expected: dict[str, Any]
) -> None:
    params = SamplingParams(response_format="json_schema", json_schema=schema)
    provider = make_chat_provider(chat_spec(server))
    complete(provider, CHAT.model_copy(update={"params": params}))
    assert server.bodies()[0]["response_format"] == {"type": "json_schema", "json_schema": expected}


def test_features_an_endpoint_lacks_are_left_out(server: ScriptedServer) -> None:
    spec = chat_spec(server, supports_json_mode=False, supports_logprobs=False)
    provider = make_chat_provider(spec)
    (completion,) = complete(provider, CHAT.model_copy(update={"params": FULL_PARAMS}))
    body = server.bodies()[0]
    assert not {"logprobs", "top_logprobs", "response_format"} & body.keys()
    assert completion.logprobs is None


def test_dashscope_native_sends_parameters_and_input(server: ScriptedServer, fake_key: str) -> None:
    spec = resolve_spec(
        "dashscope",
        {"base_url": server.dashscope_base_url, "extra_body": {"enable_thinking": False}},
    )
    provider = make_chat_provider(spec)
    complete(provider, CHAT.model_copy(update={"params": FULL_PARAMS}))
    (sent,) = server.requests
    assert sent.path == DASHSCOPE_PATH
    assert sent.headers["authorization"] == f"Bearer {fake_key}"
    assert sent.body == {
        "model": "judge-model",
        "input": {"messages": [m.model_dump() for m in CHAT.messages]},
        "parameters": {
            "temperature": 0.3,
            "top_p": 0.9,
            "max_tokens": 64,
            "seed": 7,
            "stop": ["\n\n"],
            "result_format": "message",
            "logprobs": True,
            "top_logprobs": 3,
            "response_format": {"type": "json_object"},
            "enable_thinking": False,
            "top_k": 5,
        },
    }


# --- answers we read -------------------------------------------------------------------

SCRIPTED = Answer(
    text="yes",
    finish_reason="length",
    tokens=(Tok("yes", -0.25, {"yes": -0.25, "no": -1.5, "maybe": -4.0}),),
    usage=(42, 1),
)


@pytest.mark.parametrize("kind", ["openai", "dashscope"])
def test_completion_text_usage_and_logprobs_are_read(server: ScriptedServer, kind: str) -> None:
    server.enqueue(SCRIPTED)
    provider = make_chat_provider(chat_spec(server, kind))
    params = SamplingParams(logprobs=True, top_logprobs=2)
    (completion,) = complete(provider, CHAT.model_copy(update={"params": params}))
    assert (completion.text, completion.finish_reason) == ("yes", "length")
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (42, 1)
    assert completion.logprobs is not None
    (token,) = completion.logprobs
    assert (token.token, token.logprob) == ("yes", -0.25)
    assert [(t.token, t.logprob) for t in token.top] == [("yes", -0.25), ("no", -1.5)]


@pytest.mark.parametrize("kind", ["openai", "dashscope"])
def test_empty_content_is_empty_text(server: ScriptedServer, kind: str) -> None:
    server.enqueue(EMPTY)
    provider = make_chat_provider(chat_spec(server, kind))
    (completion,) = complete(provider, CHAT)
    assert completion.text == ""


def test_keyword_responder_reads_the_passage(make_server: Callable[..., ScriptedServer]) -> None:
    server = make_server(responder=keyword_responder({"purr": "yes"}, default="no"))
    provider = make_chat_provider(chat_spec(server))
    other = CHAT.model_copy(update={"messages": (Message(role="user", content="Dogs bark."),)})
    texts = [c.text for c in complete(provider, CHAT, other)]
    assert ['"verdict": "yes"' in texts[0], '"verdict": "no"' in texts[1]] == [True, True]


def test_sixty_four_concurrent_calls_all_answered(server: ScriptedServer) -> None:
    async def many() -> list[Completion]:
        provider = make_chat_provider(chat_spec(server))
        try:
            return list(
                await asyncio.gather(*(provider.complete(CHAT, timeout=10) for _ in range(64)))
            )
        finally:
            await provider.aclose()

    completions = run(many())
    assert len({c.text for c in completions}) == 1  # same prompt, same hashed verdict
    assert server.successes == 64


# --- faults: classified, and exactly one request each ----------------------------------

FAULT_CASES = [
    pytest.param(
        rate_limit("7"), RetryDecision(retry=True, kind="rate_limit", retry_after=7.0), id="429"
    ),
    pytest.param(SERVER_ERROR, RetryDecision(retry=True, kind="server"), id="500"),
    pytest.param(
        Fault("status", 503, retry_after="2"),
        RetryDecision(retry=True, kind="server", retry_after=2.0),
        id="503",
    ),
    pytest.param(Fault("status", 408), RetryDecision(retry=True, kind="server"), id="408"),
    pytest.param(Fault("status", 409), RetryDecision(retry=True, kind="server"), id="409"),
    *(
        pytest.param(Fault("status", code), RetryDecision(retry=False, kind="client"), id=str(code))
        for code in (400, 401, 403, 404, 422)
    ),
    pytest.param(DROP, RetryDecision(retry=True, kind="connection"), id="drop"),
    pytest.param(CUT, RetryDecision(retry=True, kind="connection"), id="cut"),
    pytest.param(MALFORMED, RetryDecision(retry=True, kind="protocol"), id="malformed"),
    pytest.param(TRUNCATED, RetryDecision(retry=True, kind="protocol"), id="truncated"),
    pytest.param(WRONG_SHAPE, RetryDecision(retry=True, kind="protocol"), id="wrong-shape"),
    pytest.param(Fault("hang", seconds=5), RetryDecision(retry=True, kind="timeout"), id="hang"),
]


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
@pytest.mark.parametrize(("fault", "expected"), FAULT_CASES)
def test_fault_is_classified_after_exactly_one_request(
    server: ScriptedServer, fake_key: str, protocol: str, fault: Fault, expected: RetryDecision
) -> None:
    server.enqueue(fault)
    result, exc, provider = run(call_once(PROTOCOLS[protocol], server, timeout=0.3))
    assert result is None and exc is not None
    assert provider.classify(exc) == expected
    assert len(server.requests) == 1  # no SDK-level retry, no hidden resend


@pytest.mark.parametrize(
    ("protocol", "message"),
    [
        (
            "dashscope",
            "HTTP 429: Throttling.RateQuota: scripted failure 429 (request_id req-scripted)",
        ),
        (
            "dashscope-rerank",
            "HTTP 429: Throttling.RateQuota: scripted failure 429 (request_id req-scripted)",
        ),
        ("cohere", "HTTP 429: scripted failure 429"),
    ],
)
def test_status_error_says_what_the_server_said(
    server: ScriptedServer, fake_key: str, protocol: str, message: str
) -> None:
    server.enqueue(rate_limit("3"))
    _, exc, _ = run(call_once(PROTOCOLS[protocol], server))
    assert str(exc) == message


@pytest.mark.parametrize("protocol", ["dashscope-rerank", "cohere"])
def test_rerank_without_results_is_a_protocol_error(
    server: ScriptedServer, fake_key: str, protocol: str
) -> None:
    server.enqueue(EMPTY)
    _, exc, provider = run(call_once(PROTOCOLS[protocol], server))
    assert isinstance(exc, ResponseError)
    assert provider.classify(exc) == RetryDecision(retry=True, kind="protocol")


def test_random_faults_follow_the_rate(make_server: Callable[..., ScriptedServer]) -> None:
    server = make_server(fault_rate=0.5, faults=(SERVER_ERROR,), seed=3)

    async def twenty() -> list[BaseException | None]:
        provider = make_chat_provider(chat_spec(server))
        outcomes: list[BaseException | None] = []
        for _ in range(20):
            try:
                await provider.complete(CHAT, timeout=5)
                outcomes.append(None)
            except Exception as exc:
                outcomes.append(exc)
        await provider.aclose()
        return outcomes

    failures = sum(exc is not None for exc in run(twenty()))
    assert 0 < failures < 20
    assert server.outcomes == {"status_500": failures, "ok": 20 - failures}


# --- secrets ---------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_api_key_never_in_errors_or_logs(
    server: ScriptedServer, fake_key: str, protocol: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    texts = []
    for fault in (rate_limit(), Fault("status", 401), DROP, MALFORMED, Fault("hang", seconds=5)):
        server.enqueue(fault)
        _, exc, provider = run(call_once(PROTOCOLS[protocol], server, timeout=0.3))
        assert exc is not None
        texts += [str(exc), repr(exc), "".join(traceback.format_exception(exc))]
        texts.append(repr(provider.classify(exc)))
    assert all(r.headers["authorization"] == f"Bearer {fake_key}" for r in server.requests)
    assert not [text for text in texts if fake_key in text]
    assert fake_key not in caplog.text


@pytest.mark.parametrize(
    ("preset", "variable"),
    [
        ("openai", "OPENAI_API_KEY"),
        ("dashscope-compatible", "DASHSCOPE_API_KEY"),
        ("dashscope", "DASHSCOPE_API_KEY"),
        ("cohere", "CO_API_KEY"),
    ],
)
def test_missing_key_variable_is_named(preset: str, variable: str) -> None:
    spec = resolve_spec(preset, {})
    make = make_rerank_provider if spec.kind == "rerank" else make_chat_provider
    with pytest.raises(ProviderConfigError, match=variable):
        make(spec)


def test_local_endpoint_needs_no_key(server: ScriptedServer) -> None:
    provider = make_chat_provider(resolve_spec("local", {"base_url": server.openai_base_url}))
    complete(provider, CHAT)
    assert server.requests[0].headers["authorization"] == "Bearer not-needed"


def test_injected_http_clients_are_used_and_left_open(server: ScriptedServer) -> None:
    async def go() -> tuple[bool, bool]:
        async with (
            httpx2.AsyncClient(headers={"x-probe": "chat"}) as chat_client,
            httpx.AsyncClient(headers={"x-probe": "rerank"}) as rerank_client,
        ):
            chat = OpenAICompatProvider(chat_spec(server), http_client=chat_client)
            reranker = HTTPRerankProvider(
                resolve_spec("rerank", {"base_url": server.url}), http_client=rerank_client
            )
            await chat.complete(CHAT, timeout=5)
            await reranker.rerank(RERANK, timeout=5)
            await chat.aclose()
            await reranker.aclose()
            return chat_client.is_closed, rerank_client.is_closed

    assert run(go()) == (False, False)
    assert [r.headers["x-probe"] for r in server.requests] == ["chat", "rerank"]


# --- presets and the registry ----------------------------------------------------------


def test_preset_overrides_merge_extra_body_and_replace_the_rest() -> None:
    spec = resolve_spec(
        "dashscope-compatible",
        {
            "base_url": "http://127.0.0.1:9/v1",
            "extra_body": {"top_k": 3},
            "supports_logprobs": False,
        },
    )
    assert spec.kind == "openai"
    assert spec.base_url == "http://127.0.0.1:9/v1"
    assert spec.api_key_env == "DASHSCOPE_API_KEY"
    assert spec.extra_body == {"enable_thinking": False, "top_k": 3}
    assert spec.supports_logprobs is False
    assert PRESETS["dashscope-compatible"].extra_body == {"enable_thinking": False}


def test_a_bare_kind_resolves() -> None:
    assert resolve_spec("rerank", {"base_url": "http://127.0.0.1:9"}).kind == "rerank"


@pytest.mark.parametrize(
    ("name", "overrides", "message"),
    [
        ("openia", {}, "unknown provider 'openia': presets are .*dashscope-compatible"),
        ("openai", {"base_ur": "x"}, "unknown setting.*base_ur"),
        ("openai", {"supports_logprobs": "sometimes"}, "supports_logprobs"),
    ],
)
def test_bad_provider_config_is_explained(
    name: str, overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ProviderConfigError, match=message):
        resolve_spec(name, overrides)


def test_registry_refuses_the_wrong_role() -> None:
    with pytest.raises(ProviderConfigError, match="not a chat model"):
        make_chat_provider(resolve_spec("cohere", {}))
    with pytest.raises(ProviderConfigError, match="not a reranker"):
        make_rerank_provider(resolve_spec("local", {}))


def test_identity_names_kind_and_base_url(server: ScriptedServer) -> None:
    providers: list[ChatProvider | RerankProvider] = [
        make_chat_provider(resolve_spec("local", {"base_url": server.openai_base_url + "/"})),
        make_chat_provider(
            resolve_spec("dashscope", {"base_url": server.dashscope_base_url, "api_key_env": None})
        ),
        make_rerank_provider(resolve_spec("rerank", {"base_url": server.url})),
    ]
    assert [p.identity for p in providers] == [
        f"openai:{server.openai_base_url}",
        f"dashscope:{server.dashscope_base_url}",
        f"rerank:{server.url}/v1/rerank",
    ]
    for provider in providers:
        run(provider.aclose())


# --- rerank ----------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["dashscope-rerank", "cohere"])
def test_rerank_scores_come_back_in_input_order(
    server: ScriptedServer, fake_key: str, protocol: str
) -> None:
    result, exc, _ = run(call_once(PROTOCOLS[protocol], server))
    assert exc is None and isinstance(result, RerankResult)
    assert result.scores == (0.0, 1.0, 0.5)  # word overlap with "black cat"


def test_cohere_request_body(server: ScriptedServer, fake_key: str) -> None:
    run(call_once(PROTOCOLS["cohere"], server))
    (sent,) = server.requests
    assert sent.headers["authorization"] == f"Bearer {fake_key}"
    assert sent.body == {
        "model": "rerank-model",
        "query": "black cat",
        "documents": ["a dog", "black cat sleeps", "a cat"],
        "top_n": 3,
    }


def test_dashscope_rerank_request_body(server: ScriptedServer, fake_key: str) -> None:
    run(call_once(PROTOCOLS["dashscope-rerank"], server))
    assert server.bodies() == [
        {
            "model": "rerank-model",
            "input": {"query": "black cat", "documents": ["a dog", "black cat sleeps", "a cat"]},
            "parameters": {"return_documents": False, "top_n": 3},
        }
    ]


def test_tei_bare_list_answer_is_read(make_server: Callable[..., ScriptedServer]) -> None:
    server = make_server(rerank_shape="tei")
    provider = make_rerank_provider(resolve_spec("rerank", {"base_url": server.url + "/rerank"}))
    result = rerank(provider, RERANK)
    assert server.requests[0].path == "/rerank"
    assert result.scores == (0.0, 1.0, 0.5)


def test_rerank_with_top_n_scores_the_rest_zero(server: ScriptedServer) -> None:
    provider = make_rerank_provider(resolve_spec("rerank", {"base_url": server.url}))
    result = rerank(provider, RERANK.model_copy(update={"top_n": 1}))
    assert server.bodies()[0]["top_n"] == 1
    assert result.scores == (0.0, 1.0, 0.0)


@pytest.mark.parametrize(
    ("base_url", "endpoint"),
    [
        ("https://api.cohere.com", "https://api.cohere.com/v1/rerank"),
        ("https://api.jina.ai/v1/", "https://api.jina.ai/v1/rerank"),
        ("http://tei:8080/rerank", "http://tei:8080/rerank"),
    ],
)
def test_rerank_endpoint_is_not_doubled(base_url: str, endpoint: str) -> None:
    assert rerank_endpoint(base_url) == endpoint


@pytest.mark.parametrize(
    ("pairs", "top_n"),
    [([(0, 0.5)], 2), ([(0, 0.5), (0, 0.7)], 1), ([(2, 0.5)], 1), ([(0, float("nan"))], 1)],
)
def test_incomplete_or_bad_rerank_results_are_refused(
    pairs: list[tuple[int, float]], top_n: int
) -> None:
    with pytest.raises(ResponseError):
        scores_in_input_order(pairs, 2, top_n)


# --- the server as a process -----------------------------------------------------------


def test_server_runs_as_a_process_and_prints_its_port() -> None:
    command = [sys.executable, "-m", "tests.servers", "openai", "--port", "0"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            word, port = process.stdout.readline().split()
            reply = httpx.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            )
        finally:
            process.kill()
    assert word == "PORT"
    assert reply.json()["choices"][0]["message"]["content"].startswith('{"verdict": ')
