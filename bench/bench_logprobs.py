"""What asking for logprobs costs on the embedded llama.cpp judge, and what cuts it.

llama-cpp-python computes logprobs in Python: it needs the server started with
``logits_all`` (logits for every prompt token, not just the last), log-softmaxes every row of
the prompt and the answer, and sorts the whole vocabulary (~152k entries for Qwen) once per
generated token. So the cost grows with the answer's length. This bench times one pointwise
request per passage of the dev set, through the real server and the real ``openai`` SDK, in
the shapes judge can ask for:

- ``reason+lp``: verdict first, then an 8-word reason, ``max_tokens`` 16, with logprobs
  (the shape the quickstart used before);
- ``reason``: the same without logprobs (no probability of relevance);
- ``verdict+lp``: the verdict only (``{"verdict": "yes"}``), with logprobs: what judge now
  asks a local server for when the config sets ``reasons = false``;
- ``verdict``: the verdict only, without logprobs.

Each shape judges the passages as a run would: one after another, distinct passages behind
one shared system prompt (llama.cpp reuses a common prompt prefix, so asking the same prompt
twice in a row would time only the answer). The shapes take turns in blocks, in the order
ABCD then DCBA, so drift on a busy machine reaches every shape alike; the figures that hold
are the ratios to ``reason+lp``.

Run (about 2 minutes on 2 cores):
    python bench/bench_logprobs.py ../shared/data/trec-dl-2019-sample.jsonl --passages 12
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from judge.judging.prompts import load_template
from judge.providers.embedded.server import EmbeddedServer
from judge.providers.embedded.weights import model_path
from judge.schema import Passage, Scale

SHAPES: dict[str, dict[str, Any]] = {
    "reason+lp": {"reasons": True, "logprobs": True},
    "reason": {"reasons": True, "logprobs": False},
    "verdict+lp": {"reasons": False, "logprobs": True},
    "verdict": {"reasons": False, "logprobs": False},
}


def messages(pair: dict[str, Any], reasons: bool) -> list[dict[str, str]]:
    template = load_template("binary.pointwise.en")
    passage = Passage(id=str(pair["doc_id"]), text=str(pair["text"]))
    rendered = template.render_pointwise(
        str(pair["query"]),
        passage,
        Scale.binary(),
        verdict_first=True,
        max_reason_words=8,
        reasons=reasons,
    )
    return [{"role": m.role, "content": m.content} for m in rendered]


async def ask(client: AsyncOpenAI, pair: dict[str, Any], shape: dict[str, Any]) -> float:
    extra: dict[str, Any] = {"logprobs": True, "top_logprobs": 5} if shape["logprobs"] else {}
    start = time.perf_counter()
    await client.chat.completions.create(
        model="judge",
        messages=messages(pair, shape["reasons"]),  # type: ignore[arg-type]
        temperature=0.0,
        max_tokens=16 if shape["reasons"] else 8,
        extra_body={"repeat_penalty": 1.0},
        **extra,
    )
    return time.perf_counter() - start


async def run(pairs: list[dict[str, Any]]) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in SHAPES}
    async with EmbeddedServer(model_path()) as server:
        client = AsyncOpenAI(base_url=server.base_url, api_key="none", max_retries=0)
        await ask(client, pairs[0], SHAPES["verdict"])  # warm-up: load the weights
        for order in (list(SHAPES), list(reversed(SHAPES))):
            for name in order:
                for pair in pairs:
                    times[name].append(await ask(client, pair, SHAPES[name]))
        await client.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("pairs", type=Path, help="JSONL: query, doc_id, text")
    ap.add_argument("--passages", type=int, default=12)
    args = ap.parse_args()
    with args.pairs.open(encoding="utf-8") as f:
        pairs = [json.loads(line) for line in f][: args.passages]
    times = asyncio.run(run(pairs))
    base = statistics.median(times["reason+lp"])
    print(f"{len(pairs)} passages, median seconds per request (ratio to reason+lp)")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:11} {median:6.2f} s  ({median / base:.2f}x)")


if __name__ == "__main__":
    main()
