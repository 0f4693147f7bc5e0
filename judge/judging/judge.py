"""One query's passages -> verdicts -> label-free metrics (the per-query Python API), and
many queries at once (:meth:`Judge.judge_many`, through the one unit loop of judging/units.py).

Async core (:meth:`Judge.ajudge`), one sync wrapper at the edge (:meth:`Judge.judge`, which
runs the core on an event loop the Judge owns, so its HTTP clients survive between calls;
see judging/sync.py). A Judge is built from one settings record, the ``[judge]`` table's
:class:`~judge.config.JudgeSection`: ``Judge(settings)``, or ``Judge(provider, model, **knobs)``,
which validates the keywords into that record. How verdicts are asked for (pointwise,
listwise, re-asks) lives in :mod:`judge.judging.relevance`; every question goes through
:func:`judge.judging.ask.ask`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import statistics
import sys
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar

from tqdm import tqdm

from judge.aspects import Aspects
from judge.calling.cache import Cache, open_cache
from judge.calling.caller import Caller
from judge.calling.limits import Limits
from judge.config import CascadeSection, JudgeSection, RunConfig
from judge.errors import BudgetExceeded, ConfigError, InputError, ProviderError
from judge.judging.arguments import as_limits, as_policy, check_kinds, read_knobs, with_window
from judge.judging.ask import AskContext
from judge.judging.cascade import Band, Cascade, rerank_scores
from judge.judging.context import (
    DEFAULT_ANSWER_TOKENS,
    EMBEDDED_CONTEXT,
    fit_to_context,
    preset_context,
)
from judge.judging.dimensions import DIMENSIONS, Dimensions, UnitAspects
from judge.judging.memo import VerdictMemo
from judge.judging.prompts import AnswerShape, template_name, template_pair, with_schema
from judge.judging.relevance import Asker, window_size
from judge.judging.rows import PassageLike, QueryRow, as_passages, as_queries, as_query
from judge.judging.sanitise import AIMED, SANITISED, sanitise_query
from judge.judging.sync import OwnLoop
from judge.judging.tables import Judgements
from judge.judging.units import Judged, judge_units, refusal
from judge.metrics.compute import metrics_for_queries
from judge.providers import (
    ADAPTERS,
    judges_by_score,
    make_chat_provider,
    make_rerank_provider,
    rerank_provider,
    resolve_spec,
)
from judge.providers.base import ChatProvider, ChatRequest, ProviderSpec, RerankProvider
from judge.schema import BUILTIN_SCALES, JudgedQuery, MetricPolicy, Query, Scale, Usage, Verdict
from judge.sections import DEFAULT_PASSAGE_CHARS

__all__ = ["EMBEDDED_CONTEXT", "Judge", "Judged", "PassageLike", "as_passages"]

T = TypeVar("T")
P = ParamSpec("P")
_AGGREGATES: dict[str, Callable[[list[float]], float]] = {
    "max": max,
    "mean": statistics.fmean,
    "median": statistics.median,
}


# The answers that refuse every request alike: no key or a wrong one, no model, no such URL.
_REFUSED = re.compile(r"HTTP (401|403|404)\b")


def _check_labels(queries: Sequence[Query], scale: Scale) -> None:
    """One InputError naming each human label that is not a grade of ``scale`` (the label
    scale), as ``judge run`` refuses them: agreement and label metrics would read them."""
    grades = {lab.grade for lab in scale.labels}
    bad = [
        f"{q.source or q.query_id}: field 'labels.{pid}': {grade} is not a grade of the "
        f"'{scale.name}' scale ({', '.join(map(str, sorted(grades)))})"
        for q in queries
        for pid, grade in (q.labels or {}).items()
        if grade not in grades
    ]
    if bad:
        more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
        raise InputError(f"{bad[0]}{more}; pass label_scale= if the labels use another scale")


def _score_judge(
    provider: object, overrides: Mapping[str, Any], settings: JudgeSection, rerank: object
) -> tuple[RerankProvider, CascadeSection] | None:
    """A judge by score when ``provider`` names a kind that reranks and cannot chat: its
    reranker, and the cascade that labels by its score alone (``[judge.cascade]`` when given,
    else the kind's calibrated cut; the kind's calibrated echo floor unless the section sets
    one: judging/cascade.py). None otherwise."""
    if isinstance(provider, str):
        spec = resolve_spec(provider, overrides)
    elif isinstance(provider, ProviderSpec):
        spec = provider
    else:
        return None
    if not judges_by_score(spec):
        return None
    adapter = ADAPTERS[spec.kind]
    if rerank is not None:
        raise ConfigError(
            f"judge.provider '{settings.provider}' is a reranker, and judges by score itself: "
            "drop [rerank] (or name an LLM as [judge] provider to keep the reranker beside it)"
        )
    cut, section = adapter.score_cut, settings.cascade
    if section is None:
        section = CascadeSection(low=cut, high=cut, echo_floor=adapter.echo_floor)
    elif adapter.echo_floor is not None and "echo_floor" not in section.model_fields_set:
        # Another cut (one judge calibrate fitted): still the floor calibrated for the kind.
        section = section.model_copy(update={"echo_floor": adapter.echo_floor})
    return make_rerank_provider(spec), section


def _flag_aimed(query: Query, verdicts: Sequence[Verdict]) -> Sequence[Verdict]:
    """``verdicts`` with the signal ``aimed`` on those whose passage holds text aimed at the
    judge, and ``sanitised`` on those it was taken out of (judging/sanitise.py); the same
    sequence when there are none."""
    found = {p.id: AIMED if p.aimed else SANITISED for p in query.passages if p.aimed or p.removed}
    if not found:
        return verdicts
    return [
        v.model_copy(update={"signals": (*v.signals, found[v.passage_id])})
        if v.passage_id in found and found[v.passage_id] not in v.signals
        else v
        for v in verdicts
    ]


def _usage(verdicts: Sequence[Verdict], aspects: UnitAspects | None) -> Usage:
    """A unit's tokens: its verdicts' and its dimensions' (summed as numbers: a cached run adds
    up 100,000 of these)."""
    usage = Usage(
        prompt_tokens=sum(v.usage.prompt_tokens for v in verdicts),
        completion_tokens=sum(v.usage.completion_tokens for v in verdicts),
    )
    return usage if aspects is None else usage + aspects.usage


def _sync(
    method: Callable[Concatenate[Judge, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[Judge, P], T]:
    """The sync wrapper of an async Judge method: the same arguments, run on the Judge's own
    event loop (:meth:`Judge._run`)."""

    def run(self: Judge, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(method(self, *args, **kwargs))

    functools.update_wrapper(run, method)  # help() and inspect show the async's arguments
    run.__name__ = method.__name__.removeprefix("a")
    run.__qualname__ = f"Judge.{run.__name__}"
    run.__doc__ = f"Sync wrapper of :meth:`{method.__name__}`: {method.__doc__}"
    return run


class Judge:
    """Judge passages for a query with an LLM.

    >>> j = Judge(provider="local", model="qwen2.5", scale="binary")   # doctest: +SKIP
    >>> jq = j.judge("what is rust?", ["Rust is a systems language.", "Bananas are yellow."])
    >>> [v.label for v in jq.verdicts], jq.metrics["ap"]

    ``Judge.from_config(load_config("judge.toml"))`` is the judge a run config describes, as
    ``judge run`` builds it; the run's cache and limits are passed in, not read:
    ``cache=open_cache(config)`` (judge.calling.cache), ``limits=Limits.from_config(config)``.
    ``with Judge(...) as j:`` closes its connections, cache and event loop when the block
    ends; without ``with``, call ``j.close()``.
    """

    def __init__(
        self,
        provider: str | ProviderSpec | ChatProvider | JudgeSection = "openai",
        model: str | None = None,
        *,
        scale: str | Scale | None = None,
        metrics: str | Sequence[str] | MetricPolicy = MetricPolicy(),
        rerank: str | ProviderSpec | RerankProvider | None = None,
        rerank_model: str | None = None,
        cache: str | Path | Cache | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        **knobs: Any,
    ) -> None:
        """``provider``: a preset name, a ProviderSpec, a ChatProvider, or the whole settings
        record (a ``[judge]`` table); ``scale``: a name or a Scale record (a custom scale);
        ``metrics``: names or a whole :class:`MetricPolicy`; ``cache``: a path or a Cache
        (None: none; every call pays again); ``limits``: a Limits or a dict of its fields.
        ``knobs``: fields of :class:`~judge.config.JudgeSection` (``mode``,
        ``language``, ``params``, ``reask``, ``context_tokens``, ``sanitise``, ``cascade``,
        ...), a dimension's table by name (``nuggets=True``, ``credibility=...``:
        judging/dimensions.py), and overrides of the provider preset (``base_url``)."""
        check_kinds(provider, model, scale, cache)
        settings, sections, overrides = read_knobs(provider, model, scale, knobs)
        named = provider if not isinstance(provider, JudgeSection | str) else settings.provider
        self.settings = settings = with_window(settings, named, overrides)
        self.scale = scale if isinstance(scale, Scale) else Scale.named(settings.scale)
        self.model, self.mode = settings.model, settings.mode
        self.context_tokens, self.sanitise = settings.context_tokens, settings.sanitise
        self.policy = as_policy(metrics)
        self.max_passage_chars = DEFAULT_PASSAGE_CHARS  # longer passages are cut
        limits = as_limits(limits)
        self.closed = False
        scorer = _score_judge(named, overrides, settings, rerank)
        chat: ChatProvider | None
        reranker: RerankProvider | None
        section: CascadeSection | None
        if scorer is not None:  # a reranker as the judge: judging by score, no LLM
            chat, (reranker, section) = None, scorer
            rerank_model = settings.model
        else:
            chat = self._chat_provider(named, overrides)
            reranker, section = rerank_provider(rerank, rerank_model), settings.cascade
        mine = None  # a cache opened here, closed with the Judge
        if isinstance(cache, str | Path):
            cache = mine = open_cache(cache)
        self._cache, self._chat, self._reranker = cache, chat, reranker
        self.rerank_model = rerank_model
        self.caller = Caller(chat, rerank=reranker, cache=cache, limits=limits)
        self.cascade = Cascade.of(section, self.scale, self.caller, rerank_model)
        self._loop = OwnLoop()
        self._release = self._released_when_collected(mine)
        shape = AnswerShape(settings.verdict_first, settings.max_reason_words, settings.reasons)
        self.params = with_schema(settings.params, self.scale, settings.mode, shape)
        self.ctx = AskContext.of(self.caller, settings, self.params)
        self.asker = self._asker(settings, shape)
        self.template = self.asker.template
        self.dimensions = self._dimensions(sections, settings.template_dir, named)
        plain = self.cascade is None and self._reranker is None and self.dimensions is None
        how = repr((self.sanitise, self.context_tokens, self.params.max_tokens))
        self.memo = VerdictMemo(self.caller, f"{self.asker.identity()}\x00{how}") if plain else None

    def _dimensions(
        self, sections: Mapping[str, Any], template_dir: str | None, named: object
    ) -> Dimensions | None:
        """The dimensions ``sections`` switch on (their metrics added to the policy); a judge
        by score has no LLM for them (ConfigError)."""
        found = Dimensions.of(sections, self.ctx, template_dir)
        if found is None:
            return None
        if self.by_score:
            names = " and ".join(d.name for d in found.on)
            raise ConfigError(
                f"Judge: {names}: a judge by score (provider '{named}' is a reranker) has no "
                f"LLM to judge {names} with: name an LLM as provider, or leave {names} out"
            )
        self.policy = found.metric_policy(self.policy)
        return found

    @property
    def by_score(self) -> bool:
        """Whether this judge decides by a reranker's score alone: it has no LLM to ask."""
        return self._chat is None

    def _released_when_collected(self, mine: Cache | None) -> weakref.finalize[Any, Any]:
        """What close() gives back, given back if the Judge is collected without it: the
        loop, the clients, and ``mine``, the cache it opened (see :func:`_release`)."""
        clients = [c for c in (self._chat, self._reranker) if c is not None]
        return weakref.finalize(self, _release, self._loop, clients, mine)

    def _asker(self, settings: JudgeSection, shape: AnswerShape) -> Asker:
        """The relevance asker: the mode's template and params, and the pointwise ones a
        listwise judge falls back to (with the pointwise answer schema)."""
        scale, mode = self.scale, settings.mode
        name = settings.template or template_name(
            scale.name if scale.name in BUILTIN_SCALES else "graded", mode, settings.language
        )
        template, pointwise_template = template_pair(name, settings.template_dir, self.ctx.mark)
        implied = (
            settings.params.response_format == "json_schema" and settings.params.json_schema is None
        )
        return Asker(
            ctx=self.ctx,
            params=self.params,
            pointwise_params=with_schema(settings.params, scale, "pointwise", shape),
            scale=scale,
            mode=mode,
            template=template,
            pointwise_template=pointwise_template,
            shape=shape,
            # The listwise schema the scale implies is made per list (its ids and count).
            schema_per_list=mode == "listwise" and implied,
            list_size=window_size(settings),
        )

    def first_requests(self, query: Query) -> list[ChatRequest]:
        """The first-round requests a query needs, exactly as they would be sent."""
        return self.asker.first_requests(self.fit(query))

    def fit(self, query: Query) -> Query:
        """``query`` as the judge sees it: text aimed at the judge taken out of its passages
        (judging/sanitise.py), and passages cut to the context window (judging/context.py)."""
        if self.sanitise != "off":
            query = sanitise_query(query, cut=self.sanitise == "cut")
        if self.context_tokens is None:
            return query
        return fit_to_context(
            query,
            context_tokens=self.context_tokens,
            answer_tokens=self.params.max_tokens or DEFAULT_ANSWER_TOKENS,
            listwise=self.mode == "listwise",
            render=self.asker.render,
            list_size=self.asker.list_size,
        )

    @staticmethod
    def _chat_provider(
        provider: str | ProviderSpec | ChatProvider, overrides: Mapping[str, Any]
    ) -> ChatProvider:
        if isinstance(provider, str):
            return make_chat_provider(resolve_spec(provider, overrides))
        if isinstance(provider, ProviderSpec):
            return make_chat_provider(provider)
        return provider

    @classmethod
    def from_config(
        cls, config: RunConfig, *, cache: Cache | None = None, limits: Limits | None = None
    ) -> Judge:
        """The judge a run config describes: its ``[judge]`` record as it is (the context
        window filled in from the provider preset when not given), its ``[provider]``,
        ``[rerank]``, ``[metrics]`` and every dimension's table."""
        j = config.judge
        spec = resolve_spec(j.provider, config.provider.overrides())
        rerank_spec = (
            resolve_spec(config.rerank.provider, config.rerank.overrides())
            if config.rerank
            else None
        )
        settings = j.model_copy(update={"context_tokens": j.context_tokens or preset_context(spec)})
        made = cls(
            settings,
            scale=config.scale(),
            metrics=config.metrics,
            rerank=rerank_spec,
            rerank_model=config.rerank.model if config.rerank else None,
            cache=cache,
            limits=limits,
            **{d.name: getattr(config, d.name) for d in DIMENSIONS},
            **config.provider.overrides(),
        )
        made.max_passage_chars = config.dataset.max_passage_chars  # as judge run cuts them
        return made

    # ---- async core -------------------------------------------------------------------

    async def ajudge(
        self,
        query: str | Query,
        passages: Sequence[PassageLike] | None = None,
        *,
        repeat: int = 0,
    ) -> JudgedQuery:
        """Judge every passage of ``query`` (a Query, or a query text plus ``passages``)."""
        self._check_open()
        self.caller.stats.reachable_again()  # a server down before may be up now
        if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 0:
            raise InputError(f"repeat: expected a whole number >= 0, got {repeat!r}")
        answered = self.caller.stats.successes
        whole = as_query(query, passages, max_passage_chars=self.max_passage_chars)
        judged = await self._loop.call(self.averdicts(whole, repeat))
        done = self.finish_many([judged])[0]
        stats, failed = self.caller.stats, [v for v in done.verdicts if v.status == "error"]
        asked = sum(v.source != "empty" for v in done.verdicts)  # a blank passage is not
        # Refused whatever it is asked (a key, a model, a base_url without /v1), not this
        # passage alone (a 400 may be about its text), or never reached (one passage's
        # retries are fewer than make a provider unreachable): an exception, as judge_many
        # raises, whatever the number of passages.
        unreached = stats.successes == answered and stats.unconnected > 0
        refused = all(_REFUSED.match(v.error or "") for v in failed)
        if failed and len(failed) == asked and (stats.unreachable or unreached or refused):
            why = (
                "the provider refuses every request (check the API key, model name and base_url)"
                if refused and not (stats.unreachable or unreached)
                else "the provider cannot be reached"
            )
            raise ProviderError(
                f"no passage could be judged: {why}: {stats.unreachable or failed[0].error}"
            )
        return done

    async def averdicts(self, query: Query, repeat: int = 0) -> Judged:
        """:meth:`ajudge` but the metrics, which :meth:`finish_many` attaches to many at once;
        on the running loop (a run's own)."""
        if self.memo is not None:  # a plain judge: verdicts alone, read whole when stored
            ask, reread = self.asker.verdicts, self.asker.cached_verdicts
            fitted, found = await self.memo.verdicts(query, repeat, self.fit, ask, reread)
            return (fitted, repeat, _flag_aimed(fitted, found), None, None)
        query = self.fit(query)
        if self.cascade is not None:
            ask = self.asker.verdicts
            verdicts, scores = await self.cascade.verdicts(query, lambda q: ask(q, repeat))
        else:
            verdicts, scores = await self.asker.verdicts(query, repeat), None
            if self._reranker is not None and query.passages:
                scores = await self._rerank_scores(query, repeat)
        # Dimensions are asked after the verdicts, not beside them: a run keeps many units in
        # flight, so the caller's concurrency limit, not one unit's wait, sets the pace.
        aspects = await self.dimensions.judge(query, repeat) if self.dimensions else None
        return (query, repeat, _flag_aimed(query, verdicts), scores, aspects)

    async def prepare(
        self, queries: Sequence[Query], labels: Scale | None = None, run_dir: Path | None = None
    ) -> None:
        """What judging ``queries`` needs before its first unit, paid for: a cascade's band from
        their reranker scores (when it comes from quantiles or human ``labels``), then each
        dimension's preparation (nugget sets from every engine's passages pooled, kept in
        ``run_dir`` when given)."""
        if self.cascade is not None and self.cascade.band is None:
            await self.fit_band(queries, labels)
        if self.dimensions is not None:
            await self.dimensions.prepare(queries, run_dir)

    async def ajudge_many(
        self,
        rows: Iterable[QueryRow],
        *,
        repeats: int = 1,
        progress: bool = True,
        label_scale: Scale | str | None = None,
        columns: Mapping[str, str] | None = None,
    ) -> Judgements:
        """Judge dataset rows (dicts in the dataset JSONL shape, judging/rows.py), Queries or a
        pandas DataFrame's rows ``repeats`` times each, as ``judge run`` does (limits, cache,
        cascade, dimensions, through the same unit loop); the rows' order kept, repeats side
        by side. ``columns`` renames the rows' fields to the dataset's, as ``[dataset]
        columns`` does (``{"question": "query", "contexts": "retrieved_texts"}``). A provider
        that refuses every request (bad model name or key) stops it after a few refusals with
        a ProviderError. Progress is a tqdm bar on stderr: plain text, which a terminal and a
        Jupyter cell both show as one updating line."""
        self._check_open()
        self.caller.stats.reachable_again()  # a server down before may be up now
        if isinstance(label_scale, str):  # a built-in scale by name, as Judge(scale=) takes
            label_scale = Scale.named(label_scale)
        elif label_scale is not None and not isinstance(label_scale, Scale):
            raise ConfigError(f"label_scale: expected a Scale or its name, got {label_scale!r}")
        work = self._judge_many(rows, repeats, progress, label_scale, columns)
        try:
            return await self._loop.call(work)
        except BudgetExceeded:  # said with what was spent in the end (answers in flight settled)
            caller = self.caller
            said = caller.budget.spent_message(caller.stats.worst_counted)
            if self._cache is None or not self._cache.enabled:  # nothing of it would resume
                said = said.replace(
                    "; rerun with a larger budget to resume",
                    "; this Judge has no cache, so what was judged is not kept: give it "
                    "cache= (a path) and a larger budget, and a rerun pays only for the rest",
                )
            raise BudgetExceeded(said) from None

    async def _judge_many(
        self,
        rows: Iterable[QueryRow],
        repeats: int,
        progress: bool,
        labels: Scale | None,
        columns: Mapping[str, str] | None = None,
    ) -> Judgements:
        """The unit loop with a tqdm bar; long because the bar, its per-verdict counter and
        the refusal stop share the loop's state."""
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            raise ConfigError(f"repeats: expected a whole number >= 1, got {repeats!r}")
        queries = as_queries(rows, columns=columns, max_passage_chars=self.max_passage_chars)
        _check_labels(queries, labels or self.scale)
        units = [(q, r) for q in queries for r in range(repeats)]
        if units:
            await self.prepare(queries, labels)
        out: list[Judged | None] = [None] * len(units)
        stats, counts = self.caller.stats, {"passages": 0, "errors": 0}
        seen = [0] * len(units)  # passages of each unit the bar counted as their verdicts came
        bar = tqdm(
            total=sum(len(q.passages) for q, _ in units),
            desc="judging",
            unit="passage",
            file=sys.stderr,
            disable=not progress,
            dynamic_ncols=True,
        )

        def counted(index: int, verdict: Verdict) -> None:
            """A verdict made inside a unit: the bar moves before the unit ends."""
            if seen[index] < len(units[index][0].passages):
                seen[index] += 1
                bar.update(1)

        async def judged_one(index: int, judged: Judged) -> None:
            out[index] = judged
            counts["passages"] += len(judged[2])
            counts["errors"] += sum(v.status != "ok" for v in judged[2])
            bar.set_postfix_str(
                f"passages {counts['passages']}, cached {stats.cache_hits}, "
                f"failed {counts['errors']}",
                refresh=False,
            )
            bar.update(len(judged[2]) - seen[index])
            if (why := refusal(stats, judged[2])) is not None:
                raise ProviderError(why, kind="unreachable" if stats.unreachable else "client")

        try:
            await judge_units(
                units,
                self.averdicts,
                judged_one,
                workers=self.caller.limits.concurrency * 2,
                on_verdict=counted,
            )
        finally:
            bar.close()
        judged = [j for j in out if j is not None]
        verdicts = [v for j in judged for v in j[2]]
        if verdicts and all(v.status == "error" for v in verdicts):
            # Nothing to return but failures: say so, rather than a table of errors.
            kinds = stats.errors
            kind = max(kinds, key=lambda k: kinds[k]) if kinds else "error"
            raise ProviderError(
                f"every one of {len(verdicts)} verdicts ended in a provider error, mostly "
                f"{kind}; for example: {verdicts[0].error}",
                kind=kind,
            )
        return Judgements(self.finish_many(judged), policy=self.policy, scale=self.scale)

    def finish_many(self, judged: Sequence[Judged]) -> list[JudgedQuery]:
        """Attach metrics to each query's verdicts, in one vectorised pass (per query, its fixed
        cost is most of a cached run's): rerank_* from the reranker's scores when given,
        everything else (soft metrics, a relevance threshold) from the judge's own."""
        values = metrics_for_queries(
            self.policy.names,
            [(query, verdicts) for query, _, verdicts, *_ in judged],
            self.scale,
            self.policy,
            [j[3] for j in judged],
            [None if j[4] is None else Aspects(**j[4].results) for j in judged],
        )
        return [
            JudgedQuery(
                query=query,
                repeat=repeat,
                scale=self.scale.name,
                verdicts=tuple(verdicts),
                metrics=metrics,
                rerank_scores=scores,
                usage=_usage(verdicts, aspects),
                **(aspects.results if aspects is not None else {}),
            )
            for (query, repeat, verdicts, scores, aspects), metrics in zip(
                judged, values, strict=True
            )
        ]

    async def arerank_relevancy(
        self,
        query: str | Query,
        passages: Sequence[PassageLike] | None = None,
        *,
        agg: Literal["max", "mean", "median"] = "max",
    ) -> float | None:
        """Cohere-style rerank relevancy: per-passage scores in [0, 1], aggregated.

        Scores come from the rerank provider when one is configured, else from the judge's
        own probability of relevance (which needs logprobs). None when no score is known.
        """
        if agg not in _AGGREGATES:
            raise ConfigError(f"agg must be one of {sorted(_AGGREGATES)}")
        query = as_query(query, passages)
        if self._reranker is not None:
            scores = list((await self._loop.call(self._rerank_scores(query, 0))).values())
        else:
            jq = await self.ajudge(query)
            scores = [v.probability for v in jq.verdicts if v.probability is not None]
        return float(_AGGREGATES[agg](scores)) if scores else None

    async def _rerank_scores(self, query: Query, repeat: int) -> dict[str, float]:
        """The side reranker's scores (``rerank_*``): scored once, whatever the repeat (a
        reranker is deterministic; each repeat had paid for the same scores again)."""
        assert self.rerank_model is not None
        return (await rerank_scores(self.caller, self.rerank_model, query, 0))[0]

    async def afit_cascade(self, queries: Sequence[Query], labels: Scale | None = None) -> Band:
        """The cascade's band from ``queries``' reranker scores (and human labels on ``labels``,
        default the judge's scale): once before judging when it comes from quantiles or labels."""
        return await self._loop.call(self.fit_band(queries, labels))

    async def fit_band(self, queries: Sequence[Query], labels: Scale | None = None) -> Band:
        """:meth:`afit_cascade` on the running loop (a run's own, as for :meth:`averdicts`)."""
        self._check_open()
        if self.cascade is None:
            raise ConfigError("afit_cascade: this judge has no cascade")
        return await self.cascade.fit([self.fit(q) for q in queries], labels or self.scale)

    # ---- sync edge --------------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the Judge's own event loop (its HTTP clients live there); inside a
        running loop (a Jupyter cell) in a worker thread, see judging/sync.py. A closed Judge
        refuses first: its loop is not started again (its thread would outlive it)."""
        if self.closed:
            coro.close()
            self._check_open()
        return self._loop.run(coro)

    # Sync wrappers of the async core (inside a running loop too, as in Jupyter).
    judge = _sync(ajudge)
    judge_many = _sync(ajudge_many)
    fit_cascade = _sync(afit_cascade)
    rerank_relevancy = _sync(arerank_relevancy)

    async def aclose(self) -> None:
        """What :meth:`close` does, awaited: the clients closed on the loop they live on (the
        Judge's own once an async or sync method ran), then that loop's thread stopped and the
        cache closed, off the caller's loop (aclose had left both open)."""
        self.closed = True
        own = self._loop.started
        await (self._loop.call(self._aclose()) if own else self._aclose())
        if own and self._loop.on_it():  # called from the Judge's own loop: close() stops it
            return
        self._release.detach()
        await asyncio.to_thread(self._stop)

    def _stop(self) -> None:
        """Stop the Judge's loop and close its cache (the clients are closed already)."""
        if self._loop.started:
            self._loop.close()
        if self._cache is not None:
            self._cache.close()

    async def _aclose(self) -> None:
        if self._chat is not None:
            await self._chat.aclose()
        if self._reranker is not None:
            await self._reranker.aclose()

    def _check_open(self) -> None:
        if self.closed:  # its cache is closed: answers would be paid for and not kept
            raise ConfigError(
                "this Judge is closed (close() was called, or its `with` block ended): make a "
                "new one"
            )

    def close(self) -> None:
        """Close the clients, stop the Judge's loop and close its cache."""
        self.closed = True
        self._release.detach()  # done here, not again when it is collected
        if self._loop.started:
            self._loop.run(self._aclose())
        self._stop()

    def __enter__(self) -> Judge:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Judge:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()


def _release(loop: OwnLoop, clients: list[Any], cache: Cache | None) -> None:
    """What :meth:`Judge.close` does, for a Judge collected without it (a notebook cell run
    again: 30 such kept 60 threads and 150 files): ``cache`` when the Judge opened it. In a
    thread of its own, since the collector may run on any thread, the loop's own included
    (whose waiting on itself would never end)."""

    def release() -> None:
        with contextlib.suppress(Exception):  # a finaliser: nothing to tell, nowhere to raise
            if loop.started:
                loop.run(_close_all(clients))
                loop.close()
        if cache is not None:
            with contextlib.suppress(Exception):
                cache.close()

    threading.Thread(target=release, name="judge-release", daemon=True).start()


async def _close_all(clients: list[Any]) -> None:
    for client in clients:
        await client.aclose()
