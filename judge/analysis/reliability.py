"""Reliability statistics over plain arrays: bootstrap CI, Krippendorff's alpha, kappa, AUC.

Pure numpy functions with no knowledge of judged records, so each can be pinned against
hand-computed values and independent implementations. A statistic that is undefined for
its input (0/0, an empty class) is returned as None rather than NaN or an exception.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import NormalDist
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

AlphaLevel = Literal["nominal", "ordinal", "interval"]
FloatArray = NDArray[np.float64]

# Resampled cells drawn per bootstrap block, so memory stays bounded for large datasets.
_BOOT_BLOCK_CELLS = 500_000
# From this many values on, the percentile bootstrap of a mean is replaced by the normal
# interval it converges to (central limit theorem): mean +- z * sd / sqrt(n). At 5,000 values
# the two differ by about one Monte Carlo standard deviation of the bootstrap's own endpoints
# (on [0, 1] metrics, 2,000 resamples: ~0.0003; tests/test_reliability.py), and resampling
# 10,000 queries 2,000 times for ten metrics was a seventh of a 100k-judgment re-run.
NORMAL_FROM = 5_000


def bootstrap_ci(
    values: ArrayLike,
    *,
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
    normal_from: int | None = NORMAL_FROM,
) -> tuple[float, float] | None:
    """Percentile bootstrap CI of the mean of ``values`` (None when there are fewer than two).

    Draws ``n_boot`` resamples with replacement from ``numpy.random.default_rng(seed)``
    and returns the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles of
    their means. From ``normal_from`` values on (None: never), the normal interval instead
    (see :data:`NORMAL_FROM`).
    """
    return bootstrap_cis(
        [values], n_boot=n_boot, seed=seed, confidence=confidence, normal_from=normal_from
    )[0]


def bootstrap_cis(
    samples: Sequence[ArrayLike],
    *,
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
    normal_from: int | None = NORMAL_FROM,
) -> list[tuple[float, float] | None]:
    """:func:`bootstrap_ci` of each sample, the same numbers as one call each, but samples of
    one size share their resampled positions (the same seed draws the same ones): one draw
    serves every metric defined on the same queries, which is most of a large summary's work.
    """
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    data = [np.asarray(values, dtype=np.float64) for values in samples]
    by_size: dict[int, list[int]] = {}
    for i, d in enumerate(data):
        if d.size >= 2:  # one value has no spread to resample: no interval, not a zero-wide one
            by_size.setdefault(d.size, []).append(i)
    out: list[tuple[float, float] | None] = [None] * len(data)
    tail = (1.0 - confidence) / 2.0
    z = NormalDist().inv_cdf(1.0 - tail)
    for size, members in by_size.items():
        if normal_from is not None and size >= normal_from:
            for i in members:
                mean, half = float(data[i].mean()), z * float(data[i].std(ddof=1)) / size**0.5
                out[i] = (mean - half, mean + half)
            continue
        rng = np.random.default_rng(seed)
        means = np.empty((len(members), n_boot))
        step = max(1, _BOOT_BLOCK_CELLS // size)
        for start in range(0, n_boot, step):
            stop = min(n_boot, start + step)
            picks = rng.integers(0, size, size=(stop - start, size))
            for row, i in enumerate(members):
                means[row, start:stop] = data[i][picks].mean(axis=1)
        for row, i in enumerate(members):
            low, high = np.quantile(means[row], [tail, 1.0 - tail])
            out[i] = (float(low), float(high))
    return out


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


def cohen_kappa(confusion: ArrayLike, values: Sequence[float] | None = None) -> float | None:
    """Cohen's kappa of a square table (rows: rater A, columns: rater B).

    kappa = 1 - sum w_ij p_ij / sum w_ij e_ij with p the observed proportions and
    e_ij = p_i. * p_.j; w_ij = 1 if i != j (unweighted) or, given category ``values``,
    linear weights |v_i - v_j| / (max v - min v). None when there is no data or chance
    disagreement is 0 (both raters used one and the same category).
    """
    table = np.asarray(confusion, dtype=np.float64)
    if table.ndim != 2 or table.shape[0] != table.shape[1]:
        raise ValueError(f"expected a square confusion table, got shape {table.shape}")
    total = table.sum()
    cats = np.arange(table.shape[0], dtype=np.float64) if values is None else np.asarray(values)
    spread = float(cats.max() - cats.min()) if cats.size else 0.0
    if total == 0 or spread == 0.0:
        return None
    if values is None:
        weights = 1.0 - np.eye(table.shape[0])
    else:
        weights = np.abs(np.subtract.outer(cats, cats)) / spread
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
