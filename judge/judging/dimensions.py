"""Coverage and credibility beside relevance, for one Judge: the ``[nuggets]`` and
``[credibility]`` dimensions, each opt-in because each costs calls.

A run first gives every query a nugget set (:meth:`Dimensions.prepare`: the sets it is given
as they are, the rest written by the judge from every engine's passages for that query
pooled, :mod:`judge.judging.nuggets`); then, per (query, engine, repeat) unit, after its
relevance verdicts (:func:`with_aspects`), :meth:`Dimensions.judge` asks which passages
support which nugget (:mod:`judge.judging.support`) and how credible each source is
(:mod:`judge.judging.credibility`). A query whose set could not be written has every
passage's support ``error`` or ``unparsed`` with the reason, so its coverage is undefined and
a resumed run asks again. Judging a query whose set is unknown (the Python API without
``prepare``) writes its set from that query's own passages first, once per query id.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from judge.aspects import Aspects, AspectStatus, Coverage, Nugget, NuggetSet, Support
from judge.calling.cache import Cache
from judge.calling.caller import Caller
from judge.config import CredibilitySection, NuggetsSection
from judge.data.nuggets import same_query
from judge.errors import BudgetExceeded, ParseError
from judge.judging.asking import ask
from judge.judging.credibility import CredibilityAsker
from judge.judging.nuggets import NuggetPrompt, parse_nuggets, pool
from judge.judging.prompts import load_template
from judge.judging.support import Assigner
from judge.metrics.compute import parse_metric_name
from judge.providers.base import ChatRequest, Completion
from judge.schema import JudgedQuery, MetricPolicy, Query, SamplingParams, Usage, Verdict

if TYPE_CHECKING:
    from judge.judging.judge import Judge, Judged

__all__ = ["Aspects", "Dimensions", "Planned", "aspect_fields", "unit_statuses_of", "with_aspects"]

# A request a dry run counts: (kind, request, repeat, completion tokens it expects).
Planned = tuple[str, ChatRequest, int, int]
# A nugget's text as a dry run imagines it before the judge has written it (about 15 tokens).
_PLACEHOLDER = "one fact of about a dozen words standing in for a nugget not written yet"


class Dimensions:
    """The dimensions a Judge adds to relevance; build with :meth:`of` (None when all off)."""

    def __init__(
        self,
        nuggets: NuggetsSection,
        credibility: CredibilitySection,
        *,
        caller: Caller,
        model: str,
        params: SamplingParams,
        language: str,
        template_dir: str | Path | None,
        context_tokens: int | None,
        reask: bool,
        max_reason_words: int,
    ) -> None:
        """Long because it wires each dimension's asker from the judge's settings."""
        tdir = Path(template_dir) if template_dir else None
        self.section, self.model, self.caller = nuggets, model, caller
        self.language, self.reask = language, reask
        self.sets: dict[str, NuggetSet] = {}
        # Query ids whose set could not be written in this Judge's life: status and why.
        self.failures: dict[str, tuple[AspectStatus, str]] = {}
        self.creation_usage = Usage()
        self._creating: dict[str, asyncio.Task[None]] = {}
        self.maker: NuggetPrompt | None = None
        self.assigner: Assigner | None = None
        self.credibility: CredibilityAsker | None = None
        if nuggets.enabled:
            self.maker = NuggetPrompt(
                load_template(f"nuggets.listwise.{language}", template_dir=tdir),
                model,
                params,
                nuggets.max_nuggets,
                nuggets.pool_tokens,
                context_tokens,
            )
            self.assigner = Assigner(
                caller,
                load_template(f"support.listwise.{language}", template_dir=tdir),
                model,
                params,
                language,
                reask,
                nuggets.group_passages,
                context_tokens,
            )
        if credibility.enabled:
            self.credibility = CredibilityAsker(
                caller,
                load_template(f"credibility.pointwise.{language}", template_dir=tdir),
                model,
                params,
                language,
                reask,
                max_reason_words,
                context_tokens,
            )

    @classmethod
    def of(
        cls,
        nuggets: NuggetsSection | bool,
        credibility: CredibilitySection | bool,
        judge: Judge,
        template_dir: str | Path | None,
    ) -> Dimensions | None:
        """The dimensions turned on for ``judge`` (``True``: with the default settings), asked
        with its model, params, language, re-ask and context window; None when none is on."""
        n = nuggets if isinstance(nuggets, NuggetsSection) else NuggetsSection(enabled=nuggets)
        c = credibility
        if not isinstance(c, CredibilitySection):
            c = CredibilitySection(enabled=c)
        if not n.enabled and not c.enabled:
            return None
        return cls(
            n,
            c,
            caller=judge.caller,
            model=judge.model,
            params=judge.params,
            language=judge.asker.language,
            template_dir=template_dir,
            context_tokens=judge.context_tokens,
            reask=judge.asker.reask,
            max_reason_words=judge.asker.shape.max_reason_words,
        )

    def metric_policy(self, policy: MetricPolicy) -> MetricPolicy:
        """``policy`` with each dimension's default metrics added when it names none of its own."""
        names = list(policy.names)
        for on, defaults in (
            (self.assigner is not None, NuggetsSection.DEFAULT),
            (self.credibility is not None, CredibilitySection.DEFAULT),
        ):
            bases = {parse_metric_name(d)[0] for d in defaults}
            if on and not any(parse_metric_name(n)[0] in bases for n in names):
                names += defaults
        return policy.model_copy(update={"names": tuple(names)})

    # ---- nugget sets ------------------------------------------------------------------

    async def prepare(
        self, queries: Sequence[Query], known: Mapping[str, NuggetSet] | None = None
    ) -> None:
        """A nugget set for every query id of ``queries``: ``known`` ones as given, the rest
        written by the judge from every engine's passages pooled, concurrently (one request
        per query id). BudgetExceeded propagates; other failures are kept per query id."""
        self.sets.update(known or {})
        by_id: dict[str, list[Query]] = {}
        for q in queries:
            by_id.setdefault(q.query_id, []).append(q)
        todo = [qid for qid in by_id if qid not in self.sets and qid not in self.failures]
        done = await asyncio.gather(
            *(self._create(by_id[qid]) for qid in todo), return_exceptions=True
        )
        failed = [r for r in done if isinstance(r, BaseException)]
        if failed:  # the budget's stop first: the run ends resumable on it
            raise next((r for r in failed if isinstance(r, BudgetExceeded)), failed[0])

    def _key(self, query: Query) -> str:
        """Where ``query``'s set is kept: its id, unless a set kept there is for another text
        (the Python API names every bare query text "q")."""
        found = self.sets.get(query.query_id)
        if found is None or same_query(found.query, query.query):
            return query.query_id
        return f"{query.query_id}\x00{query.query}"

    async def _create(self, queries: Sequence[Query]) -> None:
        first, key = queries[0], self._key(queries[0])
        if self.maker is None or key in self.sets:
            return
        passages = pool(queries, self.section.pool_passages)
        if not passages:
            self.failures[key] = ("unparsed", "no passages to write nuggets from")
            return
        pooled = first.model_copy(update={"passages": passages, "engine": "pool"})
        parse = functools.partial(parse_nuggets, max_nuggets=self.section.max_nuggets)
        request = self.maker.request(pooled)
        asked = await ask(self.caller, request, 0, parse, reask=self.reask, language=self.language)
        self.creation_usage = self.creation_usage + asked.usage
        if asked.value is None:
            status: AspectStatus = "error" if asked.failed else "unparsed"
            self.failures[key] = (status, f"nugget creation: {asked.error}")
            return
        self.sets[key] = NuggetSet(
            query_id=first.query_id, query=first.query, nuggets=asked.value, model=self.model
        )

    async def _nugget_set(self, query: Query) -> tuple[str, NuggetSet | None]:
        """The set for ``query`` (written from its own passages when none is known, once per
        query even when engines ask together) and the key it is kept under."""
        key = self._key(query)
        if key not in self.sets and key not in self.failures:
            task = self._creating.get(key)
            if task is None:
                task = self._creating[key] = asyncio.create_task(self._create([query]))
            await task
        return key, self.sets.get(key)

    # ---- per unit ---------------------------------------------------------------------

    async def judge(self, query: Query, repeat: int) -> Aspects:
        """``query``'s coverage and credibility for repeat ``repeat`` (each None when off)."""
        coverage, c_usage = (None, Usage())
        credibility, r_usage = (None, Usage())
        if self.assigner is not None and self.credibility is not None:
            (coverage, c_usage), (credibility, r_usage) = await asyncio.gather(
                self._coverage(query, repeat), self.credibility.grades(query, repeat)
            )
        elif self.assigner is not None:
            coverage, c_usage = await self._coverage(query, repeat)
        elif self.credibility is not None:
            credibility, r_usage = await self.credibility.grades(query, repeat)
        usage = c_usage + r_usage
        return Aspects(
            coverage=coverage,
            credibility=credibility,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
        )

    async def _coverage(self, query: Query, repeat: int) -> tuple[Coverage, Usage]:
        assert self.assigner is not None
        key, found = await self._nugget_set(query)
        if found is None:
            status, why = self.failures[key]
            supports = tuple(
                Support(passage_id=p.id, status=status, error=why) for p in query.passages
            )
            return Coverage(nuggets=(), supports=supports), Usage()
        if not query.passages:
            return Coverage(nuggets=found.nuggets, supports=()), Usage()
        return await self.assigner.coverage(query, found, repeat)

    # ---- a dry run --------------------------------------------------------------------

    def planned(
        self,
        queries: Sequence[Query],
        units: Sequence[tuple[Query, int]],
        known: Mapping[str, NuggetSet],
        cache: Cache,
    ) -> tuple[list[Planned], bool]:
        """The requests ``units`` need, creation for the query ids ``known`` lacks included,
        and whether some assignment prompts stand in placeholder nuggets for a set not written
        yet (a creation answer in ``cache`` is read: its set is known)."""
        out, sets = self._creation_planned(queries, {q.query_id for q, _ in units}, known, cache)
        stand_in = tuple(
            Nugget(id=f"n{i}", text=_PLACEHOLDER) for i in range(1, self.section.max_nuggets + 1)
        )
        for q, repeat in units:
            if self.assigner is not None and q.passages:
                nuggets = sets[q.query_id].nuggets if q.query_id in sets else stand_in
                for batch in self.assigner.groups(q, nuggets):
                    # An entry per passage with a nugget id or two: about 12 tokens.
                    request = self.assigner.request(q, batch, nuggets)
                    out.append(("support", request, repeat, 8 + 12 * len(batch)))
            if self.credibility is not None:
                answer = self.credibility.answer_tokens
                out += [("credibility", r, repeat, answer) for r in self.credibility.requests(q)]
        stood_in = any(q.query_id not in sets and q.passages for q, _ in units)
        return out, stood_in and self.assigner is not None

    def _creation_planned(
        self,
        queries: Sequence[Query],
        wanted: set[str],
        known: Mapping[str, NuggetSet],
        cache: Cache,
    ) -> tuple[list[Planned], dict[str, NuggetSet]]:
        """The creation requests for the wanted query ids ``known`` lacks, and the sets known
        after reading those a cached creation answer gives."""
        out: list[Planned] = []
        sets = dict(known)
        if self.maker is None:
            return out, sets
        for qid in sorted(wanted - set(known)):
            group = [q for q in queries if q.query_id == qid]
            passages = pool(group, self.section.pool_passages)
            if not passages:
                continue
            pooled = group[0].model_copy(update={"passages": passages, "engine": "pool"})
            request = self.maker.request(pooled)
            # A written nugget takes about 25 tokens, the JSON around them 10.
            out.append(("nuggets", request, 0, 10 + 25 * self.section.max_nuggets))
            answer = cache.get(self.caller.key(request, 0), Completion)
            try:
                nuggets = parse_nuggets(answer, self.section.max_nuggets) if answer else None
            except ParseError:
                nuggets = None
            if nuggets:
                sets[qid] = NuggetSet(query_id=qid, query=pooled.query, nuggets=nuggets)
        return out, sets


def unit_statuses_of(jq: JudgedQuery) -> frozenset[str]:
    """How a unit's answers ended: its verdicts', its supports' and its credibility grades'
    statuses (a resumed run judges a unit with an ``error`` among them again)."""
    supports = jq.coverage.supports if jq.coverage is not None else ()
    return frozenset(
        [v.status for v in jq.verdicts]
        + [s.status for s in supports]
        + [c.status for c in jq.credibility or ()]
    )


async def with_aspects(
    dimensions: Dimensions | None,
    judged: tuple[Query, int, Sequence[Verdict], dict[str, float] | None],
) -> Judged:
    """A unit's relevance judging with its coverage and credibility (None when all are off).
    Asked after its verdicts, not beside them: a run keeps many units in flight, so the
    caller's concurrency limit, not one unit's wait, sets the pace."""
    query, repeat, _, _ = judged
    aspects = await dimensions.judge(query, repeat) if dimensions is not None else None
    return (*judged, aspects)


def aspect_fields(aspects: Aspects | None, verdicts: Sequence[Verdict]) -> dict[str, Any]:
    """A JudgedQuery's coverage, credibility and usage (its verdicts' tokens and theirs)."""
    usage = Usage(  # summed as numbers: a cached run adds up 100,000 of these
        prompt_tokens=sum(v.usage.prompt_tokens for v in verdicts),
        completion_tokens=sum(v.usage.completion_tokens for v in verdicts),
    )
    if aspects is None:
        return {"usage": usage}
    extra = Usage(prompt_tokens=aspects.prompt_tokens, completion_tokens=aspects.completion_tokens)
    return {
        "usage": usage + extra,
        "coverage": aspects.coverage,
        "credibility": aspects.credibility,
    }
