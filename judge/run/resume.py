"""Resume bookkeeping for a run directory: which units are finished, the config fingerprint a
directory was made with, the lock that keeps two runs out of one directory, the repair of a
partial last line left by a killed writer, and the partial file.

``verdicts.jsonl`` holds one whole line per finished unit (its verdicts and metrics), never
part of one, so every reader of it (reports, compare, resume, users' own scripts) sees each
unit once. A unit's verdicts as they come go to ``verdicts.partial.jsonl`` instead, a line per
paid verdict (``query_id``, ``engine``, ``repeat``, ``verdict``) while its unit is unfinished:
what a killed run had judged, visible as it happens. The answers behind them are in the cache
already, so a resumed unit reads them from there (nothing is paid twice) and its whole line
goes to verdicts.jsonl; the partial lines of finished units are then dropped, and the file
goes when no unit is left unfinished."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from judge.config import RunConfig
from judge.data.lines import write_atomic
from judge.data.nuggets import NUGGETS_FILE
from judge.data.results import RESULTS_FILE, UnitKey, stale_units, unit_statuses
from judge.errors import ConfigError, InputError
from judge.run.batch_state import load_state
from judge.schema import Query, Usage, Verdict
from judge.version import __version__

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
PARTIAL_FILE = "verdicts.partial.jsonl"
LOCK_FILE = ".lock"
_TAIL = 1 << 16  # bytes read at a time when looking for a partial last line


Redo = frozenset[Literal["error", "unparsed"]]


def finished_units(
    results_path: Path, queries: Iterable[Query], redo: Redo = frozenset()
) -> set[UnitKey]:
    """(query_id, engine, repeat) units a rerun of ``queries`` skips: see :func:`recorded`."""
    return recorded(results_path, queries, redo)[2]


def recorded(
    results_path: Path, queries: Iterable[Query], redo: Redo = frozenset()
) -> tuple[dict[UnitKey, frozenset[str]], int, set[UnitKey]]:
    """Each unit the results file records (its statuses), the file's lines, and the units a
    rerun of ``queries`` skips: see :func:`finished_of`; a unit recorded from another dataset
    row than ``queries`` gives now is not one (the dataset changed: it is judged again)."""
    if not results_path.exists():
        return {}, 0, set()
    inputs: dict[UnitKey, str | None] = {}
    units, lines = unit_statuses(results_path, inputs)
    done = finished_of(units, redo)
    if stale := stale_units(done, inputs, queries):
        log.warning(
            "%d unit(s) in %s were judged from other dataset rows than these (the dataset "
            "changed): judged again (unchanged passages come from the cache)",
            len(stale),
            results_path.parent,
        )
    return units, lines, done - stale


def finished_of(recorded: dict[UnitKey, frozenset[str]], redo: Redo = frozenset()) -> set[UnitKey]:
    """The recorded units a rerun skips, from each unit's statuses in its last line.

    A unit whose last recorded line has an ``error`` verdict is always judged again, and one
    with an ``unparsed`` verdict too when ``redo`` names it (``--redo unparsed``); its good
    answers come from the cache, and the newer line supersedes the older one.
    """
    again = {"error", *redo}
    done = {k for k, statuses in recorded.items() if not statuses & again}
    if len(done) < len(recorded):
        what = " or ".join(sorted(again))
        log.info(
            "%d earlier unit(s) with %s verdicts will be judged again",
            len(recorded) - len(done),
            what,
        )
    return done


def repair_results(path: Path) -> None:
    """Cut a partial last line left by a killed writer, so appends start on a fresh line.
    Only the file's tail is read: a finished run's results are never read for this."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as fh:
        end = fh.seek(0, 2)
        fh.seek(end - 1)
        if fh.read(1) == b"\n":
            return
        cut = 0
        for start in range(end - (end % _TAIL or _TAIL), -1, -_TAIL):
            fh.seek(start)
            newline = fh.read(min(_TAIL, end - start)).rfind(b"\n")
            if newline >= 0:
                cut = start + newline + 1
                break
        fh.truncate(cut)
        log.warning(
            "%s: dropped a partial last line (%d bytes) from an interrupted run",
            path,
            end - cut,
        )


def partial_line(key: UnitKey, verdict: Verdict) -> bytes:
    """A line of the partial file: ``verdict``, made before its unit ``key`` ended."""
    query_id, engine, repeat = key
    unit = {"query_id": query_id, "engine": engine, "repeat": repeat}
    head = json.dumps(unit, ensure_ascii=False)[:-1]
    return f'{head}, "verdict": {verdict.model_dump_json()}}}\n'.encode()


def _partial_key(line: bytes) -> UnitKey | None:
    try:
        row = json.loads(line)
        return (str(row["query_id"]), str(row["engine"]), int(row["repeat"]))
    except (ValueError, TypeError, KeyError):
        return None


def partial_units(out_dir: Path) -> set[UnitKey]:
    """The units with verdicts in the partial file (an earlier invocation stopped in them)."""
    path = out_dir / PARTIAL_FILE
    if not path.exists():
        return set()
    repair_results(path)
    with open(path, "rb") as fh:
        return {key for line in fh if (key := _partial_key(line)) is not None}


def settle_partial(out_dir: Path, unfinished: set[UnitKey]) -> int:
    """Keep only the partial file's lines of ``unfinished`` units, the file itself only while
    it has some; how many lines stay."""
    path = out_dir / PARTIAL_FILE
    if not path.exists():
        return 0
    if not unfinished:
        path.unlink()
        return 0
    with open(path, "rb") as fh:
        kept = [line for line in fh if _partial_key(line) in unfinished]
    if not kept:
        path.unlink()
        return 0
    spare = path.with_name(path.name + ".tmp")
    spare.write_bytes(b"".join(kept))
    spare.replace(path)
    return len(kept)


def _run_file(out_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((out_dir / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def config_source(out_dir: Path) -> tuple[str | None, dict[str, Any]]:
    """The config file the run into ``out_dir`` was started with, and the command line's
    settings over it, as run.json names them."""
    data = _run_file(out_dir)
    source, given = data.get("source"), data.get("overrides")
    return (
        source if isinstance(source, str) and source else None,
        given if isinstance(given, dict) else {},
    )


def config_changes(out_dir: Path, config: RunConfig) -> str | None:
    """How ``config`` differs from the one the run into ``out_dir`` was made with (None: it
    does not, in what its fingerprint holds)."""
    old = _run_file(out_dir).get("fingerprint")
    if _settings(old) == _settings(config.fingerprint()):
        return None
    return describe_changes(old, config.fingerprint())


def add_elapsed(out_dir: Path, seconds: float) -> float:
    """Add one invocation's ``seconds`` to the run directory's judging time (in run.json);
    return the total over every invocation since the directory was made (or ``--fresh``)."""
    data = _run_file(out_dir)
    earlier = data.get("elapsed_s")
    total = seconds + (float(earlier) if isinstance(earlier, int | float) else 0.0)
    data["elapsed_s"] = total
    write_atomic(out_dir / RUN_FILE, json.dumps(data, indent=2, ensure_ascii=False))
    return total


def spent_before(out_dir: Path) -> tuple[Usage, bool]:
    """What earlier invocations into ``out_dir`` spent in real time (run.json's ledger, which
    the runner keeps as it goes: a budget caps the run directory, not one invocation, nor one
    --fresh start), and whether that is at most so (a run killed outright left requests in
    flight, counted at their worst case). Batches' spend is :func:`batched_before`'s."""
    usage = _ledger(out_dir, "spent")
    return usage, bool(_run_file(out_dir).get("spent_at_most")) and usage.total > 0


def batched_before(out_dir: Path) -> Usage:
    """What the batches read into ``out_dir`` used (batch.json's records, which --fresh
    keeps: priced at batch prices): the budget caps the directory whichever way it was
    paid."""
    state = load_state(out_dir)
    return sum((b.usage for b in state.batches if b.collected) if state else (), Usage())


def _ledger(out_dir: Path, field: str) -> Usage:
    found = _run_file(out_dir).get(field)
    if found is None:  # none kept yet: the run spent less than a step of its ledger
        return Usage()
    counts = [found.get(k) for k in Usage.model_fields] if isinstance(found, dict) else [None]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
        raise InputError(
            f"{json.dumps(found)[:80]} is not what judge keeps there (token counts): what "
            "earlier runs into this directory spent is unknown, and the budget caps the "
            "directory; restore the file, or give another --out",
            file=str(out_dir / RUN_FILE),
            field=field,
        )
    return Usage.model_validate(found)


def record_spent(out_dir: Path, total: Usage, *, at_most: bool = False) -> None:
    """Keep ``total`` (earlier invocations' real-time spend and this one's so far) as the
    ledger; ``at_most``: it counts requests in flight at their worst case."""
    data = _run_file(out_dir)
    ledger = total.model_dump()
    if data.get("spent") != ledger or bool(data.get("spent_at_most")) != at_most:
        data["spent"], data["spent_at_most"] = ledger, at_most
        write_atomic(out_dir / RUN_FILE, json.dumps(data, indent=2, ensure_ascii=False))


def _flatten(value: object, prefix: str = "") -> dict[str, object]:
    if isinstance(value, dict) and value:
        out: dict[str, object] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def _settings(fingerprint: object) -> dict[str, object]:
    """A fingerprint's settings, unset ones left out: a setting a newer version added (with
    no value) does not make an older run directory "a different config"."""
    return {k: v for k, v in _flatten(fingerprint or {}).items() if v is not None}


def describe_changes(old: object, new: object, *, limit: int = 4) -> str:
    """``judge.model 'a' -> 'b'``, for the first ``limit`` dotted keys whose values differ."""
    before, after = _flatten(old or {}), _flatten(new)
    keys = sorted(k for k in {*before, *after} if before.get(k) != after.get(k))

    def show(v: object) -> str:
        text = json.dumps(v, ensure_ascii=False) if v is not None else "unset"
        return text if len(text) <= 40 else text[:37] + "..."

    parts = [f"{k} {show(before.get(k))} -> {show(after.get(k))}" for k in keys[:limit]]
    more = len(keys) - limit
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


# What --fresh keeps, said where a directory is refused: the cache is not the run directory.
_FRESH = (
    "--fresh starts the directory over and judges from the cache: every answer already paid "
    "for is reused, not paid again, where this version sends the same request (--dry-run "
    "--fresh counts them)"
)


def _refusal(out_dir: Path, old: object, new: dict[str, Any]) -> str:
    """Why ``out_dir`` (made with fingerprint ``old``) cannot be resumed with ``new``: an
    upgrade when another judge version wrote it, or one that recorded no version and a setting
    one version has the other lacks differs; else a change of config."""
    changes = describe_changes(old, new)
    wrote = _run_file(out_dir).get("judge_version")
    before, after = _settings(old), _settings(new)
    one_sided = any((k in before) != (k in after) for k in {*before, *after})
    if wrote != __version__ and (wrote is not None or one_sided):
        who = f"judge {wrote}" if isinstance(wrote, str) else "an older judge (one that did not "
        who += "" if isinstance(wrote, str) else "record its version)"
        return (
            f"{out_dir}: this run directory was written by {who} and this is judge "
            f"{__version__}, whose settings differ (changed: {changes}); "
            f"an upgrade cannot resume it: {_FRESH}; or use another --out"
        )
    return (
        f"{out_dir}: this run directory was made with a different config (changed: {changes}); "
        f"use another --out, or {_FRESH}"
    )


def resume_problem(out_dir: Path, config: RunConfig, *, fresh: bool = False) -> str | None:
    """Why ``out_dir`` cannot be resumed with ``config`` (None: it can, or holds no run yet);
    ``fresh``: why it cannot be started over (a batch that may still answer, whatever
    --fresh says: it would be paid twice). Reads only (``judge run --dry-run`` says it as
    the run would)."""
    if not config.run.batch and (pending := _pending_batch(out_dir)) is not None:
        return pending
    run_file = out_dir / RUN_FILE
    if fresh:
        return None
    if not run_file.exists():
        return None
    try:
        old = json.loads(run_file.read_text(encoding="utf-8")).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return (
            f"{run_file}: unreadable (not the JSON judge writes); use --fresh to start over "
            "or another --out"
        )
    fingerprint = config.fingerprint()
    if _settings(old) != _settings(fingerprint):
        return _refusal(out_dir, old, fingerprint)
    return None


def _pending_batch(out_dir: Path) -> str | None:
    """A batch of this directory's that may still answer at the provider (submitted, or
    uploaded and perhaps submitted, not yet collected): a run without ``--batch`` would pay
    in real time for what it will answer, and the provider would bill that too."""
    state = load_state(out_dir)
    live = [
        b
        for b in (state.batches if state else ())
        if not b.collected and (b.batch_id or b.input_file_id)
    ]
    if not live:
        return None
    first = live[0]
    name = first.batch_id or f"the batch of {first.input_file_id}"
    more = f" (and {len(live) - 1} more)" if len(live) > 1 else ""
    return (
        f"{out_dir}: batch {name}{more} may still answer at the provider (status "
        f"{first.status}, {len(first.custom_ids)} requests, not collected): rerun with --batch "
        "to collect it (without --batch its requests would be paid again in real time); "
        f"`judge batch status {out_dir}` shows it, `judge batch cancel {out_dir}` stops it"
    )


# What a finished run writes from its results: --fresh removes a run directory's old ones, so
# none is read (judge compare, baseline set, read_run) as the new run's before it finishes.
FINISH_FILES = ("summary.json", "report.md", "report.html", "qrels.txt", "finished.json")


# run.json's ledger (what the directory spent in real time, and whether at most): --fresh
# keeps it, for a budget caps the directory (batches' spend is in batch.json, kept too).
_LEDGERS = ("spent", "spent_at_most")


def check_fingerprint(out_dir: Path, config: RunConfig, *, fresh: bool) -> None:
    run_file = out_dir / RUN_FILE
    fingerprint = config.fingerprint()
    spend = {k: v for k, v in _run_file(out_dir).items() if k in _LEDGERS}
    if (problem := resume_problem(out_dir, config, fresh=fresh)) is not None:
        raise ConfigError(problem)
    if fresh:
        ours = run_file.is_file()  # a run directory: its finish files are the run's own
        for name in (RESULTS_FILE, RUN_FILE, PARTIAL_FILE, NUGGETS_FILE):
            (out_dir / name).unlink(missing_ok=True)
        for name in FINISH_FILES if ours else ():
            if (out_dir / name).is_file():
                (out_dir / name).unlink()
    out_dir.mkdir(parents=True, exist_ok=True)
    # The judging time of earlier invocations is kept (add_elapsed adds this one's).
    # An invocation's time adds to the earlier ones' (--fresh starts it over); its spend does
    # too, whatever --fresh says: the budget caps what the run directory may cost.
    kept = {} if fresh else {k: v for k, v in _run_file(out_dir).items() if k == "elapsed_s"}
    elapsed = {**kept, **spend}
    run_file.write_text(
        json.dumps(
            {
                "fingerprint": fingerprint,
                "source": _absolute(config.source),
                "overrides": config.overrides,
                "judge_version": __version__,
                **elapsed,
            },
            indent=2,
            ensure_ascii=False,
            default=str,  # an override TOML reads as a date, say
        ),
        encoding="utf-8",
    )


def _absolute(source: str | None) -> str | None:
    """A config file's path made absolute (``<defaults>`` and None as they are): read again
    from another working directory (``judge report --rebuild``)."""
    if not source or source.startswith("<"):
        return source
    return str(Path(source).resolve())


@contextlib.contextmanager
def run_lock(out_dir: Path) -> Iterator[None]:
    """One ``judge run`` at a time per run directory (two would interleave their results)."""
    with open(out_dir / LOCK_FILE, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"{out_dir}: another judge run is writing to this directory; "
                "wait for it or use another --out"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
