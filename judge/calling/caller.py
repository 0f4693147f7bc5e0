"""The one layer that calls providers: cache, concurrency, rate limits, retries, budget.

Every provider call in judge goes through a :class:`Caller` (DESIGN rule 2: one retry
authority). Providers only classify errors; here tenacity retries with exponential backoff
and jitter, honouring a server's Retry-After (capped), up to ``max_attempts`` tries. The
cache is consulted first. A chat answer is read by the caller's ``parse`` function exactly
once; only an answer that parses is cached (rule 3), and the parsed value comes back with it.

An attempt has a deadline drawn from the provider's recent latency and is hedged when it is
far slower than that (a second request; the first answer wins; both are counted and paid): a
hung request does not hold its slot for the whole timeout (:class:`judge.calling.limits.Tail`).

What it takes in and hands back: a :class:`Prompt` is known by a digest before it is rendered,
and a :class:`Reader`'s readings are kept beside the answers: a hit renders and parses nothing.
Answers stay keyed by the rendered request; a digest is an alias, and one that misses costs a
rendering, not a call. A call gives a :class:`CallResult`; a chat call a :class:`ChatAnswer`,
the answer with its parser's value or error.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from judge.calling.cache import UNREAD, Cache, Reading, Stored
from judge.calling.limits import (
    AdaptiveLimit,
    Budget,
    Gate,
    Limits,
    RateLimiter,
    worst_case_prompt_tokens,
)
from judge.calling.retries import CallStats, RetryPolicy, name_url, spent_failing
from judge.calling.tail import Deadline, Tail
from judge.calling.telemetry import spans
from judge.errors import NOT_SENT, BudgetExceeded, CacheError, ParseError, ProviderError
from judge.providers.base import (
    ChatProvider,
    ChatRequest,
    Completion,
    ProviderSpec,
    RerankProvider,
    RerankRequest,
    RerankResult,
    RetryDecision,
    never_sent,
    request_key,
)

A = TypeVar("A", Completion, RerankResult)
CLAIM_POLL_S = 0.05  # between looks for an answer another process asks for (x looks, <= 1 s)
CLAIM_SAID_AFTER = 40  # looks (about 30 s) before the wait is said
# Seconds a call's requests spent between leaving and their answer arriving (not waiting for
# a slot, a rate token or a retry's backoff; a hedge's too): a verdict's latency_s. A cell that
# the call's hedges, run as tasks of their own (with a copy of the context), add to as well.
log = logging.getLogger(__name__)

_IN_FLIGHT_S: ContextVar[list[float] | None] = ContextVar("judge_in_flight_s", default=None)
# Seconds between looks at the tail for a request sent before it knew the p95.
HEDGE_RECHECK_S = 0.5
# Seconds past timeout_s after which a request the provider did not time out is given up.
HARD_MARGIN_S = 5.0
P = TypeVar("P")
R = TypeVar("R")


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


@dataclass
class Prompt:
    """A chat request known by a digest of all that makes it before ``render`` makes it."""

    digest: str
    render: Callable[[], ChatRequest]
    # The rendered request's cache key by (provider identity, repeat): a call looks it up
    # before asking and stores under it after, and hashing a request costs more than a lookup.
    keys: dict[tuple[str, int], str] = field(default_factory=dict, repr=False, compare=False)

    @functools.cached_property
    def request(self) -> ChatRequest:
        return self.render()


@dataclass(frozen=True)
class Reader(Generic[P]):
    """A parser whose readings the cache keeps: ``dump`` and ``load`` carry a value to and from
    JSON; ``tag`` changes whenever ``parse`` could read the same answer differently."""

    parse: Callable[[Completion], P]
    tag: str
    dump: Callable[[P], str]
    load: Callable[[str], P]


def _parsed(
    call: CallResult[Completion], parse: Callable[[Completion], P] | Reader[P]
) -> ChatAnswer[P]:
    read = parse.parse if isinstance(parse, Reader) else parse
    try:
        return ChatAnswer(call, read(call.answer), None)
    except ParseError as exc:
        return ChatAnswer(call, None, exc)


def _reading_of(
    parse: Callable[[Completion], P] | Reader[P], result: ChatAnswer[P]
) -> Reading | None:
    """What the cache keeps of a reading: the value, or the error of an answer the parser
    could not read (None: a parser without a tag)."""
    if not isinstance(parse, Reader):
        return None
    if result.error is not None:
        return Reading(UNREAD + parse.tag, str(result.error))
    if result.value is None:
        return None
    return Reading(parse.tag, parse.dump(result.value))


def _named(provider: ChatProvider) -> str:
    """A chat provider as a message names it: its identity's URL, else the identity."""
    identity = provider.identity
    if identity.startswith("openai:"):  # "openai:" + base_url, then "+digest" if shaped
        return identity.removeprefix("openai:").split("+", 1)[0]
    return identity


class _NoHedge(Exception):
    """A hedge not sent: the budget has no room for it now."""


# Keys :meth:`Caller.cached` remembers as just missed, at most (a bound, never reached by
# a run that asks what it looked up).
MISSED_MAX = 100_000


def _wake(waiter: asyncio.Future[None], *_: Any) -> None:
    """Resolve ``waiter`` unless it already is (a done callback, a timer)."""
    if not waiter.done():
        waiter.set_result(None)


def _local(provider: ChatProvider | RerankProvider | None) -> bool:
    """Whether ``provider`` is a model on this machine (the embedded judge or reranker)."""
    return provider is not None and provider.identity.startswith("embedded")


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
        # The provider's own extra body: a completion limit in it bounds every answer too.
        spec = getattr(chat, "spec", None)
        self.extra_body: Mapping[str, Any] = (
            spec.extra_body if isinstance(spec, ProviderSpec) else {}
        )
        self.reranker = rerank
        self.cache = cache or Cache(None)
        self.limits = limits or Limits()
        self.stats = CallStats()
        # Why no new request may leave (a signal stopped the run); None while they may.
        self.stopping: str | None = None
        # Why a paid answer could not be stored (a full disk, a file another process holds):
        # its verdict still stands (see keep).
        self.cache_failure: str | None = None
        # A stored answer the parser could not read is asked again, not read (--redo
        # unparsed); else it is read, and its error re-asked about, as when it came.
        self.fresh_unparsed = False
        self.budget = Budget(self.limits)
        # One limit per provider: its calls in flight (adaptive under the configured ceiling).
        lim = self.limits
        self.slots = {
            "chat": AdaptiveLimit(lim.concurrency, start=lim.start, adaptive=lim.adaptive),
            "rerank": AdaptiveLimit(lim.rerank_concurrency, start=lim.start, adaptive=lim.adaptive),
        }
        # Each provider's recent latencies: an attempt's deadline and when to hedge it. A model
        # on this machine (embedded) is neither hedged nor cut short: its latency is our CPU.
        self.tails = {
            "chat": Tail(lim, local=_local(chat)),
            "rerank": Tail(lim, local=_local(rerank)),
        }
        self._rpm = RateLimiter(self.limits.requests_per_minute)
        self._tpm = RateLimiter(self.limits.tokens_per_minute)
        self._inflight: dict[str, asyncio.Future[Any]] = {}  # by key: chat and rerank keys differ
        # Prompts' keys that :meth:`cached` just found nothing under: the complete() that
        # follows asks without looking again (once; a put under the key forgets it).
        self._missed: set[str] = set()
        # The gate of asks waiting for a chat slot, per event loop (see :meth:`admission`).
        self._admission: tuple[asyncio.AbstractEventLoop, Gate] | None = None

    def admission(self) -> Gate:
        """The gate a query's asks pass before they exist (judging/units.py ``admitted``): at
        most twice the chat calls allowed in flight are made at once, whatever the passages
        per query. Without it every unit being judged made a task, a prompt and its
        rendering for each of its passages at once: 400 units of 100 passages held 40,000 of
        them (about 10 KB each) to keep 256 calls in flight."""
        loop = asyncio.get_running_loop()
        if self._admission is None or self._admission[0] is not loop:
            self._admission = (loop, Gate(2 * self.slots["chat"].ceiling))
        return self._admission[1]

    def key(self, request: ChatRequest | Prompt, repeat: int) -> str:
        """The cache key of ``request`` for repeat ``repeat`` to the chat provider (a prompt's:
        the alias that names its answer)."""
        identity = self.chat.identity if self.chat is not None else ""
        if isinstance(request, Prompt):
            blob = f"{identity}\x00{request.digest}\x00{repeat}".encode()
            return hashlib.sha256(blob).hexdigest()
        return request_key(identity, request, repeat)

    def _stored_key(self, prompt: Prompt, repeat: int) -> str:
        """The key the answer to ``prompt`` is stored under: its rendered request's, once."""
        identity = self.chat.identity if self.chat is not None else ""
        found = prompt.keys.get((identity, repeat))
        if found is None:
            found = prompt.keys[identity, repeat] = self.key(prompt.request, repeat)
        return found

    async def complete(
        self,
        request: ChatRequest | Prompt,
        repeat: int,
        parse: Callable[[Completion], P] | Reader[P],
    ) -> ChatAnswer[P]:
        """The answer to ``request`` for repeat ``repeat`` (cache or provider), parsed once.

        ``parse`` raises ParseError for an answer it cannot read; such an answer is returned
        with the error, and cached with it (:data:`UNREAD`): it was paid. Raises ProviderError
        after the retries are spent, BudgetExceeded before a call that the budget no longer
        allows.
        """
        provider = self.chat
        if provider is None:
            raise ProviderError("no chat provider is configured")
        key = self.key(request, repeat)

        def share(got: ChatAnswer[P]) -> ChatAnswer[P]:
            # Read again by this asker's parser: one request may be asked by two that read it
            # differently (a list prompt names passages by position; each list its own ids).
            return _parsed(replace(got.call, cached=True, attempts=0, latency_s=0.0), parse)

        async def fetch() -> ChatAnswer[P]:
            if not isinstance(request, Prompt):
                return await self._complete_uncached(provider, request, key, parse)
            stored = self._stored_key(request, repeat)
            return await self._complete_uncached(
                provider, request.request, stored, parse, alias=key
            )

        def cached() -> ChatAnswer[P] | None:
            if key in self._missed:  # looked up by cached() just now: nothing there
                self._missed.discard(key)
                return None
            return self._cached(key, request, repeat, parse)

        with spans().call("chat", provider.identity, request) as span:
            got = await self._once(key, cached, fetch, share)
            span.answered(got.call, request)
        return got

    def cached(
        self,
        requests: Sequence[Prompt],
        repeat: int,
        parse: Reader[P] | Sequence[Reader[P]],
        *,
        count: bool = True,
    ) -> list[ChatAnswer[P] | None]:
        """The cached answer to each of ``requests`` now, without a task or a wait, looked up
        together; None for one that must be asked (or is being asked) through :meth:`complete`.
        ``parse``: one reader for all, or one each. ``count``: count the hits in :attr:`stats`
        (not for a second look at answers that a run has already counted)."""
        readers = [parse] * len(requests) if isinstance(parse, Reader) else parse
        if self.chat is None:
            return [None] * len(requests)
        keys = [self.key(r, repeat) for r in requests]
        found = self.cache.get_stored_many([k for k in keys if k not in self._inflight], Completion)
        hits: list[ChatAnswer[P] | None] = []
        for key, request, reader in zip(keys, requests, readers, strict=True):
            stored = found.get(key)
            if key in self._inflight:
                hit = None
            elif stored is not None:
                hit = self._read(stored, reader)
            else:  # not under its digest (looked up just now): under its rendered request?
                hit = self._cached(key, request, repeat, reader, digest_missed=True)
            if (stored is not None or hit is not None) and (hit is None or hit.value is None):
                hits.append(None)  # unread, or to ask anew: complete() reads it, or asks
                continue
            self.stats.cache_hits += count and hit is not None
            if hit is None and key not in self._inflight and len(self._missed) < MISSED_MAX:
                self._missed.add(key)
            hits.append(hit)
        return hits

    async def _once(
        self,
        key: str,
        cached: Callable[[], R | None],
        fetch: Callable[[], Awaitable[R]],
        share: Callable[[R], R],
    ) -> R:
        """``cached()``; else, ``share``d, the answer to the same request in flight (one
        passage from two engines); else, once another process asking for it is done (the
        cache's claim on it, :meth:`judge.calling.cache.Cache.claim`), its cached answer;
        else ``fetch()``'s, which later askers wait for."""
        waited, stored = 0, False
        while True:
            hit = cached()
            if hit is not None:
                self.stats.cache_hits += 1
                return hit
            pending = self._inflight.get(key)
            if pending is None:
                claimed = self.cache.claim(key)
                if claimed or (claimed is None and stored):  # (stored, and of no use: asked)
                    break
                if claimed is None:  # stored since the look above: looked at again
                    stored = True
                    continue
                waited += 1  # another process asks for it now: its answer is ours too
                await self._wait_for_other(waited)
                continue
            try:
                got: R = await asyncio.shield(pending)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if pending.cancelled() and task is not None and not task.cancelling():
                    continue  # the owner was cancelled, not us: ask again ourselves
                raise
            self.stats.cache_hits += 1
            return share(got)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            result = await fetch()
        except BaseException as exc:
            self.cache.release(key)  # (an answer kept in the cache lets its claim go with it)
            if isinstance(exc, Exception):
                future.set_exception(exc)
                future.exception()  # mark retrieved: waiters re-raise it themselves
            else:
                future.cancel()
            raise
        else:
            self.cache.release(key)  # kept, it went with the answer; else it goes now
            future.set_result(result)
            return result
        finally:
            del self._inflight[key]

    async def _wait_for_other(self, waited: int) -> None:
        """Wait a moment (longer the more ``waited``) for another process's answer; said
        once, past about 30 s."""
        if waited == CLAIM_SAID_AFTER and not self.stats.said_waiting:
            self.stats.said_waiting = True
            log.warning(
                "%s: waiting for another judge process asking the same requests (its answers "
                "are read, not paid again)",
                self.cache.path,
            )
        await asyncio.sleep(min(CLAIM_POLL_S * waited, 1.0))

    def _cached(
        self,
        key: str,
        request: ChatRequest | Prompt,
        repeat: int,
        parse: Callable[[Completion], P] | Reader[P],
        *,
        digest_missed: bool = False,
    ) -> ChatAnswer[P] | None:
        """The cached answer: a prompt's by its digest (unless ``digest_missed``: known to
        name no usable answer), else by its rendered request's key (then named by the digest
        too); read from its reading when the parser's tag matches."""
        found = None
        if not digest_missed:
            found = self.cache.get_stored(key, Completion, alias=isinstance(request, Prompt))
        if found is None and isinstance(request, Prompt):
            found = self.cache.get_stored(self._stored_key(request, repeat), Completion)
            if found is not None:
                self.cache.add_alias(key, found.key)
        if found is None:
            return None
        return self._read(found, parse)

    def _read(
        self, found: Stored[Completion], parse: Callable[[Completion], P] | Reader[P]
    ) -> ChatAnswer[P] | None:
        """A stored answer as read by ``parse``: from its reading when the parser's tag
        matches, else parsed again (and the new reading stored). One this parser could not
        read: its error, as when it came (None under ``fresh_unparsed``: asked again)."""
        call, reading = (
            CallResult(found.value, cached=True, attempts=0, latency_s=0.0),
            found.reading,
        )
        tag = parse.tag if isinstance(parse, Reader) else None
        if tag is not None and reading is not None and reading.tag == UNREAD + tag:
            error = ParseError(reading.value)
            return None if self.fresh_unparsed else ChatAnswer(call, None, error)
        if isinstance(parse, Reader) and reading is not None and reading.tag == parse.tag:
            try:
                return ChatAnswer(call, parse.load(reading.value), None)
            except ValueError:  # unreadable as this version's value: read the answer again
                pass
        result = _parsed(call, parse)
        if result.error is not None and self.fresh_unparsed:
            return None
        stored = _reading_of(parse, result)
        if stored is not None:
            self.cache.set_reading(found.key, stored)
        return result

    async def _complete_uncached(
        self,
        provider: ChatProvider,
        request: ChatRequest,
        key: str,
        parse: Callable[[Completion], P] | Reader[P],
        alias: str | None = None,
    ) -> ChatAnswer[P]:
        estimate = sum(len(m.content) for m in request.messages) // 3  # tokens, for the TPM
        estimate += request.params.max_tokens or 256
        worst = worst_case_prompt_tokens([m.content for m in request.messages])

        send = functools.partial(provider.complete, request, timeout=self.limits.timeout_s)
        tries = 0

        async def pace() -> None:
            await self._rpm.acquire()
            await self._tpm.acquire(estimate)

        async def once() -> Completion:
            nonlocal tries
            tries += 1
            tokens, classify = request.params.completion_limit(self.extra_body), provider.classify
            answer = await self._attempt("chat", tries, pace, worst, tokens, send, classify)
            self._tpm.refund(max(0, estimate - answer.usage.total))
            return answer

        result = _parsed(await self._call(once, provider.classify), parse)
        answer = result.call.answer
        self.stats.answered(answer.text, _named(provider), answer.finish_reason == "length")
        # Kept whether it reads or not (paid either way); a parser without a tag (no reading
        # to keep) takes only the answers it reads, as the cache's acceptor.
        if result.error is None or isinstance(parse, Reader):
            reading = _reading_of(parse, result)
            self.keep(
                functools.partial(
                    self.cache.put,
                    key,
                    answer,
                    kind="chat",
                    model=request.model,
                    reading=reading,
                    alias=alias,
                )
            )
            self._missed.discard(key)
            if alias is not None:
                self._missed.discard(alias)
        return result

    async def rerank(self, request: RerankRequest, repeat: int = 0) -> CallResult[RerankResult]:
        provider = self.reranker
        if provider is None:
            raise ProviderError("no rerank provider is configured ([rerank] in the config)")
        key = request_key(provider.identity, request, repeat)

        def cached() -> CallResult[RerankResult] | None:
            got = self.cache.get(key, RerankResult)
            return None if got is None else CallResult(got, cached=True, attempts=0, latency_s=0)

        def share(got: CallResult[RerankResult]) -> CallResult[RerankResult]:
            return CallResult(got.answer, cached=True, attempts=0, latency_s=0.0)

        async def fetch() -> CallResult[RerankResult]:
            return await self._rerank_uncached(provider, request, key)

        with spans().call("rerank", provider.identity, request) as span:
            result = await self._once(key, cached, fetch, share)
            span.answered(result)
        return result

    async def _rerank_uncached(
        self, provider: RerankProvider, request: RerankRequest, key: str
    ) -> CallResult[RerankResult]:
        worst = worst_case_prompt_tokens([request.query, *request.documents])

        send = functools.partial(provider.rerank, request, timeout=self.limits.timeout_s)
        tries = 0

        async def once() -> RerankResult:
            nonlocal tries
            tries += 1
            return await self._attempt(
                "rerank", tries, self._rpm.acquire, worst, 0, send, provider.classify
            )

        result = await self._call(once, provider.classify)
        if len(result.answer.scores) == len(request.documents):
            self.keep(
                functools.partial(
                    self.cache.put, key, result.answer, kind="rerank", model=request.model
                )
            )
        return result

    def keep(self, put: Callable[[], None]) -> None:
        """``put()`` a paid answer (or its name) in the cache. A cache that cannot take it (a
        full disk, a file another process holds) is no reason to lose the answer: its
        verdict stands, and ``cache_failure`` says why (a run then stops sending and keeps
        the verdicts in its run directory; a Python caller is warned once, and its later
        answers are stored again once the cache takes them)."""
        try:
            put()
        except CacheError as exc:
            if self.cache_failure is None:
                log.warning("%s: the answers are kept, not cached, until it can be", exc)
            self.cache_failure = str(exc)

    async def _attempt(
        self,
        lane: str,
        attempt: int,
        pace: Callable[[], Awaitable[None]],
        prompt_tokens: int,
        completion_tokens: int | None,
        send: Callable[[], Awaitable[A]],
        classify: Callable[[BaseException], RetryDecision],
    ) -> A:
        """Attempt ``attempt`` of a call to the ``lane`` provider: a request under one of its
        slots and ``pace`` (the rate limits), given up at its deadline; when it has no answer
        by the tail's hedge time and a hedge is left, a second request (ahead of every call
        waiting for a slot) races it (see :class:`judge.calling.limits.Tail`)."""
        slot, tail = self.slots[lane], self.tails[lane]

        async def request(hedge: bool, left: asyncio.Future[None] | None) -> A:
            await slot.acquire(first=hedge)
            try:
                await pace()
                return await self._paid(
                    lane, prompt_tokens, completion_tokens, send, classify, attempt, hedge, left
                )
            finally:
                slot.release()

        if tail.share <= 0:  # never hedged: no task of its own
            return await request(False, None)
        left: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        first = asyncio.ensure_future(request(False, left))
        first.add_done_callback(functools.partial(_wake, left))  # failed before it left
        try:
            await left  # one future, not asyncio.wait's set of two: this runs for every call
            if not await self._slow(first, tail) or not tail.may_hedge():
                return await first
            hedge = asyncio.ensure_future(request(True, None))
            return await self._race(first, hedge, classify)
        finally:
            if not first.done():  # this call was cancelled: so is its request
                first.cancel()
                await asyncio.wait((first,))
            if not first.cancelled():  # a failure this call never awaited is still read
                first.exception()

    async def _slow(self, first: asyncio.Future[Any], tail: Tail) -> bool:
        """Whether the request ``first`` (just left, or failed before it could) is still
        without an answer at its hedge time, counted from when it left (a slot may have taken
        long), by the tail as it is then: one sent before the tail knew the p95 is hedged once
        it does. False as soon as it ends, or once a signal stops the run."""
        left, loop = time.perf_counter(), asyncio.get_running_loop()
        while not first.done() and self.stopping is None:
            after = tail.hedge_after()
            waited = time.perf_counter() - left
            if after is not None and waited >= after:
                return True
            # Until it ends or the wait is over: a future and a timer, what asyncio.wait
            # would make, without its sets (this runs for every call).
            ready: asyncio.Future[None] = loop.create_future()
            wake = functools.partial(_wake, ready)
            timer = loop.call_later(HEDGE_RECHECK_S if after is None else after - waited, wake)
            first.add_done_callback(wake)
            try:
                await ready
            finally:
                timer.cancel()
                first.remove_done_callback(wake)
        return False

    async def _race(
        self,
        first: asyncio.Future[A],
        hedge: asyncio.Future[A],
        classify: Callable[[BaseException], RetryDecision],
    ) -> A:
        """The first answer of a request and its hedge; the other request is cancelled (and
        paid as a request lost in flight; a first request so given up counts as a timeout).
        When both fail, the first request's failure is raised for the retry policy to decide
        on, and the hedge's is counted here."""
        pending: set[asyncio.Future[A]] = {first, hedge}
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task.exception() is None:
                        other = first if task is hedge else hedge
                        if other in pending:  # cancelled below: a first request given up slow
                            self.stats.errors["timeout"] += other is first
                        else:
                            self._count_failure(other.exception(), classify)
                        return task.result()
            self._count_failure(hedge.exception(), classify)
            failure = first.exception()
            assert failure is not None
            raise failure
        finally:
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
            for task in pending:  # one that failed before its cancel landed: read, not logged
                if not task.cancelled():
                    task.exception()

    def _count_failure(
        self, exc: BaseException | None, classify: Callable[[BaseException], RetryDecision]
    ) -> None:
        """Count a failed request that no retry decision will see (a hedge race's loser)."""
        if exc is None or isinstance(exc, _NoHedge):
            return
        if isinstance(exc, TimeoutError):
            kind = "timeout"
        elif isinstance(exc, ProviderError) and exc.kind in ("unreachable", "interrupted"):
            kind = exc.kind  # the caller's own refusals; a provider's errors are classified
        else:
            kind = classify(exc).kind
        self.stats.errors[kind] += 1

    async def _paid(
        self,
        lane: str,
        prompt_tokens: int,
        completion_tokens: int | None,
        send: Callable[[], Awaitable[A]],
        classify: Callable[[BaseException], RetryDecision],
        attempt: int,
        hedge: bool = False,
        left: asyncio.Future[None] | None = None,
    ) -> A:
        """One request (``send()``, given up at the deadline the tail gives a call's
        ``attempt``-th attempt as it leaves) under the budget: its worst case reserved before it
        is sent, settled to what it used. A request whose fate is unknown (timeout, dropped
        connection, cancelled in flight, a hedge race's loser) is counted at its worst case,
        prompt and completion: the provider may have generated and billed all of it for
        nobody. ``left`` is set as it leaves."""
        if self.stats.unreachable is not None:  # no request goes to a provider never reached
            raise ProviderError(f"{NOT_SENT}{self.stats.unreachable}", kind="unreachable")
        if self.stopping is not None:  # a run told to stop sends nothing new
            raise ProviderError(f"{NOT_SENT}{self.stopping}", kind="interrupted")
        slot, tail = self.slots[lane], self.tails[lane]
        if hedge:  # sent only if it fits now: it never waits for room a first request needs
            reservation = self.budget.try_reserve(prompt_tokens, completion_tokens)
            if reservation is None:
                raise _NoHedge()
        else:
            reservation = await self.budget.reserve(prompt_tokens, completion_tokens)
        tail.sent(hedge)
        spent, known, sent = reservation.usage, False, time.perf_counter()  # fate unknown yet
        self.stats.requests += 1  # counted as it leaves: not while waiting, not if refused
        self.stats.hedges += hedge
        if left is not None and not left.done():  # (done: its watcher was cancelled)
            left.set_result(None)
        deadline, timeout = self._deadline(tail, attempt), None
        try:
            async with Deadline(deadline) as timeout:
                tail.watch(timeout, attempt)
                answer = await send()
            answer = self.stats.counted(answer, reservation.usage, lane)
            spent, known = answer.usage, True
        except Exception as exc:
            kind = "timeout" if isinstance(exc, TimeoutError) else classify(exc).kind
            spent, known = spent_failing(exc, kind, reservation.usage), True
            self.stats.worst_counted += spent.total > 0
            self._failed(exc, kind, lane, attempt, hedge, sent, tail.cut(timeout))
            raise
        finally:
            self.stats.worst_counted += not known  # cancelled in flight: at its worst
            self.budget.settle(reservation, spent)
            if (cell := _IN_FLIGHT_S.get()) is not None:
                cell[0] += time.perf_counter() - sent
        latency = time.perf_counter() - sent
        tail.answered(latency)
        slot.success(latency)
        self.stats.unconnected = self.stats.dark = 0
        return answer

    def _failed(
        self,
        exc: BaseException,
        kind: str,
        lane: str,
        attempt: int,
        hedge: bool,
        sent: float,
        cut: bool = False,
    ) -> None:
        """What a failed request (sent at ``sent``, perf_counter) tells the counters, the lane's
        limit and tail, and the checks for a provider never reached or never answering. A
        timeout is the tail's deadline or the full ``timeout_s`` by how long it waited, not by
        the deadline it was sent with: the first attempts' deadlines are shortened once the
        p95 is known (they had counted as hung for timeout_s, and a provider answering half
        its requests in 0.1 s was said to have stopped answering for 60 s). ``cut``: one of
        those, which tells nothing of the provider's pace now (Tail.abandoned)."""
        provider = self.chat if lane == "chat" else self.reranker
        if provider is not None:  # named where the SDK's words do not (DashScope's, a timeout)
            name_url(exc, provider.identity)
        if kind == "timeout" and time.perf_counter() - sent < 0.9 * self.limits.timeout_s:
            self.tails[lane].abandoned(early=cut)  # given up at the tail's deadline
        elif kind == "timeout":
            self.stats.timed_out(exc, self.limits.timeout_s)  # at the full timeout_s
        unsent = never_sent(exc)
        self.stats.requests -= unsent  # no connection: the server never saw it
        self.stats.hedges -= unsent and hedge
        if unsent:
            self.stats.no_connection(exc)
        elif kind == "timeout" and attempt >= 2:
            self.stats.silent_retry(exc)
        if kind == "rate_limit":
            self.slots[lane].throttled()
        elif not unsent:
            self.slots[lane].failed()

    def _deadline(self, tail: Tail, attempt: int) -> float:
        """Seconds a request of a call's ``attempt``-th attempt leaving now is given: the
        tail's deadline, or past timeout_s, which the providers enforce themselves, a backstop
        for one that does not."""
        deadline = tail.deadline(attempt)
        return deadline if deadline < self.limits.timeout_s else deadline + HARD_MARGIN_S

    async def _call(
        self,
        once: Callable[[], Awaitable[A]],
        classify: Callable[[BaseException], RetryDecision],
    ) -> CallResult[A]:
        """``once`` until it succeeds, a failure is final, or the attempts are spent."""
        policy = RetryPolicy(classify, self.limits, self.stats)
        cell = [0.0]
        _IN_FLIGHT_S.set(cell)
        try:
            answer = await policy.run(once)
        except (ProviderError, BudgetExceeded) as exc:
            self.stats.failures += 1
            if isinstance(exc, ProviderError) and exc.kind not in ("unreachable", "interrupted"):
                raise policy.final(exc) from None
            raise
        except Exception as exc:
            self.stats.failures += 1
            raise policy.gave_up(exc) from None
        self.stats.successes += 1
        attempts, latency = policy.attempts, cell[0]
        return CallResult(answer, cached=False, attempts=attempts, latency_s=latency)
