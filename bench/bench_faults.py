"""Adaptive concurrency under a fault mix: judge at the defaults against fixed concurrency.

A loopback server (``python -m tests.servers openai``, its own process) answers after
``--latency`` seconds and injects faults at ``--fault-rate``, drawn uniformly from ``--faults``
(a name listed twice is drawn twice as often). The default mix is the one a nightly job meets:
20% 429s, 5% 500s, 5% hung requests (longer than the timeout), 5% dropped connections and 5%
bodies that are not JSON. ``Judge.judge_many`` judges ``--passages`` passages (10 per query)
with a fresh cache, at ``[run] concurrency`` ``--concurrency``, adaptive (the default) and
fixed, in alternation, ``--trials`` times. Printed per setting: median wall seconds, the
passages that ended ok, the limit the controller ended at, and the requests the server saw.

    python bench/bench_faults.py [--passages 600] [--trials 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench_runner import serve

from judge.calling.limits import Limits
from judge.judging.judge import Judge
from judge.schema import Passage, Query

MIX = "rate_limit,rate_limit,rate_limit,rate_limit,server_error,hang,drop,malformed"


def queries(n: int, tag: str) -> list[Query]:
    return [
        Query(
            query_id=f"{tag}{q}",
            query=f"what does item {q} of {tag} do",
            passages=tuple(
                Passage(id=f"{tag}{q}-{p}", text=f"Item {q} passage {p} of {tag}.")
                for p in range(10)
            ),
        )
        for q in range(n // 10)
    ]


def trial(url: str, args: argparse.Namespace, adaptive: bool, tag: str) -> tuple[float, int, int]:
    limits = Limits(
        concurrency=args.concurrency,
        adaptive=adaptive,
        timeout_s=args.timeout,
        max_attempts=4,
        backoff_base_s=0.2,
    )
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        with Judge(
            "local", "bench", base_url=url, limits=limits, cache=Path(tmp) / "c.sqlite"
        ) as j:
            got = j.judge_many(queries(args.passages, tag), progress=False)
            limit = j.caller.slots["chat"].current
        took = time.perf_counter() - start
    ok = sum(v.status == "ok" for jq in got for v in jq.verdicts)
    return took, ok, limit


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--passages", type=int, default=600)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument("--fault-rate", type=float, default=0.4)
    parser.add_argument("--faults", default=MIX)
    args = parser.parse_args()
    faults = [
        *("--fault-rate", str(args.fault_rate), "--faults", args.faults),
        *("--hang-seconds", str(args.timeout * 2)),
    ]
    with serve(args.latency, faults) as url:
        runs: dict[bool, list[tuple[float, int, int]]] = {True: [], False: []}
        for t in range(args.trials):
            for adaptive in (True, False):
                runs[adaptive].append(trial(url, args, adaptive, f"t{t}{int(adaptive)}"))
    for adaptive, got in runs.items():
        name = "adaptive (default)" if adaptive else f"fixed {args.concurrency}"
        print(
            f"{name:20s} {statistics.median(g[0] for g in got):6.1f} s wall (median of "
            f"{len(got)}); ok {[g[1] for g in got]} of {args.passages}; "
            f"limit at the end {[g[2] for g in got]}"
        )


if __name__ == "__main__":
    main()
