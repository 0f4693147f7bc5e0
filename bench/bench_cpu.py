"""CPU per judgment of ``judge run``, and a run at scale, against loopback servers.

E. CPU per judgment. ``judge run`` end to end at its defaults (adaptive concurrency from 64,
   summary, reports, charts; a child process with a fresh cache each trial) against
   ``python -m tests.servers openai`` at 0 ms (``--latency``): ``--judgments`` pointwise
   judgments, and ``--small`` of them to tell the process's start-up from the per-judgment
   cost (CPU = start-up + judgments x per judgment, the two points' line). The chat client is
   judge's lean HTTP client and, alternating with it trial by trial, the ``openai`` SDK
   (``[provider] options = {client = "sdk"}``); beside them the bare SDK loop of
   bench_runner.py A, as a child process of its own (importing ``openai`` included), at the
   same 64 in flight. Printed: medians of CPU seconds, CPU per judgment, wall seconds, and
   the ratios (judge/bare wall; lean/sdk CPU pair by pair).

F. Scale. ``--scale`` judgments (default 100,000) at ``--scale-latency`` (50 ms) and
   ``--scale-concurrency`` (256, fixed, not adaptive) through ``judge run`` once: wall, CPU and
   peak memory, the floor (calls x latency / concurrency), and the same at a quarter of the
   judgments; from the two, how much the peak grows a passage (flat would be 0).

Python's bytecode is compiled first (``compileall``), as an installed package has it: a
checkout run with PYTHONDONTWRITEBYTECODE would otherwise compile every edited module in
every trial.

    python bench/bench_cpu.py [--judgments N] [--small S] [--trials T] [--scale M] [--skip-scale]
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_runner import (  # the sibling bench, by path
    _LAUNCH,
    DATASET_FIELDS,
    ROOT,
    bare_loop,
    config_for,
    judge_command,
    make_queries,
    request_bodies,
    serve,
)

IN_FLIGHT = 64  # judge's starting concurrency, and the bare loop's


def write_dataset(path: Path, n: int, tag: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for q in make_queries(n, tag):
            fh.write(q.model_dump_json(include=DATASET_FIELDS) + "\n")


def write_config(path: Path, url: str, cache: Path, client: str, run: str = "") -> None:
    path.write_text(
        '[judge]\nprovider = "local"\nmodel = "bench-judge"\n'
        f'[provider]\nbase_url = "{url}"\noptions = {{ client = "{client}" }}\n'
        f'[run]\ncache = "{cache}"\nhistory = "{cache.with_suffix(".history")}"\n{run}',
        encoding="utf-8",
    )


def judge_run(work: Path, url: str, dataset: Path, client: str, n: int, run: str = "") -> Any:
    """One ``judge run`` child with a fresh cache: its figures (wall, cpu, peak, exit)."""
    tag = f"{client}-{time.monotonic_ns()}"
    toml = work / f"{tag}.toml"
    write_config(toml, url, work / f"{tag}.sqlite", client, run)
    out = work / tag
    got = judge_command(["run", str(toml), str(dataset), "--out", str(out)])
    assert got["exit"] in (0, 1), got  # 1: the judge's health warns, as it may here
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["counts"]["ok"] == n, summary["counts"]
    return got


_BARE = """
import asyncio, json, sys
sys.path.insert(0, sys.argv[1])
from bench_runner import bare_loop
bodies = json.load(open(sys.argv[3]))
print(asyncio.run(bare_loop(sys.argv[2], bodies, False)))
"""


def bare_child(url: str, bodies_file: Path) -> dict[str, float]:
    """The bare SDK loop as a process of its own (importing openai included)."""
    here = str(Path(__file__).resolve().parent)
    launched = subprocess.run(
        [sys.executable, "-c", _LAUNCH, sys.executable, "-c", _BARE, here, url, str(bodies_file)],
        capture_output=True,
        text=True,
        check=True,
    )
    figures: dict[str, float] = json.loads(launched.stdout)
    return figures


def cpu_per_judgment(n: int, small: int, trials: int, latency: float, work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    big, little = work / "big.jsonl", work / "small.jsonl"
    write_dataset(big, n, "e")
    write_dataset(little, small, "s")
    figures: dict[str, list[float]] = {}

    def note(key: str, value: float) -> None:
        figures.setdefault(key, []).append(value)

    with serve(latency) as url:
        bodies = request_bodies(config_for(url, work / "render"), make_queries(n, "e"))
        bodies_file = work / "bodies.json"
        bodies_file.write_text(json.dumps(bodies), encoding="utf-8")
        asyncio.run(bare_loop(url, bodies[:64], False))  # the server warmed up
        for _ in range(trials):
            for client in ("lean", "sdk"):
                got = judge_run(work, url, big, client, n)
                few = judge_run(work, url, little, client, small)
                note(f"{client} cpu", got["cpu"])
                note(f"{client} wall", got["wall"])
                note(f"{client} peak", got["peak"])
                note(f"{client} small cpu", few["cpu"])
                note(f"{client} per", (got["cpu"] - few["cpu"]) / (n - small))
                note(f"{client} start", few["cpu"] - small * figures[f"{client} per"][-1])
            bare = bare_child(url, bodies_file)
            note("bare wall", bare["wall"])
            note("bare cpu", bare["cpu"])
            note("lean/sdk cpu", figures["lean cpu"][-1] / figures["sdk cpu"][-1])
            note("lean/bare wall", figures["lean wall"][-1] / bare["wall"])
            note("sdk/bare wall", figures["sdk wall"][-1] / bare["wall"])
    f = {k: statistics.median(v) for k, v in figures.items()}
    floor = len(bodies) * latency / IN_FLIGHT
    for client in ("lean", "sdk"):
        print(
            f"E. judge run, {client:4} client, {n} pointwise judgments at {latency * 1000:.0f} ms: "
            f"{f[f'{client} cpu']:.2f} s CPU = {f[f'{client} cpu'] / n * 1000:.2f} ms a judgment "
            f"(start-up {f[f'{client} start']:.2f} s + {f[f'{client} per'] * 1000:.2f} ms a "
            f"judgment, from {small} and {n}); {f[f'{client} wall']:.2f} s wall, "
            f"peak {f[f'{client} peak']:.0f} MiB"
        )
    print(
        f"E. bare openai loop (its own process) at {IN_FLIGHT} in flight: {f['bare wall']:.2f} s "
        f"wall, {f['bare cpu']:.2f} s CPU | lean/sdk CPU {f['lean/sdk cpu']:.2f}x, "
        f"judge/bare wall: lean {f['lean/bare wall']:.2f}x, sdk {f['sdk/bare wall']:.2f}x"
        + (f" | floor {floor:.2f} s" if latency > 0 else "")
        + f" (medians of {trials}, alternating)"
    )


def at_scale(n: int, latency: float, concurrency: int, work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    run = f"concurrency = {concurrency}\nadaptive_concurrency = false\n"
    peaks: dict[int, float] = {}
    with serve(latency) as url:
        for count in (n // 4, n):
            dataset = work / f"scale-{count}.jsonl"
            write_dataset(dataset, count, f"f{count}-")
            got = judge_run(work, url, dataset, "lean", count, run)
            floor = count * latency / concurrency
            print(
                f"F. judge run, {count} pointwise judgments at {latency * 1000:.0f} ms, "
                f"concurrency {concurrency}: {got['wall']:.1f} s wall ({got['wall'] / floor:.2f}x "
                f"the floor of {floor:.1f} s), {got['cpu']:.1f} s CPU "
                f"({got['cpu'] / count * 1000:.2f} ms a judgment), peak {got['peak']:.0f} MiB"
            )
            peaks[count] = got["peak"]
    low, high = sorted(peaks)
    slope = (peaks[high] - peaks[low]) * 1024 / (high - low)
    print(
        f"F. peak memory grows {slope:.2f} KB a passage from {low} to {high} judgments "
        "(0 would be flat in the number of passages)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--judgments", type=int, default=1000)
    parser.add_argument("--small", type=int, default=10)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--scale", type=int, default=100_000)
    parser.add_argument("--scale-latency", type=float, default=0.05)
    parser.add_argument("--scale-concurrency", type=int, default=256)
    parser.add_argument("--skip-cpu", action="store_true")
    parser.add_argument("--skip-scale", action="store_true")
    args = parser.parse_args()
    compileall.compile_dir(ROOT / "judge", quiet=1)
    print(f"load average at start: {load()}")
    with tempfile.TemporaryDirectory(prefix="bench-cpu-") as tmp:
        if not args.skip_cpu:
            cpu_per_judgment(args.judgments, args.small, args.trials, args.latency, Path(tmp) / "e")
        if not args.skip_scale:
            at_scale(args.scale, args.scale_latency, args.scale_concurrency, Path(tmp) / "f")
    print(f"load average at end: {load()}")


def load() -> str:
    with open("/proc/loadavg", encoding="utf-8") as fh:
        return " ".join(fh.read().split()[:3]) + " (1, 5, 15 min; 2 cores)"


if __name__ == "__main__":
    main()
