"""Read a TREC run (``qid Q0 docid rank score tag``) into query rows, over a passage store.

Passage texts come from the passage store (JSONL ``{"id", "text", "title"?, "url"?}``), query
texts from a JSONL file (``{"query_id", "query"}``), a TSV file (``qid<TAB>query``) or a
mapping. Passages are truncated by the same policy as dataset rows (:mod:`judge._passages`).
Every bad line is collected, then one InputError lists them (``file:line: field 'x': what``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from judge.data.lines import MISSING, Row, Sink, is_integer, json_lines, objects, text_lines
from judge.data.passages import DatasetReport, check_limit, counts, cut, read_store, split_columns
from judge.schema import Passage, Query
from judge.sections import DEFAULT_PASSAGE_CHARS

__all__ = ["read_trec_run"]


def _read_query_texts(path: Path, top: Mapping[str, str], sink: Sink) -> dict[str, str]:
    """Query texts by id, from JSONL ({"query_id", "query"}) or TSV (``qid<TAB>query``)."""
    texts: dict[str, str] = {}
    lines: dict[str, int] = {}
    if path.suffix.lower() in {".jsonl", ".json"}:
        pairs: Iterator[tuple[int, Any]] = json_lines(path, sink)
    else:
        pairs = (
            (n, dict(zip(("query_id", "query"), t.split("\t", 1), strict=False)))
            for n, t in text_lines(path, sink)
        )
    for row, data in objects(pairs, str(path), sink, top):
        qid = row.ident(data.get("query_id", MISSING), "query_id")
        text = row.nonblank(data.get("query", MISSING), "query")
        if qid is not None and qid in lines:
            row.bad("query_id", f"duplicate query id '{qid}' (first on line {lines[qid]})")
        elif qid is not None and text is not None:
            texts[qid], lines[qid] = text, row.line
    return texts


def read_trec_run(
    run_path: str | Path,
    passage_store: str | Path,
    queries: str | Path | Mapping[str, str],
    *,
    engine: str | None = None,
    columns: Mapping[str, str] | None = None,
    max_passage_chars: int = DEFAULT_PASSAGE_CHARS,
) -> DatasetReport:
    """Query rows from a TREC run (``qid Q0 docid rank score tag``), a store and query texts.

    Each (qid, engine) becomes one Query; ``engine`` defaults to the line's run tag. Passages
    are ranked by score, highest first (as trec_eval does); equal scores keep rank order.
    """
    check_limit(max_passage_chars)
    sink = Sink()
    top, inner = split_columns(columns)
    store = read_store(Path(passage_store), inner, sink)
    if isinstance(queries, Mapping):
        texts, where = dict(queries), "the query mapping"
    else:
        texts, where = _read_query_texts(Path(queries), top, sink), str(queries)
    name = str(run_path)
    # (qid, engine) -> docid -> (score, rank, line)
    lists: dict[tuple[str, str], dict[str, tuple[float, int, int]]] = {}
    for n, line in text_lines(Path(run_path), sink):
        row = Row(sink, name, n)
        cols = line.split()
        if len(cols) != 6:
            row.bad(None, f"expected 6 columns (qid Q0 docid rank score tag), got {len(cols)}")
            continue
        qid, _, docid, rank, score, tag = cols
        ranked = lists.setdefault((qid, engine or tag), {})
        if not is_integer(rank):
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
    out = _queries(lists, store, texts, sink, name, max_passage_chars)
    for qid in sorted(texts.keys() - {q.query_id for q in out}):
        sink.note(f"query '{qid}' has no lines in the run (skipped)", name)
    if not out and not sink.errors:  # an empty run judged nothing, then failed a threshold
        sink.error("no run lines: nothing to judge", name, None)
    sink.raise_if_any()
    return DatasetReport(queries=tuple(out), problems=tuple(sink.problems), **counts(out))


def _queries(
    lists: Mapping[tuple[str, str], Mapping[str, tuple[float, int, int]]],
    store: Mapping[str, Passage],
    texts: Mapping[str, str],
    sink: Sink,
    name: str,
    max_passage_chars: int,
) -> list[Query]:
    """One Query per (qid, engine), passages by score (highest first), equal scores by rank."""
    out: list[Query] = []
    for (qid, eng), ranked in lists.items():
        if not ranked:
            continue
        row = Row(sink, name, min(line for _, _, line in ranked.values()))
        order = sorted(ranked, key=lambda d: (-ranked[d][0], ranked[d][1]))
        passages = (
            cut(store[d].model_copy(update={"score": ranked[d][0]}), row, max_passage_chars)
            for d in order
        )
        source = f"{name}:{row.line}"
        out.append(
            Query(
                query_id=qid, query=texts[qid], engine=eng, passages=tuple(passages), source=source
            )
        )
    return out


def _is_finite(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False
