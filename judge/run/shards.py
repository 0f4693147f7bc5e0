"""A run split into shards (``judge run --ray``, judge/run/ray_run.py): which shard judges which
query, what each may spend, and one shard's work as a function a Ray worker calls.

A shard holds every row (every engine) of the queries whose stable hash of ``query_id`` lands
on it, with all their repeats: what a query pools (its nugget set, a passage two engines
returned, asked once) stays in one process. Its work lives in ``<run dir>/shards/<k>/``
(judge/run/shard_files.py): results, nugget sets and its own answer cache, written by that
shard alone, so nothing there needs a lock across machines; the cache reads through to the
user's cache wherever the worker's node can see that file. Each shard is
:func:`judge.run.runner.run_async` on its own queries, with its own provider client (or its own
embedded llama.cpp server), under its share of the limits.

Limits are split, not coordinated: with ``m`` shards running at once each gets 1/m of the
budget (``max_cost``, ``max_tokens``), of ``requests_per_minute`` and ``tokens_per_minute``,
and of the concurrency of a remote provider (at least one call each; an embedded server is the
shard's own, so it keeps its full concurrency). The sum of the shares is the configured figure,
so the cap holds by construction, with the Budget the single-process run uses, no round trip
per request to a coordinator, and nothing a killed worker could leave reserved. What a split
budget strands (a shard stopped at its share while others finished under theirs) the driver
hands out again in later waves. An embedded shard asks Ray for the CPUs its llama.cpp server
runs threads on (:func:`shard_cpus`), so Ray places no other shard on them. What a Ray run
cannot do is refused before anything is paid (:func:`check_ray`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

from judge.calling.cache import Cache, Stored, open_cache
from judge.config import RunConfig
from judge.data.results import UnitKey
from judge.errors import ConfigError, JudgeError
from judge.providers import ADAPTERS, Adapter, resolve_spec
from judge.run.resume import Redo
from judge.run.runner import RunOutcome, run_async
from judge.run.shard_files import SHARD_CACHE, write_shard_record
from judge.schema import Query, Record
from judge.version import __version__

__all__ = [
    "ShardCache",
    "ShardResult",
    "ShardTask",
    "judge_shard",
    "plan_shards",
    "shard_config",
    "shard_of",
]

log = logging.getLogger(__name__)
T = TypeVar("T", bound=BaseModel)


def shard_of(query_id: str, shards: int) -> int:
    """The shard of ``query_id`` among ``shards``: a hash that is the same in every process and
    on every run (Python's ``hash`` of a str is salted per process)."""
    digest = hashlib.blake2b(query_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def plan_shards(
    queries: Sequence[Query], shards: int, done: set[UnitKey], repeats: int
) -> list[list[Query]]:
    """Each shard's rows: every row of a query that has a unit left to judge (its finished
    units come along in the shard's seeded results, judge/run/shard_files.py)."""
    pending = {
        q.query_id for q in queries for r in range(repeats) if (q.query_id, q.engine, r) not in done
    }
    plan: list[list[Query]] = [[] for _ in range(shards)]
    for q in queries:
        if q.query_id in pending:
            plan[shard_of(q.query_id, shards)].append(q)
    return plan


_ADDRESS = re.compile(r"^(local|auto|ray://\S+|[\w.-]+:\d+)$")


def check_ray(config: RunConfig) -> None:
    """ConfigError when ``config``'s ``[run] ray`` cannot work, before anything is paid."""
    address = config.run.ray
    if address is None:
        return
    where = f"{config.source}: run.ray"
    if not _ADDRESS.match(address):
        raise ConfigError(
            f"{where}: {address!r} is not a Ray address (local, auto, ray://HOST:PORT or "
            "HOST:PORT); on the command line --ray goes after the dataset"
        )
    if config.run.batch:
        raise ConfigError(
            f"{where}: batch mode (run.batch) runs at the provider, not on a cluster; "
            "use --batch or --ray, not both"
        )
    cascade = config.judge.cascade
    if cascade is not None and cascade.low is None:
        raise ConfigError(
            f"{where}: [judge.cascade] fits its band from the whole run's scores (quantiles or "
            "max_error), and a shard sees only its part; give the band as low and high, or run "
            "without --ray"
        )
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError(f"{where}: Ray is not installed: pip install 'judge[ray]'") from None


def shard_config(
    config: RunConfig, running: int, *, cost: float, tokens: int, cache: Path, cpus: int = 1
) -> RunConfig:
    """``config`` for one of ``running`` shards at once: ``cost`` and ``tokens`` as its budget
    (a share the driver worked out), rates and a remote provider's concurrency split evenly,
    its own ``cache`` file, and for a judge running its own model (the embedded one) ``cpus``
    threads (:func:`shard_cpus`). None of these is part of the fingerprint, so a shard's
    directory resumes with any other share."""

    def split(value: int, adapter: Adapter) -> int:
        if value == 0 or adapter.runs_locally:  # every shard runs its own model
            return value
        return max(1, value // running)

    chat = _adapter(config.judge.provider, config.provider.overrides())
    run = config.run.model_copy(
        update={
            "max_cost": cost,
            "max_tokens": tokens,
            "requests_per_minute": config.run.requests_per_minute / running,
            "tokens_per_minute": config.run.tokens_per_minute / running,
            "concurrency": split(config.run.concurrency, chat),
            "cache": str(cache),
            "ray": None,
        }
    )
    update: dict[str, Any] = {
        "run": run,
        "provider": config.provider.model_copy(
            update={"concurrency": split(config.provider.concurrency, chat)}
        ),
    }
    if config.rerank is not None:
        rerank = _adapter(config.rerank.provider, config.rerank.overrides())
        update["rerank"] = config.rerank.model_copy(
            update={"concurrency": split(config.rerank.concurrency, rerank)}
        )
    if chat.threads_option:  # its local model uses the CPUs Ray gives the shard, no more
        options = {**(config.provider.options or {}), chat.threads_option: cpus}
        update["provider"] = update["provider"].model_copy(update={"options": options})
    return config.model_copy(update=update)


def shard_cpus(config: RunConfig) -> int:
    """The CPUs a shard asks Ray for: 1, but for a judge whose local model runs a thread per
    core (the embedded llama.cpp server), its threads option (``[provider]
    options.n_threads``) when given, else every CPU of the largest node (so Ray places no
    other shard on the cores that model uses)."""
    threads = _adapter(config.judge.provider, config.provider.overrides()).threads_option
    if threads is None:
        return 1
    given = (config.provider.options or {}).get(threads)
    if given:
        return int(given)
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
    nodes = [n.get("Resources", {}).get("CPU", 0) for n in alive]
    return max(1, int(max(nodes, default=1)))


def _adapter(name: str, overrides: dict[str, Any]) -> Adapter:
    """What the provider ``name`` with a config table's ``overrides`` offers."""
    return ADAPTERS[resolve_spec(name, overrides).kind]


class ShardCache(Cache):
    """A shard's own cache file, where every answer it is given is stored, read through to the
    user's cache (``base``) when this node can see that file: answers known before the run cost
    nothing, and the user's file is only ever read by a shard (the driver merges the shard's
    answers into it afterwards, judge/run/shard_files.py)."""

    def __init__(self, path: Path, base: Path | None) -> None:
        super().__init__(path)
        # Opened only when it exists here: on another node the path would make an empty file.
        self.base = open_cache(base) if base is not None and base.is_file() else None

    def get_stored(self, key: str, model: type[T], *, alias: bool = False) -> Stored[T] | None:
        found = super().get_stored(key, model, alias=alias)
        if found is None and self.base is not None:
            found = self.base.get_stored(key, model, alias=alias)
        return found

    def contains(self, key: str, *, alias: bool = False, unread: bool = True) -> bool:
        if super().contains(key, alias=alias, unread=unread):
            return True
        return self.base is not None and self.base.contains(key, alias=alias, unread=unread)

    def close(self) -> None:
        super().close()
        if self.base is not None:
            self.base.close()


class ShardTask(Record):
    """What the driver sends a worker: one shard's queries, config and directory."""

    index: int
    shards: int
    config: RunConfig
    queries: tuple[Query, ...]
    shard_dir: str
    user_cache: str
    redo: tuple[Literal["error", "unparsed"], ...] = ()
    version: str = __version__  # the driver's judge: a node running another is refused
    log_level: int = logging.INFO


class ShardResult(Record):
    """What became of one shard's task: its outcome, or the one line of the JudgeError that
    stopped it (with its exit code), or Ray's word that its worker or node died."""

    index: int
    host: str = ""
    pid: int = 0
    outcome: RunOutcome | None = None
    error: str | None = None
    exit_code: int = 0
    died: bool = False


def judge_shard(task: ShardTask) -> ShardResult:
    """One shard's work, in a Ray worker: :func:`run_async` over its queries in its directory,
    with its own cache (read through to the user's). A JudgeError comes back as its line and
    exit code (an exception's pickled class would not always survive the trip)."""
    host, pid = socket.gethostname(), os.getpid()
    here = ShardResult(index=task.index, host=host, pid=pid)
    shard_dir = Path(task.shard_dir)
    if task.version != __version__:
        why = f"this node runs judge {__version__}, the driver {task.version}; install one version"
        return here.model_copy(update={"error": why, "exit_code": 2})
    if not shard_dir.is_dir():
        why = (
            f"{shard_dir} is not on this node: put the run directory (--out) on a filesystem "
            "every Ray node mounts"
        )
        return here.model_copy(update={"error": why, "exit_code": 2})
    write_shard_record(
        shard_dir, {"shard": task.index, "shards": task.shards, "host": host, "pid": pid}
    )
    handler = _log_to_stderr(task)
    redo: Redo = frozenset(task.redo)
    cache: ShardCache | None = None
    try:
        cache = ShardCache(shard_dir / SHARD_CACHE, Path(task.user_cache))
        outcome = asyncio.run(
            run_async(task.config, task.queries, shard_dir, redo=redo, cache=cache, ledger=False)
        )
    except JudgeError as exc:
        return here.model_copy(update={"error": str(exc), "exit_code": exc.exit_code})
    finally:
        if cache is not None:
            cache.close()  # run_async closed it already, unless it failed before opening
        logging.getLogger("judge").removeHandler(handler)
    return here.model_copy(update={"outcome": outcome})


def _log_to_stderr(task: ShardTask) -> logging.Handler:
    """The shard's log lines (its progress) on the worker's stderr, which Ray shows on the
    driver's, named by shard; the worker process is reused, so the handler is removed after."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"judge: shard {task.index}: %(message)s"))
    logger = logging.getLogger("judge")
    logger.setLevel(task.log_level)
    logger.addHandler(handler)
    return handler
