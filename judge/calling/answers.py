"""What the call layer hands back and takes in: a call's result, a parsed chat answer, a
prompt known by its digest before it is rendered, and a reader whose readings the cache keeps;
reading an answer once with the caller's parser."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from judge.calling.cache import Reading
from judge.errors import ParseError
from judge.providers.base import ChatRequest, Completion, RerankResult

A = TypeVar("A", Completion, RerankResult)
P = TypeVar("P")


@dataclass(frozen=True)
class CallResult(Generic[A]):
    answer: A
    cached: bool
    attempts: int
    latency_s: float


@dataclass(frozen=True)
class ChatAnswer(Generic[P]):
    """A chat answer and what the caller's parser made of it: ``value`` or ``error``."""

    call: CallResult[Completion]
    value: P | None
    error: ParseError | None


@dataclass
class Prompt:
    """A chat request known by a digest of all that makes it before ``render`` makes it."""

    digest: str
    render: Callable[[], ChatRequest]

    @functools.cached_property
    def request(self) -> ChatRequest:
        return self.render()


@dataclass(frozen=True)
class Reader(Generic[P]):
    """A parser whose readings the cache keeps: ``dump`` and ``load`` carry a value to and from
    JSON; ``tag`` changes whenever ``parse`` could read the same answer differently."""

    parse: Callable[[Completion], P]
    tag: str
    dump: Callable[[P], str]
    load: Callable[[str], P]


def parsed(
    call: CallResult[Completion], parse: Callable[[Completion], P] | Reader[P]
) -> ChatAnswer[P]:
    read = parse.parse if isinstance(parse, Reader) else parse
    try:
        return ChatAnswer(call, read(call.answer), None)
    except ParseError as exc:
        return ChatAnswer(call, None, exc)


def reading(parse: Callable[[Completion], P] | Reader[P], result: ChatAnswer[P]) -> Reading | None:
    """What the cache keeps of a successful reading (None: a parser without a tag)."""
    if not isinstance(parse, Reader) or result.error is not None or result.value is None:
        return None
    return Reading(parse.tag, parse.dump(result.value))
