"""Results JSONL (one judged query per line) and TREC qrels files: writing and reading.

Results: :func:`append_result` writes one JSON line per judged query and fsyncs it;
:func:`read_results` drops an incomplete last line left by a killed writer and reports it.
Qrels: :func:`write_qrels` pools every ``ok`` verdict for a (query_id, passage id) across
engines and repeats into one grade (``majority``: most frequent, ties to the lower grade).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO

from pydantic import ValidationError

from judge._input import Row, Sink, read_bytes, text_lines
from judge.errors import ConfigError, InputError
from judge.schema import JudgedQuery

__all__ = ["REPEAT_POLICIES", "append_result", "read_qrels", "read_results", "write_qrels"]

# The logger these warnings had before the results code left judge.datasets; kept so that
# logging filters users set up on it still apply.
log = logging.getLogger("judge.datasets")


def append_result(path: str | Path, jq: JudgedQuery) -> None:
    """Append one judged query as a JSON line, flushed and fsynced: a kill loses nothing done.

    An incomplete last line left by a killed writer is cut first (``read_results`` would drop
    it anyway), so the new line never fuses with it.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_RDWR | os.O_CREAT, 0o644)
    with os.fdopen(fd, "r+b") as fh:
        _end_last_line(fh, target)
        fh.seek(0, os.SEEK_END)
        fh.write(jq.model_dump_json().encode("utf-8") + b"\n")
        fh.flush()
        os.fsync(fh.fileno())


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


def _first_error(exc: ValidationError) -> tuple[str | None, str]:
    err = exc.errors()[0]
    field = ".".join(str(part) for part in err["loc"]) or None
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return field, f"not a judged result: {err['msg']}{more}"


def read_results(path: str | Path, *, problems: list[str] | None = None) -> list[JudgedQuery]:
    """Every judged query in a results JSONL, in file order.

    An incomplete last line (no newline after it, and unreadable: a killed writer) is dropped,
    logged and added to ``problems``; any other bad line is an InputError naming file:line.
    """
    name = str(path)
    lines = read_bytes(Path(path)).split(b"\n")
    sink = Sink()
    out: list[JudgedQuery] = []
    for n, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            out.append(JudgedQuery.model_validate_json(raw))
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


def _majority(grades: Sequence[int]) -> int:
    """The most frequent grade; a tie goes to the lower grade (the cautious call)."""
    counts = Counter(grades)
    top = max(counts.values())
    return min(grade for grade, count in counts.items() if count == top)


REPEAT_POLICIES: dict[str, Callable[[Sequence[int]], int]] = {
    "majority": _majority,
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
                if value.split() != [value]:
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
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.writelines(lines)
    os.replace(tmp, target)
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
        elif not cols[3].lstrip("-").isdigit():
            row.bad("grade", f"not an integer: '{cols[3]}'")
        elif cols[2] in qrels.get(cols[0], {}):
            row.bad("docid", f"passage '{cols[2]}' graded twice for query '{cols[0]}'")
        else:
            qrels.setdefault(cols[0], {})[cols[2]] = int(cols[3])
    sink.raise_if_any()
    return qrels
