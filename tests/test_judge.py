"""The per-query Python API, through the real openai SDK against a loopback server."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable

import pytest

from judge.calling.limits import Limits
from judge.errors import ProviderError
from judge.judging.judge import Judge
from judge.providers.base import ProviderSpec, SamplingParams
from judge.schema import JudgedQuery, MetricPolicy, Passage, Query
from tests.servers import (
    Answer,
    AnswerServer,
    Fault,
    Recorded,
    ScriptedServer,
    keyword_responder,
    label_responder,
)

PUPPY = "what are the signs of anaemia in puppies?"
PASSAGES = [
    "Pale gums and tiredness are the classic signs of anaemia in puppies.",
    "Our shop sells puppy food in three sizes.",
    "Anaemia makes puppies weak; their gums turn pale.",
]
FAST = Limits(max_attempts=3, backoff_base_s=0.01, timeout_s=5.0)


def conversation_responder() -> Callable[[Recorded], Answer]:
    """'yes' when any message of the conversation mentions 'pale' (re-asks included)."""
    return label_responder(
        lambda r: "yes" if "pale" in json.dumps(r.messages, ensure_ascii=False).lower() else "no"
    )


def make_judge(srv: ScriptedServer, **kwargs: object) -> Judge:
    return Judge(
        provider="local",
        model="judge-model",
        base_url=srv.openai_base_url,
        limits=FAST,
        **kwargs,  # type: ignore[arg-type]
    )


def chat_requests(srv: ScriptedServer) -> list[Recorded]:
    return [r for r in srv.requests if r.path.endswith("/chat/completions")]


def test_pointwise_verdicts_probabilities_and_metrics() -> None:
    with ScriptedServer(responder=keyword_responder({"pale": "yes"}, "no")) as srv:
        with make_judge(srv) as j:
            jq = j.judge(PUPPY, PASSAGES)
    assert [v.label for v in jq.verdicts] == ["yes", "no", "yes"]
    assert [v.status for v in jq.verdicts] == ["ok"] * 3
    assert [v.rank for v in jq.verdicts] == [1, 2, 3]
    # The server's label token carries p=0.9 for the chosen label, 0.1 for the other.
    assert jq.verdicts[0].probability == pytest.approx(0.9, abs=1e-6)
    assert jq.verdicts[1].probability == pytest.approx(0.1, abs=1e-6)
    # relevant at ranks 1 and 3: AP = (1/1 + 2/3) / 2
    assert jq.metrics["ap"] == pytest.approx((1 + 2 / 3) / 2)
    assert jq.metrics["relevancy_mean"] == pytest.approx(2 / 3)
    assert jq.metrics["rerank_max"] == pytest.approx(0.9, abs=1e-6)
    body = chat_requests(srv)[0].body
    assert body["model"] == "judge-model"
    assert body["temperature"] == 0.0
    assert body["logprobs"] is True and body["top_logprobs"] == 5
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert jq.usage.prompt_tokens > 0


def test_unparsable_answer_is_reasked_once_with_the_error() -> None:
    with ScriptedServer(responder=conversation_responder()) as srv:
        srv.enqueue("I think it is kind of relevant maybe")
        with make_judge(srv) as j:
            jq = j.judge(PUPPY, PASSAGES[:1])
    (verdict,) = jq.verdicts
    assert verdict.status == "ok" and verdict.label == "yes"
    requests = chat_requests(srv)
    assert len(requests) == 2
    reask = requests[1].body["messages"]
    assert any(m["role"] == "assistant" and "kind of relevant" in m["content"] for m in reask), (
        reask
    )
    assert len(reask) > len(requests[0].body["messages"])


def garbling_responder(marker: str) -> Callable[[Recorded], Answer | str]:
    """Never a verdict for the passage containing ``marker``; 'pale' -> yes otherwise."""
    sane = conversation_responder()

    def respond(request: Recorded) -> Answer | str:
        if marker in json.dumps(request.messages, ensure_ascii=False):
            return "no idea"
        return sane(request)

    return respond


def test_twice_unparsable_is_unparsed_never_a_grade() -> None:
    with ScriptedServer(responder=garbling_responder("tiredness")) as srv, make_judge(srv) as j:
        jq = j.judge(PUPPY, PASSAGES[:2])
    first = jq.verdicts[0]
    assert first.status == "unparsed"
    assert first.grade is None and first.relevant is None
    assert first.raw == "no idea"
    assert jq.verdicts[1].status == "ok"
    assert first.error
    # One unparsed verdict makes the query's label-free metrics undefined, not 0.
    assert jq.metrics["ap"] is None and jq.metrics["relevancy_mean"] is None


def test_unparsed_can_be_skipped_by_configuration() -> None:
    with ScriptedServer(responder=garbling_responder("tiredness")) as srv:
        with make_judge(srv, metrics=MetricPolicy(unjudged="skip")) as j:
            jq = j.judge(PUPPY, PASSAGES)
    assert jq.verdicts[0].status == "unparsed"
    # Judged passages only: [no, yes] -> AP = (1/2) / 1
    assert jq.metrics["ap"] == pytest.approx(0.5)


def test_client_error_is_an_error_verdict_without_retries() -> None:
    with ScriptedServer(responder=keyword_responder({"pale": "yes"}, "no")) as srv:
        srv.enqueue(Fault("status", 400))  # about this passage, say (its text refused)
        with make_judge(srv) as j:
            jq = j.judge(PUPPY, PASSAGES[:1])
    (verdict,) = jq.verdicts
    assert verdict.status == "error"
    assert "400" in (verdict.error or "")
    assert len(chat_requests(srv)) == 1
    assert jq.metrics["ap"] is None


@pytest.mark.parametrize("status", [401, 404])
def test_a_provider_refusing_every_request_is_an_exception_not_error_verdicts(
    status: int,
) -> None:
    """No key, or a base_url without its /v1: judge() raises as judge_many does (it returned
    every verdict as an error, metrics None), after one request a passage."""
    with ScriptedServer(responder=lambda request: Fault("status", status)) as srv:
        with make_judge(srv) as j, pytest.raises(ProviderError, match="refuses every request"):
            j.judge(PUPPY, PASSAGES[:2])
        assert len(chat_requests(srv)) == 2


def test_retryable_fault_is_retried_by_the_caller() -> None:
    with ScriptedServer(responder=keyword_responder({"pale": "yes"}, "no")) as srv:
        srv.enqueue(Fault("status", 503), Fault("status", 429, retry_after="0"))
        with make_judge(srv) as j:
            jq = j.judge(PUPPY, PASSAGES[:1])
    assert jq.verdicts[0].status == "ok"
    assert jq.verdicts[0].attempts == 3
    assert len(chat_requests(srv)) == 3


def _listwise_responder(
    drop: Callable[[list[str]], set[str]], extra: str | None
) -> Callable[[Recorded], Answer]:
    """Answers every passage id in the prompt 'yes' if it mentions 'pale', minus dropped ids."""

    def respond(request: Recorded) -> Answer:
        prompt = request.prompt
        blocks = re.findall(r'<passage id="([^"]+)">(.*?)</passage>', prompt, flags=re.S)
        ids = [pid for pid, _ in blocks]
        dropped = drop(ids)
        items = [
            {"id": pid, "reason": "r", "verdict": "yes" if "pale" in text.lower() else "no"}
            for pid, text in blocks
            if pid not in dropped
        ]
        if extra:
            items.append({"id": extra, "reason": "r", "verdict": "yes"})
        return Answer(text=json.dumps({"verdicts": items}))

    return respond


def test_listwise_missing_id_is_asked_again_and_extra_id_dropped() -> None:
    calls: list[int] = []

    def drop(ids: list[str]) -> set[str]:
        calls.append(len(ids))
        return {"2"} if len(calls) == 1 else set()

    with ScriptedServer(responder=_listwise_responder(drop, extra="99")) as srv:
        with make_judge(srv, mode="listwise") as j:
            jq = j.judge(PUPPY, PASSAGES)
    assert [v.passage_id for v in jq.verdicts] == ["1", "2", "3"]
    assert [v.label for v in jq.verdicts] == ["yes", "no", "yes"]
    assert all(v.status == "ok" for v in jq.verdicts)
    # First round: all three passages; second round: only the missing one.
    assert calls == [3, 1]


@pytest.mark.parametrize("status", [400, 503])
def test_a_list_the_provider_fails_is_errors_not_asked_again_one_by_one(status: int) -> None:
    """A list request the provider refuses (after the Caller's retries) leaves each of its
    passages an error, asked again on resume: each had been asked alone of the provider that
    had just failed, a request each that failed too (and the console blamed the judge for
    answering lists poorly)."""
    bodies: list[bytes] = []

    def answer(raw: bytes) -> tuple[int, object]:
        bodies.append(raw)
        return status, {"error": {"message": "down", "type": "server_error"}}

    with AnswerServer(answer) as srv:
        with make_judge(srv, mode="listwise") as j:
            jq = j.judge(PUPPY, PASSAGES)
    assert [v.status for v in jq.verdicts] == ["error"] * 3
    assert all("down" in (v.error or "") for v in jq.verdicts)
    prompts = [json.loads(b)["messages"][-1]["content"] for b in bodies]
    assert all('<passage id="3">' in p for p in prompts)  # the list, never one passage
    assert len(bodies) == (FAST.max_attempts if status == 503 else 1)


def test_a_listwise_answer_numbering_passages_from_0_is_asked_again_not_shifted() -> None:
    """A model counting from 0 answers ids 0-2 for positions 1-3: read as given, "1" and "2"
    landed on the next passage's verdict and "0" was dropped. Its ids are not trusted: the
    passages are asked again (one by one), and the verdicts are their own."""
    answers: list[str] = []

    def respond(request: Recorded) -> Answer:
        blocks = re.findall(r'<passage id="([^"]+)">(.*?)</passage>', request.prompt, flags=re.S)
        if blocks:  # the list, counted from 0
            items = [
                {"id": str(int(pid) - 1), "verdict": "yes" if "pale" in text.lower() else "no"}
                for pid, text in blocks
            ]
            answers.append(json.dumps({"verdicts": items}))
        else:  # one passage
            answers.append(
                json.dumps({"verdict": "yes" if "pale" in request.prompt.lower() else "no"})
            )
        return Answer(text=answers[-1])

    with ScriptedServer(responder=respond) as srv:
        with make_judge(srv, mode="listwise") as j:
            jq = j.judge(PUPPY, PASSAGES)
    assert [v.label for v in jq.verdicts] == ["yes", "no", "yes"]
    assert all(v.status == "ok" for v in jq.verdicts)
    assert len(answers) >= 2 and '"id": "0"' in answers[0]


def test_listwise_prompts_name_passages_by_position_and_answers_map_back_to_engine_ids() -> None:
    """Engine ids never reach the list prompt (positions cost the judge fewer tokens and
    cannot be miscopied); an answer naming positions, in any order and spelling, lands on the
    passage shown at that position."""
    ids = ["msmarco_passage_07_1", "doc/b", "x" * 40]
    seen: list[str] = []

    def respond(request: Recorded) -> Answer:
        seen.append(request.prompt)
        blocks = re.findall(r'<passage id="([^"]+)">(.*?)</passage>', request.prompt, flags=re.S)
        items = [
            {"id": f"passage {pid}", "verdict": "yes" if "pale" in text.lower() else "no"}
            for pid, text in reversed(blocks)
        ]
        return Answer(text=json.dumps({"verdicts": items}))

    query = Query(
        query_id="q",
        query=PUPPY,
        passages=tuple(Passage(id=i, text=t) for i, t in zip(ids, PASSAGES, strict=True)),
    )
    with ScriptedServer(responder=respond) as srv:
        with make_judge(srv, mode="listwise") as j:
            jq = j.judge(query)
    assert len(seen) == 1
    assert re.findall(r'<passage id="([^"]+)">', seen[0]) == ["1", "2", "3"]
    assert not any(i in seen[0] for i in ids)
    assert [v.passage_id for v in jq.verdicts] == ids
    assert [v.label for v in jq.verdicts] == ["yes", "no", "yes"]


def test_listwise_falls_back_to_pointwise_when_the_list_never_parses() -> None:
    with ScriptedServer(responder=keyword_responder({"pale": "yes"}, "no")) as srv:
        srv.enqueue("not json", "still not json")
        with make_judge(srv, mode="listwise") as j:
            jq = j.judge(PUPPY, PASSAGES)
    assert [v.label for v in jq.verdicts] == ["yes", "no", "yes"]
    # 2 failed listwise calls (ask + re-ask), then one pointwise call per passage.
    assert len(chat_requests(srv)) == 2 + 3


def test_identical_requests_in_flight_are_paid_once() -> None:
    shared = Passage(id="p", text=PASSAGES[0])
    a = Query(query_id="q", query=PUPPY, engine="a", passages=(shared,))
    b = Query(query_id="q", query=PUPPY, engine="b", passages=(shared,))
    with ScriptedServer(responder=keyword_responder({"pale": "yes"}, "no"), latency=0.2) as srv:
        j = make_judge(srv)

        async def both() -> None:
            ra, rb = await asyncio.gather(j.ajudge(a), j.ajudge(b))
            assert ra.verdicts[0].label == rb.verdicts[0].label == "yes"
            await j.aclose()

        asyncio.run(both())
    assert len(chat_requests(srv)) == 1


def test_one_list_in_flight_under_two_engines_ids_is_paid_once_and_read_by_each() -> None:
    """Two engines returning the same texts under their own ids make one list prompt (it
    names passages by position): asked once, its answer is read with each list's own ids.
    The second asker had been handed the first's verdicts, keyed by the first's ids: a
    KeyError out of the judge."""
    ids = {"a": ["bm25:17", "bm25:4", "bm25:9"], "b": ["vec-0017", "vec-0004", "vec-0009"]}
    queries = [
        Query(
            query_id="q",
            query=PUPPY,
            engine=engine,
            passages=tuple(Passage(id=i, text=t) for i, t in zip(own, PASSAGES, strict=True)),
        )
        for engine, own in ids.items()
    ]
    respond = _listwise_responder(lambda ids: set(), None)
    with ScriptedServer(responder=respond, latency=0.2) as srv:
        j = make_judge(srv, mode="listwise")

        async def both() -> list[JudgedQuery]:
            try:
                return list(await asyncio.gather(*(j.ajudge(q) for q in queries)))
            finally:
                await j.aclose()

        found = asyncio.run(both())
    assert len(chat_requests(srv)) == 1
    for jq, own in zip(found, ids.values(), strict=True):
        assert [v.passage_id for v in jq.verdicts] == own
        assert [v.label for v in jq.verdicts] == ["yes", "no", "yes"]


def test_sync_wrapper_can_be_called_repeatedly() -> None:
    with ScriptedServer(responder=keyword_responder({"pale": "yes"}, "no")) as srv:
        with make_judge(srv) as j:
            first = j.judge(PUPPY, PASSAGES[:1])
            second = j.judge(PUPPY, PASSAGES[1:2])
    assert first.verdicts[0].label == "yes" and second.verdicts[0].label == "no"


def test_json_schema_response_format_carries_the_scale_labels() -> None:
    params = SamplingParams(response_format="json_schema", max_tokens=64)
    with ScriptedServer(responder=keyword_responder({"pale": "yes"}, "no")) as srv:
        with make_judge(srv, params=params) as j:
            j.judge(PUPPY, PASSAGES[:1])
    fmt = chat_requests(srv)[0].body["response_format"]
    assert fmt["type"] == "json_schema"
    assert set(json.dumps(fmt["json_schema"]).split('"')) >= {"yes", "no", "verdict"}


def test_rerank_relevancy_from_a_rerank_provider() -> None:
    with ScriptedServer(
        responder=keyword_responder({"pale": "yes"}, "no"),
        scorer=lambda q, d: 0.8 if "pale" in d.lower() else 0.2,
    ) as srv:
        spec = ProviderSpec(kind="rerank", base_url=srv.url)
        with make_judge(srv, rerank=spec, rerank_model="rerank-x") as j:
            best = j.rerank_relevancy(PUPPY, PASSAGES, agg="max")
            mean = j.rerank_relevancy(PUPPY, PASSAGES, agg="mean")
    assert best == pytest.approx(0.8)
    assert mean == pytest.approx((0.8 + 0.2 + 0.8) / 3)
    rerank_bodies = [r.body for r in srv.requests if r.path.endswith("/rerank")]
    assert rerank_bodies[0]["model"] == "rerank-x"
    # Each passage as given, then the one restating the query without its restatement: the
    # two scores are weighed (judging/echo.py).
    assert rerank_bodies[0]["documents"] == [
        *PASSAGES,
        "Pale gums and tiredness are the classic .",
    ]


def test_rerank_relevancy_from_the_judges_own_probability() -> None:
    with ScriptedServer(responder=keyword_responder({"pale": "yes"}, "no")) as srv:
        with make_judge(srv) as j:
            median = j.rerank_relevancy(PUPPY, PASSAGES, agg="median")
    assert median == pytest.approx(0.9, abs=1e-6)


def test_the_sync_call_works_inside_a_running_event_loop() -> None:
    """As in a Jupyter cell: judge() called from code that runs inside an event loop."""
    with ScriptedServer(responder=keyword_responder({"pale": "yes"}, "no")) as srv:

        async def cell() -> list[str | None]:
            with make_judge(srv) as j:
                first = j.judge(PUPPY, PASSAGES)
                second = j.judge(PUPPY, PASSAGES)  # the Judge's clients survive between calls
            return [v.label for v in (*first.verdicts, *second.verdicts)]

        labels = asyncio.run(cell())
    assert labels[: len(PASSAGES)] == labels[len(PASSAGES) :]
    assert "yes" in labels and "no" in labels
