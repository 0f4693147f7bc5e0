"""Source authority from the tier list in ``[metrics.authority]`` (:mod:`judge.tiers`).

Each passage's url host is put in a tier by the most specific matching rule (the precedence
is in :mod:`judge.tiers`); a host no rule matches is ``unknown``. ``authority@k`` is the mean
tier score of the top k, ``low_quality@k`` the share of them in the low_quality tier.

Passages without a url: in a list where some passage in the top k has one, a passage without
is an ``unknown`` source (it scores the unknown tier's score and is not low quality), so an
engine cannot raise its authority by dropping urls. When no passage in the top k has a url,
both metrics are undefined (None), never the unknown score: a dataset without urls says
nothing about authority.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from judge.metrics.hosts import host_of
from judge.tiers import DEFAULT_RULES, TIERS, AuthorityTiers, Tier, TierScores, parse_rule

__all__ = ["TierList", "authority_score", "low_quality_share", "tier_list"]


class TierList:
    """The rules of an :class:`AuthorityTiers`, parsed once, in precedence order."""

    def __init__(self, tiers: AuthorityTiers) -> None:
        self.scores = tiers.scores
        mine = {tier: tiers.rules(tier) for tier in TIERS}
        defaults = DEFAULT_RULES if tiers.defaults else {}
        # (origin, minus the score): the tie-breaks after specificity; the user's rules are 1.
        self._rules = [
            (origin, -self.scores.of(tier), parse_rule(text), tier)
            for origin, source in ((1, mine), (0, defaults))
            for tier, rules in source.items()
            for text in rules
        ]
        self._seen: dict[str, Tier] = {}

    def tier(self, host: str) -> Tier:
        """The tier of a normalised host: the most specific matching rule's (then the user's
        rule before a default, then the lower score), else ``unknown``."""
        if host in self._seen:
            return self._seen[host]
        best: tuple[int, int, float] | None = None
        found: Tier = "unknown"
        for origin, low, rule, tier in self._rules:
            if rule.matches(host):
                key = (rule.rank(host), origin, low)
                if best is None or key > best:
                    best, found = key, tier
        self._seen[host] = found
        return found

    def tier_of(self, url: str | None) -> Tier | None:
        """The tier of ``url``'s host; None when it has no host (no url)."""
        host = host_of(url)
        return None if host is None else self.tier(host)


@functools.lru_cache(maxsize=8)
def tier_list(tiers: AuthorityTiers) -> TierList:
    """The parsed tier list of a config's ``[metrics.authority]`` (parsed once per config)."""
    return TierList(tiers)


def authority_score(tiers: Sequence[Tier | None], scores: TierScores) -> float | None:
    """``authority@k = mean_{i <= m} score(tier_i)``, ``m = min(k, n)``; a passage without a
    url scores the unknown tier's. Undefined when none of the top k has a url."""
    if all(tier is None for tier in tiers):
        return None
    return sum(scores.of(tier or "unknown") for tier in tiers) / len(tiers)


def low_quality_share(tiers: Sequence[Tier | None]) -> float | None:
    """``low_quality@k = #{i <= m : tier_i = low_quality} / m``, ``m = min(k, n)``. Undefined
    when none of the top k has a url. Lower is better."""
    if all(tier is None for tier in tiers):
        return None
    return sum(tier == "low_quality" for tier in tiers) / len(tiers)
