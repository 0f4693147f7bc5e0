"""The one layer that calls providers: cache, concurrency, rate limits, retries, budget.

Every provider call in judge goes through a :class:`Caller` (DESIGN rule 2: one retry
authority). Providers only classify errors; here tenacity retries with exponential backoff
and jitter, honouring a server's Retry-After (capped), up to ``max_attempts`` tries. The
cache is consulted first and written only for answers the caller accepts (rule 3).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from judge.cache import Cache
from judge.errors import BudgetExceeded, ProviderError
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
from judge.schema import Record, Usage

A = TypeVar("A", Completion, RerankResult)


class Limits(Record):
    """How hard we may push providers (none of this is part of the cache key)."""

    concurrency: int = 8
    provider_concurrency: int = 0  # 0: only the global limit applies
    timeout_s: float = 60.0
    max_attempts: int = 6
    backoff_base_s: float = 0.5
    max_backoff_s: float = 60.0
    requests_per_minute: float = 0.0
    tokens_per_minute: float = 0.0
    max_cost: float = 0.0  # USD; 0 = no budget
    max_tokens: int = 0  # 0 = no budget
    price_prompt: float = 0.0  # USD per 1M prompt tokens
    price_completion: float = 0.0  # USD per 1M completion tokens


@dataclass
class CallStats:
    """Counters for progress lines and the summary (mutated only on the event loop)."""

    requests: int = 0  # HTTP calls made to providers (every attempt)
    successes: int = 0
    cache_hits: int = 0
    retries: int = 0
    failures: int = 0  # calls that failed after all retries
    errors: Counter[str] = field(default_factory=Counter)  # by kind, every failed attempt
    usage: Usage = field(default_factory=Usage)
    cost: float = 0.0


@dataclass(frozen=True)
class CallResult(Generic[A]):
    answer: A
    cached: bool
    attempts: int
    latency_s: float


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
        global_semaphore: asyncio.Semaphore | None = None,
    ) -> None:
        self.chat = chat
        self.reranker = rerank
        self.cache = cache or Cache(None)
        self.limits = limits or Limits()
        self.stats = CallStats()
        self._global = global_semaphore or asyncio.Semaphore(self.limits.concurrency)
        per = self.limits.provider_concurrency or self.limits.concurrency
        self._per_provider = {"chat": asyncio.Semaphore(per), "rerank": asyncio.Semaphore(per)}
        self._rpm = RateLimiter(self.limits.requests_per_minute)
        self._tpm = RateLimiter(self.limits.tokens_per_minute)
        self._inflight: dict[str, asyncio.Future[CallResult[Completion]]] = {}
        # The providers enforce timeout_s themselves; this backstop catches one that does not.
        self._hard_timeout_s = self.limits.timeout_s + 5.0

    async def complete(
        self,
        request: ChatRequest,
        repeat: int,
        *,
        accept: Callable[[Completion], bool] = lambda _c: True,
    ) -> CallResult[Completion]:
        """The answer to ``request`` for repeat ``repeat``, from the cache or the provider.

        ``accept`` says whether an answer may be cached (only parseable answers are).
        Raises ProviderError after the retries are spent, BudgetExceeded before a call
        that the budget no longer allows.
        """
        provider = self.chat
        if provider is None:
            raise ProviderError("no chat provider is configured")
        key = request_key(provider.identity, request, repeat)
        while True:
            cached = self.cache.get(key, Completion)
            if cached is not None:
                self.stats.cache_hits += 1
                return CallResult(cached, cached=True, attempts=0, latency_s=0.0)
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
            return CallResult(shared.answer, cached=True, attempts=0, latency_s=0.0)
        future: asyncio.Future[CallResult[Completion]] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            result = await self._complete_uncached(provider, request, key, accept)
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
        accept: Callable[[Completion], bool],
    ) -> CallResult[Completion]:
        estimate = _estimate_tokens(request)

        async def once() -> Completion:
            async with self._global, self._per_provider["chat"]:
                await self._rpm.acquire()
                await self._tpm.acquire(estimate)
                async with asyncio.timeout(self._hard_timeout_s):
                    answer = await provider.complete(request, timeout=self.limits.timeout_s)
            self._tpm.refund(max(0, estimate - answer.usage.total))
            return answer

        result = await self._call(once, provider.classify)
        self._account(result.answer.usage)
        if accept(result.answer):
            self.cache.put(key, result.answer, kind="chat", model=request.model)
        return result

    async def rerank(self, request: RerankRequest, repeat: int = 0) -> CallResult[RerankResult]:
        provider = self.reranker
        if provider is None:
            raise ProviderError("no rerank provider is configured ([rerank] in the config)")
        key = request_key(provider.identity, request, repeat)
        cached = self.cache.get(key, RerankResult)
        if cached is not None:
            self.stats.cache_hits += 1
            return CallResult(cached, cached=True, attempts=0, latency_s=0.0)

        async def once() -> RerankResult:
            async with self._global, self._per_provider["rerank"]:
                await self._rpm.acquire()
                async with asyncio.timeout(self._hard_timeout_s):
                    return await provider.rerank(request, timeout=self.limits.timeout_s)

        result = await self._call(once, provider.classify)
        self._account(result.answer.usage)
        if len(result.answer.scores) == len(request.documents):
            self.cache.put(key, result.answer, kind="rerank", model=request.model)
        return result

    async def _call(
        self,
        once: Callable[[], Awaitable[A]],
        classify: Callable[[BaseException], RetryDecision],
    ) -> CallResult[A]:
        self._check_budget()
        # The decision for the latest failure, classified (and counted) once. Keyed by the
        # exception itself, not id(): a freed exception's id is soon reused by the next one.
        last: list[tuple[BaseException, RetryDecision]] = []

        def decide(exc: BaseException) -> RetryDecision:
            if not last or last[0][0] is not exc:
                if isinstance(exc, TimeoutError):
                    decision = RetryDecision(retry=True, kind="timeout")
                else:
                    decision = classify(exc)
                self.stats.errors[decision.kind] += 1
                last[:] = [(exc, decision)]
            return last[0][1]

        def delay(failed: int, exc: BaseException | None) -> float:
            """Seconds to wait after ``failed`` attempts: the server's Retry-After (capped) if
            it sent one, else full jitter: uniform(0, min(base * 2^(failed-1), max_backoff))."""
            decision = decide(exc) if exc is not None else None
            if decision is not None and decision.retry_after is not None:
                return min(decision.retry_after, self.limits.max_backoff_s) + random.uniform(0, 0.1)
            ceiling = self.limits.backoff_base_s * 2 ** (failed - 1)
            return random.uniform(0, min(ceiling, self.limits.max_backoff_s))

        def before_sleep(_state: RetryCallState) -> None:
            self.stats.retries += 1

        start = time.perf_counter()
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
                if self.limits.max_attempts <= 1 or not decide(first).retry:
                    raise
                self.stats.retries += 1
                await asyncio.sleep(delay(1, first))
                retrying = AsyncRetrying(
                    stop=stop_after_attempt(self.limits.max_attempts - 1),
                    wait=lambda st: delay(
                        st.attempt_number + 1, st.outcome.exception() if st.outcome else None
                    ),
                    retry=retry_if_exception(lambda e: decide(e).retry),
                    before_sleep=before_sleep,
                    reraise=True,
                )
                answer = await retrying(attempt)
        except (ProviderError, BudgetExceeded):
            self.stats.failures += 1
            raise
        except Exception as exc:
            self.stats.failures += 1
            kind = decide(exc).kind
            raise ProviderError(
                f"{kind} after {attempts} attempt(s): {type(exc).__name__}: {exc}",
                kind=kind,
                attempts=attempts,
            ) from None
        self.stats.successes += 1
        return CallResult(
            answer, cached=False, attempts=attempts, latency_s=time.perf_counter() - start
        )

    def _account(self, usage: Usage) -> None:
        self.stats.usage = self.stats.usage + usage
        self.stats.cost += (
            usage.prompt_tokens * self.limits.price_prompt
            + usage.completion_tokens * self.limits.price_completion
        ) / 1e6

    def _check_budget(self) -> None:
        lim = self.limits
        if lim.max_cost > 0 and self.stats.cost >= lim.max_cost:
            raise BudgetExceeded(
                f"cost budget reached: ${self.stats.cost:.4f} of ${lim.max_cost:.4f}; "
                "rerun the same command to resume"
            )
        if lim.max_tokens > 0 and self.stats.usage.total >= lim.max_tokens:
            raise BudgetExceeded(
                f"token budget reached: {self.stats.usage.total} of {lim.max_tokens}; "
                "rerun the same command to resume"
            )
