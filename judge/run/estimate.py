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

Hedging (``[run] hedge_share``, judge/calling/limits.py) may send a second request for a slow
one: at most that share of the requests sent, each paid. ``hedge_calls`` is that bound for the
calls to pay (none for a model on this machine or a batch), and ``worst_cost_usd`` holds them.

The cost through the provider's Batch API (``--batch``) is given too, at ``Price.batch()``, with
the worst case a batch's budget must hold before it is submitted (judge/calling/batch.py).

Coverage and credibility (``[nuggets]``, ``[credibility]``) add their requests, rendered as the
run renders them and counted in the totals and in ``aspect_calls`` by kind: a nugget set per
query id not given (``[nuggets] path`` or the run's own file), the assignment calls per unit,
and a credibility call per passage. Before the judge has written a query's nuggets their
text is unknown: its assignment prompts carry ``max_nuggets`` stand-in nuggets of typical
length, and ``nuggets_estimated`` says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field

from judge.calling.batch import worst_case
from judge.calling.cache import Cache
from judge.calling.caller import Prompt
from judge.config import Price, RunConfig
from judge.data.results import RESULTS_FILE
from judge.judging.cascade import (
    echo_request,
    fit_band,
    passage_scores,
    read_scores,
    rerank_request,
    scored_documents,
    scored_passages,
)
from judge.judging.context import count_tokens
from judge.judging.dimensions import PlanFor, Planned
from judge.judging.judge import Judge
from judge.providers import planning_only, resolve_spec, why_no_batch
from judge.providers.base import ChatRequest, RerankResult, request_key
from judge.run.resume import Redo, batched_before, finished_units, spent_before
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
    # The first-round verdict calls with every answer running to its max_tokens (what the
    # budget reserves per call); re-asks, retries and the dimensions' calls not counted.
    worst_cost_usd: float | None = None
    # Hedged requests the run may add at most (``hedge_share`` of the calls to pay, rounded
    # down), counted in worst_cost_usd as calls of the average worst case.
    hedge_calls: int = 0
    tokens_per_passage: float
    # A judge cascade: its rerank requests (one per query, whatever the repeats), those already
    # cached, the passages the reranker labels (per repeat, as far as known), and whether the
    # LLM figures are an upper bound (scores not cached: those passages counted as the LLM's).
    rerank_calls: int = 0
    rerank_cached: int = 0
    side_rerank: bool = False  # the rerank calls are a side reranker's (rerank_*), no cascade
    reranker_passages: int = 0
    upper_bound: bool = False
    # Blank passages (no text to read): judged not relevant without a call, per repeat.
    blank_passages: int = 0
    # Batch mode: the cost with --batch (first-round verdicts at batch prices, [prices]
    # batch_factor or batch_*; what goes in real time at list price), whether this run is
    # batched ([run] batch), and the batch's worst case its budget must hold before submitting.
    batch: bool = False
    batch_cost_usd: float | None = None
    batch_worst_usd: float | None = None
    # Coverage and credibility calls by kind ("nuggets", "support", "credibility"), already in
    # the totals; whether assignment prompts hold stand-in nuggets (see the module docstring).
    aspect_calls: dict[str, int] = Field(default_factory=dict)
    nuggets_estimated: bool = False
    # What earlier invocations into the run directory spent (run.json's ledger): a budget
    # caps the run, so they count against it (None: nothing spent there yet, or --fresh).
    earlier: Usage | None = None


def estimate(
    config: RunConfig,
    queries: Sequence[Query],
    out_dir: Path,
    *,
    fresh: bool = False,
    redo: Redo = frozenset(),
) -> Estimate:
    """What judging ``queries`` into ``out_dir`` would send and spend, read from the cache and
    the run's results (none with ``fresh``: --fresh starts over; units ``redo`` names judged
    again, as the run judges them) without calling anything.
    Long because it walks every first-round request once, counting calls, cache hits, tokens
    and the worst case together."""
    done = set() if fresh else finished_units(out_dir / RESULTS_FILE, queries, redo)
    fresh_ok = "unparsed" not in redo  # an answer that did not parse counts, unless redone
    cache_file = config.cache_path()
    # Read only: a dry run moves nothing aside (a damaged file is said, as a run would find it).
    cache_db = Cache(cache_file if cache_file.exists() else None, recover=False)
    with planning_only():
        judge = Judge.from_config(config)
    limit = config.judge.params.completion_limit(judge.caller.extra_body)
    answer_tokens = min(limit or 512, 16 + 2 * config.judge.max_reason_words)
    units = calls = cached = prompt = completion = passages = decided = blank = 0
    worst = Usage()
    seen: set[str] = set()
    listwise = config.judge.mode == "listwise"
    # Rendered once per query; only the repeat index (part of the key) differs per repeat.
    plan, cascade = _plan(judge, config, queries, cache_db)
    blanks = [sum(p.blank for p in q.passages) for q, _, _ in plan]
    for repeat in range(config.run.repeats):
        for (q, prompts, n_llm), n_blank in zip(plan, blanks, strict=True):
            if (q.query_id, q.engine, repeat) in done:
                continue
            units += 1
            passages += len(q.passages)
            blank += n_blank
            decided += len(q.passages) - n_llm - n_blank
            # A listwise window answers for its passages (the last one: the rest), within its
            # max_tokens; a pointwise request for one.
            size, most = judge.asker.list_size, limit or 10**9
            for i, ask in enumerate(prompts):
                window = min(size, n_llm - i * size) if listwise else 1
                per_call_answer = min(answer_tokens * max(window, 1), most)
                key = judge.caller.key(ask, repeat)
                if key in seen:  # the same passage from another engine: asked once
                    continue
                seen.add(key)
                calls += 1
                # As the run looks it up: by its digest, else by the rendered request.
                if cache_db.contains(key, alias=True, unread=fresh_ok) or cache_db.contains(
                    judge.caller.key(ask.request, repeat), unread=fresh_ok
                ):
                    cached += 1
                    continue
                prompt += count_tokens(ask.request.messages)
                completion += per_call_answer
                worst = worst + worst_case(ask.request, judge.caller.extra_body)
    # What a batch would ask (first-round verdicts); the aspects' requests go in real time.
    batched = Usage(prompt_tokens=prompt, completion_tokens=completion)
    extra = _aspects(judge, config, (queries, [q for q, _, _ in plan]), done, out_dir, cache_db)
    calls, cached, prompt, completion = extra.plus(calls, cached, prompt, completion, seen)
    cache_db.close()
    price = config.price()
    usage = Usage(prompt_tokens=prompt, completion_tokens=completion)
    cost = price.cost(usage) if price is not None else None
    hedges = 0 if config.run.batch else int(judge.caller.tails["chat"].share * (calls - cached))
    hedged = worst  # what a real-time run may pay, its hedges as the average call's worst
    if hedges:
        hedged = worst + Usage(
            prompt_tokens=worst.prompt_tokens * hedges // (calls - cached),
            completion_tokens=worst.completion_tokens * hedges // (calls - cached),
        )
    return Estimate(
        units=units,
        calls=calls,
        cached_calls=cached,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cost_usd=cost,
        worst_cost_usd=price.cost(hedged) if price is not None else None,
        hedge_calls=hedges,
        tokens_per_passage=(prompt + completion) / passages if passages else 0.0,
        reranker_passages=decided,
        blank_passages=blank,
        **extra.fields(),
        batch=config.run.batch,
        **(_batch_costs(price, batched, usage, worst) if _has_batch(config) else {}),
        **cascade,
        earlier=None
        if not (spent := spent_before(out_dir)[0] + batched_before(out_dir)).total
        else spent,
    )


def _has_batch(config: RunConfig) -> bool:
    """Whether the judge's provider has a Batch API (the dry run prices --batch only then)."""
    spec = resolve_spec(config.judge.provider, config.provider.overrides())
    return why_no_batch(config.judge.provider, spec) is None


def _batch_costs(
    price: Price | None, batched: Usage, total: Usage, worst: Usage
) -> dict[str, float | None]:
    """With --batch: what a batch asks (``batched``) at batch prices and the rest of ``total``
    at list price; and the batch's worst case at batch prices."""
    if price is None:
        return {"batch_cost_usd": None, "batch_worst_usd": None}
    rest = Usage(
        prompt_tokens=total.prompt_tokens - batched.prompt_tokens,
        completion_tokens=total.completion_tokens - batched.completion_tokens,
    )
    return {
        "batch_cost_usd": price.batch().cost(batched) + price.cost(rest),
        "batch_worst_usd": price.batch().cost(worst),
    }


def _cached_scores(
    identity: str, model: str, queries: Sequence[Query], cache: Cache
) -> dict[int, dict[str, float]]:
    """By index in ``queries``: the reranker's scores per passage where the cache holds them
    (a query with nothing to score: its zeros, no call)."""
    scores: dict[int, dict[str, float]] = {}
    for i, q in enumerate(queries):
        documents = scored_documents(q)
        if not documents:
            scores[i] = dict.fromkeys((p.id for p in q.passages), 0.0)
            continue
        request = rerank_request(model, q, documents)
        got = cache.get(request_key(identity, request, 0), RerankResult)
        if got is not None and len(got.scores) == len(request.documents):
            scores[i] = passage_scores(q, documents, got.scores)[0]
    return scores


def _plan(
    judge: Judge, config: RunConfig, queries: Sequence[Query], cache: Cache
) -> tuple[Plan, dict[str, int | bool]]:
    """Each query's first LLM requests, and the cascade's rerank counts and upper-bound flag."""
    with_passages = [judge.fit(q) for q in queries if q.passages]
    reranker = judge.caller.reranker
    model = judge.cascade.model if judge.cascade is not None else judge.rerank_model
    scores: dict[int, dict[str, float]] = {}
    if reranker is not None and model is not None:  # one scoring a query, cascade or side
        scores = _cached_scores(reranker.identity, model, with_passages, cache)
    calls = sum(1 for q in with_passages if scored_passages(q))  # an all-blank query: none
    cached = len(scores) - (len(with_passages) - calls)
    if judge.cascade is None or reranker is None or model is None:
        asked = [
            (q, judge.asker.first_prompts(q), sum(not p.blank for p in q.passages))
            for q in with_passages
        ]
        side = {"rerank_calls": calls, "rerank_cached": cached}
        return asked, {**side, "side_rerank": True} if reranker is not None else {}
    identity = reranker.identity
    band = judge.cascade.band
    if band is None and len(scores) == len(with_passages):
        scored = [(q, read_scores(q, scores[i])) for i, q in enumerate(with_passages)]
        band = fit_band(judge.cascade.section, scored, config.label_scale())
    plan: Plan = []
    floor, unknown_echo = judge.cascade.section.echo_floor, False
    if judge.by_score:  # no LLM to ask: every passage is the reranker's
        counts = {"rerank_calls": calls, "rerank_cached": cached}
        return [(q, [], 0) for q in with_passages], {**counts, "upper_bound": False}
    for i, q in enumerate(with_passages):
        if band is not None and i in scores:
            above = [p for p in scored_passages(q) if band.side(scores[i][p.id]) == "above"]
            echoed: set[str] = set()
            if floor and above:
                # The echo check's answer when cached; else every passage above may echo.
                request = echo_request(model, q, above)
                got = cache.get(request_key(identity, request, 0), RerankResult)
                unknown_echo = unknown_echo or got is None
                masked = got.scores if got is not None else (0.0,) * len(above)
                echoed = {p.id for p, s in zip(above, masked, strict=True) if s < floor}
            inside = tuple(
                p
                for p in q.passages
                if not p.blank and (band.side(scores[i][p.id]) == "band" or p.id in echoed)
            )
            q_llm = q.model_copy(update={"passages": inside})
        else:
            q_llm = q
        prompts = judge.asker.first_prompts(q_llm) if q_llm.passages else []
        plan.append((q, prompts, len(q_llm.passages)))
    counts = {
        "rerank_calls": calls,
        "rerank_cached": cached,
        "upper_bound": band is None or len(scores) < len(with_passages) or unknown_echo,
    }
    return plan, counts


@dataclass
class _Extra:
    """The coverage and credibility requests of a dry run, and whether they hold stand-ins."""

    cache: Cache
    key: Callable[[ChatRequest, int], str]
    planned: list[Planned] = field(default_factory=list)
    by_kind: dict[str, int] = field(default_factory=dict)
    estimated: bool = False

    def plus(
        self, calls: int, cached: int, prompt: int, completion: int, seen: set[str]
    ) -> tuple[int, int, int, int]:
        """The totals with these requests counted like the verdicts' (one passage from two
        engines: its credibility asked once; already cached: not to pay)."""
        for kind, request, repeat, answer in self.planned:
            key = self.key(request, repeat)
            if key in seen:
                continue
            seen.add(key)
            calls += 1
            self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
            if self.cache.contains(key):
                cached += 1
                continue
            prompt += count_tokens(request.messages)
            completion += answer
        return calls, cached, prompt, completion

    def fields(self) -> dict[str, Any]:
        return {"aspect_calls": self.by_kind, "nuggets_estimated": self.estimated}


def _aspects(
    judge: Judge,
    config: RunConfig,
    queries: tuple[Sequence[Query], Sequence[Query]],
    done: set[tuple[str, str, int]],
    out_dir: Path,
    cache: Cache,
) -> _Extra:
    """The coverage and credibility requests the units still to judge need. ``queries``: as
    given (nugget pools are made of them) and as the run fits them to the context window (what
    units are judged on)."""
    extra, dims = _Extra(cache=cache, key=judge.caller.key), judge.dimensions
    given, fitted = queries
    if dims is None:
        return extra
    units = [
        (q, r)
        for r in range(config.run.repeats)
        for q in fitted
        if (q.query_id, q.engine, r) not in done
    ]
    extra.planned, extra.estimated = dims.planned(PlanFor(given, units, out_dir, cache))
    return extra
