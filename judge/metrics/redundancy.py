"""Redundancy in a ranked list, without a judge: near-duplicate passages and distinct sites.

Normalisation: NFKC, case-folded; every run of characters that are not letters or digits
(punctuation, symbols, whitespace, ``_``) separates tokens. Tokens: in space-separated
scripts a word; in Chinese and Japanese (Han ideographs, kana), which put no spaces between
words, each character, so Chinese text is compared character by character. Shingles: every
:data:`SHINGLE` consecutive tokens; a text with fewer tokens has one shingle, all of them.

Two passages are *near-duplicates* when the Jaccard similarity of their shingle sets,
``|A ∩ B| / |A ∪ B|``, is at least :data:`NEAR_DUP_JACCARD`. A passage whose normalised text
is empty has no shingles and is nobody's near-duplicate.

The pairs are compared exactly (``k(k-1)/2`` set intersections for a top k), not through
MinHash sketches (``datasketch``): for the ten to a hundred passages of one list, exact is
cheap, and a sketch would only add sampling error.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

__all__ = [
    "NEAR_DUP_JACCARD",
    "SHINGLE",
    "distinct_sites",
    "jaccard",
    "near_dup_rate",
    "near_duplicates",
    "shingles",
    "tokens",
]

# Tokens per shingle: 3 words, or 3 Chinese characters.
SHINGLE = 3
# Resemblance at which two passages count as one: a 200-character snippet and a 120-character
# cut of the same text (0.6), or one text with about one token in twelve changed.
NEAR_DUP_JACCARD = 0.6

# Scripts written without spaces between words: one token per character.
_UNSPACED = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_TOKEN = re.compile(rf"[{_UNSPACED}]|[^\W_{_UNSPACED}]+")

# A shingle's tokens joined by a separator no token holds: a str caches its hash, so the
# pairwise set intersections do not hash every shingle again (a tuple would).
Shingle = str
_JOIN = "\x1f"


def tokens(text: str) -> list[str]:
    """The normalised tokens of ``text``: ``"Hello, World 小狗!" -> [hello, world, 小, 狗]``."""
    return _TOKEN.findall(unicodedata.normalize("NFKC", text).casefold())


def shingles(text: str, size: int = SHINGLE) -> frozenset[Shingle]:
    """Every ``size`` consecutive tokens of ``text``; one shingle when it has fewer tokens,
    none when it has none."""
    found = tokens(text)
    if len(found) <= size:
        return frozenset({_JOIN.join(found)}) if found else frozenset()
    return frozenset(map(_JOIN.join, zip(*(found[i:] for i in range(size)), strict=False)))


def jaccard(a: frozenset[Shingle], b: frozenset[Shingle]) -> float:
    """``|a ∩ b| / |a ∪ b|``; 0 when either set is empty (an empty text duplicates nothing)."""
    if not a or not b:
        return 0.0
    shared = len(a & b)
    return shared / (len(a) + len(b) - shared)


def near_duplicates(texts: Sequence[str], threshold: float = NEAR_DUP_JACCARD) -> list[bool]:
    """Per passage in rank order: True when it near-duplicates some passage ranked above it
    (Jaccard of shingles >= ``threshold``), whether or not that one is a duplicate itself."""
    seen: list[frozenset[Shingle]] = []
    flags = []
    for text in texts:
        mine = shingles(text)
        flags.append(any(jaccard(mine, other) >= threshold for other in seen))
        seen.append(mine)
    return flags


def near_dup_rate(flags: Sequence[bool]) -> float | None:
    """``near_dup@k = #{i <= m : passage i near-duplicates a passage j < i} / m``, ``m =
    min(k, n)`` (``flags`` are the top m's, from :func:`near_duplicates`).

    The share of the top k that repeats something ranked higher: 0 for one passage or all
    distinct ones, ``(m - 1) / m`` when all m are the same text. Undefined for an empty list.
    Lower is better.
    """
    return sum(flags) / len(flags) if flags else None


def distinct_sites(sites: Sequence[str | None]) -> float | None:
    """``sites@k = |{site(url_i) : i <= m, url_i has a host}|``, ``m = min(k, n)``.

    The number of distinct sites (registrable domains, :func:`judge.metrics.hosts.site_of`)
    among the top k; passages without a url add none. Undefined when no passage in the top k
    has a url. Higher means more sources.
    """
    known = {site for site in sites if site is not None}
    return float(len(known)) if known else None
