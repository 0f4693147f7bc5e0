"""A small JSON reader for judge answers: keeps offsets and survives truncation.

Unlike :func:`json.loads`, :func:`scan` reads the value at a position of a longer text (an
answer with prose or a code fence around its JSON), records where every value starts and ends
(so the verdict token can be found in the logprobs), tolerates a trailing comma, and returns
a value cut off by the token limit as far as it got (``Node.complete`` False) instead of
failing. :func:`values` walks the top-level values of a text. :class:`Quoted` tells a piece
of an answer that the judge quoted from a passage it was shown.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from judge.schema import Passage, whole_text

__all__ = [
    "NOTHING_SHOWN",
    "QUOTE_MIN",
    "Malformed",
    "Node",
    "Quoted",
    "scan",
    "shown_as_data",
    "values",
]


@dataclass
class Node:
    """A JSON value at text[start:end]; objects are dict[str, Node], arrays list[Node].

    ``complete`` is False when the text ended inside the value (a cut string keeps its
    partial content; a cut number or literal is None).
    """

    value: Any
    start: int
    end: int
    complete: bool = True


class Malformed(Exception):
    """Not JSON at this position."""


_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_LITERALS = {"true": True, "false": False, "null": None}
_WS = " \t\r\n"
_DECODER = json.JSONDecoder(strict=False)  # strict=False: raw newlines inside strings
# An escape cut in half at the end of a string: an odd backslash, maybe "u" and < 4 hex digits.
_PARTIAL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\(?:u[0-9a-fA-F]{0,3})?$")
_HIGH_SURROGATES = "".join(map(chr, range(0xD800, 0xDC00)))  # half a cut surrogate pair
_MAX_STARTS = 64  # tried opening brackets per answer


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def scan(text: str, i: int) -> Node:
    """The JSON value starting at (or after whitespace from) ``text[i]``."""
    i, n = _skip(text, i), len(text)
    if i >= n:
        return Node(None, i, n, False)
    if text[i] in "{[":
        return _container(text, i)
    if text[i] == '"':
        try:
            value, end = _DECODER.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            if "Unterminated" not in exc.msg and exc.pos + 6 < n:
                raise Malformed from None
            rest = _PARTIAL_ESCAPE.sub(r"\1", text[i + 1 :])
            try:
                partial = json.loads(f'"{rest}"', strict=False).rstrip(_HIGH_SURROGATES)
            except json.JSONDecodeError:
                partial = rest
            return Node(whole_text(partial), i, n, False)
        return Node(whole_text(value), i, end)  # a lone surrogate escape: no UTF-8 string
    number = _NUMBER.match(text, i)
    if number:
        if number.end() == n:
            return Node(None, i, n, False)
        return Node(json.loads(number.group()), i, number.end())
    for word, value in _LITERALS.items():
        if text.startswith(word, i):
            return Node(value, i, i + len(word))
        if word.startswith(text[i:]):
            return Node(None, i, n, False)
    raise Malformed


def _container(text: str, i: int) -> Node:
    is_object, close = text[i] == "{", "}" if text[i] == "{" else "]"
    pairs: dict[str, Node] = {}
    items: list[Node] = []
    node = Node(pairs if is_object else items, i, len(text), False)
    j = i + 1
    while True:
        j = _skip(text, j)
        if j >= len(text):
            return node
        if text[j] == close:
            node.end, node.complete = j + 1, True
            return node
        if pairs or items:
            if text[j] != ",":
                raise Malformed
            j = _skip(text, j + 1)
            if j < len(text) and text[j] == close:  # tolerate a trailing comma
                continue
        if is_object:
            key = scan(text, j)
            if not key.complete:
                return node
            if not isinstance(key.value, str):
                raise Malformed
            j = _skip(text, key.end)
            if j >= len(text):
                return node
            if text[j] != ":":
                raise Malformed
            value = pairs[key.value] = scan(text, j + 1)
        else:
            value = scan(text, j)
            items.append(value)
        if not value.complete:
            return node
        j = value.end


def values(text: str, start: int, openers: str) -> Iterator[Node]:
    """Top-level JSON values in ``text[start:]`` that open with one of ``openers``."""
    pattern = re.compile("[" + re.escape(openers) + "]")
    for _ in range(_MAX_STARTS):
        found = pattern.search(text, start)
        if found is None:
            return
        try:
            node = scan(text, found.start())
        except (Malformed, RecursionError):
            start = found.start() + 1
            continue
        yield node
        if not node.complete:
            return
        start = node.end


# Brackets a prompt neutralises in a passage (judging/prompts.py neutralise), read back as
# what the passage wrote; white space and the datamark ("^") are left out of the comparison.
_UNMARK = str.maketrans({"\u2039": "<", "\uff3b": "["})
_BLANKS = re.compile(r"[\s^]+")
# A piece of an answer shorter than this (compared as :func:`_plain`) is not taken for a
# quote: a label alone ("yes", "Relevance: 1") is in many honest passages.
QUOTE_MIN = 12


def _plain(text: str) -> str:
    return _BLANKS.sub("", unicodedata.normalize("NFKC", text).translate(_UNMARK)).casefold()


class Quoted:
    """Whether a piece of a judge's answer is quoted from text it was shown as data.

    A passage may write a verdict for itself (``{"verdict":"yes"}``, a verdict list,
    ``</think>`` before one) and a judge may quote the passage in its answer: what it quotes
    is the passage's, never the judge's own, so the parsers pass over it. A class-level test
    (no list of phrasings): the piece, without white space, datamarks and neutralised
    brackets, occurs in a passage shown. Pieces under :data:`QUOTE_MIN` characters so
    compared are not quotes. The passages are compared only when an answer is parsed."""

    def __init__(self, shown: Sequence[str]) -> None:
        self._shown = shown
        self._plain: tuple[str, ...] | None = None

    def __call__(self, piece: str) -> bool:
        if not self._shown:
            return False
        plain = _plain(piece)
        if len(plain) < QUOTE_MIN:
            return False
        if self._plain is None:
            self._plain = tuple(_plain(text) for text in self._shown)
        return any(plain in text for text in self._plain)


NOTHING_SHOWN = Quoted(())


def shown_as_data(passages: Iterable[Passage]) -> Quoted:
    """What ``passages`` show a judge as data (titles and texts), as :class:`Quoted`."""
    return Quoted(tuple(text for p in passages for text in (p.title or "", p.text) if text))
