"""Python values -> Queries: what ``Judge.judge`` and ``Judge.judge_many`` take.

:func:`as_query` / :func:`as_passages` turn a query text and strings, dicts or Passages into a
Query. For many queries, rows are dataset rows (dicts in the dataset JSONL shape, read by the
dataset reader's own row reader, so a row means here what it means in a file) or
:class:`~judge.schema.Query` records, mixed freely; or a table: a pandas DataFrame, a Hugging
Face ``datasets.Dataset`` or a pyarrow Table, whose records are the rows (data/frames.py: a
missing cell is a field not given, numpy values are lists and numbers, one passage per row is
grouped per query); or a dataset file's path (JSONL or Parquet, read as ``judge run`` reads
it). ``columns`` renames the rows' fields to ours as a dataset file's ``[dataset] columns``
does (``{"question": "query"}``), or names a preset for another tool's shape (``"ragas"``,
``"ragas-legacy"``, ``"phoenix"``, ``"pyterrier"``; a preset reads plain dicts as a table
too). A table that has no column for the query or its passages is refused in one line naming
what is missing and the mapping or preset to pass. Every row is checked before the first
request: bad ones fail together in one :class:`~judge.errors.InputError` naming each row by
its index (a table's: its position) and field (``rows[3]: field 'query': missing``), with a
one-line hint naming the preset when dict rows look like another tool's. A dict without
``query_id`` gets ``row<index>``; Query records are taken as given (their passages are not
truncated again). pandas, datasets and pyarrow stay optional: nothing imports them here.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

# The dataset reader's row reader itself (private there: files are its public door), so a
# row passed here is read exactly as the same line of a dataset file would be.
from judge.data.datasets import _Options, _parse_row, read_queries
from judge.data.frames import PRESETS, as_table, dict_table, matching_preset, resolve_columns
from judge.data.lines import Row, Sink, id_text
from judge.data.passages import check_limit, split_columns, truncate
from judge.errors import InputError
from judge.schema import Passage, Query
from judge.sections import DEFAULT_PASSAGE_CHARS

__all__ = ["PassageLike", "QueryRow", "Rows", "as_passages", "as_queries", "as_query"]

log = logging.getLogger(__name__)

QueryRow = Mapping[str, Any] | Query
PassageLike = Passage | str | Mapping[str, Any]
# Rows, or a DataFrame / datasets.Dataset / pyarrow Table (not typed here: all optional), or a
# dataset file's path (JSONL or Parquet).
Rows = Iterable[QueryRow] | str | os.PathLike[str] | Any


# Tables (pandas, pyarrow, Hugging Face datasets): rows of queries for judge_many, never one
# query's passages.
_TABLES = frozenset({"DataFrame", "Table", "Dataset", "DatasetDict"})


def as_passages(
    passages: Iterable[PassageLike], *, max_passage_chars: int = DEFAULT_PASSAGE_CHARS
) -> tuple[Passage, ...]:
    """Plain strings (ids "1".."n"), dicts or Passage records, each text cut to
    ``max_passage_chars`` as a dataset's are (0: uncut). Anything else, or one string or
    dict where the list goes (whose characters or keys would each be judged and paid for),
    is an InputError naming it."""
    if isinstance(passages, str | bytes | Mapping | Passage) or not isinstance(passages, Iterable):
        raise InputError(
            "passages: expected a list of passages (strings, dicts or Passages), got one "
            f"{type(passages).__name__}"
        )
    if type(passages).__name__ in _TABLES:  # iterating a DataFrame gives its column names
        raise InputError(
            f"passages: got a {type(passages).__name__}, whose iteration gives its column "
            "names (each would be judged, and paid for, as a passage): give a list, such as "
            "df['text'].tolist() or df.to_dict('records'), or the whole table to judge_many"
        )
    out: list[Passage] = []
    for i, item in enumerate(passages):
        where = f"passages[{i}]"
        if isinstance(item, Passage):
            passage = item
        elif isinstance(item, str):
            passage = Passage(id=str(i + 1), text=item)
        elif isinstance(item, Mapping):
            data = {"id": str(i + 1), **item}
            data["id"], problem = id_text(data["id"])  # as a dataset's ids are read
            if problem:
                raise InputError(f"{where}: field 'id': {problem}")
            try:
                passage = Passage.model_validate(data)
            except ValidationError as exc:
                err = exc.errors()[0]
                field = ".".join(str(p) for p in err["loc"])
                raise InputError(f"{where}: field '{field}': {err['msg']}") from None
        else:
            raise InputError(
                f"{where}: expected a string, a dict or a Passage, got {type(item).__name__}"
            )
        short = truncate(passage.text, max_passage_chars)
        if short != passage.text:
            passage = passage.model_copy(
                update={"text": short, "truncated_from": len(passage.text)}
            )
        out.append(passage)
    first: dict[str, int] = {}
    for i, passage in enumerate(out):
        if (at := first.setdefault(passage.id, i)) != i:
            raise InputError(
                f"passages[{i}]: id '{passage.id}' is passages[{at}]'s too (a passage given "
                "without an id is numbered by its place from 1)"
            )
    return tuple(out)


def as_query(
    query: str | Query,
    passages: Iterable[PassageLike] | None,
    *,
    max_passage_chars: int = DEFAULT_PASSAGE_CHARS,
) -> Query:
    """A Query from a query text and passages, or a Query (its passages replaced if given),
    the passages cut at ``max_passage_chars`` (:func:`as_passages`); a query that is neither
    a non-empty string nor a Query is an InputError."""
    cut = functools.partial(as_passages, max_passage_chars=max_passage_chars)
    if isinstance(query, str):
        if not query.strip():
            raise InputError("query: empty; give the text the passages were retrieved for")
        given = () if passages is None else passages  # an array's truth value is an error
        return Query(query_id="q", query=query, passages=cut(given))
    if not isinstance(query, Query):
        raise InputError(f"query: expected a string or a Query, got {type(query).__name__}")
    update = {} if passages is None else {"passages": cut(passages)}
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


def _named(item: Any, opt: _Options) -> bool:
    """Whether ``item`` gives its query id (under any name ``columns`` maps to query_id)."""
    return isinstance(item, Mapping) and any(opt.top.get(k, k) == "query_id" for k in item)


def _one(
    item: Any, index: int, sink: Sink, opt: _Options, unused: dict[str, int], ids: bool
) -> Query | None:
    if isinstance(item, Query):
        return item
    row = _Item(sink, index)
    if not isinstance(item, Mapping):
        row.bad(None, f"expected a dataset row (a dict) or a Query, got {type(item).__name__}")
        return None
    # A row gives its query id, or gets one (``row<index>``); in a table whose other rows
    # give one (``ids``), a row without one is missing it.
    named = _named(item, opt)
    if ids and not named:
        row.bad("query_id", "missing (other rows give one)")
        return None
    data = dict(item) if named else {"query_id": f"row{index}", **item}
    query = _parse_row(data, row, opt, unused)
    return None if query is None else query.model_copy(update={"source": row.file})


def _hint(fields: Iterable[Any], columns: Mapping[str, str] | str | None) -> str | None:
    """The line naming the preset that reads a failing row of another tool's shape (ragas,
    Phoenix, PyTerrier: data/frames.py), if it is one and neither it nor its renames were
    given."""
    if isinstance(columns, str):
        return None
    name = matching_preset(list(fields))
    if name is None or PRESETS[name].columns.items() <= dict(columns or {}).items():
        return None
    return f"hint: these look like {name} rows: pass columns='{name}'"


def _table_rows(
    rows: Any, columns: Mapping[str, str] | str | None, max_chars: int
) -> tuple[Iterable[Any], dict[str, str], list[Query], bool]:
    """What ``rows`` holds, as (rows to parse, the renames to parse them with, Queries read
    already, whether they came from a table): a path (str or PathLike) is a dataset file
    read by the file reader (JSONL or Parquet); a DataFrame, Dataset or pyarrow Table is
    checked for a query and passages column first, and one passage per row grouped
    (data/frames.py); anything else as it is."""
    renames, preset = resolve_columns(columns)
    split_columns(renames)  # a mapping to an unknown field is named before anything is read
    if isinstance(rows, str | os.PathLike):
        report = read_queries(Path(rows), columns=columns, max_passage_chars=max_chars)
        for note in report.problems:
            log.warning("%s", note)
        return [], renames, list(report.queries), False
    table = as_table(rows)
    if table is None and isinstance(columns, str):  # a preset reads plain dicts as a table
        rows = list(rows)
        if all(isinstance(r, Mapping) for r in rows):
            table = dict_table(rows)
    if table is None:
        if isinstance(rows, str | bytes | Mapping | Query) or not isinstance(rows, Iterable):
            # one row where the rows go: a dict's keys would each be read as a row
            raise InputError(
                f"rows: expected rows (a list of dicts or Queries, a DataFrame, a "
                f"dataset path), got one {type(rows).__name__}"
            )
        return rows, renames, [], False
    return [row for _, row in table.dataset_rows(renames, preset)], renames, [], True


def as_queries(
    rows: Rows,
    *,
    columns: Mapping[str, str] | str | None = None,
    max_passage_chars: int = DEFAULT_PASSAGE_CHARS,
) -> list[Query]:
    """Every row (or a DataFrame's, a Dataset's, a dataset file's) as a Query, ``columns``
    renaming fields as a dataset file's do (or naming a preset), or one InputError naming
    every bad row (``rows[i]``) and field."""
    check_limit(max_passage_chars)
    items, renames, queries, tabled = _table_rows(rows, columns, max_passage_chars)
    sink = Sink()
    top, inner = split_columns(renames)
    opt = _Options(top=top, inner=inner, max_chars=max_passage_chars)
    first: dict[tuple[str, str], int] = {}
    unused: dict[str, int] = {}
    failed: Mapping[str, Any] | None = None  # the first bad dict row, for a hint
    # A table's id column with a gap (pandas makes it NaN, read as no cell) is a missing id;
    # plain dict rows may mix rows with ids and rows numbered by their place.
    items = list(items)
    ids = tabled and any(_named(item, opt) for item in items)
    for index, item in enumerate(items):
        query = _one(item, index, sink, opt, unused, ids)
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
        hint = None if failed is None else _hint(failed, columns)
        if hint is None:
            raise
        message = f"{exc.detail}\n{hint}"
        raise InputError(message, file=exc.file, line=exc.line, field=exc.field) from None
    for key, index in sorted(unused.items()):
        sink.problems.append(f"rows[{index}]: field '{key}' is not a dataset field; ignored")
    for note in sink.problems:
        log.warning("%s", note)
    return queries
