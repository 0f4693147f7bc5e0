"""A sharded run's files (judge/run/shards.py): each shard's directory under
``<run dir>/shards/<k>/``, seeded from the run's results before its shard starts and folded back
into the run directory after.

Folding is the only way back, at the end of every invocation and first thing in the next one
(what a killed driver or worker left): the shard's answers merged into the user's cache, its
nugget sets into the run's, its results appended to the run's (fsynced), then its directory
removed. Each step can be repeated, so a fold that is itself killed is finished by the next: a
results line appended twice is dropped when the results are compacted to one line per unit,
the last written (a shard's newer line supersedes the run's older one for the same unit).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from pydantic import BaseModel, ConfigDict, ValidationError

from judge.calling.cache import open_cache
from judge.data.nuggets import NUGGETS_FILE, read_nuggets, write_nuggets
from judge.data.results import RESULTS_FILE, compact_results, unit_statuses
from judge.errors import CacheError, ConfigError
from judge.run.resume import repair_results, run_lock
from judge.schema import Query

__all__ = [
    "SHARDS_DIR",
    "SHARD_CACHE",
    "SHARD_FILE",
    "fold_shards",
    "merge_cache",
    "seed_shards",
    "shard_dir",
    "write_shard_record",
]

log = logging.getLogger(__name__)

SHARDS_DIR = "shards"
SHARD_CACHE = "cache.sqlite"
SHARD_FILE = "shard.json"  # where the shard runs (host, pid): for people, and kill tests

_COLUMNS = "key, kind, model, value, created, reading_tag, reading"


class _Id(BaseModel):
    model_config = ConfigDict(extra="ignore")
    query_id: str


class _Line(BaseModel):
    """The part of a results line that names its query."""

    model_config = ConfigDict(extra="ignore")
    query: _Id


def shard_dir(out_dir: Path, index: int) -> Path:
    return out_dir / SHARDS_DIR / str(index)


def write_shard_record(directory: Path, record: dict[str, object]) -> None:
    """``shard.json``: which host and process judge this shard (replaced atomically)."""
    tmp = directory / f".{SHARD_FILE}.tmp"
    tmp.write_text(json.dumps(record, indent=2), encoding="utf-8")
    os.replace(tmp, directory / SHARD_FILE)


def seed_shards(out_dir: Path, plan: Sequence[Sequence[Query]]) -> list[Path]:
    """Each shard's directory, holding the run's results lines and nugget sets for its queries:
    a unit the run finished is not judged again, and a query keeps the nugget set it has."""
    owner = {q.query_id: k for k, rows in enumerate(plan) for q in rows}
    dirs = [shard_dir(out_dir, k) for k in range(len(plan))]
    for k, rows in enumerate(plan):
        if rows:
            dirs[k].mkdir(parents=True, exist_ok=True)
    results = out_dir / RESULTS_FILE
    if results.exists() and owner:
        with contextlib.ExitStack() as stack, open(results, "rb") as lines:
            files: dict[int, BinaryIO] = {}
            for line in lines:
                try:
                    query_id = _Line.model_validate_json(line).query.query_id
                except ValidationError:
                    continue  # unit_statuses has reported it; it is no unit of any shard
                shard = owner.get(query_id)
                if shard is None:
                    continue
                if shard not in files:
                    files[shard] = stack.enter_context(open(dirs[shard] / RESULTS_FILE, "wb"))
                files[shard].write(line)
            for fh in files.values():
                fh.flush()
                os.fsync(fh.fileno())
    nuggets = out_dir / NUGGETS_FILE
    if nuggets.exists():
        sets = read_nuggets(nuggets)
        for k, rows in enumerate(plan):
            mine = [sets[qid] for qid in dict.fromkeys(q.query_id for q in rows) if qid in sets]
            if mine:
                write_nuggets(dirs[k] / NUGGETS_FILE, mine)
    return dirs


def fold_shards(out_dir: Path, user_cache: Path, *, strict: bool = True) -> int:
    """Every shard directory back into the run directory (the module docstring); returns how
    many were folded. A shard a live worker still holds is refused (``strict``: ConfigError)
    or left for the next run with a warning."""
    root = out_dir / SHARDS_DIR
    if not root.is_dir():
        return 0
    results = out_dir / RESULTS_FILE
    repair_results(results)
    folded = 0
    for directory in sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.name):
        try:
            with run_lock(directory):
                _fold(directory, out_dir, user_cache)
        except ConfigError:
            if strict:
                raise ConfigError(
                    f"{directory}: a worker of an earlier run is still judging this shard "
                    f"(see its {SHARD_FILE}); wait for it to end, then rerun"
                ) from None
            log.warning("%s: still being written by its worker; the next run folds it", directory)
            continue
        shutil.rmtree(directory)
        folded += 1
    with contextlib.suppress(OSError):
        root.rmdir()  # left when a shard could not be folded
    if folded and results.exists():
        units, lines = unit_statuses(results)
        if lines > len(units):
            compact_results(results)
    return folded


def _fold(directory: Path, out_dir: Path, user_cache: Path) -> None:
    cache = directory / SHARD_CACHE
    if cache.exists():
        merge_cache(cache, user_cache)
    sets = directory / NUGGETS_FILE
    if sets.exists():
        run_sets = out_dir / NUGGETS_FILE
        known = read_nuggets(run_sets) if run_sets.exists() else {}
        write_nuggets(run_sets, {**known, **read_nuggets(sets)}.values())
    lines = directory / RESULTS_FILE
    if lines.exists():
        repair_results(lines)  # a worker killed mid-write leaves a partial last line
        with open(lines, "rb") as src, open(out_dir / RESULTS_FILE, "ab") as dst:
            shutil.copyfileobj(src, dst)
            dst.flush()
            os.fsync(dst.fileno())


def merge_cache(source: Path, target: Path) -> int:
    """Every answer and alias in the cache file ``source`` copied into ``target`` in one
    transaction; returns the answers copied. SQL across both files rather than the Cache API,
    which stores one answer per commit: a shard's answers are many."""
    for path in (target, source):
        open_cache(path).close()  # both in the current schema (reading columns, aliases)
    try:
        conn = sqlite3.connect(target, timeout=30.0, isolation_level=None)
        try:
            conn.execute("ATTACH DATABASE ? AS shard", (str(source),))
            conn.execute("BEGIN IMMEDIATE")
            copied = conn.execute(
                f"INSERT OR REPLACE INTO main.answers({_COLUMNS}) "
                f"SELECT {_COLUMNS} FROM shard.answers"
            ).rowcount
            conn.execute(
                "INSERT OR REPLACE INTO main.aliases(key, target) "
                "SELECT key, target FROM shard.aliases"
            )
            conn.execute("COMMIT")
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise CacheError(f"{target}: cannot merge the shard cache {source}: {exc}") from None
    return int(copied)
