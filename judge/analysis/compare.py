"""Engines side by side on the same queries: paired differences, bootstrap CIs, sign-flip
tests, and pooled metrics whose ideal ranking comes from every engine's judged passages.

Per metric and engine, a query's value is its mean over the repeats where it is defined.
Against the baseline engine B, engine A's paired difference over the ``n`` query ids defined
for both is ``d_q = v_A(q) - v_B(q)`` and ``diff = mean_q d_q``. The 95% CI resamples the
``d_q`` with replacement (percentile bootstrap). The p-value is two-sided from the paired
randomization (sign-flip) test: under H0 each ``d_q`` is as likely to be ``-d_q``, so
``p = #{s : |mean_q s_q d_q| >= |mean_q d_q|} / #s`` over all ``2^n`` sign vectors ``s``
when ``2^n <= n_permutations`` (exact), else ``(1 + hits) / (1 + n_permutations)`` over
random sign vectors. Every random draw uses ``numpy.random.default_rng(seed)``.

Pooled metrics (``pooled_ndcg``, ``pooled_ndcg@k``, ``pooled_recall@k``) are computed per
(query id, repeat) over the pool of every engine's ``ok`` verdicts. Passages are the same
when they share an id or their normalised text (NFKC, casefolded, whitespace collapsed);
a pooled passage's grade is the highest grade any engine's verdict gave it. Then::

    pooled_ndcg@k   = DCG@k / IDCG@k, DCG over the engine's list, IDCG over the pool's
                      grades sorted descending (gain rel or 2^rel - 1, discount log2(i + 1))
    pooled_recall@k = |relevant pooled passages in the engine's top k| / |relevant in pool|

A passage repeated lower in an engine's list (same id or text) gains nothing, so an engine
cannot pad its score with duplicates and an engine that found fewer good passages than the
pool holds cannot reach 1. Both are undefined when the pool holds nothing graded above 0
(nothing relevant, for recall). Unparsed/error verdicts follow the ``unjudged`` policy.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

from judge.errors import ConfigError, InputError
from judge.metrics.compute import Gain, metrics_for_queries, normalise_text
from judge.metrics.compute import parse_metric_name as parse_plain
from judge.schema import JudgedQuery, MetricPolicy, Record, Scale

FloatArray = npt.NDArray[np.float64]
POOLED_BASES = ("pooled_ndcg", "pooled_recall")
DEFAULT_POOLED = ("pooled_ndcg", "pooled_ndcg@5", "pooled_recall@5")
_POOLED = re.compile(r"^(pooled_ndcg|pooled_recall)(?:@(\d+))?$")
# Resampled cells per block, so memory stays bounded for many queries x many resamples.
_BLOCK_CELLS = 2_000_000


class EngineMean(Record):
    """An engine's mean over the query ids where the metric is defined (``n`` of them)."""

    mean: float | None
    n: int


class PairedDiff(Record):
    """``engine - baseline`` on the ``n`` query ids defined for both; see the module doc."""

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


class Comparison(Record):
    """Everything ``judge compare`` prints; ``per_query[metric][engine][query_id]``."""

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


def parse_pooled(name: str) -> tuple[str, int | None] | None:
    """``"pooled_ndcg@5" -> ("pooled_ndcg", 5)``; None when ``name`` is not a pooled metric."""
    match = _POOLED.match(name)
    if not match:
        return None
    k = None if match.group(2) is None else int(match.group(2))
    if k is not None and k < 1:
        raise ConfigError(f"metric '{name}': the cutoff after '@' must be at least 1")
    return match.group(1), k


def check_metric(name: str) -> None:
    """Raise ConfigError for a name that is neither a plain metric nor a pooled one."""
    if parse_pooled(name) is None:
        try:
            parse_plain(name)
        except ConfigError as exc:
            raise ConfigError(f"{exc}; compare also knows {', '.join(POOLED_BASES)}") from None


class PassagePool:
    """Union-find over passage keys: a passage's id and its normalised text are one passage."""

    def __init__(self) -> None:
        self.parent: dict[tuple[str, str], tuple[str, str]] = {}

    def find(self, key: tuple[str, str]) -> tuple[str, str]:
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def add(self, passage_id: str, text: str) -> None:
        root = self.find(("id", passage_id))
        norm = normalise_text(text)
        if norm:
            self.parent[root] = self.find(("text", norm))

    def root(self, passage_id: str) -> tuple[str, str]:
        return self.find(("id", passage_id))


def _gain(grades: Sequence[float], gain: Gain) -> FloatArray:
    values = np.asarray(grades, dtype=np.float64)
    return values if gain == "linear" else np.exp2(values) - 1.0


def _discounted(gains: FloatArray, k: int | None) -> float:
    top = gains[:k]
    return float((top / np.log2(np.arange(2, top.size + 2))).sum())


def _build_pool(rows: Sequence[JudgedQuery]) -> tuple[PassagePool, dict[tuple[str, str], int]]:
    pool = PassagePool()
    for jq in rows:
        for p in jq.query.passages:
            pool.add(p.id, p.text)
    grades: dict[tuple[str, str], int] = {}
    for jq in rows:
        for v in jq.verdicts:
            if v.status == "ok" and v.grade is not None:
                root = pool.root(v.passage_id)
                grades[root] = max(grades.get(root, 0), v.grade)
    return pool, grades


def pooled_metrics(
    results: Sequence[JudgedQuery],
    names: Sequence[str],
    scale: Scale,
    policy: MetricPolicy = MetricPolicy(),
) -> list[dict[str, float | None]]:
    """Pooled metric values (None = undefined) for each result, in order; see the module doc."""
    parsed = [(name, parse_pooled(name)) for name in names]
    groups: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, jq in enumerate(results):
        groups[(jq.query.query_id, jq.repeat)].append(i)
    out: list[dict[str, float | None]] = [{} for _ in results]
    for members in groups.values():
        pool, pooled = _build_pool([results[i] for i in members])
        ideal = _gain(sorted(pooled.values(), reverse=True), policy.gain)
        n_relevant = sum(1 for g in pooled.values() if scale.relevant(g))
        for i in members:
            ordered = sorted(results[i].verdicts, key=lambda v: v.rank)
            failed = any(v.status != "ok" for v in ordered)
            grades: list[int] = []
            hits: list[bool] = []
            seen: set[tuple[str, str]] = set()
            for v in ordered:
                if v.status != "ok" or v.grade is None:
                    continue
                root = pool.root(v.passage_id)
                fresh = root not in seen
                seen.add(root)
                grades.append(v.grade if fresh else 0)
                hits.append(fresh and scale.relevant(v.grade))
            for name, spec in parsed:
                if spec is None:
                    raise ConfigError(f"'{name}' is not a pooled metric")
                base, k = spec
                value: float | None = None
                if not (failed and policy.unjudged == "undefined"):
                    if base == "pooled_ndcg":
                        ideal_dcg = _discounted(ideal, k)
                        dcg = _discounted(_gain(grades, policy.gain), k)
                        value = dcg / ideal_dcg if ideal_dcg > 0 else None
                    elif n_relevant:
                        value = sum(hits[:k]) / n_relevant
                out[i][name] = value
    return out


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


def per_query_values(
    results: Sequence[JudgedQuery],
    names: Sequence[str],
    scale: Scale,
    policy: MetricPolicy = MetricPolicy(),
) -> dict[str, dict[str, dict[str, float]]]:
    """``[metric][engine][query_id]`` = mean over the repeats where the value is defined."""
    rows = _metric_rows(results, names, scale, policy)
    sums: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for jq, row in zip(results, rows, strict=True):
        for name in names:
            value = row.get(name)
            if value is not None:
                sums[(name, jq.query.engine, jq.query.query_id)].append(value)
    engines = sorted({jq.query.engine for jq in results})
    out: dict[str, dict[str, dict[str, float]]] = {n: {e: {} for e in engines} for n in names}
    for (name, engine, qid), values in sorted(sums.items()):
        out[name][engine][qid] = sum(values) / len(values)
    return out


def _blocks(total: int, width: int) -> Iterator[int]:
    step = max(1, _BLOCK_CELLS // max(width, 1))
    for start in range(0, total, step):
        yield min(step, total - start)


def bootstrap_mean_ci(
    diffs: FloatArray, *, n_boot: int, seed: int, confidence: float = 0.95
) -> tuple[float, float] | None:
    """Percentile bootstrap CI of ``mean(diffs)``, resampling with replacement."""
    n = diffs.size
    if n == 0 or n_boot < 1:
        return None
    rng = np.random.default_rng(seed)
    means = np.concatenate(
        [diffs[rng.integers(0, n, size=(rows, n))].mean(axis=1) for rows in _blocks(n_boot, n)]
    )
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(means, [tail, 100.0 - tail])
    return float(low), float(high)


def sign_flip_p(diffs: FloatArray, *, n_permutations: int, seed: int) -> tuple[float, bool]:
    """Two-sided paired randomization p-value of ``mean(diffs) != 0``; (p, exact)."""
    n = diffs.size
    observed = abs(float(diffs.mean()))
    # Sums that equal the observed one up to rounding count as "as extreme".
    tol = 1e-12 * max(1.0, observed)
    if n <= 20 and 2**n <= n_permutations:
        codes = np.arange(2**n, dtype=np.int64)[:, None] >> np.arange(n, dtype=np.int64)
        signs = 1.0 - 2.0 * (codes & 1)
        stats = np.abs(signs @ diffs) / n
        return float(np.mean(stats >= observed - tol)), True
    rng = np.random.default_rng(seed)
    hits = 0
    for rows in _blocks(n_permutations, n):
        signs = rng.choice(np.array([-1.0, 1.0]), size=(rows, n))
        hits += int(np.sum(np.abs(signs @ diffs) / n >= observed - tol))
    return (1 + hits) / (1 + n_permutations), False


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def paired_diff(
    metric: str,
    engine: tuple[str, dict[str, float]],
    baseline: tuple[str, dict[str, float]],
    *,
    n_boot: int,
    n_permutations: int,
    seed: int,
) -> PairedDiff:
    """``engine - baseline`` over the query ids where both have a value."""
    (name, values), (base, base_values) = engine, baseline
    common = sorted(values.keys() & base_values.keys())
    a = np.array([values[q] for q in common], dtype=np.float64)
    b = np.array([base_values[q] for q in common], dtype=np.float64)
    d = a - b
    ci = bootstrap_mean_ci(d, n_boot=n_boot, seed=seed)
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
    )


def compare(
    results: Sequence[JudgedQuery],
    metrics: Sequence[str],
    scale: Scale,
    *,
    baseline: str | None = None,
    n_boot: int = 10_000,
    n_permutations: int = 10_000,
    seed: int = 0,
    policy: MetricPolicy = MetricPolicy(),
) -> Comparison:
    """Every engine against ``baseline`` (default: the first engine by name) on ``metrics``."""
    for name in metrics:
        check_metric(name)
    engines = sorted({jq.query.engine for jq in results})
    if len(engines) < 2:
        raise InputError(
            f"compare needs at least two engines, got {engines or 'none'}: give a results file "
            "whose rows carry several engines, or several run directories"
        )
    base = baseline if baseline is not None else engines[0]
    if base not in engines:
        raise InputError(f"baseline engine '{base}' is not one of {engines}")
    per_query = per_query_values(results, metrics, scale, policy)
    means = {
        m: {e: EngineMean(mean=_mean(list(v.values())), n=len(v)) for e, v in per_query[m].items()}
        for m in metrics
    }
    diffs = [
        paired_diff(
            m,
            (e, per_query[m][e]),
            (base, per_query[m][base]),
            n_boot=n_boot,
            n_permutations=n_permutations,
            seed=seed,
        )
        for m in metrics
        for e in engines
        if e != base
    ]
    return Comparison(
        engines=tuple([base, *(e for e in engines if e != base)]),
        baseline=base,
        metrics=tuple(metrics),
        n_query_ids=len({jq.query.query_id for jq in results}),
        n_boot=n_boot,
        n_permutations=n_permutations,
        seed=seed,
        means=means,
        diffs=tuple(diffs),
        per_query=per_query,
    )
