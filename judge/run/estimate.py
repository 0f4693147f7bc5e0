"""``judge run --dry-run``: how many calls, tokens and dollars a run would take, without calling.

Prompts are rendered exactly as the run would render them; their tokens are counted with the
offline cl100k tokenizer (an estimate for non-OpenAI models). Completion tokens are estimated
from the requested reason length, capped by ``max_tokens``. Calls already in the cache, and
units already in the run directory, are not counted as to-pay; a passage several engines
returned is counted once per repeat, as the run asks it once. Re-asks and retries are not
foreseen, so the figures are a floor for a judge that answers badly.

A judge cascade (``[judge.cascade]``) sends the LLM only the passages in its band. Which those
are is known when the reranker's answers are in the cache (a dry run never calls the reranker,
even the free embedded one): then the LLM figures count exactly those passages. Otherwise every
passage whose score is unknown is counted as going to the LLM, and the estimate says it is an
upper bound. A band from the run's scores (quantiles, max_error) needs every query's scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from judge.calling.cache import Cache, open_cache
from judge.calling.caller import Prompt
from judge.config import RunConfig
from judge.data.results import RESULTS_FILE
from judge.judging.cascade import fit_band, rerank_request
from judge.judging.context import count_tokens
from judge.judging.judge import Judge
from judge.providers import planning_only
from judge.providers.base import RerankResult, request_key
from judge.run.resume import finished_units
from judge.schema import Query, Record, Usage

# Per query with passages: its first-round LLM prompts and how many passages they judge.
Plan = list[tuple[Query, list[Prompt], int]]


class Estimate(Record):
    units: int  # (query, engine, repeat) still to judge
    calls: int  # provider calls those need (before any re-asks or retries)
    cached_calls: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None  # None when the config has no price for the model
    tokens_per_passage: float
    # A judge cascade: its rerank requests (one per query, whatever the repeats), those already
    # cached, the passages the reranker labels (per repeat, as far as known), and whether the
    # LLM figures are an upper bound (scores not cached: those passages counted as the LLM's).
    rerank_calls: int = 0
    rerank_cached: int = 0
    reranker_passages: int = 0
    upper_bound: bool = False


def estimate(config: RunConfig, queries: Sequence[Query], out_dir: Path) -> Estimate:
    done = finished_units(out_dir / RESULTS_FILE)
    cache_file = config.cache_path()
    cache_db = open_cache(cache_file if cache_file.exists() else None)
    with planning_only():
        judge = Judge.from_config(config)
    answer_tokens = min(
        config.judge.params.max_tokens or 512, 16 + 2 * config.judge.max_reason_words
    )
    units = calls = cached = prompt = completion = passages = decided = 0
    seen: set[str] = set()
    listwise = config.judge.mode == "listwise"
    # Rendered once per query; only the repeat index (part of the key) differs per repeat.
    plan, cascade = _plan(judge, config, queries, cache_db)
    for repeat in range(config.run.repeats):
        for q, prompts, n_llm in plan:
            if (q.query_id, q.engine, repeat) in done:
                continue
            units += 1
            passages += len(q.passages)
            decided += len(q.passages) - n_llm
            per_call_answer = answer_tokens * (n_llm if listwise else 1)
            for ask in prompts:
                key = judge.caller.key(ask, repeat)
                if key in seen:  # the same passage from another engine: asked once
                    continue
                seen.add(key)
                calls += 1
                # As the run looks it up: by its digest, else by the rendered request.
                if cache_db.contains(key, alias=True) or cache_db.contains(
                    judge.caller.key(ask.request, repeat)
                ):
                    cached += 1
                    continue
                prompt += count_tokens(ask.request.messages)
                completion += per_call_answer
    cache_db.close()
    price = config.price()
    usage = Usage(prompt_tokens=prompt, completion_tokens=completion)
    cost = price.cost(usage) if price is not None else None
    return Estimate(
        units=units,
        calls=calls,
        cached_calls=cached,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cost_usd=cost,
        tokens_per_passage=(prompt + completion) / passages if passages else 0.0,
        reranker_passages=decided,
        **cascade,
    )


def _plan(
    judge: Judge, config: RunConfig, queries: Sequence[Query], cache: Cache
) -> tuple[Plan, dict[str, int | bool]]:
    """Each query's first LLM requests, and the cascade's rerank counts and upper-bound flag."""
    with_passages = [judge.fit(q) for q in queries if q.passages]
    if judge.cascade is None or judge.caller.reranker is None:
        return [(q, judge.asker.first_prompts(q), len(q.passages)) for q in with_passages], {}
    identity, model = judge.caller.reranker.identity, judge.cascade.model
    scores: dict[int, dict[str, float]] = {}
    for i, q in enumerate(with_passages):
        got = cache.get(request_key(identity, rerank_request(model, q), 0), RerankResult)
        if got is not None and len(got.scores) == len(q.passages):
            scores[i] = dict(zip((p.id for p in q.passages), got.scores, strict=True))
    band = judge.cascade.band
    if band is None and len(scores) == len(with_passages):
        scored = [(q, scores[i]) for i, q in enumerate(with_passages)]
        band = fit_band(judge.cascade.section, scored, config.label_scale())
    plan: Plan = []
    for i, q in enumerate(with_passages):
        if band is not None and i in scores:
            inside = tuple(p for p in q.passages if band.side(scores[i][p.id]) == "band")
            q_llm = q.model_copy(update={"passages": inside})
        else:
            q_llm = q
        prompts = judge.asker.first_prompts(q_llm) if q_llm.passages else []
        plan.append((q, prompts, len(q_llm.passages)))
    counts = {
        "rerank_calls": len(with_passages),
        "rerank_cached": len(scores),
        "upper_bound": band is None or len(scores) < len(with_passages),
    }
    return plan, counts
