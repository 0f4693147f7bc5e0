"""``judge run --ray`` against a single process, on this machine (judge/run/ray_run.py).

A. API throughput at 0 ms server latency: the same ``--judgments`` pointwise judgments (10
   passages per query, no two requests alike) through ``run_async`` in this process, then
   through ``run_on_ray`` with 1, 2 and 4 shards, each with a fresh cache and run directory, so
   every request is sent. The loopback server (``python -m tests.servers openai``) runs in its
   own process. Total concurrency is 64 in every case (a Ray run splits it between its shards).
   Ray is started once beforehand with 4 logical CPUs (so 4 shards can run at once on 2 cores),
   and one untimed Ray run warms its worker processes (they import judge once); its start-up
   time is printed apart, since ``judge run --ray`` without an address pays it on every run.
   A Ray figure is the whole of ``run_on_ray``: planning, seeding, the shards, folding the
   results back and merging the shards' caches into the user's.

B. The embedded judge (0.5B llama.cpp, the quickstart's settings, no reranker): passages per
   second over ``--embedded-passages`` passages in this process, then with 1 and 2 Ray workers,
   each shard starting its own llama.cpp server (its start-up is inside the figure). Slow: a few
   passages only, one measurement at a time (``--no-embedded`` skips it).

Run from the repository root, in the environment judge is installed in with the ray extra:

    python bench/bench_ray.py [--judgments N] [--trials T] [--embedded-passages P]
                              [--no-api | --no-embedded]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import ray

from judge.config import RunConfig, load_config
from judge.run.ray_run import run_on_ray
from judge.run.runner import RunOutcome, run_async
from judge.schema import Passage, Query

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_runner import make_queries, serve

CONCURRENCY = 64
Run = Callable[..., Coroutine[Any, Any, RunOutcome]]


def api_config(base_url: str, work: Path, shards: int | None) -> RunConfig:
    return load_config(
        None,
        {
            "judge.provider": "local",
            "judge.model": "bench-judge",
            "provider.base_url": base_url,
            "run.cache": str(work / "cache.sqlite"),
            "run.history": str(work / "history.sqlite"),
            "run.concurrency": CONCURRENCY,
            "run.adaptive_concurrency": False,
            "run.timeout_s": 30.0,
            "run.progress_interval_s": 3600.0,
            **({"run.ray": "local", "run.ray_shards": shards} if shards else {}),
        },
    )


def timed(run: Run, config: RunConfig, queries: list[Query], out: Path) -> tuple[float, int]:
    """Wall seconds of one run, and the requests it sent."""
    start = time.perf_counter()
    outcome = asyncio.run(run(config, queries, out))
    seconds = time.perf_counter() - start
    assert outcome.status == "complete", outcome.reason
    return seconds, outcome.requests


def bench_api(judgments: int, trials: int) -> None:
    print(f"A. {judgments} pointwise judgments, 0 ms loopback server, concurrency {CONCURRENCY}")
    with serve(0.0) as base_url, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        warm = make_queries(200, "warm")
        timed(run_on_ray, api_config(base_url, work / "warm", 4), warm, work / "warm" / "out")
        rows: dict[str, list[float]] = {}
        for trial in range(trials):
            for name, shards in (("single process", None), *((f"ray, {n}", n) for n in (1, 2, 4))):
                where = work / f"{trial}-{shards or 0}"
                queries = make_queries(judgments, f"t{trial}s{shards or 0}-")
                run: Run = run_on_ray if shards else run_async
                config = api_config(base_url, where, shards)
                seconds, requests = timed(run, config, queries, where / "out")
                assert requests == judgments, requests
                rows.setdefault(name, []).append(seconds)
        single = statistics.median(rows["single process"])
        for name, values in rows.items():
            wall = statistics.median(values)
            print(
                f"  {name:<16} {wall:6.2f} s  {judgments / wall:7.0f} passages/s  "
                f"{single / wall:4.2f}x  (trials: {', '.join(f'{v:.2f}' for v in values)})"
            )


def embedded_queries(passages: int) -> list[Query]:
    """``passages`` passages, 2 per query, short and distinct."""
    return [
        Query(
            query_id=f"e{q}",
            query=f"how do I keep basil plant number {q} alive indoors",
            engine="bench",
            passages=tuple(
                Passage(id=f"e{q}-{p}", text=f"Basil {q}.{p}: water when the top soil is dry.")
                for p in range(2)
            ),
        )
        for q in range(passages // 2)
    ]


# The quickstart's embedded judge (configs/quickstart.toml) without its reranker.
EMBEDDED = """
[judge]
provider = "embedded"
model = "qwen2.5-coder-0.5b-instruct-q4"
scale = "binary"
verdict_first = true
max_reason_words = 8
[judge.params]
temperature = 0.0
max_tokens = 16
logprobs = true
top_logprobs = 5
response_format = "json_object"
[metrics]
names = ["relevancy_mean", "ap"]
"""


def embedded_config(work: Path, shards: int | None) -> RunConfig:
    work.mkdir(parents=True, exist_ok=True)
    (work / "run.toml").write_text(EMBEDDED, encoding="utf-8")
    return load_config(
        work / "run.toml",
        {
            "run.cache": str(work / "cache.sqlite"),
            "run.history": str(work / "history.sqlite"),
            "run.concurrency": 1,
            "run.timeout_s": 300.0,
            "run.progress_interval_s": 3600.0,
            **({"run.ray": "local", "run.ray_shards": shards} if shards else {}),
        },
    )


def bench_embedded(passages: int) -> None:
    print(f"B. the embedded judge, {passages} passages (each shard its own llama.cpp server)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        single = None
        for name, shards in (("single process", None), ("ray, 1", 1), ("ray, 2", 2)):
            where = work / str(shards or 0)
            queries = embedded_queries(passages)
            run: Run = run_on_ray if shards else run_async
            seconds, _ = timed(run, embedded_config(where, shards), queries, where / "out")
            single = single or seconds
            print(
                f"  {name:<16} {seconds:6.1f} s  {passages / seconds:5.2f} passages/s  "
                f"{single / seconds:4.2f}x"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--judgments", type=int, default=4000)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--embedded-passages", type=int, default=8)
    parser.add_argument("--no-embedded", action="store_true")
    parser.add_argument("--no-api", action="store_true", help="part B only")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    start = time.perf_counter()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    print(f"Ray start-up (local instance, 4 logical CPUs): {time.perf_counter() - start:.1f} s")
    try:
        if not args.no_api:
            bench_api(args.judgments, args.trials)
        if not args.no_embedded:
            bench_embedded(args.embedded_passages)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
