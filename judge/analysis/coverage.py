"""Which engine found which nugget, and what each engine found that no other did.

Per query and engine, a nugget is *covered* when some passage of the engine's list supports
it, by majority over the repeats whose supports were all read (a tie is not covered: the
cautious call, as the majority vote on verdicts). An engine with no such repeat is
*undefined* on that query (an unparsed support is never "not covered").

Unique coverage of engine ``E`` on a query judged by two or more engines, all defined::

    unique_coverage(E) = |{vital j : E covers j, no other engine covers j}| / |vital|

averaged over those queries (undefined for a query with no vital nugget). ``unique_nuggets``
counts every nugget, vital or okay, that only ``E`` covers, summed over the queries.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from judge.aspects import Coverage, Nugget
from judge.schema import JudgedQuery, Record

__all__ = ["CoverageSummary", "EngineCoverage", "NuggetRow", "QueryNuggets", "coverage_summary"]


class NuggetRow(Record):
    """One nugget of a query and the engines that cover it."""

    id: str
    text: str
    vital: bool
    engines: tuple[str, ...]


class QueryNuggets(Record):
    """One query's nuggets; ``undefined``: engines whose supports could not all be read."""

    query_id: str
    query: str
    nuggets: tuple[NuggetRow, ...]
    undefined: tuple[str, ...] = ()


class EngineCoverage(Record):
    """What one engine alone found (see the module docstring)."""

    unique_coverage: float | None
    unique_nuggets: int
    n_queries: int  # queries where it was compared (two or more engines, all defined)


class CoverageSummary(Record):
    engines: dict[str, EngineCoverage]
    queries: tuple[QueryNuggets, ...]


def _covered(coverages: Sequence[Coverage]) -> frozenset[str] | None:
    """The nuggets covered by majority over the repeats whose supports were all read."""
    read = [
        frozenset().union(*(s.nuggets or () for s in c.supports))
        for c in coverages
        if all(s.status == "ok" for s in c.supports)
    ]
    if not read:
        return None
    return frozenset(
        j for j in frozenset().union(*read) if 2 * sum(j in r for r in read) > len(read)
    )


def _unique(
    nuggets: Sequence[Nugget], found: dict[str, frozenset[str]]
) -> dict[str, tuple[float | None, int]]:
    """Per engine: the share of vital nuggets only it covers, and how many nuggets only it does."""
    vital = {n.id for n in nuggets if n.vital}
    out: dict[str, tuple[float | None, int]] = {}
    for engine, mine in found.items():
        others = frozenset().union(*(f for e, f in found.items() if e != engine))
        alone = mine - others
        out[engine] = (len(alone & vital) / len(vital) if vital else None, len(alone))
    return out


def coverage_summary(results: Sequence[JudgedQuery]) -> CoverageSummary | None:
    """Nuggets per query with the engines covering each, and each engine's unique coverage;
    None when no result carries coverage (the dimension was off)."""
    by_query: dict[str, dict[str, list[Coverage]]] = defaultdict(lambda: defaultdict(list))
    texts: dict[str, str] = {}
    for jq in results:
        if jq.coverage is not None:
            by_query[jq.query.query_id][jq.query.engine].append(jq.coverage)
            texts[jq.query.query_id] = jq.query.query
    if not by_query:
        return None
    shares: dict[str, list[float]] = defaultdict(list)
    counts: dict[str, int] = defaultdict(int)
    compared: dict[str, int] = defaultdict(int)
    queries = []
    for qid, engines in sorted(by_query.items()):
        nuggets = next((c.nuggets for cs in engines.values() for c in cs if c.nuggets), ())
        found = {e: _covered(cs) for e, cs in sorted(engines.items())}
        defined = {e: f for e, f in found.items() if f is not None}
        rows = tuple(
            NuggetRow(
                id=n.id,
                text=n.text,
                vital=n.vital,
                engines=tuple(e for e, f in defined.items() if n.id in f),
            )
            for n in nuggets
        )
        undefined = tuple(e for e in found if e not in defined)
        queries.append(
            QueryNuggets(query_id=qid, query=texts[qid], nuggets=rows, undefined=undefined)
        )
        if len(found) < 2 or undefined or not nuggets:
            continue
        for engine, (share, n_alone) in _unique(nuggets, defined).items():
            compared[engine] += 1
            counts[engine] += n_alone
            if share is not None:
                shares[engine].append(share)
    every = sorted({e for engines in by_query.values() for e in engines})
    summary = {
        e: EngineCoverage(
            unique_coverage=sum(shares[e]) / len(shares[e]) if shares[e] else None,
            unique_nuggets=counts[e],
            n_queries=compared[e],
        )
        for e in every
    }
    return CoverageSummary(engines=summary, queries=tuple(queries))
