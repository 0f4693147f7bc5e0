"""Provider faults and secrets over real HTTP: each fault classified after exactly one
request, and the API key kept out of every error, traceback and log line.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import httpx
import httpx2
import pytest

from judge.errors import NotTheApiError, ProviderConfigError, ResponseError
from judge.providers import make_chat_provider, make_rerank_provider, resolve_spec
from judge.providers.base import ProviderSpec, ProviderStatusError, RetryDecision
from judge.providers.openai_compat import OpenAICompatProvider
from judge.providers.rerank import HTTPRerankProvider
from tests.provider_harness import CHAT, PROTOCOLS, RERANK, call_once, chat_spec, complete, run
from tests.servers import (
    CUT,
    DROP,
    EMPTY,
    MALFORMED,
    SERVER_ERROR,
    TRUNCATED,
    WEB_PAGE,
    WRONG_SHAPE,
    Fault,
    ScriptedServer,
    rate_limit,
)

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
    # A web page where the API should be: every request would get it; not retried.
    pytest.param(WEB_PAGE, RetryDecision(retry=False, kind="not_api"), id="web-page"),
    # The same page labelled JSON (a gateway's): DashScope's SDK had retried it six times.
    pytest.param(
        Fault("web_page_as_json"), RetryDecision(retry=False, kind="not_api"), id="web-page-json"
    ),
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


@pytest.mark.parametrize("fault", [MALFORMED, WRONG_SHAPE], ids=["malformed", "wrong-shape"])
def test_an_unreadable_chat_answer_names_the_url_it_came_from(
    server: ScriptedServer, fake_key: str, fault: Fault
) -> None:
    server.enqueue(fault)
    _, exc, _ = run(call_once(PROTOCOLS["openai"], server))
    assert isinstance(exc, ResponseError)
    assert f"malformed chat completion from {server.openai_base_url}/chat/completions: " in str(exc)


def test_a_dashscope_run_through_faults_prints_no_traceback(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """The dashscope SDK logs each failed request with its traceback before raising it; a run
    (its own process, its own logging) says what happened in lines, and only with --verbose
    shows the SDK's."""
    server = make_server(fault_rate=0.4, faults=(MALFORMED, WRONG_SHAPE, CUT), seed=1)
    rows = [
        {
            "query_id": f"q{i}",
            "query": f"question {i}",
            "passages": [{"id": f"p{i}-{k}", "text": f"text {k} of {i}"} for k in range(2)],
        }
        for i in range(8)
    ]
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    config = tmp_path / "c.toml"
    config.write_text(
        '[judge]\nprovider = "dashscope"\nmodel = "qwen-plus"\n'
        f'[provider]\nbase_url = "{server.dashscope_base_url}"\napi_key_env = "FAKE_DS_KEY"\n'
        f'[run]\ncache = "{tmp_path / "c.sqlite"}"\nhistory = "{tmp_path / "h.sqlite"}"\n'
        "backoff_base_s = 0.01\n",
        encoding="utf-8",
    )
    env = {**os.environ, "FAKE_DS_KEY": "sk-fake", "JUDGE_CACHE_DIR": str(tmp_path)}
    command = [sys.executable, "-m", "judge", "run", str(config), str(dataset)]
    done = subprocess.run(
        [*command, "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode in (0, 1, 3), done.stderr
    served = server.outcomes
    assert served["malformed"] + served["wrong_shape"] + served["cut"] >= 1, served
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("protocol", ["openai", "cohere"])
def test_a_redirect_is_named_and_final_not_followed(
    server: ScriptedServer, fake_key: str, protocol: str
) -> None:
    """Our HTTP clients do not follow a POST's redirect: it is a client error naming where it
    points, not an unreadable empty answer retried six times."""
    server.enqueue(Fault("status", 308, location="https://elsewhere.test/v1/x"))
    _, exc, provider = run(call_once(PROTOCOLS[protocol], server))
    assert exc is not None and "redirected to https://elsewhere.test/v1/x" in str(exc)
    assert provider.classify(exc) == RetryDecision(retry=False, kind="client")
    assert len(server.requests) == 1


@pytest.mark.parametrize("protocol", ["openai", "cohere", "dashscope", "dashscope-rerank"])
def test_an_error_object_in_a_200_answer_is_final_in_the_servers_words(
    server: ScriptedServer, fake_key: str, protocol: str
) -> None:
    server.enqueue(Fault("error_200"))
    _, exc, provider = run(call_once(PROTOCOLS[protocol], server))
    assert exc is not None and "an error in a 200 answer" in str(exc)
    assert "invalid api token" in str(exc)
    assert provider.classify(exc) == RetryDecision(retry=False, kind="client")


def test_an_unasked_event_stream_is_named_as_one() -> None:
    from judge.providers.base import read_json_answer

    stream = b'data: {"choices": [{"delta": {"content": "yes"}}]}\n\ndata: [DONE]\n\n'
    with pytest.raises(NotTheApiError, match="answered with a stream of server-sent events"):
        read_json_answer(stream, "http://h/v1/chat/completions", "a chat completion")


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (
            {"object": "error", "message": "The model `m1` does not exist.", "code": 404},
            "an error in a 200 answer from http://h/v1/chat/completions: The model `m1`",
        ),
        ({"id": "x", "choices": []}, "with no choices (nothing answered)"),
        ([{"choices": []}], "a JSON list, not an object"),
    ],
)
def test_a_200_answer_that_is_not_a_completion_says_what_it_is(body: object, said: str) -> None:
    """vLLM's error object with a 200 had been "malformed ...: 'choices'" and retried six
    times (each billed by a real provider); empty choices "list index out of range"."""
    from judge.providers.openai_compat import to_completion

    with pytest.raises((ResponseError, ProviderStatusError)) as caught:
        to_completion(json.dumps(body).encode(), "m1", "http://h/v1/chat/completions")
    assert said in str(caught.value)
    if isinstance(caught.value, ProviderStatusError):  # final: the server's own words
        spec = ProviderSpec(kind="openai", base_url="http://h/v1")
        provider = OpenAICompatProvider(spec)
        assert provider.classify(caught.value) == RetryDecision(retry=False, kind="client")


def test_a_404_names_the_url_it_came_from(server: ScriptedServer) -> None:
    """A base_url whose path is mistyped: the 404 said only "scripted failure 404"."""
    base = server.openai_base_url.replace("/v1", "/v2")
    provider = OpenAICompatProvider(ProviderSpec(kind="openai", base_url=base))
    with pytest.raises(ProviderStatusError) as caught:
        complete(provider, CHAT)
    assert "/v2/chat/completions" in str(caught.value) and caught.value.status == 404


def test_chat_usage_that_says_nothing_was_spent_is_unknown_but_a_cached_prompt_is_a_count() -> None:
    from judge.providers.base import read_chat_usage
    from judge.schema import Usage

    keys = ("prompt_tokens", "completion_tokens")
    assert read_chat_usage(None, *keys, "yes") == (Usage(), False)  # no usage at all
    assert read_chat_usage({"prompt_tokens": 0, "completion_tokens": 0}, *keys, "")[1] is False
    assert read_chat_usage({"prompt_tokens": 9, "completion_tokens": 0}, *keys, "yes")[1] is False
    cached = read_chat_usage({"prompt_tokens": 0, "completion_tokens": 5}, *keys, "yes")
    assert cached == (Usage(prompt_tokens=0, completion_tokens=5), True)  # a cached prompt
