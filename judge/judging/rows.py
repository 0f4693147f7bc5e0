"""Python values -> Queries: what ``Judge.judge`` and ``Judge.judge_many`` take.

:func:`as_query` / :func:`as_passages` turn a query text and strings, dicts or Passages into a
Query. For many queries, rows are dataset rows (dicts in the dataset JSONL shape, read by the
dataset reader's own row reader, so a row means here what it means in a file) or
:class:`~judge.schema.Query` records, mixed freely, or a pandas DataFrame, whose records are the
rows (a missing cell is a field not given; numpy arrays and numbers are read as lists and
numbers). ``columns`` renames the rows' fields to ours as a dataset file's ``[dataset]
columns`` does (``{"question": "query"}``). Every row is checked before the first request: bad
ones fail together in one :class:`~judge.errors.InputError` naming each row by its index (a
DataFrame's: its position) and field (``rows[3]: field 'query': missing``), with a one-line hint
when the rows look like another tool's (ragas, Phoenix) naming the ``columns`` to pass. A dict
without ``query_id`` gets ``row<index>``; Query records are taken as given (their passages are
not truncated again). pandas stays optional: a DataFrame is recognised only when pandas is
already imported (it cannot exist otherwise).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# The dataset reader's row reader itself (private there: files are its public door), so a
# row passed here is read exactly as the same line of a dataset file would be.
from judge.data.datasets import _Options, _parse_row
from judge.data.lines import Row, Sink
from judge.data.passages import split_columns
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
    # A row gives its query id under any name that ``columns`` maps to query_id, or gets one.
    named = any(opt.top.get(key, key) == "query_id" for key in item)
    data = dict(item) if named else {"query_id": f"row{index}", **item}
    query = _parse_row(data, row, opt, unused)
    return None if query is None else query.model_copy(update={"source": row.file})


# Other tools' row shapes: the fields that give one away, and the columns that read it. A
# Phoenix row holds one retrieved document, so its rows are grouped into lists first.
_SHAPES: dict[str, tuple[dict[str, str], str]] = {
    "ragas": ({"question": "query", "contexts": "retrieved_texts"}, ""),
    "ragas (0.2+)": ({"user_input": "query", "retrieved_contexts": "retrieved_texts"}, ""),
    "Phoenix": (
        {"input": "query", "reference": "retrieved_texts"},
        "group its one-document rows into lists first, e.g. "
        "df.groupby('input', sort=False)['reference'].agg(list).reset_index(), then ",
    ),
}


def _hint(fields: Iterable[Any], columns: Mapping[str, str]) -> str | None:
    """The line saying which ``columns`` read a failing row of a known shape, if it is one
    and they were not given."""
    given = set(fields)
    for name, (renames, first) in _SHAPES.items():
        if renames.keys() <= given and any(columns.get(k) != v for k, v in renames.items()):
            return f"hint: these look like {name} rows: {first}pass columns={renames!r}"
    return None


def _plain(value: Any) -> Any:
    """A DataFrame cell as a dataset value: numpy arrays and scalars as lists and numbers
    (``tolist``), tuples as lists, inside lists and dicts too."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return _plain(value.tolist()) if hasattr(value, "tolist") else value


def _records(rows: Iterable[Any]) -> Iterable[Any]:
    """A pandas DataFrame's rows as dicts, a missing cell (None, NaN, NA) left out as a field
    not given; anything else as it is. Iterating a DataFrame itself gives its column names."""
    pd = sys.modules.get("pandas")  # not imported: not a DataFrame, and pandas stays optional
    if pd is None or not isinstance(rows, pd.DataFrame):
        return rows
    missing = pd.api.types.is_scalar
    return [
        {k: _plain(v) for k, v in record.items() if not (missing(v) and pd.isna(v))}
        for record in rows.to_dict(orient="records")
    ]


def as_queries(
    rows: Iterable[QueryRow],
    *,
    columns: Mapping[str, str] | None = None,
    max_passage_chars: int = 8000,
) -> list[Query]:
    """Every row (or a DataFrame's) as a Query, ``columns`` renaming fields as a dataset
    file's do, or one InputError naming every bad row (``rows[i]``) and field."""
    sink = Sink()
    top, inner = split_columns(columns)
    opt = _Options(top=top, inner=inner, max_chars=max_passage_chars)
    queries: list[Query] = []
    first: dict[tuple[str, str], int] = {}
    unused: dict[str, int] = {}
    failed: Mapping[str, Any] | None = None  # the first bad dict row, for a hint
    for index, item in enumerate(_records(rows)):
        query = _one(item, index, sink, opt, unused)
        if query is None:
            if failed is None and isinstance(item, Mapping):
                failed = item
            continue
        if query.key in first:
            what = f"duplicate row for query '{query.query_id}', engine '{query.engine}'"
            _Item(sink, index).bad("query_id", f"{what} (first at rows[{first[query.key]}])")
            continue
        first[query.key] = index
        queries.append(query)
    try:
        sink.raise_if_any()
    except InputError as exc:
        hint = None if failed is None else _hint(failed, columns or {})
        if hint is None:
            raise
        message = f"{exc.detail}\n{hint}"
        raise InputError(message, file=exc.file, line=exc.line, field=exc.field) from None
    for key, index in sorted(unused.items()):
        sink.problems.append(f"rows[{index}]: field '{key}' is not a dataset field; ignored")
    for note in sink.problems:
        log.warning("%s", note)
    return queries
