"""Engines side by side on the same queries: unpaired means, paired differences, bootstrap
CIs, sign-flip tests, win/tie/loss counts; pooled metrics come from
:mod:`judge.analysis.judged_pool`.

Per metric and engine, a query's value is its mean over the repeats where it is defined.
*Unpaired*: an engine's mean over the query ids it defines, with a 95% CI (each engine on its
own queries; the run report's metric table shows the same numbers). *Paired*: against its
baseline B, engine A's difference over the ``n`` query ids defined for both is
``d_q = v_A(q) - v_B(q)`` and ``diff = mean_q d_q`` (paired and unpaired means disagree when
the engines define different queries). Every CI is :func:`judge.analysis.reliability.bootstrap_ci`
(percentile bootstrap, queries resampled with replacement) with ``N_BOOT`` resamples and one
seed, so the report and ``judge compare`` print the same numbers for the same run.

The p-value is two-sided from the paired randomization (sign-flip) test: under H0 each ``d_q``
is as likely to be ``-d_q``, so ``p = #{s : |mean_q s_q d_q| >= |mean_q d_q|} / #s`` over all
``2^m`` sign vectors ``s`` of the ``m`` pairs that differ (a tie flips to itself) when
``2^m <= n_permutations`` (exact), else ``(1 + hits) / (1 + n_permutations)`` over random
sign vectors. With ``m`` non-zero
differences no p-value can fall below ``2 / 2^m`` (only the observed signs and their mirror
image are as extreme): ``p_floor``. Below 6 differing pairs the test cannot reach p < 0.05
whatever the data, and a reader is told so. Every random draw uses
``numpy.random.default_rng(seed)``. Win / tie / loss count the queries where ``d_q`` is
above, at (within 1e-12) or below 0; for a lower-is-better metric (``near_dup``,
``low_quality``: :func:`judge.metrics.facts.lower_is_better`) below, at or above, and
"worse" means significantly higher.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterator, Mapping, Sequence

import numpy as np
import numpy.typing as npt
from pydantic import Field

from judge.analysis.judged_pool import (
    DEFAULT_POOLED,
    POOLED_BASES,
    PassagePool,
    parse_pooled,
    pooled_metrics,
)
from judge.analysis.reliability import bootstrap_ci
from judge.errors import ConfigError, InputError
from judge.metrics.compute import metrics_for_queries
from judge.metrics.facts import family_of, lower_is_better
from judge.metrics.facts import parse_metric_name as parse_plain
from judge.schema import JudgedQuery, MetricPolicy, Record, Scale

__all__ = [
    "DEFAULT_POOLED",
    "N_BOOT",
    "N_PERMUTATIONS",
    "SIGNIFICANCE",
    "Comparison",
    "EngineMean",
    "PairedDiff",
    "PassagePool",
    "check_metric",
    "compare",
    "engine_mean",
    "fully_judged",
    "paired_diff",
    "parse_pooled",
    "per_query_values",
    "pooled_metrics",
    "score_misses",
    "scored_when_missed",
    "sign_flip_floor",
    "sign_flip_p",
]

FloatArray = npt.NDArray[np.float64]
# The one resample count and permutation count of every CI and p-value judge prints.
N_BOOT = 10_000
N_PERMUTATIONS = 10_000
SIGNIFICANCE = 0.05
# Resampled cells per block, so memory stays bounded for many queries x many permutations.
_BLOCK_CELLS = 2_000_000
_ZERO = 1e-12


class EngineMean(Record):
    """Unpaired: an engine's mean over the ``n`` query ids where the metric is defined."""

    mean: float | None
    n: int
    ci_low: float | None = None
    ci_high: float | None = None


class PairedDiff(Record):
    """Paired: ``engine - baseline`` on the ``n`` query ids defined for both; see the module doc."""

    metric: str
    engine: str
    baseline: str
    n: int
    mean_engine: float | None
    mean_baseline: float | None
    diff: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    exact: bool
    # The smallest p the test could give these pairs; >= SIGNIFICANCE means too few of them.
    p_floor: float | None = None
    wins: int = 0
    ties: int = 0
    losses: int = 0
    # Query ids either side holds that the pairs leave out: undefined on one side (not judged
    # fully, or not held) or on both (nothing relevant found by either), or ``unlike``.
    left_out: int = 0
    # Of those, ids both sides hold that ask different questions (two runs that number their
    # queries alike, say): pairing them would compare unrelated queries.
    unlike: int = 0
    # Of those left out, ids each side holds but did not judge fully (unparsed or failed
    # verdicts): a winner over the rest may owe its lead to them.
    unjudged_engine: int = 0
    unjudged_baseline: int = 0
    # Of those left out, ids only one side holds (another night's queries, say).
    held_by_one: int = 0
    # Whether the reasons above were counted: the sides' held ids were given (and, for the
    # unjudged counts, their fully judged ones: ``judged_known``).
    reasons: bool = False
    judged_known: bool = False
    # The pairs of engines p is read against (Bonferroni): every pair of k engines when the
    # baseline is the best of k >= 3 found after the fact (the best of several equal engines
    # beats the worst by chance alone: 17% of 4 equal engines' runs had claimed a winner).
    family: int = Field(default=1, ge=1)
    # Whether the baseline never computed ``metric`` (a summary made with other [metrics]
    # names): nothing could be paired, and that is why.
    baseline_lacks: bool = False

    @property
    def p_read(self) -> float | None:
        """The p a claim of this difference is read at: ``p_value`` times :attr:`family`."""
        return None if self.p_value is None else min(1.0, self.p_value * self.family)

    @property
    def too_few(self) -> bool:
        """True when no difference, however large, could reach p < SIGNIFICANCE."""
        return self.p_floor is not None and self.p_floor >= SIGNIFICANCE

    def better(self, alpha: float = SIGNIFICANCE) -> bool:
        """Significantly better than the baseline, p < ``alpha`` (higher, or lower for a
        lower-is-better metric)."""
        if self.diff is None or self.diff == 0:
            return False
        won = self.diff < 0 if lower_is_better(self.metric) else self.diff > 0
        return won and (self.p_read or 1.0) < alpha

    def worse(self, alpha: float = SIGNIFICANCE) -> bool:
        """Significantly worse than the baseline, p < ``alpha``: lower, or higher for a
        lower-is-better metric."""
        if self.diff is None:
            return False
        lost = self.diff > 0 if lower_is_better(self.metric) else self.diff < 0
        return lost and (self.p_read or 1.0) < alpha


class Comparison(Record):
    """Everything ``judge compare`` prints; ``per_query[metric][engine][query_id]``.

    ``baselines[engine]`` is the engine it is compared with (runs of several engines compare
    engine by engine); ``baseline`` names the first argument's engine or run.
    """

    engines: tuple[str, ...]
    baseline: str
    metrics: tuple[str, ...]
    n_query_ids: int
    n_boot: int
    n_permutations: int
    seed: int
    means: dict[str, dict[str, EngineMean]]
    diffs: tuple[PairedDiff, ...]
    per_query: dict[str, dict[str, dict[str, float]]]
    baselines: dict[str, str] = Field(default_factory=dict)


def check_metric(name: str) -> None:
    """Raise ConfigError for a name that is neither a plain metric nor a pooled one."""
    if parse_pooled(name) is None:
        try:
            parse_plain(name)
        except ConfigError as exc:
            raise ConfigError(f"{exc}; compare also knows {', '.join(POOLED_BASES)}") from None


def _metric_rows(
    results: Sequence[JudgedQuery],
    names: Sequence[str],
    scale: Scale,
    policy: MetricPolicy,
) -> list[dict[str, float | None]]:
    """Per-result values: stored metrics where present, the rest recomputed from verdicts."""
    pooled = [n for n in names if parse_pooled(n) is not None]
    plain = [n for n in names if n not in pooled]
    rows: list[dict[str, float | None]] = [
        {n: jq.metrics[n] for n in plain if n in jq.metrics} for jq in results
    ]
    missing = [i for i, jq in enumerate(results) if any(n not in jq.metrics for n in plain)]
    if missing:
        fresh = metrics_for_queries(
            plain,
            [(results[i].query, results[i].verdicts) for i in missing],
            scale,
            policy,
        )
        for i, values in zip(missing, fresh, strict=True):
            rows[i] = {**values, **rows[i]}
    if pooled:
        for row, values in zip(rows, pooled_metrics(results, pooled, scale, policy), strict=True):
            row.update(values)
    return rows


def scored_when_missed(metric: str) -> bool:
    """Whether a query ``metric`` leaves undefined for one side of a comparison, and defines
    for another, counts 0 for the first: the label-free and soft metrics, undefined when a
    list holds nothing relevant (their ideal is the list's own)."""
    return family_of(metric) in ("label-free", "soft")


def score_misses(
    metric: str,
    values: Mapping[str, dict[str, float]],
    judged: Mapping[str, Collection[str]],
) -> int:
    """In place: a query some side of ``values`` (``[side][query_id]``) defines ``metric``
    for, and a side that judged it fully (``judged[side]``: every verdict answered) leaves
    undefined, counts 0 for that side: it found nothing relevant where another side found
    something. Left undefined, the query would drop out of the pairing and flatter the side
    that found nothing. Returns how many values were so scored."""
    if not scored_when_missed(metric):
        return 0
    defined = set().union(*(v.keys() for v in values.values()))
    scored = 0
    for side, held in judged.items():
        mine = values[side]
        for qid in held:
            if qid in defined and qid not in mine:
                mine[qid] = 0.0
                scored += 1
    return scored


def per_query_values(
    results: Sequence[JudgedQuery],
    names: Sequence[str],
    scale: Scale,
    policy: MetricPolicy = MetricPolicy(),
) -> dict[str, dict[str, dict[str, float]]]:
    """``[metric][engine][query_id]`` = mean over the repeats where the value is defined."""
    rows = _metric_rows(results, names, scale, policy)
    repeats: dict[tuple[str, str], list[dict[str, float | None]]] = defaultdict(list)
    for jq, row in zip(results, rows, strict=True):
        repeats[(jq.query.engine, jq.query.query_id)].append(row)
    engines = sorted({engine for engine, _ in repeats})
    out: dict[str, dict[str, dict[str, float]]] = {n: {e: {} for e in engines} for n in names}
    for (engine, qid), group in sorted(repeats.items()):  # query ids in order, per engine
        for name in names:
            values = [v for row in group if (v := row.get(name)) is not None]
            if values:
                out[name][engine][qid] = sum(values) / len(values)
    return out


def fully_judged(results: Sequence[JudgedQuery]) -> dict[str, set[str]]:
    """Per engine, the query ids whose every verdict, in every repeat, was answered."""
    judged: dict[str, set[str]] = defaultdict(set)
    unjudged: set[tuple[str, str]] = set()
    for jq in results:
        key = (jq.query.engine, jq.query.query_id)
        if all(v.status == "ok" for v in jq.verdicts):
            judged[key[0]].add(key[1])
        else:
            unjudged.add(key)
    for engine, qid in unjudged:
        judged[engine].discard(qid)
    return judged


def _blocks(total: int, width: int) -> Iterator[int]:
    step = max(1, _BLOCK_CELLS // max(width, 1))
    for start in range(0, total, step):
        yield min(step, total - start)


def _is_exact(n: int, n_permutations: int) -> bool:
    return n <= 20 and 2**n <= n_permutations


def sign_flip_p(
    diffs: FloatArray, *, n_permutations: int = N_PERMUTATIONS, seed: int = 0
) -> tuple[float, bool]:
    """Two-sided paired randomization p-value of ``mean(diffs) != 0``; (p, exact). A pair that
    does not differ flips to itself, so only the differing pairs are flipped: exact whenever
    they are few enough, however many tie (2 of 20 differing: p is 1/2, not a sample of it)."""
    nonzero = diffs[np.abs(diffs) > _ZERO]
    n = nonzero.size
    if n == 0:
        return 1.0, True
    observed = abs(float(nonzero.sum()))
    # Sums that equal the observed one up to rounding count as "as extreme".
    tol = 1e-12 * max(1.0, observed)
    if _is_exact(n, n_permutations):
        codes = np.arange(2**n, dtype=np.int64)[:, None] >> np.arange(n, dtype=np.int64)
        signs = 1.0 - 2.0 * (codes & 1)
        return float(np.mean(np.abs(signs @ nonzero) >= observed - tol)), True
    rng = np.random.default_rng(seed)
    hits = 0
    for rows in _blocks(n_permutations, n):
        signs = rng.choice(np.array([-1.0, 1.0]), size=(rows, n))
        hits += int(np.sum(np.abs(signs @ nonzero) >= observed - tol))
    return (1 + hits) / (1 + n_permutations), False


def sign_flip_floor(diffs: FloatArray, *, n_permutations: int = N_PERMUTATIONS) -> float:
    """The smallest p :func:`sign_flip_p` can give ``diffs``'s signs, whatever their sizes:
    ``2 / 2^m`` for ``m`` non-zero differences (1 when none), and never below
    ``1 / (1 + n_permutations)`` when the test is sampled."""
    m = int(np.count_nonzero(np.abs(diffs) > _ZERO))
    floor = min(1.0, math.ldexp(1.0, 1 - m))
    if not _is_exact(m, n_permutations):
        floor = max(floor, 1.0 / (1 + n_permutations))
    return floor


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def engine_mean(values: Mapping[str, float], *, n_boot: int = N_BOOT, seed: int = 0) -> EngineMean:
    """Unpaired mean and 95% CI of per-query ``values`` (resampled in query-id order)."""
    ordered = [values[q] for q in sorted(values)]
    ci = bootstrap_ci(ordered, n_boot=n_boot, seed=seed)
    return EngineMean(
        mean=_mean(ordered),
        n=len(ordered),
        ci_low=ci[0] if ci else None,
        ci_high=ci[1] if ci else None,
    )


def question(text: str) -> str:
    """A query's text as the question it asks: case and spacing aside."""
    return " ".join(text.casefold().split())


def asked_by(results: Sequence[JudgedQuery]) -> dict[str, dict[str, str]]:
    """Per engine, the question (:func:`question`) each of its query ids asks."""
    asked: dict[str, dict[str, str]] = defaultdict(dict)
    for jq in results:
        asked[jq.query.engine].setdefault(jq.query.query_id, question(jq.query.query))
    return asked


def paired_diff(
    metric: str,
    engine: tuple[str, Mapping[str, float]],
    baseline: tuple[str, Mapping[str, float]],
    *,
    n_boot: int = N_BOOT,
    n_permutations: int = N_PERMUTATIONS,
    seed: int = 0,
    held: tuple[Collection[str], Collection[str]] | None = None,
    judged: tuple[Collection[str], Collection[str]] | None = None,
    asked: tuple[Mapping[str, str], Mapping[str, str]] | None = None,
) -> PairedDiff:
    """``engine - baseline`` over the query ids where both have a value; ``held``: the query
    ids each side holds, defined or not, to count those left out; ``judged``: those each
    side judged fully, a query one of them found nothing relevant in, and the other did,
    then counting 0 for it (:func:`score_misses`: the two sides alone decide); ``asked``:
    the question each side's ids ask (:func:`question`), an id the two ask differently left
    out of the pairs."""
    (name, values), (base, base_values) = engine, baseline
    if judged is not None:
        values, base_values = dict(values), dict(base_values)
        score_misses(metric, {"a": values, "b": base_values}, {"a": judged[0], "b": judged[1]})
    unlike: set[str] = set()
    if asked is not None:
        ours, theirs = asked
        unlike = {q for q in ours.keys() & theirs.keys() if ours[q] != theirs[q]}
    common = sorted(values.keys() & base_values.keys() - unlike)
    held_ids = set(held[0]) | set(held[1]) if held is not None else set(common)
    a = np.array([values[q] for q in common], dtype=np.float64)
    b = np.array([base_values[q] for q in common], dtype=np.float64)
    d = a - b
    better = -d if lower_is_better(metric) else d  # wins are queries where the engine is better
    ci = bootstrap_ci(d, n_boot=n_boot, seed=seed)
    p, exact = sign_flip_p(d, n_permutations=n_permutations, seed=seed) if d.size else (None, False)
    return PairedDiff(
        metric=metric,
        engine=name,
        baseline=base,
        n=len(common),
        mean_engine=float(a.mean()) if d.size else None,
        mean_baseline=float(b.mean()) if d.size else None,
        diff=float(d.mean()) if d.size else None,
        ci_low=ci[0] if ci else None,
        ci_high=ci[1] if ci else None,
        p_value=p,
        exact=exact,
        p_floor=sign_flip_floor(d, n_permutations=n_permutations) if d.size else None,
        wins=int(np.count_nonzero(better > _ZERO)),
        ties=int(np.count_nonzero(np.abs(d) <= _ZERO)),
        losses=int(np.count_nonzero(better < -_ZERO)),
        left_out=len(held_ids.difference(common)),
        unlike=len(unlike),
        **_unjudged(held_ids.difference(common) - unlike, held, judged),
    )


def _unjudged(
    left: set[str],
    held: tuple[Collection[str], Collection[str]] | None,
    judged: tuple[Collection[str], Collection[str]] | None,
) -> dict[str, int | bool]:
    """Why the ids ``left`` out (other questions aside) are: held by one side only, else (when
    ``judged`` is known) not judged fully by the engine, else by the baseline (each id counted
    once, by its first reason)."""
    if held is None:
        return {}
    ours, theirs = set(held[0]), set(held[1])
    one = {q for q in left if (q in ours) != (q in theirs)}
    if judged is None:
        return {"held_by_one": len(one), "reasons": True}
    done, done_too = set(judged[0]), set(judged[1])
    mine = {q for q in left - one if q not in done}
    other = {q for q in left - one - mine if q not in done_too}
    return {
        "held_by_one": len(one),
        "unjudged_engine": len(mine),
        "unjudged_baseline": len(other),
        "reasons": True,
        "judged_known": True,
    }


def _pairs(
    found: Sequence[str],
    engines: Sequence[str] | None,
    baseline: str | None,
    baselines: Mapping[str, str] | None,
) -> tuple[list[str], str, dict[str, str]]:
    """The engines in order, the baseline, and each compared engine's baseline (checked)."""
    if len(found) < 2:
        raise InputError(
            f"compare needs at least two engines, got {list(found) or 'none'}: give a results "
            "file whose rows carry several engines, or several run directories"
        )
    order = [e for e in (engines or ()) if e in found]
    order += [e for e in sorted(found) if e not in order]
    base = baseline if baseline is not None else order[0]
    if base not in found:
        raise InputError(f"baseline engine '{base}' is not one of {sorted(found)}")
    pairs = dict(baselines) if baselines is not None else {e: base for e in order if e != base}
    for engine, against in pairs.items():
        if engine not in found or against not in found:
            raise InputError(f"cannot compare '{engine}' with '{against}': not both in the results")
    order = [base, *(e for e in order if e != base)]
    return order, base, pairs


def _read_against_every_pair(diffs: Sequence[PairedDiff], engines: int) -> list[PairedDiff]:
    """``diffs`` with each p read against every pair of ``engines`` engines."""
    family = engines * (engines - 1) // 2
    return [d.model_copy(update={"family": family}) for d in diffs]


def compare(
    results: Sequence[JudgedQuery],
    metrics: Sequence[str],
    scale: Scale,
    *,
    baseline: str | None = None,
    engines: Sequence[str] | None = None,
    baselines: Mapping[str, str] | None = None,
    n_boot: int = N_BOOT,
    n_permutations: int = N_PERMUTATIONS,
    seed: int = 0,
    policy: MetricPolicy = MetricPolicy(),
    best_of: bool = False,
) -> Comparison:
    """Every engine against its baseline on ``metrics``.

    ``engines`` orders the engines (the rest follow by name); ``baseline`` defaults to the
    first. ``baselines`` maps each engine to compare to the engine it is compared with
    (default: every other engine to ``baseline``). ``best_of``: the baseline is the best
    of three engines or more, found after the fact (:attr:`PairedDiff.family`).

    Long because its signature is the comparison's settings, one a line (a third of it).
    """
    for name in metrics:
        check_metric(name)
    found = sorted({jq.query.engine for jq in results})
    order, base, pairs = _pairs(found, engines, baseline, baselines)
    per_query = per_query_values(results, metrics, scale, policy)
    asked = asked_by(results)  # every query id each engine holds, and what it asks
    judged = fully_judged(results)
    means = {
        m: {e: engine_mean(per_query[m][e], n_boot=n_boot, seed=seed) for e in order}
        for m in metrics
    }
    diffs = [
        paired_diff(
            m,
            (e, per_query[m][e]),
            (pairs[e], per_query[m][pairs[e]]),
            n_boot=n_boot,
            n_permutations=n_permutations,
            seed=seed,
            held=(asked[e].keys(), asked[pairs[e]].keys()),
            judged=(judged[e], judged[pairs[e]]),
            asked=(asked[e], asked[pairs[e]]),
        )
        for m in metrics
        for e in order
        if e in pairs
    ]
    if best_of and len(order) >= 3:
        diffs = _read_against_every_pair(diffs, len(order))
    return Comparison(
        engines=tuple(order),
        baseline=base,
        metrics=tuple(metrics),
        n_query_ids=len({jq.query.query_id for jq in results}),
        n_boot=n_boot,
        n_permutations=n_permutations,
        seed=seed,
        means=means,
        diffs=tuple(diffs),
        per_query=per_query,
        baselines=pairs,
    )
