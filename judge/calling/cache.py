"""Content-addressed cache of provider answers in SQLite (WAL mode).

An answer's key is :func:`judge.providers.base.request_key`: provider identity, model, rendered
messages, sampling params and the repeat index (DESIGN rule 3). Every paid answer is stored,
one its parser could not read with its error (:data:`UNREAD`); errors never are. Secrets never
enter it.

An *alias* names an answer by a cheaper key: a first-round prompt's digest, known before the
prompt is rendered (:meth:`judge.calling.caller.Caller.key`), so a hit renders nothing. An alias
only ever points at a content-addressed answer; a digest that changes (another judge version)
costs a rendering and a lookup by the rendered request's key, never a paid call.

Beside an answer the cache may keep its *reading*: what the caller's parser made of it, with a
tag naming that parser, so a hit with the same tag parses nothing. A row without one (written
by an older judge) or with another tag is simply parsed again. The alias table and the reading
columns were added to the first schema: older files gain them when opened; an older judge
reads and writes the answers as it always did, and leaves the readings empty.

A *verdict set* is a whole query's verdicts, read from answers stored here
(:mod:`judge.judging.memo`), so a cached re-run reads one row per query. It is an index, never
the only copy of anything: a set that cannot be stored is skipped, and clearing or pruning
the cache (which also drops sets older judge versions left), or replacing an answer under its
key, drops every set.

One connection per process, guarded by a lock, serves every task of that process; WAL and
a busy timeout let two processes share the file. Each ``put`` commits at once, so a killed
run loses only the calls that were in flight. A request is *claimed* before it is sent
(:meth:`Cache.claim`): another process (or another Judge) that needs the same answer while it
is asked waits for it instead of paying for it again; ``put`` lets the claim go, and a claim
whose process is gone (or older than :data:`CLAIM_STALE_S`) is taken over.

A damaged file (not a database, or a malformed page met on any read or write) is moved aside
as ``<name>.corrupt-<time>`` with one warning line (how many entries, where), and the run goes
on with a fresh cache: a cache only saves money, so losing it must not stop a run. Entries
that do not read (another version's, or damaged) are misses, overwritten when asked again, and
counted in one line when the cache closes. ``judge cache check`` reports on a file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from judge.calling.cache_file import (
    NotACache,
    answer_queries,
    check_sqlite,
    damaged,
    open_file,
)
from judge.config import RunConfig
from judge.errors import CacheError
from judge.schema import Record

T = TypeVar("T", bound=BaseModel)

# A reading's tag when the parser could not read the answer: the parser's own tag after it,
# the error as the value. Such an answer is paid too, so it is kept: a run stopped before its
# re-ask, resumed, reads it again instead of paying for it again (--redo unparsed asks anew).
UNREAD = "unread:"
_ALIAS = "INSERT OR REPLACE INTO aliases(key, target) VALUES (?,?)"
# Before an answer is stored: every verdict set goes when it replaces one (sets are read from
# the answers; an old one's set is stale).
_STALE_SETS = "DELETE FROM verdict_sets WHERE EXISTS (SELECT 1 FROM answers WHERE key = ?)"
# A claim is taken only while no answer is stored under its key (or named by it): one stored
# by another process between this one's look in the cache and its claim is read, not paid.
_CLAIM = (
    "INSERT OR IGNORE INTO claims(key, owner, pid, host, at) SELECT ?,?,?,?,? "
    "WHERE NOT EXISTS (SELECT 1 FROM answers WHERE key = ?1) "
    "AND NOT EXISTS (SELECT 1 FROM aliases WHERE key = ?1)"
)
_UNCLAIM = "DELETE FROM claims WHERE key IN (?, ?) AND owner = ?"
# A claim older than this is taken over whoever holds it (another machine's, on a shared disk,
# whose process cannot be looked up): no request is asked for so long.
CLAIM_STALE_S = 900.0
_HOST = socket.gethostname()
log = logging.getLogger(__name__)


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
    verdict_sets: int = 0  # whole queries' verdicts (judging/memo.py)


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
        # Keys of entries this version could not read (another version's, or damaged), and
        # how many of them were overwritten by an answer asked again: one line at close.
        self._unreadable: set[str] = set()
        self._overwritten = 0
        self._sql: tuple[str, str] | None = None  # made on first use, again after a recovery
        # This cache's name in the claims table, and the keys it holds claims on.
        self._owner, self._claimed = uuid.uuid4().hex, set[str]()
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            check_sqlite(self.path)
            try:
                self._conn = open_file(self.path)
            except sqlite3.DatabaseError as exc:
                if not (damaged(exc) and recover):
                    raise
                self._move_aside(exc)
                self._conn = open_file(self.path)
        except NotACache as exc:
            raise CacheError(f"{exc}: refused as a cache (is run.cache another file?)") from None
        except (sqlite3.Error, OSError) as exc:
            raise CacheError(f"{self.path}: cannot open cache: {exc}") from None

    def _move_aside(self, exc: BaseException) -> None:
        """Rename the damaged file (and its WAL files) out of the way, saying where."""
        assert self.path is not None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        entries = self._count_entries()
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        for suffix in ("", "-wal", "-shm"):
            part = self.path.with_name(self.path.name + suffix)
            if part.exists():
                part.replace(aside.with_name(aside.name + suffix))
        what = "its entries" if entries is None else f"its {entries} entries"
        log.warning(
            "%s: the cache file is damaged (%s); moved aside with %s to %s (none of them reused), "
            "continuing with a new cache",
            self.path,
            exc,
            what,
            aside,
        )
        self._unreadable.clear()  # rows of the file just moved aside
        self._overwritten = 0

    def _count_entries(self) -> int | None:
        """The answers in the open file, when a damaged file still counts them; else None."""
        if self._conn is None:
            return None
        try:
            return int(self._conn.execute("SELECT count(*) FROM answers").fetchone()[0])
        except sqlite3.Error:
            return None

    def _recover(self, exc: sqlite3.DatabaseError) -> None:
        """A read or write met a damaged page: start over with a fresh file."""
        if not (damaged(exc) and self.recover):
            hint = " (the file is damaged: a run moves it aside and asks its answers again)"
            raise CacheError(f"{self.path}: {exc}{hint if damaged(exc) else ''}") from None
        self._move_aside(exc)
        assert self.path is not None
        self._conn = open_file(self.path)
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
        row = self._answer_row(key, alias)
        found = None if row is None else self._stored(row, model)
        self.hits += found is not None
        self.misses += found is None
        return found

    def _answer_row(self, key: str, alias: bool) -> Any:
        """The row (key, value, reading tag, reading) of the answer stored under ``key``
        (``alias``: named by it), or None."""
        assert self._conn is not None
        with self._lock:
            try:
                if self._sql is None:
                    self._sql = answer_queries(self._conn)
                return self._conn.execute(self._sql[alias], (key,)).fetchone()
            except sqlite3.DatabaseError as exc:
                self._recover(exc)
                return None

    def _stored(self, row: Any, model: type[T]) -> Stored[T] | None:
        """A row (key, value, reading tag, reading) as stored; None if unreadable as ``model``
        (written by another version of judge: asked again and overwritten rather than fail)."""
        try:
            value = model.model_validate_json(row[1])
        except ValidationError:
            self._unreadable.add(row[0])  # said in one line when the cache closes
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
                    self._sql = answer_queries(self._conn)
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

    def get_verdict_set(self, key: str) -> bytes | None:
        """The verdicts of a whole query stored under ``key`` (judging/memo.py), or None."""
        if self._conn is None:
            return None
        with self._lock:
            try:
                row = self._conn.execute(
                    "SELECT value FROM verdict_sets WHERE key = ?", (key,)
                ).fetchone()
            except sqlite3.OperationalError:  # a read-only file from before the table
                return None
            except sqlite3.DatabaseError as exc:
                self._recover(exc)
                return None
        return row[0] if row is not None and isinstance(row[0], bytes) else None

    def put_verdict_set(self, key: str, value: bytes) -> None:
        """Store a whole query's verdicts under ``key``: an index over answers already stored,
        so a failure to write it (a read-only file) loses nothing and is not an error."""
        if self._conn is None:
            return
        try:
            sql = "INSERT OR REPLACE INTO verdict_sets(key, value) VALUES (?,?)"
            self._write((sql, (key, value)))
        except CacheError as exc:
            log.debug("%s: verdict set not stored: %s", self.path, exc)

    def contains(self, key: str, *, alias: bool = False, unread: bool = True) -> bool:
        """Whether an answer is stored under ``key`` (``alias``: named by it); ``unread``
        False: one its parser could not read does not count (--redo unparsed asks it anew)."""
        if self._conn is None:
            return False
        row = self._answer_row(key, alias)
        return row is not None and (unread or not str(row[2] or "").startswith(UNREAD))

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
        # Another answer under this key: a set read from the old one is stale. One commit for
        # the answer, that, and its alias (a put costs about a commit, not three statements').
        statements = [(_STALE_SETS, (key,)), (sql, row)]
        if alias is not None:
            statements.append((_ALIAS, (alias, key)))
        named = {key, alias or key}
        if named & self._claimed:  # asked under a claim: it goes with the answer, at once
            statements.append((_UNCLAIM, (key, alias or key, self._owner)))
        self._write(*statements)
        self._claimed -= named
        if key in self._unreadable:
            self._unreadable.discard(key)
            self._overwritten += 1

    def claim(self, key: str) -> bool | None:
        """Whether this cache may ask for the answer under ``key`` now: True once it holds the
        claim on it (taken now, already its own, or taken over from a process that is gone),
        and always when claims cannot be kept (no file, a read-only one); False while another
        live process, or another cache in this one, is asking for it; None when an answer is
        stored under it (another process's, stored since the caller looked: it looks again;
        one it cannot use, it asks for unclaimed). Claims only spare money: one that cannot be
        written never stops a request."""
        if self._conn is None:
            return True
        with self._lock:
            try:
                row = (key, self._owner, os.getpid(), _HOST, time.time())
                if self._conn.execute(_CLAIM, row).rowcount == 1:
                    self._claimed.add(key)
                    return True
                held = self._conn.execute(
                    "SELECT owner, pid, host, at FROM claims WHERE key = ?", (key,)
                ).fetchone()
                if held is None:  # an answer is stored: the caller looks again
                    return None
                if held[0] != self._owner and _alive(*held[1:]):
                    return False
                taken = self._conn.execute(
                    "UPDATE claims SET owner = ?, pid = ?, host = ?, at = ? "
                    "WHERE key = ? AND owner = ?",
                    (*row[1:], key, held[0]),
                )
            except sqlite3.Error:
                return True
            if taken.rowcount == 1:
                self._claimed.add(key)
            return bool(taken.rowcount == 1)

    def release(self, key: str) -> None:
        """Let the claim on ``key`` go without an answer (the request failed, or its answer
        was not one to keep): another process may ask now."""
        if self._conn is None or key not in self._claimed:
            return
        self._claimed.discard(key)
        with self._lock, contextlib.suppress(sqlite3.Error):
            self._conn.execute(_UNCLAIM, (key, key, self._owner))

    def add_alias(self, alias: str, key: str) -> None:
        """Name the answer stored under ``key`` by ``alias`` too."""
        if self._conn is not None:
            self._write((_ALIAS, (alias, key)))

    def set_reading(self, key: str, reading: Reading) -> None:
        """Keep ``reading`` beside the answer already stored under ``key``."""
        if self._conn is None:
            return
        sql = "UPDATE answers SET reading_tag = ?, reading = ? WHERE key = ?"
        self._write((sql, (reading.tag, reading.value, key)))

    def _write(self, *statements: tuple[str, tuple[object, ...]]) -> None:
        """Run ``statements`` as one transaction: committed together, at once."""
        assert self._conn is not None
        with self._lock:
            try:
                self._commit(statements)
            except sqlite3.DatabaseError as exc:
                if type(exc) is not sqlite3.DatabaseError and not damaged(exc):
                    raise CacheError(f"{self.path}: cannot write cache: {exc}") from None
                self._recover(exc)
                self._commit(statements)

    def _commit(self, statements: Sequence[tuple[str, tuple[object, ...]]]) -> None:
        conn = self._conn
        assert conn is not None
        if len(statements) == 1:
            conn.execute(*statements[0])
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            for sql, row in statements:
                conn.execute(sql, row)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise

    def stats(self) -> CacheStats:
        if self._conn is None or self.path is None:
            raise CacheError("the cache is disabled")
        with self._lock, self._said():
            entries, oldest, newest = self._conn.execute(
                "SELECT count(*), min(created), max(created) FROM answers"
            ).fetchone()
            by_model = dict(
                self._conn.execute("SELECT model, count(*) FROM answers GROUP BY model").fetchall()
            )
            try:
                sets = self._conn.execute("SELECT count(*) FROM verdict_sets").fetchone()[0]
            except sqlite3.OperationalError:  # a read-only file from before the table
                sets = 0
        size = sum(p.stat().st_size for p in self.path.parent.glob(self.path.name + "*"))
        return CacheStats(
            path=str(self.path),
            entries=entries,
            bytes=size,
            by_model=by_model,
            oldest=oldest,
            newest=newest,
            verdict_sets=sets,
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
        """Remove every answer (a file with damaged pages is moved aside instead, as a run
        would: nothing of it is read again)."""
        try:
            return self._delete("DELETE FROM answers", ())
        except sqlite3.DatabaseError as exc:
            self._recover(exc)  # a CacheError unless damaged and this cache may recover
            return 0

    def prune(self, older_than_days: float) -> int:
        cutoff = time.time() - older_than_days * 86400.0
        with self._said():
            return self._delete("DELETE FROM answers WHERE created < ?", (cutoff,))

    def _delete(self, sql: str, args: tuple[float, ...] | tuple[()]) -> int:
        if self._conn is None:
            raise CacheError("the cache is disabled")
        with self._lock:
            count = self._conn.execute(sql, args).rowcount
            self._conn.execute("DELETE FROM aliases WHERE target NOT IN (SELECT key FROM answers)")
            # Sets of verdicts are read from answers (any answer gone may be one of theirs), and
            # each judge version keys its own: a clear or prune drops them all, and the next
            # cached re-run stores its sets again.
            self._conn.execute("DELETE FROM verdict_sets")
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._conn.execute("VACUUM")
        return int(count)

    @contextlib.contextmanager
    def _said(self) -> Iterator[None]:
        """A SQLite error of stats, clear or prune as one CacheError naming the file."""
        try:
            yield
        except sqlite3.Error as exc:
            raise CacheError(f"{self.path}: {exc}") from None

    @property
    def unreadable(self) -> int:
        """Entries met that this version could not read (another version's, or damaged)."""
        return len(self._unreadable) + self._overwritten

    def close(self) -> None:
        """Close the file, after one line on the entries it could not read, if any."""
        if self.unreadable:
            left = len(self._unreadable)
            log.warning(
                "%s: %d cache entries could not be read (another judge version's, or damaged) "
                "and were treated as misses: %d asked again and overwritten in place, %d left "
                "in place as they were; none moved",
                self.path,
                self.unreadable,
                self._overwritten,
                left,
            )
            self._unreadable.clear()
            self._overwritten = 0
        if self._conn is not None:
            with self._lock:
                self._conn.close()
            self._conn = None


def _alive(pid: int, host: str, at: float) -> bool:
    """Whether the process that claimed a request may still be asking for it: on this
    machine, while its process lives; anywhere, for :data:`CLAIM_STALE_S`."""
    if time.time() - at > CLAIM_STALE_S:
        return False
    if host != _HOST:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: it lives
        return True
    return True


def open_cache(where: RunConfig | str | Path | None) -> Cache:
    """The cache a config names ([run] cache, else the user cache dir), or the one at a path;
    None: a disabled cache. Every part of judge opens its cache here."""
    if isinstance(where, RunConfig):
        where = where.cache_path()
    return Cache(where)
