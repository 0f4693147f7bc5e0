"""The embedded reranker (all-MiniLM-L6-v2 in numpy): passages per second and AUC.

On ../shared/data/trec-dl-2019-sample.jsonl (475 judged pairs, 43 queries; relevant = grade
>= 2), after ``judge model fetch --model rerank``:

- unbatched: one passage per forward pass (the first ``--unbatched`` passages);
- per query: one provider ``rerank`` call per query, as a run makes them (query encoded once,
  its ~11 passages batched, in a worker thread);
- all at once: every passage in one ``encode`` call (batches of similar length);
- AUC of the provider's scores (and of the raw cosines) against the human labels, and how
  often a passage is relevant per score band (how well the scores read as P(relevant)).

Matrix products dominate, so the figures depend on the CPU and on what else runs: the load
average and passages per CPU-second are printed beside them. ``--threads N``: BLAS threads
for every pass (default 1, the provider's default; 0: the BLAS library's own choice).

Run: .venv/bin/python bench/bench_rerank.py [--data FILE] [--threads N] [--unbatched N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from judge.analysis.reliability import roc_auc
from judge.providers.base import ProviderSpec, RerankRequest
from judge.providers.embedded.minilm import MiniLM
from judge.providers.embedded.rerank import blas_threads, make_embedded_rerank_provider
from judge.providers.embedded.weights import MINILM, is_verified, model_path

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "trec-dl-2019-sample.jsonl"


class Timer:
    """Wall and process CPU time since creation: passages per second of each."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def rates(self, passages: int) -> tuple[float, float]:
        wall = time.perf_counter() - self.wall
        cpu = time.process_time() - self.cpu
        return passages / wall, passages / cpu


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads (0: the library's)")
    parser.add_argument("--unbatched", type=int, default=60, help="passages timed one by one")
    return parser.parse_args()


def main() -> int:
    args = _args()
    if not is_verified(model_path(MINILM), MINILM):
        print(
            "the reranker model is not fetched: judge model fetch --model rerank", file=sys.stderr
        )
        return 2
    rows = [json.loads(line) for line in args.data.read_text(encoding="utf-8").splitlines()]
    texts = [r["text"] for r in rows]
    relevant = np.array([r["label"] >= 2 for r in rows])
    queries: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        queries.setdefault(r["query"], []).append(i)
    threads = args.threads or "the library's default"
    print(f"{args.data.name}: {len(rows)} pairs, {len(queries)} queries; BLAS threads {threads}")
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores\n")

    encoder = MiniLM(model_path(MINILM).parent)
    encoder.encode(texts[:8])  # warm up
    timer = Timer()
    with blas_threads(args.threads):
        for text in texts[: args.unbatched]:
            encoder.encode([text])
    unbatched = timer.rates(args.unbatched)

    options = {"fetch": False, "threads": args.threads}
    provider = make_embedded_rerank_provider(ProviderSpec(options=options))
    scores = np.zeros(len(rows))

    async def per_query() -> tuple[float, float]:
        warm = RerankRequest(model="all-MiniLM-L6-v2", query="warm up", documents=("the model",))
        await provider.rerank(warm, timeout=None)  # loads the model: not timed
        timer = Timer()
        for query, idx in queries.items():
            request = RerankRequest(
                model="all-MiniLM-L6-v2", query=query, documents=tuple(texts[i] for i in idx)
            )
            result = await provider.rerank(request, timeout=None)
            scores[idx] = result.scores
        rates = timer.rates(len(rows))
        await provider.aclose()
        return rates

    requests = asyncio.run(per_query())
    timer = Timer()
    with blas_threads(args.threads):
        vectors = encoder.encode(texts).vectors
    at_once = timer.rates(len(rows))
    query_vectors = dict(zip(queries, encoder.encode(list(queries)).vectors, strict=True))
    cosines = np.array([query_vectors[r["query"]] @ v for r, v in zip(rows, vectors, strict=True)])

    print(f"{'passages/s':>10} {'per CPU-s':>10}  how")
    for (wall, cpu), how in (
        (unbatched, f"unbatched: one passage per forward pass (first {args.unbatched})"),
        (requests, "batched per query: one provider.rerank call per query"),
        (at_once, f"batched: all {len(rows)} passages in one encode call"),
    ):
        print(f"{wall:10.1f} {cpu:10.1f}  {how}")
    print(f"load average after: {os.getloadavg()[0]:.2f}\n")
    print(f"AUC (gold = grade >= 2): scores {roc_auc(scores, relevant):.4f}, "
          f"raw cosines {roc_auc(cosines, relevant):.4f}")  # fmt: skip
    brier = float(np.mean((scores - relevant) ** 2))
    print(
        f"Brier score of the scores as P(relevant): {brier:.3f} (base rate {relevant.mean():.2f})"
    )
    print("score band   passages  relevant")
    for lo in np.arange(0.0, 1.0, 0.1):
        band = (scores >= lo) & (scores < lo + 0.1 if lo < 0.9 else scores <= 1.0)
        if band.any():
            print(f"{lo:.1f}-{lo + 0.1:.1f}   {int(band.sum()):9d}  {relevant[band].mean():8.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
