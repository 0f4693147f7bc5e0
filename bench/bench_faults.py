"""Concurrency under a fault mix: judge at its defaults against fixed concurrency.

A loopback server (this script with ``--serve``, its own process, so this process's CPU is the
client's alone) answers after ``--latency`` seconds and injects faults at ``--fault-rate``,
drawn uniformly from ``--faults`` (a name listed twice is drawn twice as often); a hung request
answers after twice ``--timeout``. Two mixes are built in (``--mix``):

- ``nightly`` (the default): 40% faults, 20% 429s, 5% each of 500s, hung requests, dropped
  connections and bodies that are not JSON;
- ``harsh``: 60% faults, 30% 429s, 10% hung, 10% dropped, 5% 500s, 5% not JSON.

``Judge.judge_many`` judges ``--passages`` passages (10 per query) with a fresh cache, with
``[run] concurrency`` ``--concurrency`` and every other limit at its default (adaptive
concurrency, the per-attempt deadline and hedging from the recent p95, 6 attempts), and with
each of ``--fixed`` fixed concurrencies (adaptive off; deadline and hedging as the defaults),
in alternation, ``--trials`` times; with ``--plain``, also each fixed concurrency without the
deadline and hedging (``attempt_timeout_s = timeout_s``, ``hedge_share = 0``: every attempt
may take the whole timeout, as before they existed). Printed per setting: median wall seconds;
the verdicts per status (each passage must have exactly one); the requests the server received
against the requests judge counted (they must be equal: every request is counted, hedges
included), the hedges and retries among them; and the limit the controller ended at. Last, the
defaults' median against the best fixed one's.

    python bench/bench_faults.py [--mix nightly|harsh] [--passages 600] [--trials 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from judge.calling.limits import Limits
from judge.judging.judge import Judge
from judge.schema import Passage, Query

ROOT = Path(__file__).resolve().parent.parent
MIXES = {
    "nightly": (
        0.4,
        "rate_limit,rate_limit,rate_limit,rate_limit,server_error,hang,drop,malformed",
    ),
    "harsh": (
        0.6,
        "rate_limit,rate_limit,rate_limit,rate_limit,rate_limit,rate_limit,"
        "hang,hang,drop,drop,server_error,malformed",
    ),
}


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


class Server:
    """The fault server process: its base URL, and the requests it has received so far."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        assert proc.stdout is not None and proc.stdin is not None
        self._out: IO[str] = proc.stdout
        self._in: IO[str] = proc.stdin
        line = self._out.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"server did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}/v1"

    def received(self) -> int:
        self._in.write("count\n")
        self._in.flush()
        return int(json.loads(self._out.readline())["requests"])


@contextmanager
def serve(args: argparse.Namespace, rate: float, faults: str) -> Iterator[Server]:
    options = [
        *("--latency", str(args.latency), "--fault-rate", str(rate), "--faults", faults),
        *("--hang-seconds", str(args.timeout * 2)),
    ]
    command = [sys.executable, __file__, "--serve", *options]
    proc = subprocess.Popen(
        command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        yield Server(proc)
    finally:
        proc.terminate()
        proc.wait()


@dataclass(frozen=True)
class Trial:
    wall_s: float
    statuses: Counter[str]
    once: bool  # every passage has exactly one verdict
    received: int  # requests the server received
    requests: int  # requests judge counted
    hedges: int
    retries: int
    limit: int


# A setting: None for the defaults, else (fixed concurrency, with the deadline and hedging).
Setting = tuple[int, bool] | None


def name_of(setting: Setting, args: argparse.Namespace) -> str:
    if setting is None:
        return f"defaults (adaptive {args.concurrency})"
    fixed, tail = setting
    return f"fixed {fixed}" + ("" if tail else ", plain")


def trial(server: Server, args: argparse.Namespace, setting: Setting, tag: str) -> Trial:
    fixed, tail = setting or (args.concurrency, True)
    plain = {} if tail else {"attempt_timeout_s": args.timeout, "hedge_share": 0.0}
    limits = Limits(concurrency=fixed, adaptive=setting is None, timeout_s=args.timeout, **plain)
    asked = queries(args.passages, tag)
    before = server.received()
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        with Judge(
            "local", "bench", base_url=server.url, limits=limits, cache=Path(tmp) / "c.sqlite"
        ) as j:
            got = j.judge_many(asked, progress=False)
            stats, limit = j.caller.stats, j.caller.slots["chat"].current
        took = time.perf_counter() - start
    time.sleep(0.2)  # requests cancelled in flight reach the server's count
    verdicts = Counter(v.passage_id for jq in got for v in jq.verdicts)
    want = {p.id for q in asked for p in q.passages}
    return Trial(
        wall_s=took,
        statuses=Counter(v.status for jq in got for v in jq.verdicts),
        once=set(verdicts) == want and max(verdicts.values()) == 1,
        received=server.received() - before,
        requests=stats.requests,
        hedges=stats.hedges,
        retries=stats.retries,
        limit=limit,
    )


def report(name: str, got: Sequence[Trial], passages: int) -> float:
    wall = statistics.median(t.wall_s for t in got)
    print(
        f"{name:24s} {wall:6.1f} s wall (median of {len(got)}, {[round(t.wall_s, 1) for t in got]})"
    )
    for t in got:
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(t.statuses.items()))
        print(
            f"{'':26s}{statuses} of {passages}, each once: {t.once}; server received "
            f"{t.received}, judge counted {t.requests} ({t.hedges} hedges, {t.retries} retries); "
            f"limit at the end {t.limit}"
        )
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mix", choices=sorted(MIXES), default="nightly")
    parser.add_argument("--passages", type=int, default=600)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--fixed", default="32", help="fixed concurrencies to compare, a,b,c")
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--fault-rate", type=float, help="instead of the mix's")
    parser.add_argument("--faults", help="instead of the mix's")
    parser.add_argument("--plain", action="store_true", help="also without deadline, hedging")
    args = parser.parse_args()
    rate, faults = MIXES[args.mix]
    rate = rate if args.fault_rate is None else args.fault_rate
    faults = args.faults or faults
    fixed = [int(c) for c in args.fixed.split(",")]
    settings: list[Setting] = [None, *((c, True) for c in fixed)]
    settings += [(c, False) for c in fixed] if args.plain else []
    print(
        f"mix {args.mix}: fault rate {rate} over {faults}; latency {args.latency} s, "
        f"timeout_s {args.timeout}, {args.passages} passages"
    )
    runs: dict[Setting, list[Trial]] = {s: [] for s in settings}
    with serve(args, rate, faults) as server:
        for t in range(args.trials):
            for n, setting in enumerate(settings):
                runs[setting].append(trial(server, args, setting, f"t{t}s{n}"))
    walls = {s: report(name_of(s, args), got, args.passages) for s, got in runs.items()}
    best = min((w, name_of(s, args)) for s, w in walls.items() if s is not None)
    print(f"defaults / best fixed ({best[1]}): {walls[None] / best[0]:.2f}x")


def serve_main(argv: Sequence[str]) -> None:
    """The server process: ``PORT <n>``, then one JSON line of counts per line read."""
    sys.path.insert(0, str(ROOT))  # tests/ is not installed: the repository's own copy
    from tests.servers import FAULTS, HANG, Fault, ScriptedServer, listing_responder

    parser = argparse.ArgumentParser(prog="bench_faults.py --serve")
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--fault-rate", type=float, default=0.0)
    parser.add_argument("--faults", default="")
    parser.add_argument("--hang-seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    faults = [FAULTS[name.strip()] for name in args.faults.split(",") if name.strip()]
    faults = [Fault("hang", seconds=args.hang_seconds) if f is HANG else f for f in faults]
    server = ScriptedServer(
        responder=listing_responder(),
        latency=args.latency,
        fault_rate=args.fault_rate,
        faults=faults,
    )
    with server:
        print(f"PORT {server.port}", flush=True)
        for _ in sys.stdin:
            print(json.dumps({"requests": len(server.requests)}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve_main(sys.argv[2:])
    else:
        main()
