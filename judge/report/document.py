"""report.md and a self-contained report.html from a run's :class:`Summary` and results.

summary.json (:mod:`judge.report.summary`) stays the machine-readable output; these two are
for people. Both are rendered from one list of sections, so they say the same things; only
the HTML has charts. The page has no script and references nothing outside itself (charts
are inline SVG from :mod:`judge.report.charts`; a Content-Security-Policy forbids every
load), so it opens offline and as an attachment. Every text that came from data (queries,
passages, reasons, engine names) is escaped: a passage holding ``<script>`` shows as text, in
both files. The worst queries are listed with each passage's excerpt, label, status and the
judge's reason, so a reader sees why a query scored low; queries whose verdicts failed are
listed apart, since their metrics are undefined, never 0. A degenerate judge
(:mod:`judge.analysis.health`) puts a warning above everything else; its health is always shown.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from judge.analysis import health as hc
from judge.analysis.compare import DEFAULT_POOLED, Comparison, compare, per_query_values
from judge.analysis.stability import StabilityReport
from judge.report.blocks import (
    Chart,
    Section,
    Table,
    Text,
    format_value,
    render_html,
    render_markdown,
)
from judge.report.history import HistoryRow
from judge.report.human import agreement_section, corrected_section
from judge.report.summary import Check, EngineSummary, Summary
from judge.schema import JudgedQuery, Scale

EXCERPT_CHARS = 240
CHART_METRICS = 6


def _excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def run_comparison(summary: Summary, results: Sequence[JudgedQuery]) -> Comparison | None:
    """Paired comparison of the run's engines (None for one engine), pooled metrics included."""
    if len({jq.query.engine for jq in results}) < 2:
        return None
    return compare(
        results,
        list(dict.fromkeys([*summary.metric_names, *DEFAULT_POOLED])),
        summary.config.scale,
        n_boot=summary.stability.n_boot,
        seed=summary.stability.seed,
        policy=summary.policy,
    )


def worst_queries(
    results: Sequence[JudgedQuery], metric: str, n: int
) -> list[tuple[JudgedQuery, float]]:
    """The ``n`` (query, engine) pairs with the lowest mean ``metric`` over repeats, each with
    its lowest-scoring repeat (whose verdicts explain the score)."""
    groups: dict[tuple[str, str], list[JudgedQuery]] = defaultdict(list)
    for jq in results:
        if jq.metrics.get(metric) is not None:
            groups[(jq.query.query_id, jq.query.engine)].append(jq)
    ranked = []
    for rows in groups.values():
        values = [jq.metrics[metric] or 0.0 for jq in rows]
        lowest = min(rows, key=lambda jq: jq.metrics[metric] or 0.0)
        ranked.append((lowest, sum(values) / len(values)))
    ranked.sort(key=lambda pair: (pair[1], pair[0].query.query_id, pair[0].query.engine))
    return ranked[:n]


def _query_blocks(jq: JudgedQuery, what: str) -> list[Text | Table | Chart]:
    """A query's heading, text, and one row per passage: excerpt, label, status, reason."""
    by_id = {p.id: p for p in jq.query.passages}
    rows, css = [], []
    for v in sorted(jq.verdicts, key=lambda v: v.rank):
        passage = by_id.get(v.passage_id)
        reason = v.reason or v.error or (f"raw answer: {_excerpt(v.raw, 160)}" if v.raw else "")
        text = _excerpt(passage.text) if passage else ""
        rows.append([v.rank, v.passage_id, text, v.label or "", v.status, reason])
        css.append("failed" if v.status != "ok" else "relevant" if v.relevant else "")
    head = f"{jq.query.query_id} / {jq.query.engine} (repeat {jq.repeat}): {what}"
    table = Table(["#", "passage", "text", "label", "status", "reason"], rows, frozenset({0}), css)
    return [Text(head, "h3"), Text(jq.query.query, "quote"), table]


def _overview(summary: Summary) -> list[Text | Table | Chart]:
    c, u = summary.counts, summary.usage
    if summary.policy.unjudged == "skip":
        policy = "Queries with unparsed/error verdicts are scored on their judged passages only."
    else:
        policy = "Queries with an unparsed or error verdict have undefined metrics (not 0)."
    return [
        Text(
            f"{c.queries} queries ({c.query_ids} ids, engines: {', '.join(c.engines)}), "
            f"{c.repeats} repeat(s), {c.verdicts} verdicts: {c.ok} ok, "
            f"{c.unparsed} unparsed, {c.error} error."
        ),
        Text(
            f"Tokens: {u.prompt_tokens} prompt + {u.completion_tokens} completion; cost "
            f"{format_value(u.cost_usd)} USD. {policy} Created {summary.created}; config "
            f"{summary.config.source}.",
            "muted",
        ),
    ]


def _health(summary: Summary, results: Sequence[JudgedQuery]) -> hc.JudgeHealth:
    """The summary's judge health, measured from the results when the summary predates it."""
    return (
        summary.health if summary.health.known else hc.judge_health(results, summary.config.scale)
    )


def _warning_section(health: hc.JudgeHealth) -> Section:
    """The loud block a degenerate judge puts at the very top of the report."""
    title = "WARNING: the judge is degenerate, so these metrics are not informative"
    why = (
        "A judge that gives nearly every passage the same answer makes every metric "
        "meaningless: engines score about the same whatever they return."
    )
    return Section("warning", title, [Text(why), *(Text(p, "alert") for p in health.problems)])


def _health_section(health: hc.JudgeHealth) -> Section:
    """Label distribution and P(relevant) spread, per engine and over all engines."""
    groups = {**health.engines, "all engines": health.overall}
    names = [c.label for c in health.overall.labels]
    labels = [
        [e, s.ok, *(f"{c.count} ({c.share:.1%})" for c in s.labels), s.top_label]
        for e, s in groups.items()
    ]
    p = {e: s.probability for e, s in groups.items()}
    spreads = [
        [e, x.n, x.mean, x.std, x.p10, x.p90, x.distinct, x.peak_share] for e, x in p.items()
    ]
    head = ["engine", "with P(relevant)", "mean", "std", "p10", "p90", "distinct (0.01)", "peak"]
    status = Text("Degenerate: see the warning at the top.", "bad")
    blocks: list[Text | Table | Chart] = [
        status if health.degenerate else Text("Not degenerate.", "ok"),
        *(Text(note) for note in health.notes),
        Table(["engine", "ok verdicts", *names, "most common"], labels, frozenset({1})),
        Table(head, spreads, frozenset(range(1, len(head))))
        if health.overall.probability.n
        else Text("No verdict carries P(relevant) (that needs logprobs).", "muted"),
        Text(
            f"Degenerate: one label on {hc.DOMINANT_SHARE:.0%} or more of at least "
            f"{hc.MIN_VERDICTS} ok verdicts, or at least {hc.MIN_VERDICTS} P(relevant) with a "
            f"std under {hc.FLAT_STD} or {hc.DOMINANT_SHARE:.0%} of them within "
            f"{hc.FLAT_WIDTH} of each other (peak).",
            "muted",
        ),
    ]
    return Section("health", "Judge health", blocks)


def _mean_ci(data: EngineSummary, name: str) -> str:
    m = data.metrics.get(name)
    if m is None:
        return format_value(None)
    cell = format_value(m.mean)
    if m.ci_low is not None and m.ci_high is not None:
        cell += f" [{m.ci_low:.3f}, {m.ci_high:.3f}]"
    return cell


def _compare_section(cmp: Comparison) -> Section:
    diffs = {(d.metric, d.engine): d for d in cmp.diffs}
    rows: list[list[Any]] = []
    for metric in cmp.metrics:
        for engine in cmp.engines:
            m, d = cmp.means[metric][engine], diffs.get((metric, engine))
            if d is None:
                rows.append([metric, engine, m.n, m.mean, "baseline", "", "", ""])
                continue
            ci = None if d.ci_low is None else f"[{d.ci_low:+.4f}, {d.ci_high or 0.0:+.4f}]"
            diff = None if d.diff is None else f"{d.diff:+.4f}"
            rows.append([metric, engine, m.n, m.mean, diff, ci, d.p_value, d.n])
    head = ["metric", "engine", "n", "mean", f"diff vs {cmp.baseline}", "95% CI", "p", "paired"]
    blocks: list[Text | Table | Chart] = [
        Table(head, rows, frozenset({2, 3, 4, 6, 7})),
        Text(
            "diff: mean paired difference over the queries both engines define (paired); CI: "
            "bootstrap over queries; p: two-sided sign-flip test. pooled_*: the ideal ranking "
            "comes from every engine's judged passages (de-duplicated by id and text).",
            "muted",
        ),
    ]
    shown = list(dict.fromkeys([*cmp.metrics[:2], "pooled_ndcg"]))
    for engine in cmp.engines[1:]:
        pairs = {m: (cmp.per_query[m][cmp.baseline], cmp.per_query[m][engine]) for m in shown}
        blocks.append(
            Chart(
                partial(_draw, "engine_scatter", pairs, cmp.baseline, engine),
                f"per query: {engine} (y) against {cmp.baseline} (x)",
            )
        )
    return Section("compare", f"Engines compared (baseline {cmp.baseline})", blocks)


def _history_section(
    history: Sequence[HistoryRow], names: Sequence[str], engines: Sequence[str]
) -> Section:
    present = {m for row in history for values in row.values.values() for m in values}
    flagged_first = [r.metric for row in history for r in row.regressions]
    metrics = [m for m in dict.fromkeys([*flagged_first, *names]) if m in present][:4]
    rows = [
        [row.run_id, row.created[:16].replace("T", " ")]
        + [row.values.get(e, {}).get(m) for e in engines for m in metrics]
        + ["; ".join(r.describe() for r in row.regressions) or "—"]
        for row in history
    ]
    head = ["run", "created", *(f"{e} {m}" for e in engines for m in metrics), "regressions"]
    flagged = {(r.run_id, r.engine, r.metric) for row in history for r in row.regressions}
    runs = [(row.run_id, row.values) for row in history]
    n_flagged = sum(1 for row in history if row.regressions)
    status = Text(f"{n_flagged} run(s) flagged as regressions.", "bad") if n_flagged else None
    return Section(
        "history",
        f"History (last {len(history)} runs)",
        [
            status or Text("No regressions.", "ok"),
            Table(head, rows, frozenset(range(2, len(head) - 1))),
            Chart(
                partial(_draw, "history_trend", runs, metrics, engines, flagged),
                "red crosses: runs flagged as regressions",
            ),
        ],
    )


def _label_counts(results: Sequence[JudgedQuery]) -> dict[str, dict[str, int]]:
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for jq in results:
        for v in jq.verdicts:
            counts[jq.query.engine][v.label if v.status == "ok" and v.label else v.status] += 1
    return {engine: dict(c) for engine, c in sorted(counts.items())}


_CHARTS = {
    "distribution": ("Per-query metric distribution", "one dot per query (mean over repeats)"),
    "stability": ("Stability across repeats", "per-repeat means"),
    "labels": ("Verdict labels", "unparsed and error are failures, never 'not relevant'"),
}


def _draw(name: str, *args: Any) -> str:
    """Chart ``name`` of :mod:`judge.report.charts`, imported only when a chart is drawn:
    matplotlib takes about a second to import, and --no-charts or report.md need none."""
    from judge.report import charts

    draw: Callable[..., str] = getattr(charts, name)
    return draw(*args)


def _chart(ident: str, draw: Callable[[], str]) -> Section:
    title, caption = _CHARTS[ident]
    return Section(ident, title, [Chart(draw, caption)])


def _threshold_section(checks: Sequence[Check]) -> Section:
    rows = [
        [c.check, c.engine, c.value, c.limit, "ok" if c.ok else "BREACHED", c.note] for c in checks
    ]
    table = Table(["check", "engine", "value", "limit", "result", "note"], rows, frozenset({2, 3}))
    return Section("thresholds", "Thresholds", [table] if rows else [Text("None configured.")])


def _stability_section(st: StabilityReport, shown: Sequence[str]) -> Section:
    """Per-repeat means (chart), label flips and alpha per engine."""
    per_repeat = {
        e: {m: x.metrics[m].per_repeat for m in shown if m in x.metrics}
        for e, x in st.engines.items()
    }
    firsts = {e: x.metrics.get(shown[0]) if shown else None for e, x in st.engines.items()}
    repeats = {e: first.repeats if first else () for e, first in firsts.items()}
    flips = [[e, x.flips.flip_rate, x.flips.n_passages, x.alpha] for e, x in st.engines.items()]
    section = _chart("stability", partial(_draw, "stability_lines", per_repeat, repeats))
    section.blocks[:0] = [
        Text(f"Krippendorff's alpha ({st.alpha_level}): {format_value(st.alpha)}"),
        Table(["engine", "label flip rate", "passages", "alpha"], flips, frozenset({1, 2, 3})),
    ]
    return section


def _labels_section(results: Sequence[JudgedQuery], scale: Scale) -> Section:
    """Verdicts per label and failure kind, per engine (chart and table)."""
    labels = [lab.name for lab in sorted(scale.labels, key=lambda lab: lab.grade)]
    counts = _label_counts(results)
    section = _chart("labels", partial(_draw, "label_distribution", counts, labels))
    kinds = [*labels, "unparsed", "error"]
    rows = [[e, *(c.get(k, 0) for k in kinds)] for e, c in counts.items()]
    section.blocks.append(Table(["engine", *kinds], rows, frozenset(range(1, len(kinds) + 1))))
    return section


def sections(
    summary: Summary,
    results: Sequence[JudgedQuery],
    *,
    comparison: Comparison | None = None,
    history: Sequence[HistoryRow] = (),
    worst: int = 5,
) -> list[Section]:
    """The report's content, in order, for both renderers."""
    names, engines = list(summary.metric_names), list(summary.engines)
    shown = names[:CHART_METRICS]
    metric_rows = [[e, *(_mean_ci(d, n) for n in names)] for e, d in summary.engines.items()]
    values = per_query_values(results, shown, summary.config.scale, policy=summary.policy)
    dist = {m: {e: list(values[m].get(e, {}).values()) for e in engines} for m in shown}
    health = _health(summary, results)
    out = [_warning_section(health)] if health.degenerate else []
    out += [
        Section("overview", "Run", _overview(summary)),
        _health_section(health),
        Section("metrics", "Metrics (mean, 95% CI)", [Table(["engine", *names], metric_rows)]),
        _chart("distribution", partial(_draw, "metric_distribution", dist, engines)),
    ]
    if comparison:
        out.append(_compare_section(comparison))
    out += [
        _stability_section(summary.stability, shown),
        _labels_section(results, summary.config.scale),
    ]
    out += [
        s
        for s in (agreement_section(summary.stability.engines), corrected_section(summary))
        if s is not None
    ]
    if history:
        out.append(_history_section(history, names, engines))
    out.append(_threshold_section(summary.thresholds.checks))
    if names:
        low = worst_queries(results, names[0], worst)
        what = f"{names[0]} {{}} (mean over repeats)"
        blocks = [b for jq, v in low for b in _query_blocks(jq, what.format(format_value(v)))]
        out.append(Section("worst", f"Lowest {names[0]}", blocks))
    failed = [jq for jq in results if any(v.status != "ok" for v in jq.verdicts)]
    if failed:
        blocks = [b for jq in failed[:worst] for b in _query_blocks(jq, "metrics undefined")]
        title = f"Queries with failed verdicts ({len(failed)}; showing {min(worst, len(failed))})"
        out.append(Section("failed", title, blocks))
    return out


def markdown(summary: Summary, results: Sequence[JudgedQuery], **kwargs: Any) -> str:
    """report.md: the sections without charts."""
    return render_markdown(sections(summary, results, **kwargs))


def html_report(
    summary: Summary, results: Sequence[JudgedQuery], *, charts: bool = True, **kwargs: Any
) -> str:
    """report.html: one page, no script, nothing loaded from anywhere."""
    return render_html(sections(summary, results, **kwargs), charts=charts)


def write_reports(
    out_dir: Path,
    summary: Summary,
    results: Sequence[JudgedQuery],
    *,
    history: Sequence[HistoryRow] = (),
    worst: int = 5,
    charts: bool = True,
) -> list[Path]:
    """Write report.md and report.html into ``out_dir``; ``history`` from
    :func:`judge.report.history.history_rows_for_report` adds the trend and regression flags."""
    kwargs: dict[str, Any] = {
        "comparison": run_comparison(summary, results),
        "history": history,
        "worst": worst,
    }
    md, page = Path(out_dir) / "report.md", Path(out_dir) / "report.html"
    md.write_text(markdown(summary, results, **kwargs), encoding="utf-8")
    page.write_text(html_report(summary, results, charts=charts, **kwargs), encoding="utf-8")
    return [md, page]
