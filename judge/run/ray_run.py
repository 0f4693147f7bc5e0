"""``judge run --ray [ADDRESS]``: a run judged in shards on a Ray cluster (judge/run/shards.py)
and folded back into one run directory whose content is a single-process run's.

Ray is an optional extra (``pip install 'judge[ray]'``), imported here only, and only when a
run asks for it: ``import judge`` and every other command never load it.

1. Everything checkable is checked before anything is paid (:func:`check_ray`, then the run
   directory's lock and config fingerprint, as a single-process run's).
2. Shard directories an earlier invocation left (a killed driver or worker) are folded back
   first (judge/run/shard_files.py): their finished units and answers are kept, never re-paid.
3. Ray: one already initialised in this process (a notebook, tests) is used as it is; "local"
   starts an instance here and stops it at the end; another address joins that cluster.
4. Every query with a unit left goes to shard ``hash(query_id) % N`` (``[run] ray_shards``, else
   one per CPU of the cluster); each shard runs as one Ray task (one CPU, or for the embedded
   judge as many as its server's threads: :func:`shard_cpus`; never retried by Ray: a retry
   would spend its budget share twice) calling ``run_async`` in its own directory.
5. Waves: the budget is split between the shards running at once; what shards stopped at their
   share left unspent is split between those of a next wave (one at a time when no share fits a
   request), until all finish or nothing left fits. A dead worker's shard is charged its whole
   share (what it spent is unknown) and left for the next run.
6. The shards are folded back into the run directory and the user's cache; the outcome counts
   every shard's calls, tokens and cost."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from judge.config import RunConfig
from judge.data.results import RESULTS_FILE, UnitKey, unit_statuses
from judge.errors import ConfigError, JudgeError
from judge.run.resume import Redo, add_elapsed, check_fingerprint, finished_of, run_lock
from judge.run.runner import RunOutcome, StopKind
from judge.run.shard_files import SHARD_CACHE, fold_shards, seed_shards
from judge.run.shards import (
    ShardResult,
    ShardTask,
    check_ray,
    judge_shard,
    plan_shards,
    shard_config,
    shard_cpus,
)
from judge.schema import Query

__all__ = ["ShardFailed", "check_ray", "run_on_ray"]  # check_ray: from judge/run/shards.py

log = logging.getLogger(__name__)

_WAIT_S = 0.25  # each wait for a shard returns this often, so Ctrl-C reaches the driver


class ShardFailed(JudgeError):
    """A shard stopped on a JudgeError (its line and exit code, with the shard named)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


async def run_on_ray(
    config: RunConfig,
    queries: Sequence[Query],
    out_dir: Path,
    *,
    fresh: bool = False,
    redo: Redo = frozenset(),
) -> RunOutcome:
    """:func:`judge.run.runner.run_async`'s work, in shards on Ray (the module docstring)."""
    check_ray(config)
    out_dir = out_dir.absolute()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{out_dir}: cannot create the run directory: {exc.strerror}") from None
    start = time.monotonic()
    user_cache = config.cache_path().absolute()
    with run_lock(out_dir):
        # What an earlier invocation's shards finished, back in the run directory first (and
        # their answers in the user's cache, which --fresh keeps as a single run's would).
        fold_shards(out_dir, user_cache)
        check_fingerprint(out_dir, config, fresh=fresh)
        results = out_dir / RESULTS_FILE
        done = finished_of(unit_statuses(results)[0] if results.exists() else {}, redo)
        keys = {(q.query_id, q.engine, r) for q in queries for r in range(config.run.repeats)}
        waves = _Waves(config, out_dir, user_cache, redo, resumed=len(keys & done))
        try:
            await waves.run(queries, done)
        finally:
            fold_shards(out_dir, user_cache, strict=False)
            elapsed = add_elapsed(out_dir, time.monotonic() - start)
        recorded = unit_statuses(results)[0] if results.exists() else {}
        return waves.outcome(keys, recorded, elapsed)


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[list[signal.Signals]]:
    """SIGTERM and SIGHUP stop the driver as Ctrl-C does (asyncio.run's own handling): the
    shards are cancelled and keep what they finished, Ray is stopped, the shards folded. Left
    to their default, Ray's processes would outlive the driver (no ray.shutdown)."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    got: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        got.append(sig)
        if task is not None:
            task.cancel()

    installed = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        before = signal.getsignal(sig)
        try:
            loop.add_signal_handler(sig, on_signal, sig)
            installed[sig] = before
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread: the caller handles signals
    try:
        yield got
    finally:
        for sig, before in installed.items():
            loop.remove_signal_handler(sig)
            if before is not None:  # a Python handler (a notebook's, Ray's) is put back
                signal.signal(sig, before)


@dataclass
class _Waves:
    """The shards of one invocation, run in waves under one budget (the module docstring)."""

    config: RunConfig
    out_dir: Path
    user_cache: Path
    redo: Redo
    resumed: int
    results: list[ShardResult] = field(default_factory=list)
    spent_cost: float = 0.0
    spent_tokens: int = 0
    exhausted: bool = False  # the budget had nothing left to hand out

    async def run(self, queries: Sequence[Query], done: set[UnitKey]) -> None:
        import ray

        if not plan_shards(queries, 1, done, self.config.run.repeats)[0]:
            return  # every unit is judged: no cluster to start
        started = _connect(self.config.run.ray or "local")
        try:
            # After ray.init, which sets a SIGTERM handler of its own (it aborts the driver).
            with _signals_interrupt() as signalled:
                try:
                    await self._plan_and_run(queries, done)
                except asyncio.CancelledError:
                    if signalled:  # ends as Ctrl-C does: "interrupted", exit 3
                        raise KeyboardInterrupt from None
                    raise
        finally:
            if started:
                ray.shutdown()
        failed = next((r for r in self.results if r.error and not r.died), None)
        if failed is not None:
            where = f"shard {failed.index} on {failed.host}" if failed.host else "a shard"
            raise ShardFailed(f"{where}: {failed.error}", failed.exit_code)

    async def _plan_and_run(self, queries: Sequence[Query], done: set[UnitKey]) -> None:
        import ray

        cpus = ray.cluster_resources().get("CPU", 1)  # type: ignore[no-untyped-call]
        shards = self.config.run.ray_shards or max(1, int(cpus))
        plan = plan_shards(queries, shards, done, self.config.run.repeats)
        self.plan, self.dirs = plan, seed_shards(self.out_dir, plan)
        busy = sum(1 for rows in plan if rows)
        log.info("ray: %d shard(s) of %d hold queries with units to judge", busy, shards)
        await self._waves([k for k, rows in enumerate(plan) if rows])

    async def _waves(self, waiting: list[int]) -> None:
        solo = False
        while waiting:
            wave = waiting[:1] if solo else waiting
            shares = self._shares(len(wave))
            if shares is None:
                self.exhausted = True
                return
            if self.results:  # a wave after the first: what the budget has left, handed out
                log.info(
                    "ray: %d shard(s) stopped at their share of the budget; again with "
                    "$%.4f / %d tokens each (0: no cap)",
                    len(wave),
                    *shares,
                )
            got = await self._wave(wave, *shares)
            if any(r.error and not r.died for r in got):
                return  # a shard's JudgeError ends the run (raised after the fold)
            again = [r.index for r in got if r.outcome and r.outcome.stopped_by == "budget"]
            moved = any(_spent(r) > 0 for r in got if r.index in again)
            rest = waiting[len(wave) :]
            if again and not moved:
                # No share fits a next request: all that is left, to one shard at a time; a
                # shard that cannot fit its next request even so is done for this run.
                waiting = (again if len(wave) > 1 else []) + rest
                solo = True
            else:
                waiting = again + rest

    def _shares(self, running: int) -> tuple[float, int] | None:
        """Each running shard's budget: an even part of what is left (0: no budget); None
        when a budget is set and nothing of it is left (0 would mean none)."""
        r = self.config.run
        cost = (r.max_cost - self.spent_cost) / running if r.max_cost > 0 else 0.0
        tokens = (r.max_tokens - self.spent_tokens) // running if r.max_tokens > 0 else 0
        if (r.max_cost > 0 and cost <= 0) or (r.max_tokens > 0 and tokens <= 0):
            return None
        return cost, tokens

    async def _wave(self, wave: list[int], cost: float, tokens: int) -> list[ShardResult]:
        """The ``wave``'s shards at once, each with ``cost`` and ``tokens`` as its budget."""
        import ray

        remote = ray.remote(judge_shard)
        cpus = shard_cpus(self.config)
        level = logging.getLogger("judge").getEffectiveLevel()
        pending: dict[Any, int] = {}
        for k in wave:
            own = self.dirs[k] / SHARD_CACHE
            config = shard_config(
                self.config, len(wave), cost=cost, tokens=tokens, cache=own, cpus=cpus
            )
            task = ShardTask(
                index=k,
                shards=len(self.plan),
                config=config,
                queries=tuple(self.plan[k]),
                shard_dir=str(self.dirs[k]),
                user_cache=str(self.user_cache),
                redo=tuple(sorted(self.redo)),
                log_level=level,
            )
            named = remote.options(num_cpus=cpus, max_retries=0, name=f"judge-shard-{k}")
            pending[named.remote(task)] = k
        got: dict[int, ShardResult] = {}
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=_WAIT_S)
                await asyncio.sleep(0)  # where a Ctrl-C (the main task cancelled) lands
                for ref in ready:
                    k = pending.pop(ref)
                    got[k] = _result(k, ref)
        except BaseException:
            # A KeyboardInterrupt in each shard: its run stops, its finished units written;
            # waited for, so that the fold finds the shards' directories free.
            for ref in pending:
                ray.cancel(ref)
            if pending:
                grace = self.config.run.grace_s + 5
                ray.wait(list(pending), num_returns=len(pending), timeout=grace)
            raise
        for k in wave:
            self._charge(got[k], cost, tokens)
        self.results.extend(got[k] for k in wave)
        return [got[k] for k in wave]

    def _charge(self, result: ShardResult, cost: float, tokens: int) -> None:
        """What a shard spent; one that came back without an outcome is charged its share."""
        if result.outcome is not None:
            self.spent_cost += result.outcome.cost_usd
            self.spent_tokens += result.outcome.prompt_tokens + result.outcome.completion_tokens
        else:
            self.spent_cost += cost
            self.spent_tokens += tokens

    def outcome(
        self, keys: set[UnitKey], recorded: dict[Any, frozenset[str]], elapsed: float
    ) -> RunOutcome:
        """The run's outcome: every shard's counts summed, what the run directory now holds."""
        outcomes = [r.outcome for r in self.results if r.outcome is not None]
        last = {r.index: r for r in self.results}  # each shard's final state
        reason, stopped_by = self._stop(list(last.values()))
        done = len(keys & recorded.keys())
        failed = sum(1 for k in keys & recorded.keys() if "error" in recorded[k])
        if failed and reason is None:
            reason = (
                f"{failed} of {done} query-repeats have passages that ended in provider errors "
                "after retries; rerun to ask them again"
            )
            stopped_by = "errors"
        complete = reason is None and done == len(keys)
        errors: dict[str, int] = {}
        for o in outcomes:
            for kind, n in o.errors_by_kind.items():
                errors[kind] = errors.get(kind, 0) + n
        return RunOutcome(
            out_dir=str(self.out_dir),
            status="complete" if complete else "incomplete",
            reason=reason,
            stopped_by=stopped_by,
            planned=len(keys),
            done=done,
            resumed=self.resumed,
            requests=sum(o.requests for o in outcomes),
            cache_hits=sum(o.cache_hits for o in outcomes),
            retries=sum(o.retries for o in outcomes),
            prompt_tokens=sum(o.prompt_tokens for o in outcomes),
            completion_tokens=sum(o.completion_tokens for o in outcomes),
            cost_usd=sum(o.cost_usd for o in outcomes),
            elapsed_s=elapsed,
            errors_by_kind=errors,
            worst_counted=sum(o.worst_counted for o in outcomes),
            cascade_band=next((o.cascade_band for o in outcomes if o.cascade_band), None),
        )

    def _stop(self, final: list[ShardResult]) -> tuple[str | None, StopKind | None]:
        """Why the run stopped, from each shard's final state: the budget first (its own exit
        code), then a dead worker, then a shard's own reason."""
        budget = [r for r in final if r.outcome and r.outcome.stopped_by == "budget"]
        if budget or self.exhausted:
            r = self.config.run
            what = (
                f"cost budget reached: spent ${self.spent_cost:.4f} of ${r.max_cost:.4f}"
                if r.max_cost > 0
                else f"token budget reached: spent {self.spent_tokens} of {r.max_tokens} tokens"
            )
            return f"{what} across the shards; rerun with a larger budget to resume", "budget"
        for result in final:
            if result.died:
                why = f"shard {result.index}'s Ray worker died ({result.error}); rerun to resume"
                return why, "errors"
        for result in final:
            if result.outcome is not None and result.outcome.reason is not None:
                return f"shard {result.index}: {result.outcome.reason}", result.outcome.stopped_by
        return None, None


# A cluster's address as host:port, and how long its port is given to take a connection
# before the run says it cannot reach it (ray.init would retry it silently for ten minutes,
# deaf to Ctrl-C).
_HOST_PORT = re.compile(r"\[?([^\s\[\]/]+?)\]?:(\d{1,5})")
RAY_REACH_S = 10.0


def _connect(address: str) -> bool:
    """Ray for this run: the one this process has, else a new local instance or a cluster;
    True when this run started it (and so stops it)."""
    import ray

    if found := _HOST_PORT.fullmatch(address):  # Ray retries an address for ten minutes
        try:
            socket.create_connection((found[1], int(found[2])), timeout=RAY_REACH_S).close()
        except OSError as exc:
            said = exc.strerror or type(exc).__name__
            raise ConfigError(f"run.ray: cannot reach Ray at {address!r}: {said}") from None
    if ray.is_initialized():
        return False
    options: dict[str, Any] = {"logging_level": logging.WARNING}
    if address == "local":
        options["include_dashboard"] = False
    try:
        ray.init(address=address, **options)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"run.ray: cannot reach Ray at {address!r}: {exc}") from None
    return True


def _result(index: int, ref: Any) -> ShardResult:
    """A finished shard task's result; a worker or node that died, as such."""
    import ray

    try:
        result: ShardResult = ray.get(ref)
    except ray.exceptions.RayTaskError:
        raise  # a bug in the shard: its traceback, as in a single-process run
    except ray.exceptions.RayError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return ShardResult(index=index, error=f"{type(exc).__name__}: {first}", died=True)
    return result


def _spent(result: ShardResult) -> float:
    o = result.outcome
    return 0.0 if o is None else o.cost_usd + o.prompt_tokens + o.completion_tokens
