"""Many queries x repeats: the batch job behind ``judge run``.

Results are appended to ``verdicts.jsonl`` as each (query, engine, repeat) completes, and
every accepted completion is in the cache the moment it arrives, so a killed run resumes
where it stopped and re-pays only the calls that were in flight (DESIGN rule 8). A run
directory remembers the config fingerprint it was made with; resuming it with a config that
changes the answers is refused rather than silently mixing two judges.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TextIO

from judge.cache import Cache
from judge.calls import Caller
from judge.config import RunConfig
from judge.datasets import read_queries, read_results, read_trec_run
from judge.errors import BudgetExceeded, ConfigError, InputError
from judge.judge import Judge
from judge.schema import JudgedQuery, Query, Record

log = logging.getLogger("judge.run")

RESULTS_FILE = "verdicts.jsonl"
RUN_FILE = "run.json"
LOCK_FILE = ".lock"


class RunOutcome(Record):
    out_dir: str
    status: Literal["complete", "incomplete"]
    reason: str | None = None
    planned: int  # (query, engine, repeat) units in this run
    done: int  # of those, finished (including earlier, resumed runs)
    resumed: int  # finished before this invocation started
    requests: int
    cache_hits: int
    retries: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    elapsed_s: float
    errors_by_kind: dict[str, int]


def load_queries(config: RunConfig, dataset: str | None = None) -> list[Query]:
    """The dataset named on the command line, else the config's [dataset]."""
    ds = config.dataset
    if ds.trec_run and dataset is None:
        if not (ds.passage_store and ds.queries):
            raise ConfigError(
                f"{config.source}: [dataset] trec_run needs passage_store and queries"
            )
        trec = read_trec_run(
            ds.trec_run, ds.passage_store, ds.queries, max_passage_chars=ds.max_passage_chars
        )
        return list(trec.queries)
    path = dataset or ds.path
    if path is None:
        raise ConfigError(
            f"{config.source}: no dataset: give one on the command line or [dataset] path"
        )
    report = read_queries(path, columns=ds.columns or None, max_passage_chars=ds.max_passage_chars)
    for problem in report.problems:
        log.warning("%s", problem)
    return list(report.queries)


def sample_queries(queries: Sequence[Query], n: int, seed: int) -> list[Query]:
    """A reproducible sample of n query ids; every engine's row of a sampled id comes along."""
    if n <= 0:
        return list(queries)
    ids = sorted({q.query_id for q in queries})
    if n >= len(ids):
        return list(queries)
    chosen = set(random.Random(seed).sample(ids, n))
    return [q for q in queries if q.query_id in chosen]


def finished_units(results_path: Path) -> set[tuple[str, str, int]]:
    """(query_id, engine, repeat) units a rerun skips: recorded, with no provider ``error``.

    A unit whose last recorded line has an error verdict is judged again (its good answers
    come from the cache); the newer line supersedes the older one.
    """
    if not results_path.exists():
        return set()
    recorded = {jq.key: jq for jq in read_results(results_path)}
    done = {key for key, jq in recorded.items() if all(v.status != "error" for v in jq.verdicts)}
    if len(done) < len(recorded):
        log.info("%d earlier unit(s) with errors will be judged again", len(recorded) - len(done))
    return done


def repair_results(path: Path) -> None:
    """Cut a partial last line left by a killed writer, so appends start on a fresh line."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as fh:
        data = fh.read()
        if data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1
        fh.truncate(cut)
        log.warning(
            "%s: dropped a partial last line (%d bytes) from an interrupted run",
            path,
            len(data) - cut,
        )


def _flatten(value: object, prefix: str = "") -> dict[str, object]:
    if isinstance(value, dict) and value:
        out: dict[str, object] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def describe_changes(old: object, new: object, *, limit: int = 4) -> str:
    """``judge.model 'a' -> 'b'``, for the first ``limit`` dotted keys whose values differ."""
    before, after = _flatten(old or {}), _flatten(new)
    keys = sorted(k for k in {*before, *after} if before.get(k) != after.get(k))

    def show(v: object) -> str:
        text = json.dumps(v, ensure_ascii=False) if v is not None else "unset"
        return text if len(text) <= 40 else text[:37] + "..."

    parts = [f"{k} {show(before.get(k))} -> {show(after.get(k))}" for k in keys[:limit]]
    more = len(keys) - limit
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


def check_fingerprint(out_dir: Path, config: RunConfig, *, fresh: bool) -> None:
    run_file = out_dir / RUN_FILE
    fingerprint = config.fingerprint()
    if fresh:
        for name in (RESULTS_FILE, RUN_FILE):
            (out_dir / name).unlink(missing_ok=True)
    elif run_file.exists():
        old = json.loads(run_file.read_text(encoding="utf-8")).get("fingerprint")
        if old != fingerprint:
            raise ConfigError(
                f"{out_dir}: this run directory was made with a different config "
                f"(changed: {describe_changes(old, fingerprint)}); "
                "use --fresh to start over or another --out"
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    run_file.write_text(
        json.dumps(
            {"fingerprint": fingerprint, "source": config.source}, indent=2, ensure_ascii=False
        ),
        encoding="utf-8",
    )


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
        if self._task.done():  # the writer failed (disk full, ...): say so now
            self._task.result()
        self._pending.append(jq.model_dump_json().encode("utf-8") + b"\n")
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


@dataclass
class Progress:
    """Counters shown on a TTY as one refreshed line, elsewhere as periodic log lines."""

    total_units: int
    total_passages: int
    caller: Caller
    stream: TextIO = sys.stderr
    interval_s: float = 10.0
    units: int = 0
    passages: int = 0
    status: Counter[str] = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)
    _last: float = 0.0
    _logged: str = ""

    def update(self, jq: JudgedQuery) -> None:
        self.units += 1
        self.passages += len(jq.verdicts)
        self.status.update(v.status for v in jq.verdicts)
        self.show()

    def line(self) -> str:
        s = self.caller.stats
        elapsed = time.monotonic() - self.started
        rate = self.passages / elapsed if elapsed > 0 else 0.0
        return (
            f"queries {self.units}/{self.total_units}"
            f"  passages {self.passages}/{self.total_passages}"
            f"  ({rate:.1f}/s)  cached {s.cache_hits}  retries {s.retries}"
            f"  unparsed {self.status['unparsed']}  errors {self.status['error']}"
            f"  tokens {s.usage.total}  ${s.cost:.4f}"
        )

    def show(self, final: bool = False) -> None:
        now = time.monotonic()
        tty = self.stream.isatty()
        if tty and (final or now - self._last >= 0.2):
            self.stream.write("\r" + self.line() + ("\n" if final else ""))
            self.stream.flush()
            self._last = now
        elif not tty and (final or now - self._last >= self.interval_s):
            line = self.line()
            if line != self._logged:  # the final line may just have been logged
                log.info("%s", line)
                self._logged = line
            self._last = now


async def run_async(
    config: RunConfig,
    queries: Sequence[Query],
    out_dir: Path,
    *,
    fresh: bool = False,
) -> RunOutcome:
    """Judge every (query, repeat) not already in out_dir's results; append as they finish.

    A unit whose recorded verdicts include a provider ``error`` is judged again on resume
    (its good answers come from the cache); the newer line supersedes the older one.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    with run_lock(out_dir):
        return await _run_locked(config, queries, out_dir, fresh=fresh)


@contextlib.contextmanager
def run_lock(out_dir: Path) -> Iterator[None]:
    """One ``judge run`` at a time per run directory (two would interleave their results)."""
    with open(out_dir / LOCK_FILE, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"{out_dir}: another judge run is writing to this directory; "
                "wait for it or use another --out"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


async def _run_locked(
    config: RunConfig, queries: Sequence[Query], out_dir: Path, *, fresh: bool
) -> RunOutcome:
    check_fingerprint(out_dir, config, fresh=fresh)
    results_path = out_dir / RESULTS_FILE
    repair_results(results_path)
    done = finished_units(results_path)
    units = [
        (q, r)
        for r in range(config.run.repeats)
        for q in queries
        if (q.query_id, q.engine, r) not in done
    ]
    planned = len(queries) * config.run.repeats
    resumed = planned - len(units)
    cache = Cache(config.cache_path())
    judge = Judge.from_config(config, cache=cache, limits=config.limits())
    caller = judge.caller
    progress = Progress(
        total_units=len(units),
        total_passages=sum(len(q.passages) for q, _ in units),
        caller=caller,
        interval_s=config.run.progress_interval_s,
    )
    start = time.monotonic()
    reason: str | None = None
    queue: asyncio.Queue[tuple[Query, int]] = asyncio.Queue()
    for unit in units:
        queue.put_nowait(unit)
    stop = asyncio.Event()

    async def worker() -> None:
        nonlocal reason
        while not stop.is_set():
            try:
                query, repeat = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            try:
                jq = await judge.ajudge(query, repeat=repeat)
            except BudgetExceeded as exc:
                reason = reason or str(exc)
                stop.set()
                return
            writer.add(jq)
            progress.update(jq)
            finished = progress.passages
            errors = progress.status["error"]
            stats = caller.stats
            if stats.errors["client"] >= 3 and stats.successes == 0:
                # A bad key, model name or endpoint: every call is refused, none retried.
                example = next((v.error for v in jq.verdicts if v.error), "")
                reason = reason or (
                    "the provider refuses every request (not retried; check the API key, "
                    f"model name and base_url): {example}"
                )
                stop.set()
            elif finished >= 20 and errors / finished > config.run.abort_error_rate:
                reason = reason or (
                    f"too many errors: {errors} of {finished} passages failed "
                    f"(abort_error_rate {config.run.abort_error_rate}); see verdicts.jsonl"
                )
                stop.set()

    n_workers = max(1, min(len(units), config.run.concurrency * 2))
    out_dir.mkdir(parents=True, exist_ok=True)
    writer = ResultsWriter(results_path)
    tasks = [asyncio.create_task(worker()) for _ in range(n_workers)]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        # A failure (or Ctrl-C) in one worker stops the others before the clients close.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    finally:
        try:
            await writer.aclose()
        finally:
            if units:
                progress.show(final=True)
            await judge.aclose()
            cache.close()
    s = caller.stats
    finished_now = progress.units
    return RunOutcome(
        out_dir=str(out_dir),
        status="complete" if reason is None and finished_now == len(units) else "incomplete",
        reason=reason,
        planned=planned,
        done=resumed + finished_now,
        resumed=resumed,
        requests=s.requests,
        cache_hits=s.cache_hits,
        retries=s.retries,
        prompt_tokens=s.usage.prompt_tokens,
        completion_tokens=s.usage.completion_tokens,
        cost_usd=s.cost,
        elapsed_s=time.monotonic() - start,
        errors_by_kind=dict(s.errors),
    )


def latest_results(out_dir: Path) -> list[JudgedQuery]:
    """The run's results, one per (query, engine, repeat) (the last written wins)."""
    path = out_dir / RESULTS_FILE
    if not path.exists():
        raise InputError("no results yet", file=str(path))
    by_key = {jq.key: jq for jq in read_results(path)}
    return sorted(by_key.values(), key=lambda jq: (jq.query.query_id, jq.query.engine, jq.repeat))
