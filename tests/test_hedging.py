"""An attempt's deadline and hedging, against a loopback server whose requests can hang.

After 20 answers the call layer knows the provider's recent p95: an attempt without an answer
after 2 x that (at least 0.2 s) gets a second, identical request, and the first answer wins; an
attempt still without one after 4 x that (at least 1 s) is abandoned and retried. Both requests
of a hedged attempt are counted and paid, a hedge is never sent past the budget, and hedges
stay a small share of the requests. The server counts every request; a hung request is held
until the test ends, so an answer that came is proof that it did not wait for the hung one.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from judge.calling.limits import Limits, worst_case_prompt_tokens
from judge.calling.tail import Tail
from judge.errors import BudgetExceeded
from judge.judging.judge import Judge
from tests.servers import Answer, Fault, Item, Recorded, ScriptedServer, hashed_responder

HISTORY = [f"passage {i} about kettles and tea" for i in range(40)]
MARK = "zebracorn"  # one word: found in a prompt whatever its datamark
TARGET = f"the {MARK} passage"
USAGE = (100, 5)  # every answer's (prompt, completion) tokens: exact accounting


class Hanging:
    """Answers every request with :data:`USAGE`; the first request whose prompt ``hangs``
    holds its handler until :meth:`release` (the test's end), then answers."""

    def __init__(self, hangs: Callable[[Recorded, int], bool]) -> None:
        self.hangs = hangs
        self.inner = hashed_responder()
        self.seen: Counter[str] = Counter()
        self.arrivals = 0
        self.hung: list[Recorded] = []
        self.finished = 0  # hung handlers that got to answer
        self._released = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, request: Recorded) -> Item:
        with self._lock:
            self.arrivals += 1
            self.seen[request.prompt] += 1
            hang = self.seen[request.prompt] == 1 and self.hangs(request, self.arrivals)
            if hang:
                self.hung.append(request)
        if hang:
            self._released.wait(120)
            with self._lock:
                self.finished += 1
        answer = self.inner(request)
        assert isinstance(answer, Answer)
        return dataclasses.replace(answer, usage=USAGE)

    def release(self) -> None:
        self._released.set()


@pytest.fixture
def serve() -> Iterator[Callable[[Hanging], ScriptedServer]]:
    """``serve(responder)``: a started server; its hung handlers are released, then it stops."""
    running: list[tuple[ScriptedServer, Hanging]] = []

    def start(responder: Hanging) -> ScriptedServer:
        server = ScriptedServer(responder=responder).start()
        running.append((server, responder))
        return server

    yield start
    for server, responder in running:
        responder.release()
        server.stop()


def _judge(server: ScriptedServer, **limits: float) -> Judge:
    # timeout_s is far beyond the test's patience: only the derived deadline or a hedge ends
    # a hung attempt in time.
    settings = {"timeout_s": 120.0, "max_attempts": 4, "backoff_base_s": 0.01, **limits}
    return Judge("local", "m", base_url=server.openai_base_url, limits=Limits(**settings))


def _target_hangs(request: Recorded, _arrival: int) -> bool:
    return MARK in request.prompt


def _worst_prompt(request: Recorded) -> int:
    return worst_case_prompt_tokens([str(m["content"]) for m in request.messages])


def test_a_hung_request_is_hedged_the_answer_comes_from_the_hedge_and_both_are_paid(
    serve: Callable[[Hanging], ScriptedServer],
) -> None:
    hanging = Hanging(_target_hangs)
    server = serve(hanging)
    with _judge(server) as judge:
        assert all(v.status == "ok" for v in judge.judge("kettles", HISTORY).verdicts)
        [verdict] = judge.judge("kettles", [TARGET]).verdicts
        stats, budget = judge.caller.stats, judge.caller.budget
        answered_while_hung = hanging.finished == 0
    assert verdict.status == "ok" and verdict.attempts == 1
    assert answered_while_hung  # the answer came from the second request
    target = [r for r in server.requests if MARK in r.prompt]
    assert len(target) == 2 and target[0].body == target[1].body  # an identical second request
    # Both requests counted: the server saw 42, the stats say 42, one of them a hedge, and no
    # retry was needed; the first request, given up, counts as a timeout.
    assert stats.requests == len(server.requests) == len(HISTORY) + 2
    assert (stats.hedges, stats.retries, dict(stats.errors)) == (1, 0, {"timeout": 1})
    # Both paid: 41 answers as reported, the abandoned one at its worst case, prompt and
    # completion (the provider may have generated it whole: it had been its prompt alone).
    answered = len(HISTORY) + 1
    assert budget.usage.prompt_tokens == answered * USAGE[0] + _worst_prompt(target[0])
    limit = int(target[0].body["max_tokens"])
    assert budget.usage.completion_tokens == answered * USAGE[1] + limit
    assert stats.worst_counted == 1  # so the spend is said as "at most"


def test_without_hedging_a_hung_attempt_is_abandoned_at_its_deadline_and_retried(
    serve: Callable[[Hanging], ScriptedServer],
) -> None:
    hanging = Hanging(_target_hangs)
    server = serve(hanging)
    with _judge(server, hedge_share=0.0) as judge:
        judge.judge("kettles", HISTORY)
        [verdict] = judge.judge("kettles", [TARGET]).verdicts
        stats = judge.caller.stats
        answered_while_hung = hanging.finished == 0
    assert verdict.status == "ok" and verdict.attempts == 2
    assert answered_while_hung  # the retry answered; the first request was still hanging
    assert sum(MARK in r.prompt for r in server.requests) == 2
    assert (stats.hedges, stats.retries, dict(stats.errors)) == (0, 1, {"timeout": 1})
    assert stats.requests == len(server.requests)


def test_a_hedge_is_not_sent_when_the_budget_has_no_room_for_it(
    serve: Callable[[Hanging], ScriptedServer],
) -> None:
    # The target's worst case, from a request for it that nothing hangs.
    probe = serve(Hanging(lambda _r, _n: False))
    with _judge(probe) as judge:
        judge.judge("kettles", [TARGET])
    [sent] = probe.requests
    prompt, completion = _worst_prompt(sent), int(sent.body["max_tokens"])
    assert completion > 1
    # Room after the history for the first request and half another: no hedge beside it. At
    # its deadline it is given up and counted at its worst case (it may have been generated
    # whole), and its retry no longer fits: the budget is reached, not passed.
    history = len(HISTORY) * sum(USAGE)
    cap = history + (prompt + completion) + (prompt + completion) // 2
    hanging = Hanging(_target_hangs)
    server = serve(hanging)
    with _judge(server, max_tokens=cap) as judge:
        judge.judge("kettles", HISTORY)
        with pytest.raises(BudgetExceeded):
            judge.judge("kettles", [TARGET])
        stats, budget = judge.caller.stats, judge.caller.budget
    assert stats.hedges == 0 and stats.requests == len(server.requests) == len(HISTORY) + 1
    assert budget.usage.total == history + prompt + completion <= cap


def test_hedges_stay_a_small_share_of_the_requests(
    serve: Callable[[Hanging], ScriptedServer],
) -> None:
    """A third of the passages hang on their first request (after the first 40 arrivals, so
    the deadline is known): hedges are sent, but at most 5% of the requests are hedges; the
    rest of the hung attempts are retried at their deadline. Nothing is lost."""

    def a_third(request: Recorded, arrival: int) -> bool:
        return arrival > 40 and sum(request.prompt.encode()) % 3 == 0

    hanging = Hanging(a_third)
    server = serve(hanging)
    passages = [f"passage {i} about kettles and tea" for i in range(200)]
    with _judge(server, concurrency=16, hedge_share=0.05) as judge:
        verdicts = judge.judge("kettles", passages).verdicts
        stats = judge.caller.stats
    assert [v.status for v in verdicts] == ["ok"] * len(passages)
    assert len(hanging.hung) >= 30
    assert stats.hedges >= 1
    first_requests = stats.requests - stats.hedges
    assert stats.hedges <= 0.05 * first_requests
    # The server saw each passage once, each retry and each hedge: nothing else was sent.
    assert len(server.requests) == stats.requests == len(passages) + stats.retries + stats.hedges


def test_a_provider_slower_for_everyone_is_not_abandoned_and_paid_twice() -> None:
    """After a fast spell the deadline is a few p95s (here the 1 s floor). When the provider
    turns slower for every request, each attempt was abandoned at it and sent again, and the
    provider answered (and billed) both: while most of the latest attempts were abandoned,
    attempts get timeout_s, until the answers bring the p95 up to date. Some hung requests
    among fast answers keep the short deadline, as does a burst of them while answers come."""
    now = [0.0]
    tail = Tail(Limits(timeout_s=60.0), clock=lambda: now[0])
    for _ in range(100):
        tail.answered(0.05)
    assert tail.deadline(1) == 1.0
    for _ in range(9):  # a tenth of the latest attempts hung: the short deadline holds
        tail.abandoned()
        for _ in range(9):
            tail.answered(0.05)
    assert tail.deadline(1) == 1.0
    for _ in range(11):  # most attempts of late abandoned, in a burst: not yet told apart
        tail.abandoned()
    assert tail.deadline(1) == 1.0
    now[0] += 2.0  # and no answer within a deadline since: slower for everyone
    assert tail.deadline(1) == 60.0
    for _ in range(20):  # its answers come (at 1.5 s) and the p95 catches up
        tail.answered(1.5)
    assert tail.deadline(1) == 6.0  # 4 x the p95 of the answers


def _judged_within(srv: ScriptedServer, n: int, *, concurrency: int, guard_s: float) -> Any:
    """``n`` passages judged through ``srv`` (timeout_s 60, no hedging) in a thread, which must
    end within ``guard_s``: the hung requests were not held to timeout_s."""
    judge = Judge(
        provider="local",
        model="m",
        base_url=srv.openai_base_url,
        limits=Limits(concurrency=concurrency, timeout_s=60.0, hedge_share=0, backoff_base_s=0.01),
    )
    got: list[Any] = []
    worker = threading.Thread(
        target=lambda: got.append(judge.judge("kettles", [f"p {i}" for i in range(n)])),
        daemon=True,
    )
    worker.start()
    worker.join(timeout=guard_s)
    assert not worker.is_alive(), "the hung requests were held to timeout_s"
    judge.close()
    (jq,) = got
    return jq


def test_a_request_hung_before_the_p95_was_known_gets_its_deadline_once_it_is() -> None:
    """Three of the first requests hang (a minute); the attempt deadline is timeout_s (60 s)
    until 20 answers give a p95, and those three were held to it long after every other
    answer was in. Once the p95 is known they get its deadline, and are asked again."""
    hung = [Fault("hang", seconds=120)] * 3
    with ScriptedServer(responder=hashed_responder()) as srv:
        srv.enqueue(*hung)
        # a hang guard: held to timeout_s it needs 60 s and more
        jq = _judged_within(srv, 60, concurrency=8, guard_s=45)
    assert [v.status for v in jq.verdicts] == ["ok"] * 60
    assert len(srv.requests) == 63  # the three hung, asked once more each


def test_a_provider_that_hangs_on_some_requests_is_not_taken_for_one_gone_dark() -> None:
    """A third of the requests hang (retries too) while the rest are answered in 0.1 s: once the
    p95 is known the first wave's deadlines are shortened and expire together. They had
    counted as timeouts at the full timeout_s, sixteen in a row made the provider "stopped
    answering: timed out after 60 s", and the run stopped in about 3 s, most passages
    errors. They are abandoned attempts, asked again."""
    hang = Fault("hang", seconds=120)
    with ScriptedServer(latency=0.1, fault_rate=0.3, faults=[hang], seed=3) as srv:
        # a hang guard (a call hung four times waits 1 + 2 + 4 + 8 s)
        jq = _judged_within(srv, 160, concurrency=64, guard_s=100)
    statuses = Counter(v.status for v in jq.verdicts)
    assert statuses["ok"] >= 155, statuses  # six attempts each: one may fail them all
    assert not any("stopped answering" in (v.error or "") for v in jq.verdicts)
