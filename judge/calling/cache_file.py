"""The cache's SQLite file: its schema, opening it (WAL), upgrading a file an older judge
made, and the queries that read an answer. See judge/calling/cache.py for what is stored."""

from __future__ import annotations

import random
import sqlite3
import time
from pathlib import Path

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
# the table of aliases, and the table of whole queries' verdicts (judging/memo.py).
_READING_COLUMNS = ("reading_tag", "reading")
_ALIASES = "CREATE TABLE IF NOT EXISTS aliases (key TEXT PRIMARY KEY, target TEXT NOT NULL)"
_VERDICT_SETS = (
    "CREATE TABLE IF NOT EXISTS verdict_sets (key TEXT PRIMARY KEY, value BLOB NOT NULL)"
)
# Requests being asked now, by which cache (process, host) is asking (judge/calling/cache.py
# claim): another process wants the answer, not a second paid one.
_CLAIMS = (
    "CREATE TABLE IF NOT EXISTS claims (key TEXT PRIMARY KEY, owner TEXT NOT NULL, "
    "pid INTEGER NOT NULL, host TEXT NOT NULL, at REAL NOT NULL)"
)


def open_file(path: Path, wait_s: float = _BUSY_S) -> sqlite3.Connection:
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
            _check_ours(conn, path)
            conn.executescript(_SCHEMA)
            upgrade(conn)
            return conn
        except sqlite3.OperationalError as exc:
            conn.close()
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(random.uniform(0.005, 0.05))
        except BaseException:
            conn.close()
            raise


class NotACache(Exception):
    """A SQLite file of other tables (a run history, say), or a file that is not SQLite at all
    (a dataset given as the cache, say): not one to add a cache's tables to or move aside."""


_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file


def check_sqlite(path: Path) -> None:
    """NotACache when ``path`` is a non-empty file that does not begin as SQLite files do: a
    damaged cache still does (its pages after the first are what break), another file never.
    Nor is anything there that is not a regular file (a pipe would block the run, unread)."""
    if path.exists() and not path.is_file() and not path.is_dir():
        raise NotACache(f"{path}: not a regular file (a pipe or a device), so not a judge cache")
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(_HEADER))
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        return  # no file yet, or one SQLite reports on in its own words
    if head and head != _HEADER:
        raise NotACache(f"{path}: not a SQLite file, so not a judge cache (left as it is)")


def _check_ours(conn: sqlite3.Connection, path: Path) -> None:
    """A file with tables but no ``answers`` is someone else's database: refused, so neither
    the cache's tables are written into it nor is it moved aside as damaged."""
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if tables and "answers" not in tables:
        shown = ", ".join(sorted(tables)[:5])
        raise NotACache(f"{path}: not a judge cache (it holds other tables: {shown})")


def upgrade(conn: sqlite3.Connection) -> None:
    """Give a file made by an older judge the reading columns, the alias table, the table of
    verdict sets and the table of claims. Another process may be adding them at the same
    moment (then SQLite says they exist, which is as good); a read-only file keeps its schema
    and is read without them (see :func:`answer_queries`)."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(answers)")}
    steps = [f"ALTER TABLE answers ADD COLUMN {c} TEXT" for c in _READING_COLUMNS if c not in have]
    for step in [*steps, _ALIASES, _VERDICT_SETS, _CLAIMS]:
        try:
            conn.execute(step)
        except sqlite3.OperationalError as exc:
            if "duplicate column" not in str(exc) and "readonly" not in str(exc):
                raise


def answer_queries(conn: sqlite3.Connection) -> tuple[str, str]:
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


def damaged(exc: sqlite3.DatabaseError) -> bool:
    """Whether SQLite says the file itself is damaged (not: locked, full, read-only)."""
    text = str(exc).lower()
    return "malformed" in text or "not a database" in text or "corrupt" in text
