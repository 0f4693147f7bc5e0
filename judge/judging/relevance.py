"""Relevance verdicts: rendering, asking (judging/ask.py), reading — one query's verdicts.

Pointwise: one call per passage. Listwise: one call for the whole list; ids the judge left
out (or answered off-scale) are asked again in a second, smaller listwise call, and whatever
is still missing is judged pointwise — a verdict is never guessed. A completion that does not
parse gets one re-ask carrying the validation error, then the verdict is ``unparsed`` with the
raw text kept (DESIGN rule 1). Provider failures after the caller's retries are ``error``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from judge.calling.caller import CallResult, Prompt, Reader
from judge.judging.ask import AskContext, Asked, ask
from judge.judging.jsonscan import shown_as_data
from judge.judging.keys import PromptKeys, parser_tag
from judge.judging.prompts import AnswerShape, PromptTemplate, json_schema_for, numbered
from judge.judging.units import admitted, told
from judge.judging.verdicts import (
    ListwiseParsed,
    Parsed,
    empty_verdict,
    ok_verdict,
    parse_listwise,
    parse_pointwise,
)
from judge.providers.base import ChatRequest, Completion, Message
from judge.schema import Passage, Query, SamplingParams, Scale, Usage, Verdict, share_verdict_fields
from judge.sections import JudgeSection

R = TypeVar("R")
# Passages of a query whose cached answers are looked up together (see ``_asks``).
CACHED_WINDOW = 256


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


# What one verdict of a list answer takes: its id, label and punctuation, then its reason.
VERDICT_TOKENS, TOKENS_PER_WORD = 16, 2
# Passages a listwise request holds at most unless [judge] list_size says.
LIST_SIZE = 20


def window_size(settings: JudgeSection) -> int:
    """Passages a listwise request holds: ``list_size``, fewer when their answers would not
    fit its ``max_tokens`` (a verdict about ``VERDICT_TOKENS``, and ``TOKENS_PER_WORD`` a
    word of its reason): an answer cut off at max_tokens leaves the rest asked again."""
    per = VERDICT_TOKENS + (TOKENS_PER_WORD * settings.max_reason_words if settings.reasons else 0)
    size, most = settings.list_size or LIST_SIZE, settings.params.max_tokens
    return max(1, min(size, most // per)) if most else size


def _to_ask(query: Query) -> list[Passage]:
    """``query``'s passages a judge is asked about: all but the blank ones."""
    return [p for p in query.passages if not p.blank]


@dataclass
class Asker:
    """Everything needed to turn passages into verdicts with one chat model."""

    ctx: AskContext
    params: SamplingParams  # for the mode's requests (listwise in listwise mode)
    pointwise_params: SamplingParams  # for pointwise requests, the listwise fallback included
    scale: Scale
    mode: Literal["pointwise", "listwise"]
    template: PromptTemplate
    pointwise_template: PromptTemplate
    shape: AnswerShape
    # The listwise schema is the one the scale implies: each list request gets its own, with
    # its passages' ids and count (a schema the user gave is sent as given).
    schema_per_list: bool = False
    # Listwise: passages a request holds at most; a longer list is asked in windows.
    list_size: int = LIST_SIZE

    def __post_init__(self) -> None:
        # First-round prompts are known by digests before they are rendered, and their
        # readings are kept in the cache: a cached re-run renders and parses nothing.
        options = self.shape.options()
        self._keys = PromptKeys(self.template, self.scale, options, self.ctx.model, self.params)
        self._point_keys = self._keys
        if self.pointwise_template is not self.template or self.pointwise_params != self.params:
            self._point_keys = PromptKeys(
                self.pointwise_template, self.scale, options, self.ctx.model, self.pointwise_params
            )
        self._point_tag = parser_tag("pointwise", self.scale)

    def _point_reader(self, passage: Passage) -> Reader[Parsed]:
        """The pointwise parser for ``passage``'s answer: a verdict quoted from the passage
        is not the judge's (:class:`~judge.judging.jsonscan.Quoted`)."""
        quoted = shown_as_data((passage,))
        return Reader(
            lambda c: parse_pointwise(c, self.scale, quoted),
            self._point_tag,
            Parsed.model_dump_json,
            Parsed.model_validate_json,
        )

    def identity(self) -> str:
        """What decides this asker's verdicts besides the query, its passages and the cached
        answers: its prompts' shared digests, the parser's tag and how it asks."""
        window = self.list_size if self.mode == "listwise" else None  # pointwise: none
        how = (self.mode, self.ctx.reask, self.schema_per_list, self.ctx.language, window)
        parts = (self._keys.identity, self._point_keys.identity, self._point_tag, repr(how))
        return "\x00".join(parts)

    def _pointwise_prompt(self, query: Query, passage: Passage) -> Prompt:
        def render() -> ChatRequest:
            messages = self.pointwise_template.render_pointwise(
                query, passage, self.scale, **self.shape.options()
            )
            return ChatRequest(
                model=self.ctx.model, messages=messages, params=self.pointwise_params
            )

        return Prompt(self._point_keys.pointwise(query, passage), render)

    def _listwise_prompt(self, query: Query, passages: list[Passage]) -> Prompt:
        def render() -> ChatRequest:
            messages = self.template.render_listwise(
                query, numbered(passages), self.scale, **self.shape.options()
            )
            return ChatRequest(model=self.ctx.model, messages=messages, params=self._list(passages))

        return Prompt(self._keys.listwise(query, passages), render)

    def _list(self, passages: Sequence[Passage]) -> SamplingParams:
        """The sampling of a list request for ``passages`` (see ``schema_per_list``)."""
        if not self.schema_per_list:
            return self.params
        ids = [str(n) for n in range(1, len(passages) + 1)]  # as numbered() shows them
        schema = json_schema_for(self.scale, "listwise", shape=self.shape, passage_ids=ids)
        return self.params.model_copy(update={"json_schema": schema})

    def first_prompts(self, query: Query) -> list[Prompt]:
        """The first-round prompts a query needs (:meth:`first_requests`, unrendered)."""
        return [prompt for prompt, _ in self.first_asks(query)]

    def first_asks(self, query: Query) -> list[tuple[Prompt, tuple[str, ...] | None]]:
        """Each first-round prompt with the passage ids it asks about (None: one passage,
        pointwise): one a passage, or one a listwise window."""
        asked = _to_ask(query)
        if self.mode != "listwise" or not asked:
            return [(self._pointwise_prompt(query, p), None) for p in asked]
        return [
            (self._listwise_prompt(query, w), tuple(p.id for p in w)) for w in self.windows(asked)
        ]

    def windows(self, passages: Sequence[Passage]) -> list[list[Passage]]:
        """``passages`` in the listwise windows they are asked in, ``list_size`` each."""
        size = self.list_size
        return [list(passages[i : i + size]) for i in range(0, len(passages), size)]

    async def verdicts(self, query: Query, repeat: int) -> list[Verdict]:
        """One verdict per passage of ``query``, in rank order (a blank passage's without a
        call: ``empty_verdict``)."""
        if self.mode == "listwise" and query.passages:
            verdicts = self._empty(query)
            lists = [self._listwise(query, w, repeat) for w in self.windows(_to_ask(query))]
            for got in await asyncio.gather(*lists):
                verdicts += got
        else:
            verdicts = []
            asks = self._asks(query, repeat, verdicts)
            verdicts += await admitted(asks, self.ctx.caller.admission())
        verdicts.sort(key=lambda v: v.rank)
        share_verdict_fields(verdicts)  # a run holds them all (judge/schema.py)
        return verdicts

    def _asks(
        self, query: Query, repeat: int, verdicts: list[Verdict]
    ) -> Iterator[Callable[[], Coroutine[Any, Any, Verdict]]]:
        """The asks for ``query``'s passages whose answers are not cached, made as the gate
        starts them (:meth:`verdicts`); the cached ones are read a window at a time and put
        in ``verdicts`` at once (a task per passage would cost a cached re-run more than
        reading its answers; a window, not the whole query, so that a query of 50,000
        passages holds no more prompts than the asks started need)."""
        verdicts.extend(self._empty(query))
        ranked = [(rank, p) for rank, p in enumerate(query.passages, start=1) if not p.blank]
        for start in range(0, len(ranked), CACHED_WINDOW):
            window = ranked[start : start + CACHED_WINDOW]
            prompts = [self._pointwise_prompt(query, p) for _, p in window]
            readers = [self._point_reader(p) for _, p in window]
            hits = self.ctx.caller.cached(prompts, repeat, readers)
            for (rank, p), prompt, hit in zip(window, prompts, hits, strict=True):
                if hit is not None and hit.value is not None:
                    verdicts.append(self._hit(p, rank, hit.call, hit.value))
                    told(verdicts[-1])
                else:
                    yield functools.partial(self._pointwise, query, p, rank, repeat, prompt)

    def cached_verdicts(self, query: Query, repeat: int) -> list[Verdict] | None:
        """The verdicts a cached re-run would give ``query``, when every first-round answer is
        in the cache now (pointwise); None otherwise, and for a listwise asker. Sends nothing
        and counts no hit: what a paid run stores as the query's verdict set (judging/memo.py)."""
        if self.mode == "listwise" and query.passages:
            return None
        ranked = [(rank, p) for rank, p in enumerate(query.passages, start=1) if not p.blank]
        prompts = [self._pointwise_prompt(query, p) for _, p in ranked]
        readers = [self._point_reader(p) for _, p in ranked]
        hits = self.ctx.caller.cached(prompts, repeat, readers, count=False)
        verdicts = self._empty(query, tell=False)
        for (rank, p), hit in zip(ranked, hits, strict=True):
            if hit is None or hit.value is None:
                return None
            verdicts.append(self._hit(p, rank, hit.call, hit.value))
        verdicts.sort(key=lambda v: v.rank)
        return verdicts

    def _empty(self, query: Query, *, tell: bool = True) -> list[Verdict]:
        """The verdicts of ``query``'s blank passages, given without asking (``tell``: handed
        on as made, as every verdict a unit makes is)."""
        found = [
            empty_verdict(self.scale, p, rank)
            for rank, p in enumerate(query.passages, start=1)
            if p.blank
        ]
        for verdict in found if tell else ():
            told(verdict)
        return found

    def first_requests(self, query: Query) -> list[ChatRequest]:
        """The first-round requests a query needs, exactly as they would be sent."""
        options = self.shape.options()
        asked = _to_ask(query)
        if self.mode != "listwise" or not asked:
            chats = [
                self.pointwise_template.render_pointwise(query, p, self.scale, **options)
                for p in asked
            ]
            params = self.pointwise_params
            return [ChatRequest(model=self.ctx.model, messages=m, params=params) for m in chats]
        return [
            ChatRequest(
                model=self.ctx.model,
                messages=self.template.render_listwise(query, numbered(w), self.scale, **options),
                params=self._list(w),
            )
            for w in self.windows(asked)
        ]

    def render(self, query: Query, passages: Sequence[Passage]) -> tuple[Message, ...]:
        """The messages of one first-round request for ``passages`` (one passage pointwise)."""
        options = self.shape.options()
        if self.mode == "listwise":
            return self.template.render_listwise(query, numbered(passages), self.scale, **options)
        return self.pointwise_template.render_pointwise(query, passages[0], self.scale, **options)

    def _hit(
        self, passage: Passage, rank: int, call: CallResult[Completion], parsed: Parsed
    ) -> Verdict:
        """The verdict a cached answer gives (one call, read from the cache)."""
        return self._ok(
            passage,
            rank,
            parsed,
            raw=call.answer.text,
            attempts=call.attempts,
            usage=call.answer.usage,
            latency_s=call.latency_s,
            cached=call.cached,
        )

    def _ok(self, passage: Passage, rank: int, parsed: Parsed, **extra: Any) -> Verdict:
        return ok_verdict(
            self.scale,
            passage.id,
            rank,
            parsed.label,
            parsed.grade,
            probability=parsed.probability,
            expected_grade=parsed.expected_grade,
            reason=parsed.reason,
            **extra,
        )

    async def _pointwise(
        self, query: Query, passage: Passage, rank: int, repeat: int, prompt: Prompt | None = None
    ) -> Verdict:
        prompt = prompt or self._pointwise_prompt(query, passage)
        asked = await self._ask(prompt, repeat, self._point_reader(passage))
        tally = {
            "raw": asked.raw,
            "attempts": asked.attempts,
            "usage": asked.usage,
            "latency_s": asked.latency_s,
            "cached": asked.cached,
        }
        if asked.value is not None:
            verdict = self._ok(passage, rank, asked.value, **tally)
        else:
            status = "error" if asked.failed else "unparsed"
            verdict = Verdict(
                passage_id=passage.id, rank=rank, status=status, error=asked.error, **tally
            )
        told(verdict)
        return verdict

    async def _ask(self, prompt: Prompt, repeat: int, reader: Reader[R]) -> Asked[R]:
        return await ask(
            self.ctx.caller,
            prompt,
            repeat,
            reader,
            reask=self.ctx.reask,
            language=self.ctx.language,
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
            done.update(got)
            todo = [p for p in todo if p.id not in got]
            if len(got) == 0:
                break  # the judge cannot do listwise here; go pointwise
        rest = [p for p in passages if p.id not in done]
        if rest:
            self.ctx.caller.stats.asked_alone += len(rest)  # said: a request each, not a list's
            singles = await asyncio.gather(
                *(self._pointwise(query, p, ranks[p.id], repeat) for p in rest)
            )
            done.update({v.passage_id: v for v in singles})
        return [done[p.id] for p in passages]

    async def _listwise_round(
        self, query: Query, passages: list[Passage], ranks: dict[str, int], repeat: int
    ) -> dict[str, Verdict]:
        """One list's verdicts by passage id: those its answer gives; every passage's, unparsed,
        when the answer was cut inside its thinking (asking each alone would think as long
        again); every passage's, an error, when the provider failed after the Caller's retries
        (asked alone of a provider that just failed, each would fail again, a request each)."""
        prompt = self._listwise_prompt(query, passages)
        ids = [p.id for p in passages]
        quoted = shown_as_data(passages)
        reader = Reader(
            lambda c: parse_listwise(c, self.scale, ids, quoted),
            parser_tag("listwise", self.scale, ids),
            ListwiseParsed.model_dump_json,
            ListwiseParsed.model_validate_json,
        )
        asked = await self._ask(prompt, repeat, reader)
        if asked.failed or (
            asked.value is None and asked.futile and "<think>" in (asked.error or "")
        ):
            status = "error" if asked.failed else "unparsed"
            tally = {"raw": asked.raw, "attempts": asked.attempts, "cached": asked.cached}
            shares = _split_usage(asked.usage, len(passages))
            out = {
                p.id: Verdict(
                    passage_id=p.id,
                    rank=ranks[p.id],
                    status=status,
                    error=asked.error,
                    usage=share,
                    latency_s=asked.latency_s,
                    **tally,
                )
                for p, share in zip(passages, shares, strict=True)
            }
            for verdict in out.values():
                told(verdict)
            return out
        if asked.value is None:
            return {}
        by_id = {p.id: p for p in passages}
        shares = _split_usage(asked.usage, max(1, len(asked.value.verdicts)))
        got = {
            pid: self._ok(
                by_id[pid],
                ranks[pid],
                item,
                raw=asked.raw,
                attempts=asked.attempts,
                usage=share,
                latency_s=asked.latency_s,
                cached=asked.cached,
            )
            for (pid, item), share in zip(asked.value.verdicts.items(), shares, strict=False)
        }
        for verdict in got.values():
            told(verdict)
        return got
