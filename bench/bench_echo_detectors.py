"""Can a reranker alone tell an echo attack from an honest passage? Class-level detectors, measured.

On the human-labelled pairs file, every passage is scored clean by MiniLM (the English signal of
the fused reranker, as a judge by score reads it: the list layer's flagged text left out of the
score), and every human-irrelevant one again under the echo forms of bench/attack_forms.py that
get past the list layer (tune: related, sprinkle, tail-repeat; held-out: interleave, restate,
self-vouch). Each detector is a number per passage; it is set so that 5% of the relevant clean
passages the judge calls "yes" are flagged, and printed is the share of attacked passages the
judge calls "yes" that it catches, per split, and its AUC between the two groups:

- ``masked``: minus the cosine with the query's words masked (judging/echo.py);
- ``base-masked``: how much the cosine drops when they are masked;
- ``leave-one-out``: how much it drops without the sentence that helps it most;
- ``dedupe``: how much it drops when every query word but its first mention is masked;
- ``copies`` / ``density``: query-word mentions per query word / per passage word.

Then each rule that labels by a defended score: flips of attacked irrelevant passages from "no"
to "yes" at the cut 0.5, per form, and the clean AUC and kappa on all pairs.

    python bench/bench_echo_detectors.py ../shared/data/trec-dl-2019-sample.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from attack_forms import FORMS, attack

from judge.analysis.reliability import cohen_kappa, roc_auc
from judge.judging.cascade import scored_text
from judge.judging.echo import _pattern, mask_query, query_terms
from judge.judging.sanitise import sanitise_query
from judge.providers.embedded.fused import FUSIONS, minilm_cosines
from judge.providers.embedded.weights import MINILM, model_path
from judge.schema import Passage, Query

ECHO_FORMS = ("related", "sprinkle", "tail-repeat", "interleave", "restate", "self-vouch")
Item = dict[str, Any]


def as_scored(query: str, text: str) -> str:
    passage = Passage(id="p", text=text)
    fitted = sanitise_query(Query(query_id="q", query=query, passages=(passage,)))
    return scored_text(fitted.passages[0], query)


def dedupe(text: str, query: str) -> str:
    """``text`` with every mention of a query word but the first masked."""
    pattern, seen = _pattern(query), set()
    if pattern is None:
        return text

    def once(m: re.Match[str]) -> str:
        word = m.group(0).casefold()
        if word in seen:
            return " "
        seen.add(word)
        return m.group(0)

    return " ".join(pattern.sub(once, text).split())


def items(path: Path) -> list[Item]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    forms = [f for f in FORMS if f.name in ECHO_FORMS]
    out: list[Item] = []
    for r in rows:
        base = {"qid": r["query_id"], "query": r["query"], "pid": r["doc_id"], "label": r["label"]}
        out.append({**base, "form": None, "text": as_scored(r["query"], r["text"])})
        for f in forms if r["label"] == 0 else ():
            text = attack(f, r["text"], r["query"], f"{r['query_id']}/{r['doc_id']}")
            out.append(
                {**base, "form": f.name, "split": f.split, "text": as_scored(r["query"], text)}
            )
    return out


def score(all_items: list[Item]) -> None:
    cosines = minilm_cosines(model_path(MINILM).parent, 2)
    stop = threading.Event()
    for it in all_items:
        q, t = it["query"], it["text"]
        sentences = [s for s in re.split(r"(?<=[.!?])\s+", t.strip()) if s]
        loo = [" ".join(sentences[:i] + sentences[i + 1 :]) for i in range(len(sentences))]
        docs = [t, mask_query(t, q), dedupe(t, q), *(loo if len(sentences) > 1 else [])]
        c, _ = cosines(q, [d if d.strip() else "." for d in docs], stop)
        it["base"], it["masked"], it["dedupe"] = float(c[0]), float(c[1]), float(c[2])
        it["loo"] = float(c[3:].min()) if len(c) > 3 else float(c[0])
        pattern = _pattern(q)
        hits = len(pattern.findall(t)) if pattern else 0
        it["copies"] = hits / max(1, len(query_terms(q)))
        it["density"] = hits / max(1, len(re.findall(r"\w+", t)))


def prob(cosine: float) -> float:
    return float(FUSIONS["en"].probability({"minilm": np.asarray([cosine])})[0])


DETECTORS: dict[str, Callable[[Item], float]] = {
    "masked": lambda i: -i["masked"],
    "base-masked": lambda i: i["base"] - i["masked"],
    "leave-one-out": lambda i: i["base"] - i["loo"],
    "dedupe": lambda i: i["base"] - i["dedupe"],
    "copies": lambda i: i["copies"],
    "density": lambda i: i["density"],
}


def print_detectors(all_items: list[Item]) -> None:
    said_yes = [i for i in all_items if prob(i["base"]) >= 0.5]
    clean = [i for i in said_yes if i["form"] is None]
    attacked = [i for i in said_yes if i["form"]]
    print(f"judge says yes: {len(clean)} clean ({sum(i['label'] >= 2 for i in clean)} relevant)")
    print(f"  and {len(attacked)} attacked irrelevant passages")
    for name, d in DETECTORS.items():
        relevant = sorted(d(i) for i in clean if i["label"] >= 2)
        bar = relevant[int(0.95 * len(relevant))]
        caught = {
            split: np.mean([d(i) > bar for i in attacked if i["split"] == split])
            for split in ("tune", "held-out")
        }
        auc = roc_auc(
            [d(i) for i in clean + attacked], [False] * len(clean) + [True] * len(attacked)
        )
        print(
            f"  {name:14s} catches tune {caught['tune']:.0%}, held-out {caught['held-out']:.0%} "
            f"(AUC {auc:.3f})"
        )


def print_rules(all_items: list[Item]) -> None:
    clean = [i for i in all_items if i["form"] is None]
    by_pair = {(i["qid"], i["pid"]): i for i in clean}
    rules: dict[str, Callable[[Item], float]] = {"score": lambda i: prob(i["base"])}
    for floor in (0.15, 0.25, 0.4):
        rules[f"masked below {floor}"] = lambda i, f=floor: (
            prob(i["masked"])
            if prob(i["base"]) >= 0.5 and prob(i["masked"]) < f
            else prob(i["base"])
        )
    for name, rule in rules.items():
        p = [rule(i) for i in clean]
        gold = [i["label"] >= 2 for i in clean]
        table = np.zeros((2, 2))
        for said, g in zip(p, gold, strict=True):
            table[int(said >= 0.5), int(g)] += 1
        flips = []
        for form in ECHO_FORMS:
            attacked = [i for i in all_items if i["form"] == form]
            n = sum(rule(by_pair[(i["qid"], i["pid"])]) < 0.5 <= rule(i) for i in attacked)
            flips.append(f"{form} {n / len(attacked):.0%}")
        auc, kappa = roc_auc(p, gold), cohen_kappa(table)
        print(f"  {name:18s} AUC {auc:.3f} kappa {kappa:.3f}; flips: " + ", ".join(flips))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("pairs", type=Path)
    args = parser.parse_args()
    all_items = items(args.pairs)
    score(all_items)
    print_detectors(all_items)
    print("rules (cut 0.5):")
    print_rules(all_items)


if __name__ == "__main__":
    main()
