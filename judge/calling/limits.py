"""How hard the call layer may push providers, and what it may spend.

:class:`Limits` is read from a config once (:meth:`Limits.from_config`); none of it is part
of a cache key. :class:`AdaptiveLimit` keeps the calls in flight to what a provider can take;
:class:`Gate` starts a query's asks in the order queries started;
:class:`RateLimiter` paces requests and tokens per minute; :class:`Budget` counts what was
spent and refuses a call the budget no longer allows (an attempt's deadline and hedging:
judge/calling/tail.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import Field, model_validator

from judge.config import Price, RunConfig
from judge.errors import BudgetExceeded, ConfigError
from judge.providers.base import never_sent
from judge.schema import Record, Usage


class Limits(Record):
    """Concurrency, timeouts, retries, rates and budget for one Caller."""

    # Calls in flight per provider (chat and rerank each): [provider] / [rerank] concurrency,
    # else [run] concurrency. One limit per provider; nothing nests. With ``adaptive`` it is a
    # ceiling the limit adapts under (AIMD, see AdaptiveLimit), starting at ``start``.
    # The bounds are [run]'s (judge/sections.py): a Python caller's Limits is checked as a
    # config's is, before anything is sent.
    concurrency: int = Field(default=64, ge=1)
    rerank_concurrency: int = Field(default=64, ge=1)
    adaptive: bool = True
    start: int = Field(default=64, ge=1)
    timeout_s: float = Field(default=60.0, gt=0)
    # One attempt's deadline (0: drawn from the recent p95, see Tail) and the share of
    # requests that may be hedges (0: no hedging).
    attempt_timeout_s: float = Field(default=0.0, ge=0)
    hedge_share: float = Field(default=0.05, ge=0, le=0.5)
    max_attempts: int = Field(default=6, ge=1)
    backoff_base_s: float = Field(default=0.5, ge=0)
    max_backoff_s: float = Field(default=60.0, gt=0)
    requests_per_minute: float = Field(default=0.0, ge=0)
    tokens_per_minute: float = Field(default=0.0, ge=0)
    max_cost: float = Field(default=0.0, ge=0)  # USD; 0 = no budget
    max_tokens: int = Field(default=0, ge=0)  # 0 = no budget
    price: Price | None = None  # the judge model's price; None = unknown (cost counted as 0)

    @model_validator(mode="after")
    def _priced(self) -> Limits:
        if self.max_cost > 0 and self.price is None:  # a dollar cap that could never be met
            raise ValueError(
                "max_cost needs the model's price beside it (Limits(max_cost=..., "
                "price=Price(prompt=..., completion=...)), USD per 1M tokens; or a limits dict's "
                "'price': {'prompt': ..., 'completion': ...}); or cap tokens with max_tokens"
            )
        return self

    @classmethod
    def from_config(cls, config: RunConfig) -> Limits:
        """The limits [run], [provider], [rerank] and the model's [prices] entry set."""
        r = config.run
        if r.max_cost > 0 and config.price() is None:
            raise ConfigError(
                f"{config.source}: run.max_cost is set but [prices] has no entry for the model "
                f"'{config.judge.model}': add [prices.\"{config.judge.model}\"] prompt and "
                "completion (USD per 1M tokens), or cap tokens with run.max_tokens instead"
            )
        rerank = config.rerank.concurrency if config.rerank else 0
        return cls(
            concurrency=config.provider.concurrency or r.concurrency,
            rerank_concurrency=rerank or r.concurrency,
            adaptive=r.adaptive_concurrency,
            timeout_s=r.timeout_s,
            attempt_timeout_s=r.attempt_timeout_s,
            hedge_share=r.hedge_share,
            max_attempts=r.max_attempts,
            backoff_base_s=r.backoff_base_s,
            max_backoff_s=r.max_backoff_s,
            requests_per_minute=r.requests_per_minute,
            tokens_per_minute=r.tokens_per_minute,
            max_cost=r.max_cost,
            max_tokens=r.max_tokens,
            price=config.price(),
        )


# A round of answers is judged once it holds at least this many (and the limit's worth).
MIN_ROUND = 32
# Latency rises by less than this are noise (a busy client, a fast provider), not queueing.
QUEUEING_S = 0.05
# More throttles than this share of a round's answers means overload; fewer, faults. A round
# is a sample: it must pass the share by SHARE_MARGIN standard deviations (about 9 points in a
# round of 32), else 429s that come whatever the load (a quarter of the answers, say) would
# pass it by chance every few rounds and halve the limit each time. A round within that of
# the share is too close to call and goes on, up to MAX_ROUNDS rounds' worth of answers (the
# margin narrowing as it grows), then counts as no overload.
THROTTLED_SHARE = 0.4
SHARE_MARGIN = 1.0
MAX_ROUNDS = 4
# Latency cuts that leave a round's median above LATENCY_KEPT of the first slow round's, for
# SLOW_ROUNDS rounds, were not queueing of ours: the provider got slower (AdaptiveLimit._slower).
LATENCY_KEPT, SLOW_ROUNDS = 0.9, 2


class AdaptiveLimit:
    """Calls in flight to one provider, adapted to what it can take (AIMD, judged by rounds).

    Starts at ``start`` (at most ``ceiling``). Outcomes are judged a round at a time (as many
    answers as the limit allows in flight, at least :data:`MIN_ROUND`; an answer is any attempt
    that ended, in success or failure): a round in which more than :data:`THROTTLED_SHARE` of
    the answers were throttles (429, or 503 with Retry-After) halves the limit, since the
    provider is overloaded (by a margin; a round too close to call goes on:
    :data:`SHARE_MARGIN`); a round whose median latency passed
    ``slow`` times the lowest seen, and by more than :data:`QUEUEING_S` (queueing at the
    provider), takes a quarter off, unless such cuts leave the latency where it was (the
    provider got slower whatever the load): then that latency is the new lowest, and the
    cuts are given back. A few 429s that come whatever the load, hung requests,
    5xx and dropped connections are faults, not overload: the retry layer deals with them, and the
    limit does not shrink for them. Every success adds ``1 / limit`` (one slot per round of
    calls, as TCP's congestion avoidance does). A round that is mostly throttles (three in
    four answers, eight at least) is judged at once: heavy overload is not waited out. The limit
    stays in [``floor``, ``ceiling``] (floor: an eighth of the ceiling, at
    least 1): an explicit ``concurrency`` is a hard ceiling. ``adaptive=False`` keeps it at
    the ceiling.
    """

    def __init__(
        self, ceiling: int, *, start: int = 64, adaptive: bool = True, slow: float = 3.0
    ) -> None:
        self.ceiling = max(1, ceiling)
        self.adaptive = adaptive
        self.limit = float(min(start, self.ceiling) if adaptive else self.ceiling)
        self.floor = float(max(1, self.ceiling // 8))
        self.slow = slow
        self.in_flight = 0
        self.peak = 0
        self.fastest: float | None = None
        # Since a round was first found slow: the limit before it was cut, that round's
        # median, and the slow rounds since that a cut did not bring down (see _slower).
        self._slowed: tuple[float, float, int] | None = None
        # The round being judged: its successes' latencies, its throttles, its other failures.
        self._latencies: list[float] = []
        self._throttles = 0
        self._faults = 0
        self._rounds = 1  # rounds' worth of answers the round being judged has grown to
        # Tasks waiting for a slot, first come first served; each is woken only when a slot is
        # its own (one Event for all woke every waiter on every release: O(n^2) at 1,000).
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def current(self) -> int:
        return max(1, int(self.limit))

    async def acquire(self, *, first: bool = False) -> None:
        """Take a slot, waiting for one in arrival order (``first``: ahead of every waiter,
        for a hedge, whose call has waited already)."""
        if not self._waiters and self.in_flight < self.current:
            self._take()
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if first:
            self._waiters.appendleft(waiter)
        else:
            self._waiters.append(waiter)
        try:
            await waiter  # resolved by _wake with the slot already taken for us
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # granted, then cancelled: pass it on
                self.release()
            raise

    def release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _take(self) -> None:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)

    def _wake(self) -> None:
        """Hand the free slots to the longest waiting tasks."""
        while self._waiters and self.in_flight < self.current:
            waiter = self._waiters.popleft()
            if not waiter.done():  # a cancelled waiter has gone
                self._take()
                waiter.set_result(None)

    async def __aenter__(self) -> AdaptiveLimit:
        await self.acquire()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.release()

    def success(self, latency_s: float) -> None:
        if not self.adaptive:
            return
        if self.fastest is None or latency_s < self.fastest:
            self.fastest = max(latency_s, 1e-3)
        self._latencies.append(latency_s)
        if not self._judge_round():
            self.limit = min(float(self.ceiling), self.limit + 1.0 / self.limit)
        self._wake()

    def throttled(self) -> None:
        if self.adaptive:
            self._throttles += 1
            self._judge_round()

    def failed(self) -> None:
        """An attempt ended in a fault (5xx, timeout, drop, bad body): not a reason to shrink,
        but an answer of the round all the same."""
        if self.adaptive:
            self._faults += 1
            self._judge_round()

    def _judge_round(self) -> bool:
        """At the end of a round, cut the limit if the round says the provider is overloaded
        (see the class docstring); True when it was cut."""
        throttles = self._throttles
        answers = len(self._latencies) + throttles + self._faults
        heavy = throttles >= 8 and throttles > 3 * (answers - throttles)
        size = max(MIN_ROUND, self.current)
        if answers < size * self._rounds and not heavy:
            return False
        share = throttles / answers
        spread = SHARE_MARGIN * math.sqrt(THROTTLED_SHARE * (1 - THROTTLED_SHARE) / answers)
        if not heavy and abs(share - THROTTLED_SHARE) <= spread and self._rounds < MAX_ROUNDS:
            self._rounds += 1  # too close to call: the round goes on
            return False
        latencies = self._latencies
        median = statistics.median(latencies) if latencies else None
        self._latencies, self._throttles, self._faults, self._rounds = [], 0, 0, 1
        if heavy or share > THROTTLED_SHARE + spread:
            return self._cut(0.5)
        fastest = self.fastest
        if (
            median is not None
            and fastest is not None
            and median > self.slow * fastest
            and median - fastest > QUEUEING_S
        ):
            return self._slower(median, min(latencies))
        self._slowed = None
        return False

    def _slower(self, median: float, quickest: float) -> bool:
        """A slow round: queueing that our load causes, so a quarter off the limit, unless
        cuts have not brought the latency down (LATENCY_KEPT of the first slow round's, for
        SLOW_ROUNDS rounds): then the provider is slower whatever the load (a bigger model
        behind the same URL, a busy hour), the slow latency is the new normal, and the limit
        the cuts took is given back (a 20x slower provider held 64 slots down to 8 for good)."""
        if self._slowed is None:
            self._slowed = (self.limit, median, 0)
            return self._cut(0.75)
        before, first, kept = self._slowed
        if median >= LATENCY_KEPT * first:
            kept += 1
            if kept >= SLOW_ROUNDS:
                self.fastest, self._slowed = max(quickest, 1e-3), None
                self.limit = max(self.limit, before)
                return False
        self._slowed = (before, first, kept)
        return self._cut(0.75)

    def _cut(self, factor: float) -> bool:
        self.limit = max(self.floor, self.limit * factor)
        return True


class Gate:
    """Starts asks, at most ``permits`` running at once, from the queries waiting in the order
    they came: every ask of a query is started before any of a later one's, so queries end in
    about the order the unit loop started them, as they did when each made all its asks at
    once, and which of two identical asks pays does not depend on timing. The gate itself
    starts the next ask when one ends, so no permit is ever free while a query waits. See
    judging/units.py ``admitted``."""

    def __init__(self, permits: int) -> None:
        self._free = max(1, permits)
        self._waiting: deque[Admission] = deque()

    def admit(self, admission: Admission) -> None:
        """Start ``admission``'s asks as permits allow, after those of every earlier one."""
        self._waiting.append(admission)
        self._fill()

    def _ended(self, _task: asyncio.Future[Any]) -> None:
        self._free += 1
        self._fill()

    def _fill(self) -> None:
        while self._free > 0 and self._waiting:
            task = self._waiting[0].next_task()
            if task is None:  # no ask left to start (or it failed, or was cancelled)
                self._waiting.popleft()
                continue
            self._free -= 1
            task.add_done_callback(self._ended)


class Admission:
    """One query's asks waiting at a :class:`Gate`, made one at a time as the gate starts them
    (``asks`` is read lazily: an ask's prompt is made as late). :meth:`next_task` is None
    once none is left, one has failed (making it, or running it), or it was closed."""

    def __init__(self, asks: Iterator[Callable[[], Coroutine[Any, Any, Any]]]) -> None:
        self._asks = asks
        self.tasks: list[asyncio.Task[Any]] = []
        self.failure: BaseException | None = None
        self.closed = False
        # Set once no more asks will be made (all made, a failure, or closed).
        self.all_made: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # The query's context: an ask started by the gate (from another ask's end) runs in a
        # copy of it, as a task made by the query itself would (its verdict sink, its spans).
        self._context = contextvars.copy_context()

    def next_task(self) -> asyncio.Task[Any] | None:
        make = None
        if not self.closed and self.failure is None:
            try:
                make = next(self._asks, None)
            except Exception as exc:  # making the ask failed (a template on this query's data)
                self.failure = exc
        if make is None:
            if not self.all_made.done():
                self.all_made.set_result(None)
            return None
        loop = asyncio.get_running_loop()
        task = loop.create_task(make(), context=self._context.copy())
        task.add_done_callback(self._ran)
        self.tasks.append(task)
        return task

    def _ran(self, task: asyncio.Future[Any]) -> None:
        if self.failure is None and not task.cancelled() and task.exception() is not None:
            self.failure = task.exception()


class RateLimiter:
    """Token bucket for ``per_minute`` units per minute; 0 disables it.

    The level L refills at r = per_minute / 60 units per second up to the capacity
    C = max(r * burst_s, 1): L(t) = min(C, L(t0) + r * (t - t0)). A request for n units waits
    until L >= min(n, C), then takes all n, so L may go negative and a request larger than the
    bucket is paid for by later waits: over any span T at most C + r * T units pass.

    The burst is one second's worth, not a minute's: providers enforce per-minute limits over
    shorter windows, and a full minute of requests fired at once would meet 429s.
    """

    def __init__(self, per_minute: float, *, burst_s: float = 1.0) -> None:
        self.rate = per_minute / 60.0
        self.capacity = max(self.rate * burst_s, 1.0)
        self.level = self.capacity
        self.stamp = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self, amount: float = 1.0) -> None:
        if self.rate <= 0:
            return
        need = min(amount, self.capacity)
        async with self._lock:  # FIFO: a waiter is not overtaken by later small requests
            while True:
                self._refill()
                if self.level >= need:
                    self.level -= amount
                    return
                await asyncio.sleep((need - self.level) / self.rate)

    def refund(self, amount: float) -> None:
        """Give back units taken but not used (a token estimate above the real usage)."""
        if self.rate > 0 and amount > 0:
            self._refill()
            self.level = min(self.capacity, self.level + amount)

    def _refill(self) -> None:
        now = time.monotonic()
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now


# Completion tokens reserved for a request that sets no max_tokens (a reasoning model's
# omitted limit): a generous bound, so a budget is never passed by an unbounded answer.
UNBOUNDED_COMPLETION = 8192
# Framing tokens a chat protocol adds per message and per request (role markers, priming).
PER_MESSAGE, PER_REQUEST = 8, 16


def worst_case_prompt_tokens(texts: list[str]) -> int:
    """An upper bound on the prompt tokens of these message texts, for any tokenizer we meet.

    Byte-level BPE tokenizers (OpenAI, Qwen, Llama) never give a token less than one byte, so
    the UTF-8 length bounds the count; framing adds a few tokens per message. It overestimates
    English about fourfold, which only matters for requests in flight at once: a reservation
    is settled to the real usage the moment its answer arrives.
    """
    return sum(len(t.encode("utf-8")) + PER_MESSAGE for t in texts) + PER_REQUEST


@dataclass(frozen=True)
class Reservation:
    usage: Usage
    cost: float


# Failures a provider answered with a status: the request was refused, not billed.
NOT_BILLED = frozenset({"rate_limit", "server", "client", "config"})


def billed_on_failure(exc: BaseException, kind: str, reserved: Usage) -> Usage:
    """What a request that failed with ``exc`` (classified ``kind``) may have cost: nothing
    when the server answered with a refusal or no connection was made (:func:`never_sent`);
    else ``reserved``, its worst case (a timeout or a drop: it may have been billed whole)."""
    return Usage() if kind in NOT_BILLED or never_sent(exc) else reserved


# A budget's bound is kept (Budget.on_bound) each time it grows by this fraction of a cap: a
# run killed outright may pass its cap by at most one such step.
BOUND_STEPS = 50
# Without a cap, the bound is kept each time it grows by a fiftieth of itself, and by at least
# this many tokens (a run killed outright has then said what it spent, within that).
UNCAPPED_STEP = 10_000


# Who spent what a budget counted before its first request (:meth:`Budget.count_earlier`), as
# its messages say it (a batch run names its own batch phase instead: judge/run/batch.py).
EARLIER = "by earlier invocations of this run"


class Budget:
    """A hard cap on cost and tokens: reserve each request's worst case, settle it after.

    No request starts while spent + reserved + its own worst case would pass a cap; it waits
    for requests in flight to settle (their real usage is usually far below the reservation).
    When nothing is in flight and it still does not fit, the budget is reached:
    BudgetExceeded, stating what was truly spent.
    """

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.usage = Usage()  # spent: what answers reported (and worst cases of lost ones)
        self.cost = 0.0
        # Of ``usage``, what earlier invocations into the same run directory spent: the cap
        # is the run's (:meth:`count_earlier`), and a rerun after a budget stop needs more.
        self.earlier = Usage()
        # Whether ``earlier`` is at most what they spent: one was killed outright with requests
        # in flight, counted at their worst case.
        self.earlier_at_most = False
        # Spent by earlier invocations at other prices (a run's batches at batch prices, a
        # batch phase's real-time asks at list price): counted against the caps, not in
        # ``usage``, whose cost is at this budget's price.
        self.elsewhere = Usage()
        self.elsewhere_cost = 0.0
        self._reserved_tokens = 0
        self._reserved_cost = 0.0
        self._reserved_prompt = 0  # of _reserved_tokens, the prompts'
        self._in_flight = 0
        # Told what may have been spent (:meth:`bound`) before a request that takes it past
        # the last bound told by a step of a cap (a run keeps it in its run directory: a run
        # killed outright then resumes under what it may have paid, not what it had settled).
        self.on_bound: Callable[[Usage], None] | None = None
        self._bound_told = (0.0, 0)  # the cost and tokens of the bound last told
        self._settled = asyncio.Event()
        # Which cap refused a request first ("cost" or "tokens"), once one has.
        self.reached_by: str | None = None

    @property
    def capped(self) -> bool:
        return self.limits.max_cost > 0 or self.limits.max_tokens > 0

    def _cost(self, usage: Usage) -> float:
        return self.limits.price.cost(usage) if self.limits.price is not None else 0.0

    def _committed(self) -> tuple[float, int]:
        """The cost and tokens spent, and held for the requests in flight."""
        return self.cost + self._reserved_cost, self.spent_tokens + self._reserved_tokens

    @property
    def spent_tokens(self) -> int:
        """Tokens spent, at this budget's price or elsewhere (:meth:`count_earlier`)."""
        return self.usage.total + self.elsewhere.total

    def _fits(self, usage: Usage, cost: float) -> bool:
        lim, (held_cost, held_tokens) = self.limits, self._committed()
        if lim.max_cost > 0 and held_cost + cost > lim.max_cost:
            return False
        return not (lim.max_tokens > 0 and held_tokens + usage.total > lim.max_tokens)

    def _worst(self, prompt_tokens: int, completion_tokens: int | None) -> Reservation:
        completion = UNBOUNDED_COMPLETION if completion_tokens is None else completion_tokens
        usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=completion)
        return Reservation(usage, self._cost(usage))

    def _hold(self, worst: Reservation) -> Reservation:
        self._reserved_tokens += worst.usage.total
        self._reserved_cost += worst.cost
        self._reserved_prompt += worst.usage.prompt_tokens
        self._in_flight += 1
        if self.on_bound is not None:
            self._tell_bound()
        return worst

    def bound(self) -> Usage:
        """What may have been spent: what was, and the worst case of the requests in flight."""
        return self.usage + Usage(
            prompt_tokens=self._reserved_prompt,
            completion_tokens=self._reserved_tokens - self._reserved_prompt,
        )

    def _tell_bound(self) -> None:
        """Tell ``on_bound`` the bound when it passed the last one told by a step of a cap;
        without a cap, by a step of what it was (at least :data:`UNCAPPED_STEP` tokens): a
        cap given to a rerun counts what an uncapped run killed outright had spent."""
        lim, (cost, tokens) = self.limits, self._bound_told
        spent_cost, spent_tokens = self._committed()
        if not self.capped:
            if spent_tokens - tokens >= max(UNCAPPED_STEP, tokens / BOUND_STEPS):
                self.tell_bound()
            return
        if (lim.max_cost > 0 and spent_cost - cost >= lim.max_cost / BOUND_STEPS) or (
            lim.max_tokens > 0 and spent_tokens - tokens >= lim.max_tokens / BOUND_STEPS
        ):
            self.tell_bound()

    def tell_bound(self) -> None:
        """Tell ``on_bound`` the bound now (a run's ledger on its timer, and at its end): the
        next step is counted from it, so a bound told lower (requests settled below their
        worst case) is told again a step later, not once the higher one is passed."""
        if self.on_bound is not None:
            self._bound_told = self._committed()
            self.on_bound(self.bound())

    async def reserve(self, prompt_tokens: int, completion_tokens: int | None) -> Reservation:
        """Hold a request's worst case, waiting while requests in flight may free room."""
        worst = self._worst(prompt_tokens, completion_tokens)
        while not self._fits(worst.usage, worst.cost):
            if self._in_flight == 0:
                raise BudgetExceeded(self.reached_message(worst.usage.total, worst.cost))
            self._settled.clear()
            await self._settled.wait()
        return self._hold(worst)

    def try_reserve(self, prompt_tokens: int, completion_tokens: int | None) -> Reservation | None:
        """Hold a request's worst case if it fits now, without waiting (None: it does not);
        a hedge is sent only so, never by waiting for room a first request would take."""
        worst = self._worst(prompt_tokens, completion_tokens)
        return self._hold(worst) if self._fits(worst.usage, worst.cost) else None

    def settle(self, reservation: Reservation, spent: Usage) -> None:
        """Release a reservation and count what the request really used (synchronous, so it
        also runs while a cancelled task unwinds)."""
        self._reserved_tokens -= reservation.usage.total
        self._reserved_cost -= reservation.cost
        self._reserved_prompt -= reservation.usage.prompt_tokens
        self._in_flight -= 1
        self.spend(spent)
        self._settled.set()

    def count_earlier(
        self,
        usage: Usage,
        at_most: bool = False,
        *,
        elsewhere: Usage | None = None,
        elsewhere_cost: float = 0.0,
    ) -> None:
        """Count ``usage``, spent by earlier invocations of this run, against the caps;
        ``at_most``: an upper bound (requests in flight when one was killed, at worst).
        ``elsewhere``: what they spent at another price, which cost ``elsewhere_cost``."""
        self.earlier, self.earlier_at_most = usage, at_most
        self.elsewhere, self.elsewhere_cost = elsewhere or Usage(), elsewhere_cost
        self.spend(usage)

    @property
    def this_run(self) -> Usage:
        """What this invocation spent (``usage`` less the earlier invocations')."""
        u, e = self.usage, self.earlier
        return Usage(
            prompt_tokens=u.prompt_tokens - e.prompt_tokens,
            completion_tokens=u.completion_tokens - e.completion_tokens,
        )

    @property
    def this_run_cost(self) -> float:
        return self._cost(self.this_run)

    def spend(self, usage: Usage) -> None:
        self.usage = self.usage + usage
        # The price is linear in tokens: the cost of everything spent, not a running float sum,
        # so the same answers cost the same to the last bit in whatever order they came.
        self.cost = self._cost(self.usage) + self.elsewhere_cost

    def reached_message(self, next_tokens: int = 0, next_cost: float = 0.0) -> str:
        """Why a request of this worst case is refused, with what was spent so far."""
        lim = self.limits
        by_cost = lim.max_cost > 0 and self.cost + next_cost > lim.max_cost
        self.reached_by = self.reached_by or ("cost" if by_cost else "tokens")
        if by_cost:
            what = f"{self._spent('cost')} (the next request could cost up to ${next_cost:.4f})"
        else:
            what = f"{self._spent('tokens')} (the next request could use up to {next_tokens})"
        return what + "; rerun with a larger budget to resume"

    def spent_message(self, worst_counted: int = 0) -> str:
        """The cap that was reached, with what was spent in the end: requests smaller than
        the one refused may still have fitted, and those in flight settled after it.
        ``worst_counted``: requests counted at their worst case (usage never reported, an
        attempt abandoned or dropped): the spend is then an upper bound, said as one."""
        by = self.reached_by or ("cost" if self.limits.max_cost > 0 else "tokens")
        return f"{self._spent(by, worst_counted)}; rerun with a larger budget to resume"

    def _spent(self, by: str, worst_counted: int = 0) -> str:
        lim = self.limits
        spent = "spent at most" if worst_counted or self.earlier_at_most else "spent"
        why = (
            f" ({worst_counted} request(s) with no usage reported counted at their worst case)"
            if worst_counted
            else ""
        )
        if self.earlier.total or self.elsewhere.total:
            before_cost = self._cost(self.earlier) + self.elsewhere_cost
            before_tokens = self.earlier.total + self.elsewhere.total
            before = f"${before_cost:.4f}" if by == "cost" else f"{before_tokens}"
            bound = (
                ", at most: one was stopped outright, its requests in flight counted at their "
                "worst case"
                if self.earlier_at_most
                else ""
            )
            why += f" ({before} of it {EARLIER}{bound})"
        if by == "cost":
            return f"cost budget reached: {spent} ${self.cost:.4f} of ${lim.max_cost:.4f}{why}"
        return f"token budget reached: {spent} {self.spent_tokens} of {lim.max_tokens} tokens{why}"
