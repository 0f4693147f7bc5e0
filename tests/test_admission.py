"""The gate a query's asks pass (judging/units.py ``admitted``, calling/limits.py ``Gate``):
at most its permits run at once, every ask of an earlier query starts before any of a later
one's, results come in order, and a failure stops that query's next asks without losing those
in flight."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

from judge.calling.limits import Gate
from judge.judging.units import admitted


class Log:
    def __init__(self) -> None:
        self.started: list[str] = []
        self.running = 0
        self.most = 0

    def ask(self, name: str, fail: bool = False) -> Callable[[], Coroutine[Any, Any, str]]:
        async def run() -> str:
            self.started.append(name)
            self.running += 1
            self.most = max(self.most, self.running)
            await asyncio.sleep(0.01)
            self.running -= 1
            if fail:
                raise ValueError(f"{name} failed")
            return name

        return run


def test_asks_start_by_query_within_the_permits_and_end_in_order() -> None:
    """c holds both permits; a then b wait: every ask of a starts before any of b's, though
    b's first could have taken the permit a's second was waiting for."""
    log = Log()

    async def main() -> list[list[str]]:
        gate = Gate(2)
        held = asyncio.ensure_future(admitted([log.ask("c0"), log.ask("c1")], gate))
        await asyncio.sleep(0)
        earlier = asyncio.ensure_future(admitted([log.ask(f"a{i}") for i in range(3)], gate))
        await asyncio.sleep(0)
        later = asyncio.ensure_future(admitted([log.ask(f"b{i}") for i in range(3)], gate))
        return list(await asyncio.gather(held, earlier, later))

    got_c, got_a, got_b = asyncio.run(main())
    assert got_a == ["a0", "a1", "a2"] and got_b == ["b0", "b1", "b2"] and got_c == ["c0", "c1"]
    assert log.most == 2
    assert log.started == ["c0", "c1", "a0", "a1", "a2", "b0", "b1", "b2"]


def test_a_failed_ask_stops_its_querys_next_asks_and_is_raised() -> None:
    log = Log()

    async def main() -> None:
        asks = [log.ask("x0", fail=True), log.ask("x1"), log.ask("x2")]
        await admitted(asks, Gate(1))

    with pytest.raises(ValueError, match="x0 failed"):
        asyncio.run(main())
    assert log.started == ["x0"]


def test_a_failure_making_an_ask_keeps_the_asks_in_flight() -> None:
    log = Log()
    finished: list[str] = []

    def asks() -> Iterator[Callable[[], Coroutine[Any, Any, str]]]:
        for i in range(3):
            if i == 2:
                raise KeyError("no title")
            yield log.ask(f"y{i}")

    async def main() -> None:
        try:
            await admitted(asks(), Gate(4))
        finally:
            finished.extend(log.started)
            assert log.running == 0  # the two made were awaited, not dropped

    with pytest.raises(KeyError, match="no title"):
        asyncio.run(main())
    assert finished == ["y0", "y1"]


def test_an_ask_the_gate_starts_runs_in_its_own_querys_context() -> None:
    """The gate starts the next ask when another query's ask ends; it must still see its own
    query's context (the unit's verdict sink, judging/units.py ``told``)."""
    whose: contextvars.ContextVar[str] = contextvars.ContextVar("whose", default="none")
    seen: list[tuple[str, str]] = []

    def ask(name: str) -> Callable[[], Coroutine[Any, Any, str]]:
        async def run() -> str:
            await asyncio.sleep(0.005)
            seen.append((name, whose.get()))
            return name

        return run

    async def query(name: str, gate: Gate) -> list[str]:
        whose.set(name)
        return await admitted([ask(f"{name}{i}") for i in range(3)], gate)

    async def main() -> None:
        gate = Gate(1)
        await asyncio.gather(query("a", gate), query("b", gate))

    asyncio.run(main())
    assert len(seen) == 6 and all(name[0] == owner for name, owner in seen)
