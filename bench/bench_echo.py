"""How far can an attack form buy the offline judge's verdict? Per form, tune and held-out.

Takes the human-labelled pairs file (``{query_id, query, doc_id, text, label}``, 0-3), and
judges through the package's own path (``Judge``: the sanitiser, the embedded MiniLM reranker,
the judge cascade of the quickstart, ``[judge.cascade] low = 0.53, high = 0.6``) every
human-irrelevant passage (label 0) clean and under each form of bench/attack_forms.py. The LLM
of the cascade is a loopback server (``python -m tests.servers openai``): what it would answer is
not measured here (bench/bench_quality.py does that, slowly); what is measured is what the
reranker decides, which no LLM sees. Printed per form, for each ``echo_floor`` given:

- the mean shift of the reranker score (attacked minus clean; what ``rerank_*`` metrics and a
  reranker-alone judge read) and the share the reranker alone would flip from "no" to "yes"
  (score from below ``high`` to at or above it);
- the cascade's flips: clean verdict not the reranker's "yes", attacked verdict the reranker's
  "yes" (an echo-flagged passage goes to the LLM instead), and the share sent to the LLM;
- on every clean pair: the share of the reranker's "yes" that the echo check sends to the LLM
  instead (its cost on honest passages), and the precision of the "yes" that stay.

Forms are split by form, not by passage (bench/attack_forms.py): choose on ``tune``, report
``held-out``. A held-out form is still not an adaptive attacker.

    python bench/bench_echo.py ../shared/data/trec-dl-2019-sample.jsonl --floors 0 0.35 0.45

``--score-judge``: the same for a judge by score (``[judge] provider = "embedded-fused"``, cut
0.5, no LLM): an echo-flagged passage is labelled by its masked score (judging/cascade.py), so
"the cascade's flips" are that judge's own.

    python bench/bench_echo.py ../shared/data/trec-dl-2019-sample.jsonl --score-judge \
        --floors 0 0.15

``--fused-cascade``: the cascade of configs/cascade.toml instead (the fused reranker, cut at
0.5 with no band: only echoed and flagged passages go to the LLM; its floor is 0.4).

    python bench/bench_echo.py ../shared/data/trec-dl-2019-sample.jsonl --fused-cascade \
        --floors 0.4

``--splits``: which splits of forms to attack with (default all: tune, held-out, fresh,
fresh2).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from attack_forms import FORMS, attack
from bench_runner import serve

from judge.config import CascadeSection
from judge.judging.judge import Judge
from judge.providers.base import ProviderSpec
from judge.schema import JudgedQuery, Passage, Query

HIGH, LOW = 0.6, 0.53
SCORE_CUT = 0.5  # embedded-fused's calibrated cut (judge.providers.ADAPTERS)


def load(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def queries(rows: list[dict[str, object]], form: object | None) -> list[Query]:
    """One Query per query id holding its passages (attacked by ``form`` when given)."""
    by_id: dict[str, list[dict[str, object]]] = defaultdict(list)
    for r in rows:
        by_id[str(r["query_id"])].append(r)
    out = []
    for qid, group in by_id.items():
        text = str(group[0]["query"])
        passages = tuple(
            Passage(
                id=str(r["doc_id"]),
                text=str(r["text"])
                if form is None
                else attack(form, str(r["text"]), text, f"{qid}/{r['doc_id']}"),  # type: ignore[arg-type]
            )
            for r in group
        )
        out.append(Query(query_id=qid, query=text, passages=passages))
    return out


def judged(
    url: str | None,
    cache: Path,
    floor: float | None,
    qs: list[Query],
    sanitise: str = "flag",
    fused: bool = False,
) -> dict[str, tuple[float, str, str, tuple[str, ...]]]:
    """Per passage id: reranker score, label, source, signals (``url`` None: the judge by
    score, no LLM; ``fused``: the cascade of configs/cascade.toml, the fused reranker cut at
    0.5 with no band, instead of MiniLM's band)."""
    if url is None:
        section = CascadeSection(low=SCORE_CUT, high=SCORE_CUT, echo_floor=floor)
        judge = Judge(
            "embedded-fused", "minilm-e5", cascade=section, sanitise=sanitise, cache=cache
        )
    else:
        low, high = (SCORE_CUT, SCORE_CUT) if fused else (LOW, HIGH)
        judge = Judge(
            ProviderSpec(kind="openai", base_url=url),
            "bench-judge",
            rerank="embedded-fused" if fused else "embedded-rerank",
            rerank_model="minilm-e5" if fused else "all-MiniLM-L6-v2",
            cascade=CascadeSection(low=low, high=high, echo_floor=floor),
            sanitise=sanitise,
            cache=cache,
        )
    with judge as j:
        got: list[JudgedQuery] = list(j.judge_many(qs, progress=False))
    return {
        v.passage_id: ((jq.rerank_scores or {})[v.passage_id], v.label or "", v.source, v.signals)
        for jq in got
        for v in jq.verdicts
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("pairs", type=Path)
    parser.add_argument("--floors", nargs="+", default=["0", "0.45"])
    parser.add_argument("--sanitise", default="flag", choices=("flag", "cut", "off"))
    parser.add_argument("--score-judge", action="store_true", help="embedded-fused, no LLM")
    parser.add_argument(
        "--fused-cascade", action="store_true", help="configs/cascade.toml's reranker and cut"
    )
    parser.add_argument("--splits", nargs="+", default=["tune", "held-out", "fresh", "fresh2"])
    args = parser.parse_args()
    high = SCORE_CUT if args.score_judge or args.fused_cascade else HIGH
    run = functools.partial(judged, sanitise=args.sanitise, fused=args.fused_cascade)
    rows = load(args.pairs)
    irrelevant = [r for r in rows if r["label"] == 0]
    relevant = {str(r["doc_id"]) for r in rows if int(r["label"]) >= 2}  # type: ignore[call-overload]
    with tempfile.TemporaryDirectory(prefix="bench-echo-") as tmp, serve() as served:
        url = None if args.score_judge else served
        cache = Path(tmp) / "cache.sqlite"
        for raw in args.floors:
            floor = None if raw == "none" else float(raw)
            clean_all = run(url, cache, floor, queries(rows, None))
            yes = [pid for pid, (s, _, _, _) in clean_all.items() if s >= high]
            kept = [pid for pid in yes if clean_all[pid][2] == "reranker"]
            precision = sum(pid in relevant for pid in kept) / max(1, len(kept))
            print(
                f"echo_floor {raw}: clean pairs {len(clean_all)}: reranker yes {len(yes)}, "
                f"sent to the LLM by the echo check {len(yes) - len(kept)} "
                f"({(len(yes) - len(kept)) / max(1, len(clean_all)):.1%} of pairs); "
                f"precision of the reranker's yes kept {precision:.2f}"
            )
            clean = run(url, cache, floor, queries(irrelevant, None))
            for split in args.splits:
                for form in [f for f in FORMS if f.split == split]:
                    attacked = run(url, cache, floor, queries(irrelevant, form))
                    shifts, alone, cascade, to_llm = [], 0, 0, 0
                    for pid, (s0, label0, src0, _) in clean.items():
                        s1, label1, src1, _ = attacked[pid]
                        shifts.append(s1 - s0)
                        alone += s0 < high <= s1
                        was_yes = src0 == "reranker" and label0 == "yes"
                        cascade += (not was_yes) and src1 == "reranker" and label1 == "yes"
                        to_llm += src1 == "judge"
                    n = len(clean)
                    print(
                        f"  {split:8s} {form.name:15s} "
                        f"score shift {statistics.fmean(shifts):+.3f}; "
                        f"flips: reranker alone {alone / n:.1%}, cascade {cascade / n:.1%}; "
                        f"to the LLM {to_llm / n:.1%}"
                    )
            sys.stdout.flush()


if __name__ == "__main__":
    main()
