"""A small JSON reader for judge answers: keeps offsets and survives truncation.

Unlike :func:`json.loads`, :func:`scan` reads the value at a position of a longer text (an
answer with prose or a code fence around its JSON), records where every value starts and ends
(so the verdict token can be found in the logprobs), tolerates a trailing comma, and returns
a value cut off by the token limit as far as it got (``Node.complete`` False) instead of
failing. :func:`values` walks the top-level values of a text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from judge.schema import whole_text

__all__ = ["Malformed", "Node", "scan", "values"]


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
