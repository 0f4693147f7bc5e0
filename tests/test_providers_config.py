"""Provider presets and the registry: overrides, refusals and identities."""

from __future__ import annotations

from typing import Any

import pytest

from judge.errors import ProviderConfigError
from judge.providers import PRESETS, make_chat_provider, make_rerank_provider, resolve_spec
from judge.providers.base import ChatProvider, RerankProvider
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
