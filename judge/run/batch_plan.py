"""What a ``judge run --batch`` asks (see judge/run/batch.py): the run's uncached first-round
requests, rendered as the run renders them and keyed as the run's cache keys them; the lines of
a batch input, cut within the provider's limits; and how an answer is read, as the run's asker
reads it (a batch stores only what it will read).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from judge.calling.cache import Cache
from judge.config import RunConfig
from judge.data.results import UnitKey
from judge.judging.judge import Judge
from judge.judging.verdicts import parse_listwise, parse_pointwise
from judge.providers.base import ChatRequest, Completion
from judge.schema import Query, Scale

__all__ = ["MAX_BYTES", "MAX_LINES", "Item", "Line", "chunks", "parser", "plan_requests"]

MAX_LINES = 50_000  # requests per batch (OpenAI's and DashScope's limit)
MAX_BYTES = 190 * 2**20  # bytes per input file (OpenAI's limit is 200 MB)


@dataclass(frozen=True)
class Item:
    """A first-round request the run will look up: its cache key (``custom_id``, the rendered
    request's content address) and the alias it is looked up by."""

    custom_id: str
    alias: str
    repeat: int
    request: ChatRequest
    ids: tuple[str, ...] | None  # listwise: the passage ids its answer must cover


@dataclass(frozen=True)
class Line:
    """A line of a batch input: ``request`` (a first-round request, or its re-ask) under
    ``custom_id``, answering the first-round request ``first``."""

    custom_id: str
    request: ChatRequest
    first: str


def plan_requests(
    judge: Judge,
    config: RunConfig,
    queries: Sequence[Query],
    cache: Cache,
    done: set[UnitKey],
    unread: bool = True,
) -> dict[str, Item]:
    """The uncached first-round requests of the units not done, by custom id (a passage two
    engines returned is one request). A cached prompt is found by its alias, unrendered;
    ``unread`` False: an answer its parser could not read is asked anew (--redo unparsed)."""
    items: dict[str, Item] = {}
    for repeat in range(config.run.repeats):
        for query in queries:
            if (query.query_id, query.engine, repeat) in done or not query.passages:
                continue
            fitted = judge.fit(query)
            for prompt, ids in judge.asker.first_asks(fitted):  # ids: a listwise window's
                alias = judge.caller.key(prompt, repeat)
                if cache.contains(alias, alias=True, unread=unread):
                    continue
                key = judge.caller.key(prompt.request, repeat)
                if key not in items and not cache.contains(key, unread=unread):
                    items[key] = Item(key, alias, repeat, prompt.request, ids)
    return items


def chunks(lines: list[Line], encode: Callable[[Line], bytes]) -> list[list[tuple[Line, bytes]]]:
    """``lines`` with their encodings, cut into batches within the provider's limits."""
    chunks: list[list[tuple[Line, bytes]]] = [[]]
    size = 0
    for line in lines:
        data = encode(line)
        if len(chunks[-1]) >= MAX_LINES or (chunks[-1] and size + len(data) > MAX_BYTES):
            chunks.append([])
            size = 0
        chunks[-1].append((line, data))
        size += len(data)
    return [c for c in chunks if c]


def parser(scale: Scale, ids: tuple[str, ...] | None) -> Callable[[Completion], object]:
    """What the run's asker reads a first-round answer with (listwise: for ``ids``)."""
    if ids is None:
        return lambda c: parse_pointwise(c, scale)
    return lambda c: parse_listwise(c, scale, ids)
