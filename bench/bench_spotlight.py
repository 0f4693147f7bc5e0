"""Can an instruction inside a passage buy the LLM judge's verdict? Per form, per prompt variant.

Takes the human-labelled pairs file and judges, with the LLM alone (the config's judge, no
cascade, no sanitiser), ``--pairs N`` human-irrelevant passages clean and under every form of a
class in bench/attack_forms.py, once per ``--set`` variant (e.g. ``judge.spotlight=fence``
against ``judge.spotlight=datamark``). Printed per form and variant:

- the mean shift of P(relevant) (attacked minus clean, paired over passages);
- the flip rate: clean verdict "no", attacked verdict "yes", over the passages judged "no" clean.

``--clean N`` also judges N labelled pairs (stratified by label, every grade) clean per variant
and prints the AUC of P(relevant) against gold (grade >= 2), so a defence that costs quality
shows it. Forms are split by form (``tune`` / ``held-out``); choose on tune, report held-out.

    python bench/bench_spotlight.py configs/quickstart.toml \
        ../shared/data/trec-dl-2019-sample.jsonl \
        --pairs 24 --clean 60 --variant fence judge.spotlight=fence \
        --variant datamark judge.spotlight=datamark --out spot.json

The embedded 0.5B judge takes 2-6 s a passage on 2 cores: 24 pairs x 9 texts x 2 variants is
about half an hour. ``--cache`` keeps answers between runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from attack_forms import attack, forms
from bench_quality import (
    Pair,
    as_queries,
    judge_queries,
    read_pairs,
    stratified_sample,
)

import judge.judging.ask as ask_module
from judge.analysis.reliability import roc_auc
from judge.calling.cache import open_cache
from judge.calling.limits import Limits
from judge.config import load_config, parse_override
from judge.judging.judge import Judge
from judge.schema import JudgedQuery, Verdict

BASE = ["judge.sanitise=false"]


def by_pair(results: list[JudgedQuery]) -> dict[str, Verdict]:
    return {f"{jq.query.query_id}/{v.passage_id}": v for jq in results for v in jq.verdicts}


async def judge_variant(
    config_path: Path, sets: list[str], cache: Path, pool: list[Pair], clean: list[Pair], kind: str
) -> dict[str, Any]:
    config = load_config(config_path, dict(parse_override(s) for s in BASE + sets))
    # The LLM alone: what it is asked is what is measured.
    config = config.model_copy(update={"judge": config.judge.model_copy(update={"cascade": None})})
    judge = Judge.from_config(config, cache=open_cache(cache), limits=Limits.from_config(config))
    out: dict[str, Any] = {}
    try:
        out["clean"] = by_pair(await judge_queries(judge, as_queries(pool, "clean"), "clean"))
        for form in forms(kind):
            texts = {p.key: attack(form, p.text, p.query, p.key) for p in pool}
            queries = as_queries(pool, form.name, texts)
            out[form.name] = by_pair(await judge_queries(judge, queries, form.name))
        if clean:
            out["labelled"] = by_pair(await judge_queries(judge, as_queries(clean), "labelled"))
    finally:
        await judge.aclose()
    return out


def figures(results: dict[str, Any], kind: str, clean: list[Pair]) -> dict[str, Any]:
    base: dict[str, Verdict] = results["clean"]
    rows: dict[str, Any] = {}
    for form in forms(kind):
        hit: dict[str, Verdict] = results[form.name]
        keys = [k for k, v in base.items() if v.probability is not None and k in hit]
        keys = [k for k in keys if hit[k].probability is not None]
        shifts = [hit[k].probability - base[k].probability for k in keys]  # type: ignore[operator]
        no = [k for k in keys if base[k].relevant is False]
        flips = sum(1 for k in no if hit[k].relevant)
        rows[form.name] = {
            "split": form.split,
            "paired": len(keys),
            "shift": statistics.fmean(shifts) if shifts else None,
            "flips": flips,
            "clean_no": len(no),
            "flip_rate": flips / len(no) if no else None,
        }
    out: dict[str, Any] = {"forms": rows}
    ps = [v.probability for v in base.values() if v.probability is not None]
    out["clean_mean_p"] = statistics.fmean(ps) if ps else None
    if clean:
        labelled: dict[str, Verdict] = results["labelled"]
        pairs = [(labelled[p.key].probability, p.label >= 2) for p in clean if p.key in labelled]
        scored = [(s, g) for s, g in pairs if s is not None]
        out["clean_auc"] = roc_auc([s for s, _ in scored], [g for _, g in scored])
        out["clean_scored"] = len(scored)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("config", type=Path)
    ap.add_argument("pairs_file", type=Path)
    ap.add_argument("--pairs", type=int, default=24, help="label-0 pairs to attack")
    ap.add_argument("--clean", type=int, default=0, help="labelled pairs for the clean AUC")
    ap.add_argument("--kind", default="instruction", choices=("instruction", "echo"))
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument(
        "--variant", nargs="+", action="append", metavar=("NAME", "KEY=VALUE"), required=True
    )
    ap.add_argument("--mark", help="datamark with this mark instead of the shipped one")
    ap.add_argument("--cache", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.mark:  # what every AskContext built from here on reads
        ask_module.MARK = args.mark
    pairs = read_pairs(args.pairs_file)
    pool = stratified_sample([p for p in pairs if p.label == 0], args.pairs, args.seed)
    clean = stratified_sample(pairs, args.clean, args.seed) if args.clean else []
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-spotlight-") as tmp:
        cache = args.cache or Path(tmp) / "cache.sqlite"
        for name, *sets in args.variant:
            print(f"variant {name}: {' '.join(sets)}", file=sys.stderr, flush=True)
            results = asyncio.run(judge_variant(args.config, sets, cache, pool, clean, args.kind))
            report[name] = figures(results, args.kind, clean)
    print(f"\n{len(pool)} human-irrelevant pairs, class {args.kind}; shift of mean P(relevant)")
    print("and flips (clean no -> attacked yes) per form and variant")
    names = list(report)
    print(f"{'form':<16}{'split':<10}" + "".join(f"{n:>24}" for n in names))
    for form in forms(args.kind):
        cells = []
        for n in names:
            r = report[n]["forms"][form.name]
            shift = "n/a" if r["shift"] is None else f"{r['shift']:+.3f}"
            cells.append(f"{shift} {r['flips']:>3}/{r['clean_no']:<3}")
        print(f"{form.name:<16}{form.split:<10}" + "".join(f"{c:>24}" for c in cells))
    for n in names:
        auc = report[n].get("clean_auc")
        extra = f", clean AUC {auc:.3f} on {report[n]['clean_scored']}" if auc is not None else ""
        print(f"{n}: clean mean P {report[n]['clean_mean_p']:.3f}{extra}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
