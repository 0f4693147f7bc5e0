"""What the run machinery (judge.runner + judge.calls + judge.cache) costs per judgment.

Three figures, each from a real ``run_async`` against the loopback OpenAI-compatible server
(``python -m tests.servers openai``) started as a separate process, so that the judge
process's CPU time (time.process_time) is the judge's alone:

a. overhead: zero-latency server, N pointwise judgments into a fresh cache: judgments per
   second and CPU milliseconds of the judge process per judgment;
b. concurrency: 200 ms server latency, concurrency 64: achieved throughput against the
   ideal 64 / 0.2 s = 320 judgments per second;
c. cached re-run: M judgments whose answers are all in the cache (filled beforehand with the
   exact keys the run will ask for): seconds for the whole run, zero provider calls.

Queries have 10 passages each (one request per passage). Run from the repository root:

    /work/venv/bin/python bench/bench_runner.py [--overhead N] [--latency-n N] [--cached M]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from judge.calling.cache import open_cache
from judge.config import RunConfig, load_config
from judge.judging.judge import Judge
from judge.providers.base import Completion, request_key
from judge.run.runner import RunOutcome, run_async
from judge.schema import Passage, Query, Usage

ROOT = Path(__file__).resolve().parent.parent
PER_QUERY = 10


@contextmanager
def serve(latency: float = 0.0) -> Iterator[str]:
    """A loopback server process; yields its OpenAI base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.servers", "openai", "--port", "0", "--latency", str(latency)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"server did not start: {line!r}")
        yield f"http://127.0.0.1:{int(line.split()[1])}/v1"
    finally:
        proc.terminate()
        proc.wait()


def make_queries(n_judgments: int, tag: str) -> list[Query]:
    """n_judgments / 10 queries of 10 distinct passages each (no two requests alike)."""
    return [
        Query(
            query_id=f"{tag}{q}",
            query=f"what does item {q} of batch {tag} do",
            engine="bench",
            passages=tuple(
                Passage(id=f"{tag}{q}-{p}", text=f"Item {q} passage {p}: it does thing {p}.")
                for p in range(PER_QUERY)
            ),
        )
        for q in range(n_judgments // PER_QUERY)
    ]


def config_for(base_url: str, work: Path, concurrency: int) -> RunConfig:
    return load_config(
        None,
        {
            "judge.provider": "local",
            "judge.model": "bench-judge",
            "provider.base_url": base_url,
            "run.cache": str(work / "cache.sqlite"),
            "run.concurrency": concurrency,
            "run.timeout_s": 30.0,
            "run.backoff_base_s": 0.05,
        },
    )


def timed_run(
    config: RunConfig, queries: list[Query], out: Path
) -> tuple[RunOutcome, float, float]:
    """The run's outcome, wall seconds and CPU seconds of this (the judge) process."""
    wall, cpu = time.perf_counter(), time.process_time()
    outcome = asyncio.run(run_async(config, queries, out))
    return outcome, time.perf_counter() - wall, time.process_time() - cpu


def judgments(outcome: RunOutcome) -> int:
    return outcome.done * PER_QUERY


def bench_overhead(n: int, work: Path) -> None:
    with serve() as url:
        config = config_for(url, work, concurrency=16)
        outcome, wall, cpu = timed_run(config, make_queries(n, "a"), work / "out-a")
    assert outcome.status == "complete" and outcome.requests == n, outcome
    print(
        f"a. overhead, zero-latency server, {n} judgments (concurrency 16, fresh cache): "
        f"{n / wall:.0f} judgments/s, {1000 * cpu / n:.3f} CPU ms per judgment "
        f"({wall:.1f} s wall, {cpu:.1f} s CPU)"
    )


def bench_concurrency(n: int, work: Path) -> None:
    latency, concurrency = 0.2, 64
    ideal = concurrency / latency
    with serve(latency) as url:
        config = config_for(url, work, concurrency=concurrency)
        outcome, wall, cpu = timed_run(config, make_queries(n, "b"), work / "out-b")
    assert outcome.status == "complete" and outcome.requests == n, outcome
    print(
        f"b. concurrency {concurrency}, {latency * 1000:.0f} ms latency, {n} judgments: "
        f"{n / wall:.0f} judgments/s of the ideal {ideal:.0f}/s ({n / wall / ideal:.0%}); "
        f"{1000 * cpu / n:.3f} CPU ms per judgment"
    )


def fill_cache(config: RunConfig, queries: list[Query]) -> float:
    """Store an answer under every key the run will ask for; seconds it took."""
    start = time.perf_counter()
    judge = Judge.from_config(config)
    identity = judge.caller.chat.identity if judge.caller.chat else ""
    answer = Completion(
        text=json.dumps({"verdict": "yes", "reason": "prefilled"}),
        model="bench-judge",
        usage=Usage(prompt_tokens=60, completion_tokens=9),
    )
    cache = open_cache(config)
    for query in queries:
        for request in judge.first_requests(query):
            cache.put(request_key(identity, request, 0), answer, kind="chat", model="bench-judge")
    cache.close()
    asyncio.run(judge.aclose())
    return time.perf_counter() - start


def bench_cached(n: int, work: Path) -> None:
    with serve() as url:
        config = config_for(url, work, concurrency=16)
        queries = make_queries(n, "c")
        filled = fill_cache(config, queries)
        outcome, wall, cpu = timed_run(config, queries, work / "out-c")
    assert outcome.status == "complete" and outcome.requests == 0, outcome
    assert outcome.cache_hits == n, outcome
    print(
        f"c. fully cached re-run of {n} judgments: {wall:.1f} s ({n / wall:.0f} judgments/s, "
        f"{1000 * cpu / n:.3f} CPU ms per judgment; filling the cache took {filled:.1f} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overhead", type=int, default=20_000, help="judgments for (a)")
    parser.add_argument("--latency-n", type=int, default=3_200, help="judgments for (b)")
    parser.add_argument("--cached", type=int, default=100_000, help="judgments for (c)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-runner-") as tmp:
        work = Path(tmp)
        if args.overhead:
            bench_overhead(args.overhead, work / "a")
        if args.latency_n:
            bench_concurrency(args.latency_n, work / "b")
        if args.cached:
            bench_cached(args.cached, work / "c")


if __name__ == "__main__":
    main()
