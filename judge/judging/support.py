"""Nugget assignment: which of its query's nuggets each passage supports, listwise.

All of a unit's passages go in one request with the nuggets, as long as the request fits the
model's context window and ``[nuggets] group_passages``; otherwise consecutive groups of them
(greedily, in rank order), and a passage too long on its own is cut (visibly) to fit. The
answer lists, per passage id, the ids of the nuggets it supports (:func:`parse_supports`).

Nothing is guessed (DESIGN rule 1): an answer with no readable list is re-asked once with the
error; passages it left out or answered unreadably are asked once more, alone in a second
listwise request; whatever is still unread is ``Support(status="unparsed")`` (a provider
failure: ``"error"``), which makes every coverage metric that reads it undefined, never 0.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import Field

from judge.aspects import Coverage, Nugget, NuggetSet, Support
from judge.errors import ParseError
from judge.judging.ask import (
    AskContext,
    answer_entries,
    answer_field,
    answer_room,
    ask,
    aspect_params,
)
from judge.judging.context import FRAMING, SAFETY, count_tokens, fit_to_context
from judge.judging.jsonscan import NOTHING_SHOWN, Node, Quoted, shown_as_data
from judge.judging.prompts import PromptTemplate, fence, neutralise, one_line
from judge.providers.base import ChatRequest, Completion, Message
from judge.schema import Passage, Query, Record, Scale, Usage

__all__ = ["SUPPORT", "Assigner", "SupportsParsed", "parse_supports"]

SUPPORT = Scale.ordered(
    "support",
    1,
    ("no", "the passage does not state the fact", "文本没有陈述这一事实", ()),
    (
        "supports",
        "the passage states the fact, or something that directly implies it",
        "文本陈述了这一事实，或陈述了直接蕴含它的内容",
        (),
    ),
)
_LIST_KEYS = ("supports", "passages", "results", "items", "assignments")
_ID_KEYS = ("id", "passage_id", "pid")
_NUGGET_KEYS = ("nuggets", "supports", "supported", "nugget_ids", "ids")


class SupportsParsed(Record):
    """The supported nugget ids per asked-for passage id, and the ids left unread (why)."""

    supports: dict[str, tuple[str, ...]]
    unresolved: dict[str, str] = Field(default_factory=dict)


def _entry_id(entry: Node) -> str | None:
    if not isinstance(entry.value, dict):
        return None
    found = answer_field(entry.value, _ID_KEYS)
    if found is None or not found.complete:
        return None
    if isinstance(found.value, str):
        return found.value.strip()
    return str(found.value) if isinstance(found.value, int) else None


def _names(nuggets: Sequence[Nugget]) -> dict[str, str]:
    """What names a nugget in an answer, normalised: its id, or its exact text (a small model
    copies texts; a text is one nugget, so reading it is not a guess), to its id."""
    texts = {" ".join(n.text.casefold().split()): n.id for n in nuggets}
    return texts | {n.id.casefold(): n.id for n in nuggets}


def _nuggets_of(entry: Node, known: dict[str, str]) -> tuple[str, ...]:
    """The nugget ids one complete entry lists (ParseError naming what is wrong)."""
    assert isinstance(entry.value, dict)
    listed = answer_field(entry.value, _NUGGET_KEYS)
    if listed is None:
        raise ParseError('no "nuggets" list')
    if listed.value is None:
        return ()
    if not isinstance(listed.value, list):
        raise ParseError('"nuggets" is not a list')
    out: list[str] = []
    for item in listed.value:
        raw = str(item.value) if isinstance(item.value, str | int) else None
        nid = known.get(" ".join(raw.casefold().split())) if raw is not None else None
        if nid is None:
            ids = ", ".join(dict.fromkeys(known.values()))
            raise ParseError(f"{item.value!r} is not one of the nugget ids ({ids})")
        if nid not in out:
            out.append(nid)
    return tuple(out)


def parse_supports(
    completion: Completion,
    passage_ids: Sequence[str],
    nuggets: Sequence[Nugget],
    quoted: Quoted = NOTHING_SHOWN,
) -> SupportsParsed:
    """Each asked-for passage's supported nuggets (named by id, or by exact text); ParseError
    when there is no readable list. Ids not asked for are dropped; a passage given twice
    differently, or with a nugget not in the set, is unresolved (asked again), as is one the
    answer never reached."""
    entries = answer_entries(
        completion, _LIST_KEYS, '{"supports": [{"id": ..., "nuggets": [...]}]}', quoted
    )
    known = _names(nuggets)
    wanted = set(passage_ids)
    found: dict[str, tuple[str, ...]] = {}
    bad: dict[str, str] = {}
    ided = [(pid, e) for e in entries if (pid := _entry_id(e)) is not None]
    if not ided and entries:
        raise ParseError('the entries carry no passage "id"')
    for pid, entry in ided:
        if pid not in wanted or pid in bad or not entry.complete:
            continue
        try:
            named = _nuggets_of(entry, known)
        except ParseError as exc:
            bad[pid] = f'id "{pid}": {exc}'
            continue
        if pid in found and set(found[pid]) != set(named):
            del found[pid]
            bad[pid] = f'id "{pid}" is given twice, differently'
        else:
            found[pid] = named
    missing = {pid: f'id "{pid}" has no entry' for pid in passage_ids if pid not in found}
    return SupportsParsed(supports=found, unresolved={**missing, **bad})


@dataclass(frozen=True)
class Assigner:
    """Asks which passages support which nuggets, for one judge."""

    ctx: AskContext
    template: PromptTemplate
    group_passages: int

    @property
    def context_tokens(self) -> int | None:
        return self.ctx.context_tokens

    @staticmethod
    def answer_tokens(n_passages: int, n_nuggets: int) -> int:
        """An answer's token need: an entry per passage, a few nugget ids in each."""
        return 16 + n_passages * (12 + 4 * min(n_nuggets, 5))

    def _room(self, n_passages: int, n_nuggets: int) -> int:
        return answer_room(self.ctx.params, self.answer_tokens(n_passages, n_nuggets))

    def _render(
        self, query: Query, passages: Sequence[Passage], nuggets: Sequence[Nugget]
    ) -> tuple[Message, ...]:
        # One line each: a nugget is written from passages, and must not start lines of its own.
        shown = [{"id": neutralise(n.id), "text": one_line(neutralise(n.text))} for n in nuggets]
        return self.template.render_listwise(query, passages, SUPPORT, nuggets=shown)

    def request(
        self, query: Query, passages: Sequence[Passage], nuggets: Sequence[Nugget]
    ) -> ChatRequest:
        answer = self.answer_tokens(len(passages), len(nuggets))
        messages = self._render(query, passages, nuggets)
        params = aspect_params(self.ctx.params, answer)
        return ChatRequest(model=self.ctx.model, messages=messages, params=params)

    def groups(self, query: Query, nuggets: Sequence[Nugget]) -> list[list[Passage]]:
        """The passages in consecutive groups whose requests fit (see the module docstring)."""
        size, passages = self.group_passages, list(query.passages)
        if self.context_tokens is None:
            return [passages[i : i + size] for i in range(0, len(passages), size)]
        room = int(self.context_tokens / SAFETY) - FRAMING
        empty = Passage(id="0", text="")
        around = count_tokens(self._render(query, [empty], nuggets)) - count_tokens(
            [Message(role="user", content=fence(empty))]
        )
        out: list[list[Passage]] = []
        group: list[Passage] = []
        used = around
        for p in passages:
            cost = count_tokens([Message(role="user", content=fence(p))])
            answer = self._room(len(group) + 1, len(nuggets))
            if group and (len(group) >= size or used + cost + answer > room):
                out.append(group)
                group, used = [], around
            if not group and around + cost + self._room(1, len(nuggets)) > room:
                p = self._cut(query, p, nuggets)
                cost = count_tokens([Message(role="user", content=fence(p))])
            group.append(p)
            used += cost
        return [*out, group] if group else out

    def _cut(self, query: Query, passage: Passage, nuggets: Sequence[Nugget]) -> Passage:
        assert self.context_tokens is not None
        alone = query.model_copy(update={"passages": (passage,)})
        fitted = fit_to_context(
            alone,
            context_tokens=self.context_tokens,
            answer_tokens=self._room(1, len(nuggets)),
            listwise=True,
            render=lambda q, ps: self._render(q, ps, nuggets),
        )
        return fitted.passages[0]

    async def coverage(
        self, query: Query, nuggets: NuggetSet, repeat: int
    ) -> tuple[Coverage, Usage]:
        """Every passage's support of ``nuggets``, in rank order, and the tokens it took."""
        done: dict[str, Support] = {}
        usages = await asyncio.gather(
            *(
                self._group(query, g, nuggets.nuggets, repeat, done)
                for g in self.groups(query, nuggets.nuggets)
            )
        )
        supports = tuple(done[p.id] for p in query.passages)
        return Coverage(nuggets=nuggets.nuggets, supports=supports), sum(usages, Usage())

    async def _group(
        self,
        query: Query,
        group: list[Passage],
        nuggets: Sequence[Nugget],
        repeat: int,
        done: dict[str, Support],
    ) -> Usage:
        """One group's supports into ``done``: a listwise request (re-asked once when it does
        not parse), then once more for the passages it left unread."""
        usage, todo, why, ctx = Usage(), group, "", self.ctx
        for round_ in range(2 if ctx.reask else 1):
            asked_ids = [p.id for p in todo]
            asked = await ask(
                ctx.caller,
                self.request(query, todo, nuggets),
                repeat,
                functools.partial(
                    parse_supports,
                    passage_ids=asked_ids,
                    nuggets=nuggets,
                    quoted=shown_as_data(todo),
                ),
                reask=ctx.reask and round_ == 0,
                language=ctx.language,
            )
            usage = usage + asked.usage
            if asked.value is None:
                status = "error" if asked.failed else "unparsed"
                for p in todo:
                    done[p.id] = Support(passage_id=p.id, status=status, error=asked.error)
                return usage
            for pid, found in asked.value.supports.items():
                done[pid] = Support(passage_id=pid, status="ok", nuggets=found)
            todo = [p for p in todo if p.id in asked.value.unresolved]
            why = "; ".join(asked.value.unresolved.values())
            if not todo:
                return usage
        for p in todo:
            done[p.id] = Support(passage_id=p.id, status="unparsed", error=why)
        return usage
