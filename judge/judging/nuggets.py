"""Nugget creation: per query, the judge writes the atomic facts ("nuggets") a complete answer
needs, from every engine's passages for that query pooled, so every engine is measured
against one list (as the TREC 2024 RAG track's AutoNuggetizer does).

The pool interleaves the engines' lists by rank (each engine's 1st passage, then each 2nd,
engines in name order), drops repeated passages (same id, or same text once normalised) and
keeps the first ``[nuggets] pool_passages``; their text together is cut (visibly, equal
shares, :func:`judge.judging.context.fit_to_context`) to ``pool_tokens`` and to the model's
context window. The answer is read by :func:`parse_nuggets`; nuggets are numbered ``n1..nK``
in the judge's order with the vital ones first, at most ``max_nuggets``. One call per query
(cached like every call, so a second night with the same pool pays nothing; a fixed set across
nights comes from a nugget file, :mod:`judge.data.nuggets`).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from judge.aspects import Nugget
from judge.errors import ParseError
from judge.judging.ask import (
    answer_entries,
    answer_field,
    answer_room,
    aspect_params,
)
from judge.judging.context import FRAMING, SAFETY, count_tokens, fit_to_context
from judge.judging.jsonscan import NOTHING_SHOWN, Node, Quoted
from judge.judging.prompts import PromptTemplate
from judge.providers.base import ChatRequest, Completion, Message
from judge.schema import Passage, Query, SamplingParams, Scale

__all__ = ["IMPORTANCE", "NuggetPrompt", "parse_nuggets", "pool"]

IMPORTANCE = Scale.ordered(
    "importance",
    1,
    (
        "okay",
        "useful to a complete answer, which can do without it",
        "对完整的回答有用，但缺少也可以",
        ("ok", "optional", "no", "false", "可选", "一般", "次要"),
    ),
    (
        "vital",
        "a complete answer must contain it",
        "完整的回答必须包含",
        ("essential", "required", "yes", "true", "必要", "关键", "重要"),
    ),
)
_TEXT_KEYS = ("text", "nugget", "fact", "内容", "事实")
_IMPORTANCE_KEYS = ("importance", "label", "vital", "重要性")
_LIST_KEYS = ("nuggets", "facts", "items")
# Tokens one nugget's entry takes in an answer, for the answer's token limit.
TOKENS_PER_NUGGET = 40


def _norm(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def pool(queries: Sequence[Query], limit: int) -> tuple[Passage, ...]:
    """One query's passages from every engine, interleaved by rank, repeats dropped."""
    lists = [q.passages for q in sorted(queries, key=lambda q: q.engine)]
    seen_ids: set[str] = set()
    seen_texts: set[str] = set()
    out: list[Passage] = []
    for rank in range(max((len(p) for p in lists), default=0)):
        for passages in lists:
            if rank >= len(passages) or len(out) >= limit:
                continue
            p = passages[rank]
            text = _norm(p.text)
            if p.id in seen_ids or text in seen_texts:
                continue
            seen_ids.add(p.id)
            seen_texts.add(text)
            out.append(p)
    return tuple(out)


def _read(entry: Node, i: int) -> tuple[str, bool] | None:
    """An entry's text and whether it is vital; None for an entry cut off by the token limit.
    A bare string is a vital nugget (the record's default); an importance off the scale is a
    ParseError (re-asked), never guessed."""
    if not entry.complete:
        return None
    if isinstance(entry.value, str):
        return (entry.value.strip(), True) if entry.value.strip() else None
    if not isinstance(entry.value, dict):
        raise ParseError(f"nugget {i + 1} is not an object with a text")
    text = answer_field(entry.value, _TEXT_KEYS)
    if text is None or not isinstance(text.value, str) or not text.value.strip():
        raise ParseError(f'nugget {i + 1} has no "text"')
    importance = answer_field(entry.value, _IMPORTANCE_KEYS)
    if importance is None or importance.value is None:
        return text.value.strip(), True
    value: Any = importance.value
    label = IMPORTANCE.snap(value) if isinstance(value, str | int | bool) else None
    if label is None:
        allowed = " or ".join(f'"{n}"' for n in IMPORTANCE.names)
        raise ParseError(f"nugget {i + 1}: importance {value!r} is not {allowed}")
    return text.value.strip(), IMPORTANCE.relevant(label.grade)


def parse_nuggets(
    completion: Completion, max_nuggets: int, quoted: Quoted = NOTHING_SHOWN
) -> tuple[Nugget, ...]:
    """The nuggets in an answer, vital ones first, repeats dropped, at most ``max_nuggets``,
    numbered ``n1..``; ParseError (the re-ask text) when there is none."""
    found: dict[str, tuple[str, bool]] = {}
    for i, entry in enumerate(
        answer_entries(completion, _LIST_KEYS, '{"nuggets": [{"text": ..., ...}, ...]}', quoted)
    ):
        read = _read(entry, i)
        if read is not None:
            found.setdefault(_norm(read[0]), read)
    if not found:
        cut = " (cut off by the token limit)" if completion.finish_reason == "length" else ""
        raise ParseError(f"the answer lists no nuggets{cut}")
    ordered = sorted(found.values(), key=lambda item: not item[1])[:max_nuggets]
    return tuple(
        Nugget(id=f"n{i}", text=re.sub(r"\s+", " ", text), vital=vital)
        for i, (text, vital) in enumerate(ordered, start=1)
    )


@dataclass(frozen=True)
class NuggetPrompt:
    """Renders the nugget-creation request for one query's pool, fitted to the token limits."""

    template: PromptTemplate
    model: str
    params: SamplingParams
    max_nuggets: int
    pool_tokens: int
    context_tokens: int | None

    @property
    def answer_tokens(self) -> int:
        return 64 + TOKENS_PER_NUGGET * self.max_nuggets

    def _render(self, query: Query, passages: Sequence[Passage]) -> tuple[Message, ...]:
        return self.template.render_listwise(
            query, passages, IMPORTANCE, max_nuggets=self.max_nuggets
        )

    def request(self, query: Query) -> ChatRequest:
        """The request for ``query`` (its passages: the pool), its passages cut to fit."""
        empty = [p.model_copy(update={"text": ""}) for p in query.passages]
        around = count_tokens(self._render(query, empty))
        room = answer_room(self.params, self.answer_tokens)
        window = math.ceil((self.pool_tokens + around + room + FRAMING) * SAFETY)
        if self.context_tokens is not None:
            window = min(window, self.context_tokens)
        render: Callable[[Query, Sequence[Passage]], Sequence[Message]] = self._render
        fitted = fit_to_context(
            query,
            context_tokens=window,
            answer_tokens=room,
            listwise=True,
            render=render,
        )
        params = aspect_params(self.params, self.answer_tokens)
        messages = self._render(fitted, fitted.passages)
        return ChatRequest(model=self.model, messages=messages, params=params)
