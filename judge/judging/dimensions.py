"""Dimensions beyond relevance, as plug-ins: each a :class:`Dimension`, registered in
:data:`DIMENSIONS`, opt-in because each costs calls.

A dimension is named by its config table (``[nuggets]``, ``[credibility]``) and fills one
field of a :class:`~judge.schema.JudgedQuery` (``coverage``, ``credibility``). It is built
from its table and the judge's :class:`~judge.judging.ask.AskContext`; before the first unit a
run lets it :meth:`~Dimension.prepare` (the nugget dimension gives every query a nugget set:
the sets it is given as they are, the rest written by the judge from every engine's passages
for that query pooled, :mod:`judge.judging.nuggets`); then, per (query, engine, repeat) unit,
after its relevance verdicts, :meth:`~Dimension.judge` gives its result and the tokens it took.
A dry run asks it for the requests it would send (:meth:`~Dimension.planned`).

Adding a dimension: its asker and prompts (judging/), its records (aspects.py) and a
JudgedQuery field, a metric kernel (metrics/), its table (sections.py) and a line in
:data:`DIMENSIONS`; docs/DESIGN.md lists the files.
"""

from __future__ import annotations

import asyncio
import functools
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ValidationError

from judge.aspects import AspectStatus, Coverage, Credibility, Nugget, NuggetSet, Support
from judge.calling.cache import Cache
from judge.config import CredibilitySection, NuggetsSection
from judge.data.nuggets import NUGGETS_FILE, given_sets, same_query, write_nuggets
from judge.errors import BudgetExceeded, ConfigError, ParseError
from judge.judging.ask import AskContext, ask
from judge.judging.credibility import CredibilityAsker
from judge.judging.jsonscan import shown_as_data
from judge.judging.nuggets import NuggetPrompt, parse_nuggets, pool
from judge.judging.prompts import load_template
from judge.judging.support import Assigner
from judge.providers.base import ChatRequest, Completion
from judge.schema import JudgedQuery, MetricPolicy, Query, Usage
from judge.sections import with_dimension_defaults

__all__ = [
    "DIMENSIONS",
    "Dimension",
    "Dimensions",
    "PlanFor",
    "Planned",
    "UnitAspects",
    "unit_statuses_of",
]

# A request a dry run counts: (kind, request, repeat, completion tokens it expects).
Planned = tuple[str, ChatRequest, int, int]
# A nugget's text as a dry run imagines it before the judge has written it (about 15 tokens).
_PLACEHOLDER = "one fact of about a dozen words standing in for a nugget not written yet"


@dataclass(frozen=True)
class PlanFor:
    """What a dry run asks a dimension's requests for: every query of the run as given (nugget
    pools are made of them), the units still to judge (as the run fits them), the run
    directory (the sets it keeps) and the cache (answers that make content known)."""

    queries: Sequence[Query]
    units: Sequence[tuple[Query, int]]
    run_dir: Path
    cache: Cache


class Dimension(ABC):
    """One question beyond relevance, asked per unit after its verdicts. A subclass names its
    table, the JudgedQuery field it fills and its default metrics, and is built from its
    table, the judge's AskContext and a template folder."""

    name: ClassVar[str]  # its config table, and its key among a unit's results
    field: ClassVar[str]  # the JudgedQuery field its result fills
    section_type: ClassVar[
        type[NuggetsSection] | type[CredibilitySection]
    ]  # its table's record; ``enabled`` switches it on
    # The metrics computed when ``[metrics] names`` names none of this dimension's.
    default_metrics: ClassVar[tuple[str, ...]]

    def __init__(self, section: Any, ctx: AskContext, template_dir: Path | None) -> None:
        self.section, self.ctx, self.template_dir = section, ctx, template_dir

    def load(self, queries: Sequence[Query], run_dir: Path | None) -> None:
        """What it is given for ``queries`` (files, a run directory's own), read before anything
        is paid: an InputError names a bad file. Nothing, unless a dimension says so."""
        return None

    async def prepare(self, queries: Sequence[Query], run_dir: Path | None) -> None:
        """Before the first unit, with every query of the run (a run directory to keep what
        it prepared in, or None). BudgetExceeded propagates. Nothing, unless a dimension says
        so."""
        return None

    @abstractmethod
    async def judge(self, query: Query, repeat: int) -> tuple[Any, Usage]:
        """One unit's result (the JudgedQuery field's value) and the tokens it took."""

    @abstractmethod
    def planned(self, plan: PlanFor) -> tuple[list[Planned], bool]:
        """The requests ``plan.units`` need, and whether some are estimates (stand-in content)."""

    @staticmethod
    @abstractmethod
    def statuses(result: Any) -> Iterable[AspectStatus]:
        """How a result's answers ended (a resumed run judges an ``error`` again)."""


class NuggetsDimension(Dimension):
    """``[nuggets]``: a nugget set per query, then which passages support which nugget."""

    name = "nuggets"
    field = "coverage"
    section_type = NuggetsSection
    default_metrics = NuggetsSection.DEFAULT

    def __init__(self, section: NuggetsSection, ctx: AskContext, template_dir: Path | None):
        super().__init__(section, ctx, template_dir)
        self.section: NuggetsSection = section
        self.sets: dict[str, NuggetSet] = {}
        # Query ids whose set could not be written in this Judge's life: status and why.
        self.failures: dict[str, tuple[AspectStatus, str]] = {}
        self._creating: dict[str, asyncio.Task[None]] = {}
        language, params = ctx.language, ctx.params
        self.maker = NuggetPrompt(
            load_template(f"nuggets.listwise.{language}", template_dir=template_dir, mark=ctx.mark),
            ctx.model,
            params,
            section.max_nuggets,
            section.pool_tokens,
            ctx.context_tokens,
        )
        self.assigner = Assigner(
            ctx,
            load_template(f"support.listwise.{language}", template_dir=template_dir, mark=ctx.mark),
            section.group_passages,
        )

    @staticmethod
    def statuses(result: Any) -> Iterable[AspectStatus]:
        return [] if result is None else [s.status for s in result.supports]

    def given(self, queries: Sequence[Query], run_dir: Path | None) -> dict[str, NuggetSet]:
        """The sets given for ``queries``: the ``path`` file's, then the run directory's own."""
        if run_dir is None and self.section.path is None:
            return {}
        return given_sets(self.section.path, run_dir or Path(), queries)

    def load(self, queries: Sequence[Query], run_dir: Path | None) -> None:
        if run_dir is not None:
            self.sets.update(self.given(queries, run_dir))

    async def prepare(self, queries: Sequence[Query], run_dir: Path | None) -> None:
        """A nugget set for every query id of ``queries``: given ones (:meth:`load`) as they
        are, the rest written by the judge from every engine's passages pooled, concurrently
        (one request per query id); the sets then written to the run directory.
        BudgetExceeded propagates; other failures are kept per query id."""
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
        if run_dir is not None:
            sets = [self.sets[qid] for qid in by_id if qid in self.sets]
            write_nuggets(run_dir / NUGGETS_FILE, sets)

    def _key(self, query: Query) -> str:
        """Where ``query``'s set is kept: its id, unless a set kept there is for another text
        (the Python API names every bare query text "q")."""
        found = self.sets.get(query.query_id)
        if found is None or same_query(found.query, query.query):
            return query.query_id
        return f"{query.query_id}\x00{query.query}"

    async def _create(self, queries: Sequence[Query]) -> None:
        first, key = queries[0], self._key(queries[0])
        if key in self.sets:
            return
        passages = pool(queries, self.section.pool_passages)
        if not passages:
            self.failures[key] = ("unparsed", "no passages to write nuggets from")
            return
        pooled = first.model_copy(update={"passages": passages, "engine": "pool"})
        parse = functools.partial(
            parse_nuggets, max_nuggets=self.section.max_nuggets, quoted=shown_as_data(passages)
        )
        ctx = self.ctx
        request = self.maker.request(pooled)
        asked = await ask(ctx.caller, request, 0, parse, reask=ctx.reask, language=ctx.language)
        if asked.value is None:
            status: AspectStatus = "error" if asked.failed else "unparsed"
            self.failures[key] = (status, f"nugget creation: {asked.error}")
            return
        self.sets[key] = NuggetSet(
            query_id=first.query_id, query=first.query, nuggets=asked.value, model=ctx.model
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

    async def judge(self, query: Query, repeat: int) -> tuple[Coverage, Usage]:
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

    def planned(self, plan: PlanFor) -> tuple[list[Planned], bool]:
        """Creation for the query ids with no set given, then assignment; assignment prompts
        stand in placeholder nuggets for a set not written yet (a creation answer in the cache
        is read: its set is known)."""
        units = plan.units
        known = self.given(plan.queries, plan.run_dir)
        wanted = {q.query_id for q, _ in units}
        out, sets = self._creation_planned(plan.queries, wanted, known, plan.cache)
        stand_in = tuple(
            Nugget(id=f"n{i}", text=_PLACEHOLDER) for i in range(1, self.section.max_nuggets + 1)
        )
        for q, repeat in units:
            if q.passages:
                nuggets = sets[q.query_id].nuggets if q.query_id in sets else stand_in
                for batch in self.assigner.groups(q, nuggets):
                    # An entry per passage with a nugget id or two: about 12 tokens.
                    request = self.assigner.request(q, batch, nuggets)
                    out.append(("support", request, repeat, 8 + 12 * len(batch)))
        stood_in = any(q.query_id not in sets and q.passages for q, _ in units)
        return out, stood_in

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
        for qid in sorted(wanted - set(known)):
            group = [q for q in queries if q.query_id == qid]
            passages = pool(group, self.section.pool_passages)
            if not passages:
                continue
            pooled = group[0].model_copy(update={"passages": passages, "engine": "pool"})
            request = self.maker.request(pooled)
            # A written nugget takes about 25 tokens, the JSON around them 10.
            out.append(("nuggets", request, 0, 10 + 25 * self.section.max_nuggets))
            answer = cache.get(self.ctx.caller.key(request, 0), Completion)
            try:
                nuggets = parse_nuggets(answer, self.section.max_nuggets) if answer else None
            except ParseError:
                nuggets = None
            if nuggets:
                sets[qid] = NuggetSet(query_id=qid, query=pooled.query, nuggets=nuggets)
        return out, sets


class CredibilityDimension(Dimension):
    """``[credibility]``: each passage's source graded low / medium / high with a reason."""

    name = "credibility"
    field = "credibility"
    section_type = CredibilitySection
    default_metrics = CredibilitySection.DEFAULT

    def __init__(self, section: Any, ctx: AskContext, template_dir: Path | None) -> None:
        super().__init__(section, ctx, template_dir)
        name = f"credibility.pointwise.{ctx.language}"
        template = load_template(name, template_dir=template_dir, mark=ctx.mark)
        self.asker = CredibilityAsker(ctx, template)

    @staticmethod
    def statuses(result: Any) -> Iterable[AspectStatus]:
        return [c.status for c in result or ()]

    async def judge(self, query: Query, repeat: int) -> tuple[tuple[Credibility, ...], Usage]:
        return await self.asker.grades(query, repeat)

    def planned(self, plan: PlanFor) -> tuple[list[Planned], bool]:
        answer = self.asker.answer_tokens
        out = [
            ("credibility", r, repeat, answer)
            for q, repeat in plan.units
            for r in self.asker.requests(q)
        ]
        return out, False


# Every dimension judge knows, in the order a unit asks them and a dry run lists them.
DIMENSIONS: tuple[type[Dimension], ...] = (NuggetsDimension, CredibilityDimension)


@dataclass(frozen=True)
class UnitAspects:
    """What one unit's dimensions gave: each result by the JudgedQuery field it fills, and the
    tokens they took (nugget creation's are the run's, not a unit's: it serves every engine)."""

    results: dict[str, Any]
    usage: Usage


def _section(kind: type[Dimension], given: object) -> NuggetsSection | CredibilitySection:
    """The table ``given`` for dimension ``kind``, read as :meth:`Dimensions.of` says."""
    if isinstance(given, kind.section_type):
        return given
    if given is None or isinstance(given, bool):
        return kind.section_type(enabled=bool(given))
    if isinstance(given, Mapping):
        try:
            return kind.section_type.model_validate({"enabled": True, **given})
        except ValidationError as exc:
            said = "; ".join(
                f"{kind.name}.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()
            )
            raise ConfigError(f"Judge: {said}") from None
    raise ConfigError(
        f"Judge: {kind.name}: expected True, False, a dict of [{kind.name}] settings or a "
        f"{kind.section_type.__name__}, got {type(given).__name__}"
    )


class Dimensions:
    """The dimensions turned on for one Judge; build with :meth:`of` (None when all are off)."""

    def __init__(self, dims: Sequence[Dimension]) -> None:
        self.on = tuple(dims)
        self.by_name = {d.name: d for d in self.on}

    @classmethod
    def of(
        cls, sections: Mapping[str, Any], ctx: AskContext, template_dir: str | Path | None
    ) -> Dimensions | None:
        """The dimensions whose table in ``sections`` (by name) is enabled, asked with ``ctx``;
        None when none is on. A table is its section record, a bool (``True``: the default
        settings), None (off), or a dict of the section's fields (on unless ``enabled`` says
        otherwise); anything else, or a field the section lacks, is a ConfigError."""
        tdir = Path(template_dir) if template_dir else None
        dims = []
        for kind in DIMENSIONS:
            section = _section(kind, sections.get(kind.name))
            if section.enabled:
                dims.append(kind(section, ctx, tdir))
        return cls(dims) if dims else None

    @property
    def nuggets(self) -> NuggetsDimension | None:
        found = self.by_name.get(NuggetsDimension.name)
        return found if isinstance(found, NuggetsDimension) else None

    def metric_policy(self, policy: MetricPolicy) -> MetricPolicy:
        """``policy`` with each dimension's default metrics added when it names none of its own."""
        names = with_dimension_defaults(policy.names, (d.default_metrics for d in self.on))
        return policy.model_copy(update={"names": names})

    def load(self, queries: Sequence[Query], run_dir: Path | None) -> None:
        for dim in self.on:
            dim.load(queries, run_dir)

    async def prepare(self, queries: Sequence[Query], run_dir: Path | None = None) -> None:
        for dim in self.on:
            await dim.prepare(queries, run_dir)

    async def judge(self, query: Query, repeat: int) -> UnitAspects:
        """``query``'s results for repeat ``repeat``, the dimensions asked together. Asked
        after its verdicts, not beside them: a run keeps many units in flight, so the caller's
        concurrency limit, not one unit's wait, sets the pace."""
        got = await asyncio.gather(*(d.judge(query, repeat) for d in self.on))
        usage = sum((u for _, u in got), Usage())
        return UnitAspects({d.field: r for d, (r, _) in zip(self.on, got, strict=True)}, usage)

    def planned(self, plan: PlanFor) -> tuple[list[Planned], bool]:
        """Every dimension's requests for ``plan``, and whether some are estimates."""
        out: list[Planned] = []
        estimated = False
        for dim in self.on:
            planned, stood_in = dim.planned(plan)
            out += planned
            estimated = estimated or stood_in
        return out, estimated


def unit_statuses_of(jq: JudgedQuery) -> frozenset[str]:
    """How a unit's answers ended: its verdicts' and every dimension's statuses (a resumed run
    judges a unit with an ``error`` among them again)."""
    out: set[str] = {v.status for v in jq.verdicts}
    for kind in DIMENSIONS:
        out.update(kind.statuses(getattr(jq, kind.field)))
    return frozenset(out)
