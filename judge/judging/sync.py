"""The sync edge of the Python API: coroutines run on an event loop the Judge owns.

A :class:`Judge`'s HTTP clients, limits and in-flight table belong to the loop they were first
used on, and the embedded judge's llama.cpp server dies with the thread that started it (it
asks the kernel for PR_SET_PDEATHSIG). So every sync call runs its coroutine on one private
loop, in one long-lived thread of its own, while the caller waits: the same from a plain
script and from inside a running loop (a Jupyter cell), whose loop is never patched or
re-entered (no nest_asyncio). The async methods run there too (:meth:`OwnLoop.call`),
awaited from the caller's loop, so sync and async calls mix on one Judge in any order. The
loop thread is a daemon, so a script that never closes its Judge still exits (the embedded
server's atexit hook stops that server).

The coroutine runs in a copy of the caller's context variables: in Jupyter they say which cell
is running, so what the coroutine prints (a progress bar, a warning) lands in that cell.
Ctrl-C in a script, or "interrupt kernel" in Jupyter, cancels the interrupted call's work on
the private loop (its task and every task started under it, found by a context variable the
loop's task factory reads) and waits for it to wind down before the KeyboardInterrupt goes on:
nothing of it is left running, and paid for, in the background, and a call another thread
made on the same Judge goes on.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import weakref
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

__all__ = ["OwnLoop"]

T = TypeVar("T")


Family = weakref.WeakSet["asyncio.Task[Any]"]

# The tasks of one sync call: its own and those started under it (in its context, or in a
# copy of it). Read by the loop's task factory when a task is created.
_CALL: contextvars.ContextVar[Family | None] = contextvars.ContextVar("judge_call", default=None)


def _task_factory(
    loop: asyncio.AbstractEventLoop,
    coro: Coroutine[Any, Any, Any] | Generator[Any, None, Any],
    **kwargs: Any,
) -> asyncio.Task[Any]:
    task = asyncio.Task(coro, loop=loop, **kwargs)
    # The task's own context when one is given (a gate starts a query's next ask in that
    # query's context, from whichever call's task freed the slot), else its creator's.
    context = kwargs.get("context")
    family = context.get(_CALL) if context is not None else _CALL.get()
    if family is not None:
        family.add(task)
    return task


async def _in_family(coro: Coroutine[Any, Any, T], family: Family) -> T:
    """Run ``coro`` as a member of ``family``, and every task it starts with it."""
    me = asyncio.current_task()
    assert me is not None
    family.add(me)
    _CALL.set(family)  # this task's own context: what it starts inherits it
    return await coro


async def _settle(tasks: Family | None = None) -> None:
    """Cancel ``tasks`` (None: every other task on this loop) and wait until they have ended."""
    me = asyncio.current_task()
    others = [t for t in (asyncio.all_tasks() if tasks is None else list(tasks)) if t is not me]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


async def _shutdown() -> None:
    await _settle()
    loop = asyncio.get_running_loop()
    await loop.shutdown_asyncgens()
    await loop.shutdown_default_executor()


class OwnLoop:
    """One private event loop in a thread of its own, started on first use, until close()."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Two threads' first calls at once made two loops: each call's HTTP clients and
        # limits then belonged to the other's loop, and both waited forever.
        self._lock = threading.Lock()

    @property
    def started(self) -> bool:
        return self._loop is not None

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                loop.set_task_factory(_task_factory)
                thread = threading.Thread(target=loop.run_forever, name="judge-loop", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the private loop and wait for its result."""
        loop = self._started()
        family: Family = weakref.WeakSet()
        # The task is created in a copy of this thread's context (call_soon_threadsafe copies it).
        future = asyncio.run_coroutine_threadsafe(_in_family(coro, family), loop)
        try:
            return future.result()
        except KeyboardInterrupt:  # this call's tasks only: another thread's call goes on
            asyncio.run_coroutine_threadsafe(_settle(family), loop).result()
            raise

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` run on the private loop, from whatever loop is running (on the
        private loop itself: directly). A cancelled caller cancels it there too."""
        loop = self._started()
        if asyncio.get_running_loop() is loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))

    def on_it(self) -> bool:
        """Whether the caller runs on the private loop itself."""
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def close(self) -> None:
        """Cancel what is left on the loop, stop its thread and close it."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(_shutdown(), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
