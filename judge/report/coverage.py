"""Report sections on coverage (each query's nuggets and the engines covering them, what each
engine alone found) and source credibility (the judge's grades per engine, the sources it
graded low with its reasons). Each is absent when its dimension was off."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from judge.analysis.coverage import CoverageSummary, coverage_summary
from judge.report.blocks import Chart, Section, Table, Text
from judge.schema import JudgedQuery

__all__ = ["MAX_NUGGET_ROWS", "coverage_section", "credibility_section"]

# Nugget rows shown; summary.json holds them all.
MAX_NUGGET_ROWS = 200
# Sources graded low listed per engine.
LOWEST = 5
_GRADES = {0: "low", 1: "medium", 2: "high"}


def coverage_section(
    found: CoverageSummary | None, results: Sequence[JudgedQuery]
) -> Section | None:
    """The summary's coverage (measured from ``results`` when the summary has none)."""
    found = found or coverage_summary(results)
    if found is None:
        return None
    engines = list(found.engines)
    head = ["engine", "unique coverage (vital)", "nuggets only it found", "queries compared"]
    rows = [[e, x.unique_coverage, x.unique_nuggets, x.n_queries] for e, x in found.engines.items()]
    nuggets: list[list[Any]] = [
        [q.query_id, n.id, n.text, "vital" if n.vital else "okay"]
        + ["✓" if e in n.engines else ("?" if e in q.undefined else "") for e in engines]
        for q in found.queries
        for n in q.nuggets
    ]
    blocks: list[Text | Table | Chart] = [
        Text(
            "Nuggets: the facts a complete answer needs, one set per query shared by every "
            "engine (written by the judge from all engines' passages pooled, or given). A nugget "
            "is covered when a passage in the engine's list supports it (majority over repeats); "
            "? marks an engine whose supports could not all be read (never counted as missed).",
            "muted",
        ),
        Table(head, rows, frozenset({1, 2, 3})),
    ]
    no_set = [q.query_id for q in found.queries if not q.nuggets]
    if no_set:
        shown = ", ".join(no_set[:10]) + (" ..." if len(no_set) > 10 else "")
        blocks.append(Text(f"No nugget set (its creation failed): {shown}.", "bad"))
    blocks.append(
        Table(["query", "nugget", "text", "importance", *engines], nuggets[:MAX_NUGGET_ROWS])
    )
    if len(nuggets) > MAX_NUGGET_ROWS:
        more = len(nuggets) - MAX_NUGGET_ROWS
        blocks.append(
            Text(f"... and {more} more nuggets in summary.json and nuggets.jsonl.", "muted")
        )
    return Section("coverage", "Coverage (nuggets)", blocks)


def credibility_section(results: Sequence[JudgedQuery]) -> Section | None:
    """Credibility grades per engine, and the sources each engine had graded low (repeat 0)."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    low: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    for jq in results:
        urls = {p.id: p.url or p.title or p.id for p in jq.query.passages}
        for c in jq.credibility or ():
            engine = jq.query.engine
            counts[engine][_GRADES[c.grade] if c.grade is not None else c.status] += 1
            if c.grade == 0 and jq.repeat == 0:
                source = urls.get(c.passage_id, c.passage_id)
                low[engine].append((jq.query.query_id, source, c.reason or ""))
    if not counts:
        return None
    kinds = [*_GRADES.values(), "unparsed", "error"]
    rows = [[e, *(c.get(k, 0) for k in kinds)] for e, c in sorted(counts.items())]
    blocks: list[Text | Table | Chart] = [
        Text(
            "The judge's view of each passage's source, from its URL, title and text: high "
            "(authoritative on the topic), medium (ordinary), low (unreliable). Unparsed and "
            "error are failures, never low.",
            "muted",
        ),
        Table(["engine", *kinds], rows, frozenset(range(1, len(kinds) + 1))),
    ]
    listed = [[e, *item] for e, items in sorted(low.items()) for item in items[:LOWEST]]
    if listed:
        blocks.append(Text(f"Sources graded low (repeat 0, at most {LOWEST} per engine)", "h3"))
        blocks.append(Table(["engine", "query", "source", "reason"], listed))
    return Section("credibility", "Source credibility", blocks)
