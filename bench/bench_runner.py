"""How fast judge calls a provider, and re-runs from its cache, against a baseline you can trust.

A. judge against a bare ``openai`` SDK loop, in one run. Both talk to the same loopback
   OpenAI-compatible server (``python -m tests.servers openai``, its own process, so this
   process's CPU time is the client's alone), send the same requests (the ones judge renders,
   with the same body fields), at the same concurrency. The bare loop is what a user would
   write: ``AsyncOpenAI(max_retries=0)``, a semaphore, ``chat.completions.create`` and
   ``json.loads`` of each answer. judge is ``run_async`` with a fresh cache and run directory
   (so every request is sent), fixed concurrency: it also caches every answer, writes the
   results and computes each query's metrics. For each server latency (0 and 200 ms) and mode
   (pointwise: one request per passage; listwise: one per query), the two alternate
   ``--trials`` times; printed are the medians of wall seconds and of client CPU seconds, and
   the judge/bare ratio of each (medians of the per-trial ratios).

B. A fully cached re-run of ``--cached`` judgments, through the ``judge`` command as a child
   process (wall seconds, CPU seconds and peak memory from the operating system): into a new
   run directory, then again into that finished directory. The cache is filled beforehand
   (answers only, as a paid run leaves them with their readings missing); the first re-run,
   timed once and printed on its own line, reads every answer, stores its reading and each
   query's verdict set (judging/memo.py); the timed re-runs after it find the sets.

C. The same for a small run of ``--small`` judgments (100 queries x 10 passages), with and
   without charts.

D. ``judge run`` end to end at its defaults (adaptive concurrency from 64, charts, summary,
   reports; a child process with a fresh cache each trial) against the same loopback server
   at 200 ms (``--defaults-latency``): ``--judgments`` pointwise judgments, and as many in lists
   of 10 (one call per list). Beside each, the bare SDK loop of A for the same requests at 64
   in flight, which is what the server allows in that time.

Run from the repository root, in the environment judge is installed in:

    python bench/bench_runner.py [--judgments N] [--trials T] [--cached M] [--small S]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai  # imported before anything is timed: both sides use it

from judge.calling.cache import open_cache
from judge.config import RunConfig, load_config
from judge.judging.judge import Judge
from judge.providers.base import ChatRequest, Completion
from judge.run.runner import run_async
from judge.schema import Passage, Query, Usage

ROOT = Path(__file__).resolve().parent.parent
PER_QUERY = 10
# What a dataset line holds (a passage's other fields are what judge adds: unused as input).
DATASET_FIELDS: Any = {
    "query_id": True,
    "query": True,
    "engine": True,
    "passages": {"__all__": {"id", "text"}},
}
CONCURRENCY = 64


@contextmanager
def serve(latency: float = 0.0, extra: Sequence[str] = ()) -> Iterator[str]:
    """A loopback server process answering pointwise and listwise prompts (``extra``: more of
    its options, such as faults); its base URL."""
    options = ["--port", "0", "--latency", str(latency), "--responder", "listing", *extra]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.servers", "openai", *options],
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


def config_for(base_url: str, work: Path, mode: str = "pointwise") -> RunConfig:
    return load_config(
        None,
        {
            "judge.provider": "local",
            "judge.model": "bench-judge",
            "judge.mode": mode,
            "provider.base_url": base_url,
            "run.cache": str(work / "cache.sqlite"),
            "run.history": str(work / "history.sqlite"),
            "run.concurrency": CONCURRENCY,
            "run.adaptive_concurrency": False,
            "run.timeout_s": 30.0,
        },
    )


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


# --- A: judge against the bare SDK loop ---------------------------------------------------


async def bare_loop(base_url: str, bodies: list[dict[str, Any]], listwise: bool) -> int:
    """What a user would write: one create() per request, CONCURRENCY at a time; the number
    of verdicts read."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="not-needed", max_retries=0)
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(body: dict[str, Any]) -> int:
        async with gate:
            extra = {k: v for k, v in body.items() if k not in ("model", "messages")}
            response = await client.chat.completions.create(
                model=body["model"], messages=body["messages"], extra_body=extra, timeout=30.0
            )
        answer = json.loads(response.choices[0].message.content or "")
        return len(answer["verdicts"]) if listwise else int("verdict" in answer)

    try:
        return sum(await asyncio.gather(*(one(body) for body in bodies)))
    finally:
        await client.close()


def request_bodies(config: RunConfig, queries: list[Query]) -> list[dict[str, Any]]:
    """The JSON bodies judge sends for ``queries`` (model, messages and its fields)."""
    judge = Judge.from_config(config)
    provider: Any = judge.caller.chat
    requests: list[ChatRequest] = [r for q in queries for r in judge.first_requests(q)]
    bodies = [
        {
            "model": r.model,
            "messages": [{"role": m.role, "content": m.content} for m in r.messages],
            **provider.request_body(r),
        }
        for r in requests
    ]
    asyncio.run(judge.aclose())
    return bodies


def timed(run: Callable[[], Any]) -> tuple[Any, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    got = run()
    return got, time.perf_counter() - wall, time.process_time() - cpu


def versus_bare(n: int, latency: float, mode: str, trials: int, work: Path) -> None:
    listwise = mode == "listwise"
    queries = make_queries(n, f"{mode[0]}{int(latency * 1000)}-")
    figures: dict[str, list[float]] = {k: [] for k in ("jw", "jc", "bw", "bc", "rw", "rc")}
    with serve(latency) as url:
        bodies = request_bodies(config_for(url, work / "render", mode), queries)
        for trial in range(trials):
            trial_dir = work / f"{mode}-{latency}-{trial}"
            config = config_for(url, trial_dir, mode)
            outcome, jw, jc = timed(
                lambda: asyncio.run(run_async(config, queries, trial_dir / "out"))  # noqa: B023
            )
            assert outcome.status == "complete" and outcome.requests == len(bodies), outcome
            read, bw, bc = timed(lambda: asyncio.run(bare_loop(url, bodies, listwise)))
            assert read == n, read
            for key, value in zip(figures, (jw, jc, bw, bc, jw / bw, jc / bc), strict=True):
                figures[key].append(value)
    f = {k: median(v) for k, v in figures.items()}
    print(
        f"A. {mode:9} {latency * 1000:3.0f} ms, {len(bodies):5d} requests ({n} judgments), "
        f"concurrency {CONCURRENCY}: judge {f['jw']:6.2f} s wall {f['jc']:6.2f} s CPU | "
        f"bare openai {f['bw']:6.2f} s wall {f['bc']:6.2f} s CPU | "
        f"judge/bare wall {f['rw']:.2f}x, CPU {f['rc']:.2f}x"
    )


# --- B and C: cached re-runs through the judge command ------------------------------------


def fill_cache(config: RunConfig, queries: list[Query]) -> float:
    """Store an answer for every request the run will make, as a first run would (under the
    rendered request's key, named by its prompt digest); seconds it took."""
    start = time.perf_counter()
    judge = Judge.from_config(config)
    answer = Completion(
        text=json.dumps({"verdict": "yes", "reason": "prefilled"}),
        model="bench-judge",
        usage=Usage(prompt_tokens=60, completion_tokens=9),
    )
    cache = open_cache(config)
    for query in queries:
        for prompt in judge.asker.first_prompts(judge.fit(query)):
            key, alias = judge.caller.key(prompt.request, 0), judge.caller.key(prompt, 0)
            cache.put(key, answer, kind="chat", model="bench-judge", alias=alias)
    cache.close()
    asyncio.run(judge.aclose())
    return time.perf_counter() - start


# Run in a small process of its own, which starts the judge command and reports on it: Linux
# counts a child's peak memory from the process it was forked from, so the judge command must
# not be forked from this (large) one.
_LAUNCH = """
import json, os, subprocess, sys, time
start = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
_, status, usage = os.wait4(proc.pid, 0)
print(json.dumps({
    "wall": time.perf_counter() - start,
    "cpu": usage.ru_utime + usage.ru_stime,
    "peak": usage.ru_maxrss / 1024,
    "exit": os.waitstatus_to_exitcode(status),
}))
"""


def judge_command(args: list[str]) -> dict[str, float]:
    """``python -m judge ARGS`` as a child: wall and CPU seconds, peak memory (MiB), exit."""
    launched = subprocess.run(
        [sys.executable, "-c", _LAUNCH, sys.executable, "-m", "judge", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    figures: dict[str, float] = json.loads(launched.stdout)
    return figures


def cached_reruns(n: int, trials: int, work: Path, label: str, extra: Sequence[str] = ()) -> None:
    work.mkdir(parents=True, exist_ok=True)
    queries = make_queries(n, "c")
    dataset = work / "data.jsonl"
    with open(dataset, "w", encoding="utf-8") as fh:
        for q in queries:
            fh.write(q.model_dump_json(include=DATASET_FIELDS) + "\n")
    toml = work / "judge.toml"
    toml.write_text(
        '[judge]\nprovider = "local"\nmodel = "bench-judge"\n'
        # Nothing listens here: a cache miss would fail the run, not pass unnoticed.
        '[provider]\nbase_url = "http://127.0.0.1:9/v1"\n'
        f'[run]\ncache = "{work / "cache.sqlite"}"\nhistory = "{work / "history.sqlite"}"\n',
        encoding="utf-8",
    )
    filled = fill_cache(load_config(toml), queries)
    base = ["run", str(toml), str(dataset), *extra]
    first = judge_command([*base, "--out", str(work / "first")])
    assert first["exit"] == 0, first
    print(
        f"{label} first cached re-run of {n} judgments (reads every answer, stores the verdict "
        f"sets): {first['wall']:.2f} s wall, {first['cpu']:.2f} s CPU, peak {first['peak']:.0f} MiB"
    )
    new, finished = [], []
    for trial in range(trials):
        out = str(work / f"out-{trial}")
        new.append(judge_command([*base, "--out", out]))
        finished.append(judge_command([*base, "--out", out]))
        summary = json.loads((Path(out) / "summary.json").read_text(encoding="utf-8"))
        assert summary["run"]["requests"] == 0 and summary["counts"]["ok"] == n, summary["run"]
    for what, runs in (("new run directory", new), ("finished run directory", finished)):
        assert all(r["exit"] == 0 for r in runs), runs
        print(
            f"{label} cached re-run of {n} judgments into a {what}: "
            f"{median([r['wall'] for r in runs]):.2f} s wall, "
            f"{median([r['cpu'] for r in runs]):.2f} s CPU, "
            f"peak {median([r['peak'] for r in runs]):.0f} MiB "
            f"(median of {trials}; cache filled in {filled:.1f} s)"
        )


def cli_at_defaults(n: int, latency: float, mode: str, trials: int, work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    queries = make_queries(n, f"d{mode[0]}")
    dataset = work / f"{mode}.jsonl"
    with open(dataset, "w", encoding="utf-8") as fh:
        for q in queries:
            fh.write(q.model_dump_json(include=DATASET_FIELDS) + "\n")
    runs: list[dict[str, float]] = []
    bare: list[float] = []
    with serve(latency) as url:
        bodies = request_bodies(config_for(url, work / "render", mode), queries)
        for trial in range(trials):
            toml = work / f"{mode}-{trial}.toml"
            toml.write_text(
                f'[judge]\nprovider = "local"\nmodel = "bench-judge"\nmode = "{mode}"\n'
                f'[provider]\nbase_url = "{url}"\n'
                f'[run]\ncache = "{work / f"{mode}-{trial}.sqlite"}"\n'
                f'history = "{work / "history.sqlite"}"\n',
                encoding="utf-8",
            )
            got = judge_command(["run", str(toml), str(dataset), "--out", str(work / toml.stem)])
            assert got["exit"] in (0, 1), got  # 1: the judge's health warns, as it may here
            summary = json.loads((work / toml.stem / "summary.json").read_text(encoding="utf-8"))
            assert summary["run"]["requests"] == len(bodies), summary["run"]
            runs.append(got)
            read, wall, _ = timed(lambda: asyncio.run(bare_loop(url, bodies, mode == "listwise")))
            assert read == n, read
            bare.append(wall)
    f = {k: median([r[k] for r in runs]) for k in ("wall", "cpu", "peak")}
    print(
        f"D. judge run at its defaults, {mode:9} {latency * 1000:3.0f} ms, {len(bodies):5d} "
        f"requests ({n} judgments): {f['wall']:.2f} s wall end to end, {f['cpu']:.2f} s CPU, "
        f"peak {f['peak']:.0f} MiB | bare openai loop at {CONCURRENCY} in flight "
        f"{median(bare):.2f} s (median of {trials})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--judgments", type=int, default=1000, help="judgments for A")
    parser.add_argument("--latency", type=float, nargs="*", default=[0.0, 0.2])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--cached", type=int, default=100_000, help="judgments for B (0: skip)")
    parser.add_argument("--small", type=int, default=1000, help="judgments for C (0: skip)")
    parser.add_argument(
        "--defaults-latency", type=float, default=0.2, help="server latency for D (<0: skip)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-runner-") as tmp:
        work = Path(tmp)
        for latency in args.latency:
            for mode in ("pointwise", "listwise"):
                versus_bare(args.judgments, latency, mode, args.trials, work / "a")
        if args.small:
            cached_reruns(args.small, args.trials, work / "c", "C.")
            cached_reruns(args.small, args.trials, work / "c2", "C. --no-charts", ["--no-charts"])
        if args.cached:
            cached_reruns(args.cached, args.trials, work / "b", "B.")
        if args.defaults_latency >= 0:
            for mode in ("pointwise", "listwise"):
                cli_at_defaults(
                    args.judgments, args.defaults_latency, mode, args.trials, work / "d"
                )


if __name__ == "__main__":
    main()
