"""Judged queries as tidy tables: what ``Judge.judge_many`` returns and ``judge.read_run`` loads.

:class:`Judgements` is a read-only sequence of :class:`~judge.schema.JudgedQuery` with two
flat views, plain dicts from :meth:`Judgements.to_records` and pandas DataFrames from
:meth:`Judgements.to_pandas` (pandas is optional: ``pip install 'judge[pandas]'``):

- ``"passages"``: one row per (query, engine, repeat, passage): the judge's label, grade,
  P(relevant), reason, where the label came from (judge or a cascade's reranker), whether it
  was cached, its latency and tokens, and the human grade when the dataset row has labels.
- ``"queries"``: one row per (query, engine, repeat): verdict counts, tokens, and each metric
  as its own column, named as in reports (``ndcg@5``), None (NaN in pandas) when undefined.

Columns are fixed per kind, so code written against one run works on the next; the optional
ones (:data:`OPTIONAL_COLUMNS`: titles, urls, reranker scores, expected grades, human grades,
errors, raw answers) appear only when some row has a value for them, so a plain run is not
padded with empty columns. Labels are a column, never one column per passage id.

The repr counts the judged queries and the ok / unparsed / error verdicts; in Jupyter,
``_repr_html_`` shows those counts above each engine's mean of every metric (per query id the
mean over its repeats where defined, then over query ids). Engines compared with paired
statistics are a later stage's: ``judge.compare_engines(judgements)`` (judge/report/read.py).
"""

from __future__ import annotations

import html
import importlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, overload

from judge.schema import JudgedQuery, MetricPolicy, Passage, Scale, Verdict

__all__ = ["OPTIONAL_COLUMNS", "Judgements", "Kind", "pandas"]

Kind = Literal["passages", "queries"]
Record = dict[str, Any]

# Each kind's columns in order, with the pandas dtype that keeps missing values missing
# (nullable integers and booleans; None: as pandas infers, for text).
_PASSAGE_COLUMNS: dict[str, str | None] = {
    "query_id": None,
    "engine": None,
    "repeat": "Int64",
    "query": None,
    "rank": "Int64",
    "passage_id": None,
    "title": None,
    "url": None,
    "text": None,
    "status": None,
    "label": None,
    "grade": "Int64",
    "relevant": "boolean",
    "probability": "Float64",
    "expected_grade": "Float64",
    "rerank_score": "Float64",
    "human_grade": "Int64",
    "reason": None,
    "error": None,
    "raw": None,
    "source": None,
    "cached": "boolean",
    "latency_s": "Float64",
    "attempts": "Int64",
    "prompt_tokens": "Int64",
    "completion_tokens": "Int64",
}
_QUERY_COLUMNS: dict[str, str | None] = {
    "query_id": None,
    "engine": None,
    "repeat": "Int64",
    "query": None,
    "passages": "Int64",
    "ok": "Int64",
    "unparsed": "Int64",
    "error": "Int64",
    "cached": "Int64",
    "labelled": "Int64",
    "prompt_tokens": "Int64",
    "completion_tokens": "Int64",
}
# Shown only when some row has a value (a query row's "labelled": when some query has labels).
OPTIONAL_COLUMNS = frozenset(
    {"title", "url", "expected_grade", "rerank_score", "human_grade", "error", "raw", "labelled"}
)


def _passage_record(jq: JudgedQuery, v: Verdict, passage: Passage | None) -> Record:
    labels = jq.query.labels or {}
    scores = jq.rerank_scores or {}
    return {
        "query_id": jq.query.query_id,
        "engine": jq.query.engine,
        "repeat": jq.repeat,
        "query": jq.query.query,
        "rank": v.rank,
        "passage_id": v.passage_id,
        "title": passage.title if passage else None,
        "url": passage.url if passage else None,
        "text": passage.text if passage else None,
        "status": v.status,
        "label": v.label,
        "grade": v.grade,
        "relevant": v.relevant,
        "probability": v.probability,
        "expected_grade": v.expected_grade,
        "rerank_score": scores.get(v.passage_id),
        "human_grade": labels.get(v.passage_id),
        "reason": v.reason,
        "error": v.error,
        "raw": v.raw if v.status != "ok" else None,  # kept for what could not be read
        "source": v.source,
        "cached": v.cached,
        "latency_s": v.latency_s,
        "attempts": v.attempts,
        "prompt_tokens": v.usage.prompt_tokens,
        "completion_tokens": v.usage.completion_tokens,
    }


def _passages(judged: Sequence[JudgedQuery]) -> list[Record]:
    out = []
    for jq in judged:
        by_id = {p.id: p for p in jq.query.passages}
        out += [_passage_record(jq, v, by_id.get(v.passage_id)) for v in jq.verdicts]
    return out


def _query_record(jq: JudgedQuery) -> Record:
    status = Counter(v.status for v in jq.verdicts)
    labels = jq.query.labels
    return {
        "query_id": jq.query.query_id,
        "engine": jq.query.engine,
        "repeat": jq.repeat,
        "query": jq.query.query,
        "passages": len(jq.verdicts),
        "ok": status["ok"],
        "unparsed": status["unparsed"],
        "error": status["error"],
        "cached": sum(v.cached for v in jq.verdicts),
        "labelled": None if labels is None else sum(v.passage_id in labels for v in jq.verdicts),
        "prompt_tokens": jq.usage.prompt_tokens,
        "completion_tokens": jq.usage.completion_tokens,
        **jq.metrics,
    }


def _queries(judged: Sequence[JudgedQuery]) -> list[Record]:
    records = [_query_record(jq) for jq in judged]
    # Every row gets every metric any row has (a query judged with fewer metrics gets None).
    names = dict.fromkeys(name for jq in judged for name in jq.metrics)
    return [{**dict.fromkeys(names), **r} for r in records]


_BUILDERS: dict[str, tuple[Callable[[Sequence[JudgedQuery]], list[Record]], dict[str, Any]]] = {
    "passages": (_passages, _PASSAGE_COLUMNS),
    "queries": (_queries, _QUERY_COLUMNS),
}


def _kind(kind: str) -> tuple[Callable[[Sequence[JudgedQuery]], list[Record]], dict[str, Any]]:
    if kind not in _BUILDERS:
        raise ValueError(f"kind must be one of {sorted(_BUILDERS)}, got {kind!r}")
    return _BUILDERS[kind]


def _optional(column: str, fixed: dict[str, Any]) -> bool:
    """Whether ``column`` of a table is shown only when some row has a value: the queries
    table's error count is always there (only its "labelled" is optional)."""
    return column in OPTIONAL_COLUMNS and (fixed is _PASSAGE_COLUMNS or column == "labelled")


def _columns(records: Sequence[Record], fixed: dict[str, Any]) -> list[str]:
    """The fixed columns (the optional ones only when some record has a value), then the
    rest (metrics) in first-seen order."""
    shown = [c for c in fixed if not _optional(c, fixed) or any(r[c] is not None for r in records)]
    extra = dict.fromkeys(c for r in records[:1] for c in r if c not in fixed)
    return [*shown, *extra]


def pandas(who: str, instead: str) -> Any:
    """The pandas module, or an ImportError saying ``who`` needs it and what to do ``instead``."""
    try:
        # By name: pandas is an optional extra, and untyped without pandas-stubs.
        return importlib.import_module("pandas")
    except ImportError:
        raise ImportError(f"{who} needs pandas: pip install 'judge[pandas]' ({instead})") from None


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


class Judgements(Sequence[JudgedQuery]):
    """Judged queries in the order they were asked for (repeats of a query side by side).
    ``policy`` and ``scale``: the Judge's, by which its metrics were computed (what
    ``compare_engines`` computes any others by)."""

    def __init__(
        self,
        judged: Iterable[JudgedQuery],
        *,
        policy: MetricPolicy | None = None,
        scale: Scale | None = None,
    ) -> None:
        self._judged = tuple(judged)
        self.policy, self.scale = policy, scale

    @overload
    def __getitem__(self, index: int) -> JudgedQuery: ...

    @overload
    def __getitem__(self, index: slice) -> Judgements: ...

    def __getitem__(self, index: int | slice) -> JudgedQuery | Judgements:
        if isinstance(index, slice):
            return Judgements(self._judged[index], policy=self.policy, scale=self.scale)
        return self._judged[index]

    def __len__(self) -> int:
        return len(self._judged)

    def __iter__(self) -> Iterator[JudgedQuery]:
        return iter(self._judged)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Judgements) and self._judged == other._judged

    def _counts(self) -> str:
        """The judged queries and their verdicts by status, as the repr and HTML say them."""
        status = Counter(v.status for jq in self._judged for v in jq.verdicts)
        engines = sorted({jq.query.engine for jq in self._judged})
        return (
            f"{len(self)} judged queries, engines {', '.join(engines) or '-'}; "
            f"{status.total()} verdicts: {status['ok']} ok, {status['unparsed']} unparsed, "
            f"{status['error']} error"
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self._counts()}>"

    def engine_means(self) -> dict[str, dict[str, float | None]]:
        """``[engine][metric]``: per query id the mean over its repeats where the metric is
        defined, then the mean over the query ids that have one (None when none has)."""
        values: dict[tuple[str, str, str], list[float]] = defaultdict(list)
        names: dict[str, None] = {}
        for jq in self._judged:
            for name, value in jq.metrics.items():
                names.setdefault(name)
                if value is not None:
                    values[(jq.query.engine, name, jq.query.query_id)].append(value)
        per_query: dict[tuple[str, str], list[float]] = defaultdict(list)
        for (engine, name, _), got in values.items():
            per_query[(engine, name)].append(sum(got) / len(got))
        engines = sorted({jq.query.engine for jq in self._judged})
        return {e: {n: _mean(per_query.get((e, n), [])) for n in names} for e in engines}

    def _repr_html_(self) -> str:
        """Jupyter's view: the counts, then each engine's query ids and metric means (plain
        HTML, every name escaped)."""
        means = self.engine_means()
        names = list(next(iter(means.values()), {}))
        ids = Counter(e for e, _ in {(jq.query.engine, jq.query.query_id) for jq in self._judged})
        head = "".join(f"<th>{html.escape(c)}</th>" for c in ["engine", "query ids", *names])
        rows = "".join(
            f"<tr><td>{html.escape(engine)}</td><td>{ids[engine]}</td>"
            + "".join(f"<td>{_cell(v)}</td>" for v in row.values())
            + "</tr>"
            for engine, row in means.items()
        )
        table = f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
        lines = [f"{type(self).__name__}: {self._counts()}", *self._notes()]
        caption = "<br>".join(html.escape(line) for line in lines)
        return f"<div><p>{caption}</p>{table if means else ''}</div>"

    def _notes(self) -> list[str]:
        """Lines the HTML view adds below the counts (a run read back: its judge health)."""
        return []

    def to_records(self, kind: Kind = "passages") -> list[dict[str, Any]]:
        """Plain dicts, one per passage or one per (query, engine, repeat); see the module doc."""
        build, fixed = _kind(kind)
        records = build(self._judged)
        columns = _columns(records, fixed)
        return [{c: r[c] for c in columns} for r in records]

    def to_pandas(self, kind: Kind = "passages") -> Any:
        """:meth:`to_records` as a ``pandas.DataFrame``, with nullable dtypes where a value may
        be missing (grades, booleans, probabilities, metrics)."""
        pd = pandas("Judgements.to_pandas", "or use to_records(), plain dicts")
        _, fixed = _kind(kind)
        records = self.to_records(kind)
        columns = list(records[0]) if records else [c for c in fixed if not _optional(c, fixed)]
        frame = pd.DataFrame.from_records(records, columns=columns)
        dtypes = {c: fixed.get(c, "Float64") for c in columns}
        return frame.astype({c: t for c, t in dtypes.items() if t is not None})
