"""Run history: one SQLite file (WAL) that remembers each run's counts and metric means.

``runs`` holds one row per recorded run (when, which config and dataset, counts);
``run_metrics`` one row per (run, engine, metric) with the mean and its CI. A nightly job
records every run, the report draws the trend, and :func:`regressions` flags a run whose
metric mean fell by more than ``[thresholds] max_drop[metric]`` (an absolute drop, as in the
baseline check) below the previous run that has a value for the same engine and metric; for a
lower-is-better metric (``near_dup``, ``low_quality``) a rise of more than that is flagged.
Reading never creates the file: no history yet is an empty list.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from judge.errors import CacheError
from judge.metrics.facts import lower_is_better
from judge.schema import Record

if TYPE_CHECKING:
    from judge.report.summary import Summary

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created TEXT NOT NULL,
    recorded TEXT NOT NULL,
    config_source TEXT,
    dataset TEXT,
    out_dir TEXT NOT NULL,
    queries INTEGER NOT NULL,
    repeats INTEGER NOT NULL,
    verdicts INTEGER NOT NULL,
    ok INTEGER NOT NULL,
    unparsed INTEGER NOT NULL,
    error INTEGER NOT NULL,
    cost_usd REAL
);
CREATE TABLE IF NOT EXISTS run_metrics (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    engine TEXT NOT NULL,
    metric TEXT NOT NULL,
    mean REAL,
    ci_low REAL,
    ci_high REAL,
    PRIMARY KEY (run_id, engine, metric)
);
"""


# What a run history's runs table holds, by which another program's table is told apart.
_RUNS_COLUMNS = frozenset({"id", "created", "recorded", "out_dir", "queries", "verdicts"})


class HistoryRun(Record):
    """One recorded run; ``metrics[engine][metric]`` is the mean (None = undefined)."""

    run_id: int
    created: str
    config_source: str | None
    dataset: str | None
    out_dir: str
    queries: int
    repeats: int
    verdicts: int
    ok: int
    unparsed: int
    error: int
    cost_usd: float | None
    metrics: dict[str, dict[str, float | None]]


class TrendPoint(Record):
    run_id: int
    created: str
    value: float | None


class Regression(Record):
    """``previous - current > max_drop`` between run ``previous_run`` and run ``run_id``
    (``current - previous`` for a lower-is-better metric: ``drop`` is how much worse)."""

    run_id: int
    previous_run: int
    engine: str
    metric: str
    previous: float
    current: float
    drop: float
    max_drop: float

    def describe(self) -> str:
        moved = "rose" if lower_is_better(self.metric) else "fell"
        return (
            f"{self.engine} {self.metric} {moved} {self.drop:.4f} (run {self.previous_run} "
            f"{self.previous:.4f} -> run {self.run_id} {self.current:.4f}; max {self.max_drop})"
        )


class HistoryRow(Record):
    """What the report draws for one run: its means and the regressions it is flagged for."""

    run_id: int
    created: str
    values: dict[str, dict[str, float | None]]
    regressions: tuple[Regression, ...] = ()
    dataset: str | None = None  # the file it judged (a nightly one is often new each night)


@contextmanager
def _connect(
    path: str | Path, *, create: bool, wait_s: float = 30.0
) -> Iterator[sqlite3.Connection]:
    """The history open (``create``: its tables made), waiting ``wait_s`` for a writer's lock;
    a SQLite error is a CacheError naming the file, a lock said as one."""
    target = Path(path)
    if create:
        target.parent.mkdir(parents=True, exist_ok=True)
    try:
        conn = sqlite3.connect(target, timeout=wait_s)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        columns = {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
        # Another program's database (one with a runs table of its own too): never written.
        if tables and ("runs" not in tables or not columns >= _RUNS_COLUMNS):
            conn.close()
            raise CacheError(
                f"{target}: not a judge run history (it holds other tables: "
                f"{', '.join(sorted(tables)[:5])}): left as it is"
            )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA foreign_keys=ON")
        if create:
            conn.executescript(_SCHEMA)
    except sqlite3.Error as exc:
        raise CacheError(f"{target}: cannot open the run history: {_why(exc)}") from None
    try:
        with conn:
            yield conn
    except sqlite3.DatabaseError as exc:
        raise CacheError(f"{target}: run history unreadable: {_why(exc)}") from None
    finally:
        conn.close()


def _why(exc: sqlite3.Error) -> str:
    if "locked" in str(exc):
        return f"{exc} (another process holds it: a run recording itself, say)"
    return str(exc)


def history_problem(path: str | Path) -> str | None:
    """Why the run history at ``path`` cannot record a run (None: it can, or it does not exist
    yet and will be made): ``judge run`` asks before it pays for anything, since a run records
    itself only after judging."""
    target = Path(path)
    if not target.exists():
        return None
    if not target.is_file():
        return f"{target}: cannot open the run history: not a file"
    try:
        with _connect(target, create=False, wait_s=2.0) as conn:  # refuses another's file
            found = [r[0] for r in conn.execute("PRAGMA quick_check")]  # every page read
            if found != ["ok"]:
                return f"{target}: the run history is damaged ({found[0]}): move it aside"
    except CacheError as exc:
        return str(exc)
    return None


def source_key(source: str | None) -> str | None:
    """How a run's config is stored and matched: its path made absolute, so runs of one
    config match whatever the working directory; ``<defaults>`` and None stay as they are."""
    if not source or source.startswith("<"):
        return source or None
    return str(Path(source).resolve())


def record_run(path: str | Path, summary: Summary, out_dir: str | Path) -> int:
    """Store one run's summary (counts and per-engine metric means); return its run id."""
    c = summary.counts
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    row = (
        summary.created or now,
        now,
        source_key(summary.config.source),
        summary.dataset or None,
        str(out_dir),
        c.queries,
        c.repeats,
        c.verdicts,
        c.ok,
        c.unparsed,
        c.error,
        summary.usage.cost_usd,
    )
    with _connect(path, create=True) as conn:
        cur = conn.execute(
            "INSERT INTO runs (created, recorded, config_source, dataset, out_dir, queries, "
            "repeats, verdicts, ok, unparsed, error, cost_usd) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            row,
        )
        run_id = int(cur.lastrowid or 0)
        conn.executemany(
            "INSERT INTO run_metrics (run_id, engine, metric, mean, ci_low, ci_high) "
            "VALUES (?,?,?,?,?,?)",
            [
                (run_id, engine, metric, m.mean, m.ci_low, m.ci_high)
                for engine, data in summary.engines.items()
                for metric, m in data.metrics.items()
            ],
        )
    return run_id


def _where(source: str | None) -> tuple[str, tuple[Any, ...]]:
    return ("WHERE config_source = ?", (source,)) if source is not None else ("", ())


def list_runs(path: str | Path, limit: int = 20, *, source: str | None = None) -> list[HistoryRun]:
    """The last ``limit`` runs (all when ``limit <= 0``), oldest first; optionally one config's."""
    if not Path(path).exists():
        return []
    where, args = _where(source)
    with _connect(path, create=False) as conn:
        try:
            rows = conn.execute(
                "SELECT id, created, config_source, dataset, out_dir, queries, repeats, verdicts,"
                f" ok, unparsed, error, cost_usd FROM runs {where} ORDER BY id DESC LIMIT ?",
                (*args, limit if limit > 0 else -1),
            ).fetchall()
        except sqlite3.OperationalError:  # a file that is not (yet) a history
            return []
        metrics: dict[int, dict[str, dict[str, float | None]]] = {r[0]: {} for r in rows}
        if rows:
            marks = ",".join("?" * len(rows))
            for run_id, engine, metric, mean in conn.execute(
                f"SELECT run_id, engine, metric, mean FROM run_metrics WHERE run_id IN ({marks})",
                [r[0] for r in rows],
            ):
                metrics[run_id].setdefault(engine, {})[metric] = mean
    keys: tuple[str, ...] = ("run_id", "created", "config_source", "dataset", "out_dir")
    keys = (*keys, "queries", "repeats", "verdicts", "ok", "unparsed", "error", "cost_usd")
    try:
        return [
            HistoryRun(**dict(zip(keys, r, strict=True)), metrics=metrics[r[0]]) for r in rows[::-1]
        ]
    except ValidationError as exc:  # a value judge never writes there: damaged, or edited
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CacheError(
            f"{path}: run history unreadable: a run's {where} is {first['input']!r}: "
            f"{first['msg']}; move the file aside to start a new history"
        ) from None


def metric_trend(
    path: str | Path, metric: str, engine: str, last_n: int = 10, *, source: str | None = None
) -> list[TrendPoint]:
    """The metric's mean for one engine over the last ``last_n`` runs, oldest first."""
    return [
        TrendPoint(
            run_id=run.run_id,
            created=run.created,
            value=run.metrics.get(engine, {}).get(metric),
        )
        for run in list_runs(path, last_n, source=source)
        if engine in run.metrics
    ]


def regressions(runs: Sequence[HistoryRun], max_drop: Mapping[str, float]) -> list[Regression]:
    """Runs whose mean fell more than ``max_drop[metric]`` below the previous defined value
    (rose above it, for a lower-is-better metric)."""
    flagged: list[Regression] = []
    previous: dict[tuple[str, str], tuple[int, float]] = {}
    for run in runs:
        for engine, values in sorted(run.metrics.items()):
            for metric, limit in max_drop.items():
                current = values.get(metric)
                if current is None:
                    continue
                before = previous.get((engine, metric))
                sign = -1.0 if lower_is_better(metric) else 1.0  # a drop is how much worse
                if before is not None and sign * (before[1] - current) > limit:
                    flagged.append(
                        Regression(
                            run_id=run.run_id,
                            previous_run=before[0],
                            engine=engine,
                            metric=metric,
                            previous=before[1],
                            current=current,
                            drop=sign * (before[1] - current),
                            max_drop=limit,
                        )
                    )
                previous[(engine, metric)] = (run.run_id, current)
    return flagged


def history_rows_for_report(
    path: str | Path,
    engines: Sequence[str],
    metrics: Sequence[str],
    last_n: int = 10,
    *,
    max_drop: Mapping[str, float] | None = None,
    source: str | None = None,
) -> list[HistoryRow]:
    """The last ``last_n`` runs (oldest first) restricted to ``engines`` x ``metrics``.

    One run more than shown is read, so the oldest run shown is checked against its own
    predecessor too.
    """
    runs = list_runs(path, last_n + 1 if last_n > 0 else 0, source=source)
    flags: dict[int, list[Regression]] = {}
    for reg in regressions(runs, max_drop or {}):
        if reg.engine in engines:
            flags.setdefault(reg.run_id, []).append(reg)
    if last_n > 0:
        runs = runs[-last_n:]
    return [
        HistoryRow(
            run_id=run.run_id,
            created=run.created,
            values={
                e: {m: run.metrics[e].get(m) for m in metrics} for e in engines if e in run.metrics
            },
            regressions=tuple(flags.get(run.run_id, ())),
            dataset=run.dataset,
        )
        for run in runs
    ]
