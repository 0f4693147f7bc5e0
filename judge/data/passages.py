"""What the dataset and TREC run readers share: columns, truncation, the store, the report.

Columns: ``columns`` renames the user's field names to ours (:data:`ROW_FIELDS`,
:data:`PASSAGE_FIELDS`); :func:`split_columns` sorts each rename to the level (row or passage)
where its target field lives.

Truncation policy: a passage longer than ``max_passage_chars`` (0 = no limit) keeps its
first ``max_passage_chars`` characters; when whitespace falls within the last 10% of those,
the cut moves back to the last whitespace so no word is split (text without spaces, such as
Chinese, is cut exactly). " …[truncated]" is appended so the judge knows the text goes on;
``Passage.truncated_from`` keeps the original length and the cut is listed in ``problems``.

Passage store: JSONL ``{"id", "text", "title"?, "url"?}`` read by :func:`read_store`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from judge.data.lines import MISSING, Row, Sink, json_lines, objects
from judge.errors import ConfigError
from judge.schema import Passage, Query, Record

__all__ = [
    "PASSAGE_FIELDS",
    "ROW_FIELDS",
    "TRUNCATION_MARKER",
    "Counts",
    "DatasetReport",
    "check_limit",
    "counts",
    "cut",
    "read_store",
    "split_columns",
    "truncate",
]

TRUNCATION_MARKER = " …[truncated]"
ROW_FIELDS = frozenset(
    {"query_id", "query", "engine", "passages", "retrieved_ids", "retrieved_texts"}
    | {"expected_ids", "expected_texts", "labels"}
)
PASSAGE_FIELDS = frozenset({"id", "text", "title", "url", "score"})


class Counts(Record):
    n_queries: int  # rows, i.e. (query_id, engine) pairs
    n_query_ids: int
    n_passages: int
    engines: tuple[str, ...]
    n_labelled: int
    n_truncated: int
    n_empty: int


class DatasetReport(Counts):
    """The queries read from a dataset, the non-fatal notes about them, and counts."""

    queries: tuple[Query, ...]
    problems: tuple[str, ...] = ()


def counts(queries: Sequence[Query]) -> dict[str, Any]:
    """The :class:`Counts` fields for ``queries``, as keyword arguments."""
    return {
        "n_queries": len(queries),
        "n_query_ids": len({q.query_id for q in queries}),
        "n_passages": sum(len(q.passages) for q in queries),
        "engines": tuple(sorted({q.engine for q in queries})),
        "n_labelled": sum(q.labels is not None for q in queries),
        "n_truncated": sum(p.truncated_from is not None for q in queries for p in q.passages),
        "n_empty": sum(not q.passages for q in queries),
    }


def split_columns(columns: Mapping[str, str] | None) -> tuple[dict[str, str], dict[str, str]]:
    """``columns`` split into (row-level renames, passage-level renames)."""
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


def check_limit(max_chars: int) -> None:
    if max_chars < 0:
        raise ConfigError(f"max_passage_chars must be >= 0 (0 = no limit), got {max_chars}")


def truncate(text: str, limit: int) -> str:
    """``text`` cut by this module's truncation policy; unchanged if it fits or limit is 0."""
    if limit <= 0 or len(text) <= limit:
        return text
    head = text[:limit]
    for i in range(limit - 1, limit - limit // 10 - 1, -1):
        if head[i].isspace():
            head = head[:i]
            break
    return head.rstrip() + TRUNCATION_MARKER


def cut(passage: Passage, row: Row, max_chars: int) -> Passage:
    """``passage`` with the truncation policy applied, noting any cut or empty text."""
    short = truncate(passage.text, max_chars)
    if short == passage.text:
        if passage.blank:
            row.note(f"passage '{passage.id}' has no text: judged not relevant without asking")
        return passage
    kept = len(short) - len(TRUNCATION_MARKER)
    row.note(f"passage '{passage.id}' truncated from {len(passage.text)} to {kept} characters")
    return passage.model_copy(update={"text": short, "truncated_from": len(passage.text)})


def read_store(path: Path, inner: Mapping[str, str], sink: Sink) -> dict[str, Passage]:
    """A JSONL passage store: id -> Passage (untruncated; fields besides ours ignored)."""
    store: dict[str, Passage] = {}
    lines: dict[str, int] = {}
    for row, p in objects(json_lines(path, sink), str(path), sink, inner):
        pid = row.ident(p.get("id", MISSING), "id")
        text = row.string(p.get("text", MISSING), "text")
        title = row.string(p.get("title"), "title", required=False)
        url = row.string(p.get("url"), "url", required=False)
        if pid is not None and pid in lines:
            row.bad("id", f"duplicate passage id '{pid}' (first on line {lines[pid]})")
        elif pid is not None and text is not None and row.ok:
            store[pid], lines[pid] = Passage(id=pid, text=text, title=title, url=url), row.line
    return store
