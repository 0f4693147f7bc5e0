"""``judge batch status|cancel RUN_DIR``: the provider batches a ``judge run --batch`` recorded.

Both read the run directory's ``batch.json`` (judge/run/batch_state.py), which names the
provider by its spec (base URL, the API key's environment variable), so they need no config.
``status`` asks the provider about the batches not yet read; ``cancel`` cancels those. The
answers a cancelled batch already gave are kept and paid; the next ``judge run --batch`` reads
them and asks the rest as ``[run] batch_followup`` says.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from judge.cli.common import EXIT_OK
from judge.errors import BatchGone, ConfigError

if TYPE_CHECKING:
    from judge.providers.openai_compat import BatchJob
    from judge.run.batch_state import BatchRecord, BatchState


def _pending(out_dir: Path) -> tuple[BatchState, list[str]]:
    """The recorded state and the ids of its batches not yet read. A batch whose create's
    answer never came ("maybe made") is looked for by its input file first: found, its id is
    recorded (the next run reads it); not listed, it is left out."""
    from judge.run.batch_state import STATE_FILE, load_state, save_state

    state = load_state(out_dir)
    if state is None:
        raise ConfigError(f"{out_dir / STATE_FILE}: no batch was recorded in this run directory")
    maybe = [i for i, b in enumerate(state.batches) if _maybe_made(b)]
    if maybe:
        found = asyncio.run(_find(state, [state.batches[i].input_file_id or "" for i in maybe]))
        for index, job in zip(maybe, found, strict=True):
            if job is not None:
                update = {"batch_id": job.id, "status": job.status}
                state = state.with_batch(index, state.batches[index].model_copy(update=update))
        save_state(out_dir, state)
    return state, [b.batch_id for b in state.batches if not b.collected and b.batch_id]


def _maybe_made(record: BatchRecord) -> bool:
    """A record whose create was sent and whose answer never named the batch."""
    from judge.run.batch_state import MAYBE_MADE

    return not record.collected and record.batch_id is None and record.status == MAYBE_MADE


async def _find(state: BatchState, file_ids: list[str]) -> list[BatchJob | None]:
    """The batch the provider lists as made from each of ``file_ids`` (None: none listed)."""
    from judge.calling.batch import managed
    from judge.calling.limits import Limits
    from judge.calling.retries import CallStats
    from judge.providers.openai_compat import OpenAICompatProvider

    provider = OpenAICompatProvider(state.provider)
    limits, stats = Limits(max_attempts=3, backoff_base_s=0.5), CallStats()
    try:
        out: list[BatchJob | None] = []
        for file_id in file_ids:

            async def call(f: str = file_id) -> BatchJob | None:
                return await provider.find_batch(f, timeout=30.0)

            what = f"looking for a batch made from {file_id}"
            out.append(await managed(call, provider.classify, limits, stats, what))
        return out
    finally:
        await provider.aclose()


async def _ask(state: BatchState, ids: list[str], cancel: bool) -> list[BatchJob | BatchGone]:
    """The provider's view of batches ``ids`` (after cancelling them, with ``cancel``); a
    batch the provider does not know (404) as its error."""
    from judge.calling.batch import managed
    from judge.calling.limits import Limits
    from judge.calling.retries import CallStats
    from judge.providers.openai_compat import OpenAICompatProvider

    provider = OpenAICompatProvider(state.provider)
    limits, stats = Limits(max_attempts=3, backoff_base_s=0.5), CallStats()
    try:
        out: list[BatchJob | BatchGone] = []
        for batch_id in ids:
            method = provider.cancel_batch if cancel else provider.get_batch
            what = f"{'cancelling' if cancel else 'checking'} batch {batch_id}"

            async def call(m: Callable[..., Any] = method, b: str = batch_id) -> BatchJob:
                job: BatchJob = await m(b, timeout=30.0)
                return job

            try:
                out.append(await managed(call, provider.classify, limits, stats, what))
            except BatchGone as gone:
                out.append(gone)
        return out
    finally:
        await provider.aclose()


def cmd_status(args: argparse.Namespace) -> int:
    out_dir = Path(args.run_dir)
    state, pending = _pending(out_dir)
    print(
        f"{out_dir}: {len(state.batches)} batch(es) of {state.model} at {state.provider.base_url}"
    )
    for i, b in enumerate(state.batches):
        left = ", ".join(
            f"{n} {reason}"
            for reason in ("unparsed", "failed", "expired", "cancelled")
            if (n := sum(1 for x in b.leftovers.values() if x.reason == reason))
        )
        read = (
            f"read: {b.answered} answered{', ' + left if left else ''}; "
            f"{b.usage.total} tokens, ${b.cost:.4f}"
            if b.collected
            else f"not read yet; worst case ${b.reserved_cost:.4f}"
        )
        name = b.batch_id or (
            "(its create's answer never came; not listed)" if _maybe_made(b) else "(not created)"
        )
        print(f"  #{i} round {b.round}: {name} {b.status}, {len(b.custom_ids)} requests; {read}")
    jobs = asyncio.run(_ask(state, pending, cancel=False)) if pending else []
    for batch_id, job in zip(pending, jobs, strict=True):
        if isinstance(job, BatchGone):
            print(
                f"  {batch_id} at the provider: unknown ({job}); `judge batch cancel` gives it up"
            )
            continue
        print(
            f"  {job.id} at the provider: {job.status}, {job.completed} answered, "
            f"{job.failed} failed of {job.total}"
        )
    if pending:
        print("a `judge run --batch` with this run directory waits for them and reads them")
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    out_dir = Path(args.run_dir)
    state, pending = _pending(out_dir)
    for record in filter(_maybe_made, state.batches):
        _give_up(out_dir, record.input_file_id, "its create's answer never came; given up")
        print(
            f"the batch of {record.input_file_id}: its create's answer never came and the "
            "provider lists none made from it; given up: the next run asks its requests again "
            "(if it shows later, it is billed: check the provider's batches)"
        )
    if not pending:
        print(f"{out_dir}: no batch in flight; nothing to cancel")
        return EXIT_OK
    for batch_id, job in zip(pending, asyncio.run(_ask(state, pending, cancel=True)), strict=True):
        if isinstance(job, BatchGone):
            _give_up(out_dir, batch_id, str(job))
            print(
                f"{batch_id}: unknown to the provider ({job}); given up: the next run asks its "
                "requests again (paid again; if the batch exists under another key, it may be "
                "billed there too)"
            )
            continue
        print(f"{job.id}: {job.status} ({job.completed} answered before the cancel are kept)")
    print(
        "the next `judge run --batch` with this run directory reads what they answered and asks "
        "the rest as [run] batch_followup says"
    )
    return EXIT_OK


def _give_up(out_dir: Path, batch_id: str | None, why: str) -> None:
    """Record the batch ``batch_id`` (or the one of that input file, not created) as read,
    every request of it left over ("given up")."""
    from judge.run.batch_state import Leftover, load_state, save_state

    state = load_state(out_dir)
    assert state is not None  # read by _pending just before
    for index, record in enumerate(state.batches):
        if batch_id in (record.batch_id, record.input_file_id) and not record.collected:
            left = {
                record.first_id(c): Leftover(reason="given up", detail=why)
                for c in record.custom_ids
            }
            update = {"status": "given up", "collected": True, "leftovers": left}
            state = state.with_batch(index, record.model_copy(update=update))
    save_state(out_dir, state)


def add_commands(sub: Any) -> None:
    b = sub.add_parser("batch", help="the provider batches of a `judge run --batch`")
    bsub = b.add_subparsers(dest="batch_command", required=True)
    s = bsub.add_parser("status", help="recorded batches, and the provider's view of open ones")
    s.add_argument("run_dir")
    s.set_defaults(func=cmd_status)
    c = bsub.add_parser("cancel", help="cancel the run directory's batches still in flight")
    c.add_argument("run_dir")
    c.set_defaults(func=cmd_cancel)
