"""Report sections about human labels: the judge's agreement with them, and each metric
corrected by them (judge-only, human-only and prediction-powered, with 95% CIs)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from judge.analysis.ppi import Estimate
from judge.analysis.stability import EngineStability
from judge.report.blocks import Chart, Section, Table, Text
from judge.report.summary import Summary


def agreement_section(engines: Mapping[str, EngineStability]) -> Section | None:
    """Judge vs the rows' human labels: each repeat's verdict counts once."""
    rows: list[list[Any]] = []
    blocks: list[Text | Table | Chart] = []
    for engine, est in engines.items():
        if est.agreement is None:
            continue
        a = est.agreement.per_judgement
        rows.append(
            [engine, a.n, a.accuracy, a.relevance_accuracy, a.kappa, a.weighted_kappa, a.auc]
        )
        confusion = [[f"human {lab}", *row] for lab, row in zip(a.labels, a.confusion, strict=True)]
        blocks.append(Text(f"{engine}: human (rows) x judge (columns)"))
        blocks.append(Table(["", *a.labels], confusion, frozenset(range(1, len(a.labels) + 1))))
    if not rows:
        return None
    head = ["engine", "n", "accuracy", "relevance accuracy", "kappa", "weighted kappa", "AUC"]
    table = Table(head, rows, frozenset(range(1, len(head))))
    return Section("agreement", "Agreement with human labels", [table, *blocks])


def _est(e: Estimate | None) -> str:
    return "—" if e is None else f"{e.mean:.4f} [{e.ci_low:.4f}, {e.ci_high:.4f}] n={e.n}"


def corrected_section(summary: Summary) -> Section | None:
    """Each label-free metric three ways, where some queries carry human labels."""
    rows: list[list[Any]] = []
    for engine, metrics in summary.corrected.items():
        for m in metrics:
            if m.judge_only is None and m.human_only is None and m.corrected is None:
                continue
            narrower = None if m.narrower is None else f"{m.narrower:.0%}"
            rows.append(
                [
                    engine,
                    m.metric,
                    _est(m.judge_only),
                    _est(m.human_only),
                    _est(m.corrected),
                    narrower,
                ]
            )
    if not rows:
        return None
    head = ["engine", "metric", "judge only", "human only", "PPI-corrected", "CI narrower"]
    why = Text(
        "Judge only: every query, the judge's verdicts (precise, possibly biased). Human only: "
        "the queries whose passages all carry human labels. PPI-corrected (prediction-powered "
        "inference, power-tuned): the judge's bias measured on the labelled queries and removed, "
        "its precision kept; 'CI narrower' compares its 95% CI with the human-only one. These "
        "CIs are normal approximations (PPI's own), cut to [0, 1]: the Metrics table's are a "
        "bootstrap over queries, so the judge-only ones differ from it slightly.",
        "muted",
    )
    return Section("corrected", "Metrics corrected by human labels", [Table(head, rows), why])
