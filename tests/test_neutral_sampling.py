"""Issue 19: local servers penalise repetition, so listwise verdicts followed position.

llama.cpp's servers apply ``repeat_penalty`` (1.1 by default) to the last 64 generated tokens.
A listwise answer writes the same label again and again, so the verdict token just written is
penalised and the next passage's verdict flips: yes, no, yes, no, whatever the passages say.
The loopback server below imitates that penalty; a ``judge run`` against it must give every
passage the verdict its content earns, wherever the passage stands in the list, and the same
run with the old penalty must show the alternation (so these tests fail without the fix).
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from judge.cli.main import main
from judge.providers import NEUTRAL_SAMPLING, make_chat_provider, resolve_spec
from judge.providers.base import ChatRequest, Message, ProviderSpec, request_key
from judge.providers.embedded.provider import EmbeddedChatProvider
from judge.providers.embedded.server import EmbeddedServer
from tests.provider_harness import run
from tests.servers import Answer, Recorded, ScriptedServer
from tests.test_runner import verdict_labels, write_config

QUERY = "what are the signs of anaemia in puppies?"
# Three relevant passages, then three that are not: runs of equal verdicts, which a judge
# penalised for repeating its last label cannot write.
PASSAGES = {
    "p1": "Pale gums are the first sign of anaemia in a puppy.",
    "p2": "An anaemic puppy has pale gums and tires quickly.",
    "p3": "Pale inner eyelids and weakness point to anaemia in puppies.",
    "p4": "Our shop sells puppy food in three sizes.",
    "p5": "Puppies should be vaccinated at eight weeks.",
    "p6": "Adult dogs need two walks a day.",
}
CONTENT = {pid: "yes" if "pale" in text.lower() else "no" for pid, text in PASSAGES.items()}
# The same passages in two orders: each passage must get the same verdict in both.
ORDERS = {
    "forward": ["p1", "p2", "p3", "p4", "p5", "p6"],
    "rotated": ["p2", "p3", "p4", "p5", "p6", "p1"],
}
LLAMA_CPP_DEFAULT_REPEAT_PENALTY = 1.1
_BLOCK = re.compile(r'<passage id="([^"]+)">\n(.*?)\n</passage>', flags=re.S)


def penalised(body: dict[str, Any]) -> bool:
    """Whether llama.cpp would penalise repetition for this request body."""
    return float(body.get("repeat_penalty", LLAMA_CPP_DEFAULT_REPEAT_PENALTY)) > 1.0


def llama_cpp_judge(request: Recorded) -> Answer:
    """A listwise judge behind llama.cpp's sampler: by content when the request neutralises
    the repetition penalty, else every label equal to the one just written is flipped."""
    items: list[dict[str, str]] = []
    for pid, text in _BLOCK.findall(request.prompt):
        verdict = "yes" if "pale" in text.lower() else "no"
        if penalised(request.body) and items and items[-1]["verdict"] == verdict:
            verdict = "no" if verdict == "yes" else "yes"
        items.append({"id": pid, "verdict": verdict, "reason": "scripted"})
    return Answer(text=json.dumps({"verdicts": items}))


def write_dataset(path: Path) -> Path:
    rows = [
        {
            "query_id": "q1",
            "query": QUERY,
            "engine": engine,
            "passages": [{"id": pid, "text": PASSAGES[pid]} for pid in order],
        }
        for engine, order in ORDERS.items()
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture
def llama_cpp(make_server: Callable[..., ScriptedServer]) -> ScriptedServer:
    return make_server(responder=llama_cpp_judge)


def judge_run(
    server: ScriptedServer, tmp_path: Path, name: str, *settings: str
) -> dict[str, dict[str, str | None]]:
    """``judge run`` (llamacpp preset, listwise, binary) over both orders, with ``--set``
    settings; the verdicts by engine, then passage id."""
    config = write_config(
        tmp_path / "run.toml",
        server,
        tmp_path / "cache.sqlite",
        {"judge": {"provider": "llamacpp", "mode": "listwise", "scale": "binary"}},
    )
    dataset = write_dataset(tmp_path / "orders.jsonl")
    out = tmp_path / name
    overrides = [arg for setting in settings for arg in ("--set", setting)]
    assert main(["run", str(config), str(dataset), "--out", str(out), *overrides]) == 0
    by_engine: dict[str, dict[str, str | None]] = {engine: {} for engine in ORDERS}
    for (_, engine, _, pid), label in verdict_labels(out).items():
        by_engine[engine][pid] = label
    return by_engine


def neighbours_differ(verdicts: dict[str, str | None], order: list[str]) -> int:
    return sum(verdicts[a] != verdicts[b] for a, b in itertools.pairwise(order))


# --- the listwise run ------------------------------------------------------------------


def test_listwise_verdicts_follow_content_not_position(
    llama_cpp: ScriptedServer, tmp_path: Path
) -> None:
    verdicts = judge_run(llama_cpp, tmp_path, "neutral")
    assert verdicts["forward"] == CONTENT
    assert verdicts["rotated"] == verdicts["forward"]  # the same verdict wherever it stands
    bodies = llama_cpp.bodies()
    assert len(bodies) == len(ORDERS)
    for body in bodies:
        assert not penalised(body)
        assert body["repeat_penalty"] == 1.0
        assert body["frequency_penalty"] == body["presence_penalty"] == 0.0


def test_the_old_penalty_makes_verdicts_alternate_with_position(
    llama_cpp: ScriptedServer, tmp_path: Path
) -> None:
    """What the run gave before the fix, so the test above would have caught it: the user's
    explicit ``[provider] extra_body`` wins over the preset and brings the penalty back."""
    verdicts = judge_run(
        llama_cpp, tmp_path, "penalised", "provider.extra_body={repeat_penalty = 1.1}"
    )
    for engine, order in ORDERS.items():
        assert neighbours_differ(verdicts[engine], order) == len(order) - 1
        assert verdicts[engine] != CONTENT
    assert verdicts["rotated"] != verdicts["forward"]  # a passage's verdict follows its slot
    assert all(body["repeat_penalty"] == 1.1 for body in llama_cpp.bodies())


def test_a_spec_without_the_neutral_fields_alternates_too(llama_cpp: ScriptedServer) -> None:
    """The llamacpp preset as it was (a bare OpenAI spec) sends no repeat_penalty at all."""
    bare = make_chat_provider(ProviderSpec(kind="openai", base_url=llama_cpp.openai_base_url))
    order = ORDERS["forward"]
    prompt = "\n\n".join(f'<passage id="{pid}">\n{PASSAGES[pid]}\n</passage>' for pid in order)
    request = ChatRequest(model="m", messages=(Message(role="user", content=prompt),))

    async def ask() -> str:
        try:
            return (await bare.complete(request, timeout=10)).text
        finally:
            await bare.aclose()

    answer = json.loads(run(ask()))["verdicts"]
    assert "repeat_penalty" not in llama_cpp.bodies()[0]
    assert [item["verdict"] for item in answer] == ["yes", "no", "yes", "no", "yes", "no"]


def test_judge_params_extra_body_wins_over_the_provider(
    llama_cpp: ScriptedServer, tmp_path: Path
) -> None:
    verdicts = judge_run(
        llama_cpp,
        tmp_path,
        "params",
        "provider.extra_body={repeat_penalty = 1.3}",
        "judge.params.extra_body={repeat_penalty = 1.0}",
    )
    assert verdicts["forward"] == verdicts["rotated"] == CONTENT
    assert all(body["repeat_penalty"] == 1.0 for body in llama_cpp.bodies())


# --- the cache key follows the setting -------------------------------------------------


def test_a_changed_penalty_is_a_changed_cache_key(
    llama_cpp: ScriptedServer, tmp_path: Path
) -> None:
    """Same cache, same prompts: answers given under one setting are never reused under
    another (before, the provider's extra_body was not part of the key)."""
    neutral = judge_run(llama_cpp, tmp_path, "a")
    paid = len(llama_cpp.requests)
    penalty = judge_run(llama_cpp, tmp_path, "b", "provider.extra_body={repeat_penalty = 1.1}")
    assert len(llama_cpp.requests) == 2 * paid  # asked again, not served from the cache
    assert penalty["forward"] != neutral["forward"]
    assert judge_run(llama_cpp, tmp_path, "c") == neutral
    assert len(llama_cpp.requests) == 2 * paid  # the neutral answers are still cached


def test_identity_and_request_key_include_what_the_spec_sends() -> None:
    request = ChatRequest(model="m", messages=(Message(role="user", content="q"),))

    def key(overrides: dict[str, Any]) -> str:
        spec = resolve_spec("llamacpp", {"base_url": "http://127.0.0.1:9/v1", **overrides})
        provider = make_chat_provider(spec)
        run(provider.aclose())
        return request_key(provider.identity, request, 0)

    default = key({})
    assert key({}) == default
    assert key({"extra_body": {"repeat_penalty": 1.1}}) != default
    assert key({"extra_body": {"dry_multiplier": 0.8}}) != default
    assert key({"extra_body": {"repeat_penalty": 1.0}}) == default  # the default, spelt out


# --- the embedded judge ----------------------------------------------------------------


@pytest.fixture
def fake_model(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF not really a model")
    return path


def test_embedded_sends_neutral_sampling_and_its_key_follows(fake_model: Path) -> None:
    options = {"model": str(fake_model)}
    default = make_chat_provider(resolve_spec("embedded", {"options": options}))
    explicit = make_chat_provider(
        resolve_spec("embedded", {"options": options, "extra_body": {"repeat_penalty": 1.1}})
    )
    assert isinstance(default, EmbeddedChatProvider)
    assert isinstance(explicit, EmbeddedChatProvider)
    assert default.spec.extra_body == NEUTRAL_SAMPLING["embedded"]
    assert default.spec.extra_body["repeat_penalty"] == 1.0
    assert explicit.spec.extra_body == {**NEUTRAL_SAMPLING["embedded"], "repeat_penalty": 1.1}
    assert default.identity.startswith("embedded:") and default.identity != explicit.identity
    assert default.server is None  # nothing started: the server starts on the first call


def test_embedded_server_keeps_using_every_core(fake_model: Path) -> None:
    server = EmbeddedServer(fake_model, {"n_ctx": 1024})
    cores = os.cpu_count() or 1
    assert server.settings["n_threads"] == server.settings["n_threads_batch"] == cores
    command = server.command()
    assert command[command.index("--n_threads") + 1] == str(cores)
    assert EmbeddedServer(fake_model, {"n_threads": 1}).settings["n_threads"] == 1
