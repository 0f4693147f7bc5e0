"""One query's passages -> verdicts -> label-free metrics (the per-query Python API).

Async core (:meth:`Judge.ajudge`), one sync wrapper at the edge (:meth:`Judge.judge`, which
runs the core on an event loop the Judge owns, so its HTTP clients survive between calls).
How verdicts are asked for (pointwise, listwise, re-asks) lives in :mod:`judge.asking`.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from judge.asking import Asker
from judge.cache import Cache
from judge.calls import Caller, Limits
from judge.config import DEFAULT_PARAMS, RunConfig
from judge.errors import ConfigError
from judge.metrics import DEFAULT_METRICS, metrics_for_queries
from judge.prompts import PromptTemplate, json_schema_for, load_template, template_name
from judge.providers import make_chat_provider, make_rerank_provider, resolve_spec
from judge.providers.base import (
    ChatProvider,
    ChatRequest,
    ProviderSpec,
    RerankProvider,
    RerankRequest,
    SamplingParams,
)
from judge.schema import BUILTIN_SCALES, JudgedQuery, Passage, Query, Scale, Usage, Verdict

T = TypeVar("T")
PassageLike = Passage | str | Mapping[str, Any]
_AGGREGATES: dict[str, Callable[[list[float]], float]] = {
    "max": max,
    "mean": statistics.fmean,
    "median": statistics.median,
}


def as_passages(passages: Sequence[PassageLike]) -> tuple[Passage, ...]:
    """Accept plain strings (ids "1".."n"), dicts or Passage records."""
    out: list[Passage] = []
    for i, item in enumerate(passages, start=1):
        if isinstance(item, Passage):
            out.append(item)
        elif isinstance(item, str):
            out.append(Passage(id=str(i), text=item))
        else:
            data = dict(item)
            data.setdefault("id", str(i))
            data["id"] = str(data["id"])
            out.append(Passage.model_validate(data))
    ids = [p.id for p in out]
    if len(set(ids)) != len(ids):
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        raise ConfigError(f"duplicate passage ids: {dupes}")
    return tuple(out)


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
        metrics: Sequence[str] = DEFAULT_METRICS,
        rerank: str | ProviderSpec | RerankProvider | None = None,
        rerank_model: str | None = None,
        cache: str | Path | Cache | None = None,
        limits: Limits | None = None,
        verdict_first: bool = False,
        max_reason_words: int = 30,
        reask: bool = True,
        gain: Literal["linear", "exponential"] = "linear",
        unjudged: Literal["undefined", "skip"] = "undefined",
        undefined_ap: Literal["nan", "zero"] = "nan",
        **provider_overrides: Any,
    ) -> None:
        if isinstance(scale, str):
            if scale not in BUILTIN_SCALES:
                raise ConfigError(f"scale '{scale}' is not one of {sorted(BUILTIN_SCALES)}")
            scale = BUILTIN_SCALES[scale]()
        self.scale = scale
        self.model = model
        self.mode = mode
        self.metric_names = tuple(metrics)
        self.gain = gain
        self.unjudged = unjudged
        self.undefined_ap = undefined_ap
        name = template or template_name(
            scale.name if scale.name in BUILTIN_SCALES else "graded", mode, language
        )
        tdir = Path(template_dir) if template_dir else None
        self.template: PromptTemplate = load_template(name, template_dir=tdir)
        # Listwise falls back to pointwise for passages the list answer never covered.
        pointwise_template = self.template
        if self.template.mode == "listwise":
            pointwise_template = load_template(
                name.replace(".listwise.", ".pointwise."), template_dir=tdir
            )
        chat = self._chat_provider(provider, provider_overrides)
        self.params = params or DEFAULT_PARAMS
        if self.params.response_format == "json_schema" and self.params.json_schema is None:
            schema = json_schema_for(scale, mode, verdict_first=verdict_first)
            self.params = self.params.model_copy(update={"json_schema": schema})
        reranker: RerankProvider | None = None
        if rerank is not None:
            if rerank_model is None:
                raise ConfigError("rerank_model is required with a rerank provider")
            if isinstance(rerank, str | ProviderSpec):
                rspec = rerank if isinstance(rerank, ProviderSpec) else resolve_spec(rerank, {})
                reranker = make_rerank_provider(rspec)
            else:
                reranker = rerank
        self.rerank_model = rerank_model
        if isinstance(cache, str | Path):
            cache = Cache(cache)
        self._cache = cache
        self._limits = limits or Limits()
        self._chat = chat
        self._reranker = reranker
        self._caller: Caller | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.asker = Asker(
            caller=lambda: self.caller,
            model=model,
            params=self.params,
            scale=scale,
            mode=mode,
            template=self.template,
            pointwise_template=pointwise_template,
            language=language,
            verdict_first=verdict_first,
            max_reason_words=max_reason_words,
            reask=reask,
        )

    def first_requests(self, query: Query) -> list[ChatRequest]:
        """The first-round requests a query needs, exactly as they would be sent."""
        return self.asker.first_requests(query)

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
            metrics=config.metrics.names,
            rerank=rerank_spec,
            rerank_model=config.rerank.model if config.rerank else None,
            cache=cache if cache is not None else Cache(None),
            limits=limits,
            verdict_first=j.verdict_first,
            max_reason_words=j.max_reason_words,
            reask=j.reask,
            gain=config.metrics.gain,
            unjudged=config.metrics.unjudged,
            undefined_ap=config.metrics.undefined_ap,
        )

    @property
    def caller(self) -> Caller:
        """The call layer (created on first use, inside the running event loop)."""
        if self._caller is None:
            self._caller = Caller(
                self._chat, rerank=self._reranker, cache=self._cache, limits=self._limits
            )
        return self._caller

    # ---- async core -------------------------------------------------------------------

    async def ajudge(
        self,
        query: str | Query,
        passages: Sequence[PassageLike] | None = None,
        *,
        repeat: int = 0,
    ) -> JudgedQuery:
        """Judge every passage of ``query`` (a Query, or a query text plus ``passages``)."""
        if isinstance(query, str):
            query = Query(query_id="q", query=query, passages=as_passages(passages or ()))
        elif passages is not None:
            query = query.model_copy(update={"passages": as_passages(passages)})
        verdicts = await self.asker.verdicts(query, repeat)
        rerank_scores = None
        if self._reranker is not None and query.passages:
            rerank_scores = await self._rerank_scores(query, repeat)
        return self.finish(query, repeat, verdicts, rerank_scores)

    def finish(
        self,
        query: Query,
        repeat: int,
        verdicts: Sequence[Verdict],
        rerank_scores: dict[str, float] | None = None,
    ) -> JudgedQuery:
        """Attach metrics to a query's verdicts (rerank_* from reranker scores when given)."""
        scored = verdicts
        if rerank_scores is not None:
            scored = [
                v.model_copy(update={"probability": rerank_scores.get(v.passage_id)})
                for v in verdicts
            ]
        metrics = metrics_for_queries(
            self.metric_names,
            [(query, scored)],
            self.scale,
            gain=self.gain,
            unjudged=self.unjudged,
            undefined_ap=self.undefined_ap,
        )[0]
        usage = Usage()
        for v in verdicts:
            usage = usage + v.usage
        return JudgedQuery(
            query=query,
            repeat=repeat,
            scale=self.scale.name,
            verdicts=tuple(verdicts),
            metrics=metrics,
            usage=usage,
            rerank_scores=rerank_scores,
        )

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
        if isinstance(query, str):
            query = Query(query_id="q", query=query, passages=as_passages(passages or ()))
        elif passages is not None:
            query = query.model_copy(update={"passages": as_passages(passages)})
        if self._reranker is not None:
            scores = list((await self._rerank_scores(query, 0)).values())
        else:
            jq = await self.ajudge(query)
            scores = [v.probability for v in jq.verdicts if v.probability is not None]
        return float(_AGGREGATES[agg](scores)) if scores else None

    async def _rerank_scores(self, query: Query, repeat: int) -> dict[str, float]:
        assert self.rerank_model is not None
        request = RerankRequest(
            model=self.rerank_model,
            query=query.query,
            documents=tuple(p.text for p in query.passages),
            top_n=len(query.passages),
        )
        result = await self.caller.rerank(request, repeat)
        return {p.id: s for p, s in zip(query.passages, result.answer.scores, strict=True)}

    # ---- sync edge --------------------------------------------------------------------

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise RuntimeError("Judge.judge() cannot run inside an event loop; use ajudge()")
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coro)

    def judge(
        self, query: str | Query, passages: Sequence[PassageLike] | None = None, *, repeat: int = 0
    ) -> JudgedQuery:
        """Sync wrapper of :meth:`ajudge`."""
        return self._run(self.ajudge(query, passages, repeat=repeat))

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
        await self._chat.aclose()
        if self._reranker is not None:
            await self._reranker.aclose()

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.run_until_complete(self.aclose())
            self._loop.close()
        if self._cache is not None:
            self._cache.close()

    def __enter__(self) -> Judge:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
