"""Results JSONL (one judged query per line) and TREC qrels files: writing and reading.

Results: :func:`append_result` writes one JSON line per judged query and fsyncs it;
:func:`read_results` drops an incomplete last line left by a killed writer and reports it.
Qrels: :func:`write_qrels` pools every ``ok`` verdict for a (query_id, passage id) across
engines and repeats into one grade (``majority``: most frequent, ties to the lower grade).
"""

from __future__ import annotations

import codecs
import hashlib
import logging
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from judge.config import RunConfig
from judge.data.lines import Row, Sink, is_integer, read_bytes, text_lines, write_atomic
from judge.errors import ConfigError, InputError
from judge.schema import JudgedQuery, Query, Scale, VerdictStatus, share_row_fields

__all__ = [
    "REPEAT_POLICIES",
    "RESULTS_FILE",
    "append_result",
    "compact_results",
    "input_digest",
    "latest_rows",
    "load_engines",
    "load_results",
    "read_qrels",
    "read_results",
    "resolve_scale",
    "stale_units",
    "unit_statuses",
    "write_qrels",
]

log = logging.getLogger(__name__)

# The results file inside a run directory.
RESULTS_FILE = "verdicts.jsonl"

_SPACE = re.compile(r"\s")  # what a TREC qrels id cannot hold


def append_result(path: str | Path, jq: JudgedQuery) -> None:
    """Append one judged query as a JSON line, flushed and fsynced: a kill loses nothing done.

    An incomplete last line left by a killed writer is cut first (``read_results`` would drop
    it anyway), so the new line never fuses with it.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(target, os.O_RDWR | os.O_CREAT, 0o644)
        with os.fdopen(fd, "r+b") as fh:
            _end_last_line(fh, target)
            fh.seek(0, os.SEEK_END)
            fh.write(jq.model_dump_json().encode("utf-8") + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:  # a full disk's names no file: this one
        exc.filename = exc.filename or str(target)
        raise


def _end_last_line(fh: IO[bytes], path: Path) -> None:
    """Make the file end in a newline: end a complete last line, cut an incomplete one."""
    end = fh.seek(0, os.SEEK_END)
    if end == 0:
        return
    fh.seek(end - 1)
    if fh.read(1) == b"\n":
        return
    start = end
    while start > 0:
        step = min(start, 1 << 16)
        start -= step
        fh.seek(start)
        newline = fh.read(step).rfind(b"\n")
        if newline >= 0:
            start += newline + 1
            break
    fh.seek(start)
    try:
        JudgedQuery.model_validate_json(fh.read())
    except ValidationError:
        log.warning(
            "%s: cut an incomplete last line (%d bytes) before appending", path, end - start
        )
        fh.truncate(start)
    else:
        fh.seek(end)
        fh.write(b"\n")


def compact_results(path: Path) -> list[JudgedQuery]:
    """Keep one line per (query, engine, repeat), the last written, and return those rows.

    A resumed unit appends a newer line; at the end of a run the file is rewritten without
    the superseded ones, through a temporary file and a rename, so a reader sees the old file
    or the new one, never half of either.
    """
    rows = read_results(path)
    latest = {jq.key: jq for jq in rows}
    if len(latest) < len(rows):
        lines = (jq.model_dump_json().encode() + b"\n" for jq in latest.values())
        write_atomic(path, lines, path.stat().st_mode & 0o777)
    return list(latest.values())


def _first_error(exc: ValidationError) -> tuple[str | None, str]:
    err = exc.errors()[0]
    field = ".".join(str(part) for part in err["loc"]) or None
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return field, f"not a judged result: {err['msg']}{more}"


M = TypeVar("M", bound=BaseModel)


def _read_lines(path: Path, model: type[M], problems: list[str] | None = None) -> list[M]:
    """Every line of a results JSONL read as ``model``, in file order. An incomplete last line
    (a killed writer) is dropped, logged and added to ``problems``; any other bad line is an
    InputError naming file:line and field."""
    name = str(path)
    lines = read_bytes(path).removeprefix(codecs.BOM_UTF8).split(b"\n")  # an editor's BOM
    sink = Sink()
    out: list[M] = []
    for n, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            out.append(model.model_validate_json(raw))
        except ValidationError as exc:
            if n == len(lines):
                sink.note(
                    "incomplete last line (the writer was stopped mid-line); dropped", name, n
                )
            else:
                field, message = _first_error(exc)
                sink.error(message, name, n, field)
    sink.raise_if_any()
    for note in sink.problems:
        log.warning("%s", note)
    if problems is not None:
        problems.extend(sink.problems)
    return out


def read_results(path: str | Path, *, problems: list[str] | None = None) -> list[JudgedQuery]:
    """Every judged query in a results JSONL, in file order.

    An incomplete last line (no newline after it, and unreadable: a killed writer) is dropped,
    logged and added to ``problems``; any other bad line is an InputError naming file:line.
    """
    rows = _read_lines(Path(path), JudgedQuery, problems)
    for row in rows:  # a large run's rows, read back for its summary: in less memory
        share_row_fields(row)
    return rows


class _UnitKey(BaseModel):
    model_config = ConfigDict(extra="ignore")
    query_id: str
    engine: str = "default"


class _Status(BaseModel):
    model_config = ConfigDict(extra="ignore")
    status: VerdictStatus


class _Supports(BaseModel):
    model_config = ConfigDict(extra="ignore")
    supports: tuple[_Status, ...] = ()


class _Unit(BaseModel):
    """The part of a results line that says which unit it is, what it was judged from and how
    its verdicts (and nugget supports and credibility grades, when judged) ended."""

    model_config = ConfigDict(extra="ignore")
    query: _UnitKey
    repeat: int
    verdicts: tuple[_Status, ...]
    coverage: _Supports | None = None
    credibility: tuple[_Status, ...] | None = None
    input_digest: str | None = None

    def statuses(self) -> frozenset[str]:
        supports = self.coverage.supports if self.coverage else ()
        return frozenset(s.status for s in (*self.verdicts, *supports, *(self.credibility or ())))


UnitKey = tuple[str, str, int]


def unit_statuses(
    path: Path, inputs: dict[UnitKey, str | None] | None = None
) -> tuple[dict[UnitKey, frozenset[str]], int]:
    """Each (query_id, engine, repeat) unit's verdict statuses in its last line, and how many
    lines the file holds: what a resumed run needs, read without building the records
    (several times faster than :func:`read_results`). Bad lines are reported as it does.
    ``inputs``, when given, receives each unit's :func:`input_digest` (None: not recorded)."""
    units: dict[UnitKey, frozenset[str]] = {}
    lines = _read_lines(path, _Unit)
    for unit in lines:
        key = (unit.query.query_id, unit.query.engine, unit.repeat)
        units[key] = unit.statuses()
        if inputs is not None:
            inputs[key] = unit.input_digest
    return units, len(lines)


def input_digest(query: Query) -> str:
    """What a unit is judged from, as a digest: the dataset row's query, passages and labels
    (not where in the file it stood). Equal digests, equal inputs."""
    row = query.model_dump_json(exclude={"source"}).encode()
    return hashlib.blake2b(row, digest_size=12).hexdigest()


def stale_units(
    done: set[UnitKey], inputs: dict[UnitKey, str | None], queries: Iterable[Query]
) -> set[UnitKey]:
    """Of the ``done`` units, those recorded from another input than ``queries`` now give
    (a dataset changed between runs into one directory): to be judged again, not trusted."""
    recorded = {key[:2]: was for key in done if (was := inputs.get(key)) is not None}
    if not recorded:  # a new directory, or rows an older judge wrote: nothing to compare
        return set()
    changed = {q.key for q in queries if q.key in recorded and input_digest(q) != recorded[q.key]}
    return {key for key in done if key[:2] in changed}


def majority_grade(grades: Sequence[int]) -> int:
    """The most frequent grade; a tie goes to the lower grade (the cautious call). What
    qrels.txt gives a passage graded differently (repeats, engines), and the pooled metrics."""
    if len(grades) == 1:  # one repeat, one engine: most qrels
        return grades[0]
    counts = Counter(grades)
    top = max(counts.values())
    return min(grade for grade, count in counts.items() if count == top)


REPEAT_POLICIES: dict[str, Callable[[Sequence[int]], int]] = {
    "majority": majority_grade,
    "max": lambda grades: max(grades),
    "min": lambda grades: min(grades),
}


def write_qrels(
    path: str | Path, judged: Iterable[JudgedQuery], *, repeat_policy: str = "majority"
) -> int:
    """Write TREC qrels (``qid 0 docid grade``) from the judge's verdicts; return the line count.

    Qrels are per query: every ``ok`` grade for a (query_id, passage id), from any engine and
    any repeat, is pooled and reduced by ``repeat_policy``. Unparsed and error verdicts are
    left out. Lines are sorted by query id, then passage id; the file is replaced atomically.
    """
    if repeat_policy not in REPEAT_POLICIES:
        raise ConfigError(
            f"repeat_policy must be one of {sorted(REPEAT_POLICIES)}, got '{repeat_policy}'"
        )
    reduce = REPEAT_POLICIES[repeat_policy]
    votes: dict[str, dict[str, list[int]]] = {}
    for jq in judged:
        for v in jq.verdicts:
            if v.status != "ok" or v.grade is None:
                continue
            for field, value in (("query_id", jq.query.query_id), ("passage_id", v.passage_id)):
                if not value or _SPACE.search(value):
                    raise InputError(
                        f"'{value}' has whitespace, which TREC qrels cannot hold",
                        file=jq.query.source,
                        field=field,
                    )
            votes.setdefault(jq.query.query_id, {}).setdefault(v.passage_id, []).append(v.grade)
    lines = [
        f"{qid} 0 {pid} {reduce(votes[qid][pid])}\n"
        for qid in sorted(votes)
        for pid in sorted(votes[qid])
    ]
    write_atomic(path, "".join(lines))
    return len(lines)


def read_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """TREC qrels (``qid iter docid grade``) as {qid: {docid: grade}}; bad lines raise."""
    name = str(path)
    sink = Sink()
    qrels: dict[str, dict[str, int]] = {}
    for n, line in text_lines(Path(path), sink):
        row = Row(sink, name, n)
        cols = line.split()
        if len(cols) != 4:
            row.bad(None, f"expected 4 columns (qid iter docid grade), got {len(cols)}")
        elif not is_integer(cols[3]):
            row.bad("grade", f"not an integer: '{cols[3]}'")
        elif cols[2] in qrels.get(cols[0], {}):
            row.bad("docid", f"passage '{cols[2]}' graded twice for query '{cols[0]}'")
        else:
            qrels.setdefault(cols[0], {})[cols[2]] = int(cols[3])
    sink.raise_if_any()
    return qrels


def load_results(path: Path) -> list[JudgedQuery]:
    """A run directory's or results file's rows, one per (query, engine, repeat), last wins."""
    if path.is_dir():
        path = path / RESULTS_FILE
        if not path.exists():
            raise InputError("no results yet", file=str(path))
    if not path.exists():
        raise InputError("no such run directory or results file", file=str(path))
    return latest_rows(read_results(path))


def latest_rows(rows: Iterable[JudgedQuery]) -> list[JudgedQuery]:
    """One row per (query, engine, repeat), the last given, sorted by the three."""
    latest = {jq.key: jq for jq in rows}
    return sorted(latest.values(), key=lambda jq: (jq.query.query_id, jq.query.engine, jq.repeat))


def _rename(jq: JudgedQuery, engine: str) -> JudgedQuery:
    return jq.model_copy(update={"query": jq.query.model_copy(update={"engine": engine})})


def split_source(source: str) -> tuple[str | None, Path]:
    """A source's NAME (None when unnamed) and path: ``NAME=PATH``, or a path (which may hold
    an ``=`` of its own when it exists)."""
    path = Path(source)
    if "=" in source and not path.exists():
        name, raw = source.split("=", 1)
        return name, Path(raw)
    return None, path


def source_labels(paths: Sequence[Path]) -> list[str]:
    """Each path's shortest distinct name: its last part (a results file's stem), or as many
    trailing parts as it takes to tell it from the others (``monday/out``, ``tuesday/out``)."""
    parts = [
        [*p.resolve().parts[:-1], p.stem if p.suffix in (".jsonl", ".json") else p.name]
        for p in paths
    ]
    labels: list[str] = []
    for mine in parts:
        depth = 1
        while depth < len(mine) and any(
            other is not mine and other[-depth:] == mine[-depth:] for other in parts
        ):
            depth += 1
        labels.append("/".join(mine[-depth:]))
    return labels


def load_engines(
    sources: Sequence[str], read: Callable[[Path], list[JudgedQuery]] = load_results
) -> list[JudgedQuery]:
    """Results from one or more sources (``PATH`` or ``NAME=PATH``), each read by ``read``.

    One unnamed source keeps its engines. With several, each source is an engine: its one
    engine name is kept when every source has one distinct, non-default engine; otherwise it
    is named NAME, or its shortest distinct path (:func:`source_labels`), suffixed
    ``/engine`` when it holds several, or when another source does and its one engine has a
    name (so that it is compared with the engine of that name, not with another).
    """
    loaded: list[tuple[str | None, Path, list[JudgedQuery]]] = []
    for source in sources:
        name, path = split_source(source)
        loaded.append((name, path, read(path)))
        if not loaded[-1][2] and len(sources) > 1:  # one of several: it would vanish unsaid
            raise InputError(f"{path}: no judged rows: nothing to compare it with")
    if len(loaded) == 1 and loaded[0][0] is None:
        return loaded[0][2]
    singles = [sorted({jq.query.engine for jq in rows}) for _, _, rows in loaded]
    keep = all(len(e) == 1 and e[0] != "default" for e in singles) and len(
        {e[0] for e in singles}
    ) == len(singles)
    paths = source_labels([path for _, path, _ in loaded])
    several = any(len(e) > 1 for e in singles)
    out: list[JudgedQuery] = []
    owner: dict[str, str] = {}
    for (name, path, rows), engines, by_path in zip(loaded, singles, paths, strict=True):
        label = name or by_path
        if len(engines) > 1 or (several and engines != ["default"]):
            names = {e: f"{label}/{e}" for e in engines}
        else:
            names = {e: e if keep and name is None else label for e in engines}
        for new in names.values():
            if owner.setdefault(new, str(path)) != str(path):
                raise InputError(
                    f"engine name '{new}' would come from both {owner[new]} and {path}; "
                    "name the sources as NAME=PATH"
                )
        out += [_rename(jq, names[jq.query.engine]) for jq in rows]
    return out


def resolve_scale(results: Sequence[JudgedQuery], config: RunConfig | None) -> Scale:
    """The config's scale, else the built-in scale the results name; a config whose scale is
    not the one the results were judged on is an error (its grades would be read as the
    wrong labels: a graded run's 3 as a binary relevance of 3)."""
    names = sorted({jq.scale for jq in results})
    if config is not None:
        scale = config.scale()
        if names and names != [scale.name]:
            raise ConfigError(
                f"{config.source or '<config>'}: judge.scale is '{scale.name}', but the results "
                f"were judged on {', '.join(repr(n) for n in names)}; give the run's own config"
            )
        return scale
    if len(names) != 1:
        raise InputError(f"results were judged on different scales {names}; compare one scale")
    return Scale.named(names[0])
