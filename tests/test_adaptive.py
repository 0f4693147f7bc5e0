"""Adaptive concurrency: against a provider that throttles above its capacity, the limit comes
down to about that capacity, no call is lost, and the configured ceiling is never passed."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Callable

from judge.calling.limits import AdaptiveLimit, Limits
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
    # Halved after each overloaded round (clearly over 40% 429s; a round near the line is
    # judged over more answers), grown one slot per round, never below an eighth of the
    # ceiling: it ends near the capacity (at most 3x it), far below the start, and the 429s
    # are under two thirds of the calls (at a fixed 64 in flight, about 7 in 8 would be; on
    # a 2-core machine they ranged 256-370 here, so 60% was a bound on chance). (Waiting for
    # more answers near the line costs about a tenth more 429s here than judging every round
    # of 32 alone, which halved the limit on chance shares of 429s that come whatever the
    # load: test_429s_and_faults_... below.)
    assert slot.current <= 24
    assert throttling.throttled < 2 * len(PASSAGES)


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


def test_slots_go_to_waiters_first_come_first_served_one_per_free_slot() -> None:
    from judge.calling.limits import AdaptiveLimit

    async def scenario() -> tuple[list[int], int, int]:
        limit = AdaptiveLimit(2, start=2)
        order: list[int] = []
        wakeups = 0

        async def task(n: int, hold: asyncio.Event) -> None:
            nonlocal wakeups
            async with limit:
                wakeups += 1
                assert limit.in_flight <= 2
                order.append(n)
                await hold.wait()

        holds = [asyncio.Event() for _ in range(6)]
        tasks = [asyncio.create_task(task(n, holds[n])) for n in range(6)]
        await asyncio.sleep(0.01)
        assert order == [0, 1] and limit.in_flight == 2
        tasks[3].cancel()  # a waiter that leaves gives up its place
        await asyncio.sleep(0)
        for n in (0, 1, 2, 4, 5):
            holds[n].set()
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks, return_exceptions=True)
        return order, wakeups, limit.in_flight

    order, wakeups, in_flight = asyncio.run(scenario())
    assert order == [0, 1, 2, 4, 5]  # in arrival order, the cancelled one skipped
    assert wakeups == 5 and in_flight == 0  # no slot leaked, none handed twice


def test_a_waiter_cancelled_after_its_slot_was_granted_passes_the_slot_on() -> None:
    from judge.calling.limits import AdaptiveLimit

    async def scenario() -> int:
        limit = AdaptiveLimit(1, start=1)
        await limit.acquire()
        second = asyncio.create_task(limit.acquire())
        third = asyncio.create_task(limit.acquire())
        await asyncio.sleep(0)
        limit.release()  # the slot is granted to the second waiter...
        second.cancel()  # ...which is cancelled before it runs
        await asyncio.sleep(0.01)
        assert third.done() and limit.in_flight == 1
        limit.release()
        return limit.in_flight

    assert asyncio.run(scenario()) == 0


def test_429s_that_come_whatever_the_load_do_not_collapse_the_limit() -> None:
    """A fifth of the calls meet a 429 however few are in flight: not overload, so the limit
    stays high (it used to fall to 1-3 and take several times as long), and nothing is lost."""
    passages = [f"passage {i} about kettles" for i in range(320)]
    with ScriptedServer(
        responder=hashed_responder(), fault_rate=0.2, faults=[Fault("status", 429)], seed=3
    ) as srv:
        with _judge(srv, ceiling=32) as judge:
            jq = judge.judge("kettles", passages)
            slot = judge.caller.slots["chat"]
    assert all(v.status == "ok" for v in jq.verdicts)
    assert slot.current >= 12, slot.current  # the old controller ended at 1-3


def _fed(limit: AdaptiveLimit, throttled: float, faulty: float, n: int, seed: int) -> list[int]:
    """Feed ``limit`` n outcomes drawn at random: a throttle with probability ``throttled``, a
    fault (5xx, hang, drop) with ``faulty``, else a 200 ms success; the limit after each."""
    import random

    rng = random.Random(seed)
    seen = []
    for _ in range(n):
        draw = rng.random()
        if draw < throttled:
            limit.throttled()
        elif draw < throttled + faulty:
            limit.failed()
        else:
            limit.success(0.2)
        seen.append(limit.current)
    return seen


def test_429s_and_faults_that_come_whatever_the_load_keep_the_limit_high() -> None:
    """A fifth of the answers 429s and a fifth other faults (the nightly mix) never cut the
    limit. 30% and 30% (the harsh mix): a round of 32 passes 40% 429s by chance now and then,
    and it used to halve the limit each time (the old controller spent most of such a run at
    7 of 32); a share that close to the line is judged over more answers, and the limit spends
    most of the run at the ceiling."""
    for seed in range(5):
        assert min(_fed(AdaptiveLimit(32, start=32), 0.2, 0.2, 3000, seed)) == 32, seed
        harsh = _fed(AdaptiveLimit(32, start=32), 0.3, 0.3, 3000, seed)
        assert statistics.median(harsh) >= 28 and statistics.mean(harsh) >= 24, seed


def test_faults_alone_never_shrink_the_limit_and_overload_halves_it_at_once() -> None:
    faulty = AdaptiveLimit(32, start=32)
    assert min(_fed(faulty, 0.0, 0.6, 2000, 1)) == 32  # 5xx, hung and dropped: faults
    overloaded = AdaptiveLimit(32, start=32)
    seen = _fed(overloaded, 0.6, 0.0, 40, 1)  # 60% 429s: overload, judged in the first round
    assert seen[-1] <= 16


def _timed(limit: AdaptiveLimit, latency: Callable[[int], float], n: int) -> list[int]:
    """Feed ``limit`` n successes, each taking ``latency(limit.current)``; the limit after
    each."""
    seen = []
    for _ in range(n):
        limit.success(latency(limit.current))
        seen.append(limit.current)
    return seen


def test_a_provider_slower_whatever_the_load_gets_its_slots_back() -> None:
    """Twenty times slower for good (a busy hour, a bigger model behind the URL): the old
    rule compared every round with the lowest latency ever seen and cut a quarter each round,
    down to the floor (8 of 64) for the rest of the run. Cuts that leave the latency where it
    was are given back, and the slow latency becomes the new lowest."""
    limit = AdaptiveLimit(64, start=64)
    assert set(_timed(limit, lambda _: 0.05, 2000)) == {64}
    after = _timed(limit, lambda _: 1.0, 4000)
    assert min(after) < 64  # it did try cutting: it cannot tell at once
    assert after[-1] == 64 and statistics.mean(after[-1000:]) >= 60


def test_latency_our_load_causes_is_still_cut() -> None:
    """Queueing we cause (the latency grows with what is in flight past the provider's 16
    parallel slots) keeps being cut: the cuts bring the latency down, so it is not taken for
    a slower provider."""
    limit = AdaptiveLimit(64, start=16)
    seen = _timed(limit, lambda current: 0.05 * max(1.0, current / 16), 20000)
    assert max(seen) > 48  # it grew into the queueing...
    assert max(seen[-5000:]) <= 50 and statistics.mean(seen[-5000:]) <= 45  # ...and stays out
