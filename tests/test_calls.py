"""The call layer through real runs against loopback servers: faults, retries, limits.

Every provider call goes through judge.calls.Caller (the one retry authority). These tests
drive whole runs (judge.runner.run_async) at an OpenAI-compatible ScriptedServer that
injects faults, and check what a user would see: verdicts.jsonl, the run outcome and the
requests the server recorded.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from judge.calling.cache import Cache
from judge.calling.caller import Caller
from judge.config import RunConfig, load_config
from judge.data.datasets import read_results
from judge.data.results import RESULTS_FILE
from judge.providers import make_chat_provider, resolve_spec
from judge.providers.base import ChatRequest, Completion, Message, SamplingParams
from judge.run.queries import load_queries
from judge.run.runner import RunOutcome, run_async
from judge.schema import Query
from tests.servers import (
    DROP,
    MALFORMED,
    Fault,
    Item,
    Recorded,
    ScriptedServer,
    hashed_responder,
    rate_limit,
)

SAMPLE = Path(__file__).resolve().parent.parent / "datasets" / "sample.jsonl"


def make_config(server: ScriptedServer, tmp_path: Path, **overrides: Any) -> RunConfig:
    """A run config aimed at ``server`` with small timeouts and backoff (dotted overrides)."""
    settings: dict[str, Any] = {
        "judge.provider": "local",
        "judge.model": "judge-test",
        "provider.base_url": server.openai_base_url,
        "dataset.path": str(SAMPLE),
        "dataset.label_scale": "graded",
        "run.cache": str(tmp_path / "cache.sqlite"),
        "run.timeout_s": 2.0,
        "run.backoff_base_s": 0.01,
        "run.max_backoff_s": 5.0,
    }
    return load_config(None, {**settings, **overrides})


def one_query(n_passages: int) -> list[Query]:
    """One query with ``n_passages`` distinct passages (one request each)."""
    row = {
        "query_id": "q1",
        "query": "how do solar panels work",
        "passages": [
            {"id": f"p{i}", "text": f"Passage number {i} about panels."} for i in range(n_passages)
        ],
    }
    return [Query.model_validate(row)]


def run(config: RunConfig, queries: list[Query], out: Path) -> RunOutcome:
    return asyncio.run(run_async(config, queries, out))


class TimedResponder:
    """Wraps a responder: notes each call's arrival time (time.monotonic, on the server thread,
    before the server's latency) and can answer the first calls with scripted faults."""

    def __init__(self, *first: Item, then: Callable[[Recorded], Item] | None = None) -> None:
        self.first = list(first)
        self.then = then or hashed_responder()
        self.times: list[float] = []
        self._lock = threading.Lock()

    def __call__(self, request: Recorded) -> Item:
        with self._lock:
            self.times.append(time.monotonic())
            if self.first:
                return self.first.pop(0)
        return self.then(request)


def test_faults_end_ok_or_reported_none_lost_or_doubled_and_retries_bounded(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    # fault_rate 0.4 over 8 equally likely faults: 20% 429 (Retry-After: 1), 5% each of
    # 500, a hang past the timeout, a dropped connection and malformed JSON.
    faults = [rate_limit("1")] * 4 + [
        Fault("status", 500),
        Fault("hang", seconds=2.0),
        DROP,
        MALFORMED,
    ]
    server = make_server(fault_rate=0.4, faults=faults, seed=3)
    max_attempts = 6
    config = make_config(
        server,
        tmp_path,
        **{"run.timeout_s": 0.5, "run.max_attempts": max_attempts, "run.concurrency": 8},
    )
    queries = load_queries(config)
    outcome = run(config, queries, tmp_path / "out")

    served = server.outcomes
    for kind in ("status_429", "status_500", "hang", "drop", "malformed"):
        assert served[kind] >= 1, f"the server never injected {kind}: {served}"
    # Every injected fault reached the call layer and was classified as what it was.
    kinds = outcome.errors_by_kind
    assert kinds.get("rate_limit") == served["status_429"]
    assert kinds.get("server") == served["status_500"]
    assert kinds.get("timeout") == served["hang"]
    assert kinds.get("connection") == served["drop"]
    assert kinds.get("protocol") == served["malformed"]

    expected = {(q.query_id, q.engine, 0, p.id) for q in queries for p in q.passages}
    written = Counter(
        (jq.query.query_id, jq.query.engine, jq.repeat, v.passage_id)
        for jq in read_results(tmp_path / "out" / RESULTS_FILE)
        for v in jq.verdicts
    )
    assert set(written) == expected  # none lost
    assert max(written.values()) == 1  # none written twice
    results = read_results(tmp_path / "out" / RESULTS_FILE)
    statuses = Counter(v.status for jq in results for v in jq.verdicts)
    assert set(statuses) <= {"ok", "error", "unparsed"}
    assert statuses["ok"] >= 0.9 * len(expected)
    errors = [v for jq in results for v in jq.verdicts if v.status == "error"]
    # A passage may meet a fault on every one of its attempts (0.4^6 each: about one run in
    # four has one): it is then reported, with its attempts spent, and the run says so.
    assert all(v.error and v.attempts == max_attempts for v in errors), errors
    assert outcome.done == outcome.planned == len(queries), outcome
    if errors:
        assert outcome.status == "incomplete", outcome
        assert "ended in provider errors (for example: " in (outcome.reason or ""), outcome
    else:
        assert outcome.status == "complete", outcome

    distinct = {(q.query_id, p.id) for q in queries for p in q.passages}
    assert len(server.requests) <= len(distinct) * max_attempts * 2
    assert outcome.requests == len(server.requests)


def test_retry_after_is_waited_before_the_next_request(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    responder = TimedResponder(rate_limit("1"))
    server = make_server(responder=responder)
    config = make_config(server, tmp_path)
    outcome = run(config, one_query(1), tmp_path / "out")

    assert len(server.requests) == 2
    assert server.outcomes["status_429"] == 1 and server.outcomes["ok"] == 1
    gap = responder.times[1] - responder.times[0]
    assert gap >= 1.0, f"retried {gap:.3f} s after a 429 with Retry-After: 1"
    assert outcome.retries == 1
    [jq] = read_results(tmp_path / "out" / RESULTS_FILE)
    assert [v.status for v in jq.verdicts] == ["ok"]
    assert jq.verdicts[0].attempts == 2


def test_requests_per_minute_spreads_requests_after_one_second_burst(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    responder = TimedResponder()
    server = make_server(responder=responder)
    rpm, n = 600.0, 30
    rate = rpm / 60.0  # 10 per second
    burst = rate * 1.0  # the bucket holds one second's worth
    config = make_config(server, tmp_path, **{"run.requests_per_minute": rpm, "run.concurrency": n})
    started = time.monotonic()
    run(config, one_query(n), tmp_path / "out")

    times = sorted(responder.times)
    assert len(times) == n
    # After the burst every request waits for a token, so the last of the 30 cannot be sent
    # before (30 - 10) / 10 = 2 s from the start. Measured from the client's start, not from
    # the first arrival: a loaded machine only delays arrivals, so this bound cannot flake.
    assert times[-1] - started >= (n - burst) / rate, [round(t - started, 3) for t in times]


def test_unauthorised_is_not_retried_and_keeps_the_key_out_of_everything(
    make_server: Callable[..., ScriptedServer], tmp_path: Path, fake_key: str
) -> None:
    server = make_server()
    server.enqueue(Fault("status", 401))
    config = make_config(server, tmp_path, **{"provider.api_key_env": "OPENAI_API_KEY"})
    outcome = run(config, one_query(1), tmp_path / "out")

    assert len(server.requests) == 1
    assert server.requests[0].headers.get("authorization") == f"Bearer {fake_key}"
    [jq] = read_results(tmp_path / "out" / RESULTS_FILE)
    [verdict] = jq.verdicts
    assert verdict.status == "error"
    assert verdict.error is not None and "401" in verdict.error
    assert fake_key not in verdict.error
    assert outcome.retries == 0 and outcome.errors_by_kind
    for path in [*(tmp_path / "out").iterdir(), *tmp_path.glob("cache.sqlite*")]:
        assert fake_key.encode() not in path.read_bytes(), path


def test_same_request_from_two_engines_is_sent_once(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    server = make_server(latency=0.05)
    config = make_config(server, tmp_path, **{"run.concurrency": 4})
    same = one_query(3)[0]
    queries = [same.model_copy(update={"engine": e}) for e in ("bm25", "dense", "hybrid")]
    outcome = run(config, queries, tmp_path / "out")

    assert len(server.requests) == 3
    assert outcome.cache_hits == 6
    assert sum(r.prompt.count("Passage number 0") for r in server.requests) == 1


def text_of(completion: Completion) -> str:
    return completion.text


def test_a_cancelled_request_does_not_fail_its_twin_waiting_for_it(
    make_server: Callable[..., ScriptedServer],
) -> None:
    server = make_server(latency=0.3)
    provider = make_chat_provider(resolve_spec("local", {"base_url": server.openai_base_url}))
    request = ChatRequest(
        model="judge-test",
        messages=(Message(role="user", content="Passage: a kettle boils water."),),
        params=SamplingParams(temperature=0.0),
    )

    async def scenario() -> str:
        caller = Caller(provider, cache=Cache(None))
        first = asyncio.create_task(caller.complete(request, 0, text_of))
        await asyncio.sleep(0.1)
        twin = asyncio.create_task(
            caller.complete(request, 0, text_of)
        )  # waits for `first`'s answer
        await asyncio.sleep(0.05)
        first.cancel()
        try:
            answer = await twin
            assert answer.value == answer.call.answer.text  # parsed once, value returned
            return answer.call.answer.text
        finally:
            await provider.aclose()

    assert "verdict" in asyncio.run(scenario())
    assert len(server.requests) == 2  # the twin asked again itself


def test_a_request_that_never_connected_is_neither_counted_as_sent_nor_charged(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    # A port bound but not listening refuses every connection: no request ever leaves.
    import socket

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    try:
        server = make_server()  # only for make_config's defaults; aimed elsewhere below
        config = make_config(
            server,
            tmp_path,
            **{
                "provider.base_url": f"http://127.0.0.1:{port}/v1",
                "run.max_attempts": 2,
                "run.max_cost": 10.0,
                'prices."judge-test"': {"prompt": 1000.0, "completion": 1000.0},
            },
        )
        outcome = run(config, one_query(3), tmp_path / "out")
    finally:
        closed.close()
    assert outcome.errors_by_kind == {"connection": 6}  # 3 passages x 2 attempts, all refused
    assert outcome.requests == 0 and outcome.cost_usd == 0.0 and outcome.prompt_tokens == 0
    assert server.requests == []
    assert outcome.status == "incomplete"
