"""Prompt and completion tokens per judged passage, for every shipped template.

Counts with the offline cl100k tokenizer on datasets/sample.jsonl: prompts exactly as they
would be sent (judge.Judge.first_requests), completions as a typical answer of the template's
shape (a 25-word reason plus the verdict per passage). ``instr`` is the instructions' share per
passage, as the performance issue counts it: prompt tokens minus the passages' own text and
titles and minus the query text (once per request); labels, fences, ids and the chat framing
stay in. Run: python bench/bench_tokens.py [--pairs ../shared/data/trec-dl-2019-sample.jsonl]

The bundled sample's lists are short (5.6 passages), so a listwise request's shared
instructions are split over few passages. ``--pairs`` adds the same table for the ranked lists
of a labelled pairs file (rows ``{query_id, query, doc_id, text}``, grouped by query in file
order): the TREC DL 2019 dev set gives 43 lists of 11 passages with MS MARCO ids, untitled.
``--width 5 10`` adds the same lists cut to their first 5 and first 10 passages: a listwise
request's instructions are ~100 tokens shared by its passages plus ~11 per passage (its
fence), so the per-passage share falls with the list's length. ``--spotlight fence`` counts
the prompts without the datamark (``[judge] spotlight``); the default is the shipped
``datamark``, whose marks count in ``instr`` (they are not the passage's own text).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from itertools import product

from judge.data.datasets import read_queries
from judge.judging.context import _encoder, count_tokens
from judge.judging.judge import Judge
from judge.providers.base import ProviderSpec
from judge.schema import Passage, Query

REASON = " ".join(["relevant"] * 25)


def answer_tokens(mode: str, ids: list[str], label: str) -> int:
    if mode == "pointwise":
        text = json.dumps({"reason": REASON, "verdict": label}, ensure_ascii=False)
    else:
        text = json.dumps(
            {"verdicts": [{"id": i, "reason": REASON, "verdict": label} for i in ids]},
            ensure_ascii=False,
        )
    return len(_encoder().encode(text))


def pair_lists(path: str) -> list[Query]:
    """The ranked lists of a labelled pairs file: one query per query_id, in file order."""
    rows: dict[str, list[dict[str, str]]] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                rows.setdefault(str(row["query_id"]), []).append(row)
    return [
        Query(
            query_id=qid,
            query=group[0]["query"],
            passages=tuple(Passage(id=str(r["doc_id"]), text=r["text"]) for r in group),
        )
        for qid, group in rows.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", help="also count a labelled pairs file's ranked lists")
    parser.add_argument(
        "--width",
        type=int,
        nargs="*",
        default=[],
        help="also count the pairs file's lists cut to their first N passages (each N given)",
    )
    parser.add_argument("--spotlight", default="datamark", choices=("datamark", "fence"))
    args = parser.parse_args()
    table("datasets/sample.jsonl", read_queries("datasets/sample.jsonl").queries, args.spotlight)
    if args.pairs:
        print()
        table(args.pairs, pair_lists(args.pairs), args.spotlight)
        for width in args.width:
            print()
            cut = [
                q.model_copy(update={"passages": q.passages[:width]})
                for q in pair_lists(args.pairs)
            ]
            table(f"{args.pairs}, lists cut to {width}", cut, args.spotlight)


def table(name: str, queries: Sequence[Query], spotlight: str = "datamark") -> None:
    spec = ProviderSpec(kind="openai", base_url="http://127.0.0.1:9/v1")
    print(
        f"{name}: {len(queries)} ranked lists, "
        f"{sum(len(q.passages) for q in queries)} passages; cl100k tokens per judged passage\n"
    )
    print(
        f"{'template':28} {'prompt':>8} {'instr':>7} {'completion':>11} {'total':>7} {'calls':>6}"
    )
    rows: dict[tuple[str, str, str], float] = {}
    for scale, mode, lang in product(("binary", "graded"), ("pointwise", "listwise"), ("en", "zh")):
        judge = Judge(spec, "m", scale=scale, mode=mode, language=lang, spotlight=spotlight)
        label = judge.scale.names[-1]
        prompt = completion = calls = passages = texts = 0
        for q in queries:
            requests = judge.first_requests(q)
            calls += len(requests)
            passages += len(q.passages)
            texts += sum(len(_encoder().encode(f"{p.title or ''}{p.text}")) for p in q.passages)
            texts += len(requests) * len(_encoder().encode(q.query))
            prompt += sum(count_tokens(r.messages) for r in requests)
            if mode == "pointwise":
                completion += len(q.passages) * answer_tokens(mode, ["x"], label)
            else:
                completion += answer_tokens(mode, [p.id for p in q.passages], label)
        rows[(scale, mode, lang)] = prompt / passages
        name = f"{scale}.{mode}.{lang}"
        print(
            f"{name:28} {prompt / passages:8.1f} {(prompt - texts) / passages:7.1f} "
            f"{completion / passages:11.1f} {(prompt + completion) / passages:7.1f} {calls:6d}"
        )
    print()
    for scale, lang in product(("binary", "graded"), ("en", "zh")):
        ratio = rows[(scale, "listwise", lang)] / rows[(scale, "pointwise", lang)]
        print(f"{scale}.{lang}: listwise prompt tokens per passage = {ratio:.0%} of pointwise")


if __name__ == "__main__":
    main()
