"""How stable repeated judging is, and how well the judge agrees with human labels.

Pure functions over :class:`~judge.schema.JudgedQuery` records, one record per
(query, engine, repeat). Each repeat is treated as one rater: metric spread and bootstrap
CIs over queries, passage label flips, Krippendorff's alpha, a majority-vote consensus, and
Cohen's kappa / accuracy / ROC AUC against human grades where rows carry ``Query.labels``.
Only ``ok`` verdicts carry a label; ``unparsed`` and ``error`` verdicts are counted as
missing, never as "not relevant". Every bootstrap uses ``numpy.random.default_rng(seed)``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from judge.errors import InputError
from judge.metrics import Gain, UndefinedAP, Unjudged, metrics_for_queries
from judge.schema import JudgedQuery, Record, Scale, Usage, Verdict

AlphaLevel = Literal["nominal", "ordinal", "interval"]
FloatArray = NDArray[np.float64]
PassageKey = tuple[str, str, str]  # (query_id, engine, passage_id)

TOP_UNSTABLE = 20
# Resampled cells drawn per bootstrap block, so memory stays bounded for large datasets.
_BOOT_BLOCK_CELLS = 2_000_000


class MetricStability(Record):
    """One metric's dataset-level value across repeats, for one engine.

    ``per_repeat[i]`` is the mean over the queries where the metric is defined in repeat
    ``repeats[i]``; ``mean``/``std``/``min``/``max`` are over those per-repeat means
    (``std`` with ddof=1, 0 for a single repeat). ``max_rel_diff`` is
    max over repeat pairs of ``|m_i - m_j| / max(|m_i|, |m_j|)`` (0 when both are 0).
    ``ci_low``/``ci_high``: 95% percentile bootstrap (queries resampled) of the mean over
    queries of each query's value averaged over the repeats where it is defined.
    ``n_defined`` counts queries defined in at least one repeat, ``n_partial`` those of
    them undefined in some repeat, ``n_undefined`` queries undefined in every repeat.
    """

    metric: str
    engine: str
    repeats: tuple[int, ...]
    per_repeat: tuple[float | None, ...]
    mean: float | None
    std: float | None
    min: float | None
    max: float | None
    max_rel_diff: float | None
    n_defined: int
    n_partial: int
    n_undefined: int
    ci_low: float | None
    ci_high: float | None


class UnstablePassage(Record):
    """A passage whose ok verdicts disagree across repeats; ``grades`` maps grade -> count."""

    query_id: str
    engine: str
    passage_id: str
    grades: dict[int, int]
    n_failed: int
    disagreement: float


class FlipStats(Record):
    """Label flips across repeats, over passages with at least two ok verdicts.

    A passage flips when its ok verdicts do not all give the same grade (on a binary scale
    that is the relevant/not label). ``pairwise_disagreement`` is the mean over passages of
    ``1 - sum_c n_c (n_c - 1) / (n (n - 1))``: the share of verdict pairs that disagree.
    ``relevance_flip_rate`` counts only flips across the relevance threshold.
    """

    n_passages: int
    n_single: int
    n_flipped: int
    flip_rate: float | None
    pairwise_disagreement: float | None
    n_relevance_flipped: int
    relevance_flip_rate: float | None
    most_unstable: tuple[UnstablePassage, ...]


class AgreementStats(Record):
    """Judge vs human on labelled passages; ``confusion[h][j]`` counts human h, judge j.

    ``kappa``: unweighted Cohen's kappa on grades (on a binary scale, relevant/not).
    ``weighted_kappa``: linear weights ``|g_i - g_j| / (g_max - g_min)`` on grades.
    ``relevance_kappa``/``relevance_accuracy``: both sides cut at the scale's threshold.
    ``auc``: ROC AUC of ``Verdict.probability`` against human relevance (ties count 1/2).
    """

    n: int
    labels: tuple[str, ...]
    confusion: tuple[tuple[int, ...], ...]
    accuracy: float | None
    relevance_accuracy: float | None
    kappa: float | None
    weighted_kappa: float | None
    relevance_kappa: float | None
    n_with_probability: int
    auc: float | None


class Agreement(Record):
    """Agreement with humans, counting each repeat's verdict, and the majority vote."""

    n_failed: int
    per_judgement: AgreementStats
    majority: AgreementStats


class EngineStability(Record):
    """Everything :func:`stability_report` measures for one engine."""

    engine: str
    n_queries: int
    n_repeats: int
    metrics: dict[str, MetricStability]
    flips: FlipStats
    alpha: float | None
    majority_ties: int
    agreement: Agreement | None


class StabilityReport(Record):
    """Per-engine stability, plus alpha over all engines' passages (repeats as raters)."""

    scale: str
    alpha_level: AlphaLevel
    alpha: float | None
    n_boot: int
    seed: int
    engines: dict[str, EngineStability]


def by_engine(results: Sequence[JudgedQuery]) -> dict[str, list[JudgedQuery]]:
    """Results grouped by engine name, engines in sorted order, rows in input order."""
    groups: dict[str, list[JudgedQuery]] = defaultdict(list)
    for row in results:
        groups[row.query.engine].append(row)
    return {engine: groups[engine] for engine in sorted(groups)}


def bootstrap_ci(
    values: ArrayLike, *, n_boot: int = 2000, seed: int = 0, confidence: float = 0.95
) -> tuple[float, float] | None:
    """Percentile bootstrap CI of the mean of ``values`` (None when there are none)."""
    data = np.asarray(values, dtype=np.float64)
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if data.size == 0:
        return None
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    step = max(1, _BOOT_BLOCK_CELLS // data.size)
    for start in range(0, n_boot, step):
        stop = min(n_boot, start + step)
        picks = rng.integers(0, data.size, size=(stop - start, data.size))
        means[start:stop] = data[picks].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


def _masked_mean(grid: FloatArray, axis: int) -> FloatArray:
    """Mean over the non-NaN cells along ``axis``; NaN where none (without a warning)."""
    defined = ~np.isnan(grid)
    sums = np.where(defined, grid, 0.0).sum(axis=axis)
    counts = defined.sum(axis=axis)
    means: FloatArray = np.full(sums.shape, np.nan)
    np.divide(sums, counts, out=means, where=counts > 0)
    return means


def _max_rel_diff(means: FloatArray) -> float | None:
    if means.size == 0:
        return None
    diff = np.abs(means[:, None] - means[None, :])
    scale = np.maximum(np.abs(means[:, None]), np.abs(means[None, :]))
    rel = np.divide(diff, scale, out=np.zeros_like(diff), where=scale > 0)
    return float(rel.max())


def _optional(value: np.floating | float) -> float | None:
    return None if np.isnan(value) else float(value)


def metric_stability(
    results: Sequence[JudgedQuery], metrics: Sequence[str], *, n_boot: int = 2000, seed: int = 0
) -> dict[str, MetricStability]:
    """Per metric, how its dataset-level mean moves across repeats (one engine's results)."""
    engines = {row.query.engine for row in results}
    if len(engines) > 1:
        raise ValueError(f"metric_stability takes one engine, got {sorted(engines)}")
    engine = engines.pop() if engines else ""
    repeats = sorted({row.repeat for row in results})
    query_ids = sorted({row.query.query_id for row in results})
    q_pos = {qid: i for i, qid in enumerate(query_ids)}
    r_pos = {rep: j for j, rep in enumerate(repeats)}
    out: dict[str, MetricStability] = {}
    for name in metrics:
        grid = np.full((len(query_ids), len(repeats)), np.nan)
        for row in results:
            value = row.metrics.get(name)
            if value is not None:
                grid[q_pos[row.query.query_id], r_pos[row.repeat]] = value
        defined = ~np.isnan(grid)
        per_repeat = _masked_mean(grid, axis=0)
        means = per_repeat[~np.isnan(per_repeat)]
        per_query = _masked_mean(grid, axis=1)
        ci = bootstrap_ci(per_query[~np.isnan(per_query)], n_boot=n_boot, seed=seed)
        std = float(np.std(means, ddof=1)) if means.size >= 2 else 0.0
        any_defined = defined.any(axis=1)
        out[name] = MetricStability(
            metric=name,
            engine=engine,
            repeats=tuple(repeats),
            per_repeat=tuple(_optional(m) for m in per_repeat),
            mean=float(means.mean()) if means.size else None,
            std=std if means.size else None,
            min=float(means.min()) if means.size else None,
            max=float(means.max()) if means.size else None,
            max_rel_diff=_max_rel_diff(means),
            n_defined=int(any_defined.sum()),
            n_partial=int((any_defined & ~defined.all(axis=1)).sum()),
            n_undefined=int((~any_defined).sum()),
            ci_low=ci[0] if ci else None,
            ci_high=ci[1] if ci else None,
        )
    return out


def _by_passage(results: Sequence[JudgedQuery]) -> dict[PassageKey, dict[int, Verdict]]:
    """Every passage's verdicts keyed by repeat, passages in first-seen order."""
    table: dict[PassageKey, dict[int, Verdict]] = defaultdict(dict)
    for row in results:
        for verdict in row.verdicts:
            key = (row.query.query_id, row.query.engine, verdict.passage_id)
            table[key][row.repeat] = verdict
    return table


def _disagreement(counts: Sequence[int]) -> float:
    """Share of unordered verdict pairs that disagree: 1 - sum n_c(n_c-1) / (n(n-1))."""
    n = sum(counts)
    return 1.0 - sum(c * (c - 1) for c in counts) / (n * (n - 1))


def passage_flips(results: Sequence[JudgedQuery], scale: Scale | None = None) -> FlipStats:
    """Label flips per (query, engine, passage) across repeats; see :class:`FlipStats`.

    Relevance is ``scale.relevant(grade)`` when ``scale`` is given, else ``Verdict.relevant``.
    """
    unstable: list[UnstablePassage] = []
    n_passages = n_single = n_relevance = n_relevance_flipped = 0
    total_disagreement = 0.0
    for (query_id, engine, passage_id), verdicts in _by_passage(results).items():
        ok = [v for v in verdicts.values() if v.status == "ok"]
        if len(ok) < 2:
            n_single += 1
            continue
        n_passages += 1
        grades = Counter(v.grade for v in ok if v.grade is not None)
        disagreement = _disagreement(list(grades.values()))
        total_disagreement += disagreement
        relevance = {
            scale.relevant(v.grade) if scale and v.grade is not None else v.relevant for v in ok
        }
        if None not in relevance:
            n_relevance += 1
            n_relevance_flipped += len(relevance) > 1
        if len(grades) > 1:
            unstable.append(
                UnstablePassage(
                    query_id=query_id,
                    engine=engine,
                    passage_id=passage_id,
                    grades=dict(sorted(grades.items())),
                    n_failed=len(verdicts) - len(ok),
                    disagreement=disagreement,
                )
            )
    unstable.sort(
        key=lambda p: (-p.disagreement, -sum(p.grades.values()), p.query_id, p.engine, p.passage_id)
    )
    return FlipStats(
        n_passages=n_passages,
        n_single=n_single,
        n_flipped=len(unstable),
        flip_rate=len(unstable) / n_passages if n_passages else None,
        pairwise_disagreement=total_disagreement / n_passages if n_passages else None,
        n_relevance_flipped=n_relevance_flipped,
        relevance_flip_rate=n_relevance_flipped / n_relevance if n_relevance else None,
        most_unstable=tuple(unstable[:TOP_UNSTABLE]),
    )


def _alpha_deltas(level: AlphaLevel, values: FloatArray, n_c: FloatArray) -> FloatArray:
    """Krippendorff's squared difference delta^2_ck between the sorted distinct values.

    nominal: 1 if c != k; interval: (c - k)^2;
    ordinal: (sum_{g=c..k} n_g - (n_c + n_k) / 2)^2, with n_g the coincidence marginals.
    """
    if level == "nominal":
        return 1.0 - np.eye(values.size)
    if level == "interval":
        return np.subtract.outer(values, values) ** 2
    idx = np.arange(values.size)
    low, high = np.minimum.outer(idx, idx), np.maximum.outer(idx, idx)
    cum = np.cumsum(n_c)
    between = cum[high] - cum[low] + n_c[low]
    return np.asarray((between - (n_c[low] + n_c[high]) / 2.0) ** 2, dtype=np.float64)


def krippendorff_alpha(matrix: ArrayLike, level: AlphaLevel) -> float | None:
    """Krippendorff's alpha for a units x raters matrix, NaN where a rater gave no value.

    Coincidence matrix: o_ck = sum over units u with m_u >= 2 values of
    (number of ordered c-k pairs from different raters in u) / (m_u - 1); n_c = sum_k o_ck,
    n = sum_c n_c. Then alpha = 1 - (n - 1) sum o_ck delta^2_ck / sum n_c n_k delta^2_ck.
    Returns None when alpha is undefined (0/0): no unit has two values, or every pairable
    value is the same, so there is no variation to agree on.
    """
    data = np.asarray(matrix, dtype=np.float64)
    if data.ndim != 2:
        raise ValueError(f"expected a units x raters matrix, got shape {data.shape}")
    present = ~np.isnan(data)
    values = np.unique(data[present])
    if values.size < 2:
        return None
    counts = np.zeros((data.shape[0], values.size))
    np.add.at(counts, (np.nonzero(present)[0], np.searchsorted(values, data[present])), 1.0)
    per_unit = counts.sum(axis=1)
    pairable = per_unit >= 2
    counts, per_unit = counts[pairable], per_unit[pairable]
    weighted = counts / (per_unit - 1.0)[:, None]
    coincidence = weighted.T @ counts - np.diag(weighted.sum(axis=0))
    n_c = coincidence.sum(axis=1)
    delta = _alpha_deltas(level, values, n_c)
    expected = float(n_c @ delta @ n_c)
    if expected <= 0.0:
        return None
    return float(1.0 - (n_c.sum() - 1.0) * float((coincidence * delta).sum()) / expected)


def _grade_matrix(results: Sequence[JudgedQuery]) -> FloatArray:
    """Passages x repeats grades of ok verdicts, NaN where a repeat has no ok verdict."""
    table = _by_passage(results)
    repeats = sorted({row.repeat for row in results})
    column = {rep: j for j, rep in enumerate(repeats)}
    grid = np.full((len(table), len(repeats)), np.nan)
    for i, verdicts in enumerate(table.values()):
        for rep, verdict in verdicts.items():
            if verdict.status == "ok" and verdict.grade is not None:
                grid[i, column[rep]] = verdict.grade
    return grid


def cohen_kappa(confusion: ArrayLike, values: Sequence[float] | None = None) -> float | None:
    """Cohen's kappa of a square table (rows: rater A, columns: rater B).

    kappa = 1 - sum w_ij p_ij / sum w_ij e_ij with p the observed proportions and
    e_ij = p_i. * p_.j; w_ij = 1 if i != j (unweighted) or, given category ``values``,
    linear weights |v_i - v_j| / (max v - min v). None when there is no data or chance
    disagreement is 0 (both raters used one and the same category).
    """
    table = np.asarray(confusion, dtype=np.float64)
    total = table.sum()
    if total == 0:
        return None
    if values is None:
        weights = 1.0 - np.eye(table.shape[0])
    else:
        cats = np.asarray(values, dtype=np.float64)
        weights = np.abs(np.subtract.outer(cats, cats)) / (cats.max() - cats.min())
    observed = table / total
    expected = np.outer(observed.sum(axis=1), observed.sum(axis=0))
    chance = float((weights * expected).sum())
    if chance == 0.0:
        return None
    return 1.0 - float((weights * observed).sum()) / chance


def roc_auc(scores: ArrayLike, positive: ArrayLike) -> float | None:
    """ROC AUC by Mann-Whitney: P(score_pos > score_neg) + P(tie) / 2.

    AUC = (R_pos - n_pos (n_pos + 1) / 2) / (n_pos n_neg), R_pos the sum of the positives'
    mid-ranks (tied scores share their average rank). None if either class is empty.
    """
    s = np.asarray(scores, dtype=np.float64)
    pos = np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    mid_rank = np.cumsum(counts) - (counts - 1) / 2.0
    rank_sum = float(mid_rank[inverse][pos].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def _majority(grades: Sequence[int]) -> tuple[int, bool]:
    """The most frequent grade and whether it tied; a tie keeps the lowest tied grade."""
    counts = Counter(grades)
    top = max(counts.values())
    tied = sorted(g for g, c in counts.items() if c == top)
    return tied[0], len(tied) > 1


def _consensus(passage_id: str, verdicts: Sequence[Verdict]) -> tuple[Verdict, bool]:
    ok = [v for v in verdicts if v.status == "ok" and v.grade is not None]
    rank = min(v.rank for v in verdicts)
    usage = sum((v.usage for v in verdicts), Usage())
    if not ok:
        unparsed = sum(v.status == "unparsed" for v in verdicts)
        status: Literal["unparsed", "error"] = "unparsed" if unparsed else "error"
        note = f"no ok verdict in {len(verdicts)} repeats ({unparsed} unparsed)"
        return Verdict(
            passage_id=passage_id, rank=rank, status=status, error=note, usage=usage
        ), False
    grade, tied = _majority([v.grade for v in ok if v.grade is not None])
    pick = next(v for v in ok if v.grade == grade)
    probs = [v.probability for v in ok if v.probability is not None]
    tally = ", ".join(f"{g} x{c}" for g, c in sorted(Counter(v.grade for v in ok).items()))
    reason = f"majority of {len(ok)} ok verdicts (grade x count: {tally})"
    consensus = Verdict(
        passage_id=passage_id,
        rank=rank,
        status="ok",
        label=pick.label,
        grade=grade,
        relevant=pick.relevant,
        probability=float(np.mean(probs)) if probs else None,
        reason=reason + ("; tie, lower grade kept" if tied else ""),
        usage=usage,
    )
    return consensus, tied


def _vote(results: Sequence[JudgedQuery]) -> tuple[list[JudgedQuery], int]:
    groups: dict[tuple[str, str], list[JudgedQuery]] = defaultdict(list)
    for row in results:
        groups[row.query.key].append(row)
    voted: list[JudgedQuery] = []
    ties = 0
    for rows in groups.values():
        per_passage: dict[str, list[Verdict]] = defaultdict(list)
        for row in sorted(rows, key=lambda r: r.repeat):
            for verdict in row.verdicts:
                per_passage[verdict.passage_id].append(verdict)
        verdicts: list[Verdict] = []
        for passage_id, seen in per_passage.items():
            consensus, tied = _consensus(passage_id, seen)
            verdicts.append(consensus)
            ties += tied
        voted.append(
            JudgedQuery(
                query=rows[0].query,
                repeat=0,
                scale=rows[0].scale,
                verdicts=tuple(sorted(verdicts, key=lambda v: v.rank)),
                metrics={},
                usage=sum((row.usage for row in rows), Usage()),
            )
        )
    return voted, ties


def majority_vote(
    results: Sequence[JudgedQuery],
    metric_names: Sequence[str] = (),
    scale: Scale | None = None,
    *,
    gain: Gain = "linear",
    unjudged: Unjudged = "undefined",
    undefined_ap: UndefinedAP = "nan",
) -> list[JudgedQuery]:
    """One consensus JudgedQuery per (query, engine), in first-seen order.

    Each passage gets the most frequent grade among its ok verdicts; a tie keeps the lowest
    tied grade (on a binary scale: not relevant) and says so in ``Verdict.reason``. The
    probability is the mean of the ok verdicts' probabilities. A passage with no ok verdict
    stays ``unparsed`` (or ``error``). ``repeat`` is 0: the schema has no "consensus" value.
    ``metrics`` holds ``metric_names`` recomputed from the consensus verdicts with
    :func:`judge.metrics.metrics_for_queries` (same options as the run), which needs ``scale``.
    """
    voted = _vote(results)[0]
    if not metric_names or not voted:
        return voted
    if scale is None:
        raise ValueError("majority_vote needs the scale to recompute metrics")
    values = metrics_for_queries(
        metric_names,
        [(row.query, row.verdicts) for row in voted],
        scale,
        gain=gain,
        unjudged=unjudged,
        undefined_ap=undefined_ap,
    )
    return [row.model_copy(update={"metrics": m}) for row, m in zip(voted, values, strict=True)]


def _labelled(
    rows: Sequence[JudgedQuery], scale: Scale
) -> tuple[list[int], list[int], list[float], int]:
    """(human grade, judge grade, probability or NaN) for ok verdicts on labelled passages."""
    human: list[int] = []
    judged: list[int] = []
    probs: list[float] = []
    failed = 0
    grades = {label.grade for label in scale.labels}
    for row in rows:
        labels = row.query.labels or {}
        for verdict in row.verdicts:
            truth = labels.get(verdict.passage_id)
            if truth is None:
                continue
            if truth not in grades:
                raise InputError(
                    f"query '{row.query.query_id}': human grade {truth} for passage "
                    f"'{verdict.passage_id}' is not on scale '{scale.name}'",
                    field="labels",
                )
            if verdict.status != "ok" or verdict.grade is None:
                failed += 1
                continue
            human.append(truth)
            judged.append(verdict.grade)
            probs.append(np.nan if verdict.probability is None else verdict.probability)
    return human, judged, probs, failed


def _agreement_stats(
    human: Sequence[int], judged: Sequence[int], probs: Sequence[float], scale: Scale
) -> AgreementStats:
    grades = sorted(label.grade for label in scale.labels)
    h, j = np.asarray(human, dtype=np.int64), np.asarray(judged, dtype=np.int64)
    confusion = np.zeros((len(grades), len(grades)), dtype=np.int64)
    np.add.at(confusion, (np.searchsorted(grades, h), np.searchsorted(grades, j)), 1)
    h_rel, j_rel = h >= scale.threshold, j >= scale.threshold
    relevance = np.array(
        [
            [np.sum(~h_rel & ~j_rel), np.sum(~h_rel & j_rel)],
            [np.sum(h_rel & ~j_rel), np.sum(h_rel & j_rel)],
        ]
    )
    p = np.asarray(probs, dtype=np.float64)
    has_prob = ~np.isnan(p)
    n = int(h.size)
    return AgreementStats(
        n=n,
        labels=tuple(scale.by_grade(g).name for g in grades),
        confusion=tuple(tuple(int(c) for c in line) for line in confusion),
        accuracy=float(np.mean(h == j)) if n else None,
        relevance_accuracy=float(np.mean(h_rel == j_rel)) if n else None,
        kappa=cohen_kappa(confusion),
        weighted_kappa=cohen_kappa(confusion, values=grades),
        relevance_kappa=cohen_kappa(relevance),
        n_with_probability=int(has_prob.sum()),
        auc=roc_auc(p[has_prob], h_rel[has_prob]),
    )


def human_agreement(results: Sequence[JudgedQuery], scale: Scale) -> Agreement | None:
    """Judge vs human grades (``Query.labels``); None when no judged passage has a label.

    ``per_judgement`` counts every repeat's ok verdict as its own judgement; ``majority``
    uses one :func:`majority_vote` verdict per passage. Non-ok verdicts on labelled
    passages are left out and counted in ``n_failed``.
    """
    human, judged, probs, failed = _labelled(results, scale)
    if not human and not failed:
        return None
    m_human, m_judged, m_probs, _ = _labelled(_vote(results)[0], scale)
    return Agreement(
        n_failed=failed,
        per_judgement=_agreement_stats(human, judged, probs, scale),
        majority=_agreement_stats(m_human, m_judged, m_probs, scale),
    )


def stability_report(
    results: Sequence[JudgedQuery],
    metrics: Sequence[str],
    scale: Scale,
    *,
    n_boot: int = 2000,
    seed: int = 0,
) -> StabilityReport:
    """All of the above per engine, plus alpha over every engine's passages.

    Alpha treats repeats as raters and (query, engine, passage) as units, on the nominal
    level for a binary scale and the ordinal level otherwise.
    """
    other = sorted({row.scale for row in results} - {scale.name})
    if other:
        raise InputError(f"results were judged on scale {other}, not '{scale.name}'", field="scale")
    level: AlphaLevel = "nominal" if scale.is_binary else "ordinal"
    engines: dict[str, EngineStability] = {}
    for engine, rows in by_engine(results).items():
        ties = _vote(rows)[1]
        engines[engine] = EngineStability(
            engine=engine,
            n_queries=len({row.query.query_id for row in rows}),
            n_repeats=len({row.repeat for row in rows}),
            metrics=metric_stability(rows, metrics, n_boot=n_boot, seed=seed),
            flips=passage_flips(rows, scale),
            alpha=krippendorff_alpha(_grade_matrix(rows), level),
            majority_ties=ties,
            agreement=human_agreement(rows, scale),
        )
    return StabilityReport(
        scale=scale.name,
        alpha_level=level,
        alpha=krippendorff_alpha(_grade_matrix(results), level),
        n_boot=n_boot,
        seed=seed,
        engines=engines,
    )
