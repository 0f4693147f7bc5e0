"""Read query datasets (JSONL, or a TREC run over a passage store); write results and qrels.

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
use are ignored and noted in ``problems``.

Truncation policy: a passage longer than ``max_passage_chars`` (0 = no limit) keeps its
first ``max_passage_chars`` characters; when whitespace falls within the last 10% of those,
the cut moves back to the last whitespace so no word is split (text without spaces, such as
Chinese, is cut exactly). " …[truncated]" is appended so the judge knows the text goes on;
``Passage.truncated_from`` keeps the original length and the cut is listed in ``problems``.

Errors: every malformed line is collected, then one :class:`InputError` lists up to 20 of
them (``file:line: field 'x': what``) with the total count. :func:`validate` returns the
same list without raising, for ``judge validate``. Non-fatal notes (empty passage lists,
truncations, unused fields) go to ``problems``.

Results: :func:`append_result` writes one JSON line per judged query and fsyncs it;
:func:`read_results` drops an incomplete last line left by a killed writer and reports it.
Qrels: :func:`write_qrels` pools every ``ok`` verdict for a (query_id, passage id) across
engines and repeats into one grade (``majority``: most frequent, ties to the lower grade).
"""

from __future__ import annotations

import codecs
import json
import logging
import math
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from judge.errors import ConfigError, InputError, JudgeError
from judge.schema import JudgedQuery, Passage, Query, Record

log = logging.getLogger(__name__)

TRUNCATION_MARKER = " …[truncated]"
MAX_ERRORS_SHOWN = 20
ROW_FIELDS = frozenset(
    {"query_id", "query", "engine", "passages", "retrieved_ids", "retrieved_texts"}
    | {"expected_ids", "expected_texts", "labels"}
)
PASSAGE_FIELDS = frozenset({"id", "text", "title", "url", "score"})
_MISSING: Any = object()
_KINDS = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}
_KINDS |= {list: "a list", dict: "an object", type(None): "null"}


class _Counts(Record):
    n_queries: int  # rows, i.e. (query_id, engine) pairs
    n_query_ids: int
    n_passages: int
    engines: tuple[str, ...]
    n_labelled: int
    n_truncated: int
    n_empty: int


class DatasetReport(_Counts):
    """The queries read from a dataset, the non-fatal notes about them, and counts."""

    queries: tuple[Query, ...]
    problems: tuple[str, ...] = ()


class ValidationResult(_Counts):
    """What ``judge validate`` shows: counts of the rows that parsed, every error and note."""

    path: str
    errors: tuple[str, ...]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.errors


def _counts(queries: Sequence[Query]) -> dict[str, Any]:
    return {
        "n_queries": len(queries),
        "n_query_ids": len({q.query_id for q in queries}),
        "n_passages": sum(len(q.passages) for q in queries),
        "engines": tuple(sorted({q.engine for q in queries})),
        "n_labelled": sum(q.labels is not None for q in queries),
        "n_truncated": sum(p.truncated_from is not None for q in queries for p in q.passages),
        "n_empty": sum(not q.passages for q in queries),
    }


class _Sink:
    """Collects every error and note of one read, so the user sees them all at once."""

    def __init__(self) -> None:
        self.errors: list[InputError] = []
        self.problems: list[str] = []

    def error(self, message: str, file: str, line: int | None, field: str | None = None) -> None:
        self.errors.append(InputError(message, file=file, line=line, field=field))

    def note(self, message: str, file: str, line: int | None = None) -> None:
        self.problems.append(f"{file}:{line}: {message}" if line else f"{file}: {message}")

    def raise_if_any(self) -> None:
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            n = len(self.errors)
            shown = f" (first {MAX_ERRORS_SHOWN} shown)" if n > MAX_ERRORS_SHOWN else ""
            lines = "".join(f"\n  {e}" for e in self.errors[:MAX_ERRORS_SHOWN])
            files = {e.file for e in self.errors}
            file = files.pop() if len(files) == 1 else None
            raise InputError(f"{n} input errors{shown}:{lines}", file=file)


def _kind(value: Any) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read the file ({exc.strerror or exc})", file=str(path)) from None


def _text_lines(path: Path, sink: _Sink) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-blank line; undecodable lines go to the sink."""
    data = _read_bytes(path).removeprefix(codecs.BOM_UTF8)
    for n, raw in enumerate(data.split(b"\n"), start=1):
        try:
            text = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as exc:
            sink.error(f"invalid UTF-8 (byte {exc.start + 1} of the line)", str(path), n)
            continue
        if text.strip():
            yield n, text


def _json_lines(path: Path, sink: _Sink) -> Iterator[tuple[int, Any]]:
    for n, text in _text_lines(path, sink):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            sink.error(f"invalid JSON ({exc.msg} at column {exc.colno})", str(path), n)
            continue
        yield n, value


class _Row:
    """Checks the fields of one line; each problem goes to the sink with file:line and field."""

    def __init__(self, sink: _Sink, file: str, line: int) -> None:
        self.sink, self.file, self.line, self.errors = sink, file, line, 0

    @property
    def ok(self) -> bool:
        return self.errors == 0

    def bad(self, field: str | None, message: str) -> None:
        self.sink.error(message, self.file, self.line, field)
        self.errors += 1

    def note(self, message: str) -> None:
        self.sink.note(message, self.file, self.line)

    def string(self, value: Any, field: str, *, required: bool = True) -> str | None:
        if value is _MISSING or (value is None and not required):
            if required:
                self.bad(field, "missing")
            return None
        if not isinstance(value, str):
            self.bad(field, f"expected a string, got {_kind(value)}")
            return None
        return value

    def nonblank(self, value: Any, field: str) -> str | None:
        text = self.string(value, field)
        if text is not None and not text.strip():
            self.bad(field, "is empty")
            return None
        return text

    def ident(self, value: Any, field: str) -> str | None:
        if value is _MISSING:
            self.bad(field, "missing")
        elif isinstance(value, bool) or not isinstance(value, str | int):
            self.bad(field, f"expected a string or integer id, got {_kind(value)}")
        elif not str(value).strip():
            self.bad(field, "is empty")
        else:
            return str(value)
        return None

    def number(self, value: Any, field: str) -> float | None:
        if value is None or value is _MISSING:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.bad(field, f"expected a number, got {_kind(value)}")
            return None
        return float(value)

    def listed(
        self, value: Any, field: str, item: Callable[[Any, str], str | None]
    ) -> list[str] | None:
        """A list checked item by item; None when absent or invalid (``ok`` tells which)."""
        if value is None or value is _MISSING:
            return None
        if not isinstance(value, list):
            self.bad(field, f"expected a list, got {_kind(value)}")
            return None
        out = [item(v, f"{field}[{i}]") for i, v in enumerate(value)]
        return None if None in out else [v for v in out if v is not None]

    def rename(self, obj: dict[str, Any], renames: Mapping[str, str], at: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in obj.items():
            name = renames.get(key, key)
            if name in out:
                self.bad(at + name, f"given twice ('{key}' also maps to it; see columns)")
            out[name] = value
        return out


@dataclass(frozen=True)
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


def _split_columns(columns: Mapping[str, str] | None) -> tuple[dict[str, str], dict[str, str]]:
    top: dict[str, str] = {}
    inner: dict[str, str] = {}
    for theirs, ours in (columns or {}).items():
        if ours not in ROW_FIELDS | PASSAGE_FIELDS:
            known = ", ".join(sorted(ROW_FIELDS | PASSAGE_FIELDS))
            raise ConfigError(
                f"columns: '{theirs}' maps to unknown field '{ours}' (known: {known})"
            )
        (top if ours in ROW_FIELDS else inner)[theirs] = ours
    return top, inner


def _check_limit(max_chars: int) -> None:
    if max_chars < 0:
        raise ConfigError(f"max_passage_chars must be >= 0 (0 = no limit), got {max_chars}")


def truncate(text: str, limit: int) -> str:
    """``text`` cut by the module's truncation policy (unchanged when it fits or limit is 0)."""
    if limit <= 0 or len(text) <= limit:
        return text
    cut = text[:limit]
    for i in range(limit - 1, limit - limit // 10 - 1, -1):
        if cut[i].isspace():
            cut = cut[:i]
            break
    return cut.rstrip() + TRUNCATION_MARKER


def _cut(passage: Passage, row: _Row, max_chars: int) -> Passage:
    """``passage`` with the truncation policy applied, noting any cut or empty text."""
    short = truncate(passage.text, max_chars)
    if short == passage.text:
        if not short.strip():
            row.note(f"passage '{passage.id}' has empty text")
        return passage
    kept = len(short) - len(TRUNCATION_MARKER)
    row.note(f"passage '{passage.id}' truncated from {len(passage.text)} to {kept} characters")
    return passage.model_copy(update={"text": short, "truncated_from": len(passage.text)})


def _drafts(data: dict[str, Any], row: _Row, opt: _Options) -> list[_Draft] | None:
    """The passages of either shape, in ranked order; None if they have errors."""
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
        row.bad("passages", f"expected a list, got {_kind(value)}")
        return None
    out: list[_Draft] = []
    for i, item in enumerate(value):
        at = f"passages[{i}]"
        if not isinstance(item, dict):
            row.bad(at, f"expected an object, got {_kind(item)}")
            continue
        p = row.rename(item, opt.inner, at + ".")
        pid = row.ident(p["id"], f"{at}.id") if "id" in p else None
        text = row.string(p.get("text"), f"{at}.text", required=False)
        title = row.string(p.get("title"), f"{at}.title", required=False)
        url = row.string(p.get("url"), f"{at}.url", required=False)
        score = row.number(p.get("score"), f"{at}.score")
        out.append(_Draft(pid, text, f"{at}.id", f"{at}.text", title, url, score))
    return out if row.errors == before else None


def _finish(drafts: list[_Draft], row: _Row, opt: _Options) -> list[Passage]:
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
            out.append(_cut(given, row, opt.max_chars))
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
            out.append(_cut(found, row, opt.max_chars))
    return out


def _labels(value: Any, ids: set[str] | None, row: _Row) -> dict[str, int] | None:
    if value is None or value is _MISSING:
        return None
    if not isinstance(value, dict):
        row.bad("labels", f"expected an object {{passage id: grade}}, got {_kind(value)}")
        return None
    for pid, grade in value.items():
        if isinstance(grade, bool) or not isinstance(grade, int) or grade < 0:
            row.bad(f"labels.{pid}", f"expected an integer grade >= 0, got {json.dumps(grade)}")
        elif ids is not None and pid not in ids:
            row.bad(f"labels.{pid}", f"label for unknown passage id '{pid}'")
    return dict(value)


def _parse_row(obj: Any, row: _Row, opt: _Options, unused: dict[str, int]) -> Query | None:
    if not isinstance(obj, dict):
        row.bad(None, f"expected a JSON object, got {_kind(obj)}")
        return None
    data = row.rename(obj, opt.top, "")
    for key in data.keys() - ROW_FIELDS:
        unused.setdefault(key, row.line)
    qid = row.ident(data.get("query_id", f"line{row.line}"), "query_id")
    text = row.nonblank(data.get("query", _MISSING), "query")
    engine = row.nonblank(data.get("engine", "default"), "engine")
    drafts = _drafts(data, row, opt)
    expected_ids = row.listed(data.get("expected_ids"), "expected_ids", row.ident)
    expected_texts = row.listed(data.get("expected_texts"), "expected_texts", row.string)
    passages = _finish(drafts, row, opt) if drafts is not None else []
    known = None if drafts is None else {d.id or str(i) for i, d in enumerate(drafts, 1)}
    labels = _labels(data.get("labels"), known, row)
    if not row.ok or qid is None or text is None or engine is None:
        return None
    if not passages:
        row.note(f"query '{qid}' ({engine}) has no passages (kept; its metrics will be undefined)")
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


def _read_store(path: Path, inner: Mapping[str, str], sink: _Sink) -> dict[str, Passage]:
    """A JSONL passage store: id -> Passage (untruncated; fields besides ours ignored)."""
    store: dict[str, Passage] = {}
    lines: dict[str, int] = {}
    for n, obj in _json_lines(path, sink):
        row = _Row(sink, str(path), n)
        if not isinstance(obj, dict):
            row.bad(None, f"expected a JSON object, got {_kind(obj)}")
            continue
        p = row.rename(obj, inner, "")
        pid = row.ident(p.get("id", _MISSING), "id")
        text = row.string(p.get("text", _MISSING), "text")
        title = row.string(p.get("title"), "title", required=False)
        url = row.string(p.get("url"), "url", required=False)
        if pid is not None and pid in lines:
            row.bad("id", f"duplicate passage id '{pid}' (first on line {lines[pid]})")
        elif pid is not None and text is not None and row.ok:
            store[pid], lines[pid] = Passage(id=pid, text=text, title=title, url=url), n
    return store


def _load(
    path: str | Path,
    columns: Mapping[str, str] | None,
    max_chars: int,
    passage_store: str | Path | None,
    sink: _Sink,
) -> list[Query]:
    _check_limit(max_chars)
    top, inner = _split_columns(columns)
    store = None if passage_store is None else _read_store(Path(passage_store), inner, sink)
    opt = _Options(top, inner, max_chars, store, str(passage_store))
    name = str(path)
    queries: list[Query] = []
    first: dict[tuple[str, str], int] = {}
    unused: dict[str, int] = {}
    for n, obj in _json_lines(Path(path), sink):
        row = _Row(sink, name, n)
        query = _parse_row(obj, row, opt, unused)
        if query is None:
            continue
        if query.key in first:
            what = f"duplicate row for query '{query.query_id}', engine '{query.engine}'"
            row.bad("query_id", f"{what} (first on line {first[query.key]})")
            continue
        first[query.key] = n
        queries.append(query)
    for key, n in sorted(unused.items()):
        sink.note(f"field '{key}' is not used (first seen on line {n}); see columns", name)
    if not queries and not sink.errors:
        sink.error("no queries in the file", name, None)
    return queries


def read_queries(
    path: str | Path,
    *,
    columns: Mapping[str, str] | None = None,
    max_passage_chars: int = 8000,
    passage_store: str | Path | None = None,
) -> DatasetReport:
    """Read a dataset JSONL (either shape); raise one InputError listing every bad line."""
    sink = _Sink()
    queries = _load(path, columns, max_passage_chars, passage_store, sink)
    sink.raise_if_any()
    return DatasetReport(queries=tuple(queries), problems=tuple(sink.problems), **_counts(queries))


def validate(
    path: str | Path,
    *,
    columns: Mapping[str, str] | None = None,
    max_passage_chars: int = 8000,
    passage_store: str | Path | None = None,
) -> ValidationResult:
    """Check a dataset like :func:`read_queries` does, returning every error instead of raising."""
    sink = _Sink()
    try:
        queries = _load(path, columns, max_passage_chars, passage_store, sink)
    except JudgeError as exc:
        queries, sink.errors = [], [*sink.errors, InputError(str(exc))]
    return ValidationResult(
        path=str(path),
        errors=tuple(str(e) for e in sink.errors),
        problems=tuple(sink.problems),
        **_counts(queries),
    )


def _read_query_texts(path: Path, top: Mapping[str, str], sink: _Sink) -> dict[str, str]:
    """Query texts by id, from JSONL ({"query_id", "query"}) or TSV (``qid<TAB>query``)."""
    texts: dict[str, str] = {}
    lines: dict[str, int] = {}
    if path.suffix.lower() in {".jsonl", ".json"}:
        pairs: Iterator[tuple[int, Any]] = _json_lines(path, sink)
    else:
        pairs = (
            (n, dict(zip(("query_id", "query"), t.split("\t", 1), strict=False)))
            for n, t in _text_lines(path, sink)
        )
    for n, obj in pairs:
        row = _Row(sink, str(path), n)
        if not isinstance(obj, dict):
            row.bad(None, f"expected a JSON object, got {_kind(obj)}")
            continue
        data = row.rename(obj, top, "")
        qid = row.ident(data.get("query_id", _MISSING), "query_id")
        text = row.nonblank(data.get("query", _MISSING), "query")
        if qid is not None and qid in lines:
            row.bad("query_id", f"duplicate query id '{qid}' (first on line {lines[qid]})")
        elif qid is not None and text is not None:
            texts[qid], lines[qid] = text, n
    return texts


def read_trec_run(
    run_path: str | Path,
    passage_store: str | Path,
    queries: str | Path | Mapping[str, str],
    *,
    engine: str | None = None,
    columns: Mapping[str, str] | None = None,
    max_passage_chars: int = 8000,
) -> DatasetReport:
    """Query rows from a TREC run (``qid Q0 docid rank score tag``), a store and query texts.

    Each (qid, engine) becomes one Query; ``engine`` defaults to the line's run tag. Passages
    are ranked by score, highest first (as trec_eval does); equal scores keep rank order.
    """
    _check_limit(max_passage_chars)
    sink = _Sink()
    top, inner = _split_columns(columns)
    store = _read_store(Path(passage_store), inner, sink)
    if isinstance(queries, Mapping):
        texts, where = dict(queries), "the query mapping"
    else:
        texts, where = _read_query_texts(Path(queries), top, sink), str(queries)
    name = str(run_path)
    # (qid, engine) -> docid -> (score, rank, line)
    lists: dict[tuple[str, str], dict[str, tuple[float, int, int]]] = {}
    for n, line in _text_lines(Path(run_path), sink):
        row = _Row(sink, name, n)
        cols = line.split()
        if len(cols) != 6:
            row.bad(None, f"expected 6 columns (qid Q0 docid rank score tag), got {len(cols)}")
            continue
        qid, _, docid, rank, score, tag = cols
        ranked = lists.setdefault((qid, engine or tag), {})
        if not rank.lstrip("-").isdigit():
            row.bad("rank", f"not an integer: '{rank}'")
        if not _is_finite(score):
            row.bad("score", f"not a number: '{score}'")
        if qid not in texts:
            row.bad("qid", f"query '{qid}' has no text in {where}")
        if docid not in store:
            row.bad("docid", f"passage '{docid}' is not in the passage store {passage_store}")
        elif docid in ranked:
            row.bad(
                "docid", f"passage '{docid}' listed twice for '{qid}' (line {ranked[docid][2]})"
            )
        if row.ok:
            ranked[docid] = (float(score), int(rank), n)
    out: list[Query] = []
    for (qid, eng), ranked in lists.items():
        if not ranked:
            continue
        row = _Row(sink, name, min(line for _, _, line in ranked.values()))
        order = sorted(ranked, key=lambda d: (-ranked[d][0], ranked[d][1]))
        passages = (
            _cut(store[d].model_copy(update={"score": ranked[d][0]}), row, max_passage_chars)
            for d in order
        )
        source = f"{name}:{row.line}"
        out.append(
            Query(
                query_id=qid, query=texts[qid], engine=eng, passages=tuple(passages), source=source
            )
        )
    for qid in sorted(texts.keys() - {q.query_id for q in out}):
        sink.note(f"query '{qid}' has no lines in the run (skipped)", name)
    sink.raise_if_any()
    return DatasetReport(queries=tuple(out), problems=tuple(sink.problems), **_counts(out))


def _is_finite(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


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
    lines = _read_bytes(Path(path)).split(b"\n")
    sink = _Sink()
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
    sink = _Sink()
    qrels: dict[str, dict[str, int]] = {}
    for n, line in _text_lines(Path(path), sink):
        row = _Row(sink, name, n)
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
