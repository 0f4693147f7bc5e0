"""Asking the judge: rendering, calling, parsing, re-asking — one query's verdicts.

Pointwise: one call per passage. Listwise: one call for the whole list; ids the judge left
out (or answered off-scale) are asked again in a second, smaller listwise call, and whatever
is still missing is judged pointwise — a verdict is never guessed. A completion that does not
parse gets one re-ask carrying the validation error, then the verdict is ``unparsed`` with the
raw text kept (DESIGN rule 1). Provider failures after the caller's retries are ``error``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from judge.calling.caller import Caller, CallResult
from judge.errors import ProviderError
from judge.judging.prompts import AnswerShape, PromptTemplate
from judge.judging.verdicts import Parsed, parse_listwise, parse_pointwise, reask_messages
from judge.providers.base import ChatRequest, Completion, Message
from judge.schema import Passage, Query, SamplingParams, Scale, Usage, Verdict


def _split_usage(usage: Usage, n: int) -> list[Usage]:
    """Share one call's usage among the n verdicts it produced (remainder to the first)."""
    if n <= 0:
        return []
    p, pr = divmod(usage.prompt_tokens, n)
    c, cr = divmod(usage.completion_tokens, n)
    return [
        Usage(prompt_tokens=p + (pr if i == 0 else 0), completion_tokens=c + (cr if i == 0 else 0))
        for i in range(n)
    ]


@dataclass
class _Tally:
    """What the calls for one passage added up to (first ask and re-ask)."""

    attempts: int = 0
    usage: Usage = field(default_factory=Usage)
    latency_s: float = 0.0
    cached: bool = True
    raw: str | None = None

    def add(self, call: CallResult[Completion]) -> None:
        self.attempts += call.attempts
        self.usage = self.usage + call.answer.usage
        self.latency_s += call.latency_s
        self.cached = self.cached and call.cached
        self.raw = call.answer.text

    def fields(self) -> dict[str, Any]:
        return {
            "raw": self.raw,
            "attempts": self.attempts,
            "usage": self.usage,
            "latency_s": self.latency_s,
            "cached": self.cached,
        }


@dataclass
class Asker:
    """Everything needed to turn passages into verdicts with one chat model."""

    caller: Caller
    model: str
    params: SamplingParams  # for the mode's requests (listwise in listwise mode)
    pointwise_params: SamplingParams  # for pointwise requests, the listwise fallback included
    scale: Scale
    mode: Literal["pointwise", "listwise"]
    template: PromptTemplate
    pointwise_template: PromptTemplate
    language: str
    shape: AnswerShape
    reask: bool

    async def verdicts(self, query: Query, repeat: int) -> list[Verdict]:
        """One verdict per passage of ``query``, in rank order."""
        if self.mode == "listwise" and query.passages:
            verdicts = await self._listwise(query, list(query.passages), repeat)
        else:
            verdicts = list(
                await asyncio.gather(
                    *(
                        self._pointwise(query, p, rank, repeat)
                        for rank, p in enumerate(query.passages, start=1)
                    )
                )
            )
        verdicts.sort(key=lambda v: v.rank)
        return verdicts

    def first_requests(self, query: Query) -> list[ChatRequest]:
        """The first-round requests a query needs, exactly as they would be sent."""
        options = self.shape.options()
        if self.mode != "listwise" or not query.passages:
            chats = [
                self.pointwise_template.render_pointwise(query, p, self.scale, **options)
                for p in query.passages
            ]
            params = self.pointwise_params
            return [ChatRequest(model=self.model, messages=m, params=params) for m in chats]
        listwise = self.template.render_listwise(query, list(query.passages), self.scale, **options)
        return [ChatRequest(model=self.model, messages=listwise, params=self.params)]

    def render(self, query: Query, passages: Sequence[Passage]) -> tuple[Message, ...]:
        """The messages of one first-round request for ``passages`` (one passage pointwise)."""
        options = self.shape.options()
        if self.mode == "listwise":
            return self.template.render_listwise(query, list(passages), self.scale, **options)
        return self.pointwise_template.render_pointwise(query, passages[0], self.scale, **options)

    def _ok(self, passage: Passage, rank: int, parsed: Parsed, **extra: Any) -> Verdict:
        return Verdict(
            passage_id=passage.id,
            rank=rank,
            status="ok",
            label=parsed.label,
            grade=parsed.grade,
            relevant=self.scale.relevant(parsed.grade),
            probability=parsed.probability,
            expected_grade=parsed.expected_grade,
            reason=parsed.reason,
            **extra,
        )

    async def _pointwise(self, query: Query, passage: Passage, rank: int, repeat: int) -> Verdict:
        messages = self.pointwise_template.render_pointwise(
            query,
            passage,
            self.scale,
            **self.shape.options(),
        )
        tally = _Tally()
        error = ""
        conversation: tuple[Message, ...] = messages
        for round_ in range(2 if self.reask else 1):
            request = ChatRequest(
                model=self.model, messages=conversation, params=self.pointwise_params
            )
            try:
                got = await self.caller.complete(
                    request, repeat, lambda c: parse_pointwise(c, self.scale)
                )
            except ProviderError as exc:
                fields = tally.fields() | {"attempts": tally.attempts + exc.attempts}
                return Verdict(
                    passage_id=passage.id,
                    rank=rank,
                    status="error",
                    error=str(exc),
                    **fields | {"cached": False},
                )
            tally.add(got.call)
            if got.value is not None:
                return self._ok(passage, rank, got.value, **tally.fields())
            error = str(got.error)
            if round_ == 0:
                conversation = reask_messages(
                    messages, got.call.answer.text, error, language=self.language
                )
        return Verdict(
            passage_id=passage.id, rank=rank, status="unparsed", error=error, **tally.fields()
        )

    async def _listwise(self, query: Query, passages: list[Passage], repeat: int) -> list[Verdict]:
        """Listwise round, a second round for what is missing, then pointwise for the rest."""
        ranks = {p.id: rank for rank, p in enumerate(query.passages, start=1)}
        done: dict[str, Verdict] = {}
        todo = passages
        for _round in range(2):
            if not todo:
                break
            got = await self._listwise_round(query, todo, ranks, repeat)
            if got is None:  # provider error: every passage in this round is an error
                break
            done.update(got)
            todo = [p for p in todo if p.id not in got]
            if len(got) == 0:
                break  # the judge cannot do listwise here; go pointwise
        rest = [p for p in passages if p.id not in done]
        if rest:
            singles = await asyncio.gather(
                *(self._pointwise(query, p, ranks[p.id], repeat) for p in rest)
            )
            done.update({v.passage_id: v for v in singles})
        return [done[p.id] for p in passages]

    async def _listwise_round(
        self, query: Query, passages: list[Passage], ranks: dict[str, int], repeat: int
    ) -> dict[str, Verdict] | None:
        messages = self.template.render_listwise(
            query,
            passages,
            self.scale,
            **self.shape.options(),
        )
        ids = [p.id for p in passages]
        conversation = messages
        for round_ in range(2 if self.reask else 1):
            request = ChatRequest(model=self.model, messages=conversation, params=self.params)
            try:
                got = await self.caller.complete(
                    request, repeat, lambda c: parse_listwise(c, self.scale, ids)
                )
            except ProviderError:
                return None
            res, parsed = got.call, got.value
            if parsed is None:
                if round_ == 0:
                    conversation = reask_messages(
                        messages, res.answer.text, str(got.error), language=self.language
                    )
                continue
            by_id = {p.id: p for p in passages}
            shares = _split_usage(res.answer.usage, max(1, len(parsed.verdicts)))
            return {
                pid: self._ok(
                    by_id[pid],
                    ranks[pid],
                    item,
                    raw=res.answer.text,
                    attempts=res.attempts,
                    usage=share,
                    latency_s=res.latency_s,
                    cached=res.cached,
                )
                for (pid, item), share in zip(parsed.verdicts.items(), shares, strict=False)
            }
        return {}
