"""Retry decisions and waits for one call, and the counters they keep (the one retry
authority's policy, used by :class:`judge.calling.caller.Caller` and by batch mode's
management calls, :func:`judge.calling.batch.managed`).

The provider classifies a failure (``RetryDecision``); here it is decided on, counted once, and
waited for: the server's Retry-After (capped) when it sent one, else full jitter. Tenacity runs
the attempts after the first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from judge.calling.limits import Limits, billed_on_failure
from judge.errors import BudgetExceeded, ProviderError
from judge.providers.base import Completion, ProviderStatusError, RerankResult, RetryDecision
from judge.schema import Usage

__all__ = ["CallStats", "RetryPolicy"]

T = TypeVar("T")
U = TypeVar("U", Completion, RerankResult)  # an answer whose usage the budget counts
log = logging.getLogger(__name__)


# Answers that are not the API at all, before any success, that stop every call after them.
NOT_API_ANSWERS = 3


# Attempts in a row that make no connection, before any success, after which a provider is
# unreachable: a closed port or a wrong host fails fast instead of through every retry.
UNREACHABLE_ATTEMPTS = 8
# Retries that time out too, before any success, after which a provider is unreachable: a
# server that never answers fails after a first attempt and a retry, not after all of them.
SILENT_RETRIES = 3
# Answers with no text, before any with text, after which a provider is unreachable.
EMPTY_ANSWERS = 8
# Requests in a row that timed out at the full timeout_s with no answer between them, after
# the provider had answered: it went dark mid-run (CallStats.timed_out).
DARK_TIMEOUTS = 16


@dataclass
class CallStats:
    """Counters for progress lines and the summary (mutated only on the event loop)."""

    requests: int = 0  # HTTP calls made to providers (every attempt, hedges included)
    hedges: int = 0  # of those, second requests sent for an attempt slow to answer
    successes: int = 0
    cache_hits: int = 0
    retries: int = 0
    failures: int = 0  # calls that failed after all retries
    errors: Counter[str] = field(default_factory=Counter)  # by kind, every failed attempt
    # Attempts in a row that made no connection at all, before any success, and why the
    # provider is taken to be unreachable once there were UNREACHABLE_ATTEMPTS of them.
    unconnected: int = 0
    unreachable: str | None = None
    silent: int = 0  # retries that timed out too, before any success (silent_retry)
    dark: int = 0  # requests in a row that timed out at timeout_s since the last answer
    worst_counted: int = 0  # requests whose usage was not reported: counted at the worst case
    # Passages a listwise judge asked one by one: their list's answers did not judge them.
    asked_alone: int = 0
    # Answers that came with no text at all, and whether one ever came with text.
    empty: int = 0
    texts: int = 0
    said_waiting: bool = False  # that another process asking the same requests was waited on
    said_usage: set[str] = field(default_factory=set)  # lanes whose odd usage counts were said

    def counted(self, answer: U, worst: Usage, lane: str) -> U:
        """``answer`` with the usage the budget counts: its worst case when its counts are
        not counts (a negative count would lift the budget); as reported when above what
        its request allowed (it may be billed so), said once per lane."""
        if not answer.usage_known:
            self.worst_counted += 1
            self._say_usage(
                f"{lane} unknown",
                "report token usage that is not a count (none, zero, negative, fractional or "
                "text): each is counted at its request's worst case",
            )
            return answer.model_copy(update={"usage": worst})
        used = answer.usage
        if used.prompt_tokens > worst.prompt_tokens or (
            worst.completion_tokens and used.completion_tokens > worst.completion_tokens
        ):
            self._say_usage(
                f"{lane} over",
                f"report more tokens than their requests allow ({used.prompt_tokens} prompt, "
                f"{used.completion_tokens} completion, for at most {worst.prompt_tokens} and "
                f"{worst.completion_tokens}): counted as reported, as they may be billed; a "
                "budget cannot cap what a provider counts past its requests' limits",
            )
        return answer

    def _say_usage(self, what: str, said: str) -> None:
        """Said once per lane and kind (``what``: "chat over", say): its usage counts' oddity."""
        if what not in self.said_usage:
            self.said_usage.add(what)
            log.warning("the %s provider's answers %s", what.split()[0], said)

    def reachable_again(self) -> None:
        """Forget that the provider was unreachable: a Python API call is asked anew (a Judge
        that once met a closed port had refused every later call at once, the server up)."""
        self.unreachable = None
        self.unconnected = self.silent = self.dark = self.empty = 0
        self.errors.pop("not_api", None)

    def unanswered(self, count: int, limit: int, why: Callable[[], str]) -> None:
        """Before any success, once ``count`` (of one kind of failure) reaches ``limit``, the
        provider is unreachable, ``why()`` saying so: every call after fails at once (a closed
        port, a web page where the API should be, a server that never answers)."""
        if not self.successes and self.unreachable is None and count >= limit:
            self.unreachable = why()

    def answered(self, text: str, where: str, cut: bool = False) -> None:
        """Count an answer by whether it holds text; the ``EMPTY_ANSWERS``-th with none,
        before any answer with text, makes the provider unreachable, ``where`` named: a
        server that answers every request with nothing (a wrong model name some gateways
        answer so, a filter that blanks everything, ``max_tokens`` spent on a reasoning
        model's thinking: ``cut``) had its answers counted unparsed, run to the end and
        reported as a threshold breach."""
        if text.strip():
            self.texts += 1
        elif not self.texts and self.unreachable is None:
            self.empty += 1
            if self.empty >= EMPTY_ANSWERS:
                why = (
                    "each cut off by max_tokens: raise [judge.params] max_tokens (a reasoning "
                    "model may spend it all thinking)"
                    if cut
                    else "check the model name and the server's logs (an empty answer is no "
                    "verdict)"
                )
                self.unreachable = (
                    f"{where} answered {self.empty} requests with no text and none with text: {why}"
                )

    def no_connection(self, exc: BaseException) -> None:
        """Count an attempt that made no connection; before any success, the
        ``UNREACHABLE_ATTEMPTS``-th in a row makes the provider unreachable: every call after
        it fails at once, saying where and why (a run stops on it, resumable)."""
        self.unconnected += 1
        self.unanswered(
            self.unconnected,
            UNREACHABLE_ATTEMPTS,
            lambda: (
                f"cannot reach {url_of(exc) or 'the provider'} ({root_cause(exc)}; "
                f"{self.unconnected} attempts, none connected)"
            ),
        )

    def silent_retry(self, exc: BaseException) -> None:
        """Count a retry that timed out too; before any success, the ``SILENT_RETRIES``-th
        makes the provider unreachable, as a closed port does: a server that takes the
        connection and never answers failed only after every call's every attempt (374 s on
        the sample at the 60 s timeout), saying only that a read timed out."""
        self.silent += 1
        self.unanswered(
            self.silent,
            SILENT_RETRIES,
            lambda: (
                f"no answer from {url_of(exc) or 'the provider'}: {self.silent} requests timed "
                f"out on a retry and none was answered ({root_cause(exc)}): it takes "
                "connections and says nothing; check that base_url is the API and that it is up"
            ),
        )

    def timed_out(self, exc: BaseException, timeout_s: float) -> None:
        """Count a request that timed out at the full ``timeout_s``; the ``DARK_TIMEOUTS``-th
        in a row, with no answer between, makes a provider that did answer unreachable: every
        call after fails at once and the run stops (one gone dark mid-run was retried for as
        long as the run lasted: 2,030 hung requests in 280 s for 129 answers)."""
        self.dark += 1
        if self.dark >= DARK_TIMEOUTS and self.unreachable is None:
            self.unreachable = (
                f"{url_of(exc) or 'the provider'} stopped answering: {self.dark} requests in "
                f"a row timed out after {timeout_s:g} s with no answer between them"
            )


class RetryPolicy:
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
        self.attempts = 0  # made so far by :meth:`run`

    def decide(self, exc: BaseException) -> RetryDecision:
        if isinstance(exc, BudgetExceeded):  # not a provider failure: stop, never retry
            return RetryDecision(retry=False, kind="budget")
        if isinstance(exc, ProviderError) and exc.kind in ("unreachable", "interrupted"):
            return RetryDecision(retry=False, kind=exc.kind)
        if self._last is None or self._last[0] is not exc:
            if isinstance(exc, TimeoutError):
                decision = RetryDecision(retry=True, kind="timeout")
            else:
                decision = self.classify(exc)
            self.stats.errors[decision.kind] += 1
            wait = decision.retry_after
            if decision.retry and wait is not None and wait > self.limits.max_backoff_s:
                # The server asks for a longer wait than a retry may take: retrying sooner
                # would only be refused again (a day's Retry-After was five 60 s waits).
                decision = RetryDecision(retry=False, kind=decision.kind, retry_after=wait)
            self._last = (exc, decision)
            if decision.kind == "not_api":
                self._not_the_api(exc)
        return self._last[1]

    def _not_the_api(self, exc: BaseException) -> None:
        """Before any success, the ``NOT_API_ANSWERS``-th answer that is not the API at all (a
        web page where it should be) makes the provider unreachable, as a closed port does:
        every call after it fails at once, saying what answered (a run stops on it)."""
        self.stats.unanswered(
            self.stats.errors["not_api"],
            NOT_API_ANSWERS,
            lambda: f"the server does not speak the API (not retried): {exc}",
        )

    def delay(self, failed: int, exc: BaseException | None) -> float:
        """Seconds to wait after ``failed`` attempts: the server's Retry-After (capped) if it
        sent one, else full jitter: uniform(0, min(base * 2^(failed-1), max_backoff))."""
        decision = self.decide(exc) if exc is not None else None
        if decision is not None and decision.retry_after:  # > 0: a wait of 0 or less is none
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

    async def run(self, once: Callable[[], Awaitable[T]]) -> T:
        """``once()`` until it succeeds, a failure is final, or the attempts are spent (then
        that failure is raised), counting the attempts."""

        async def attempt() -> T:
            self.attempts += 1
            return await once()

        try:
            # Most calls succeed at once: only a failure pays for tenacity's machinery.
            return await attempt()
        except Exception as first:
            if self.limits.max_attempts <= 1 or not self.decide(first).retry:
                raise
            self.stats.retries += 1
            await asyncio.sleep(self.delay(1, first))
            return await self.retrying()(attempt)

    def gave_up(self, exc: Exception, what: str = "") -> ProviderError:
        """The error for a call whose last attempt failed with ``exc`` (``what``: a prefix
        saying which call)."""
        kind = self.decide(exc).kind
        return ProviderError(
            f"{what}{kind} after {self.attempts} attempt(s): {type(exc).__name__}: "
            f"{exc}{where(exc)}{self.asked(exc)}",
            kind=kind,
            attempts=self.attempts,
        )

    def final(self, exc: ProviderError) -> ProviderError:
        """``exc``, a provider's own error that ended a call, said with where it came from
        and what the server asked for that made it final (the same error, its type and
        status kept)."""
        more = f"{where(exc)}{self.asked(exc)}"
        if more:
            exc.args = (f"{exc}{more}",)
        return exc

    def asked(self, exc: BaseException) -> str:
        """What the server asked for that made ``exc`` final: a wait longer than a retry may
        take (said after the error; "" otherwise)."""
        wait = self.decide(exc).retry_after
        if wait is None or wait <= self.limits.max_backoff_s:
            return ""
        return (
            f" (the server asks to wait {wait:.0f} s, more than run.max_backoff_s "
            f"{self.limits.max_backoff_s:g} s allows)"
        )


def where(exc: BaseException) -> str:
    """`` (at URL)``: the server a failure came from, when its message does not say it."""
    url = url_of(exc)
    return f" (at {url})" if url and url not in str(exc) else ""


def url_of(exc: BaseException) -> str | None:
    """The URL a failed request went to, where the SDK's exception (or its cause) says."""
    current: BaseException | None = exc
    for _ in range(8):
        if current is None:
            return None
        if isinstance(said := getattr(current, "url", None), str):  # ProviderStatusError
            return said
        request = getattr(current, "request", None)
        url = getattr(request, "url", None)
        if url is not None:
            return str(url)
        current = current.__cause__ or current.__context__
    return None


def name_url(exc: BaseException, identity: str) -> None:
    """Give ``exc`` the URL of the provider known by ``identity`` ("kind:URL", a fingerprint
    after it) when neither it nor what it wraps names one: an unreachable provider's line
    names where it looked."""
    if url_of(exc) is not None:
        return
    found = re.search(r"https?://[^\s+]+", identity)
    if found is not None:
        with contextlib.suppress(AttributeError):  # an exception with slots: left unnamed
            exc.url = found.group()  # type: ignore[attr-defined]


def root_cause(exc: BaseException) -> str:
    """The innermost exception's message (an SDK wraps "connection refused" in its own); not
    the cancellation inside a timeout, which says nothing."""
    current, seen = exc, {id(exc)}
    while (inner := current.__cause__ or current.__context__) is not None and id(inner) not in seen:
        if isinstance(inner, asyncio.CancelledError):
            break
        seen.add(id(inner))
        current = inner
    text = str(current).strip() or type(current).__name__
    return " ".join(text.split())[:200]


def spent_failing(exc: BaseException, kind: str, reserved: Usage) -> Usage:
    """What a failed request may have cost: nothing when the server refused it or no
    connection was made (:func:`billed_on_failure`); else its whole worst case ``reserved``.
    An answer that came with a success status but could not be used (too large, an error
    object) may have been billed whole, and so may one given up, dropped or cancelled in
    flight: the provider may have generated all of it for nobody."""
    if isinstance(exc, ProviderStatusError) and exc.status == 200:
        return reserved
    return billed_on_failure(exc, kind, reserved)
