"""Label-based side of the metrics: matching retrieved passages to a row's expected items.

:func:`match_expected` turns a Query's ``expected_ids`` or ``expected_texts`` into an
:class:`ExpectedMatch` (which ranks hold the first match of an expected item, and the rank
each item was first found at). The kernels here read those matches (:class:`Matched`); the
``label.*`` rows of :data:`judge.metrics.facts.METRICS` name them (hit rate, MRR and precision
are :mod:`.ranked`'s), and :func:`judge.metrics.compute.compute_label_based` runs them; their
formulas are in each function's docstring. Where a formula divides 0 by 0 the value is NaN.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import numpy as np

from judge.metrics.ranked import FloatArray, Ranked, discounts, div, precision, precision_at_rank
from judge.schema import Query

__all__ = [
    "ExpectedMatch",
    "Matched",
    "f1",
    "label_ap",
    "label_ndcg",
    "match_expected",
    "mrr_granular",
    "normalise_text",
    "recall",
]


def normalise_text(text: str) -> str:
    """NFKC, case-folded, whitespace collapsed to single spaces and stripped."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


@dataclass(frozen=True)
class ExpectedMatch:
    """How one query's retrieved passages meet its expected items.

    ``found_ranks[j]`` is the 1-based rank at which distinct expected item ``j`` was first
    found (None if never). ``relevant[i]`` is True when passage ``i + 1`` is the first match of
    at least one expected item, so a repeat of an item already found is not counted again and
    precision, AP and NDCG stay within [0, 1].
    """

    relevant: tuple[bool, ...]
    found_ranks: tuple[int | None, ...]

    @property
    def n_expected(self) -> int:
        return len(self.found_ranks)


def match_expected(query: Query) -> ExpectedMatch | None:
    """Match by ``expected_ids`` (exact id), else ``expected_texts``, else None (no labels).

    Texts match by normalised containment (:func:`normalise_text`): a passage matches an
    expected text when either contains the other; blank texts never match. Duplicate expected
    items are counted once.
    """
    passages = query.passages
    if query.expected_ids:
        first: dict[str, int] = {}
        for rank, passage in enumerate(passages, start=1):
            first.setdefault(passage.id, rank)
        found = [first.get(item) for item in dict.fromkeys(query.expected_ids)]
    elif query.expected_texts:
        texts = [normalise_text(p.text) for p in passages]
        wanted = [t for t in dict.fromkeys(map(normalise_text, query.expected_texts)) if t]
        found = [
            next((r for r, t in enumerate(texts, start=1) if t and (e in t or t in e)), None)
            for e in wanted
        ]
    else:
        return None
    hits = {rank for rank in found if rank is not None}
    return ExpectedMatch(tuple(r in hits for r in range(1, len(passages) + 1)), tuple(found))


@dataclass(frozen=True)
class Matched(Ranked):
    """Label-based lists: ``found_rank`` (n x E) is the 1-based rank at which each expected item
    was first found, NaN if not found or padded; ``n_expected`` is ``|expected|``."""

    found_rank: FloatArray
    n_expected: FloatArray


def recall(m: Matched, k: int | None) -> FloatArray:
    """``(expected items found in the top k) / |expected|``, each item counted once; this is
    also the granular hit rate."""
    within = m.found_rank <= (np.inf if k is None else k)
    return div(within.sum(axis=1, dtype=np.float64), m.n_expected)


def mrr_granular(m: Matched, k: int | None) -> FloatArray:
    """``mean over expected items found in the top k of 1 / rank``; ``0`` when none is found."""
    within = m.found_rank <= (np.inf if k is None else k)
    summed = np.where(within, 1.0 / np.where(within, m.found_rank, 1.0), 0.0).sum(axis=1)
    return np.nan_to_num(div(summed, within.sum(axis=1, dtype=np.float64)), nan=0.0)


def f1(m: Matched, k: int | None) -> FloatArray:
    """``2 P R / (P + R)`` from precision and recall at the same k; ``0`` when ``P + R = 0``."""
    p, r = precision(m, k), recall(m, k)
    harmonic = np.nan_to_num(div(2.0 * p * r, p + r), nan=0.0)
    return np.where(np.isnan(p) | np.isnan(r), np.nan, harmonic)


def label_ap(m: Matched, k: int | None) -> FloatArray:
    """``sum_{i <= k, relevant} P@i / |expected|``."""
    summed = np.where(m.rel, precision_at_rank(m.rel), 0.0)[:, :k].sum(axis=1)
    return div(summed, m.n_expected)


def label_ndcg(m: Matched, k: int | None) -> FloatArray:
    """``DCG@k / IDCG@k`` with binary gains; ``DCG@k = sum_{i <= k, relevant} 1 / log2(i + 1)``,
    ``IDCG@k = sum_{i <= min(len(retrieved), |expected|, k)} 1 / log2(i + 1)``."""
    disc = discounts(m.rel.shape[1])
    dcg = np.where(m.rel, disc, 0.0)[:, :k].sum(axis=1)
    cumulative = np.concatenate(([0.0], np.cumsum(disc)))
    ideal_n = np.minimum(m.lengths, np.minimum(m.n_expected, k or m.rel.shape[1])).astype(int)
    return div(dcg, cumulative[ideal_n])
