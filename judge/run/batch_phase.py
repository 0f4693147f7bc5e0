"""The batches of one ``judge run --batch`` invocation (see judge/run/batch.py): planned,
recorded, submitted, polled, read into the cache and followed up.

Every step that leaves something behind at the provider is recorded in ``batch.json``
(judge/run/batch_state.py) before the next step starts, so a rerun picks a batch up where the
last invocation left it and never submits it twice.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from judge.calling.batch import (
    BatchBudget,
    keep_unread,
    managed,
    store_answer,
    within,
    worst_of,
)
from judge.calling.cache import Cache
from judge.calling.caller import Caller
from judge.calling.retries import CallStats
from judge.config import RunConfig
from judge.errors import BatchGone, BatchPending, BudgetExceeded, ProviderError
from judge.judging.judge import Judge
from judge.judging.verdicts import reask_messages
from judge.providers import resolve_spec
from judge.providers.base import ChatRequest, ProviderStatusError, RetryDecision, never_sent
from judge.providers.openai_compat import BatchJob, BatchLine, OpenAICompatProvider
from judge.providers.openai_compat import read_batch_lines as read_lines
from judge.run.batch_plan import Item, Line, chunks, parser
from judge.run.batch_state import (
    LIST_LAG_S,
    MAYBE_MADE,
    BatchRecord,
    BatchState,
    Leftover,
    LeftReason,
    load_state,
    save_state,
)
from judge.run.resume import batched_before, record_spent, spent_before
from judge.schema import Usage

__all__ = ["BatchPending", "Phase"]

log = logging.getLogger(__name__)
T = TypeVar("T")

FILE_TIMEOUT_S = 600.0  # an upload or download of up to 200 MB
GROWTH = 1.5  # each wait between status checks is this much longer than the last
# Why a request left unanswered by a batch that ended so gets no answer (else "failed").
_ENDED: dict[str, LeftReason] = {"expired": "expired", "cancelled": "cancelled"}


def _fate_unknown(exc: BaseException, decision: RetryDecision) -> bool:
    """Whether a create that failed so may still have made its batch: the request may have
    reached the provider (a timeout, a dropped connection, a server error, an answer that is
    not the protocol's), as against one refused as it stands (a client error, a rate limit)
    or never sent (no connection was made)."""
    kinds = ("timeout", "server", "connection", "protocol")
    return decision.kind in kinds and not never_sent(exc)


class Phase:
    """The batches of one invocation: submitted, polled, read, followed up."""

    def __init__(
        self, config: RunConfig, out_dir: Path, judge: Judge, cache: Cache, plan: dict[str, Item]
    ) -> None:
        provider = judge.caller.chat
        assert isinstance(provider, OpenAICompatProvider)  # check_batch let only these through
        self.config, self.out_dir, self.cache, self.plan = config, out_dir, cache, plan
        self.provider, self.scale = provider, judge.scale
        self.limits = judge.caller.limits
        self.money = BatchBudget(self.limits, provider.spec.extra_body)
        # The cap is the run directory's: earlier batches (at batch prices) and real-time
        # asks (at list price) into it count (run.json's ledgers).
        # What earlier invocations spent in real time: this one's real-time re-asks are kept
        # beside it in run.json as they go (:meth:`_keep_bound`).
        self.earlier, self.earlier_at_most = spent_before(out_dir)
        price = self.limits.price
        self.money.budget.count_earlier(
            batched_before(out_dir),
            self.earlier_at_most,
            elsewhere=self.earlier,
            elsewhere_cost=price.cost(self.earlier) if price is not None else 0.0,
        )
        self.stats = CallStats()  # the Batch API's own calls (files, batches)
        self.realtime = Caller(provider, cache=cache, limits=self.limits)  # replaced when used
        self.sent = self.answered = 0
        spec = resolve_spec(config.judge.provider, config.provider.overrides())
        state = load_state(out_dir) or BatchState(provider=spec, model=config.judge.model)
        # A batch recorded but never uploaded was never sent: its requests are planned again.
        kept = tuple(b for b in state.batches if b.collected or b.input_file_id is not None)
        self.state = state.model_copy(update={"batches": kept})

    def _save(self, index: int, record: BatchRecord) -> None:
        self.state = self.state.with_batch(index, record)
        save_state(self.out_dir, self.state)

    async def _call(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        return await managed(call, self.provider.classify, self.limits, self.stats, what)

    async def run(self) -> None:
        """Finish what earlier invocations recorded, then batch what is left, then follow up."""
        await self._adopt()
        pending = [i for i, b in enumerate(self.state.batches) if not b.collected]
        await self._finish(pending)
        # Asked in a first round and left there: the follow-up's. One a batch answered that
        # the cache no longer holds (cleared, another --cache) is batched again: in real time
        # it would be paid at list price.
        left = self.state.left_in_round(0)
        fresh = [
            Line(i.custom_id, i.request, i.custom_id)
            for i in self.plan.values()
            if i.custom_id not in left and not self.cache.contains(i.alias, alias=True)
        ]
        await self._round(0, fresh)
        if self.config.run.batch_followup == "batch":
            try:
                await self._round(1, self._followups())
            except BudgetExceeded as exc:  # the answers in hand still make a (partial) run
                log.warning("%s; the run asks what the first batch left, in real time", exc)
        else:
            await self._reask_now()

    async def _round(self, round_: int, lines: list[Line]) -> None:
        """Reserve the round's worst case, then submit, wait for and read its batches."""
        if not lines:
            return
        reservation = await self.money.reserve(line.request for line in lines)
        try:
            indices = []
            for chunk in chunks(
                lines, lambda ln: self.provider.batch_line(ln.custom_id, ln.request)
            ):
                index = len(self.state.batches)
                worst = worst_of((line.request for line, _ in chunk), self.provider.spec.extra_body)
                record = BatchRecord(
                    round=round_,
                    custom_ids=tuple(line.custom_id for line, _ in chunk),
                    answers={ln.custom_id: ln.first for ln, _ in chunk if ln.custom_id != ln.first},
                    reserved=worst,
                    reserved_cost=self.money.cost(worst),
                )
                self._save(index, record)  # before the upload: a kill leaves nothing unknown
                await self._upload(index, b"".join(data for _, data in chunk))
                await self._create(index)
                indices.append(index)
                self.sent += len(chunk)
            await self._finish(indices)
        finally:
            self.money.release(reservation)

    async def _upload(self, index: int, data: bytes) -> None:
        record = self.state.batches[index]
        name = f"judge-{self.out_dir.name}-{index}.jsonl"
        file_id = await self._call(
            f"uploading the batch input ({len(data)} bytes) to {self.provider.identity}/files "
            "(does this endpoint offer the Batch API?)",
            functools.partial(self.provider.upload_batch_file, data, name, timeout=FILE_TIMEOUT_S),
        )
        self._save(
            index, record.model_copy(update={"input_file_id": file_id, "status": "uploaded"})
        )

    async def _create(self, index: int) -> None:
        """Create the batch over the recorded input file, unless one was already created from
        it. Written ahead: the record says "maybe made" (and when) before the create is sent,
        so a kill, a lost answer or a list that lags behind never leads to a second batch
        (:meth:`_adopt` looks for it on the rerun); a create refused as it stands (a client
        error, no connection made) puts it back to "uploaded"."""
        record = self.state.batches[index]
        file_id = record.input_file_id
        assert file_id is not None
        timeout = self.limits.timeout_s
        metadata = {"made_by": "judge run --batch", "run_dir": str(self.out_dir)[-500:]}
        maybe_made: list[str] = []  # a create whose answer never came: the batch may exist

        async def find_or_create() -> BatchJob:
            if maybe_made:  # not listed yet is not never made: look again, never create again
                return await self._listed(file_id, maybe_made[0])
            found = await self.provider.find_batch(file_id, timeout=timeout)
            if found is not None:
                return found
            sent = {"status": MAYBE_MADE, "create_sent": time.time()}
            self._save(index, record.model_copy(update=sent))
            try:
                return await self.provider.create_batch(file_id, metadata, timeout=timeout)
            except Exception as exc:
                if _fate_unknown(exc, self.provider.classify(exc)):
                    maybe_made.append(str(exc)[:200] or type(exc).__name__)
                else:
                    self._save(index, record)  # refused as it stands: nothing was made
                raise

        try:
            job = await self._call(f"creating a batch from {file_id}", find_or_create)
        except ProviderError:
            if not maybe_made:
                raise
            raise BatchPending(
                f"creating a batch from {file_id} at {self.provider.identity}: its answer never "
                f"came ({maybe_made[0]}), and the provider lists no batch made from it yet; one "
                "is never created twice: rerun to look for it again"
            ) from None
        self._save(index, record.model_copy(update={"batch_id": job.id, "status": job.status}))

    async def _listed(self, file_id: str, why: str) -> BatchJob:
        """The batch made from ``file_id``, which a create that failed so (``why``) may have
        made; retried as a 503 while the provider's list does not show it."""
        found = await self.provider.find_batch(file_id, timeout=self.limits.timeout_s)
        if found is None:
            raise ProviderStatusError(
                f"a batch from {file_id} may have been made ({why}) but is not listed yet",
                status=503,
            )
        return found

    async def _adopt(self) -> None:
        """An input file an earlier invocation uploaded but did not see a batch made from: the
        batch it may have created is adopted; if there is none, the record goes (nothing was
        started; its requests are planned again, if the run still needs them)."""
        kept = []
        for record in self.state.batches:
            file_id = record.input_file_id
            if record.batch_id is None and file_id is not None:
                timeout = self.limits.timeout_s
                find = functools.partial(self.provider.find_batch, file_id, timeout=timeout)
                job = await self._follow(f"looking for a batch made from {file_id}", find)
                if job is None and record.status == MAYBE_MADE:
                    self._not_listed_yet(record, file_id)  # within LIST_LAG_S: BatchPending
                if job is None:
                    continue
                record = record.model_copy(update={"batch_id": job.id, "status": job.status})
            kept.append(record)
        if kept != list(self.state.batches):
            self.state = self.state.model_copy(update={"batches": tuple(kept)})
            save_state(self.out_dir, self.state)

    def _not_listed_yet(self, record: BatchRecord, file_id: str) -> None:
        """A batch an earlier create may have made (its answer never came) that the provider
        does not list: BatchPending while it may yet show (:data:`LIST_LAG_S` since the create
        was sent); after that, taken as never made (the record goes, its requests are planned
        again)."""
        age = time.time() - (record.create_sent or record.created)
        if age < LIST_LAG_S:
            raise BatchPending(
                f"a batch may have been made from {file_id} {age:.0f} s ago (its create's answer "
                f"never came), and {self.provider.identity} does not list it yet; one is never "
                "created twice: rerun in a few minutes to look again, or `judge batch cancel "
                f"{self.out_dir}` gives it up"
            )
        log.warning(
            "no batch made from %s is listed %.0f min after its create was sent: taken as never "
            "made; its requests are asked again",
            file_id,
            age / 60,
        )

    async def _finish(self, indices: list[int]) -> None:
        """Wait for every batch to end, then read each one."""
        if not indices:
            return
        jobs = await self._wait(indices)
        for index in indices:
            await self._collect(index, jobs[index])

    async def _follow(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """A call on a recorded batch: a provider that stays unreachable ends the run as
        incomplete (exit 3), and a rerun takes it up again."""
        try:
            return await self._call(what, call)
        except BatchGone as exc:
            raise BatchGone(
                f"{exc}: the provider does not know it (deleted, or another key, organisation "
                "or base_url than submitted it). If one of those changed, restore it and rerun; "
                f"else `judge batch cancel {self.out_dir}` gives the batch up, and the next run "
                "asks its requests again (paid again)",
                kind=exc.kind,
            ) from None
        except ProviderError as exc:
            raise BatchPending(
                f"{exc}; the batch is recorded in {self.out_dir / 'batch.json'}: rerun the same "
                "command to keep waiting for it (it is never submitted twice)"
            ) from None

    async def _wait(self, indices: list[int]) -> dict[int, BatchJob]:
        """Poll until every batch has ended, waiting longer each time, with a progress line."""
        delay = self.config.run.batch_poll_s
        jobs: dict[int, BatchJob] = {}
        while True:
            for index in indices:
                record = self.state.batches[index]
                if index in jobs and jobs[index].done:
                    continue
                batch_id = record.batch_id
                assert batch_id is not None  # _finish created every batch first
                get = functools.partial(
                    self.provider.get_batch, batch_id, timeout=self.limits.timeout_s
                )
                job = jobs[index] = await self._follow(f"checking batch {batch_id}", get)
                if job.status != record.status:
                    self._save(index, record.model_copy(update={"status": job.status}))
            done = all(job.done for job in jobs.values())
            _show(list(jobs.values()), None if done else delay)
            if done:
                return jobs
            await asyncio.sleep(delay)
            delay = min(delay * GROWTH, self.config.run.batch_max_poll_s)

    async def _collect(self, index: int, job: BatchJob) -> None:
        """Read a finished batch's output and error files; store the answers that parse; record
        the rest as left over, and what the answers used at batch prices."""
        record = self.state.batches[index]
        lines: list[BatchLine] = []
        for file_id in (job.output_file_id, job.error_file_id):
            if file_id:
                get = functools.partial(self.provider.file_content, file_id, timeout=FILE_TIMEOUT_S)
                content = await self._follow(f"downloading {file_id} of batch {job.id}", get)
                lines += read_lines(content, self.config.judge.model)
        reason = _ENDED.get(job.status, "failed")
        leftovers, usage, answered = self._store(record, lines, reason)
        detail = "; ".join(job.errors) or f"batch {job.id} ended {job.status} without answering"
        seen = {line.custom_id for line in lines}
        for custom_id in record.custom_ids:
            if custom_id not in seen:
                leftovers[record.first_id(custom_id)] = Leftover(reason=reason, detail=detail)
        cost = self.money.spend(usage)
        self.answered += answered
        update = {"status": job.status, "collected": True, "answered": answered}
        update |= {"usage": usage, "cost": cost, "leftovers": leftovers}
        self._save(index, record.model_copy(update=update))
        what = (job.id, job.status, answered, len(leftovers), usage.total, cost)
        log.info("batch %s %s: %d answers stored, %d left, %d tokens, $%.4f at batch prices", *what)
        await self._delete_files(record.input_file_id, job)
        if job.status != "completed":
            follow = self.config.run.batch_followup
            log.warning(
                "batch %s %s (%s); what it left is asked: %s", job.id, job.status, detail, follow
            )

    async def _delete_files(self, input_file_id: str | None, job: BatchJob) -> None:
        """Delete a collected batch's files at the provider (its passages need not stay
        there): best effort, a file left behind is a warning naming it."""
        for file_id in (input_file_id, job.output_file_id, job.error_file_id):
            if file_id:
                delete = functools.partial(
                    self.provider.delete_file, file_id, timeout=FILE_TIMEOUT_S
                )
                try:
                    await self._call(f"deleting {file_id} of batch {job.id}", delete)
                except ProviderError as exc:
                    log.warning("%s was left at the provider (delete it there): %s", file_id, exc)

    def _store(
        self, record: BatchRecord, lines: list[BatchLine], reason: LeftReason
    ) -> tuple[dict[str, Leftover], Usage, int]:
        """Store the answers that parse; the others, and the errors, are left over."""
        leftovers: dict[str, Leftover] = {}
        usage, answered = Usage(), 0
        seen: set[str] = set()
        sent = set(record.custom_ids)
        twice = unknown = kept = foreign = garbled = 0
        for line in lines:
            if line.custom_id in seen:  # the first line of a custom id is its answer
                twice += 1
                continue
            seen.add(line.custom_id)
            if line.custom_id not in sent:  # never asked in this batch: no answer of ours
                foreign += 1
                continue
            first = record.first_id(line.custom_id)
            if line.completion is None:  # an error line (an expired batch's say so)
                leftovers[first] = Leftover(reason=reason, detail=line.error or "")
                if line.billed:  # it ran and was billed, its usage unreadable: the worst case
                    garbled += 1
                    usage = usage + _share(record)
                continue
            if line.completion.usage_known:
                usage = usage + line.completion.usage  # billed, wanted or not
            else:  # counts that are not counts: the line's share of the reserved worst case
                unknown += 1
                usage = usage + _share(record)
            item = self.plan.get(first)
            if item is None:  # not this run's to read (its dataset or settings changed since,
                # or another run answered it): paid all the same, so kept under its request's
                # address, where a run asking it again finds it
                if not self.cache.contains(line.custom_id):
                    model = self.state.model
                    self.cache.put(line.custom_id, line.completion, kind="chat", model=model)
                    kept += 1
                continue
            parse = parser(self.scale, item.ids)
            model = self.config.judge.model
            first_asked = line.custom_id == item.custom_id  # not a re-ask
            error = store_answer(
                self.cache,
                line.custom_id,
                item.alias,
                line.completion,
                model,
                parse,
                alias_unread=first_asked,
            )
            if error is None:
                answered += 1
            else:
                text = line.completion.text
                leftovers[first] = Leftover(reason="unparsed", detail=str(error), answer=text)
        odd = {"twice": twice, "unknown": unknown, "kept": kept, "foreign": foreign}
        _say_odd_lines(record, garbled=garbled, **odd)
        return leftovers, usage, answered

    def _left(self, round_: int) -> list[tuple[Item, Leftover]]:
        """What the read batches of ``round_`` left that the run still needs."""
        out = []
        for record in self.state.batches:
            if record.round != round_ or not record.collected:
                continue
            for first, left in record.leftovers.items():
                item = self.plan.get(first)
                # An answer its parser could not read is stored (paid) but still left.
                stored = item is not None and self.cache.contains(
                    item.alias, alias=True, unread=False
                )
                if item is not None and not stored:
                    out.append((item, left))
        return out

    def _reask(self, item: Item, left: Leftover) -> ChatRequest:
        """The live re-ask of an unparsed answer: the first prompt, the answer, the error."""
        assert left.answer is not None
        language = self.config.judge.language
        conversation = reask_messages(
            item.request.messages, left.answer, left.detail, language=language
        )
        return item.request.model_copy(update={"messages": conversation})

    def _followups(self) -> list[Line]:
        """Round 1: an unparsed answer's re-ask, the first-round request again for the rest."""
        asked = self.state.in_round(1)
        lines = []
        for item, left in self._left(0):
            if item.custom_id in asked:
                continue
            if left.reason == "unparsed" and left.answer is not None and self.config.judge.reask:
                request = self._reask(item, left)
                key = self.realtime.key(request, item.repeat)
                lines.append(Line(key, request, item.custom_id))
            else:
                lines.append(Line(item.custom_id, item.request, item.custom_id))
        return lines

    def _keep_bound(self, bound: Usage) -> None:
        """Keep what the real-time re-asks may have spent (at their worst while in flight)
        beside what earlier invocations spent, in run.json, before each request that takes
        it a step further: a kill or Ctrl-C leaves it counted."""
        caller = self.realtime  # at most: in flight at their worst, or given up so
        at_most = self.earlier_at_most or bound != caller.budget.usage
        at_most = at_most or caller.stats.worst_counted > 0
        try:
            record_spent(self.out_dir, self.earlier + bound, at_most=at_most)
        except OSError as exc:
            log.warning("%s: cannot keep what the run spent: %s", self.out_dir, exc.strerror)

    async def _reask_now(self) -> None:
        """``batch_followup = "realtime"``: re-ask the unparsed answers now, under what is left
        of the budget; the run asks the failed and expired ones itself."""
        unparsed = [(i, lf) for i, lf in self._left(0) if lf.answer is not None]
        if not unparsed or not self.config.judge.reask:  # without re-asks: the run asks again
            return
        limits = within(self.limits, self.money.spent_cost, self.money.budget.spent_tokens)
        self.realtime = Caller(self.provider, cache=self.cache, limits=limits)
        self.realtime.budget.on_bound = self._keep_bound

        async def one(item: Item, left: Leftover) -> None:
            request = self._reask(item, left)
            try:
                got = await self.realtime.complete(
                    request, item.repeat, parser(self.scale, item.ids)
                )
            except (ProviderError, BudgetExceeded):
                return  # the run asks it from the start, and meets the same budget
            key = self.realtime.key(request, item.repeat)
            if got.error is None:
                self.cache.add_alias(item.alias, key)
            elif not got.call.cached:  # paid: the run's own re-ask finds it, never buys it
                keep_unread(self.cache, key, got.call.answer, request.model, got.error)

        try:
            await asyncio.gather(*(one(item, left) for item, left in unparsed))
        finally:  # a Ctrl-C included: what they may have spent is kept
            self.realtime.budget.tell_bound()


def _show(jobs: list[BatchJob], next_s: float | None) -> None:
    """The batches' progress: one refreshed line on a terminal, a log line per check elsewhere."""
    parts = [
        f"batch {j.id} {j.status} {j.completed + j.failed}/{j.total}"
        + (f" ({j.failed} failed)" if j.failed else "")
        for j in jobs
    ]
    line = "; ".join(parts) + (f"; next check in {next_s:.0f}s" if next_s is not None else "")
    if sys.stderr.isatty():
        sys.stderr.write("\r" + line + ("\n" if next_s is None else ""))
        sys.stderr.flush()
    else:
        log.info("%s", line)


def _share(record: BatchRecord) -> Usage:
    """One request's share of the worst case ``record`` reserved (rounded up): what an answer
    whose usage is unknown is counted, so that a batch counts no less than its worst case."""
    n = max(len(record.custom_ids), 1)
    return Usage(
        prompt_tokens=-(-record.reserved.prompt_tokens // n),
        completion_tokens=-(-record.reserved.completion_tokens // n),
    )


def _say_odd_lines(
    record: BatchRecord, *, twice: int, unknown: int, kept: int, foreign: int, garbled: int
) -> None:
    """One warning for each kind of output line a batch's collection met and did not just
    store: repeated custom ids, usage that is not a count, answers the run no longer needs,
    custom ids the batch never held."""
    if garbled:
        log.warning(
            "batch %s: %d output lines ran (billed) but hold no readable answer: each is "
            "counted at its share of the batch's worst case, and asked again",
            record.batch_id,
            garbled,
        )
    if foreign:
        log.warning(
            "batch %s: %d output lines answer a custom_id the batch never held: not read, "
            "not stored",
            record.batch_id,
            foreign,
        )
    if twice:
        log.warning(
            "batch %s: %d output lines repeat a custom_id already answered; the first "
            "answer of each is kept and counted once",
            record.batch_id,
            twice,
        )
    if unknown:
        log.warning(
            "batch %s: %d answers gave token usage that is not a count; each is counted "
            "at its share of the batch's worst case",
            record.batch_id,
            unknown,
        )
    if kept:
        log.warning(
            "batch %s: %d answers were asked for what this run no longer judges (its "
            "dataset or settings changed since): kept in the cache, where a run that asks "
            "them again finds them",
            record.batch_id,
            kept,
        )
