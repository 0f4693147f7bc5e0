"""Content-addressed cache of provider answers in SQLite (WAL mode).

An answer's key is :func:`judge.providers.base.request_key`: provider identity, model, rendered
messages, sampling params and the repeat index (DESIGN rule 3). Only answers that parsed into
verdicts are stored; errors and unparsed answers never are. Secrets never enter it.

An *alias* names an answer by a cheaper key: a first-round prompt's digest, known before the
prompt is rendered (:meth:`judge.calling.caller.Caller.key`), so a hit renders nothing. An alias
only ever points at a content-addressed answer; a digest that changes (another judge version)
costs a rendering and a lookup by the rendered request's key, never a paid call.

Beside an answer the cache may keep its *reading*: what the caller's parser made of it, with a
tag naming that parser, so a hit with the same tag parses nothing. A row without one (written
by an older judge) or with another tag is simply parsed again. The alias table and the reading
columns were added to the first schema: older files gain them when opened; an older judge
reads and writes the answers as it always did, and leaves the readings empty.

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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

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
# Added since the first schema: the parsed answer and the tag of the parser that read it,
# and the table of aliases.
_READING_COLUMNS = ("reading_tag", "reading")
_ALIASES = "CREATE TABLE IF NOT EXISTS aliases (key TEXT PRIMARY KEY, target TEXT NOT NULL)"


@dataclass(frozen=True)
class Reading:
    """What a parser made of a stored answer (``value``, JSON) and the parser's ``tag``."""

    tag: str
    value: str


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
            _upgrade(conn)
            return conn
        except sqlite3.OperationalError as exc:
            conn.close()
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(random.uniform(0.005, 0.05))
        except BaseException:
            conn.close()
            raise


def _upgrade(conn: sqlite3.Connection) -> None:
    """Give a file made by an older judge the reading columns and the alias table. Another
    process may be adding them at the same moment (then SQLite says they exist, which is as
    good); a read-only file keeps its schema and is read without them (see :func:`_queries`)."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(answers)")}
    steps = [f"ALTER TABLE answers ADD COLUMN {c} TEXT" for c in _READING_COLUMNS if c not in have]
    for step in [*steps, _ALIASES]:
        try:
            conn.execute(step)
        except sqlite3.OperationalError as exc:
            if "duplicate column" not in str(exc) and "readonly" not in str(exc):
                raise


def _queries(conn: sqlite3.Connection) -> tuple[str, str]:
    """The queries for an answer by key and by alias: (key, value, reading tag, reading), with
    NULLs for what a file without the newer columns or table lacks."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(answers)")}
    columns = ", ".join(f"a.{c}" if c in have else "NULL" for c in _READING_COLUMNS)
    by_key = f"SELECT a.key, a.value, {columns} FROM answers a WHERE a.key = ?"
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    by_alias = (
        f"SELECT a.key, a.value, {columns} FROM aliases x JOIN answers a ON a.key = x.target "
        "WHERE x.key = ?"
        if "aliases" in tables
        else "SELECT NULL, NULL, NULL, NULL WHERE 0 AND ? IS NULL"
    )
    return by_key, by_alias


@dataclass(frozen=True)
class Stored(Generic[T]):
    """An answer as stored: its value, its reading (None: none, or an older judge's row) and
    the key it is stored under."""

    value: T
    reading: Reading | None
    key: str


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
        self._sql: tuple[str, str] | None = None  # made on first use, again after a recovery
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
        self._sql = None

    @property
    def enabled(self) -> bool:
        return self._conn is not None

    def get(self, key: str, model: type[T]) -> T | None:
        found = self.get_stored(key, model)
        return None if found is None else found.value

    def get_stored(self, key: str, model: type[T], *, alias: bool = False) -> Stored[T] | None:
        """The answer stored under ``key`` (``alias``: under the answer ``key`` names), or None
        when there is no usable one."""
        if self._conn is None:
            return None
        with self._lock:
            try:
                if self._sql is None:
                    self._sql = _queries(self._conn)
                row = self._conn.execute(self._sql[alias], (key,)).fetchone()
            except sqlite3.DatabaseError as exc:
                self._recover(exc)
                row = None
        found = None if row is None else self._stored(row, model)
        self.hits += found is not None
        self.misses += found is None
        return found

    def _stored(self, row: Any, model: type[T]) -> Stored[T] | None:
        """A row (key, value, reading tag, reading) as stored; None if unreadable as ``model``
        (written by another version of judge: asked again and overwritten rather than fail)."""
        try:
            value = model.model_validate_json(row[1])
        except ValidationError:
            log.warning("%s: unreadable cache entry %s treated as a miss", self.path, row[0][:12])
            return None
        reading = Reading(row[2], row[3]) if row[2] is not None and row[3] is not None else None
        return Stored(value, reading, row[0])

    def get_stored_many(self, aliases: Sequence[str], model: type[T]) -> dict[str, Stored[T]]:
        """:meth:`get_stored` by alias for each of ``aliases``, in one query (a cached re-run
        looks up a query's passages together); the aliases that name no usable answer are
        left out."""
        if self._conn is None or not aliases:
            return {}
        with self._lock:
            try:
                if self._sql is None:
                    self._sql = _queries(self._conn)
                if " aliases x " not in self._sql[1]:
                    return {}
                sql = (
                    self._sql[1]
                    .replace("SELECT ", "SELECT x.key, ", 1)
                    .replace("x.key = ?", f"x.key IN ({', '.join('?' * len(aliases))})")
                )
                rows = self._conn.execute(sql, tuple(aliases)).fetchall()
            except sqlite3.DatabaseError as exc:
                self._recover(exc)
                rows = []
        stored = {row[0]: self._stored(row[1:], model) for row in rows}
        found = {alias: hit for alias, hit in stored.items() if hit is not None}
        self.hits += len(found)  # a miss is counted where the caller looks further
        return found

    def contains(self, key: str, *, alias: bool = False) -> bool:
        """Whether an answer is stored under ``key`` (``alias``: named by it)."""
        if self._conn is None:
            return False
        with self._lock:
            try:
                if self._sql is None:
                    self._sql = _queries(self._conn)
                row = self._conn.execute(self._sql[alias], (key,)).fetchone()
            except sqlite3.DatabaseError as exc:
                self._recover(exc)
                row = None
        return row is not None

    def put(
        self,
        key: str,
        value: BaseModel,
        *,
        kind: str,
        model: str,
        reading: Reading | None = None,
        alias: str | None = None,
    ) -> None:
        """Store ``value`` under ``key`` (and its ``reading``), named by ``alias`` too."""
        if self._conn is None:
            return
        blob = value.model_dump_json()
        tag, read = (reading.tag, reading.value) if reading is not None else (None, None)
        row = (key, kind, model, blob, time.time(), tag, read)
        sql = (
            "INSERT OR REPLACE INTO answers(key, kind, model, value, created, reading_tag, reading)"
            " VALUES (?,?,?,?,?,?,?)"
        )
        self._write(sql, row)
        if alias is not None:
            self.add_alias(alias, key)

    def add_alias(self, alias: str, key: str) -> None:
        """Name the answer stored under ``key`` by ``alias`` too."""
        if self._conn is not None:
            self._write("INSERT OR REPLACE INTO aliases(key, target) VALUES (?,?)", (alias, key))

    def set_reading(self, key: str, reading: Reading) -> None:
        """Keep ``reading`` beside the answer already stored under ``key``."""
        if self._conn is None:
            return
        sql = "UPDATE answers SET reading_tag = ?, reading = ? WHERE key = ?"
        self._write(sql, (reading.tag, reading.value, key))

    def _write(self, sql: str, row: tuple[object, ...]) -> None:
        assert self._conn is not None
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
            self._conn.execute("DELETE FROM aliases WHERE target NOT IN (SELECT key FROM answers)")
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
