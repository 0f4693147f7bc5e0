"""Chat providers through the real SDKs: the requests we send and the answers we read."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from judge.providers import NEUTRAL_SAMPLING, make_chat_provider, resolve_spec
from judge.providers.base import Completion, Message, SamplingParams
from tests.provider_harness import (
    CHAT,
    DASHSCOPE_PATH,
    FULL_PARAMS,
    OPENAI_PATH,
    chat_spec,
    complete,
    run,
)
from tests.servers import EMPTY, Answer, ScriptedServer, Tok, keyword_responder

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
    ("preset", "server_kind", "refused"),
    [
        ("llamacpp", "llamacpp", set()),
        # vLLM before PR #10463 answered 400 to any field it did not know.
        ("local", "vllm", {"repeat_penalty", "dry_multiplier"}),
        ("ollama", "ollama", {"repeat_penalty", "repetition_penalty"}),
    ],
)
def test_local_presets_send_neutral_sampling_and_a_request_overrides_it(
    server: ScriptedServer, preset: str, server_kind: str, refused: set[str]
) -> None:
    provider = make_chat_provider(resolve_spec(preset, {"base_url": server.openai_base_url}))
    params = SamplingParams(extra_body={"presence_penalty": 0.5})  # [judge.params] extra_body
    complete(provider, CHAT, CHAT.model_copy(update={"params": params}))
    neutral, overridden = server.bodies()
    assert {k: neutral[k] for k in NEUTRAL_SAMPLING[server_kind]} == NEUTRAL_SAMPLING[server_kind]
    assert not refused & neutral.keys()
    assert overridden["presence_penalty"] == 0.5
    assert overridden["frequency_penalty"] == 0.0


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
