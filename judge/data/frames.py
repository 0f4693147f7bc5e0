"""Rows from where they live: pandas DataFrames, Hugging Face ``datasets.Dataset``s, pyarrow
Tables and Parquet files as dataset rows, and presets for other tools' shapes.

A :class:`Table` is a source's column names and its rows as dicts in the dataset JSONL shape
(a missing cell, None / NaN / NA, is a field not given; numpy values are read as lists and
numbers; a DataFrame's named index levels are columns, as Phoenix's span ids are). pandas,
datasets and pyarrow stay optional: an object is recognised as a DataFrame, Dataset or Table
only when its library is already imported (it cannot exist otherwise), and pyarrow is imported
only to read a Parquet file.

``columns`` renames a source's columns to our fields as a dataset file's do, or names a preset
(:data:`PRESETS`: ``ragas``, ``ragas-legacy``, ``phoenix``, ``pyterrier``) that does. A preset
may also order each query's passages by one of its columns and drop columns it knows are not
ours. A table with one passage per row (a column gives ``text``, none gives ``passages`` or
``retrieved_*``) is grouped into one row per (query id or query text, engine), in first-seen
order; the query's fields are its first row's. A table whose columns cannot give a query or
its passages is refused before anything is read, in one line naming the missing field, the
columns there are and the mapping or preset to pass.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from judge.data.passages import PASSAGE_FIELDS, ROW_FIELDS
from judge.errors import ConfigError, InputError

__all__ = [
    "PRESETS",
    "Preset",
    "Table",
    "as_table",
    "dict_table",
    "matching_preset",
    "read_parquet",
    "resolve_columns",
]

_LISTS = ("passages", "retrieved_texts", "retrieved_ids")


@dataclass(frozen=True)
class Preset:
    """Another tool's shape: its columns -> ours, the column that orders a query's passages
    (one passage per row), and columns of that tool that are not ours, dropped unnoted."""

    columns: Mapping[str, str]
    about: str
    order: str | None = None
    drop: frozenset[str] = field(default_factory=frozenset)


PRESETS: dict[str, Preset] = {
    "ragas": Preset(
        {
            "user_input": "query",
            "retrieved_contexts": "retrieved_texts",
            "reference_contexts": "expected_texts",
        },
        "ragas 0.2+ EvaluationDataset.to_pandas() / its HF dataset",
        drop=frozenset({"response", "reference", "multi_responses", "rubrics"}),
    ),
    "ragas-legacy": Preset(
        {"question": "query", "contexts": "retrieved_texts"},
        "ragas < 0.2 question / contexts datasets",
        drop=frozenset({"answer", "ground_truth", "ground_truths"}),
    ),
    "phoenix": Preset(
        {
            "context.span_id": "query_id",
            "input": "query",
            "reference": "text",
            "document_score": "score",
        },
        "Phoenix get_retrieved_documents(): one retrieved document per row",
        order="document_position",
        drop=frozenset({"context.trace_id"}),
    ),
    "pyterrier": Preset(
        {"qid": "query_id", "query": "query", "docno": "id", "text": "text", "score": "score"},
        "a PyTerrier result / TREC run joined with its topics and texts: one document per row",
        order="rank",
        drop=frozenset({"docid", "query_0"}),
    ),
}


def resolve_columns(columns: Mapping[str, str] | str | None) -> tuple[dict[str, str], Preset]:
    """``columns`` as (renames, preset): a preset's name gives its own; a mapping, no order."""
    if isinstance(columns, str):
        if columns not in PRESETS:
            raise ConfigError(
                f"columns: unknown preset '{columns}' (presets: {', '.join(PRESETS)}); "
                "or pass a mapping of your columns to ours"
            )
        preset = PRESETS[columns]
        return dict(preset.columns), preset
    renames = dict(columns or {})
    return renames, Preset(renames, "columns given")


@dataclass(frozen=True)
class Table:
    """A tabular source: its name for messages, its column names, its rows."""

    name: str
    columns: tuple[str, ...]
    rows: Sequence[dict[str, Any]]

    def dataset_rows(
        self, renames: Mapping[str, str], preset: Preset, *, hint: str = "columns="
    ) -> list[tuple[int, dict[str, Any]]]:
        """(row number from 1, row) in the dataset shape, checked to give a query and passages
        first; one passage per row grouped into one row per query, numbered by its first.
        ``hint`` says how the reader is given a mapping, for the missing column's line."""
        present = [c for c in self.columns if c not in preset.drop]
        ours = {c: renames.get(c, c) for c in present}
        gives = set(ours.values())
        long = "text" in gives and not gives & set(_LISTS)
        free = [c for c in present if ours[c] not in ROW_FIELDS | PASSAGE_FIELDS]
        if "query" not in gives:
            raise InputError(self._missing("the query", "query", free, hint), file=self.name)
        if not (long or gives & set(_LISTS)):
            missing = self._missing("the passages", "retrieved_texts", free, hint)
            raise InputError(missing, file=self.name)
        rows = [{k: v for k, v in r.items() if k not in preset.drop} for r in self.rows]
        if long:
            return _grouped(rows, ours, preset.order, self.name)
        return list(enumerate(rows, start=1))

    def _missing(self, what: str, target: str, free: Sequence[str], hint: str) -> str:
        """The line saying ``what`` no column gives, the columns there are, and the preset
        they look like or a mapping of a ``free`` column (not one of ours) to pass."""
        shown = ", ".join(self.columns[:12]) + (" ..." if len(self.columns) > 12 else "")
        preset = matching_preset(self.columns)
        if preset is not None:
            fix = f"these look like {preset} rows: pass the preset, {hint}'{preset}'"
        else:
            fix = f"map one: {hint}{_guess(free, target, self.rows)!r}"
        return f"no column gives {what} ('{target}'; columns: {shown}); {fix}"


def matching_preset(columns: Sequence[str]) -> str | None:
    """The first preset whose query and passage columns are all in ``columns``."""
    have = set(columns)
    for name, preset in PRESETS.items():
        needed = {c for c, ours in preset.columns.items() if ours in {"query", *_LISTS, "text"}}
        if needed <= have:
            return name
    return None


_QUERY_WORDS = ("query", "question", "input", "prompt", "topic")
_PASSAGE_WORDS = ("context", "passage", "doc", "reference", "retrieved", "chunk", "text")


def _guess(columns: Sequence[str], target: str, rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    """A mapping to suggest: the first of ``columns`` whose name looks like ``target``'s, else
    the first (a list column is a query's passages; a scalar one, one passage per row)."""
    words = _QUERY_WORDS if target == "query" else _PASSAGE_WORDS
    found = next((c for w in words for c in columns if w in c.lower()), None)
    column = found or (columns[0] if columns else "YOUR_COLUMN")
    if target != "query" and rows and not isinstance(rows[0].get(column), list):
        target = "text"
    return {column: target}


def _key(value: Any) -> Any:
    return repr(value) if isinstance(value, list | dict) else value


def _grouped(
    rows: Sequence[dict[str, Any]], ours: Mapping[str, str], order: str | None, name: str
) -> list[tuple[int, dict[str, Any]]]:
    """One passage per row -> one row per query: keyed by the columns giving query_id and
    engine (else query and engine), passages ordered by ``order`` when every row has it. A
    row whose query fields differ from its group's first (another question under one id) is
    an InputError naming it: it was dropped unsaid."""
    inner = {c for c, f in ours.items() if f in PASSAGE_FIELDS}
    ids = [c for c, f in ours.items() if f == "query_id"]
    engine = [c for c, f in ours.items() if f == "engine"]
    keys = (ids or [c for c, f in ours.items() if f == "query"]) + engine
    # A row whose id cell is empty is grouped by its question, as a table without ids is (its
    # query then takes the id line<N>, as a JSONL line without one): every such row had been
    # one query, "'query' is 'stale bread' here but 'renew passport' in row 1".
    by_text = [c for c, f in ours.items() if f == "query"] + engine
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    starts: dict[tuple[Any, ...], int] = {}
    lines: dict[int, int] = {}  # id(row) -> its row number, for a row with no position
    for n, row in enumerate(rows, start=1):
        if ids and all(row.get(k) in (None, "") for k in ids):  # "" too: a string column's
            for k in ids:
                row.pop(k, None)
            key = ("\x00no id", *(_key(row.get(k)) for k in by_text))
        else:
            key = tuple(_key(row.get(k)) for k in keys)
        if key in groups:
            _same_query(row, groups[key][0], n, starts[key], ours, name)
        groups.setdefault(key, []).append(row)
        starts.setdefault(key, n)
        lines[id(row)] = n
    out = []
    for key, members in groups.items():
        if order is not None and any(order in m for m in members):
            _check_positions(members, order, name, lines)
            members = sorted(members, key=lambda m: m[order])
        first = members[0]
        row = {k: v for k, v in first.items() if k not in inner and k != order}
        row["passages"] = [{k: v for k, v in m.items() if k in inner} for m in members]
        out.append((starts[key], row))
    return out


def _check_positions(
    members: Sequence[dict[str, Any]], order: str, name: str, lines: Mapping[int, int]
) -> None:
    """InputError naming the first of a query's rows whose position (``order``) is missing or
    not a number while others have one: its passages' order is not known (they had been
    judged in row order, unsaid, and ranked metrics computed on that order)."""
    for m in members:
        value = m.get(order)
        if isinstance(value, bool) or not isinstance(value, int | float):
            shown = "missing" if value is None else f"{value!r}, not a number"
            raise InputError(
                f"{shown}, while other rows of the same query give their position: the order "
                "of its passages is not known",
                file=name,
                line=lines[id(m)],
                field=order,
            )


def _same_query(
    row: dict[str, Any],
    first: dict[str, Any],
    n: int,
    at: int,
    ours: Mapping[str, str],
    name: str,
) -> None:
    """InputError when ``row`` (row ``n``) gives another value of a query field (the query,
    its labels, its expected answers) than its query's first row (row ``at``)."""
    for column in sorted(c for c in row.keys() | first.keys() if ours.get(c, c) in ROW_FIELDS):
        if _key(row.get(column)) != _key(first.get(column)):
            raise InputError(
                f"{ours.get(column, column)!r} is {row.get(column)!r} here but "
                f"{first.get(column)!r} in row {at} of the same query: one query's rows give "
                "it once",
                file=name,
                line=n,
                field=column,
            )


def _plain(value: Any, structs: bool = False) -> Any:
    """A cell as a dataset value: numpy arrays and scalars as lists and numbers (``tolist``),
    tuples as lists, inside lists and dicts too. ``structs``: the cell is Arrow's, whose
    struct values hold every key any row has, null where a row has none (a passage with no
    title, a query's labels of the other queries' passages): a null there is a key not given."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return {
            k: _plain(v, structs) for k, v in value.items() if not (structs and _missing_cell(v))
        }
    if isinstance(value, list | tuple):
        return [_plain(v, structs) for v in value]
    return _plain(value.tolist(), structs) if hasattr(value, "tolist") else value


def _missing_cell(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float):
        return math.isnan(value)
    pd = sys.modules.get("pandas")
    return pd is not None and value is pd.NA


def _cells(records: Iterable[Mapping[str, Any]], structs: bool = False) -> list[dict[str, Any]]:
    out = []
    for record in records:
        plain = {str(k): _plain(v, structs) for k, v in record.items()}
        out.append({k: v for k, v in plain.items() if not _missing_cell(v)})
    return out


def _arrow_cells(table: Any) -> list[dict[str, Any]]:
    """A pyarrow Table's rows as cells: a map column (read as a list of key-value pairs) as
    the dict it is, and its structs' nulls as keys not given (:func:`_plain`)."""
    import pyarrow as pa  # the table is one: pyarrow is imported already

    maps = [f.name for f in table.schema if pa.types.is_map(f.type)]
    rows = table.to_pylist()
    for row in rows:
        for name in maps:
            if isinstance(pairs := row.get(name), list):
                row[name] = dict(pairs)
    return _cells(rows, structs=True)


def _of(module: str, attribute: str) -> Any:
    """``module.attribute`` when the module is already imported, else None."""
    mod = sys.modules.get(module)
    return None if mod is None else getattr(mod, attribute, None)


def as_table(rows: Any) -> Table | None:
    """A DataFrame, a ``datasets.Dataset`` or a pyarrow Table as a :class:`Table`; None for
    anything else (an iterable of rows). A ``DatasetDict`` is refused: pick a split."""
    frame, dataset = _of("pandas", "DataFrame"), _of("datasets", "Dataset")
    arrow, splits = _of("pyarrow", "Table"), _of("datasets", "DatasetDict")
    if frame is not None and isinstance(rows, frame):
        # Named index levels (Phoenix's span ids) are columns; a level named as a column is
        # that column's copy (set_index(..., drop=False)) and is dropped, not a clash.
        copies = [n for n in rows.index.names if n is not None and n in rows.columns]
        if copies:
            rows = rows.reset_index(level=copies, drop=True)
        if any(name is not None for name in rows.index.names):
            rows = rows.reset_index()
        columns = tuple(str(c) for c in rows.columns)
        if len(set(columns)) < len(columns):  # to_dict keeps one of them, unsaid
            twice = sorted({c for c in columns if columns.count(c) > 1})
            raise InputError(
                f"rows: column(s) {', '.join(map(repr, twice))} given more than once: one of "
                "each would be read and the other lost; rename or drop them"
            )
        return Table("rows", columns, _cells(rows.to_dict(orient="records")))
    if splits is not None and isinstance(rows, splits):
        raise InputError(
            f"rows: a DatasetDict of splits ({', '.join(rows)}); pass one split, e.g. ds['train']"
        )
    if dataset is not None and isinstance(rows, dataset):
        # Its rows through its indices (a selected or shuffled Dataset), structs as Arrow's.
        return Table("rows", tuple(rows.column_names), _cells(rows.to_list(), structs=True))
    if arrow is not None and isinstance(rows, arrow):
        return Table("rows", tuple(rows.column_names), _arrow_cells(rows))
    return None


def dict_table(rows: Sequence[Mapping[str, Any]]) -> Table:
    """Plain dicts as a :class:`Table`: its columns every key seen, in first-seen order."""
    columns = tuple(dict.fromkeys(str(k) for row in rows for k in row))
    return Table("rows", columns, _cells(rows))


def read_parquet(path: Path) -> Table:
    """A Parquet file as a :class:`Table` (needs pyarrow: ``pip install 'judge[parquet]'``)."""
    try:
        import pyarrow.parquet as pq  # optional: only a Parquet dataset needs it
    except ImportError:
        raise ConfigError(
            f"{path}: reading Parquet needs pyarrow: pip install 'judge[parquet]'"
        ) from None
    try:
        table = pq.read_table(path)
    except FileNotFoundError:
        missing = "cannot read the file (No such file or directory)"
        raise InputError(missing, file=str(path)) from None
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"not a readable Parquet file: {first}", file=str(path)) from None
    return Table(str(path), tuple(table.column_names), _arrow_cells(table))
