"""Every query of a run: its per-query row (summary.json and the report's query table), and its
passages as the judge saw them, next to the human label where the dataset has one.

A query's metric is its mean over the repeats where it is defined (the numbers ``judge
compare`` pairs). A passage's judge label is the most frequent label of its ``ok`` verdicts
across repeats (a tie keeps the lower grade, as the majority vote does), shown with how many
repeats gave it when they disagree; its reason is the first such verdict's, its P(relevant)
the mean over the ok verdicts that carry one. Human labels are compared on the judge's scale
(labels on another scale map through relevance, see
:func:`labels_on_scale`): a passage whose human label differs from the
judge's majority label is a disagreement, marked in the report and counted per query.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from judge.analysis.compare import per_query_values, score_misses
from judge.config import RunConfig
from judge.report.blocks import Chart, Link, Section, Table, Text, format_value
from judge.schema import JudgedQuery, MetricPolicy, Record, Scale, Verdict

EXCERPT_CHARS = 240
# Queries a report lists, and shows the passages of, at most (x2 with human labels).
SHOWN = 500


class QueryRow(Record):
    """One (query, engine) of a run: each metric's mean over repeats, and what went wrong."""

    query_id: str
    engine: str
    query: str
    repeats: int
    passages: int
    # Verdicts that are not ok (unparsed or error), over every repeat; of them, unparsed.
    failed: int
    unparsed: int = 0
    metrics: dict[str, float | None]
    # Passages with a human label, and of those how many the judge's majority label disagrees
    # with (None when the row carries no human label).
    labelled: int = 0
    disagreements: int | None = None


def night_values(
    metric: str, nights: Mapping[str, Sequence[QueryRow]]
) -> tuple[dict[str, dict[str, float]], dict[str, set[str]], int]:
    """Per side (rows of one engine: a night's, or an engine's of one run): ``metric`` per
    query id where defined, a query one side found nothing relevant in and another did
    counting 0 for it (:func:`judge.analysis.compare.score_misses`; a row without the metric
    at all did not compute it, and is not scored); the query ids each side holds; how many
    values were so scored."""
    values = {
        side: {r.query_id: v for r in rows if (v := r.metrics.get(metric)) is not None}
        for side, rows in nights.items()
    }
    # A row that never computed the metric (a summary made with other metric names) is not
    # a query that found nothing: it is not scored 0.
    judged = {
        side: {r.query_id for r in rows if not r.failed and metric in r.metrics}
        for side, rows in nights.items()
    }
    scored = score_misses(metric, values, judged)
    return values, {side: {r.query_id for r in rows} for side, rows in nights.items()}, scored


@dataclass(frozen=True)
class PassageView:
    """One passage of one (query, engine) over its repeats, as the report shows it."""

    rank: int
    passage_id: str
    text: str
    label: str
    votes: str
    grade: int | None
    relevant: bool
    probability: float | None
    reason: str
    failed: int
    human: str | None
    disagrees: bool
    signals: tuple[str, ...] = ()  # what fired on it in any repeat (echo, sanitised)


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def grouped(results: Sequence[JudgedQuery]) -> dict[tuple[str, str], list[JudgedQuery]]:
    """Rows per (query id, engine), keys sorted, repeats in order."""
    groups: dict[tuple[str, str], list[JudgedQuery]] = defaultdict(list)
    for jq in results:
        groups[(jq.query.query_id, jq.query.engine)].append(jq)
    return {key: sorted(groups[key], key=lambda jq: jq.repeat) for key in sorted(groups)}


def _majority(ok: Sequence[Verdict]) -> Verdict:
    """The first verdict of the most frequent grade; a tie keeps the lower grade."""
    counts = Counter(v.grade for v in ok)
    top = max(counts.values())
    grade = min(g for g, c in counts.items() if c == top and g is not None)
    return next(v for v in ok if v.grade == grade)


def _human(
    grade: int | None, label_scale: Scale | None, scale: Scale
) -> tuple[str | None, int | None]:
    """A human grade as shown (its label on its own scale) and as compared (on the judge's
    scale; None when it cannot be: a grade the scale does not have)."""
    if grade is None:
        return None, None
    own = label_scale or scale
    names = {lab.grade: lab.name for lab in own.labels}
    if grade not in names:
        return str(grade), None
    shown = f"{names[grade]} ({grade})"
    if own != scale:
        return shown, int(own.relevant(grade))
    return shown, grade


def labels_on_scale(results: Sequence[JudgedQuery], config: RunConfig) -> list[JudgedQuery]:
    """Human labels expressed on the judge's scale.

    Labels on another scale are mapped through relevance: a binary judge compares with
    ``label >= label_scale.threshold``. A graded judge cannot be compared with coarser labels.
    """
    label_scale = config.comparable_label_scale()
    if label_scale == config.scale():
        return list(results)
    out = []
    for jq in results:
        labels = jq.query.labels
        if labels:
            mapped = {pid: int(label_scale.relevant(g)) for pid, g in labels.items()}
            jq = jq.model_copy(update={"query": jq.query.model_copy(update={"labels": mapped})})
        out.append(jq)
    return out


def passage_views(
    rows: Sequence[JudgedQuery], scale: Scale, label_scale: Scale | None = None
) -> list[PassageView]:
    """The passages of one (query, engine)'s repeats, by rank; see the module doc."""
    query = rows[0].query
    texts = {p.id: p.text for p in query.passages}
    labels = query.labels or {}
    seen: dict[str, list[Verdict]] = defaultdict(list)
    for jq in rows:
        for v in jq.verdicts:
            seen[v.passage_id].append(v)
    views = []
    for pid, verdicts in seen.items():
        ok = [v for v in verdicts if v.status == "ok" and v.grade is not None]
        failed = len(verdicts) - len(ok)
        pick = _majority(ok) if ok else verdicts[0]
        agree = sum(v.grade == pick.grade for v in ok)
        probs = [v.probability for v in ok if v.probability is not None]
        human, human_grade = _human(labels.get(pid), label_scale, scale)
        raw = f"raw answer: {excerpt(pick.raw, 160)}" if pick.raw else ""
        views.append(
            PassageView(
                rank=min(v.rank for v in verdicts),
                passage_id=pid,
                text=excerpt(texts.get(pid, "")),
                label=pick.label if ok and pick.label else pick.status,
                votes="" if agree == len(verdicts) else f"{agree} of {len(verdicts)}",
                grade=pick.grade if ok else None,
                relevant=bool(ok) and pick.grade is not None and scale.relevant(pick.grade),
                probability=sum(probs) / len(probs) if probs else None,
                reason=pick.reason or pick.error or raw,
                failed=failed,
                human=human,
                disagrees=bool(ok) and human_grade is not None and human_grade != pick.grade,
                signals=tuple(sorted({s for v in verdicts for s in v.signals})),
            )
        )
    return sorted(views, key=lambda p: (p.rank, p.passage_id))


def query_rows(
    results: Sequence[JudgedQuery],
    names: Sequence[str],
    scale: Scale,
    policy: MetricPolicy = MetricPolicy(),
    label_scale: Scale | None = None,
) -> tuple[QueryRow, ...]:
    """One row per (query id, engine), sorted by both; ``results`` hold human labels on the
    judge's scale unless ``label_scale`` says what scale they are on."""
    values = per_query_values(results, names, scale, policy)
    out = []
    for (qid, engine), rows in grouped(results).items():
        if rows[0].query.labels:
            views = passage_views(rows, scale, label_scale)
            labelled, disagree = (
                sum(p.human is not None for p in views),
                sum(p.disagrees for p in views),
            )
            judged = len(views)
        else:  # no human label to compare: the views' other fields are not needed here
            labelled, disagree = 0, 0
            judged = len({v.passage_id for jq in rows for v in jq.verdicts})
        out.append(
            QueryRow(
                query_id=qid,
                engine=engine,
                query=rows[0].query.query,
                repeats=len(rows),
                passages=judged,
                failed=sum(1 for jq in rows for v in jq.verdicts if v.status != "ok"),
                unparsed=sum(1 for jq in rows for v in jq.verdicts if v.status == "unparsed"),
                labelled=labelled,
                disagreements=disagree if labelled else None,
                metrics={n: values[n].get(engine, {}).get(qid) for n in names},
            )
        )
    return tuple(out)


# --- the report's sections ----------------------------------------------------------------


def anchors(rows: Sequence[QueryRow]) -> dict[tuple[str, str], str]:
    """Each (query id, engine)'s id in the page, where its passages are."""
    return {(r.query_id, r.engine): f"q-{i}" for i, r in enumerate(rows, 1)}


def _table(
    rows: Sequence[QueryRow],
    names: Sequence[str],
    ids: dict[tuple[str, str], str],
    fold: str | None,
) -> Table:
    labelled = any(r.disagreements is not None for r in rows)
    head = ["query", "engine", "text", *names, "failed"] + (["human ≠"] if labelled else [])
    cells = [
        [Link(r.query_id, ids[(r.query_id, r.engine)]), r.engine, excerpt(r.query, 90)]
        + [r.metrics.get(n) for n in names]
        + [r.failed]
        + ([r.disagreements] if labelled else [])
        for r in rows
    ]
    css = ["failed" if r.failed else "" for r in rows]
    return Table(head, cells, frozenset(range(3, len(head))), css, fold=fold)


def _lowest_first(first: str | None) -> Callable[[QueryRow], tuple[bool, float, str, str]]:
    def lowest(r: QueryRow) -> tuple[bool, float, str, str]:
        value = r.metrics.get(first) if first else None
        return value is None, value or 0.0, r.query_id, r.engine

    return lowest


def _most_disagreements(r: QueryRow) -> tuple[int, str, str]:
    return -(r.disagreements or 0), r.query_id, r.engine


def shown_rows(rows: Sequence[QueryRow], names: Sequence[str]) -> list[QueryRow]:
    """The rows a report lists (and shows the passages of), by query id: every row up to
    :data:`SHOWN`; beyond it the SHOWN lowest on the first metric and the SHOWN with most
    disagreements with human labels. A page of a large run's every passage is more than a
    browser opens; summary.json keeps every row and verdicts.jsonl every passage."""
    if len(rows) <= SHOWN:
        return list(rows)
    keep = sorted(rows, key=_lowest_first(names[0] if names else None))[:SHOWN]
    keep += sorted((r for r in rows if r.disagreements), key=_most_disagreements)[:SHOWN]
    chosen = {(r.query_id, r.engine) for r in keep}
    return [r for r in rows if (r.query_id, r.engine) in chosen]


def query_table_section(rows: Sequence[QueryRow], names: Sequence[str]) -> Section:
    """Every (query, engine) with each metric (up to :data:`SHOWN`; see :func:`shown_rows`):
    lowest first on the first metric (undefined last), and in the HTML the same rows by query
    id and by disagreement with humans."""
    total, rows = len(rows), shown_rows(rows, names)
    ids = anchors(rows)
    first = names[0] if names else None
    blocks: list[Text | Table | Chart] = [
        _table(sorted(rows, key=_lowest_first(first)), names, ids, None),
        _table(rows, names, ids, "the same queries by query id"),
    ]
    if any(r.disagreements for r in rows):
        by_humans = sorted(rows, key=_most_disagreements)
        blocks.append(_table(by_humans, names, ids, "the same queries, most disagreements first"))
    note = (
        "Each metric: the query's mean over the repeats where it is defined (— undefined). "
        "failed: unparsed or error verdicts. human ≠: passages whose human label differs "
        "from the judge's. A query id links to its passages."
    )
    if len(rows) < total:
        note += (
            f" Listed: {len(rows)} of {total} queries, the {SHOWN} lowest on {first}"
            + (" and the most disagreements with humans" if blocks[2:] else "")
            + "; summary.json has every query's row and verdicts.jsonl every passage."
        )
    blocks.append(Text(note, "muted"))
    order = f"lowest {first} first" if first else "by query id"
    listed = f"{len(rows)} of {total}" if len(rows) < total else str(total)
    return Section("queries", f"Queries ({listed}; {order})", blocks)


def _passage_table(views: Sequence[PassageView], humans: bool, probs: bool) -> Table:
    head = ["#", "passage", "text", "judge"]
    head += (["P(relevant)"] if probs else []) + (["human"] if humans else []) + ["reason"]
    rows, css = [], []
    for p in views:
        judge = p.label + (f" ({p.votes})" if p.votes else "")
        judge += "".join(f" [{signal}]" for signal in p.signals)
        human = (p.human or "—") + (" ≠" if p.disagrees else "")
        rows.append(
            [p.rank, p.passage_id, p.text, judge]
            + ([p.probability] if probs else [])
            + ([human] if humans else [])
            + [p.reason]
        )
        css.append(
            "failed"
            if p.grade is None
            else "disagree"
            if p.disagrees
            else "relevant"
            if p.relevant
            else ""
        )
    return Table(head, rows, frozenset({0, 4} if probs else {0}), css)


def passages_section(
    results: Sequence[JudgedQuery],
    rows: Sequence[QueryRow],
    names: Sequence[str],
    scale: Scale,
    label_scale: Scale | None,
) -> Section:
    """The passages of every query listed (:func:`shown_rows`) with the judge's label,
    reason, P(relevant) and human label."""
    rows = shown_rows(rows, names)
    ids = anchors(rows)
    metrics = {(r.query_id, r.engine): r.metrics for r in rows}
    humans = any(jq.query.labels for jq in results)
    probs = any(v.probability is not None for jq in results for v in jq.verdicts)
    blocks: list[Text | Table | Chart] = []
    for key, group in grouped(results).items():
        if key not in ids:
            continue
        values = metrics.get(key, {})
        shown = " · ".join(f"{n} {format_value(values.get(n))}" for n in names[:6])
        repeats = f" (mean over {len(group)} repeats)" if len(group) > 1 else ""
        blocks += [
            Text(f"{key[0]} / {key[1]}", "h3", ids.get(key)),
            Text(group[0].query.query, "quote"),
            Text(shown + repeats, "muted"),
            _passage_table(passage_views(group, scale, label_scale), humans, probs),
        ]
    note = "judge: the most frequent label over repeats (how many gave it when they differ)"
    if humans:
        note += "; human ≠: the human label differs from the judge's"
    return Section("passages", "Passages of every query", [Text(note + ".", "muted"), *blocks])


def failed_section(results: Sequence[JudgedQuery], rows: Sequence[QueryRow]) -> Section | None:
    """Queries with unparsed or error verdicts: their metrics are undefined, never 0. A query
    id links to its passages when ``rows`` (those the report lists) hold it."""
    ids = anchors(rows)
    failed = [jq for jq in results if any(v.status != "ok" for v in jq.verdicts)]
    if not failed:
        return None
    table = []
    for jq in failed:
        bad = [v for v in jq.verdicts if v.status != "ok"]
        first = bad[0].error or (f"raw answer: {bad[0].raw[:120]}" if bad[0].raw else "")
        key = (jq.query.query_id, jq.query.engine)
        link = Link(jq.query.query_id, ids[key]) if key in ids else jq.query.query_id
        kinds = Counter(v.status for v in bad)
        table.append([link, jq.query.engine, jq.repeat, kinds["unparsed"], kinds["error"], first])
    head = ["query", "engine", "repeat", "unparsed", "error", "first problem"]
    title = f"Queries with failed verdicts ({len(failed)} query-repeats; metrics undefined)"
    return Section(
        "failed", title, [Table(head, table, frozenset({2, 3, 4}), ["failed"] * len(table))]
    )
