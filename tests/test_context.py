"""Every request fits the model's context window: long passages are cut, visibly (marker and
``truncated_from`` in the results), and short ones are left alone."""

from __future__ import annotations

from judge.calling.limits import Limits
from judge.data.passages import TRUNCATION_MARKER
from judge.judging.context import count_tokens
from judge.judging.judge import EMBEDDED_CONTEXT, Judge
from judge.providers.base import Message
from judge.providers.embedded import server
from judge.schema import Passage, Query, SamplingParams
from tests.servers import ScriptedServer, hashed_responder

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
    assert len(first) == 1
    assert count_tokens(first[0].messages) + 256 <= 2048


def test_the_embedded_window_matches_the_servers_default() -> None:
    assert server._DEFAULTS["n_ctx"] == EMBEDDED_CONTEXT
