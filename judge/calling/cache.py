"""Content-addressed cache of provider answers in SQLite (WAL mode).

The key is :func:`judge.providers.base.request_key`: provider identity, model, rendered
messages, sampling params and the repeat index (DESIGN rule 3). Only answers that parsed
into verdicts are stored; errors and unparsed answers never are. Secrets never enter it.

One connection per process, guarded by a lock, serves every task of that process; WAL and
a busy timeout let two processes share the file. Each ``put`` commits at once, so a killed
run loses only the calls that were in flight.

A damaged file (not a database, or a malformed page met on any read or write) is moved aside
as ``<name>.corrupt-<time>`` with a warning, and the run goes on with a fresh cache: a cache
only saves money, so losing it must not stop a run. ``judge cache check`` reports on a file.
"""

from __future__ import annotations

import logging
import random
import sqlite3
import threading
import time
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from judge.config import RunConfig
from judge.errors import CacheError
from judge.schema import Record

T = TypeVar("T", bound=BaseModel)
log = logging.getLogger(__name__)
_BUSY_S = 30.0  # how long a writer waits for another process's lock before failing

_SCHEMA = """
CREATE TABLE IF NOT EXISTS answers (
    key TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    model TEXT NOT NULL,
    value TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS answers_created ON answers(created);
"""


class CacheStats(Record):
    path: str
    entries: int
    bytes: int
    by_model: dict[str, int]
    oldest: float | None
    newest: float | None


def _open(path: Path, wait_s: float = _BUSY_S) -> sqlite3.Connection:
    """A connection in WAL mode with the schema in place.

    Switching a new file to WAL does not wait for a busy lock as other statements do, so two
    runs starting at once on a fresh cache would fail with "database is locked": retried here.
    """
    deadline = time.monotonic() + wait_s
    while True:
        conn = sqlite3.connect(path, timeout=wait_s, check_same_thread=False, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout={int(wait_s * 1000)}")
            if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
            return conn
        except sqlite3.OperationalError as exc:
            conn.close()
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(random.uniform(0.005, 0.05))
        except BaseException:
            conn.close()
            raise


class Cache:
    """A small key -> JSON record store; ``Cache(None)`` is a disabled cache."""

    def __init__(self, path: str | Path | None, *, recover: bool = True) -> None:
        """``recover``: move a damaged file aside and start afresh (False: CacheError)."""
        self.path = Path(path) if path is not None else None
        self.recover = recover
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self.hits = 0
        self.misses = 0
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                self._conn = _open(self.path)
            except sqlite3.DatabaseError as exc:
                if not (_damaged(exc) and recover):
                    raise
                self._move_aside(exc)
                self._conn = _open(self.path)
        except (sqlite3.Error, OSError) as exc:
            raise CacheError(f"{self.path}: cannot open cache: {exc}") from None

    def _move_aside(self, exc: BaseException) -> None:
        """Rename the damaged file (and its WAL files) out of the way, saying where."""
        assert self.path is not None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        for suffix in ("", "-wal", "-shm"):
            part = self.path.with_name(self.path.name + suffix)
            if part.exists():
                part.replace(aside.with_name(aside.name + suffix))
        log.warning(
            "%s: the cache file is damaged (%s); moved aside to %s, continuing with a new cache",
            self.path,
            exc,
            aside,
        )

    def _recover(self, exc: sqlite3.DatabaseError) -> None:
        """A read or write met a damaged page: start over with a fresh file."""
        if not (_damaged(exc) and self.recover):
            raise CacheError(f"{self.path}: {exc}") from None
        self._move_aside(exc)
        assert self.path is not None
        self._conn = _open(self.path)

    @property
    def enabled(self) -> bool:
        return self._conn is not None

    def get(self, key: str, model: type[T]) -> T | None:
        if self._conn is None:
            return None
        with self._lock:
            try:
                row = self._conn.execute(
                    "SELECT value FROM answers WHERE key = ?", (key,)
                ).fetchone()
            except sqlite3.DatabaseError as exc:
                self._recover(exc)
                row = None
        if row is None:
            self.misses += 1
            return None
        try:
            value = model.model_validate_json(row[0])
        except ValidationError:
            # Written by another version of judge: ask again (and overwrite) rather than fail.
            log.warning("%s: unreadable cache entry %s treated as a miss", self.path, key[:12])
            self.misses += 1
            return None
        self.hits += 1
        return value

    def contains(self, key: str) -> bool:
        if self._conn is None:
            return False
        with self._lock:
            try:
                row = self._conn.execute("SELECT 1 FROM answers WHERE key = ?", (key,)).fetchone()
            except sqlite3.DatabaseError as exc:
                self._recover(exc)
                row = None
        return row is not None

    def put(self, key: str, value: BaseModel, *, kind: str, model: str) -> None:
        if self._conn is None:
            return
        blob = value.model_dump_json()
        row = (key, kind, model, blob, time.time())
        sql = "INSERT OR REPLACE INTO answers(key, kind, model, value, created) VALUES (?,?,?,?,?)"
        with self._lock:
            try:
                self._conn.execute(sql, row)
            except sqlite3.DatabaseError as exc:
                if type(exc) is not sqlite3.DatabaseError and not _damaged(exc):
                    raise CacheError(f"{self.path}: cannot write cache: {exc}") from None
                self._recover(exc)
                assert self._conn is not None
                self._conn.execute(sql, row)

    def stats(self) -> CacheStats:
        if self._conn is None or self.path is None:
            raise CacheError("the cache is disabled")
        with self._lock:
            entries, oldest, newest = self._conn.execute(
                "SELECT count(*), min(created), max(created) FROM answers"
            ).fetchone()
            by_model = dict(
                self._conn.execute("SELECT model, count(*) FROM answers GROUP BY model").fetchall()
            )
        size = sum(p.stat().st_size for p in self.path.parent.glob(self.path.name + "*"))
        return CacheStats(
            path=str(self.path),
            entries=entries,
            bytes=size,
            by_model=by_model,
            oldest=oldest,
            newest=newest,
        )

    def check(self) -> list[str]:
        """SQLite's integrity check: [] when the file is sound, else what is wrong."""
        if self._conn is None:
            raise CacheError("the cache is disabled")
        with self._lock:
            try:
                rows = self._conn.execute("PRAGMA integrity_check").fetchall()
            except sqlite3.DatabaseError as exc:
                return [str(exc)]
        found = [str(r[0]) for r in rows]
        return [] if found == ["ok"] else found

    def clear(self) -> int:
        return self._delete("DELETE FROM answers", ())

    def prune(self, older_than_days: float) -> int:
        cutoff = time.time() - older_than_days * 86400.0
        return self._delete("DELETE FROM answers WHERE created < ?", (cutoff,))

    def _delete(self, sql: str, args: tuple[float, ...] | tuple[()]) -> int:
        if self._conn is None:
            raise CacheError("the cache is disabled")
        with self._lock:
            count = self._conn.execute(sql, args).rowcount
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._conn.execute("VACUUM")
        return int(count)

    def close(self) -> None:
        if self._conn is not None:
            with self._lock:
                self._conn.close()
            self._conn = None


def _damaged(exc: sqlite3.DatabaseError) -> bool:
    """Whether SQLite says the file itself is damaged (not: locked, full, read-only)."""
    text = str(exc).lower()
    return "malformed" in text or "not a database" in text or "corrupt" in text


def open_cache(where: RunConfig | str | Path | None) -> Cache:
    """The cache a config names ([run] cache, else the user cache dir), or the one at a path;
    None: a disabled cache. Every part of judge opens its cache here."""
    if isinstance(where, RunConfig):
        where = where.cache_path()
    return Cache(where)
