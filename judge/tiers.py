"""The source-authority tier list, ``[metrics.authority]``: tiers, their scores, host rules.

A passage's source (its url's host) falls in one of six tiers, each with a score in [0, 1]:
official, government, academic, reference, unknown (no rule matches, or no url), low_quality.
Each tier lists rules, one string each, in one of three forms:

- a host or domain suffix, ``gov.cn`` (a leading dot is optional): the host itself and every
  host under it (``www.gov.cn``, ``beijing.gov.cn``), never ``notgov.cn``;
- a glob (``*``, ``?``, ``[...]``, shell-style, :func:`fnmatch.fnmatchcase`) matched against
  the whole host: ``*.blogspot.com``;
- ``re:`` and a Python regex that must match the whole host (:func:`re.fullmatch`).

Hosts and rules are compared NFKC-normalised, case-folded, without a trailing dot, with
punycode labels (``xn--``) decoded, so ``中国.cn`` and ``xn--fiqs8s.cn`` are one host.

Precedence: the most specific matching rule wins. A suffix or glob is as specific as the
number of labels it spells out without wildcards (``news.bbc.co.uk`` 4, ``*.bbc.co.uk`` 3,
``gov.cn`` 2, ``gov`` 1); a regex cannot be measured that way and counts as naming the whole
host, so a matching regex beats every suffix and glob (write one to override anything).
Equally specific: your rules before the defaults, then the lower score (a tie never grants
authority). The defaults (``defaults = false`` drops them) name common TLD classes only,
:data:`DEFAULT_RULES`; no site rankings. A bad rule, an unknown tier or a score outside [0, 1]
fails :func:`judge.config.load_config` with the file and key, before anything is sent.

This is a shared leaf beside ``schema`` (``MetricPolicy.authority`` holds the record), so it
imports no stage; :mod:`judge.metrics.authority` applies it to urls.
"""

from __future__ import annotations

import contextlib
import fnmatch
import re
import unicodedata
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "DEFAULT_RULES",
    "TIERS",
    "AuthorityTiers",
    "HostRule",
    "Tier",
    "TierScores",
    "normalise_host",
    "parse_rule",
]

Tier = Literal["official", "government", "academic", "reference", "unknown", "low_quality"]
TIERS: tuple[Tier, ...] = get_args(Tier)
Share = Annotated[float, Field(ge=0.0, le=1.0)]
RuleKind = Literal["suffix", "glob", "regex"]

# Common TLD classes only: who runs a .gov or an .edu.cn is a matter of registry policy, not
# of our opinion. Everything site-specific is the user's to add.
DEFAULT_RULES: dict[Tier, tuple[str, ...]] = {
    "government": (
        *("gov", "mil", "int", "gov.cn", "gov.uk", "gov.au", "gov.in", "gouv.fr", "go.jp"),
        "gc.ca",
    ),
    "academic": ("edu", "edu.cn", "ac.cn", "ac.uk", "edu.au", "ac.jp", "ac.nz"),
}

_GLOB = re.compile(r"[*?\[]")
# A host label: letters or digits of any script, inner hyphens (and "_", seen in the wild).
_LABEL = re.compile(r"^[\w](?:[\w-]*[\w])?$")


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def normalise_host(host: str) -> str:
    """NFKC, case-folded, no trailing or leading dot, ``xn--`` labels decoded to Unicode."""
    host = unicodedata.normalize("NFKC", host).casefold().strip().strip(".")
    if "xn--" in host:
        with contextlib.suppress(UnicodeError):  # not valid punycode: kept as written
            host = host.encode("ascii").decode("idna").casefold()
    return host


@dataclass(frozen=True)
class HostRule:
    """One parsed rule: its form, the text it matches with, and how specific it is."""

    kind: RuleKind
    text: str
    specificity: int
    pattern: re.Pattern[str] | None = None

    def matches(self, host: str) -> bool:
        """Whether the normalised ``host`` falls under this rule."""
        if self.pattern is not None:
            return self.pattern.fullmatch(host) is not None
        if self.kind == "glob":
            return fnmatch.fnmatchcase(host, self.text)
        return host == self.text or host.endswith("." + self.text)

    def rank(self, host: str) -> int:
        """Specificity against ``host`` (a regex names the whole host)."""
        return host.count(".") + 1 if self.kind == "regex" else self.specificity


def parse_rule(text: str) -> HostRule:
    """A rule string as a :class:`HostRule`; ValueError saying what is wrong with it."""
    if text.startswith("re:"):
        if not text[3:]:
            raise ValueError(f"'{text}': an empty regex")
        try:
            pattern = re.compile(text[3:])
        except re.error as exc:
            raise ValueError(f"'{text}': bad regex: {exc}") from None
        return HostRule("regex", text[3:], 0, pattern)
    host = normalise_host(text)
    if "://" in text or "/" in host or ":" in host or " " in host:
        raise ValueError(
            f"'{text}' is not a host rule: write a host or suffix (example.com), a glob "
            "(*.example.com) or 're:' and a regex, without scheme, port or path"
        )
    labels = host.split(".")
    if _GLOB.search(host):
        return HostRule("glob", host, sum(1 for lab in labels if not _GLOB.search(lab)))
    if not all(_LABEL.match(lab) for lab in labels):
        raise ValueError(f"'{text}' is not a host name or suffix (labels: letters, digits, '-')")
    return HostRule("suffix", host, len(labels))


class TierScores(_Record):
    """Each tier's score in [0, 1]; a partial table changes only the tiers it names."""

    official: Share = 1.0
    government: Share = 0.9
    academic: Share = 0.8
    reference: Share = 0.7
    unknown: Share = 0.5
    low_quality: Share = 0.0

    def of(self, tier: Tier) -> float:
        score: float = getattr(self, tier)
        return score


class AuthorityTiers(_Record):
    """``[metrics.authority]``: rules per tier (lists of strings), scores, the defaults."""

    defaults: bool = True
    scores: TierScores = TierScores()
    official: tuple[str, ...] = ()
    government: tuple[str, ...] = ()
    academic: tuple[str, ...] = ()
    reference: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    low_quality: tuple[str, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        """An unknown key is most likely a misspelt tier: say which tiers there are."""
        if isinstance(data, dict):
            for key in data:
                if key not in cls.model_fields:
                    raise ValueError(
                        f"unknown tier '{key}'; tiers: {', '.join(TIERS)} "
                        "(and the keys defaults, scores)"
                    )
        return data

    @field_validator(*TIERS)
    @classmethod
    def _rules_parse(cls, rules: tuple[str, ...]) -> tuple[str, ...]:
        for rule in rules:
            parse_rule(rule)
        return rules

    @model_validator(mode="after")
    def _one_tier_per_rule(self) -> AuthorityTiers:
        seen: dict[str, Tier] = {}
        for tier in TIERS:
            for rule in self.rules(tier):
                key = rule if rule.startswith("re:") else normalise_host(rule)
                if seen.setdefault(key, tier) != tier:
                    raise ValueError(f"rule '{rule}' is in both {seen[key]} and {tier}")
        return self

    def rules(self, tier: Tier) -> tuple[str, ...]:
        """The user's rules of ``tier``, as written."""
        found: tuple[str, ...] = getattr(self, tier)
        return found
