"""Throughput of judge.metrics against ir_measures (pytrec_eval) on the same judged lists.

1,000,000 queries x 10 judged passages, grades 0..3 drawn with a fixed seed, relevant at
grade >= 2. Ours computes ap, ndcg@10, precision@5 and mrr in one compute_label_free call
over the whole matrix; pytrec_eval is timed on the first 50,000 queries only (its per-query
dicts for 1M queries take minutes and several GB), from ready-made qrels/run dicts.

Run from the repository root, in the environment judge is installed in (with the dev extras,
for ir_measures): python bench/bench_metrics.py [n_queries]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import ir_measures
import numpy as np
from ir_measures import AP, RR, P, nDCG

from judge.metrics.compute import compute_label_free, pad

DEPTH = 10
SUBSET = 50_000
THRESHOLD = 2
NAMES = ("ap", "ndcg@10", "precision@5", "mrr")
MEASURES = {
    "ap": AP(rel=THRESHOLD),
    "ndcg@10": nDCG @ 10,
    "precision@5": P(rel=THRESHOLD) @ 5,
    "mrr": RR(rel=THRESHOLD),
}


def best_of(repeats: int, run: Callable[[], object]) -> float:
    """Fastest wall time of ``repeats`` calls of ``run``."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    rng = np.random.default_rng(20240611)
    grades = rng.integers(0, 4, size=(n, DEPTH)).astype(np.float64)
    lengths = np.full(n, DEPTH, dtype=np.int64)

    def ours() -> dict[str, np.ndarray]:
        return compute_label_free(NAMES, grades, lengths, max_grade=3, threshold=THRESHOLD)

    seconds = best_of(3, ours)
    print(f"ours   compute_label_free {NAMES} on {n:,} queries x {DEPTH}:")
    print(f"       {seconds:.3f} s (best of 3) = {n / seconds:,.0f} queries/s")

    rows = grades.astype(int).tolist()
    start = time.perf_counter()
    pad(rows)
    padded = time.perf_counter() - start
    print(f"ours   pad() from {n:,} Python lists: {padded:.3f} s = {n / padded:,.0f} queries/s")

    m = min(SUBSET, n)
    qrels = {f"q{q}": {f"d{i}": int(g) for i, g in enumerate(rows[q])} for q in range(m)}
    run = {f"q{q}": {f"d{i}": float(DEPTH - i) for i in range(DEPTH)} for q in range(m)}
    start = time.perf_counter()
    theirs = list(ir_measures.pytrec_eval.iter_calc(MEASURES.values(), qrels, run))
    elapsed = time.perf_counter() - start
    print(f"ir_measures (pytrec_eval) same 4 measures on a SUBSET of {m:,} queries:")
    print(f"       {elapsed:.3f} s = {m / elapsed:,.0f} queries/s (dict building not timed)")

    mine = ours()
    by_measure = {name: np.zeros(m) for name in MEASURES}
    lookup = {measure: name for name, measure in MEASURES.items()}
    for metric in theirs:
        by_measure[lookup[metric.measure]][int(metric.query_id[1:])] = metric.value
    for name, values in by_measure.items():
        ours_sub = mine[name][:m]
        defined = ~np.isnan(ours_sub)
        gap = np.abs(ours_sub[defined] - values[defined]).max()
        print(f"check  {name}: max |ours - trec_eval| over {defined.sum():,} defined = {gap:.1e}")
    print(f"speed-up (queries/s, ours / pytrec_eval): {(n / seconds) / (m / elapsed):,.0f}x")


if __name__ == "__main__":
    main()
