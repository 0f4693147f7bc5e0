"""Adaptive concurrency: against a provider that throttles above its capacity, the limit comes
down to about that capacity, no call is lost, and the configured ceiling is never passed."""

from __future__ import annotations

import threading
import time

from judge.calling.limits import Limits
from judge.judging.judge import Judge
from tests.servers import Fault, Item, Recorded, ScriptedServer, hashed_responder

PASSAGES = [f"passage {i} about kettles and tea" for i in range(240)]


class Throttling:
    """Answers after ``latency`` seconds; a request arriving while ``capacity`` are already
    being served gets a 429 at once. Records the most requests it ever served at once."""

    def __init__(self, capacity: int, latency: float = 0.05) -> None:
        self.capacity, self.latency = capacity, latency
        self.inner = hashed_responder()
        self.serving = self.peak = self.throttled = 0
        self._lock = threading.Lock()

    def __call__(self, request: Recorded) -> Item:
        with self._lock:
            if self.serving >= self.capacity:
                self.throttled += 1
                return Fault("status", 429)
            self.serving += 1
            self.peak = max(self.peak, self.serving)
        try:
            time.sleep(self.latency)
            return self.inner(request)
        finally:
            with self._lock:
                self.serving -= 1


def _judge(srv: ScriptedServer, ceiling: int) -> Judge:
    limits = Limits(concurrency=ceiling, max_attempts=12, backoff_base_s=0.02, max_backoff_s=0.5)
    return Judge(provider="local", model="m", base_url=srv.openai_base_url, limits=limits)


def test_the_limit_converges_to_the_providers_capacity_and_loses_nothing() -> None:
    throttling = Throttling(capacity=8)
    with ScriptedServer(responder=throttling) as srv:
        with _judge(srv, ceiling=64) as judge:
            jq = judge.judge("kettles", PASSAGES)
            slot = judge.caller.slots["chat"]
    assert [v.status for v in jq.verdicts] == ["ok"] * len(PASSAGES)
    assert throttling.peak <= 8
    # Halved on each window of 429s, grown one slot per round: it ends near the capacity,
    # far below the start, and the 429s are a small share of the calls.
    assert slot.current <= 16
    assert throttling.throttled < len(PASSAGES)


def test_an_explicit_ceiling_is_never_passed() -> None:
    throttling = Throttling(capacity=1000)
    with ScriptedServer(responder=throttling) as srv:
        with _judge(srv, ceiling=5) as judge:
            jq = judge.judge("kettles", PASSAGES[:60])
            slot = judge.caller.slots["chat"]
    assert all(v.status == "ok" for v in jq.verdicts)
    assert throttling.peak <= 5 and slot.peak <= 5 and throttling.throttled == 0


def test_without_adaptation_the_limit_stays_at_the_ceiling() -> None:
    throttling = Throttling(capacity=4)
    limits = Limits(concurrency=6, adaptive=False, max_attempts=20, backoff_base_s=0.01)
    with ScriptedServer(responder=throttling) as srv:
        with Judge(provider="local", model="m", base_url=srv.openai_base_url, limits=limits) as j:
            jq = j.judge("kettles", PASSAGES[:40])
            assert j.caller.slots["chat"].current == 6
    assert all(v.status == "ok" for v in jq.verdicts)
