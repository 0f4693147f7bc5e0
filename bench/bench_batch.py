"""Batch mode against real time: what a run costs and what it sends.

The same dataset is judged twice, each time from a cold cache, by ``judge run`` (the command,
in this process) against the loopback server of tests/batch_server.py (a thread of this process:
it speaks the chat endpoint and OpenAI's Files and Batches endpoints, and answers both from the
same deterministic judge, so the two runs must give the same verdicts, which is checked):

- real time: one chat request per passage (pointwise) or per query (listwise);
- ``--batch``: one input file, one batch, its status checks (the server reports it in progress
  for ``--polls`` checks), one output file; then the run reads every answer from the cache.

Printed per mode: HTTP requests the server received (by kind), batch lines, the bytes of the
input and output files, tokens, and the cost at list and at batch prices as the run's summary
records it. Wall seconds are printed too but mean little here: a real batch takes minutes to
hours (OpenAI promises 24 h), which is the price of the discount.

Run from the repository root (it imports the test server from tests/):

    python bench/bench_batch.py [--queries 200] [--passages 10] [--polls 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the loopback server lives in tests/

from judge.cli.main import main  # noqa: E402
from judge.data.datasets import read_results  # noqa: E402
from judge.data.results import RESULTS_FILE  # noqa: E402
from tests.batch_server import BatchServer  # noqa: E402
from tests.servers import listing_responder  # noqa: E402

# A small hosted model's list price, USD per 1M tokens (batch: half, [prices] batch_factor).
PRICE = {"prompt": 0.15, "completion": 0.60}


def _dataset(path: Path, n_queries: int, n_passages: int) -> Path:
    rows = [
        {
            "query_id": f"q{q}",
            "query": f"what does report {q} say about topic {q % 17}?",
            "engine": "bm25",
            "passages": [
                {"id": f"q{q}-p{p}", "text": f"passage {p} of report {q}: " + "words " * 60}
                for p in range(n_passages)
            ],
        }
        for q in range(n_queries)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _config(folder: Path, server: BatchServer, dataset: Path, mode: str) -> Path:
    text = f"""
[judge]
provider = "openai"
model = "judge-bench"
mode = "{mode}"
[provider]
base_url = "{server.openai_base_url}"
[dataset]
path = "{dataset}"
[run]
cache = "{folder / "cache.sqlite"}"
history = "{folder / "history.sqlite"}"
concurrency = 32
charts = false
batch_poll_s = 0.01
batch_max_poll_s = 0.05
[prices."judge-bench"]
prompt = {PRICE["prompt"]}
completion = {PRICE["completion"]}
"""
    path = folder / "run.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _labels(out: Path) -> dict[tuple[str, str, int, str], str | None]:
    return {
        (jq.query.query_id, jq.query.engine, jq.repeat, v.passage_id): v.label
        for jq in read_results(out / RESULTS_FILE)
        for v in jq.verdicts
    }


def _one(server: BatchServer, folder: Path, config: Path, batch: bool) -> dict[str, Any]:
    """One cold run; what the server received and what the summary says it cost."""
    before, files_before = Counter(r.path for r in server.requests), set(server.files)
    calls_before, lines_before = Counter(server.calls), len(server.executed)
    out = folder / ("batch" if batch else "realtime")
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(["run", str(config), "--out", str(out), *(["--batch"] if batch else [])])
    wall = time.perf_counter() - started
    assert code == 0, f"judge run exited {code}"
    after = Counter(r.path for r in server.requests)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    new_files = [server.files[f] for f in set(server.files) - files_before]
    return {
        "out": out,
        "wall": wall,
        "chat": after["/v1/chat/completions"] - before["/v1/chat/completions"],
        "calls": dict(Counter(server.calls) - calls_before),
        "lines": len(server.executed) - lines_before,
        "file_bytes": sorted(len(data) for data in new_files),
        "tokens": summary["run"]["prompt_tokens"] + summary["run"]["completion_tokens"],
        "cost": summary["run"]["cost_usd"],
    }


def run(n_queries: int, n_passages: int, polls: int, mode: str) -> None:
    with (
        tempfile.TemporaryDirectory() as tmp,
        BatchServer(responder=listing_responder(), polls_in_progress=polls) as server,
    ):
        folder = Path(tmp)
        dataset = _dataset(folder / "data.jsonl", n_queries, n_passages)
        realtime = _one(
            server, folder / "r", _config(_mk(folder / "r"), server, dataset, mode), False
        )
        batched = _one(
            server, folder / "b", _config(_mk(folder / "b"), server, dataset, mode), True
        )
        same = _labels(realtime["out"]) == _labels(batched["out"])
        n = n_queries * n_passages
        print(f"\n{mode}: {n_queries} queries x {n_passages} passages = {n} judgments")
        for name, got in (("real time", realtime), ("--batch", batched)):
            kinds = {"chat": got["chat"]} if got["chat"] else {}
            kinds |= got["calls"]
            shape = ", ".join(f"{k} {v}" for k, v in kinds.items())
            print(
                f"  {name + ':':11} {sum(kinds.values())} HTTP requests ({shape}), "
                f"{got['lines']} batch lines, {got['tokens']} tokens, ${got['cost']:.6f}, "
                f"{got['wall']:.2f} s"
            )
        files = batched["file_bytes"]
        print(f"  batch files (bytes: input, output): {files}")
        print(
            f"  batch/real-time cost: {batched['cost'] / realtime['cost']:.3f}; "
            f"same verdicts: {same}"
        )


def _mk(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def main_(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python bench/bench_batch.py")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--passages", type=int, default=10)
    parser.add_argument("--polls", type=int, default=3, help="status checks a batch is in progress")
    args = parser.parse_args(argv)
    os.environ.setdefault("OPENAI_API_KEY", "sk-loopback-only")  # the server checks none
    with tempfile.TemporaryDirectory() as home:
        os.environ["XDG_CACHE_HOME"] = home  # the user's cache and history stay untouched
        for mode in ("pointwise", "listwise"):
            run(args.queries, args.passages, args.polls, mode)


if __name__ == "__main__":
    main_()
