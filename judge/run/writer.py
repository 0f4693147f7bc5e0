"""The results writer: judged queries appended to verdicts.jsonl (and a unit's verdicts to
verdicts.partial.jsonl as they come), fsynced, in group commits."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from judge.schema import JudgedQuery


class ResultsWriter:
    """Appends judged queries to the results file, fsynced, without stalling the event loop.

    One task writes; lines that arrive while a write + fsync is under way go out together in
    the next one (group commit), and the fsync runs in a worker thread. A killed run loses at
    most the lines of the batch being written, whose answers are already in the cache.
    Open it after :func:`repair_results`, so the file ends on a line boundary.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh = open(path, "ab")  # noqa: SIM115 -- closed by aclose()
        self._pending: list[bytes] = []
        self._wake = asyncio.Event()
        self._closing = False
        self._task = asyncio.create_task(self._drain())

    def add(self, jq: JudgedQuery) -> None:
        self.add_line(jq.model_dump_json().encode("utf-8") + b"\n")

    def add_line(self, line: bytes) -> None:
        """Append ``line`` (one JSON object and its newline) in the next group commit."""
        if self._task.done():  # the writer failed (disk full, ...): say so now
            self._task.result()
        self._pending.append(line)
        self._wake.set()

    async def _drain(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, []
            if batch:
                await asyncio.to_thread(self._write, b"".join(batch))
            if self._closing and not self._pending:
                return

    def _write(self, data: bytes) -> None:
        self._fh.write(data)
        self._fh.flush()
        os.fsync(self._fh.fileno())

    async def aclose(self) -> None:
        """Write what is pending and close the file."""
        self._closing = True
        self._wake.set()
        try:
            await asyncio.shield(self._task)
        finally:
            self._fh.close()
