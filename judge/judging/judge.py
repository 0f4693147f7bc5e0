"""One query's passages -> verdicts -> label-free metrics (the per-query Python API).

Async core (:meth:`Judge.ajudge`), one sync wrapper at the edge (:meth:`Judge.judge`, which
runs the core on an event loop the Judge owns, so its HTTP clients survive between calls;
see judging/sync.py), for one query or many (judging/many.py). How verdicts are asked for
(pointwise, listwise, re-asks) lives in :mod:`judge.judging.asker`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from judge.calling.cache import Cache, open_cache
from judge.calling.caller import Caller
from judge.calling.limits import Limits
from judge.config import DEFAULT_PARAMS, CascadeSection, RunConfig
from judge.errors import ConfigError
from judge.judging.asker import Asker
from judge.judging.cascade import Band, Cascade, rerank_scores
from judge.judging.context import (
    DEFAULT_ANSWER_TOKENS,
    EMBEDDED_CONTEXT,
    fit_to_context,
    preset_context,
)
from judge.judging.dimensions import Aspects, Dimensions, aspect_fields, with_aspects
from judge.judging.many import PassageLike, QueryRow, as_passages, as_query, judge_many
from judge.judging.memo import VerdictMemo
from judge.judging.prompts import AnswerShape, template_name, template_pair, with_schema
from judge.judging.sanitise import sanitise_query
from judge.judging.sync import OwnLoop
from judge.judging.tables import Judgements
from judge.metrics.compute import metrics_for_queries
from judge.providers import make_chat_provider, rerank_provider, resolve_spec
from judge.providers.base import ChatProvider, ChatRequest, ProviderSpec, RerankProvider
from judge.schema import (
    BUILTIN_SCALES,
    JudgedQuery,
    MetricPolicy,
    Query,
    SamplingParams,
    Scale,
    Verdict,
)
from judge.sections import CredibilitySection, NuggetsSection

__all__ = ["EMBEDDED_CONTEXT", "Judge", "Judged", "PassageLike", "as_passages"]

T = TypeVar("T")
# One query's judging before its metrics: (query, repeat, verdicts, reranker scores, coverage
# and credibility: judging/dimensions.py).
Judged = tuple[Query, int, Sequence[Verdict], dict[str, float] | None, Aspects | None]
_AGGREGATES: dict[str, Callable[[list[float]], float]] = {
    "max": max,
    "mean": statistics.fmean,
    "median": statistics.median,
}


def _implied_schema(params: SamplingParams) -> bool:
    """Whether the answer schema is the one the scale implies (asked for, none given)."""
    return params.response_format == "json_schema" and params.json_schema is None


class Judge:
    """Judge passages for a query with an LLM.

    >>> j = Judge(provider="local", model="qwen2.5", scale="binary")   # doctest: +SKIP
    >>> jq = j.judge("what is rust?", ["Rust is a systems language.", "Bananas are yellow."])
    >>> [v.label for v in jq.verdicts], jq.metrics["ap"]
    """

    def __init__(
        self,
        provider: str | ProviderSpec | ChatProvider = "openai",
        model: str = "gpt-4o-mini",
        *,
        scale: str | Scale = "binary",
        mode: Literal["pointwise", "listwise"] = "pointwise",
        language: Literal["en", "zh"] = "en",
        template: str | None = None,
        template_dir: str | Path | None = None,
        params: SamplingParams | None = None,
        metrics: Sequence[str] | MetricPolicy = MetricPolicy(),
        rerank: str | ProviderSpec | RerankProvider | None = None,
        rerank_model: str | None = None,
        cache: str | Path | Cache | None = None,
        limits: Limits | None = None,
        verdict_first: bool = False,
        max_reason_words: int = 30,
        reasons: bool = True,
        reask: bool = True,
        context_tokens: int | None = None,
        sanitise: bool = True,
        cascade: CascadeSection | None = None,
        nuggets: NuggetsSection | bool = False,
        credibility: CredibilitySection | bool = False,
        **provider_overrides: Any,
    ) -> None:
        """``metrics``: names or a whole :class:`MetricPolicy`; ``cache``: a path or a Cache
        (None: none); ``context_tokens``: the model's window (None: not enforced); ``sanitise``:
        take text aimed at the judge out of passages first (judging/sanitise.py); ``cascade``:
        judging/cascade.py; ``nuggets``, ``credibility``: judging/dimensions.py. Other keyword
        arguments override the preset (``base_url``).
        Long because it wires every keyword into its part."""
        scale = Scale.named(scale) if isinstance(scale, str) else scale
        self.scale, self.model, self.mode, self.context_tokens = scale, model, mode, context_tokens
        self.sanitise = sanitise
        if not isinstance(metrics, MetricPolicy):
            metrics = MetricPolicy(names=tuple(metrics))
        self.policy = metrics
        name = template or template_name(
            scale.name if scale.name in BUILTIN_SCALES else "graded", mode, language
        )
        self.template, pointwise_template = template_pair(name, template_dir)
        chat = self._chat_provider(provider, provider_overrides)
        shape = AnswerShape(verdict_first, max_reason_words, reasons)
        self.params = with_schema(params or DEFAULT_PARAMS, scale, mode, shape)
        # A listwise judge's pointwise fallback needs the pointwise answer schema.
        pointwise_params = with_schema(params or DEFAULT_PARAMS, scale, "pointwise", shape)
        reranker = rerank_provider(rerank, rerank_model)
        cache = open_cache(cache) if isinstance(cache, str | Path) else cache
        self._cache, self._chat, self._reranker = cache, chat, reranker
        self.rerank_model = rerank_model
        self.caller = Caller(chat, rerank=reranker, cache=cache, limits=limits)
        self.cascade = Cascade.of(cascade, scale, self.caller, rerank_model)
        self._loop = OwnLoop()
        self.asker = Asker(
            caller=self.caller,
            model=model,
            params=self.params,
            pointwise_params=pointwise_params,
            scale=scale,
            mode=mode,
            template=self.template,
            pointwise_template=pointwise_template,
            language=language,
            shape=shape,
            reask=reask,
            schema_per_list=mode == "listwise" and _implied_schema(params or DEFAULT_PARAMS),
        )
        self.dimensions = Dimensions.of(nuggets, credibility, self, template_dir)
        self.policy = self.dimensions.metric_policy(metrics) if self.dimensions else metrics
        plain = self.cascade is None and self._reranker is None and self.dimensions is None
        how = repr((sanitise, context_tokens, self.params.max_tokens))
        self.memo = VerdictMemo(self.caller, f"{self.asker.identity()}\x00{how}") if plain else None

    def first_requests(self, query: Query) -> list[ChatRequest]:
        """The first-round requests a query needs, exactly as they would be sent."""
        return self.asker.first_requests(self.fit(query))

    def fit(self, query: Query) -> Query:
        """``query`` as the judge sees it: text aimed at the judge taken out of its passages
        (judging/sanitise.py), and passages cut to the context window (judging/context.py)."""
        if self.sanitise:
            query = sanitise_query(query)
        if self.context_tokens is None:
            return query
        return fit_to_context(
            query,
            context_tokens=self.context_tokens,
            answer_tokens=self.params.max_tokens or DEFAULT_ANSWER_TOKENS,
            listwise=self.mode == "listwise",
            render=self.asker.render,
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
        j = config.judge
        spec = resolve_spec(j.provider, config.provider.overrides())
        rerank_spec = (
            resolve_spec(config.rerank.provider, config.rerank.overrides())
            if config.rerank
            else None
        )
        return cls(
            spec,
            j.model,
            scale=config.scale(),
            mode=j.mode,
            language=j.language,
            template=j.template,
            template_dir=j.template_dir,
            params=j.params,
            metrics=config.metrics,
            rerank=rerank_spec,
            rerank_model=config.rerank.model if config.rerank else None,
            cache=cache,
            limits=limits,
            verdict_first=j.verdict_first,
            max_reason_words=j.max_reason_words,
            reasons=j.reasons,
            reask=j.reask,
            context_tokens=j.context_tokens or preset_context(spec),
            sanitise=j.sanitise,
            cascade=j.cascade,
            nuggets=config.nuggets,
            credibility=config.credibility,
        )

    # ---- async core -------------------------------------------------------------------

    async def ajudge(
        self,
        query: str | Query,
        passages: Sequence[PassageLike] | None = None,
        *,
        repeat: int = 0,
    ) -> JudgedQuery:
        """Judge every passage of ``query`` (a Query, or a query text plus ``passages``)."""
        judged = await self._loop.call(self.averdicts(query, passages, repeat=repeat))
        return self.finish_many([judged])[0]

    async def averdicts(
        self,
        query: str | Query,
        passages: Sequence[PassageLike] | None = None,
        *,
        repeat: int = 0,
    ) -> Judged:
        """:meth:`ajudge` but the metrics, which :meth:`finish_many` attaches to many at once."""
        query = as_query(query, passages)
        if self.memo is not None:  # a plain judge: verdicts alone, read whole when stored
            ask, reread = self.asker.verdicts, self.asker.cached_verdicts
            fitted, found = await self.memo.verdicts(query, repeat, self.fit, ask, reread)
            return (fitted, repeat, found, None, None)
        query = self.fit(query)
        if self.cascade is not None:
            ask = self.asker.verdicts
            routed, scores = await self.cascade.verdicts(query, lambda q: ask(q, repeat))
            return await with_aspects(self.dimensions, (query, repeat, routed, scores))
        verdicts = await self.asker.verdicts(query, repeat)
        rerank_scores = None
        if self._reranker is not None and query.passages:
            rerank_scores = await self._rerank_scores(query, repeat)
        return await with_aspects(self.dimensions, (query, repeat, verdicts, rerank_scores))

    async def ajudge_many(
        self,
        rows: Iterable[QueryRow],
        *,
        repeats: int = 1,
        progress: bool = True,
        label_scale: Scale | None = None,
    ) -> Judgements:
        """Judge dataset rows (dicts in the dataset JSONL shape) or Queries ``repeats`` times
        each, as ``judge run`` does (limits, cache, cascade); see judging/many.py."""
        many = judge_many(self, rows, repeats=repeats, progress=progress, label_scale=label_scale)
        return await self._loop.call(many)

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
            [j[4] for j in judged],
        )
        return [
            JudgedQuery(
                query=query,
                repeat=repeat,
                scale=self.scale.name,
                verdicts=tuple(verdicts),
                metrics=metrics,
                rerank_scores=scores,
                **aspect_fields(aspects, verdicts),
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
        assert self.rerank_model is not None
        return (await rerank_scores(self.caller, self.rerank_model, query, repeat))[0]

    async def afit_cascade(self, queries: Sequence[Query], labels: Scale | None = None) -> Band:
        """The cascade's band from ``queries``' reranker scores (and human labels on ``labels``,
        default the judge's scale): once before judging when it comes from quantiles or labels."""
        return await self._loop.call(self.fit_band(queries, labels))

    async def fit_band(self, queries: Sequence[Query], labels: Scale | None = None) -> Band:
        """:meth:`afit_cascade` on the running loop (a run's own, as for :meth:`averdicts`)."""
        if self.cascade is None:
            raise ConfigError("afit_cascade: this judge has no cascade")
        return await self.cascade.fit([self.fit(q) for q in queries], labels or self.scale)

    # ---- sync edge --------------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the Judge's own event loop (its HTTP clients live there); inside a
        running loop (a Jupyter cell) in a worker thread, see judging/sync.py."""
        return self._loop.run(coro)

    def judge(
        self, query: str | Query, passages: Sequence[PassageLike] | None = None, *, repeat: int = 0
    ) -> JudgedQuery:
        """Sync wrapper of :meth:`ajudge`."""
        return self._run(self.ajudge(query, passages, repeat=repeat))

    def judge_many(
        self,
        rows: Iterable[QueryRow],
        *,
        repeats: int = 1,
        progress: bool = True,
        label_scale: Scale | None = None,
    ) -> Judgements:
        """Sync wrapper of :meth:`ajudge_many` (inside a running loop too, as in Jupyter)."""
        many = self.ajudge_many(rows, repeats=repeats, progress=progress, label_scale=label_scale)
        return self._run(many)

    def fit_cascade(self, queries: Sequence[Query], labels: Scale | None = None) -> Band:
        """Sync wrapper of :meth:`afit_cascade`."""
        return self._run(self.afit_cascade(queries, labels))

    def rerank_relevancy(
        self,
        query: str | Query,
        passages: Sequence[PassageLike] | None = None,
        *,
        agg: Literal["max", "mean", "median"] = "max",
    ) -> float | None:
        """Sync wrapper of :meth:`arerank_relevancy`."""
        return self._run(self.arerank_relevancy(query, passages, agg=agg))

    async def aclose(self) -> None:
        """Close the clients, on the loop they live on (the Judge's own once an async or sync
        method ran); :meth:`close` also stops that loop."""
        await (self._loop.call(self._aclose()) if self._loop.started else self._aclose())

    async def _aclose(self) -> None:
        await self._chat.aclose()
        if self._reranker is not None:
            await self._reranker.aclose()

    def close(self) -> None:
        if self._loop.started:
            self._run(self._aclose())
            self._loop.close()
        if self._cache is not None:
            self._cache.close()

    def __enter__(self) -> Judge:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
