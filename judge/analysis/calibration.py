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

Graded scales (:func:`calibrate_grades`): the same for cut points ``c_1 < ... < c_G`` on the
judge's expected grade ``E[g]`` (grade ``g_j``, ``j = #{i: c_i <= E[g]}``;
:mod:`judge.metrics.cuts`), chosen to maximise linear-weighted kappa with human grades on the
judge's own scale (:mod:`judge.analysis.cutpoints` says how), with the same grouped folds and
query bootstrap: weighted kappa of the arg-max grades (before), of E[g] rounded to the nearest
grade, out of fold at the chosen cuts (after), and the AUC of E[g] for relevance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from judge.analysis.cutpoints import best_cuts, grade_kappa
from judge.analysis.reliability import cohen_kappa, roc_auc
from judge.errors import InputError
from judge.metrics.cuts import cut_index, midpoint_cuts, scale_grades
from judge.schema import JudgedQuery, Record, Scale

__all__ = [
    "Calibration",
    "GradeCalibration",
    "GradePairs",
    "Pairs",
    "calibrate",
    "calibrate_grades",
    "cluster_ci",
    "grade_pairs",
    "relevance_pairs",
]

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


def _fold_of(groups: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """Each passage's fold: the queries shuffled (``seed``) and dealt round the folds."""
    ids = np.unique(groups)
    order = np.random.default_rng(seed).permutation(ids.size)
    fold_of = dict(zip(ids[order], np.arange(ids.size) % folds, strict=True))
    return np.array([fold_of[g] for g in groups])


def _cross_validated(
    p: np.ndarray, truth: np.ndarray, groups: np.ndarray, folds: int, seed: int
) -> np.ndarray:
    """Out-of-fold decisions: each query's passages cut at a threshold chosen on the others."""
    fold = _fold_of(groups, folds, seed)
    out = np.zeros(p.size, dtype=bool)
    for f in range(folds):
        held = fold == f
        if held.all() or not held.any():
            continue
        cut = _best_threshold(p[~held], truth[~held])
        out[held] = p[held] >= cut
    return out


def cluster_ci(
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
        kappa_before_ci=cluster_ci(groups, lambda i: _kappa(said[i], truth[i]), n_boot, seed),
        kappa_after=_kappa(oof, truth),
        kappa_after_ci=cluster_ci(groups, lambda i: _kappa(oof[i], truth[i]), n_boot, seed),
        kappa_in_sample=_kappa(p >= threshold, truth),
        auc=roc_auc(p, truth),
        auc_ci=cluster_ci(groups, lambda i: roc_auc(p[i], truth[i]), n_boot, seed),
    )


# --- graded scales: cut points on the expected grade ----------------------------------------


class GradePairs(Record):
    """Per passage: the judge's expected grade and arg-max grade, a human's grade, the query."""

    expected_grade: tuple[float, ...]
    judge_grade: tuple[int, ...]
    human_grade: tuple[int, ...]
    query: tuple[str, ...]


class GradeCalibration(Record):
    """Cut points on the expected grade, and linear-weighted kappa with people before/after."""

    scale: str
    grades: tuple[int, ...]
    cuts: tuple[float, ...]
    n_pairs: int
    n_queries: int
    folds: int
    kappa_before: float | None  # the judge's arg-max grades
    kappa_before_ci: tuple[float, float] | None
    kappa_rounded: float | None  # E[g] rounded to the nearest grade (the midpoint cuts)
    kappa_after: float | None  # cross-validated, at cuts chosen without the fold
    kappa_after_ci: tuple[float, float] | None
    kappa_in_sample: float | None  # at the final cuts on all the data (optimistic)
    auc: float | None  # of E[g], for relevance at the scale's threshold
    auc_ci: tuple[float, float] | None


def grade_pairs(results: Sequence[JudgedQuery], scale: Scale) -> GradePairs:
    """Every ok verdict with an expected grade whose passage carries a human grade; the grades
    must be on ``scale``, the judge's own (InputError naming the passage otherwise)."""
    on_scale = set(scale_grades(scale))
    rows: list[tuple[float, int, int, str]] = []
    for jq in results:
        labels = jq.query.labels or {}
        for v in jq.verdicts:
            human = labels.get(v.passage_id)
            if v.status != "ok" or v.expected_grade is None or v.grade is None or human is None:
                continue
            if human not in on_scale:
                raise InputError(
                    f"query '{jq.query.query_id}': human grade {human} for passage "
                    f"'{v.passage_id}' is not on the judge's scale '{scale.name}'",
                    field="labels",
                )
            rows.append((v.expected_grade, v.grade, human, jq.query.query_id))
    expected, judged, human_grades, query = zip(*rows, strict=True) if rows else ((), (), (), ())
    return GradePairs(
        expected_grade=tuple(expected),
        judge_grade=tuple(judged),
        human_grade=tuple(human_grades),
        query=tuple(query),
    )


def _cross_validated_grades(
    e: np.ndarray,
    human: np.ndarray,
    groups: np.ndarray,
    grades: tuple[int, ...],
    folds: int,
    seed: int,
) -> np.ndarray:
    """Out-of-fold grade positions: each query's passages cut where the others put the cuts."""
    fold = _fold_of(groups, folds, seed)
    out = cut_index(e, midpoint_cuts(grades))
    for f in range(folds):
        held = fold == f
        if held.all() or not held.any():
            continue
        out[held] = cut_index(e[held], best_cuts(e[~held], human[~held], grades))
    return out


def calibrate_grades(
    pairs: GradePairs, scale: Scale, *, folds: int = 5, n_boot: int = 1000, seed: int = 0
) -> GradeCalibration:
    """The weighted-kappa-maximising cut points on E[g], cross-validated over queries; see the
    module docstring. InputError with fewer than 20 pairs or a single human grade."""
    grades = scale_grades(scale)
    e = np.asarray(pairs.expected_grade, dtype=np.float64)
    human = np.searchsorted(grades, np.asarray(pairs.human_grade, dtype=np.int64))
    judged = np.searchsorted(grades, np.asarray(pairs.judge_grade, dtype=np.int64))
    groups = np.asarray(pairs.query)
    if e.size < MIN_PAIRS or np.unique(human).size < 2:
        raise InputError(
            f"graded calibration needs at least {MIN_PAIRS} judged passages with an expected "
            "grade (a graded judge asked with logprobs) and a human grade, of at least two "
            f"different grades; got {e.size} ({np.unique(human).size} different)"
        )
    folds = max(2, min(folds, np.unique(groups).size))
    cuts = best_cuts(e, human, grades)
    oof = _cross_validated_grades(e, human, groups, grades, folds, seed)
    relevant = np.asarray(pairs.human_grade) >= scale.threshold

    def ci(stat: Callable[[np.ndarray], float | None]) -> tuple[float, float] | None:
        return cluster_ci(groups, stat, n_boot, seed)

    return GradeCalibration(
        scale=scale.name,
        grades=grades,
        cuts=cuts,
        n_pairs=int(e.size),
        n_queries=int(np.unique(groups).size),
        folds=folds,
        kappa_before=grade_kappa(judged, human, grades),
        kappa_before_ci=ci(lambda i: grade_kappa(judged[i], human[i], grades)),
        kappa_rounded=grade_kappa(cut_index(e, midpoint_cuts(grades)), human, grades),
        kappa_after=grade_kappa(oof, human, grades),
        kappa_after_ci=ci(lambda i: grade_kappa(oof[i], human[i], grades)),
        kappa_in_sample=grade_kappa(cut_index(e, cuts), human, grades),
        auc=roc_auc(e, relevant),
        auc_ci=ci(lambda i: roc_auc(e[i], relevant[i])),
    )
