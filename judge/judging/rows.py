"""Python values -> Queries: what ``Judge.judge`` and ``Judge.judge_many`` take.

:func:`as_query` / :func:`as_passages` turn a query text and strings, dicts or Passages into a
Query. For many queries, rows are dataset rows (dicts in the dataset JSONL shape, read by the
dataset reader's own row reader, so a row means here what it means in a file) or
:class:`~judge.schema.Query` records, mixed freely. Every row is checked before the first
request: bad ones fail together in one :class:`~judge.errors.InputError` naming each row by its
index and field (``rows[3]: field 'query': missing``). A dict without ``query_id`` gets
``row<index>``; Query records are taken as given (their passages are not truncated again).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# The dataset reader's row reader itself (private there: files are its public door), so a
# row passed here is read exactly as the same line of a dataset file would be.
from judge.data.datasets import _Options, _parse_row
from judge.data.lines import Row, Sink
from judge.errors import ConfigError, InputError
from judge.schema import Passage, Query

__all__ = ["PassageLike", "QueryRow", "as_passages", "as_queries", "as_query"]

log = logging.getLogger(__name__)

QueryRow = Mapping[str, Any] | Query
PassageLike = Passage | str | Mapping[str, Any]


def as_passages(passages: Sequence[PassageLike]) -> tuple[Passage, ...]:
    """Accept plain strings (ids "1".."n"), dicts or Passage records."""
    out: list[Passage] = []
    for i, item in enumerate(passages, start=1):
        if isinstance(item, Passage):
            out.append(item)
        elif isinstance(item, str):
            out.append(Passage(id=str(i), text=item))
        else:
            data = dict(item)
            data.setdefault("id", str(i))
            data["id"] = str(data["id"])
            out.append(Passage.model_validate(data))
    ids = [p.id for p in out]
    if len(set(ids)) != len(ids):
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        raise ConfigError(f"duplicate passage ids: {dupes}")
    return tuple(out)


def as_query(query: str | Query, passages: Sequence[PassageLike] | None) -> Query:
    """A Query from a query text and passages, or a Query (its passages replaced if given)."""
    if isinstance(query, str):
        return Query(query_id="q", query=query, passages=as_passages(passages or ()))
    update = {} if passages is None else {"passages": as_passages(passages)}
    return query.model_copy(update=update)


class _Item(Row):
    """A Python row: problems are named ``rows[i]`` (an index, not a file line)."""

    def __init__(self, sink: Sink, index: int) -> None:
        super().__init__(sink, f"rows[{index}]", index)

    def bad(self, field: str | None, message: str) -> None:
        self.sink.errors.append(InputError(message, file=self.file, field=field))
        self.errors += 1

    def note(self, message: str) -> None:
        self.sink.problems.append(f"{self.file}: {message}")


def _one(item: Any, index: int, sink: Sink, opt: _Options, unused: dict[str, int]) -> Query | None:
    if isinstance(item, Query):
        return item
    row = _Item(sink, index)
    if not isinstance(item, Mapping):
        row.bad(None, f"expected a dataset row (a dict) or a Query, got {type(item).__name__}")
        return None
    data = {"query_id": f"row{index}", **item}
    query = _parse_row(data, row, opt, unused)
    return None if query is None else query.model_copy(update={"source": row.file})


def as_queries(rows: Iterable[QueryRow], *, max_passage_chars: int = 8000) -> list[Query]:
    """Every row as a Query, or one InputError naming every bad row (``rows[i]``) and field."""
    sink = Sink()
    opt = _Options(top={}, inner={}, max_chars=max_passage_chars)
    queries: list[Query] = []
    first: dict[tuple[str, str], int] = {}
    unused: dict[str, int] = {}
    for index, item in enumerate(rows):
        query = _one(item, index, sink, opt, unused)
        if query is None:
            continue
        if query.key in first:
            what = f"duplicate row for query '{query.query_id}', engine '{query.engine}'"
            _Item(sink, index).bad("query_id", f"{what} (first at rows[{first[query.key]}])")
            continue
        first[query.key] = index
        queries.append(query)
    sink.raise_if_any()
    for key, index in sorted(unused.items()):
        sink.problems.append(f"rows[{index}]: field '{key}' is not a dataset field; ignored")
    for note in sink.problems:
        log.warning("%s", note)
    return queries
