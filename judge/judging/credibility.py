"""Source credibility: the judge grades each passage's source on :data:`CREDIBILITY`, 0 low,
1 medium, 2 high, with a reason, from its URL, title and text (the query is its topic: a
source can be an authority on one subject and not another).

One pointwise request per passage; a passage several engines returned is one request (the
caller's in-flight sharing and cache). The answer is a verdict on the credibility scale, read
by the relevance parser (:func:`judge.judging.verdicts.parse_pointwise`); one that does not
parse is re-asked once, then ``Credibility(status="unparsed")``, never a grade.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass

from judge.aspects import Credibility
from judge.judging.ask import AskContext, answer_room, ask, aspect_params
from judge.judging.context import fit_to_context
from judge.judging.jsonscan import shown_as_data
from judge.judging.prompts import PromptTemplate, neutralise, one_line
from judge.judging.verdicts import parse_pointwise
from judge.providers.base import ChatRequest
from judge.schema import Passage, Query, Scale, Usage

__all__ = ["CREDIBILITY", "CredibilityAsker"]

CREDIBILITY = Scale.ordered(
    "credibility",
    1,
    (
        "low",
        "unreliable: spam, a content farm, advertising, anonymous or unsourced claims, "
        "or signs of misinformation",
        "不可靠：垃圾内容、内容农场、广告、匿名或无出处的说法，或有虚假信息的迹象",
        ("unreliable", "not credible", "低", "不可信"),
    ),
    (
        "medium",
        "an ordinary source: news, a company or personal site, a forum answer; "
        "plausible but not authoritative",
        "普通来源：新闻、公司或个人网站、论坛回答；可信但不权威",
        ("ordinary", "mixed", "中", "一般"),
    ),
    (
        "high",
        "authoritative on the topic: official, government, academic, a standards body, "
        "a recognised reference work, or the facts' original source",
        "在该主题上权威：官方、政府、学术机构、标准组织、公认的参考资料，或事实的原始来源",
        ("authoritative", "credible", "高", "权威", "可信"),
    ),
)


@dataclass(frozen=True)
class CredibilityAsker:
    """Asks for each passage's source credibility, for one judge."""

    ctx: AskContext
    template: PromptTemplate

    @property
    def answer_tokens(self) -> int:
        # A short reason and the label, as a relevance verdict with a reason takes.
        return 16 + 2 * self.ctx.max_reason_words

    def _render(self, query: Query, passage: Passage) -> ChatRequest:
        # The URL is printed outside the fence: it is untrusted text too.
        shown = passage.model_copy(update={"url": one_line(neutralise(passage.url or "")) or None})
        messages = self.template.render_pointwise(
            query, shown, CREDIBILITY, max_reason_words=self.ctx.max_reason_words
        )
        params = aspect_params(self.ctx.params, self.answer_tokens)
        return ChatRequest(model=self.ctx.model, messages=messages, params=params)

    def requests(self, query: Query) -> list[ChatRequest]:
        """One request per passage, each passage cut to fit the context window."""
        if self.ctx.context_tokens is not None and query.passages:
            query = fit_to_context(
                query,
                context_tokens=self.ctx.context_tokens,
                answer_tokens=answer_room(self.ctx.params, self.answer_tokens),
                listwise=False,
                render=lambda q, ps: self._render(q, ps[0]).messages,
            )
        return [self._render(query, p) for p in query.passages]

    async def grades(self, query: Query, repeat: int) -> tuple[tuple[Credibility, ...], Usage]:
        """Every passage's credibility, in rank order, and the tokens they took."""
        ctx = self.ctx
        asked = await asyncio.gather(
            *(
                ask(
                    ctx.caller,
                    r,
                    repeat,
                    functools.partial(
                        parse_pointwise, scale=CREDIBILITY, quoted=shown_as_data((p,))
                    ),
                    reask=ctx.reask,
                    language=ctx.language,
                )
                for r, p in zip(self.requests(query), query.passages, strict=True)
            )
        )
        out: list[Credibility] = []
        for p, got in zip(query.passages, asked, strict=True):
            if got.value is not None:
                out.append(
                    Credibility(
                        passage_id=p.id, status="ok", grade=got.value.grade, reason=got.value.reason
                    )
                )
            else:
                status = "error" if got.failed else "unparsed"
                out.append(Credibility(passage_id=p.id, status=status, error=got.error))
        return tuple(out), sum((got.usage for got in asked), Usage())
