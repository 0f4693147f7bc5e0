"""Read query datasets (JSONL rows, or a TREC run over a passage store); write results and qrels.

Dataset JSONL: one object per line (UTF-8, blank lines skipped), in either shape::

    {"query_id": "q1", "query": "...", "engine": "bm25", "labels": {"p1": 3},
     "passages": [{"id": "p1", "text": "...", "title": "...", "url": "...", "score": 1.5}],
     "expected_ids": ["p1"], "expected_texts": ["..."]}
    {"query_id": "q1", "query": "...", "retrieved_ids": [...], "retrieved_texts": [...]}

Only ``query`` and the passages are required. A missing ``query_id`` becomes ``line<N>``;
passage ids are given for all passages or for none (then they are the ranks "1".."n");
integer ids become strings; ``engine`` defaults to "default". A passage given by id only is
looked up in the passage store (JSONL ``{"id", "text", "title"?, "url"?}``). ``columns``
renames the user's field names to ours, e.g. ``{"question": "query", "doc_id": "id"}``; each
rename applies at the level (row or passage) where its target field lives. Fields we do not
use are ignored and noted in ``problems``. Passages longer than ``max_passage_chars`` are cut
by the truncation policy described in :mod:`judge._passages`.

Errors: every malformed line is collected, then one :class:`InputError` lists up to 20 of
them (``file:line: field 'x': what``) with the total count. :func:`validate` returns the
same list without raising, for ``judge validate``. Non-fatal notes (empty passage lists,
truncations, unused fields) go to ``problems``.

This module is the front door for dataset files: the TREC run reader (:mod:`judge.trec`) and
the results and qrels files (:mod:`judge.results`) are re-exported from here.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from judge.data.frames import Table, dict_table, read_parquet, resolve_columns
from judge.data.lines import MAX_ERRORS_SHOWN, MISSING, Row, Sink, id_text, json_lines, kind
from judge.data.passages import (
    PASSAGE_FIELDS,
    ROW_FIELDS,
    TRUNCATION_MARKER,
    Counts,
    DatasetReport,
    check_limit,
    counts,
    cut,
    read_store,
    split_columns,
    truncate,
)
from judge.data.results import REPEAT_POLICIES, append_result, read_qrels, read_results, write_qrels
from judge.data.trec import read_trec_run
from judge.errors import ConfigError, InputError, JudgeError
from judge.schema import Passage, Query, share_fields_sets
from judge.sections import DEFAULT_PASSAGE_CHARS

__all__ = [
    "MAX_ERRORS_SHOWN",
    "PASSAGE_FIELDS",
    "REPEAT_POLICIES",
    "ROW_FIELDS",
    "TRUNCATION_MARKER",
    "DatasetReport",
    "ValidationResult",
    "append_result",
    "read_qrels",
    "read_queries",
    "read_results",
    "read_trec_run",
    "truncate",
    "validate",
    "write_qrels",
]


class ValidationResult(Counts):
    """What ``judge validate`` shows: counts of the rows that parsed, every error and note."""

    path: str
    errors: tuple[str, ...]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass(slots=True)  # not frozen: one is made per passage, and frozen ones are 4x slower
class _Draft:
    """A passage as given on the line, before ids, store look-up and truncation."""

    id: str | None
    text: str | None
    id_field: str
    text_field: str
    title: str | None = None
    url: str | None = None
    score: float | None = None


@dataclass(frozen=True)
class _Options:
    top: Mapping[str, str]
    inner: Mapping[str, str]
    max_chars: int
    store: Mapping[str, Passage] | None = None
    store_name: str = ""


def _drafts(
    data: dict[str, Any], row: Row, opt: _Options, unused: dict[str, int]
) -> list[_Draft] | None:
    """The passages of either shape, in ranked order; None if they have errors. A passage
    field judge does not read goes to ``unused`` (a misspelt "socre" was dropped unsaid)."""
    before = row.errors
    has_lists = "retrieved_ids" in data or "retrieved_texts" in data
    if "passages" not in data:
        if not has_lists:
            row.bad("passages", "missing (or give retrieved_ids / retrieved_texts)")
            return None
        ids = row.listed(data.get("retrieved_ids"), "retrieved_ids", row.ident)
        texts = row.listed(data.get("retrieved_texts"), "retrieved_texts", row.string)
        if ids is not None and texts is not None and len(ids) != len(texts):
            row.bad("retrieved_texts", f"has {len(texts)} items, retrieved_ids has {len(ids)}")
        if row.errors > before:
            return None
        n = len(ids) if ids is not None else len(texts or [])
        return [
            _Draft(
                ids[i] if ids else None,
                texts[i] if texts else None,
                f"retrieved_ids[{i}]",
                f"retrieved_texts[{i}]",
            )
            for i in range(n)
        ]
    if has_lists:
        row.bad("passages", "give either passages or retrieved_ids/retrieved_texts, not both")
        return None
    value = data["passages"]
    if not isinstance(value, list):
        row.bad("passages", f"expected a list, got {kind(value)}")
        return None
    out: list[_Draft] = []
    for i, item in enumerate(value):
        at = f"passages[{i}]"
        if not isinstance(item, dict):
            row.bad(at, f"expected an object, got {kind(item)}")
            continue
        p = row.rename(item, opt.inner, at + ".")
        if extra := p.keys() - PASSAGE_FIELDS:
            for key in extra:
                unused.setdefault(f"passages.{key}", row.line)
        pid = row.ident(p["id"], f"{at}.id") if "id" in p else None
        text = row.string(p.get("text"), f"{at}.text", required=False)
        title = row.string(p.get("title"), f"{at}.title", required=False)
        url = row.string(p.get("url"), f"{at}.url", required=False)
        score = row.number(p.get("score"), f"{at}.score")
        out.append(_Draft(pid, text, f"{at}.id", f"{at}.text", title, url, score))
    return out if row.errors == before else None


def _finish(drafts: list[_Draft], row: Row, opt: _Options) -> list[Passage]:
    """Ids (given or by rank), store look-ups, duplicate checks and truncation."""
    missing = [d for d in drafts if d.id is None]
    if missing and len(missing) < len(drafts):
        row.bad(missing[0].id_field, "missing (give ids for all passages or for none)")
    seen: dict[str, int] = {}
    out: list[Passage] = []
    for rank, d in enumerate(drafts, start=1):
        pid = d.id if d.id is not None else str(rank)
        if pid in seen:
            row.bad(d.id_field, f"duplicate passage id '{pid}' (also at rank {seen[pid]})")
            continue
        seen[pid] = rank
        if d.text is not None:
            given = Passage(id=pid, text=d.text, title=d.title, url=d.url, score=d.score)
            out.append(cut(given, row, opt.max_chars))
        elif opt.store is None:
            row.bad(d.text_field, "missing (and no passage store to look the id up in)")
        elif pid not in opt.store:
            row.bad(d.id_field, f"passage '{pid}' is not in the passage store {opt.store_name}")
        else:
            got = opt.store[pid]
            found = Passage(
                id=pid,
                text=got.text,
                title=d.title or got.title,
                url=d.url or got.url,
                score=d.score,
            )
            out.append(cut(found, row, opt.max_chars))
    return out


def _labels(value: Any, ids: set[str] | None, row: Row) -> dict[str, int] | None:
    if value is None or value is MISSING:
        return None
    if not isinstance(value, dict):
        row.bad("labels", f"expected an object {{passage id: grade}}, got {kind(value)}")
        return None
    out: dict[str, int] = {}
    for key, grade in value.items():
        pid = id_text(key)[0] or str(key)  # a Python dict's integer keys, as ids are read
        if isinstance(grade, float) and grade.is_integer():
            grade = int(grade)  # an integer column with a gap is float in a DataFrame
        if isinstance(grade, bool) or not isinstance(grade, numbers.Integral) or grade < 0:
            shown = json.dumps(grade) if isinstance(grade, str | int | float | None) else grade
            row.bad(f"labels.{pid}", f"expected an integer grade >= 0, got {shown}")
        elif ids is not None and pid not in ids:
            row.bad(f"labels.{pid}", f"label for unknown passage id '{pid}'")
        else:
            out[pid] = int(grade)
    return out


def _parse_row(obj: Any, row: Row, opt: _Options, unused: dict[str, int]) -> Query | None:
    if not isinstance(obj, dict):
        row.bad(None, f"expected a JSON object, got {kind(obj)}")
        return None
    data = row.rename(obj, opt.top, "")
    for key in data.keys() - ROW_FIELDS:
        unused.setdefault(key, row.line)
    qid = row.ident(data.get("query_id", f"line{row.line}"), "query_id")
    text = row.nonblank(data.get("query", MISSING), "query")
    engine = row.nonblank(data.get("engine", "default"), "engine")
    drafts = _drafts(data, row, opt, unused)
    expected_ids = row.listed(data.get("expected_ids"), "expected_ids", row.ident)
    expected_texts = row.listed(data.get("expected_texts"), "expected_texts", row.string)
    passages = _finish(drafts, row, opt) if drafts is not None else []
    known = None if drafts is None else {d.id or str(i) for i, d in enumerate(drafts, 1)}
    labels = _labels(data.get("labels"), known, row)
    if not row.ok or qid is None or text is None or engine is None:
        return None
    if not passages:
        row.note(
            f"query '{qid}' ({engine}) has no passages (kept: its precision, hit and MRR are 0 "
            "and its other metrics undefined)"
        )
    return Query(
        query_id=qid,
        query=text,
        engine=engine,
        passages=tuple(passages),
        expected_ids=None if expected_ids is None else tuple(expected_ids),
        expected_texts=None if expected_texts is None else tuple(expected_texts),
        labels=labels,
        source=f"{row.file}:{row.line}",
    )


# How a file's reader is told its columns, in the one-line error naming a missing one.
_HINT = "[dataset] columns (Python: columns=) "


# Tables of other formats, refused by name rather than read as JSONL line by failing line.
_TABLES = frozenset({".csv", ".tsv", ".xls", ".xlsx", ".ods"})


def _rows(
    path: Path, columns: Mapping[str, str] | str | None, sink: Sink
) -> tuple[Iterable[tuple[int, Any]], dict[str, str]]:
    """A file's (number, row) pairs and the renames to read them with: JSONL lines, or a
    Parquet file's rows (numbered from 1; one passage per row grouped into one row per query,
    numbered by its first: data/frames.py)."""
    renames, preset = resolve_columns(columns)
    if path.suffix.lower() in _TABLES:
        raise InputError(
            f"a {path.suffix} file is not read: give JSONL (one JSON object per line) or "
            "Parquet; a table in pandas goes in through the Python API (docs/INTEGRATIONS.md)",
            file=str(path),
        )
    if path.suffix.lower() == ".parquet":
        return read_parquet(path).dataset_rows(renames, preset, hint=_HINT), renames
    if preset.order is None:
        return json_lines(path, sink), renames  # a preset renames a line's fields alone
    # A preset of one document per line (phoenix, pyterrier): lines grouped as a table's rows.
    objects = []
    for n, obj in json_lines(path, sink):
        if isinstance(obj, dict):
            objects.append(obj)
        else:
            Row(sink, str(path), n).bad(None, f"expected a JSON object, got {kind(obj)}")
    table = dict_table(objects)
    named = Table(str(path), table.columns, table.rows)
    return named.dataset_rows(renames, preset, hint=_HINT), renames


def _load(
    path: str | Path,
    columns: Mapping[str, str] | str | None,
    max_chars: int,
    passage_store: str | Path | None,
    sink: Sink,
) -> list[Query]:
    check_limit(max_chars)
    lines, renames = _rows(Path(path), columns, sink)
    top, inner = split_columns(renames)
    store = None if passage_store is None else read_store(Path(passage_store), inner, sink)
    opt = _Options(top, inner, max_chars, store, str(passage_store))
    name = str(path)
    queries: list[Query] = []
    first: dict[tuple[str, str], int] = {}
    unused: dict[str, int] = {}
    for n, obj in lines:
        row = Row(sink, name, n)
        query = _parse_row(obj, row, opt, unused)
        if query is None:
            continue
        if query.key in first:
            what = f"duplicate row for query '{query.query_id}', engine '{query.engine}'"
            row.bad("query_id", f"{what} (first on line {first[query.key]})")
            continue
        first[query.key] = n
        share_fields_sets((query, *query.passages))
        queries.append(query)
    for key, n in sorted(unused.items()):
        sink.note(f"field '{key}' is not used (first seen on line {n}); see columns", name)
    for theirs in sorted({*top, *inner} - sink.renamed):
        ours = top.get(theirs) or inner[theirs]
        sink.note(f"columns maps '{theirs}' to '{ours}', but no row has a '{theirs}'", name)
    if not queries and not sink.errors:
        sink.error("no queries in the file", name, None)
    return queries


def read_queries(
    path: str | Path,
    *,
    columns: Mapping[str, str] | str | None = None,
    max_passage_chars: int = DEFAULT_PASSAGE_CHARS,
    passage_store: str | Path | None = None,
) -> DatasetReport:
    """Read a dataset JSONL (either shape) or Parquet file; raise one InputError listing
    every bad line (a Parquet file's: row). ``columns``: renames, or a preset's name."""
    sink = Sink()
    queries = _load(path, columns, max_passage_chars, passage_store, sink)
    sink.raise_if_any()
    return DatasetReport(queries=tuple(queries), problems=tuple(sink.problems), **counts(queries))


def validate(
    path: str | Path,
    *,
    columns: Mapping[str, str] | str | None = None,
    max_passage_chars: int = DEFAULT_PASSAGE_CHARS,
    passage_store: str | Path | None = None,
) -> ValidationResult:
    """Check a dataset like :func:`read_queries` does, returning every error instead of raising."""
    sink = Sink()
    try:
        queries = _load(path, columns, max_passage_chars, passage_store, sink)
    except ConfigError:  # the settings the file is read with, not the file: raised as it is
        raise
    except JudgeError as exc:
        queries, sink.errors = [], [*sink.errors, InputError(str(exc))]
    return ValidationResult(
        path=str(path),
        errors=tuple(str(e) for e in sink.errors),
        problems=tuple(sink.problems),
        **counts(queries),
    )
