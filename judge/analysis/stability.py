"""How stable repeated judging is: metric spread, label flips, alpha, the bundled report.

Pure functions over :class:`~judge.schema.JudgedQuery` records, one record per
(query, engine, repeat). Each repeat is treated as one rater: metric spread and bootstrap
CIs over queries, passage label flips, Krippendorff's alpha and a majority-vote consensus.
:func:`stability_report` bundles these per engine with agreement against human grades
(:mod:`judge.agreement`); the array statistics live in :mod:`judge.reliability`.
Only ``ok`` verdicts carry a label; ``unparsed`` and ``error`` verdicts are counted as
missing, never as "not relevant". Every bootstrap uses ``numpy.random.default_rng(seed)``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

import numpy as np

from judge.analysis.agreement import Agreement, consensus_votes, human_agreement
from judge.analysis.reliability import AlphaLevel, FloatArray, bootstrap_cis, krippendorff_alpha
from judge.errors import InputError
from judge.metrics.compute import metrics_for_queries
from judge.schema import JudgedQuery, MetricPolicy, Record, Scale, Verdict

__all__ = [
    "EngineStability",
    "FlipStats",
    "MetricStability",
    "StabilityReport",
    "UnstablePassage",
    "by_engine",
    "human_agreement",
    "krippendorff_alpha",
    "majority_vote",
    "metric_stability",
    "passage_flips",
    "stability_report",
]

PassageKey = tuple[str, str, str]  # (query_id, engine, passage_id)

TOP_UNSTABLE = 20


class MetricStability(Record):
    """One metric's dataset-level value across repeats, for one engine.

    ``per_repeat[i]`` is the mean over the queries where the metric is defined in repeat
    ``repeats[i]``; ``std``/``min``/``max`` are over those per-repeat means (``std`` with
    ddof=1, 0 for a single repeat); ``mean`` is the one the CI is of (below), equal to the
    per-repeat means' mean when every query is defined in every repeat. ``max_rel_diff`` is
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
    grids = {}
    for name in metrics:
        grid = np.full((len(query_ids), len(repeats)), np.nan)
        for row in results:
            value = row.metrics.get(name)
            if value is not None:
                grid[q_pos[row.query.query_id], r_pos[row.repeat]] = value
        grids[name] = grid
    per_query_means = [_masked_mean(grid, axis=1) for grid in grids.values()]
    cis = bootstrap_cis([m[~np.isnan(m)] for m in per_query_means], n_boot=n_boot, seed=seed)
    for name, ci, by_query in zip(metrics, cis, per_query_means, strict=True):
        grid = grids[name]
        # The mean the CI is of: over queries, each its mean over the repeats defining it (a
        # mean of the repeats' means weighs a query by how many repeats defined it).
        held = by_query[~np.isnan(by_query)]
        defined = ~np.isnan(grid)
        per_repeat = _masked_mean(grid, axis=0)
        means = per_repeat[~np.isnan(per_repeat)]
        std = float(np.std(means, ddof=1)) if means.size >= 2 else 0.0
        any_defined = defined.any(axis=1)
        out[name] = MetricStability(
            metric=name,
            engine=engine,
            repeats=tuple(repeats),
            per_repeat=tuple(_optional(m) for m in per_repeat),
            mean=float(held.mean()) if held.size else None,
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


def passage_flips(
    results: Sequence[JudgedQuery],
    scale: Scale | None = None,
    table: dict[PassageKey, dict[int, Verdict]] | None = None,
) -> FlipStats:
    """Label flips per (query, engine, passage) across repeats; see :class:`FlipStats`.

    Relevance is ``scale.relevant(grade)`` when ``scale`` is given, else ``Verdict.relevant``.
    ``table``: ``results``' verdicts by passage, when already made.
    """
    unstable: list[UnstablePassage] = []
    n_passages = n_single = n_relevance = n_relevance_flipped = 0
    total_disagreement = 0.0
    table = _by_passage(results) if table is None else table
    for (query_id, engine, passage_id), verdicts in table.items():
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


def one_repeat_each(results: Sequence[JudgedQuery]) -> bool:
    """Whether no (query, engine) has more than one row: a run with one repeat."""
    keys = {row.query.key for row in results}
    return len(keys) == len(results)


def _no_flips(results: Sequence[JudgedQuery]) -> FlipStats:
    """:func:`passage_flips` of results with one row per (query, engine): every passage has
    at most one verdict, so none can flip."""
    single = sum(len({v.passage_id for v in row.verdicts}) for row in results)
    return FlipStats(
        n_passages=0,
        n_single=single,
        n_flipped=0,
        flip_rate=None,
        pairwise_disagreement=None,
        n_relevance_flipped=0,
        relevance_flip_rate=None,
        most_unstable=(),
    )


def _grade_matrix(
    results: Sequence[JudgedQuery], table: dict[PassageKey, dict[int, Verdict]] | None = None
) -> FloatArray:
    """Passages x repeats grades of ok verdicts, NaN where a repeat has no ok verdict."""
    table = _by_passage(results) if table is None else table
    repeats = sorted({row.repeat for row in results})
    column = {rep: j for j, rep in enumerate(repeats)}
    grid = np.full((len(table), len(repeats)), np.nan)
    for i, verdicts in enumerate(table.values()):
        for rep, verdict in verdicts.items():
            if verdict.status == "ok" and verdict.grade is not None:
                grid[i, column[rep]] = verdict.grade
    return grid


def majority_vote(
    results: Sequence[JudgedQuery],
    metric_names: Sequence[str] = (),
    scale: Scale | None = None,
    policy: MetricPolicy = MetricPolicy(),
) -> list[JudgedQuery]:
    """One consensus JudgedQuery per (query, engine), in first-seen order.

    Verdicts are voted by :func:`judge.agreement.consensus_votes`: the most frequent ok grade,
    a tie keeping the lowest tied grade (on a binary scale: not relevant), probabilities
    averaged. ``repeat`` is 0: the schema has no "consensus" value. ``metrics`` holds
    ``metric_names`` recomputed from the consensus verdicts with
    :func:`judge.metrics.metrics_for_queries` (same options as the run), which needs ``scale``.
    """
    voted = consensus_votes(results)[0]
    if not metric_names or not voted:
        return voted
    if scale is None:
        raise ValueError("majority_vote needs the scale to recompute metrics")
    values = metrics_for_queries(
        metric_names,
        [(row.query, row.verdicts) for row in voted],
        scale,
        policy,
        [row.rerank_scores for row in voted],
    )
    return [row.model_copy(update={"metrics": m}) for row, m in zip(voted, values, strict=True)]


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
    grouped = by_engine(results)
    for engine, rows in grouped.items():
        if one_repeat_each(rows):
            # Nothing to vote on or flip, and alpha needs two values of a passage: what the
            # general path gives, without a large single-repeat run paying per passage for it.
            flips, alpha, ties = _no_flips(rows), None, 0
            agreement = human_agreement(rows, scale)
        else:
            voted, ties = consensus_votes(rows)
            table = _by_passage(rows)  # once for the flips and alpha: a large run's passages
            flips = passage_flips(rows, scale, table)
            alpha = krippendorff_alpha(_grade_matrix(rows, table), level)
            agreement = human_agreement(rows, scale, voted=voted)
        engines[engine] = EngineStability(
            engine=engine,
            n_queries=len({row.query.query_id for row in rows}),
            n_repeats=len({row.repeat for row in rows}),
            metrics=metric_stability(rows, metrics, n_boot=n_boot, seed=seed),
            flips=flips,
            alpha=alpha,
            majority_ties=ties,
            agreement=agreement,
        )
    alpha = (
        next(iter(engines.values())).alpha
        if len(engines) == 1
        else krippendorff_alpha(_grade_matrix(results), level)
    )
    return StabilityReport(
        scale=scale.name,
        alpha_level=level,
        alpha=alpha,
        n_boot=n_boot,
        seed=seed,
        engines=engines,
    )
