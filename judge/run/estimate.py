"""``judge run --dry-run``: how many calls, tokens and dollars a run would take, without calling.

Prompts are rendered exactly as the run would render them; their tokens are counted with the
offline cl100k tokenizer (an estimate for non-OpenAI models). Completion tokens are estimated
from the requested reason length, capped by ``max_tokens``. Calls already in the cache, and
units already in the run directory, are not counted as to-pay; a passage several engines
returned is counted once per repeat, as the run asks it once. Re-asks and retries are not
foreseen, so the figures are a floor for a judge that answers badly.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from judge.calling.cache import open_cache
from judge.config import RunConfig
from judge.data.results import RESULTS_FILE
from judge.judging.context import count_tokens
from judge.judging.judge import Judge
from judge.providers import planning_only
from judge.providers.base import request_key
from judge.run.resume import finished_units
from judge.schema import Query, Record, Usage


class Estimate(Record):
    units: int  # (query, engine, repeat) still to judge
    calls: int  # provider calls those need (before any re-asks or retries)
    cached_calls: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None  # None when the config has no price for the model
    tokens_per_passage: float


def estimate(config: RunConfig, queries: Sequence[Query], out_dir: Path) -> Estimate:
    done = finished_units(out_dir / RESULTS_FILE)
    cache_file = config.cache_path()
    cache_db = open_cache(cache_file if cache_file.exists() else None)
    with planning_only():
        judge = Judge.from_config(config)
    identity = judge.caller.chat.identity if judge.caller.chat else ""
    answer_tokens = min(
        config.judge.params.max_tokens or 512, 16 + 2 * config.judge.max_reason_words
    )
    units = calls = cached = prompt = completion = passages = 0
    seen: set[str] = set()
    listwise = config.judge.mode == "listwise"
    # Rendered once per query; only the repeat index (part of the key) differs per repeat.
    rendered = [(q, judge.first_requests(q)) for q in queries if q.passages]
    for repeat in range(config.run.repeats):
        for q, requests in rendered:
            if (q.query_id, q.engine, repeat) in done:
                continue
            units += 1
            passages += len(q.passages)
            per_call_answer = answer_tokens * (len(q.passages) if listwise else 1)
            for request in requests:
                key = request_key(identity, request, repeat)
                if key in seen:  # the same passage from another engine: asked once
                    continue
                seen.add(key)
                calls += 1
                if cache_db.contains(key):
                    cached += 1
                    continue
                prompt += count_tokens(request.messages)
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
    )
