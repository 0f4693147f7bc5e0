"""How long an attempt may take, and when to hedge it, from the provider's recent latency.

:class:`Tail` draws an attempt's deadline and its hedge time from the provider's recent p95;
:class:`Deadline` holds an attempt to its deadline, moved on when this process itself stalled
past it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from judge.calling.limits import Limits

# Answers remembered for the recent p95 (per provider), and how many it needs to be known.
TAIL_WINDOW, TAIL_HISTORY = 100, 20
# An attempt is abandoned after ATTEMPT_P95 x the recent p95 (never before ATTEMPT_FLOOR_S)
# and hedged after HEDGE_P95 x it (never before HEDGE_FLOOR_S).
ATTEMPT_P95, ATTEMPT_FLOOR_S = 4.0, 1.0
HEDGE_P95, HEDGE_FLOOR_S = 2.0, 0.2
# Hedges that may be saved up while the provider is well (so a slow spell is not doubled).
HEDGE_BURST = 8.0
# The latest attempts' ends that tell a provider slower for everyone (most abandoned at their
# deadline) from some hung requests (Tail._shifted).
SHIFT_WINDOW = 20
# A deadline found past by more than STALL_S saw this process stalled (see Deadline): it is
# moved STALL_GRACE_S on from when the process runs again.
STALL_S, STALL_GRACE_S = 0.25, 0.5


class Deadline:
    """An attempt's deadline, as ``asyncio.timeout`` holds a block to one, except when this
    process stalled across it: its event loop busy, or the machine too loaded to run it. The
    timer then runs late, in the same turn of the loop as the answer that came meanwhile, and
    would abandon (and pay again) a request the provider had answered in time. A deadline
    found past by more than :data:`STALL_S` is moved :data:`STALL_GRACE_S` on from then, as
    often as it is so found. ``when``, ``reschedule`` and ``expired`` as
    :class:`asyncio.Timeout`'s."""

    __slots__ = ("__weakref__", "_handle", "_loop", "_timeout", "_when")

    def __init__(self, seconds: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._when = self._loop.time() + seconds
        self._timeout = asyncio.timeout(None)
        self._handle: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> Deadline:
        await self._timeout.__aenter__()
        self._handle = self._loop.call_at(self._when, self._due)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        await self._timeout.__aexit__(*exc)  # never swallows: raises TimeoutError or passes

    def when(self) -> float | None:
        return None if self._handle is None else self._when

    def expired(self) -> bool:
        return self._timeout.expired()

    def reschedule(self, when: float) -> None:
        if self._handle is None:
            raise RuntimeError("the deadline is not running")
        self._handle.cancel()
        self._when = max(when, self._loop.time())  # one already past expires now, no stall
        self._handle = self._loop.call_at(when, self._due)

    def _due(self) -> None:
        now = self._loop.time()
        if now - self._when > STALL_S:
            self._when = now + STALL_GRACE_S
            self._handle = self._loop.call_at(self._when, self._due)
            return
        self._handle = None
        self._timeout.reschedule(now)  # expires now: the block ends in TimeoutError


class Tail:
    """One provider's recent latencies, and what they say about a slow attempt.

    The recent p95 is that of the last :data:`TAIL_WINDOW` answers' latencies (from the request
    leaving to its answer), known once there are :data:`TAIL_HISTORY`. Then:

    - **Deadline.** Attempt n of a call is abandoned after
      ``min(timeout_s, max(ATTEMPT_FLOOR_S, ATTEMPT_P95 x p95) x 2^(n-1))`` seconds (a fixed
      ``attempt_timeout_s`` replaces the max), and retried: a hung request holds its slot for
      a few p95s, not the whole ``timeout_s``. It is a fault, never a sign of overload, so the
      concurrency limit does not shrink for it. Doubling on each retry keeps a provider that
      became slow for every request reachable while the p95 catches up, and while most of the
      latest :data:`SHIFT_WINDOW` attempts were abandoned (slow for all, not hung for some) the
      deadline is ``timeout_s`` when no answer came within a deadline either (slow for all,
      not hung for some): abandoning would pay each answer twice. Without history, or
      for a model on this machine (``local``: its latency is our own CPU), it is ``timeout_s``;
      an attempt sent before the history is given the p95's deadline once the p95 is known
      (:meth:`watch`): one hung among the first answers held the run for ``timeout_s``.
    - **Hedging.** An attempt with no answer after ``max(HEDGE_FLOOR_S, HEDGE_P95 x p95)``
      gets a second, identical request (:meth:`may_hedge`); the first answer wins, the other
      is cancelled, and both are counted and paid. Each first request earns ``hedge_share`` of
      a hedge, at most :data:`HEDGE_BURST` saved: hedges are at most ``hedge_share`` of the
      requests, and a provider slow for everyone is not sent twice the load. ``hedge_share =
      0`` or ``local``: never.
    """

    def __init__(
        self, limits: Limits, *, local: bool = False, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.timeout_s = limits.timeout_s
        self.fixed_s = limits.attempt_timeout_s
        self.share = 0.0 if local else limits.hedge_share
        self.local = local
        self._recent: deque[float] = deque(maxlen=TAIL_WINDOW)
        self._p95: float | None = None  # cached until the next answer
        self._saved = 0.0  # hedges earned and not yet spent
        # The latest attempts' ends: True for one abandoned at its deadline (see deadline).
        self._ends: deque[bool] = deque(maxlen=SHIFT_WINDOW)
        self._clock = clock
        self._last_answer: float | None = None  # when the latest answer came (clock)
        # Attempts sent before the p95 was known (deadline timeout_s): (their timeout, when
        # they left, which attempt), given the p95's deadline once it is (see watch).
        self._early: list[tuple[Deadline, float, int]] = []
        self._cut: weakref.WeakSet[Deadline] = weakref.WeakSet()  # those shortened

    def answered(self, latency_s: float) -> None:
        self._recent.append(latency_s)
        self._p95 = None
        self._ends.append(False)
        self._last_answer = self._clock()
        if self._early and len(self._recent) >= TAIL_HISTORY:
            self._shorten()

    def watch(self, timeout: Deadline, attempt: int) -> None:
        """An attempt just sent under ``timeout``: one sent before the p95 is known waits
        ``timeout_s`` (60 s), and a hung one among the first held the run that long after
        every other answer was in; it gets the p95's deadline once the p95 is known."""
        if self.p95 is None and not self.local and self.fixed_s <= 0:
            self._early.append((timeout, asyncio.get_running_loop().time(), attempt))

    def _shorten(self) -> None:
        early, self._early = self._early, []
        for timeout, sent, attempt in early:
            when = timeout.when()
            if timeout.expired() or when is None:
                continue
            with contextlib.suppress(RuntimeError):  # ended meanwhile: nothing to shorten
                timeout.reschedule(min(when, sent + self.deadline(attempt)))
                self._cut.add(timeout)

    def cut(self, timeout: Deadline | None) -> bool:
        """Whether ``timeout`` is one sent before the p95 was known and shortened to its
        deadline once it was (:meth:`watch`)."""
        return timeout is not None and timeout in self._cut

    def abandoned(self, *, early: bool = False) -> None:
        """An attempt given up at its deadline (its answer, if it comes, is paid all the same).
        ``early``: one of the first wave, its deadline shortened once the p95 was known; they
        expire together, and would read as a provider slower for all (:meth:`_shifted`) just
        as the answers show it is not: not counted among the latest attempts' ends."""
        if not early:
            self._ends.append(True)

    @property
    def p95(self) -> float | None:
        """The recent answers' 95th percentile latency (None: fewer than TAIL_HISTORY)."""
        if self._p95 is None and len(self._recent) >= TAIL_HISTORY:
            ordered = sorted(self._recent)
            self._p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        return self._p95

    def deadline(self, attempt: int) -> float:
        """Seconds attempt ``attempt`` (1 for a call's first) may take before it is abandoned."""
        if self.fixed_s > 0:
            base = self.fixed_s
        elif self.local or (p95 := self.p95) is None:
            return self.timeout_s
        else:
            base = max(ATTEMPT_FLOOR_S, ATTEMPT_P95 * p95)
            if self._shifted(base):
                return self.timeout_s
        # Doubled on each retry: a request slower than the rest (a long passage, a long
        # reason) is answered on a later attempt, not abandoned and paid at every one.
        return min(self.timeout_s, base * 2.0 ** max(0, attempt - 1))

    def _answering(self, within: float) -> bool:
        """Whether an answer came in the last ``within`` seconds."""
        return self._last_answer is not None and self._clock() - self._last_answer < within

    def _shifted(self, base: float) -> bool:
        """Most of the latest attempts were abandoned and no answer came within a deadline
        (``base``): the provider is slower for every request, not hung for some, and the p95
        of its answers is out of date. Abandoning more would pay for each answer twice (a 20x
        slower provider: 7% of bodies answered twice), so attempts get timeout_s until its
        answers bring the p95 up to date. A provider that hangs on half its requests keeps
        answering the rest: its hung attempts are abandoned (they had been held to timeout_s,
        a minute each, whenever a burst of them expired together)."""
        return sum(self._ends) * 2 > SHIFT_WINDOW and not self._answering(base)

    def hedge_after(self) -> float | None:
        """Seconds without an answer after which an attempt is hedged (None: never)."""
        if self.share <= 0 or (p95 := self.p95) is None:
            return None
        return max(HEDGE_FLOOR_S, HEDGE_P95 * p95)

    def sent(self, hedge: bool = False) -> None:
        """A request left: a first one (not a ``hedge``) earns a share of a hedge."""
        if self.share > 0 and not hedge:
            self._saved = min(HEDGE_BURST, self._saved + self.share)

    def may_hedge(self) -> bool:
        """Spend a saved hedge (False: none is left)."""
        if self._saved < 1.0:
            return False
        self._saved -= 1.0
        return True
