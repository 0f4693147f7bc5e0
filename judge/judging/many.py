"""Python values -> Queries, and many queries at once: ``Judge.judge_many`` / ``ajudge_many``.

:func:`as_query` / :func:`as_passages` turn what ``Judge.judge`` takes (a query text and
strings, dicts or Passages) into a Query. For many queries, rows are dataset rows (dicts in the
dataset JSONL shape, read by the dataset reader's own row reader, so a row means here what it
means in a file) or :class:`~judge.schema.Query` records, mixed freely. Every row is checked
before the first request: bad ones fail together in one :class:`~judge.errors.InputError`
naming each row by its index and field (``rows[3]: field 'query': missing``). A dict without
``query_id`` gets ``row<index>``; Query records are taken as given (their passages are not
truncated again).

Then each (query, repeat) is judged as ``judge run`` judges it: a cascade's band is fitted
first when it comes from the queries' scores, and nugget sets are written from every engine's
passages pooled; workers (twice the calls allowed in flight, as
the runner) pull units while the Judge's Caller owns the concurrency limit, rate limits,
retries, budget and cache; each query's metrics are attached at the end in one pass over all
of them. A provider that refuses every request (bad model name or key) stops the batch after
a few refusals with a ProviderError, rather than asking for every passage in vain.

Progress is a tqdm bar on stderr: plain text, which a terminal and a Jupyter cell both show as
one updating line (tqdm's widget bar would need ipywidgets, which a notebook may not have).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

# The dataset reader's row reader itself (private there: files are its public door), so a
# row passed here is read exactly as the same line of a dataset file would be.
from judge.data.datasets import _Options, _parse_row
from judge.data.lines import Row, Sink
from judge.errors import ConfigError, InputError, ProviderError
from judge.judging.tables import Judgements
from judge.schema import Passage, Query, Scale

if TYPE_CHECKING:
    from judge.judging.judge import Judge, Judged

__all__ = [
    "REFUSED_CALLS",
    "PassageLike",
    "QueryRow",
    "as_passages",
    "as_queries",
    "as_query",
    "judge_many",
]

log = logging.getLogger(__name__)

QueryRow = Mapping[str, Any] | Query
PassageLike = Passage | str | Mapping[str, Any]
# Refused calls (bad key, model or URL) with no success at all before the batch stops (as
# ``judge run``).
REFUSED_CALLS = 3


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


async def judge_many(
    judge: Judge,
    rows: Iterable[QueryRow],
    *,
    repeats: int = 1,
    progress: bool = True,
    label_scale: Scale | None = None,
) -> Judgements:
    """Judge every row ``repeats`` times; the rows' order kept, repeats side by side."""
    if repeats < 1:
        raise ConfigError(f"repeats must be at least 1, got {repeats}")
    queries = as_queries(rows)
    units = [(q, r) for q in queries for r in range(repeats)]
    cascade = judge.cascade
    if units and cascade is not None and cascade.band is None:
        await judge.fit_band(queries, label_scale)
    if units and judge.dimensions is not None:
        # Nugget sets from every engine's passages pooled, once per query id, before any unit.
        await judge.dimensions.prepare(queries)
    bar = tqdm(
        total=len(units),
        desc="judging",
        unit="query",
        file=sys.stderr,
        disable=not progress,
        dynamic_ncols=True,
    )
    try:
        judged = await _judge_units(judge, units, bar)
    finally:
        bar.close()
    return Judgements(judge.finish_many(judged))


async def _judge_units(
    judge: Judge, units: list[tuple[Query, int]], bar: tqdm[Any]
) -> list[Judged]:
    """Each unit's verdicts, in ``units``' order, by workers sharing one iterator of them."""
    out: list[Judged | None] = [None] * len(units)
    todo = iter(enumerate(units))
    stats = judge.caller.stats
    counts = {"passages": 0, "errors": 0}

    async def worker() -> None:
        for i, (query, repeat) in todo:
            out[i] = judged = await judge.averdicts(query, repeat=repeat)
            verdicts = judged[2]
            counts["passages"] += len(verdicts)
            counts["errors"] += sum(v.status != "ok" for v in verdicts)
            bar.set_postfix_str(
                f"passages {counts['passages']}, cached {stats.cache_hits}, "
                f"failed {counts['errors']}",
                refresh=False,
            )
            bar.update(1)
            if stats.errors["client"] >= REFUSED_CALLS and stats.successes == 0:
                example = next((v.error for v in verdicts if v.error), "")
                raise ProviderError(
                    "the provider refuses every request (not retried; check the API key, "
                    f"model name and base_url): {example}",
                    kind="client",
                )

    n_workers = max(1, min(len(units), judge.caller.limits.concurrency * 2))
    tasks = [asyncio.create_task(worker()) for _ in range(n_workers)]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        # One worker's failure (or a cancel) stops the others before anything else is paid.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return [judged for judged in out if judged is not None]
