"""The judge cascade in bench_quality.py: the reranker alone, and cascades at given bands, on
the same labelled pairs as the all-LLM run and through the same cache.

Each variant is the bench's config with ``[judge.cascade]`` set (and ``[rerank]`` the embedded
MiniLM reranker unless the config or ``--set`` names another), built with ``Judge.from_config``,
its band fitted with ``afit_cascade`` over the selection's queries (gold labels: 0-3, relevant
at >= 2) and every query judged with ``ajudge``: the package's own path, as ``judge run`` takes
it. The band passages' prompts are those of the all-LLM run, so their answers come from the
cache: a variant pays only its reranker calls, and the LLM's verdicts inside the band are the
very ones the all-LLM row scores. The reranker alone is the cascade with an empty band at 0.5
(``low = high = 0.5``): every passage labelled by the reranker, relevant when its score >= 0.5.

Per variant: the band, passages sent to the LLM, LLM calls saved (pointwise: one per passage
the reranker labelled), Cohen's kappa of the labels against gold with a 95% bootstrap CI over
queries, and the AUC of the probabilities as recorded (a cascade's mix the reranker's score
outside the band with the LLM's P(relevant) inside; the reranker's own AUC is the "reranker
alone" row). A ``max_error`` band is fitted on the same gold labels it is scored against, so
its kappa is in-sample.
"""

from __future__ import annotations

import asyncio
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from judge.analysis.calibration import cluster_ci
from judge.analysis.reliability import cohen_kappa, roc_auc
from judge.calling.cache import open_cache
from judge.calling.limits import Limits
from judge.config import RunConfig, load_config
from judge.errors import JudgeError
from judge.judging.cascade import Band
from judge.judging.judge import Judge
from judge.schema import JudgedQuery, Query, Scale

GOLD = Scale.graded()  # the pairs' labels: 0-3, relevant at >= 2
RERANKER = {"rerank.provider": "embedded-rerank", "rerank.model": "all-MiniLM-L6-v2"}
ALONE = ("reranker alone, cut 0.5", "low = 0.5, high = 0.5")


def spec_table(text: str) -> dict[str, Any]:
    """``quantiles = [0.3, 0.7]`` (the inside of a TOML inline table) as a dict."""
    try:
        table: dict[str, Any] = tomllib.loads(f"c = {{{text}}}")["c"]
    except tomllib.TOMLDecodeError as exc:
        raise SystemExit(
            f"--cascade {text!r}: not the inside of a TOML inline table: {exc}"
        ) from None
    return table


def variant_config(path: Path, overrides: dict[str, Any], spec: str) -> RunConfig:
    base = load_config(path, overrides)
    extra = {} if base.rerank is not None else RERANKER
    return load_config(path, {**overrides, **extra, "judge.cascade": spec_table(spec)})


async def run_variant(
    config: RunConfig, cache_path: Path, queries: Sequence[Query]
) -> tuple[list[JudgedQuery], Band]:
    cache = open_cache(cache_path)
    judge = Judge.from_config(config, cache=cache, limits=Limits.from_config(config))
    try:
        band = await judge.afit_cascade(queries, GOLD)
        return list(await asyncio.gather(*(judge.ajudge(q) for q in queries))), band
    finally:
        await judge.aclose()
        cache.close()


def _pairs(results: Sequence[JudgedQuery]) -> list[tuple[str, bool, bool, float | None]]:
    """(query id, said relevant, gold relevant, probability) of every ok labelled verdict."""
    return [
        (jq.query.query_id, bool(v.relevant), GOLD.relevant(labels[v.passage_id]), v.probability)
        for jq in results
        if (labels := jq.query.labels or {})
        for v in jq.verdicts
        if v.status == "ok" and v.passage_id in labels
    ]


def _kappa(rows: Sequence[tuple[str, bool, bool, float | None]]) -> float | None:
    table = np.zeros((2, 2))
    for _, said, gold, _ in rows:
        table[int(said), int(gold)] += 1
    return cohen_kappa(table)


def kappa_ci(
    rows: Sequence[tuple[str, bool, bool, float | None]], n_boot: int = 1000, seed: int = 0
) -> tuple[float, float] | None:
    """95% percentile CI of kappa over bootstrap resamples of the queries."""
    groups = np.array([row[0] for row in rows])
    return cluster_ci(groups, lambda pick: _kappa([rows[i] for i in pick]), n_boot, seed)


def figures(name: str, results: Sequence[JudgedQuery], band: Band | None) -> dict[str, Any]:
    verdicts = [v for jq in results for v in jq.verdicts]
    rows = _pairs(results)
    with_p = [(p, gold) for _, _, gold, p in rows if p is not None]
    return {
        "variant": name,
        "band": [band.low, band.high] if band else None,
        "band_how": band.how if band else None,
        "passages": len(verdicts),
        "to_llm": sum(v.source == "judge" for v in verdicts),
        "calls_saved": sum(v.source == "reranker" and v.status == "ok" for v in verdicts),
        "fresh_llm_calls": sum(v.source == "judge" and not v.cached for v in verdicts),
        "not_ok": sum(v.status != "ok" for v in verdicts),
        "kappa": _kappa(rows),
        "kappa_ci": kappa_ci(rows),
        "auc": roc_auc([p for p, _ in with_p], [g for _, g in with_p]) if with_p else None,
    }


def measure(
    path: Path,
    overrides: dict[str, Any],
    cache_path: Path,
    queries: Sequence[Query],
    llm_alone: Sequence[JudgedQuery],
    specs: Sequence[str],
) -> list[dict[str, Any]]:
    """The LLM judge alone (the run already made), the reranker alone, each ``spec``."""
    out = [figures("LLM judge alone", llm_alone, None)]
    for name, spec in (ALONE, *((s, s) for s in specs)):
        config = variant_config(path, overrides, spec)
        try:
            results, band = asyncio.run(run_variant(config, cache_path, queries))
        except JudgeError as exc:  # e.g. a max_error band on too few labelled pairs
            out.append({"variant": name, "skipped": str(exc)})
            continue
        out.append(figures(name, results, band))
    return out


def _num(x: float | None, fmt: str = ".3f") -> str:
    return "n/a" if x is None else format(x, fmt)


def print_table(rows: Sequence[dict[str, Any]], reranker: str) -> None:
    print(f"\ncascade: reranker {reranker}; kappa against gold (label >= 2), 95% CI over queries")
    print(f"  {'variant':28} {'band':16} {'to LLM':>9} {'saved':>6} {'kappa':>6} {'CI':16} AUC")
    for r in rows:
        if "skipped" in r:
            print(f"  {r['variant']:28} skipped: {r['skipped']}")
            continue
        band = "—" if r["band"] is None else f"[{r['band'][0]:.3f}, {r['band'][1]:.3f})"
        ci = f"[{r['kappa_ci'][0]:.3f}, {r['kappa_ci'][1]:.3f}]" if r["kappa_ci"] else "n/a"
        sent = f"{r['to_llm']}/{r['passages']}"
        print(
            f"  {r['variant']:28} {band:16} {sent:>9} {r['calls_saved']:>6} "
            f"{_num(r['kappa']):>6} {ci:16} {_num(r['auc'])}"
        )
        if r["not_ok"]:
            print(f"  {'':28} ({r['not_ok']} verdicts not ok)")
    print("  (saved: LLM calls the reranker's labels replaced; AUC of the recorded probabilities:")
    print("   a cascade mixes the reranker's score outside the band with the LLM's P inside)")
