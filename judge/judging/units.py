"""The one unit loop: (query, repeat) units judged by workers sharing one iterator of them.

``judge run`` (judge/run/runner.py) and ``Judge.judge_many`` both judge through
:func:`judge_units`. It takes a judging callable, not a Judge: the CLI adds the results writer,
resume, signals and its health stop around it; the Python API adds a progress bar. Workers are
more than the call slots (twice the calls allowed in flight), so the slots stay busy while a
unit waits on its last call; the Caller's per-provider limit is what bounds requests in flight.
One worker's failure (or a cancel) stops the others before anything else is paid.

Each verdict is also handed on as it is made, before its unit ends (``on_verdict``): a unit of
50,000 passages shows its progress, and ``judge run`` writes its verdicts as they come. The
hand-off is a context variable set per unit (:func:`told` is where verdicts are made, in
judging/relevance.py), so it reaches every round under ``Judge.averdicts`` (a cascade's band,
listwise fallbacks) without each layer passing it on.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from contextvars import ContextVar
from typing import Any, TypeVar

from judge.calling.limits import Admission, Gate
from judge.calling.retries import CallStats
from judge.judging.dimensions import UnitAspects
from judge.schema import Query, Verdict

__all__ = ["REFUSED_CALLS", "Judged", "Unit", "admitted", "judge_units", "refusal", "told"]

Unit = tuple[Query, int]
T = TypeVar("T")
# One query's judging before its metrics: (query, repeat, verdicts, reranker scores, what its
# dimensions gave: judging/dimensions.py).
Judged = tuple[Query, int, Sequence[Verdict], dict[str, float] | None, UnitAspects | None]
# Refused calls (bad key, model or URL) seen with no success at all before judging stops.
REFUSED_CALLS = 3
# Where the unit being judged hands each verdict as it is made (None: nobody asked).
_SINK: ContextVar[Callable[[Verdict], None] | None] = ContextVar("judge_unit_sink", default=None)


def told(verdict: Verdict) -> None:
    """Hand ``verdict`` (just made) to its unit's ``on_verdict``, when there is one."""
    sink = _SINK.get()
    if sink is not None:
        sink(verdict)


async def admitted(asks: Iterable[Callable[[], Coroutine[Any, Any, T]]], gate: Gate) -> list[T]:
    """Each ask's result, in order, the asks running concurrently as ``gate`` starts them
    (after every ask of the queries admitted before), so a query of many passages holds no
    more of them at once than the gate allows; ``asks`` is read as they start. No
    ask starts after one has failed; the failure is raised as ``asyncio.gather`` would (the
    asks in flight go on and keep their answers), and a cancel cancels the asks made."""
    admission = Admission(iter(asks))
    gate.admit(admission)
    try:
        await admission.all_made
        results = await asyncio.gather(*admission.tasks)
    except asyncio.CancelledError:
        admission.closed = True
        for task in admission.tasks:
            task.cancel()
        raise
    if admission.failure is not None:  # making an ask failed: the others were kept
        raise admission.failure
    return list(results)


def refusal(stats: CallStats, verdicts: Sequence[Verdict]) -> str | None:
    """Why judging should stop when the provider cannot be reached or has refused every
    request so far (None while neither): asking for every other passage would be in vain."""
    if stats.unreachable is not None:
        return stats.unreachable
    if stats.errors["client"] < REFUSED_CALLS or stats.successes != 0:
        return None
    example = next((v.error for v in verdicts if v.error), "")
    return (
        "the provider refuses every request (not retried; check the API key, "
        f"model name and base_url): {example}"
    )


async def judge_units(
    units: Sequence[Unit],
    judge_one: Callable[[Query, int], Awaitable[Judged | None]],
    on_judged: Callable[[int, Judged], Awaitable[None]],
    *,
    workers: int,
    stopped: Callable[[], bool] = lambda: False,
    tasks: list[asyncio.Task[Any]] | None = None,
    on_verdict: Callable[[int, Verdict], None] | None = None,
) -> None:
    """Judge ``units`` with ``judge_one`` (None: nothing to record), handing each result and
    its index in ``units`` to ``on_judged``; no new unit starts once ``stopped()``.
    ``tasks``: filled with the worker tasks, for a signal handler to cancel. ``on_verdict``:
    given each verdict with its unit's index as it is made, before ``on_judged``."""
    todo = iter(enumerate(units))

    async def worker() -> None:
        for index, (query, repeat) in todo:
            if stopped():
                return
            if on_verdict is not None:  # this worker's context: its unit's calls inherit it
                _SINK.set(functools.partial(on_verdict, index))
            judged = await judge_one(query, repeat)
            if judged is not None:
                await on_judged(index, judged)

    running = [asyncio.create_task(worker()) for _ in range(max(1, min(len(units), workers)))]
    if tasks is not None:
        tasks[:] = running
    try:
        await asyncio.gather(*running)
    except BaseException:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        raise
