"""Answers a real model gives that had crashed ``judge run`` with a traceback, and every
rerun paid for them again: half an emoji (a lone UTF-16 surrogate) in the answer or its
reason, and logprobs at vLLM's clamp (-9999) on every label. Through the real openai SDK
against the loopback server; each answer is paid once and read."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from judge.cli.main import main
from judge.data.datasets import read_results
from judge.data.results import RESULTS_FILE
from tests.servers import Answer, AnswerServer, Item, Recorded, ScriptedServer
from tests.test_runner import write_config, write_dataset
from tests.wire import Tok

ESCAPED = '{"reason": "renewal explained \\ud83d", "verdict": "yes"}'  # the escape, in JSON
RAW = '{"reason": "renewal explained \ud83d", "verdict": "yes"}'  # the character itself
CLAMPED = Answer(
    text='{"verdict": "yes"}',
    tokens=(
        Tok('{"verdict": "', -0.01),
        Tok("yes", -9999.0, {"yes": -9999.0, "no": -9999.0}),
        Tok('"}', -0.01),
    ),
)


@pytest.mark.parametrize(
    "answer",
    # The raw character goes on the wire as JSON's \ud83d escape; no logprobs for its tokens
    # (the loopback server spells a token's UTF-8 bytes, which half an emoji has not).
    [Answer(ESCAPED), Answer(RAW, tokens=()), CLAMPED],
    ids=["escaped", "raw", "clamped"],
)
def test_an_odd_answer_is_read_and_written_not_a_traceback(
    make_server: Callable[..., ScriptedServer], tmp_path: Path, answer: Answer
) -> None:
    def respond(_request: Recorded) -> Item:
        return answer

    server = make_server(responder=respond)
    dataset = write_dataset(tmp_path / "data.jsonl", n_queries=2, n_passages=2)
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite")
    out = tmp_path / "out"
    assert main(["run", str(config), str(dataset), "--out", str(out)]) == 0
    verdicts = [v for jq in read_results(out / RESULTS_FILE) for v in jq.verdicts]
    assert [(v.status, v.label) for v in verdicts] == [("ok", "yes")] * 4
    if answer is not CLAMPED:  # the half emoji is the replacement character, written as UTF-8
        assert {v.reason for v in verdicts} == {"renewal explained \ufffd"}
    else:  # no label's probability is known: none is claimed
        assert {v.probability for v in verdicts} == {None}
    assert len(server.requests) == 4  # each passage paid once
    assert main(["run", str(config), str(dataset), "--out", str(tmp_path / "again")]) == 0
    assert len(server.requests) == 4  # and read from the cache after
    json.loads((out / "summary.json").read_text(encoding="utf-8"))


THINKING = Answer("<think>\nThe passage is about kettles. Maybe relevant, maybe", "length")


@pytest.mark.parametrize(("mode", "requests"), [("pointwise", 4), ("listwise", 2)])
def test_an_answer_cut_off_inside_its_thinking_is_not_asked_again(
    make_server: Callable[..., ScriptedServer], tmp_path: Path, mode: str, requests: int
) -> None:
    """A reasoning model whose <think> block fills max_tokens: asked again with the same
    limit, it is cut off again. Each passage (or list) is asked once and left unparsed,
    saying what to change; it had been re-asked, and a list's passages then asked one by one
    and re-asked too (8 requests for a list of 3, and no verdict)."""

    def respond(_request: Recorded) -> Item:
        return THINKING

    server = make_server(responder=respond)
    dataset = write_dataset(tmp_path / "data.jsonl", n_queries=2, n_passages=2)
    config = write_config(
        tmp_path / "run.toml", server, tmp_path / "cache.sqlite", {"judge": {"mode": mode}}
    )
    out = tmp_path / "out"
    assert main(["run", str(config), str(dataset), "--out", str(out)]) in (0, 1)
    verdicts = [v for jq in read_results(out / RESULTS_FILE) for v in jq.verdicts]
    assert [v.status for v in verdicts] == ["unparsed"] * 4
    assert all("raise [judge.params] max_tokens" in (v.error or "") for v in verdicts)
    assert len(server.requests) == requests


def _inspecting(calls: list[Any]) -> Callable[[bytes], tuple[int, Any]]:
    """A DashScope server (native or OpenAI-compatible) whose content inspection refuses a
    request holding "敏感", with each API's own error body; it answers "yes" otherwise."""

    def answer(raw: bytes) -> tuple[int, Any]:
        body = json.loads(raw)
        calls.append(body)
        native = "input" in body
        messages = body["input"]["messages"] if native else body["messages"]
        text = '{"reason": "it answers", "verdict": "yes"}'
        if "敏感" in messages[-1]["content"]:
            said = "Input data may contain inappropriate content."
            if native:
                return 400, {"code": "DataInspectionFailed", "message": said, "request_id": "r"}
            return 400, {"error": {"message": said, "code": "data_inspection_failed"}}
        if native:
            choice = {"finish_reason": "stop", "message": {"role": "assistant", "content": text}}
            usage = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
            return 200, {"output": {"choices": [choice]}, "usage": usage, "request_id": "r"}
        choice = {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": text},
        }
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        return 200, {
            "id": "x",
            "object": "chat.completion",
            "model": "m",
            "choices": [choice],
            "usage": usage,
        }

    return answer


@pytest.mark.parametrize("provider", ["dashscope", "dashscope-compatible"])
def test_a_passage_the_provider_s_inspection_refuses_gets_no_verdict_and_the_run_ends(
    tmp_path: Path, fake_key: str, provider: str
) -> None:
    """Content inspection refuses the same passage every time: it had been an error, so the
    run was incomplete, and every rerun sent it again, never to complete (a Chinese web
    corpus in CI). Now it is unparsed, saying why, the rest is judged, and a rerun sends
    nothing."""
    calls: list[Any] = []
    rows = [
        {
            "query_id": f"q{q}",
            "query": "护照怎么续签？",
            "engine": "bm25",
            "passages": [
                {"id": "p1", "text": "填写续签表格并邮寄旧护照。"},
                {"id": "p2", "text": "这是一段敏感内容。" if q == 0 else "护照费用为75元。"},
            ],
        }
        for q in range(3)
    ]
    dataset = tmp_path / "data.jsonl"
    dataset.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    with AnswerServer(_inspecting(calls)) as server:
        root = server.openai_base_url.removesuffix("/v1")
        base = root + ("/api/v1" if provider == "dashscope" else "/compatible-mode/v1")
        config = tmp_path / "run.toml"
        config.write_text(
            f'[judge]\nprovider = "{provider}"\nmodel = "qwen-plus"\nlanguage = "zh"\n'
            f'[provider]\nbase_url = "{base}"\n'
            f'[run]\ncache = "{tmp_path / "c.sqlite"}"\nbackoff_base_s = 0.01\n',
            encoding="utf-8",
        )
        out = tmp_path / "out"
        assert main(["run", str(config), str(dataset), "--out", str(out)]) in (0, 1)
        assert len(calls) == 3  # each text once (two repeat): the refusal is not retried
        assert main(["run", str(config), str(dataset), "--out", str(out)]) in (0, 1)
        assert len(calls) == 3  # and not sent again
    verdicts = {
        v.passage_id + jq.query.query_id: v
        for jq in read_results(out / RESULTS_FILE)
        for v in jq.verdicts
    }
    refused = verdicts.pop("p2q0")
    assert refused.status == "unparsed" and "the provider refused it" in (refused.error or "")
    assert {v.status for v in verdicts.values()} == {"ok"}
