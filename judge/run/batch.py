"""Batch mode (``judge run --batch``): a pre-phase that fills the answer cache through the
provider's Batch API at its batch price, before the run reads everything from the cache.

1. Plan: every first-round request of the units still to judge, rendered exactly as the run
   renders it, minus what the cache holds. Its ``custom_id`` is its cache key (the rendered
   request's content address).
2. Reserve the round's worst case at batch prices (judge/calling/batch.py), record the requests
   in ``batch.json`` (judge/run/batch_state.py), upload the input file (purpose "batch"), record
   its id, create the batch (24 h window) and record its id; each step recorded before the next
   can fail. A recorded batch is polled, never submitted again: a rerun after a kill looks for
   it first, and a create whose answer was lost is looked up by its input file before retrying;
   one that may have reached the provider (a timeout, a server error) is never sent again: its
   batch is looked for until the list shows it, and a rerun looks again (a list may lag).
3. Poll with growing waits (``[run] batch_poll_s`` .. ``batch_max_poll_s``) and a progress line;
   then read the output and error files and store every answer that parses, as the caller
   stores a live one. What the answers used is charged at batch prices.
4. What a batch left without a usable answer (unparsed, failed, expired, cancelled) follows
   ``[run] batch_followup``: "realtime" re-asks the unparsed ones now (the live re-ask: the
   first prompt, the answer, what was wrong with it) and leaves the rest to the run, which asks
   them in real time; "batch" sends all of it in one follow-up batch first (unparsed ones as
   their re-asks), and the run asks in real time whatever that leaves.
5. The run (:func:`judge.run.runner.run_async`) then judges every unit, under what is left of
   the budget; cached answers cost nothing. Its outcome counts the batches' tokens and cost.

Which providers have a Batch API is theirs to say (``judge.providers.ADAPTERS``): a kind has
none unless its entry declares one, and one without is refused before anything is sent.

Only first-round requests are batched. The rounds a live run adds after reading an answer (a
listwise round for the ids a list answer left out, the pointwise fallback) are asked in real time
by the run. A re-ask's answer that parses is stored under the re-ask's own content address and
named by the first-round prompt's alias, so the run reads it as that prompt's answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

from judge.calling.cache import open_cache
from judge.calling.limits import EARLIER, Limits
from judge.config import RunConfig
from judge.data.results import RESULTS_FILE
from judge.errors import ConfigError
from judge.judging.judge import Judge
from judge.providers import resolve_spec, why_no_batch
from judge.run.batch_phase import BatchPending, Phase
from judge.run.batch_plan import plan_requests
from judge.run.resume import (
    Redo,
    add_elapsed,
    check_fingerprint,
    finished_units,
    record_spent,
    run_lock,
)
from judge.run.runner import RunOutcome, run_async
from judge.schema import Query

__all__ = ["BatchPending", "check_batch", "run_batched"]

log = logging.getLogger(__name__)


def check_batch(config: RunConfig) -> None:
    """ConfigError when batch mode cannot work with ``config``, before anything is paid."""
    name = config.judge.provider
    why = why_no_batch(name, resolve_spec(name, config.provider.overrides()))
    if why is not None:
        raise ConfigError(
            f"{config.source}: run.batch: the provider '{name}' has no Batch API ({why}); "
            "batch mode needs an OpenAI-compatible endpoint that offers one (openai, "
            "dashscope-compatible); run without --batch"
        )
    if config.judge.cascade is not None:
        raise ConfigError(
            f"{config.source}: run.batch: [judge.cascade] picks the LLM's passages from reranker "
            "scores as the run goes, which batch mode cannot plan ahead; run without --batch"
        )


async def run_batched(
    config: RunConfig,
    queries: Sequence[Query],
    out_dir: Path,
    *,
    fresh: bool = False,
    redo: Redo = frozenset(),
) -> RunOutcome:
    """:func:`run_async` after the batch pre-phase (the module docstring), under one budget;
    the outcome counts what the batches (at batch prices) and the re-asks used."""
    check_batch(config)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{out_dir}: cannot create the run directory: {exc.strerror}") from None
    start = time.monotonic()
    with run_lock(out_dir):
        check_fingerprint(out_dir, config, fresh=fresh)  # a changed config: refused, unpaid
        try:
            phase = await _prefill(config, queries, out_dir, redo)
        finally:
            add_elapsed(out_dir, time.monotonic() - start)
    realtime = phase.realtime.budget
    # This invocation's: the ledgers (run.json) hold earlier ones' too, and the run counts
    # them all against the caps: the real-time re-asks are kept with the real-time spend.
    spent_cost = phase.money.budget.this_run_cost + realtime.cost
    spent = phase.money.budget.this_run + realtime.usage
    if realtime.usage.total:
        record_spent(out_dir, phase.earlier + realtime.usage, at_most=phase.earlier_at_most)
    outcome = await run_async(config, queries, out_dir, redo=redo)
    reason = outcome.reason
    if outcome.stopped_by == "budget" and reason is not None and spent.total:
        before = phase.earlier.total or phase.money.budget.earlier.total
        said = "by this run's batches" + (" and earlier invocations" if before else "")
        reason = reason.replace(EARLIER, said)  # the run counted them all as spent before it
    log.info(
        "batch mode: %d request(s) sent in batches this run, %d answer(s) stored; "
        "%d tokens, $%.4f (batches at batch prices, re-asks at list price)",
        phase.sent,
        phase.answered,
        spent.total,
        spent_cost,
    )
    return outcome.model_copy(
        update={
            "reason": reason,
            "requests": outcome.requests + phase.realtime.stats.requests,
            "retries": outcome.retries + phase.realtime.stats.retries,
            "prompt_tokens": outcome.prompt_tokens + spent.prompt_tokens,
            "completion_tokens": outcome.completion_tokens + spent.completion_tokens,
            "cost_usd": outcome.cost_usd + spent_cost,
        }
    )


async def _prefill(config: RunConfig, queries: Sequence[Query], out_dir: Path, redo: Redo) -> Phase:
    cache = open_cache(config)
    judge = Judge.from_config(config, cache=cache, limits=Limits.from_config(config))
    try:
        done = finished_units(out_dir / RESULTS_FILE, queries, redo)
        plan = plan_requests(judge, config, queries, cache, done, "unparsed" not in redo)
        phase = Phase(config, out_dir, judge, cache, plan)
        await phase.run()
        return phase
    finally:
        await judge.aclose()
        cache.close()
