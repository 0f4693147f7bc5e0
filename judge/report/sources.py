"""The report's "Authority and redundancy" section: what the passages' urls and texts say,
without the judge (the ``source`` family of :mod:`judge.metrics.facts`).

Per engine, the mean of every configured ``near_dup`` / ``sites`` / ``authority`` /
``low_quality`` metric with its 95% CI, then the sites the engines returned in their top k
(the deepest cutoff configured) with their hosts (which the tier rules match), tier and
score, and how many passages each engine took from each, most frequent first. Absent when
no such metric is configured.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from judge.metrics.authority import tier_list
from judge.metrics.facts import family_of, lower_is_better, parse_metric_name
from judge.metrics.hosts import host_of, site_of
from judge.metrics.redundancy import NEAR_DUP_JACCARD, SHINGLE
from judge.report.blocks import Chart, Section, Table, Text
from judge.report.compared import ci_text
from judge.report.summary import Summary
from judge.schema import JudgedQuery
from judge.tiers import TIERS, Tier

__all__ = ["MAX_SITES", "sources_section"]

# Sites listed in the table; the rest are counted in a line under it.
MAX_SITES = 30


def _depth(names: Sequence[str]) -> int | None:
    """The deepest cutoff among ``names`` (None when one has none: the whole list)."""
    ks = [parse_metric_name(n)[1] for n in names]
    return None if None in ks else max(k for k in ks if k is not None)


def _means(summary: Summary, names: Sequence[str]) -> Table:
    def cell(engine: str, name: str) -> str:
        m = summary.engines[engine].metrics.get(name)
        if m is None or m.mean is None:
            return "—"
        return f"{m.mean:.4f} {ci_text(m.ci_low, m.ci_high)}"

    head = [f"{n} (lower is better)" if lower_is_better(n) else n for n in names]
    rows = [[engine, *(cell(engine, n) for n in names)] for engine in summary.engines]
    return Table(["engine", *head], rows)


def _hosts(names: set[str], shown: int = 3) -> str:
    """A site's hosts (the tier rules match hosts), the first few by name."""
    ordered = sorted(names)
    more = f" (+{len(ordered) - shown} more)" if len(ordered) > shown else ""
    return ", ".join(ordered[:shown]) + more


def _sites(
    summary: Summary, results: Sequence[JudgedQuery], depth: int | None
) -> list[Text | Table | Chart]:
    """Sites in the engines' top ``depth``, each query and engine counted once (repeats
    return the same passages), with their tier; and how many passages had no url."""
    tiers = tier_list(summary.policy.authority)
    engines = list(summary.engines)
    counts: Counter[tuple[str, Tier, str]] = Counter()
    no_url: Counter[str] = Counter()
    shown: Counter[str] = Counter()
    hosts: dict[tuple[str, Tier], set[str]] = {}
    seen: set[tuple[str, str]] = set()
    for jq in results:
        if jq.query.key in seen:
            continue
        seen.add(jq.query.key)
        for p in jq.query.passages[:depth]:
            shown[jq.query.engine] += 1
            host, site = host_of(p.url), site_of(p.url)
            if host is None or site is None:
                no_url[jq.query.engine] += 1
                continue
            tier = tiers.tier(host)
            counts[(site, tier, jq.query.engine)] += 1
            hosts.setdefault((site, tier), set()).add(host)
    totals: Counter[tuple[str, Tier]] = Counter()
    for (site, tier, _), n in counts.items():
        totals[(site, tier)] += n
    order = sorted(totals, key=lambda st: (-totals[st], TIERS.index(st[1]), st[0]))
    rows: list[list[Any]] = [
        [site, _hosts(hosts[(site, tier)]), tier, tiers.scores.of(tier)]
        + [counts[(site, tier, e)] for e in engines]
        for site, tier in order[:MAX_SITES]
    ]
    top = "every passage" if depth is None else f"the top {depth}"
    blocks: list[Text | Table | Chart] = [
        Text(f"Sites in {top} of each list (passages per engine):", "h3"),
        Table(
            ["site", "hosts", "tier", "score", *engines],
            rows,
            frozenset(range(3, 4 + len(engines))),
        ),
    ]
    if len(order) > MAX_SITES:
        blocks.append(Text(f"… and {len(order) - MAX_SITES} more sites.", "muted"))
    missing = ", ".join(f"{e} {no_url[e]} of {shown[e]}" for e in engines if no_url[e])
    if missing:
        blocks.append(Text(f"Passages without a url (unknown sources): {missing}.", "muted"))
    return blocks


def sources_section(summary: Summary, results: Sequence[JudgedQuery]) -> Section | None:
    """Authority and redundancy per engine; None when no such metric is configured."""
    names = [n for n in summary.metric_names if family_of(n) == "source"]
    if not names:
        return None
    authority = summary.policy.authority
    rules = "built-in TLD classes and yours" if authority.defaults else "yours only"
    why = Text(
        "From the passages alone, no judge. near_dup: share of the top k that near-duplicates "
        f"a passage ranked above it (Jaccard >= {NEAR_DUP_JACCARD} over {SHINGLE}-token "
        "shingles of NFKC, case-folded text; Chinese by character). sites: distinct "
        "registrable domains. authority: mean tier score; low_quality: share in the "
        f"low_quality tier (tier rules: {rules}; the most specific matching rule wins). A "
        "passage without a url is an unknown source; a list without any url leaves these "
        "undefined.",
        "muted",
    )
    blocks: list[Text | Table | Chart] = [_means(summary, names), why]
    blocks += _sites(summary, results, _depth(names))
    return Section("sources", "Authority and redundancy", blocks)
