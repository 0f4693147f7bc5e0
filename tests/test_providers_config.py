"""Provider presets and the registry: overrides, refusals and identities."""

from __future__ import annotations

import re
from typing import Any, get_args

import pytest

from judge.config import load_config
from judge.errors import ConfigError, ProviderConfigError
from judge.providers import (
    ADAPTERS,
    EMBEDDED_CONTEXT,
    KINDS,
    NEUTRAL_SAMPLING,
    PRESETS,
    Adapter,
    context_window,
    make_chat_provider,
    make_rerank_provider,
    resolve_spec,
    why_no_batch,
)
from judge.providers.base import ChatProvider, ProviderSpec, RerankProvider
from judge.providers.embedded import server
from judge.schema import ProviderKind
from tests.provider_harness import run
from tests.servers import ScriptedServer


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


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("abc\r\nX-Evil: 1", "holds white space or a control character inside the key"),
        ("sk-a b", "holds white space or a control character inside the key"),
        ("", "JUDGE_TEST_KEY is empty"),
        (None, "JUDGE_TEST_KEY is not set"),
    ],
)
def test_an_api_key_that_is_none_is_refused_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, value: str | None, said: str
) -> None:
    """A key with a line break in it had gone out as two headers, the second of the
    environment's choosing (the lean client writes headers itself); an empty one was said to
    be unset. The value itself is never shown."""
    from judge.providers.base import read_api_key

    if value is None:
        monkeypatch.delenv("JUDGE_TEST_KEY", raising=False)
    else:
        monkeypatch.setenv("JUDGE_TEST_KEY", value)
    spec = resolve_spec("openai", {"api_key_env": "JUDGE_TEST_KEY"})
    with pytest.raises(ProviderConfigError, match=said) as caught:
        read_api_key(spec)
    assert "Evil" not in str(caught.value)


def test_registry_refuses_the_wrong_role() -> None:
    with pytest.raises(ProviderConfigError, match="not a chat model"):
        make_chat_provider(resolve_spec("cohere", {}))
    with pytest.raises(ProviderConfigError, match="not a reranker"):
        make_rerank_provider(resolve_spec("local", {}))


# --- what each kind offers (the registry's entries) ---------------------------------------


def test_every_kind_a_config_can_name_has_one_entry() -> None:
    assert KINDS == get_args(ProviderKind) == tuple(ADAPTERS)
    for kind in KINDS:
        assert resolve_spec(kind, {}).kind == kind
        adapter = ADAPTERS[kind]
        assert adapter.chat is not None or adapter.rerank is not None, kind
        assert load_config(None, {"provider.kind": kind}).provider.kind == kind
    with pytest.raises(ConfigError, match=r"provider\.kind"):
        load_config(None, {"provider.kind": "cohere"})  # a preset, not a kind


def test_a_kind_has_only_what_its_entry_declares() -> None:
    """A new provider is never taken to have a Batch API, a model of its own or a known
    context window: batch mode would send it batches, shards would not split its limits."""
    spec = ProviderSpec(base_url="http://127.0.0.1:9/v1")
    bare = Adapter(chat=ADAPTERS["openai"].chat)
    assert bare.why_no_batch() == "its adapter declares no Batch API"
    assert not bare.runs_locally and bare.threads_option is None
    assert bare.context_window(spec) is None
    assert Adapter(rerank=ADAPTERS["rerank"].rerank).why_no_batch() == (
        "a reranker is not a chat model"
    )


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("openai", None),
        ("dashscope-compatible", None),
        ("dashscope", "its compatible mode has"),
        ("local", "vLLM"),
        ("ollama", "Ollama"),
        ("llamacpp", "llama.cpp"),
        ("embedded", "on this machine"),
        ("cohere", "not a chat model"),
        ("embedded-rerank", "not a chat model"),
    ],
)
def test_which_providers_have_a_batch_api(name: str, why: str | None) -> None:
    found = why_no_batch(name, resolve_spec(name, {}))
    assert found == why if why is None else why in str(found)


def test_the_embedded_judge_declares_its_servers_window() -> None:
    assert server._DEFAULTS["n_ctx"] == EMBEDDED_CONTEXT
    assert context_window(resolve_spec("embedded", {})) == EMBEDDED_CONTEXT
    assert context_window(resolve_spec("embedded", {"options": {"n_ctx": 2048}})) == 2048
    assert context_window(resolve_spec("embedded", {"options": {"n_ctx": "8192"}})) == 8192
    assert context_window(resolve_spec("embedded", {"options": {"n_ctx": "big"}})) is None
    for name in ("openai", "llamacpp", "dashscope", "cohere"):
        assert context_window(resolve_spec(name, {})) is None


def test_identity_names_kind_and_base_url(server: ScriptedServer) -> None:
    providers: list[ChatProvider | RerankProvider] = [
        make_chat_provider(
            resolve_spec("openai", {"base_url": server.openai_base_url + "/", "api_key_env": None})
        ),
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


# --- neutral sampling on local servers (issue 19) -----------------------------------------

PENALTY_FIELDS = {"repeat_penalty", "repetition_penalty", "frequency_penalty", "presence_penalty"}


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        # llama.cpp reads repeat_penalty (and DRY); vLLM's name is repetition_penalty, and
        # vLLM before PR #10463 refused unknown fields, so it never gets repeat_penalty;
        # Ollama's /v1 layer maps only the two OpenAI penalties.
        ("llamacpp", {"repeat_penalty": 1.0, "dry_multiplier": 0.0}),
        ("local", {"repetition_penalty": 1.0}),
        ("ollama", {}),
    ],
)
def test_local_presets_switch_repetition_penalties_off(
    preset: str, expected: dict[str, float]
) -> None:
    body = resolve_spec(preset, {}).extra_body
    assert body == {"frequency_penalty": 0.0, "presence_penalty": 0.0, **expected}
    assert body == PRESETS[preset].extra_body


@pytest.mark.parametrize("preset", ["openai", "dashscope", "dashscope-compatible"])
def test_hosted_presets_send_no_penalties(preset: str) -> None:
    assert not PENALTY_FIELDS & set(resolve_spec(preset, {}).extra_body)


def test_a_configured_penalty_overrides_the_preset_key_by_key() -> None:
    spec = resolve_spec("llamacpp", {"extra_body": {"repeat_penalty": 1.1, "top_k": 1}})
    assert spec.extra_body == {**NEUTRAL_SAMPLING["llamacpp"], "repeat_penalty": 1.1, "top_k": 1}
    assert PRESETS["llamacpp"].extra_body["repeat_penalty"] == 1.0  # the preset is untouched


def test_body_fingerprint_follows_what_a_spec_adds_to_requests() -> None:
    plain = ProviderSpec(base_url="http://127.0.0.1:9/v1")
    assert plain.body_fingerprint() == ""  # plain endpoints keep the keys they always had
    llamacpp = resolve_spec("llamacpp", {})
    assert llamacpp.body_fingerprint() == resolve_spec("llamacpp", {}).body_fingerprint()
    assert re.fullmatch(r"\+[0-9a-f]{16}", llamacpp.body_fingerprint())
    changed = [
        resolve_spec("llamacpp", {"extra_body": {"repeat_penalty": 1.1}}),
        resolve_spec("llamacpp", {"supports_json_mode": False}),
        resolve_spec("llamacpp", {"supports_logprobs": False}),
        plain.model_copy(update={"supports_json_mode": False}),
    ]
    prints = {spec.body_fingerprint() for spec in changed}
    assert len(prints) == len(changed) and llamacpp.body_fingerprint() not in prints
    assert "" not in prints
    # The base URL is in the identity already, the api key never is.
    assert resolve_spec("local", {"base_url": "http://h:1/v1"}).body_fingerprint() == (
        resolve_spec("local", {}).body_fingerprint()
    )


def test_identity_carries_the_body_fingerprint(server: ScriptedServer) -> None:
    url = server.openai_base_url
    local = make_chat_provider(resolve_spec("local", {"base_url": url}))
    penalised = make_chat_provider(
        resolve_spec("local", {"base_url": url, "extra_body": {"repetition_penalty": 1.05}})
    )
    assert local.identity == f"openai:{url}{PRESETS['local'].body_fingerprint()}"
    assert penalised.identity.startswith(f"openai:{url}+") and penalised.identity != local.identity
    for provider in (local, penalised):
        run(provider.aclose())
