"""Calibrating the judge's relevance cut against the human labels a team has.

A judge's arg-max label cuts P(relevant) at 0.5, wherever its bias puts that. Given passages
with both a probability and a human relevance label, :func:`calibrate` picks the cut ``t``
(relevant when ``P >= t``) that maximises Cohen's kappa with the people, and says how well a
cut chosen that way generalises: the threshold is chosen on k - 1 folds of the *queries* and
scored on the held-out fold (grouped k-fold, so passages of one query never sit on both
sides), and the pooled out-of-fold decisions give the cross-validated kappa. The final
threshold is then chosen on all the data.

Reported with 95% percentile bootstrap CIs over queries (a query's passages resampled
together): kappa of the arg-max labels (before), cross-validated kappa at the chosen cut
(after), and the AUC of P(relevant), which no cut changes. Cross-validation and the cluster
bootstrap are a few lines of numpy here; scikit-learn would bring a large dependency for them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from judge.analysis.reliability import cohen_kappa, roc_auc
from judge.errors import InputError
from judge.schema import JudgedQuery, Record, Scale

__all__ = ["Calibration", "Pairs", "calibrate", "relevance_pairs"]

MIN_PAIRS = 20


class Pairs(Record):
    """Per passage: the judge's P(relevant) and label, a human's relevance, the query."""

    probability: tuple[float, ...]
    judge_relevant: tuple[bool, ...]
    human_relevant: tuple[bool, ...]
    query: tuple[str, ...]


class Calibration(Record):
    threshold: float
    n_pairs: int
    n_queries: int
    folds: int
    kappa_before: float | None
    kappa_before_ci: tuple[float, float] | None
    kappa_after: float | None  # cross-validated, at thresholds chosen without the fold
    kappa_after_ci: tuple[float, float] | None
    kappa_in_sample: float | None  # at the final threshold on all the data (optimistic)
    auc: float | None
    auc_ci: tuple[float, float] | None


def relevance_pairs(results: Sequence[JudgedQuery], label_scale: Scale) -> Pairs:
    """Every ok verdict with a probability whose passage carries a human label; the label
    counts as relevant at ``label_scale``'s threshold."""
    prob: list[float] = []
    said: list[bool] = []
    human: list[bool] = []
    query: list[str] = []
    for jq in results:
        labels = jq.query.labels or {}
        for v in jq.verdicts:
            if v.status != "ok" or v.probability is None or v.passage_id not in labels:
                continue
            prob.append(v.probability)
            said.append(bool(v.relevant))
            human.append(label_scale.relevant(labels[v.passage_id]))
            query.append(jq.query.query_id)
    return Pairs(
        probability=tuple(prob),
        judge_relevant=tuple(said),
        human_relevant=tuple(human),
        query=tuple(query),
    )


def _kappa(decision: np.ndarray, truth: np.ndarray) -> float | None:
    table = np.zeros((2, 2))
    np.add.at(table, (decision.astype(int), truth.astype(int)), 1)
    return cohen_kappa(table)


def _best_threshold(p: np.ndarray, truth: np.ndarray) -> float:
    """The cut maximising kappa; ties go to the cut closest to 0.5 (the uncalibrated one)."""
    values = np.unique(p)
    cuts = np.unique(np.concatenate([(values[1:] + values[:-1]) / 2, [0.5, values[0]]]))
    scored = [(_kappa(p >= c, truth), c) for c in cuts]
    best = (
        max(k for k, _ in scored if k is not None)
        if any(k is not None for k, _ in scored)
        else None
    )
    if best is None:
        return 0.5
    return float(
        min(
            (c for k, c in scored if k is not None and k >= best - 1e-12),
            key=lambda c: abs(c - 0.5),
        )
    )


def _cross_validated(
    p: np.ndarray, truth: np.ndarray, groups: np.ndarray, folds: int, seed: int
) -> np.ndarray:
    """Out-of-fold decisions: each query's passages cut at a threshold chosen on the others."""
    ids = np.unique(groups)
    order = np.random.default_rng(seed).permutation(ids.size)
    fold_of = dict(zip(ids[order], np.arange(ids.size) % folds, strict=True))
    fold = np.array([fold_of[g] for g in groups])
    out = np.zeros(p.size, dtype=bool)
    for f in range(folds):
        held = fold == f
        if held.all() or not held.any():
            continue
        cut = _best_threshold(p[~held], truth[~held])
        out[held] = p[held] >= cut
    return out


def _cluster_ci(
    groups: np.ndarray, stat: Callable[[np.ndarray], float | None], n_boot: int, seed: int
) -> tuple[float, float] | None:
    """95% percentile CI of ``stat(index array)`` over bootstrap resamples of the queries."""
    ids = np.unique(groups)
    members = [np.flatnonzero(groups == g) for g in ids]
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(n_boot):
        pick = np.concatenate([members[i] for i in rng.integers(0, ids.size, ids.size)])
        value = stat(pick)
        if value is not None:
            values.append(value)
    if len(values) < n_boot // 2:
        return None
    low, high = np.quantile(values, [0.025, 0.975])
    return float(low), float(high)


def calibrate(pairs: Pairs, *, folds: int = 5, n_boot: int = 1000, seed: int = 0) -> Calibration:
    """The kappa-maximising cut on P(relevant), cross-validated over queries; see the module
    docstring. InputError with fewer than 20 pairs or without both relevant and irrelevant."""
    p = np.asarray(pairs.probability, dtype=np.float64)
    truth = np.asarray(pairs.human_relevant, dtype=bool)
    said = np.asarray(pairs.judge_relevant, dtype=bool)
    groups = np.asarray(pairs.query)
    if p.size < MIN_PAIRS or truth.all() or not truth.any():
        raise InputError(
            f"calibration needs at least {MIN_PAIRS} judged passages with a probability and a "
            f"human label, some relevant and some not; got {p.size} "
            f"({int(truth.sum())} relevant)"
        )
    folds = max(2, min(folds, np.unique(groups).size))
    threshold = _best_threshold(p, truth)
    oof = _cross_validated(p, truth, groups, folds, seed)
    return Calibration(
        threshold=threshold,
        n_pairs=int(p.size),
        n_queries=int(np.unique(groups).size),
        folds=folds,
        kappa_before=_kappa(said, truth),
        kappa_before_ci=_cluster_ci(groups, lambda i: _kappa(said[i], truth[i]), n_boot, seed),
        kappa_after=_kappa(oof, truth),
        kappa_after_ci=_cluster_ci(groups, lambda i: _kappa(oof[i], truth[i]), n_boot, seed),
        kappa_in_sample=_kappa(p >= threshold, truth),
        auc=roc_auc(p, truth),
        auc_ci=_cluster_ci(groups, lambda i: roc_auc(p[i], truth[i]), n_boot, seed),
    )
