"""Labelled pairs from the Cranfield collection, for judge quality on queries unlike MS MARCO's.

Cranfield (1,400 aeronautics abstracts, 225 engineering questions, Cleverdon's relevance codes)
is a classic public test collection; it is not shipped here. Given the folder of its standard
files (``cran.all.1400``, ``cran.qry``, ``cranqrel``), this writes a pairs file for
bench/bench_quality.py (``query_id, query, doc_id, text, label``): for ``--queries`` queries
drawn with ``--seed``, up to four documents coded 1-2 (a complete answer: label 3; highly
relevant: 2), up to two coded 3-4 (background, minimum interest: 1), and the six documents
BM25 ranks highest among those the query's judgements do not name (label 0: hard negatives, as
a pool of retrieved passages has; Cranfield's judgements are not complete, so a few of them may
be relevant, which makes the figures lower bounds). A document's text is its title and
abstract. The qrels number queries 1-225 in the order of ``cran.qry``, not by its ``.I`` ids.

    python bench/cranfield_pairs.py CRAN_DIR cranfield-pairs.jsonl
    python bench/bench_quality.py configs/quickstart.toml cranfield-pairs.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
from collections import Counter
from pathlib import Path

CODE_TO_LABEL = {1: 3, 2: 2, 3: 1, 4: 1}
K1, B = 1.2, 0.75


def records(path: Path) -> list[dict[str, str]]:
    """The ``.I`` records of a Cranfield file, their ``.T`` and ``.W`` fields joined."""
    out: list[dict[str, str]] = []
    field = None
    for line in path.read_text(encoding="latin-1").splitlines():
        if line.startswith(".I"):
            out.append({"id": line.split()[1], "T": "", "W": ""})
            field = None
        elif line[:2] in (".T", ".A", ".B", ".W"):
            field = line[1]
        elif out and field in ("T", "W"):
            out[-1][field] += " " + line
    return [{k: " ".join(v.split()) for k, v in r.items()} for r in out]


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


class BM25:
    def __init__(self, docs: dict[str, str]) -> None:
        self.terms = {d: Counter(words(t)) for d, t in docs.items()}
        self.length = {d: sum(c.values()) for d, c in self.terms.items()}
        self.avg = sum(self.length.values()) / len(self.length)
        df = Counter(w for c in self.terms.values() for w in c)
        n = len(self.terms)
        self.idf = {w: math.log(1 + (n - f + 0.5) / (f + 0.5)) for w, f in df.items()}

    def ranked(self, query: str) -> list[str]:
        q = words(query)

        def score(d: str) -> float:
            tf, norm = self.terms[d], K1 * (1 - B + B * self.length[d] / self.avg)
            return sum(self.idf[w] * tf[w] * (K1 + 1) / (tf[w] + norm) for w in q if w in tf)

        return sorted(self.terms, key=lambda d: (-score(d), int(d)))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("cran_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    docs = {
        str(int(r["id"])): f"{r['T']}. {r['W']}" for r in records(args.cran_dir / "cran.all.1400")
    }
    queries = [r["W"].rstrip(" .") for r in records(args.cran_dir / "cran.qry")]
    qrels: dict[str, dict[str, int]] = {}
    for line in (args.cran_dir / "cranqrel").read_text(encoding="latin-1").splitlines():
        if line.strip():
            q, d, code = line.split()[:3]
            qrels.setdefault(q, {})[d] = int(code)
    bm25 = BM25(docs)
    chosen = sorted(qrels, key=int)
    random.Random(args.seed).shuffle(chosen)
    rows = []
    for qn in chosen[: args.queries]:
        query, judged = queries[int(qn) - 1], qrels[qn]
        relevant = sorted((d for d, c in judged.items() if c in (1, 2)), key=int)[:4]
        partial = sorted((d for d, c in judged.items() if c in (3, 4)), key=int)[:2]
        negatives = [d for d in bm25.ranked(query)[:40] if d not in judged][:6]
        for d in relevant + partial + negatives:
            label = CODE_TO_LABEL[judged[d]] if d in judged else 0
            rows.append(
                {
                    "query_id": f"cran{qn}",
                    "query": query,
                    "doc_id": f"c{d}",
                    "text": docs[d],
                    "label": label,
                }
            )
    with open(args.out, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    print(
        f"{args.out}: {len(rows)} pairs over {min(args.queries, len(chosen))} queries, "
        f"{sum(r['label'] >= 2 for r in rows)} relevant, {sum(r['label'] == 0 for r in rows)} "
        "BM25 negatives"
    )


if __name__ == "__main__":
    main()
