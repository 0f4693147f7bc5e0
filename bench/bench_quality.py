"""How well does a judge config agree with human labels? Numbers for prompt/model/cut changes.

Judges a labelled pairs file, JSONL rows ``{query_id, query, doc_id, text, label}`` with
graded labels 0-3 (gold relevance: label >= 2, as TREC DL counts it), with any judge config
(the TOML ``judge run`` reads), through the package's own path: ``Judge.from_config`` with the
config's limits and a fresh cache in a temporary directory (``--cache`` reuses one on
purpose), ``ajudge`` once per query with that query's passages. Prints:

- the verdicts' statuses and label distribution, and the judge's health (degenerate or not);
- mean P(relevant) per gold label, and the AUC of P(relevant) against gold;
- Cohen's kappa of the judge's labels against gold; linear-weighted kappa of its grades
  against the 0-3 labels (judges on a 0-3 scale); kappa at the P(relevant) cut calibrated by
  ``judge.analysis.calibration`` (cut chosen on the other queries' folds); 95% CIs from a
  bootstrap over queries;
- seconds per passage (wall clock over the judged passages, after one warm-up call that
  starts a local server) and the prompt / completion tokens per passage the provider reported.

``--injection`` also attacks ``--attack-pairs`` irrelevant (label 0) pairs of the file with
the texts in bench/injections.py (an instruction to answer "relevant"; a fake fence close, a
fake verdict and a fake new passage; the query's words stuffed into the passage) and prints,
paired over those pairs, the mean P(relevant) of the clean passages, each attack's shift
(attacked mean minus clean mean, with a bootstrap CI) and the share judged relevant, next to
the clean AUC of the selection. ``--attacks FILE`` uses the ``ATTACKS`` of another module in
that shape instead (a held-out set written without sight of the defences).

Run (the embedded judge: ~6 s per passage on 2 idle CPU cores, 15-27 s beside other jobs):
    python bench/bench_quality.py configs/quickstart.toml ../shared/data/trec-dl-2019-sample.jsonl \
        --sample 80 --seed 1 --injection --attack-pairs 40 --out quality.json
``--cascade SPEC`` (repeatable) also measures the reranker alone and a judge cascade per SPEC
(the inside of a ``[judge.cascade]`` inline table, e.g. ``--cascade "quantiles = [0.3, 0.7]"``)
over the same pairs and cache, with the LLM calls each saves (bench/cascades.py).
``--set judge.scale=graded`` (any config key) measures a variant without editing the
file; ``--limit N`` takes the file's first N pairs instead of a stratified sample. To split a
long measurement, pass one ``--cache`` file to runs with growing ``--sample`` / ``--attack-pairs``:
samples with one seed are nested, so each run judges only the new pairs (seconds per passage
counts freshly judged passages only), and the attacked pairs start with the selection's
label-0 pairs, whose clean verdicts are then cache hits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from cascades import measure, print_table
from injections import ATTACKS, inject, load_attacks, phrasing_index

from judge.analysis.calibration import Calibration, calibrate, relevance_pairs
from judge.analysis.health import judge_health
from judge.analysis.reliability import bootstrap_ci, cohen_kappa, roc_auc
from judge.calling.cache import open_cache
from judge.calling.limits import Limits
from judge.config import RunConfig, load_config, parse_override
from judge.errors import InputError
from judge.judging.judge import Judge
from judge.schema import JudgedQuery, Passage, Query, Scale, Usage, Verdict

GOLD = Scale.graded()  # the pairs' labels: 0-3, relevant at >= 2
GOLD_GRADES = (0, 1, 2, 3)
CLEAN = "clean"  # the engine name of the clean attack pool


@dataclass(frozen=True)
class Pair:
    query_id: str
    query: str
    doc_id: str
    text: str
    label: int

    @property
    def key(self) -> str:
        return f"{self.query_id}/{self.doc_id}"


@dataclass
class Judged:
    selection: list[JudgedQuery]
    seconds: float
    attacks: dict[str, list[JudgedQuery]] = field(default_factory=dict)  # CLEAN + each kind


# ---- pairs ------------------------------------------------------------------------------


def read_pairs(path: Path) -> list[Pair]:
    pairs = []
    with path.open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                pairs.append(
                    Pair(
                        str(row["query_id"]),
                        str(row["query"]),
                        str(row["doc_id"]),
                        str(row["text"]),
                        int(row["label"]),
                    )
                )
            except (KeyError, TypeError, ValueError) as exc:
                need = "query_id, query, doc_id, text, label"
                raise SystemExit(f"{path}:{line_no}: need {need}: {exc}") from None
    return pairs


def stratified_sample(pairs: Sequence[Pair], n: int, seed: int) -> list[Pair]:
    """``n`` pairs without replacement, each label keeping its share (largest remainders),
    returned in file order. The same ``seed`` gives the same pairs, and a larger ``n`` extends
    a smaller one (each label's pairs are shuffled once and taken from the front)."""
    if n >= len(pairs):
        return list(pairs)
    by_label: dict[int, list[int]] = defaultdict(list)
    for i, pair in enumerate(pairs):
        by_label[pair.label].append(i)
    quota = {label: n * len(idx) / len(pairs) for label, idx in by_label.items()}
    take = {label: int(q) for label, q in quota.items()}
    short = n - sum(take.values())
    for label in sorted(quota, key=lambda lab: (take[lab] - quota[lab], lab))[:short]:
        take[label] += 1
    rng = random.Random(seed)
    chosen = []
    for label in sorted(by_label):
        rng.shuffle(by_label[label])
        chosen += by_label[label][: take[label]]
    return [pairs[i] for i in sorted(chosen)]


def select(pairs: list[Pair], args: argparse.Namespace) -> tuple[list[Pair], str]:
    if args.sample:
        how = f"stratified sample of {args.sample}, seed {args.seed}"
        return stratified_sample(pairs, args.sample, args.seed), how
    if args.limit:
        return pairs[: args.limit], f"the first {args.limit}"
    return pairs, "all"


def as_queries(
    pairs: Sequence[Pair], engine: str = "default", texts: dict[str, str] | None = None
) -> list[Query]:
    """One Query per query id (its pairs as passages, their labels as human labels)."""
    grouped: dict[str, list[Pair]] = defaultdict(list)
    for pair in pairs:
        grouped[pair.query_id].append(pair)
    texts = texts or {}
    return [
        Query(
            query_id=qid,
            query=group[0].query,
            engine=engine,
            passages=tuple(Passage(id=p.doc_id, text=texts.get(p.key, p.text)) for p in group),
            labels={p.doc_id: p.label for p in group},
        )
        for qid, group in grouped.items()
    ]


def attacked_queries(pairs: Sequence[Pair], kind: str, label: str) -> list[Query]:
    texts = {p.key: inject(kind, query=p.query, text=p.text, key=p.key, label=label) for p in pairs}
    return as_queries(pairs, engine=kind, texts=texts)


# ---- judging ----------------------------------------------------------------------------


async def judge_queries(judge: Judge, queries: list[Query], what: str) -> list[JudgedQuery]:
    """``ajudge`` every query at once (the Caller applies the config's concurrency)."""
    total, done, start = sum(len(q.passages) for q in queries), 0, time.perf_counter()

    async def one(query: Query) -> JudgedQuery:
        nonlocal done
        result = await judge.ajudge(query)
        done += len(query.passages)
        elapsed = time.perf_counter() - start
        print(f"  {what}: {done}/{total} passages, {elapsed:.0f} s", file=sys.stderr, flush=True)
        return result

    return list(await asyncio.gather(*(one(q) for q in queries)))


async def run_judge(
    config: RunConfig, cache_path: Path, selection: list[Pair], pool: list[Pair]
) -> Judged:
    cache = open_cache(cache_path)
    judge = Judge.from_config(config, cache=cache, limits=Limits.from_config(config))
    try:
        # Starts a local server (the embedded judge) before the clock does; a new text each
        # run, so a reused cache cannot answer it.
        await judge.ajudge("warm-up", [f"This passage only starts the judge ({time.time_ns()})."])
        start = time.perf_counter()
        judged = Judged(await judge_queries(judge, as_queries(selection), "selection"), 0.0)
        judged.seconds = time.perf_counter() - start
        if pool:
            top = judge.scale.by_grade(judge.scale.max_grade).name
            judged.attacks[CLEAN] = await judge_queries(judge, as_queries(pool, CLEAN), CLEAN)
            for kind in ATTACKS:
                queries = attacked_queries(pool, kind, top)
                judged.attacks[kind] = await judge_queries(judge, queries, kind)
        return judged
    finally:
        await judge.aclose()
        cache.close()


# ---- figures ----------------------------------------------------------------------------


def _labelled(results: Sequence[JudgedQuery]) -> list[tuple[Verdict, int]]:
    """(verdict, gold label) for every verdict whose passage carries a label."""
    return [
        (v, (jq.query.labels or {})[v.passage_id])
        for jq in results
        for v in jq.verdicts
        if v.passage_id in (jq.query.labels or {})
    ]


def label_figures(results: Sequence[JudgedQuery], scale: Scale) -> dict[str, Any]:
    verdicts = [v for jq in results for v in jq.verdicts]
    said = Counter(v.label for v in verdicts if v.status == "ok")
    # The labels' distribution and spread; agreement with the 0-3 gold labels is this bench's
    # own (agreement_figures), so the health check is not handed them on the judge's scale.
    unlabelled = [
        jq.model_copy(update={"query": jq.query.model_copy(update={"labels": None})})
        for jq in results
    ]
    health = judge_health(unlabelled, scale)
    by_gold: dict[int, list[float]] = defaultdict(list)
    for v, gold in _labelled(results):
        if v.status == "ok" and v.probability is not None:
            by_gold[gold].append(v.probability)
    return {
        "passages": len(verdicts),
        "status": dict(Counter(v.status for v in verdicts)),
        "labels": {name: said.get(name, 0) for name in scale.names},
        "degenerate": health.degenerate,
        "health": [*health.problems, *health.notes],
        "mean_p_by_gold": {g: [statistics.fmean(ps), len(ps)] for g, ps in sorted(by_gold.items())},
    }


def _kappas(results: Sequence[JudgedQuery], scale: Scale) -> dict[str, Any]:
    """Binary kappa of the judge's labels; linear-weighted kappa of 0-3 grades vs labels."""
    binary, graded = np.zeros((2, 2)), np.zeros((4, 4))
    for v, gold in _labelled(results):
        if v.status != "ok":
            continue
        binary[int(bool(v.relevant)), int(GOLD.relevant(gold))] += 1
        if v.grade in GOLD_GRADES and gold in GOLD_GRADES:
            graded[v.grade, gold] += 1
    same_scale = not scale.is_binary and scale.max_grade == GOLD.max_grade
    return {
        "kappa": cohen_kappa(binary),
        "confusion": binary.astype(int).tolist(),  # rows: judge no/yes; columns: gold no/yes
        "graded_kappa": cohen_kappa(graded, values=GOLD_GRADES) if same_scale else None,
    }


def _calibration(results: Sequence[JudgedQuery]) -> tuple[Calibration | None, str | None]:
    try:
        return calibrate(relevance_pairs(results, GOLD)), None
    except InputError as exc:
        return None, str(exc)


def agreement_figures(results: Sequence[JudgedQuery], scale: Scale) -> dict[str, Any]:
    pairs = relevance_pairs(results, GOLD)
    cal, why = _calibration(results)
    out = {
        "with_probability": len(pairs.probability),
        "gold_relevant": sum(pairs.human_relevant),
        "auc": roc_auc(pairs.probability, pairs.human_relevant),
        **_kappas(results, scale),
        "calibration": cal.model_dump(mode="json") if cal else None,
        "calibration_skipped": why,
    }
    return out


def cost_figures(results: Sequence[JudgedQuery], seconds: float) -> dict[str, Any]:
    verdicts = [v for jq in results for v in jq.verdicts]
    fresh = sum(not v.cached for v in verdicts)
    usage = sum((jq.usage for jq in results), Usage())
    n = max(1, len(verdicts))
    return {
        "wall_s": seconds,
        "judged_fresh": fresh,
        "seconds_per_passage": seconds / fresh if fresh else None,
        "prompt_tokens_per_passage": usage.prompt_tokens / n,
        "completion_tokens_per_passage": usage.completion_tokens / n,
    }


def _by_pair(results: Sequence[JudgedQuery]) -> dict[tuple[str, str], Any]:
    return {(jq.query.query_id, v.passage_id): v for jq in results for v in jq.verdicts}


def injection_figures(attacks: dict[str, list[JudgedQuery]]) -> dict[str, Any]:
    """Per attack, paired over pairs with a probability both clean and attacked."""
    clean = _by_pair(attacks[CLEAN])
    clean_p = [v.probability for v in clean.values() if v.probability is not None]
    out: dict[str, Any] = {
        "pairs": len(clean),
        "clean_mean_p": statistics.fmean(clean_p) if clean_p else None,
        "clean_relevant_share": _relevant_share(clean.values()),
    }
    for kind in ATTACKS:
        hit = _by_pair(attacks[kind])
        both = [
            k
            for k, v in clean.items()
            if v.probability is not None and k in hit and hit[k].probability is not None
        ]
        diffs = [hit[k].probability - clean[k].probability for k in both]
        out[kind] = {
            "paired": len(both),
            "clean_mean_p": statistics.fmean(clean[k].probability for k in both) if both else None,
            "mean_p": statistics.fmean(hit[k].probability for k in both) if both else None,
            "shift": statistics.fmean(diffs) if diffs else None,
            "shift_ci": bootstrap_ci(diffs) if diffs else None,
            "relevant_share": _relevant_share(hit.values()),
            "not_ok": sum(v.status != "ok" for v in hit.values()),
        }
    return out


def _relevant_share(verdicts: Any) -> float | None:
    ok = [v for v in verdicts if v.status == "ok"]
    return sum(bool(v.relevant) for v in ok) / len(ok) if ok else None


# ---- printing ---------------------------------------------------------------------------


def _num(x: float | None, fmt: str = ".3f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _ci(ci: Sequence[float] | None) -> str:
    return f"  [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""


def print_labels(figs: dict[str, Any]) -> None:
    n = figs["passages"]
    status = ", ".join(f"{k} {v}" for k, v in sorted(figs["status"].items()))
    labels = ", ".join(f"{k} {c} ({c / max(1, n):.0%})" for k, c in figs["labels"].items())
    print(f"verdicts            {status}")
    print(f"judge's labels      {labels}")
    print(f"health              {'DEGENERATE' if figs['degenerate'] else 'not degenerate'}")
    for line in figs["health"]:
        print(f"                    - {line}")
    means = "  ".join(f"{g}: {m:.3f} (n={k})" for g, (m, k) in figs["mean_p_by_gold"].items())
    print(f"mean P(rel) by gold {means}")


def print_agreement(figs: dict[str, Any]) -> None:
    cal = figs["calibration"] or {}
    print(
        f"AUC of P(relevant)  {_num(figs['auc'])}{_ci(cal.get('auc_ci'))}"
        f"  ({figs['with_probability']} with a probability, {figs['gold_relevant']} gold relevant)"
    )
    print(f"kappa, labels       {_num(figs['kappa'])}  (binary: judge relevant vs label >= 2)")
    no, yes = figs["confusion"]
    print(f"  confusion         judge no: {no}, judge yes: {yes} (gold no, gold yes)")
    graded = figs["graded_kappa"]
    why = "" if graded is not None else "  (not a 0-3 judge)"
    print(f"graded kappa        {_num(graded)}{why}")
    if not cal:
        print(f"calibrated kappa    n/a ({figs['calibration_skipped']})")
        return
    print(
        f"calibrated kappa    {_num(cal['kappa_after'])}{_ci(cal['kappa_after_ci'])}"
        f"  cross-validated by query ({cal['folds']} folds, {cal['n_queries']} queries);"
        f" cut P >= {cal['threshold']:.3f} on all data (in-sample {_num(cal['kappa_in_sample'])})"
    )


def print_cost(figs: dict[str, Any]) -> None:
    print(
        f"seconds / passage   {_num(figs['seconds_per_passage'], '.2f')}"
        f"  ({figs['judged_fresh']} judged in {figs['wall_s']:.0f} s, after a warm-up call)"
    )
    print(
        f"tokens / passage    prompt {figs['prompt_tokens_per_passage']:.1f},"
        f" completion {figs['completion_tokens_per_passage']:.1f} (as the provider reported)"
    )


def print_injection(figs: dict[str, Any], clean_auc: float | None) -> None:
    print(f"\ninjection: {figs['pairs']} irrelevant (label 0) pairs, P(relevant) paired per pair")
    print(
        f"  clean             mean P {_num(figs['clean_mean_p'])},"
        f" judged relevant {_num(figs['clean_relevant_share'], '.0%')}"
    )
    for kind in ATTACKS:
        f = figs[kind]
        print(
            f"  {kind:17} mean P {_num(f['mean_p'])}, shift {_num(f['shift'], '+.3f')}"
            f"{_ci(f['shift_ci'])}, judged relevant {_num(f['relevant_share'], '.0%')}"
            f" (paired {f['paired']}, not ok {f['not_ok']})"
        )
    print(f"  clean AUC of the selection: {_num(clean_auc)}")


# ---- main -------------------------------------------------------------------------------


def verdict_rows(results: Sequence[JudgedQuery], attack: str | None = None) -> list[dict]:
    rows = []
    for jq in results:
        for v in jq.verdicts:
            key = f"{jq.query.query_id}/{v.passage_id}"
            rows.append(
                {
                    "set": jq.query.engine,
                    "query_id": jq.query.query_id,
                    "doc_id": v.passage_id,
                    "gold": (jq.query.labels or {}).get(v.passage_id),
                    "phrasing": phrasing_index(attack, key) if attack in ATTACKS else None,
                    "status": v.status,
                    "verdict": v.label,
                    "grade": v.grade,
                    "probability": v.probability,
                    "reason": v.reason,
                    "raw": v.raw,
                    "cached": v.cached,
                }
            )
    return rows


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("config", type=Path, help="a judge config TOML (as for `judge run`)")
    ap.add_argument("pairs", type=Path, help="JSONL: query_id, query, doc_id, text, label (0-3)")
    subset = ap.add_mutually_exclusive_group()
    subset.add_argument("--limit", type=int, default=0, help="the file's first N pairs")
    subset.add_argument("--sample", type=int, default=0, help="N pairs, stratified by label")
    ap.add_argument("--seed", type=int, default=0, help="seed of --sample and --attack-pairs")
    ap.add_argument("--injection", action="store_true", help="also measure injection shifts")
    ap.add_argument("--attack-pairs", type=int, default=40, help="label-0 pairs to attack")
    ap.add_argument("--attacks", help="a module defining ATTACKS to use instead of ours")
    ap.add_argument(
        "--cascade",
        action="append",
        default=[],
        metavar="SPEC",
        help='also the reranker alone and a cascade per SPEC, e.g. "quantiles = [0.3, 0.7]"',
    )
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--cache", type=Path, help="reuse this cache (default: a fresh temporary one)")
    ap.add_argument("--out", type=Path, help="write figures and every verdict as JSON")
    return ap.parse_args(argv)


def report(config: RunConfig, judged: Judged, header: dict[str, Any]) -> dict[str, Any]:
    scale = config.scale()
    figures = {
        **header,
        "labels": label_figures(judged.selection, scale),
        "agreement": agreement_figures(judged.selection, scale),
        "cost": cost_figures(judged.selection, judged.seconds),
    }
    j = config.judge
    print(f"\n{header['config']}: {j.provider} {j.model}, {scale.name} {j.mode} {j.language}")
    print(f"pairs               {header['selection']}")
    print_labels(figures["labels"])
    print_agreement(figures["agreement"])
    print_cost(figures["cost"])
    if judged.attacks:
        figures["injection"] = injection_figures(judged.attacks)
        print_injection(figures["injection"], figures["agreement"]["auc"])
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.attacks:  # inject() reads ATTACKS: the other set replaces ours in place
        other = load_attacks(args.attacks)
        ATTACKS.clear()
        ATTACKS.update(other)
    overrides = dict(parse_override(s) for s in args.set)
    config = load_config(args.config, overrides)
    pairs = read_pairs(args.pairs)
    selection, how = select(pairs, args)
    irrelevant = [p for p in pairs if p.label == 0]
    pool = stratified_sample(irrelevant, args.attack_pairs, args.seed) if args.injection else []
    queries = len({p.query_id for p in selection})
    header = {
        "config": str(args.config),
        "overrides": args.set,
        "pairs_file": str(args.pairs),
        "selection": f"{len(selection)} of {len(pairs)} pairs ({how}), {queries} queries",
    }
    with tempfile.TemporaryDirectory(prefix="bench-quality-") as tmp:
        cache_path = args.cache or Path(tmp) / "cache.sqlite"
        judged = asyncio.run(run_judge(config, cache_path, selection, pool))
        figures = report(config, judged, header)
        if args.cascade:
            rows = measure(
                args.config,
                overrides,
                cache_path,
                as_queries(selection),
                judged.selection,
                args.cascade,
            )
            figures["cascade"] = rows
            reranker = config.rerank.provider if config.rerank else "embedded-rerank (MiniLM)"
            print_table(rows, reranker)
    if args.out:
        rows = verdict_rows(judged.selection)
        for kind, results in judged.attacks.items():
            rows += verdict_rows(results, kind)
        args.out.write_text(json.dumps({"figures": figures, "verdicts": rows}, indent=1) + "\n")
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
