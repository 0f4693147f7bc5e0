"""The call layer's share of batch mode (``judge run --batch``, orchestrated by judge/run/batch.py):
a batch's worst case held against the budget at batch prices, the Batch API's management calls
under the one retry policy, and a batch answer stored as the caller stores a live one.

A batch cannot be stopped from spending once it is submitted (cancelling keeps what it already
answered), so its whole worst case is reserved before it is: every prompt's UTF-8 bytes plus
framing (:func:`~judge.calling.limits.worst_case_prompt_tokens`) and every answer's
``max_tokens``, priced by :meth:`~judge.config.Price.batch`. It is far above what the batch
will cost; what it did cost is counted when its output is read, and what the run asks after
it gets the caps less that (:func:`within`).

An answer is stored only when it parses (DESIGN rule 3), under its request's content address
with the first-round prompt's digest as its alias, exactly as :class:`Caller` stores a live
answer; the run then finds it cached and reads it as it reads any cached answer. The reading
itself is left to the run (its parser keeps it), so a batch never writes a reading the run's own
parser did not make.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from judge.calling.cache import UNREAD, Cache, Reading
from judge.calling.limits import (
    UNBOUNDED_COMPLETION,
    Budget,
    Limits,
    Reservation,
    worst_case_prompt_tokens,
)
from judge.calling.retries import CallStats, RetryPolicy
from judge.errors import BatchGone, BudgetExceeded, ParseError
from judge.providers.base import ChatRequest, Completion, RetryDecision
from judge.schema import Usage

__all__ = ["BatchBudget", "managed", "store_answer", "within", "worst_case", "worst_of"]

T = TypeVar("T")
_NOTHING_USD = 1e-9  # a dollar cap no request fits (0 would mean "no cap")


def worst_case(request: ChatRequest, extra_body: Mapping[str, Any] | None = None) -> Usage:
    """The most tokens ``request`` can use: its prompt's bound and its completion limit as
    sent (``max_tokens``, or one in ``extra_body``, the provider's, or in its params')."""
    prompt = worst_case_prompt_tokens([m.content for m in request.messages])
    completion = request.params.completion_limit(extra_body)
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=UNBOUNDED_COMPLETION if completion is None else completion,
    )


def worst_of(requests: Iterable[ChatRequest], extra_body: Mapping[str, Any] | None = None) -> Usage:
    """The most tokens ``requests`` can use together (``extra_body``: the provider's)."""
    return sum((worst_case(r, extra_body) for r in requests), Usage())


class BatchBudget:
    """The run's budget as batches see it: worst cases reserved and real usage spent at batch
    prices (``limits.price.batch()``), under the run's caps."""

    def __init__(self, limits: Limits, extra_body: Mapping[str, Any] | None = None) -> None:
        price = limits.price.batch() if limits.price is not None else None
        self.price, self.extra_body = price, extra_body
        self.budget = Budget(limits.model_copy(update={"price": price}))

    def cost(self, usage: Usage) -> float:
        return self.price.cost(usage) if self.price is not None else 0.0

    async def reserve(self, requests: Iterable[ChatRequest]) -> Reservation:
        """Hold the worst case of ``requests`` (one batch round); BudgetExceeded, saying what
        it would take, when the caps cannot hold it."""
        worst = worst_of(requests, self.extra_body)
        try:
            return await self.budget.reserve(worst.prompt_tokens, worst.completion_tokens)
        except BudgetExceeded as exc:
            raise BudgetExceeded(
                f"{exc} -- a batch is paid whatever it answers, so its worst case "
                f"({worst.total} tokens, ${self.cost(worst):.4f} at batch prices; far above "
                "what it will cost, see --dry-run) must fit before it is submitted; raise the "
                "budget or judge a --sample"
            ) from None

    def release(self, reservation: Reservation) -> None:
        """Give a round's reservation back once its batches are read (their usage is spent)."""
        self.budget.settle(reservation, Usage())

    def spend(self, usage: Usage) -> float:
        """Count what a batch's answers used; their cost at batch prices."""
        self.budget.spend(usage)
        return self.cost(usage)

    @property
    def spent(self) -> Usage:
        return self.budget.usage

    @property
    def spent_cost(self) -> float:
        return self.budget.cost


async def managed(
    call: Callable[[], Awaitable[T]],
    classify: Callable[[BaseException], RetryDecision],
    limits: Limits,
    stats: CallStats,
    what: str,
) -> T:
    """One Batch API call (upload, create, status, download, cancel) retried as every call is
    (:class:`RetryPolicy`: the provider classifies, Retry-After honoured, full jitter); after
    the attempts are spent, ProviderError saying ``what`` failed."""
    policy = RetryPolicy(classify, limits, stats)

    async def once() -> T:
        stats.requests += 1
        return await call()

    try:
        return await policy.run(once)
    except Exception as exc:
        stats.failures += 1
        failed = policy.gave_up(exc, f"{what}: ")
        if _status_of(exc) == 404:
            raise BatchGone(str(failed), kind=failed.kind, attempts=failed.attempts) from None
        raise failed from None


def _status_of(exc: BaseException) -> int | None:
    """The HTTP status of a provider's error (the SDK's ``status_code``, ours ``status``)."""
    status = getattr(exc, "status_code", None) or getattr(exc, "status", None)
    return status if isinstance(status, int) else None


# The tag of what a batch's reader made of an answer it could not read: no run's own parser
# has it, so a run reads such an answer again with its own (and says the same).
BATCH_READ = "batch"


def store_answer(
    cache: Cache,
    key: str,
    alias: str | None,
    answer: Completion,
    model: str,
    parse: Callable[[Completion], object],
    *,
    alias_unread: bool = True,
) -> ParseError | None:
    """Store a batch's ``answer`` under ``key`` (its request's content address), named by
    ``alias`` (the first-round prompt it answers); the error when ``parse`` cannot read it.
    One it cannot read is stored all the same, marked unread, as a live run keeps one (it
    was paid): the run reads it and re-asks as a live run would, never buys it again;
    ``alias_unread`` False: such an answer is not named by ``alias`` (a re-ask's: the first
    answer, which the run re-asks from, stays the one the prompt names)."""
    try:
        parse(answer)
    except ParseError as exc:
        keep_unread(cache, key, answer, model, exc, alias=alias if alias_unread else None)
        return exc
    cache.put(key, answer, kind="chat", model=model, alias=alias)
    return None


def keep_unread(
    cache: Cache,
    key: str,
    answer: Completion,
    model: str,
    error: ParseError,
    *,
    alias: str | None = None,
) -> None:
    """Keep a paid answer its parser could not read under ``key``, marked unread."""
    unread = Reading(UNREAD + BATCH_READ, str(error))
    cache.put(key, answer, kind="chat", model=model, alias=alias, reading=unread)


def within(limits: Limits, spent_cost: float, spent_tokens: int) -> Limits:
    """``limits`` with the caps lowered by what was spent (a spent cap admits no request)."""
    update: dict[str, float | int] = {}
    if limits.max_cost > 0:
        update["max_cost"] = max(limits.max_cost - spent_cost, _NOTHING_USD)
    if limits.max_tokens > 0:
        update["max_tokens"] = max(limits.max_tokens - spent_tokens, 1)
    return limits.model_copy(update=update)
