"""The one layer that calls providers: cache, concurrency, rate limits, retries, budget.

Every provider call in judge goes through a :class:`Caller` (DESIGN rule 2: one retry
authority). Providers only classify errors; here tenacity retries with exponential backoff
and jitter, honouring a server's Retry-After (capped), up to ``max_attempts`` tries. The
cache is consulted first. A chat answer is read by the caller's ``parse`` function exactly
once; only an answer that parses is cached (rule 3), and the parsed value comes back with it.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from judge.calling.cache import Cache
from judge.calling.limits import (
    AdaptiveLimit,
    Budget,
    Limits,
    RateLimiter,
    worst_case_prompt_tokens,
)
from judge.errors import BudgetExceeded, ParseError, ProviderError
from judge.providers.base import (
    ChatProvider,
    ChatRequest,
    Completion,
    RerankProvider,
    RerankRequest,
    RerankResult,
    RetryDecision,
    request_key,
)
from judge.schema import Usage

A = TypeVar("A", Completion, RerankResult)
# Failures a provider answered with a status: the request was refused, not billed.
_NOT_BILLED = frozenset({"rate_limit", "server", "client", "config"})
# Seconds a call's attempts spent between leaving and their answer arriving (not waiting for
# a slot, a rate token or a retry's backoff): a verdict's latency_s.
_IN_FLIGHT_S: ContextVar[float] = ContextVar("judge_in_flight_s", default=0.0)
P = TypeVar("P")


@dataclass
class CallStats:
    """Counters for progress lines and the summary (mutated only on the event loop)."""

    requests: int = 0  # HTTP calls made to providers (every attempt)
    successes: int = 0
    cache_hits: int = 0
    retries: int = 0
    failures: int = 0  # calls that failed after all retries
    errors: Counter[str] = field(default_factory=Counter)  # by kind, every failed attempt


@dataclass(frozen=True)
class CallResult(Generic[A]):
    answer: A
    cached: bool
    attempts: int
    latency_s: float


@dataclass(frozen=True)
class ChatAnswer(Generic[P]):
    """A chat answer and what the caller's parser made of it: ``value`` or ``error``."""

    call: CallResult[Completion]
    value: P | None
    error: ParseError | None


def _estimate_tokens(request: ChatRequest) -> int:
    chars = sum(len(m.content) for m in request.messages)
    return chars // 3 + (request.params.max_tokens or 256)


class Caller:
    """Calls one chat provider and/or one rerank provider under shared limits."""

    def __init__(
        self,
        chat: ChatProvider | None,
        *,
        rerank: RerankProvider | None = None,
        cache: Cache | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.chat = chat
        self.reranker = rerank
        self.cache = cache or Cache(None)
        self.limits = limits or Limits()
        self.stats = CallStats()
        self.budget = Budget(self.limits)
        # One limit per provider: its calls in flight (adaptive under the configured ceiling).
        lim = self.limits
        self.slots = {
            "chat": AdaptiveLimit(lim.concurrency, start=lim.start, adaptive=lim.adaptive),
            "rerank": AdaptiveLimit(lim.rerank_concurrency, start=lim.start, adaptive=lim.adaptive),
        }
        self._rpm = RateLimiter(self.limits.requests_per_minute)
        self._tpm = RateLimiter(self.limits.tokens_per_minute)
        self._inflight: dict[str, asyncio.Future[ChatAnswer[Any]]] = {}
        self._inflight_rerank: dict[str, asyncio.Future[CallResult[RerankResult]]] = {}
        # The providers enforce timeout_s themselves; this backstop catches one that does not.
        self._hard_timeout_s = self.limits.timeout_s + 5.0

    async def complete(
        self, request: ChatRequest, repeat: int, parse: Callable[[Completion], P]
    ) -> ChatAnswer[P]:
        """The answer to ``request`` for repeat ``repeat`` (cache or provider), parsed once.

        ``parse`` raises ParseError for an answer it cannot read; such an answer is returned
        with the error and never cached. Raises ProviderError after the retries are spent,
        BudgetExceeded before a call that the budget no longer allows.
        """
        provider = self.chat
        if provider is None:
            raise ProviderError("no chat provider is configured")
        key = request_key(provider.identity, request, repeat)
        while True:
            cached = self.cache.get(key, Completion)
            if cached is not None:
                self.stats.cache_hits += 1
                return _parsed(CallResult(cached, cached=True, attempts=0, latency_s=0.0), parse)
            # The same request already in flight (e.g. one passage returned by two engines):
            # wait for that answer instead of paying twice.
            pending = self._inflight.get(key)
            if pending is None:
                break
            try:
                shared = await asyncio.shield(pending)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if pending.cancelled() and task is not None and not task.cancelling():
                    continue  # the owner was cancelled, not us: ask again ourselves
                raise
            self.stats.cache_hits += 1
            hit = CallResult(shared.call.answer, cached=True, attempts=0, latency_s=0.0)
            return ChatAnswer(hit, shared.value, shared.error)
        future: asyncio.Future[ChatAnswer[Any]] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            result = await self._complete_uncached(provider, request, key, parse)
        except BaseException as exc:
            if isinstance(exc, Exception):
                future.set_exception(exc)
                future.exception()  # mark retrieved: waiters re-raise it themselves
            else:
                future.cancel()
            raise
        else:
            future.set_result(result)
            return result
        finally:
            del self._inflight[key]

    async def _complete_uncached(
        self,
        provider: ChatProvider,
        request: ChatRequest,
        key: str,
        parse: Callable[[Completion], P],
    ) -> ChatAnswer[P]:
        estimate = _estimate_tokens(request)
        worst = worst_case_prompt_tokens([m.content for m in request.messages])

        async def send() -> Completion:
            async with asyncio.timeout(self._hard_timeout_s):
                return await provider.complete(request, timeout=self.limits.timeout_s)

        async def once() -> Completion:
            slot = self.slots["chat"]
            async with slot:
                await self._rpm.acquire()
                await self._tpm.acquire(estimate)
                answer = await self._paid(
                    slot, worst, request.params.max_tokens, send, provider.classify
                )
            self._tpm.refund(max(0, estimate - answer.usage.total))
            return answer

        result = _parsed(await self._call(once, provider.classify), parse)
        if result.error is None:
            self.cache.put(key, result.call.answer, kind="chat", model=request.model)
        return result

    async def rerank(self, request: RerankRequest, repeat: int = 0) -> CallResult[RerankResult]:
        provider = self.reranker
        if provider is None:
            raise ProviderError("no rerank provider is configured ([rerank] in the config)")
        key = request_key(provider.identity, request, repeat)
        while True:
            cached = self.cache.get(key, RerankResult)
            if cached is not None:
                self.stats.cache_hits += 1
                return CallResult(cached, cached=True, attempts=0, latency_s=0.0)
            # The same request in flight (a cascade scores a query once for all its repeats):
            # wait for that answer instead of paying twice.
            pending = self._inflight_rerank.get(key)
            if pending is None:
                break
            try:
                shared = await asyncio.shield(pending)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if pending.cancelled() and task is not None and not task.cancelling():
                    continue  # the owner was cancelled, not us: ask again ourselves
                raise
            self.stats.cache_hits += 1
            return CallResult(shared.answer, cached=True, attempts=0, latency_s=0.0)
        future: asyncio.Future[CallResult[RerankResult]] = (
            asyncio.get_running_loop().create_future()
        )
        self._inflight_rerank[key] = future
        try:
            result = await self._rerank_uncached(provider, request, key)
        except BaseException as exc:
            if isinstance(exc, Exception):
                future.set_exception(exc)
                future.exception()  # mark retrieved: waiters re-raise it themselves
            else:
                future.cancel()
            raise
        else:
            future.set_result(result)
            return result
        finally:
            del self._inflight_rerank[key]

    async def _rerank_uncached(
        self, provider: RerankProvider, request: RerankRequest, key: str
    ) -> CallResult[RerankResult]:
        worst = worst_case_prompt_tokens([request.query, *request.documents])

        async def send() -> RerankResult:
            async with asyncio.timeout(self._hard_timeout_s):
                return await provider.rerank(request, timeout=self.limits.timeout_s)

        async def once() -> RerankResult:
            slot = self.slots["rerank"]
            async with slot:
                await self._rpm.acquire()
                return await self._paid(slot, worst, 0, send, provider.classify)

        result = await self._call(once, provider.classify)
        if len(result.answer.scores) == len(request.documents):
            self.cache.put(key, result.answer, kind="rerank", model=request.model)
        return result

    async def _paid(
        self,
        slot: AdaptiveLimit,
        prompt_tokens: int,
        completion_tokens: int | None,
        send: Callable[[], Awaitable[A]],
        classify: Callable[[BaseException], RetryDecision],
    ) -> A:
        """One request under the budget: its worst case reserved before it is sent, settled
        to what it used. A request whose fate is unknown (timeout, dropped connection,
        cancelled in flight) is counted at its worst-case prompt: it may have been billed."""
        reservation = await self.budget.reserve(prompt_tokens, completion_tokens)
        spent = Usage(prompt_tokens=reservation.usage.prompt_tokens)
        sent = time.perf_counter()
        try:
            answer = await send()
            spent = answer.usage
        except Exception as exc:
            kind = "timeout" if isinstance(exc, TimeoutError) else classify(exc).kind
            if kind in _NOT_BILLED:
                spent = Usage()
            if kind == "rate_limit":
                slot.throttled()
            raise
        finally:
            self.budget.settle(reservation, spent)
            _IN_FLIGHT_S.set(_IN_FLIGHT_S.get() + time.perf_counter() - sent)
        slot.success(time.perf_counter() - sent)
        return answer

    async def _call(
        self,
        once: Callable[[], Awaitable[A]],
        classify: Callable[[BaseException], RetryDecision],
    ) -> CallResult[A]:
        """``once`` until it succeeds, a failure is final, or the attempts are spent."""
        policy = _RetryPolicy(classify, self.limits, self.stats)
        _IN_FLIGHT_S.set(0.0)
        attempts = 0

        async def attempt() -> A:
            nonlocal attempts
            attempts += 1
            self.stats.requests += 1
            return await once()

        try:
            try:
                # Most calls succeed at once: only a failure pays for tenacity's machinery.
                answer = await attempt()
            except Exception as first:
                if self.limits.max_attempts <= 1 or not policy.decide(first).retry:
                    raise
                self.stats.retries += 1
                await asyncio.sleep(policy.delay(1, first))
                answer = await policy.retrying()(attempt)
        except (ProviderError, BudgetExceeded):
            self.stats.failures += 1
            raise
        except Exception as exc:
            self.stats.failures += 1
            kind = policy.decide(exc).kind
            raise ProviderError(
                f"{kind} after {attempts} attempt(s): {type(exc).__name__}: {exc}",
                kind=kind,
                attempts=attempts,
            ) from None
        self.stats.successes += 1
        return CallResult(answer, cached=False, attempts=attempts, latency_s=_IN_FLIGHT_S.get())


class _RetryPolicy:
    """Retry decisions and waits for one call (the provider classifies, we decide)."""

    def __init__(
        self,
        classify: Callable[[BaseException], RetryDecision],
        limits: Limits,
        stats: CallStats,
    ) -> None:
        self.classify = classify
        self.limits = limits
        self.stats = stats
        # The decision for the latest failure, classified (and counted) once. Keyed by the
        # exception itself, not id(): a freed exception's id is soon reused by the next one.
        self._last: tuple[BaseException, RetryDecision] | None = None

    def decide(self, exc: BaseException) -> RetryDecision:
        if isinstance(exc, BudgetExceeded):  # not a provider failure: stop, never retry
            return RetryDecision(retry=False, kind="budget")
        if self._last is None or self._last[0] is not exc:
            if isinstance(exc, TimeoutError):
                decision = RetryDecision(retry=True, kind="timeout")
            else:
                decision = self.classify(exc)
            self.stats.errors[decision.kind] += 1
            self._last = (exc, decision)
        return self._last[1]

    def delay(self, failed: int, exc: BaseException | None) -> float:
        """Seconds to wait after ``failed`` attempts: the server's Retry-After (capped) if it
        sent one, else full jitter: uniform(0, min(base * 2^(failed-1), max_backoff))."""
        decision = self.decide(exc) if exc is not None else None
        if decision is not None and decision.retry_after is not None:
            return min(decision.retry_after, self.limits.max_backoff_s) + random.uniform(0, 0.1)
        ceiling = self.limits.backoff_base_s * 2 ** (failed - 1)
        return random.uniform(0, min(ceiling, self.limits.max_backoff_s))

    def retrying(self) -> AsyncRetrying:
        """Tenacity for the attempts after the first (which the caller made itself)."""

        def before_sleep(_state: RetryCallState) -> None:
            self.stats.retries += 1

        return AsyncRetrying(
            stop=stop_after_attempt(self.limits.max_attempts - 1),
            wait=lambda st: self.delay(
                st.attempt_number + 1, st.outcome.exception() if st.outcome else None
            ),
            retry=retry_if_exception(lambda e: self.decide(e).retry),
            before_sleep=before_sleep,
            reraise=True,
        )


def _parsed(call: CallResult[Completion], parse: Callable[[Completion], P]) -> ChatAnswer[P]:
    try:
        return ChatAnswer(call, parse(call.answer), None)
    except ParseError as exc:
        return ChatAnswer(call, None, exc)
