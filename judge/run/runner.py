"""Many queries x repeats: the batch job behind ``judge run``.

Results are appended to ``verdicts.jsonl`` as each (query, engine, repeat) completes, and
every accepted completion is in the cache the moment it arrives, so a killed run resumes
where it stopped and re-pays only the calls that were in flight (DESIGN rule 8). A run
directory remembers the config fingerprint it was made with; resuming it with a config that
changes the answers is refused rather than silently mixing two judges (see :mod:`.resume`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from judge.calling.cache import Cache, open_cache
from judge.calling.caller import Caller
from judge.calling.limits import Limits
from judge.calling.telemetry import spans
from judge.config import RunConfig
from judge.data.results import (
    RESULTS_FILE,
    UnitKey,
    compact_results,
    input_digest,
    latest_rows,
)
from judge.errors import (
    BudgetExceeded,
    CacheError,
    ConfigError,
    InputError,
    ProviderError,
    TemplateError,
)
from judge.judging.cascade import Band
from judge.judging.dimensions import unit_statuses_of
from judge.judging.judge import Judge
from judge.judging.units import Judged, judge_units, refusal
from judge.run.progress import Progress
from judge.run.resume import (
    PARTIAL_FILE,
    RUN_FILE,
    Redo,
    add_elapsed,
    batched_before,
    check_fingerprint,
    partial_line,
    partial_units,
    record_spent,
    repair_results,
    run_lock,
    settle_partial,
    spent_before,
)
from judge.run.resume import (
    recorded as recorded_units,
)
from judge.run.writer import ResultsWriter
from judge.schema import JudgedQuery, Query, Record, Usage, Verdict

log = logging.getLogger(__name__)

# Finished units wait for their metrics until this many are ready or this long has passed.
FLUSH_UNITS, FLUSH_S = 256, 0.05
# Passages finished before abort_error_rate is applied (a few early errors are not a trend).
MIN_FOR_ERROR_RATE = 20


# How often the runner keeps its spend in run.json as it goes (a budget caps the run's).
LEDGER_EVERY_S = 5.0
StopKind = Literal["budget", "interrupted", "errors", "refused", "template"]


class RunOutcome(Record):
    out_dir: str
    status: Literal["complete", "incomplete"]
    reason: str | None = None
    # Why an incomplete run stopped: the budget (its own exit code), a signal, provider
    # errors (too many, or units left in error), a provider refusing every request, or the
    # prompt template failing on a query's data (bad input: exit 2).
    stopped_by: StopKind | None = None
    planned: int  # (query, engine, repeat) units in this run
    done: int  # of those, finished (including earlier, resumed runs)
    resumed: int  # finished before this invocation started
    requests: int
    cache_hits: int
    retries: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    # Wall seconds judging this run directory took, summed over every invocation (a resumed
    # run counts its earlier ones too; an invocation killed outright is not counted).
    elapsed_s: float
    errors_by_kind: dict[str, int]
    # Requests counted at their worst case, their usage not reported (lost in flight, an
    # unreadable answer, counts that are not counts): the tokens and cost are at most these.
    worst_counted: int = 0
    # Passages a listwise judge asked one by one (their list's answers did not judge them).
    asked_alone: int = 0
    # The band of reranker scores a [judge.cascade] run sent to the LLM judge (None: no cascade,
    # or it stopped before the band was known).
    cascade_band: Band | None = None


async def run_async(
    config: RunConfig,
    queries: Sequence[Query],
    out_dir: Path,
    *,
    fresh: bool = False,
    redo: Redo = frozenset(),
    cache: Cache | None = None,
    keep: list[JudgedQuery] | None = None,
    ledger: bool = True,
) -> RunOutcome:
    """Judge every (query, repeat) not already in out_dir's results; append as they finish.

    ``keep``: when given and the results file held nothing before, it receives every row the
    file holds afterwards (as :func:`judge.data.results.load_results` would read them).

    A unit whose recorded verdicts include a provider ``error`` is judged again on resume,
    and one with ``unparsed`` verdicts when ``redo`` says so (its good answers come from the
    cache); at the end the results file holds exactly one line per unit. ``cache``: used (and
    closed) instead of the config's, as a Ray shard's own cache is (judge/run/shards.py).
    ``ledger``: the budget caps the run, earlier invocations' spend (run.json) included.
    """
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{out_dir}: cannot create the run directory: {exc.strerror}") from None
    start = time.monotonic()
    with run_lock(out_dir), _fewer_collections():
        check_fingerprint(out_dir, config, fresh=fresh)
        results_path = out_dir / RESULTS_FILE
        repair_results(results_path)
        recorded, lines, done = recorded_units(results_path, queries, redo)
        units = _to_judge(queries, config.run.repeats, done)
        planned = len(queries) * config.run.repeats
        batch = _Batch(
            config, units, results_path, queries, cache, keeping=keep is not None, ledger=ledger
        )
        # Unparsed answers are kept in the cache (paid): --redo unparsed asks them anew.
        batch.caller.fresh_unparsed = "unparsed" in redo
        try:
            with _signals_stop(batch), spans().run(config, batch):
                await batch.run()
                latest = recorded | batch.written
                failed = sum(1 for statuses in latest.values() if "error" in statuses)
                if failed and batch.reason is None:  # said on the run's span too
                    example = f" (for example: {batch.first_error})" if batch.first_error else ""
                    batch.stop(
                        f"{failed} of {len(latest)} query-repeats have passages that ended in "
                        f"provider errors{example}; rerun to ask them again",
                        "errors",
                    )
            settle_partial(out_dir, batch.partial - latest.keys())  # unfinished units' stay
            if keep is not None and not lines:
                keep.extend(latest_rows(batch.kept))
            if lines > len(recorded) or recorded.keys() & batch.written.keys():
                compact_results(results_path)  # one line per unit: drop the superseded ones
        finally:
            batch.keep_ledger()
            elapsed = add_elapsed(out_dir, time.monotonic() - start)
        return batch.outcome(out_dir, planned, planned - len(units), elapsed)


def _to_judge(
    queries: Sequence[Query], repeats: int, done: Collection[UnitKey]
) -> list[tuple[Query, int]]:
    """Each (query, repeat) not ``done``, repeat by repeat."""
    return [
        (q, r) for r in range(repeats) for q in queries if (q.query_id, q.engine, r) not in done
    ]


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """Python's cyclic collector less often while a run lasts: its default (a pass every 700
    allocations) walks the run's many live records again and again, a fifth of a fast run's
    time; cycles are rare here. The process's own setting is restored afterwards."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], 50_000), max(before[1], 20), max(before[2], 100))
    try:
        yield
    finally:
        gc.set_threshold(*before)


SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Signals that came before the run's own handlers were installed (see signals_held).
_EARLY: list[signal.Signals] = []


@contextlib.contextmanager
def signals_held(hold: bool = True) -> Iterator[list[signal.Signals]]:
    """Record SIGINT, SIGTERM and SIGHUP from here until a run installs its handlers
    (:func:`_signals_stop`), which then stops as for a signal that came after: asyncio.run's
    own SIGINT handler cancelled the main task, a cancel start-up swallowed, and the whole
    run was then paid for and ended "ok". ``hold`` False: nothing is held (a batch or Ray
    run, whose Ctrl-C asyncio.run's cancel serves). Yields a list that, once the block ends,
    holds what was recorded and never taken up: the caller ends interrupted for those."""
    _EARLY.clear()
    unheard: list[signal.Signals] = []
    if not hold or threading.current_thread() is not threading.main_thread():
        yield unheard  # not asked to, or signals are not ours (not the main thread)
        return
    held = {
        sig: signal.signal(sig, lambda n, _f: _EARLY.append(signal.Signals(n))) for sig in SIGNALS
    }
    try:
        yield unheard
    finally:
        for sig, previous in held.items():
            signal.signal(sig, previous)
        unheard.extend(_EARLY)  # what no run's handlers took up
        _EARLY.clear()


@contextlib.contextmanager
def _signals_stop(batch: _Batch) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP stop the run gracefully: no new unit starts, units in
    flight get ``[run] grace_s`` to finish, then are cancelled; a second signal cancels at
    once. The run then ends as usual (results kept, summary written, marked incomplete)."""
    loop = asyncio.get_running_loop()
    signals = SIGNALS

    def on_signal(sig: signal.Signals) -> None:
        if batch.stopped.is_set() and batch.stopped_by == "interrupted":
            batch.cancel()
            return
        log.warning("%s: finishing the calls in flight (up to %gs)", sig.name, batch.grace_s)
        batch.stop(f"interrupted by {sig.name}", "interrupted")
        # No new request leaves, for any unit: units in flight end with their unsent passages
        # as provider errors, which a rerun asks again (their answers so far are cached).
        batch.judge.caller.stopping = f"interrupted by {sig.name}"
        loop.call_later(batch.grace_s, batch.cancel)

    installed = []
    for sig in signals:
        try:
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread: the caller handles signals
    if installed:
        early, _EARLY[:] = list(_EARLY), []
        for sig in early[:2]:  # one early signal stops; a second cancels, as later ones do
            on_signal(sig)
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def cache_advice(failure: str) -> str:
    """Why the run stopped on a cache it could not write, and what to do about it."""
    text = failure.lower()
    if "locked" in text or "busy" in text:
        return (
            f"{failure}: another process holds the cache file (another run?); let it finish, "
            "or give this run a cache of its own (--cache), then rerun"
        )
    if "full" in text or "space" in text:
        return f"{failure}: the disk is full; free some space, then rerun"
    return f"{failure}: fix the cache or give this run another (--cache), then rerun"


@dataclass
class _Batch:
    """The units of one invocation, judged by workers that stop together on the first reason."""

    config: RunConfig
    units: list[tuple[Query, int]]
    results_path: Path
    # Every query of the run, finished or not: a cascade band from the run's scores uses all.
    queries: Sequence[Query]
    given_cache: Cache | None = None  # instead of the config's (run_async's ``cache``)
    keeping: bool = False  # keep every row written in ``kept`` (run_async's ``keep``)
    ledger: bool = True  # keep the spend in run.json as it goes (run_async's ``ledger``)
    reason: str | None = None
    stopped_by: StopKind | None = None
    first_error: str | None = None  # a verdict's error in the provider's words, if any

    def __post_init__(self) -> None:
        self.cache = self.given_cache or open_cache(self.config)
        # What each unit is judged from, recorded with its row (a rerun compares it).
        self.inputs = {q.key: input_digest(q) for q in {q.key: q for q, _ in self.units}.values()}
        self.judge = Judge.from_config(
            self.config, cache=self.cache, limits=Limits.from_config(self.config)
        )
        # What the dimensions are given (a [nuggets] path, the run's own sets), read before
        # any call.
        if self.judge.dimensions is not None:
            self.judge.dimensions.load(self.queries, self.results_path.parent)
        if self.ledger:  # the cap is the run's (a Ray shard's, a batch run's: the driver's)
            out_dir, price = self.results_path.parent, self.caller.limits.price
            batched = batched_before(out_dir)  # at batch prices
            batched_cost = price.batch().cost(batched) if price is not None else 0.0
            self.caller.budget.count_earlier(
                *spent_before(out_dir), elsewhere=batched, elsewhere_cost=batched_cost
            )
            self.caller.budget.on_bound = self._keep_bound
        self.progress = Progress(
            total_units=len(self.units),
            total_passages=sum(len(q.passages) for q, _ in self.units),
            caller=self.judge.caller,
            interval_s=self.config.run.progress_interval_s,
        )
        self.stopped = asyncio.Event()
        self.grace_s = self.config.run.grace_s
        self.tasks: list[asyncio.Task[Any]] = []
        # Each unit written by this invocation and its verdicts' statuses.
        self.written: dict[UnitKey, frozenset[str]] = {}
        # Units with verdicts in the partial file: an earlier invocation's, and this one's.
        self.partial = partial_units(self.results_path.parent)
        self._ready: list[Judged] = []  # judged, waiting for their metrics (_flush)
        self._flushed = time.monotonic()
        self.kept: list[JudgedQuery] = []

    async def run(self) -> None:
        """Workers pull units (judging/units.py) until none is left or a stop reason is set."""
        self.writer = ResultsWriter(self.results_path)
        self.partial_writer = ResultsWriter(self.results_path.parent / PARTIAL_FILE)
        ticker = asyncio.create_task(self._tick())
        try:
            if self.units and not await self._prepare():
                return
            await judge_units(
                self.units,
                self._judge_one,
                self._judged,
                workers=self.config.run.concurrency * 2,
                stopped=self.stopped.is_set,
                tasks=self.tasks,
                on_verdict=self._told,
            )
        except asyncio.CancelledError:
            if self.stopped_by != "interrupted" or _cancelling():
                raise
            # The grace period ran out: the cancelled units stay unfinished (resumable).
        finally:
            ticker.cancel()
            try:
                self._flush()
                await self.writer.aclose()
                await self.partial_writer.aclose()
            finally:
                if self.units:
                    self.progress.show(final=True)
                await self.judge.aclose()
                self.cache.close()

    async def _tick(self) -> None:
        """The progress line at its interval even while no verdict comes (calls hanging), and
        the spend ledger every few seconds (a killed run's is then near what it spent)."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(min(1.0, self.progress.interval_s))
            self.progress.show()
            if time.monotonic() - last >= LEDGER_EVERY_S:
                self.keep_ledger()
                last = time.monotonic()

    def _told(self, index: int, verdict: Verdict) -> None:
        """A verdict of an unfinished unit, as it is made: counted, and written to the partial
        file when it was paid for (a cached one is in the cache, an error holds no answer)."""
        query, repeat = self.units[index]
        key = (query.query_id, query.engine, repeat)
        self.progress.told(key, verdict)
        if (failure := self.caller.cache_failure) is not None and not self.stopped.is_set():
            self.stop(cache_advice(failure), "errors")  # nothing more is sent; this one stands
        if not verdict.cached and verdict.status != "error":
            self.partial_writer.add_line(partial_line(key, verdict))
            self.partial.add(key)
        elif verdict.status == "error":
            self.first_error = self.first_error or verdict.error
            if not self.stopped.is_set():
                self._check_errors(verdict.error or "")  # as it fails, not when its unit ends

    async def _prepare(self) -> bool:
        """What the units need first (judging/judge.py ``Judge.prepare``: a cascade's band from
        the run's reranker scores, every query's nugget set, written to the run directory);
        False when the run stopped instead."""
        labels, run_dir = self.config.label_scale(), self.results_path.parent
        prepare = asyncio.create_task(self.judge.prepare(self.queries, labels, run_dir))
        self.tasks[:] = [prepare]  # a signal's cancel() reaches it too
        try:
            await prepare
        except BudgetExceeded as exc:
            self.stop(str(exc), "budget")
            return False
        except ProviderError as exc:
            self.stop(f"the reranker failed while setting the cascade band: {exc}", "errors")
            return False
        return True

    def keep_ledger(self) -> None:
        """What the run may have spent so far (what it did, and the worst case of the requests
        in flight: all of it once they settle), in run.json (with ``ledger``); a failure is
        said, not raised: the run goes on (or ends as it was ending), and a rerun counts
        less."""
        if self.ledger:
            self.caller.budget.tell_bound()  # to _keep_bound, the budget's on_bound

    def _keep_bound(self, bound: Usage) -> None:
        """Keep ``bound`` as what the run spent (the budget tells it before a request that
        takes it a step past the last it told: a run killed outright resumes under it)."""
        out_dir = self.results_path.parent
        budget = self.caller.budget
        # At most: requests in flight at their worst case, or answers counted so (usage that
        # was not a count, a request given up), here or in an earlier invocation.
        at_most = (
            bound != budget.usage or budget.earlier_at_most or self.caller.stats.worst_counted > 0
        )
        try:
            record_spent(out_dir, bound, at_most=at_most)
        except OSError as exc:
            log.warning("%s: cannot keep what the run spent: %s", out_dir / RUN_FILE, exc.strerror)

    @property
    def caller(self) -> Caller:
        return self.judge.caller

    def stop(self, reason: str, kind: StopKind) -> None:
        if self.reason is None:
            self.reason, self.stopped_by = reason, kind
        self.stopped.set()
        if kind in ("errors", "refused") and self.caller.stopping is None:
            # A provider failing this much would fail what is in flight too: no request
            # leaves after the decision, not a retry nor a unit's next passage (90 passages
            # were still sent three times each after "21 of 21 failed").
            self.caller.stopping = reason

    def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()

    async def _judge_one(self, query: Query, repeat: int) -> Judged | None:
        with spans().query(query, repeat) as span:
            try:
                judged = await self.judge.averdicts(query, repeat)
            except BudgetExceeded as exc:
                self.stop(str(exc), "budget")
                return None
            except CacheError as exc:  # a full disk, say: stop as a signal does, keep the rest
                self.stop(cache_advice(str(exc)), "errors")
                return None
            except (TemplateError, InputError) as exc:
                # Found only on this query's data (a field a template reads is missing, no
                # room for a passage beside the query): no new unit starts, and those in
                # flight end and are kept, paid for once.
                where = query.source or f"query '{query.query_id}'"
                said = f"{where}: query '{query.query_id}' ({query.engine}): {exc}"
                self.stop(str(exc) if isinstance(exc, InputError) else said, "template")
                return None
            except ProviderError as exc:
                # The LLM's failures are the verdicts' own (status "error"); what escapes is
                # the side reranker's ([rerank]), after its retries: stop as for errors.
                what = f"query '{query.query_id}' ({query.engine})"
                self.stop(f"the reranker failed on {what}: {exc}", "errors")
                return None
            span.judged(judged[2])
            return judged

    async def _judged(self, _index: int, judged: Judged) -> None:
        # Units finishing together (a cached run: thousands a second) get their metrics in
        # one pass (per unit, its fixed cost is most of a cached run); alone or failed: now.
        self._ready.append(judged)
        await asyncio.sleep(0)
        if self._due() or any(v.status == "error" for v in judged[2]):
            self._flush()

    def _due(self) -> bool:
        return len(self._ready) >= FLUSH_UNITS or time.monotonic() - self._flushed >= FLUSH_S

    def _flush(self) -> None:
        """The ready units' metrics (in one pass), then each is written, counted and checked."""
        ready, self._ready = self._ready, []
        self._flushed = time.monotonic()
        for jq in self.judge.finish_many(ready) if ready else ():
            jq = jq.model_copy(update={"input_digest": self.inputs[jq.query.key]})
            self.writer.add(jq)  # written whole (the line is made here) before it is slimmed
            if self.keeping:
                self.kept.append(_slimmed(jq))
            self.written[jq.key] = unit_statuses_of(jq)
            self.progress.update(jq)
            self._check_health(jq)

    def _check_health(self, jq: JudgedQuery) -> None:
        """Stop when every call is refused, or when too many passages end in errors."""
        if (why := refusal(self.judge.caller.stats, jq.verdicts)) is not None:
            self.stop(why, "refused")
        else:
            self._check_errors(next((v.error for v in jq.verdicts if v.error), ""))

    def _check_errors(self, example: str) -> None:
        """Stop when more than abort_error_rate of the passages so far ended in errors."""
        finished = self.progress.passages
        errors = self.progress.status["error"]
        rate = self.config.run.abort_error_rate
        if finished >= MIN_FOR_ERROR_RATE and errors / finished > rate:
            kinds = self.judge.caller.stats.errors
            kind = max(kinds, key=lambda k: kinds[k]) if kinds else "unknown"
            self.stop(
                f"too many errors: {errors} of {finished} passages failed "
                f"(abort_error_rate {rate}), mostly {kind}; for example: {example}",
                "errors",
            )

    def outcome(self, out_dir: Path, planned: int, resumed: int, elapsed_s: float) -> RunOutcome:
        caller = self.judge.caller
        s, spent = caller.stats, caller.budget
        finished_now = self.progress.units
        complete = self.reason is None and finished_now == len(self.units)
        reason = self.reason
        if self.stopped_by == "budget" and spent.reached_by is not None:
            # What was spent in the end, not when it was hit (at most, where some requests'
            # usage is their worst case).
            reason = spent.spent_message(s.worst_counted)
        return RunOutcome(
            out_dir=str(out_dir),
            status="complete" if complete else "incomplete",
            reason=reason,
            stopped_by=self.stopped_by,
            planned=planned,
            done=resumed + finished_now,
            resumed=resumed,
            requests=s.requests,
            cache_hits=s.cache_hits,
            retries=s.retries,
            prompt_tokens=spent.this_run.prompt_tokens,
            completion_tokens=spent.this_run.completion_tokens,
            cost_usd=spent.this_run_cost,
            elapsed_s=elapsed_s,
            errors_by_kind=dict(s.errors),
            worst_counted=s.worst_counted,
            asked_alone=s.asked_alone,
            cascade_band=self.judge.cascade.band if self.judge.cascade else None,
        )


def _slimmed(jq: JudgedQuery) -> JudgedQuery:
    """``jq`` as the summary holds it until the reports are written: an ok verdict with a
    reason drops its raw answer, which the summary and reports read only for a verdict
    without one (report/queries.py) and the results file keeps (an LLM's answer repeats
    the reason the verdict holds)."""
    for v in jq.verdicts:
        if v.raw is not None and v.status == "ok" and v.reason:
            object.__setattr__(v, "raw", None)  # frozen: this row is the summary's alone
    return jq


def _cancelling() -> bool:
    """Whether the task running the batch was itself cancelled (not just its workers)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
