"""report.md and a self-contained report.html from a run's :class:`Summary` and results.

summary.json (:mod:`judge.report.summary`) stays the machine-readable output; these two are
for people. Both are rendered from one header and one list of sections, so they say the same
things; only the HTML has charts and the extra orders of the query table. The first screen
answers at a glance: the status (PASSED / FAILED / INCOMPLETE / JUDGE UNRELIABLE,
:mod:`judge.report.status`) with its reasons one line each, the config, dataset, model and
date, then each engine's metrics with 95% CIs. Below: thresholds, the engines compared
(paired), authority and redundancy (:mod:`judge.report.sources`), coverage of the nuggets and
source credibility (:mod:`judge.report.coverage`), every query with each metric, judge
health, charts, stability, human labels, history, and every query's passages with the
judge's label and reason and the human label.
A section with nothing to say is left out: no stability with one repeat, no chart of a metric
no query defines. The page has no script and references nothing outside itself (charts are
inline SVG from :mod:`judge.report.charts`; a Content-Security-Policy forbids every load), so
it opens offline and as an attachment. Every text that came from data (queries, passages,
reasons, engine names) is escaped: a passage holding ``<script>`` shows as text, in both files.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from judge.analysis import health as hc
from judge.analysis.compare import DEFAULT_POOLED, Comparison, compare
from judge.analysis.stability import StabilityReport
from judge.data.lines import write_atomic
from judge.metrics.facts import lower_is_better, primary_metric
from judge.report.blocks import (
    Chart,
    Header,
    Section,
    Table,
    Text,
    format_value,
    lazy_chart,
    render_html,
    render_markdown,
)
from judge.report.compared import (
    Nights,
    ci_text,
    compare_section,
    nightly_section,
    pooled_counterpart,
)
from judge.report.coverage import coverage_section, credibility_section
from judge.report.history import HistoryRow
from judge.report.human import agreement_section, corrected_section
from judge.report.queries import (
    QueryRow,
    anchors,
    failed_section,
    night_values,
    passages_section,
    query_rows,
    query_table_section,
    shown_rows,
)
from judge.report.sources import sources_section
from judge.report.status import header
from judge.report.summary import Check, Summary
from judge.schema import JudgedQuery, Scale

CHART_METRICS = 6


def run_comparison(summary: Summary, results: Sequence[JudgedQuery]) -> Comparison | None:
    """Paired comparison of the run's engines (None for one engine), pooled metrics included,
    with the summary's resamples and seed (what ``judge compare`` on the run prints)."""
    if len({jq.query.engine for jq in results}) < 2:
        return None
    leader = leading_engine(summary)
    return compare(
        results,
        list(
            dict.fromkeys(
                [
                    *summary.metric_names,
                    *DEFAULT_POOLED,
                    *pooled_counterpart(summary.metric_names, summary.policy.primary),
                ]
            )
        ),
        summary.config.scale,
        baseline=leader,
        best_of=leader is not None,
        n_boot=summary.stability.n_boot,
        seed=summary.stability.seed,
        policy=summary.policy,
    )


def leading_engine(summary: Summary) -> str | None:
    """Of three engines or more, the one the others are compared with: the best on the
    primary metric, so the verdict says how each falls short of it (or does not); two
    engines keep their order (None: the first by name). Only an engine that holds at least
    half as many queries as the one holding the most can lead (one asked a few easy queries
    is not the best), judged over the queries those engines all hold, a query one found
    nothing relevant in counting 0 for it where another found something (as compared)."""
    metric = primary_metric(summary.metric_names, summary.policy.primary)
    if len(summary.engines) < 3 or metric is None:
        return None
    means = {e: data.mean(metric) for e, data in summary.engines.items()}
    rows = {e: [r for r in summary.queries if r.engine == e] for e in summary.engines}
    most = max(len(group) for group in rows.values())
    if most:  # of those that hold at least half the most queries, over those all of them hold
        rows = {e: group for e, group in rows.items() if 2 * len(group) >= most}
        shared = set.intersection(*({r.query_id for r in group} for group in rows.values()))
        values, _, _ = night_values(
            metric, {e: [r for r in group if r.query_id in shared] for e, group in rows.items()}
        )
        means = {e: sum(v.values()) / len(v) if v else None for e, v in values.items()}
    known = {e: m for e, m in means.items() if m is not None}
    if not known:
        return None
    pick = min if lower_is_better(metric) else max
    return pick(sorted(known), key=lambda e: known[e])


def _paid(summary: Summary) -> str:
    """What this run itself paid (its cache's answers cost it nothing), when it is known."""
    run = summary.run
    if run is None:
        return ""
    if run.worst_counted:  # their usage unknown: counted at the worst case, as the budget did
        return (
            f"; this run paid at most {format_value(run.cost_usd)} USD for {run.requests} "
            f"request(s), {run.prompt_tokens} + {run.completion_tokens} tokens ("
            f"{run.worst_counted} of them counted at their worst case: no usage was reported "
            "for them)"
        )
    return (
        f"; this run paid {format_value(run.cost_usd)} USD for {run.requests} request(s), "
        f"{run.prompt_tokens} + {run.completion_tokens} tokens"
    )


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
            f"{c.unparsed} unparsed, {c.failed_words()}."
            + (
                f" {c.sanitised} passage(s) carried text aimed at the judge (instructions, "
                "forged fences or verdicts, the query stuffed in), taken out before judging; "
                'verdicts.jsonl lists it under "removed".'
                if c.sanitised
                else ""
            )
        ),
        *([Text("Flagged passages: " + "; ".join(c.flag_lines()) + ".")] if c.flag_lines() else []),
        *([Text(f"Empty passages: {c.blank_words()}.")] if c.blank else []),
        *([Text(f"Truncated: {c.truncated_words()}.")] if c.truncated else []),
        Text(
            f"Tokens of the verdicts' answers: {u.prompt_tokens} prompt + "
            f"{u.completion_tokens} completion, {format_value(u.cost_usd)} USD at list price "
            f"(what a run without the cache pays){_paid(summary)}. {policy} Created "
            f"{summary.created}; config {summary.config.source}.",
            "muted",
        ),
    ]


def _health(summary: Summary, results: Sequence[JudgedQuery]) -> hc.JudgeHealth:
    """The summary's judge health, measured from the results when the summary predates it."""
    return (
        summary.health if summary.health.known else hc.judge_health(results, summary.config.scale)
    )


def _health_section(health: hc.JudgeHealth) -> Section:
    """What the run shows about its judge (its sentences), then the label distribution and
    P(relevant) spread, per engine and over all engines."""
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
    blocks: list[Text | Table | Chart] = [
        Text("Unreliable: the metrics are not informative (see the top).", "bad")
        if health.degenerate
        else Text("Not degenerate.", "ok"),
        # The sentences summary.json and the console carry, as they are (analysis/health.py).
        *(Text(problem, "bad") for problem in health.problems),
        *(Text(line) for line in health.findings),
        *(Text(line, "muted") for line in health.caveats + health.notes),
        Table(["engine", "ok verdicts", *names, "most common"], labels, frozenset({1})),
        Table(head, spreads, frozenset(range(1, len(head))))
        if health.overall.probability.n
        else Text("No verdict carries P(relevant) (that needs logprobs).", "muted"),
        Text(
            f"Unreliable: one label on {hc.DOMINANT_SHARE:.0%} or more of at least "
            f"{hc.MIN_VERDICTS} ok verdicts, or at least {hc.MIN_VERDICTS} P(relevant) with a "
            f"std under {hc.FLAT_STD} or {hc.DOMINANT_SHARE:.0%} of them within "
            f"{hc.FLAT_WIDTH} of each other (peak); with at least {hc.MIN_LABELLED} human labels "
            f"({hc.MIN_EACH} each way), relevance kappa under {hc.KAPPA_BAR} or AUC under "
            f"{hc.AUC_BAR}; most passages in a language the model does not serve.",
            "muted",
        ),
    ]
    return Section("health", "Judge health", blocks)


def _defined(summary: Summary) -> tuple[list[str], list[str]]:
    """The metric names some engine has a mean for, and those no query defines."""
    names = list(summary.metric_names)
    some = [n for n in names if any(d.mean(n) is not None for d in summary.engines.values())]
    return some, [n for n in names if n not in some]


def _metrics_section(summary: Summary, rows: Sequence[QueryRow], worst: int) -> Section:
    """The headline: metrics down, engines across, mean [95% CI] (unpaired), then the lowest
    queries on the first metric."""
    names, undefined = _defined(summary)
    engines = list(summary.engines)

    def cell(engine: str, name: str) -> str:
        data = summary.engines[engine]
        m = data.metrics.get(name)
        if m is None or m.mean is None:
            return format_value(None)
        said = f"{m.mean:.4f} {ci_text(m.ci_low, m.ci_high)}"
        # A mean over a few of the engine's queries (the rest found nothing relevant, or
        # were not judged fully) is not its mean over all of them: said beside it.
        if m.n_defined < data.n_queries:
            said += f" ({m.n_defined} of {data.n_queries} queries)"
        return said

    table = Table(["metric", *engines], [[n, *(cell(e, n) for e in engines)] for n in names])
    n_queries = ", ".join(f"{e} {d.n_queries}" for e, d in summary.engines.items())
    st = summary.stability
    blocks: list[Text | Table | Chart] = [
        table,
        Text(
            f"Unpaired: each engine's mean over its own queries ({n_queries}); 95% CI by "
            f"bootstrap over queries ({st.n_boot} resamples, seed {st.seed}; judge compare on "
            "this run prints the same).",
            "muted",
        ),
    ]
    if undefined:
        blocks.append(Text(f"Undefined for every query: {', '.join(undefined)}.", "muted"))
    scored = [r for r in rows if names and r.metrics.get(names[0]) is not None]
    low = sorted(scored, key=lambda r: (r.metrics[names[0]] or 0.0, r.query_id, r.engine))
    if low[:worst] and low[0].metrics[names[0]] != low[-1].metrics[names[0]]:
        listed = " · ".join(
            f"{r.query_id}/{r.engine} {format_value(r.metrics[names[0]])}" for r in low[:worst]
        )
        blocks.append(Text(f"Lowest {names[0]}: {listed}"))
    return Section("metrics", "Metrics (mean, 95% CI)", blocks)


def _history_section(
    history: Sequence[HistoryRow], names: Sequence[str], engines: Sequence[str]
) -> Section:
    present = {m for row in history for values in row.values.values() for m in values}
    flagged_first = [r.metric for row in history for r in row.regressions]
    metrics = [m for m in dict.fromkeys([*flagged_first, *names]) if m in present][:4]
    # Runs of one config may judge other files (a nightly sample each night): each says its.
    rows = [
        [row.run_id, row.created[:16].replace("T", " "), Path(row.dataset or "—").name]
        + [row.values.get(e, {}).get(m) for e in engines for m in metrics]
        + ["; ".join(r.describe() for r in row.regressions) or "—"]
        for row in history
    ]
    head = ["run", "created", "dataset"]
    head += [*(f"{e} {m}" for e in engines for m in metrics), "regressions"]
    flagged = {(r.run_id, r.engine, r.metric) for row in history for r in row.regressions}
    runs = [(row.run_id, row.values) for row in history]
    n_flagged = sum(1 for row in history if row.regressions)
    status = None
    if n_flagged:  # means of whole runs: the drop check pairs the queries both nights hold
        said = f"{n_flagged} run(s) flagged as regressions: each run's mean against the "
        said += "previous run's, over the queries each held (the drop checks pair the "
        said += "queries both nights hold, and can pass where these means fell)."
        status = Text(said, "bad")
    return Section(
        "history",
        f"History (last {len(history)} runs)",
        [
            status or Text("No regressions.", "ok"),
            Table(head, rows, frozenset(range(3, len(head) - 1))),
            Chart(
                lazy_chart("history_trend", runs, metrics, engines, flagged),
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


def _distribution_section(
    summary: Summary, rows: Sequence[QueryRow], names: Sequence[str]
) -> Section | None:
    """Per-query values (``rows``: every query's) of the first metrics with something to
    show: a metric no query defines gets no panel, one every query scores the same is named
    instead of drawn."""
    engines = list(summary.engines)
    dist: dict[str, dict[str, list[float]]] = {m: {e: [] for e in engines} for m in names}
    for row in rows:
        for m in names:
            value = row.metrics.get(m)
            if value is not None and row.engine in dist[m]:
                dist[m][row.engine].append(value)
    flat = {
        m: vs[0]
        for m in names
        if len(vs := [v for e in engines for v in dist[m][e]]) and max(vs) == min(vs)
    }
    shown = {m: d for m, d in dist.items() if any(d.values()) and m not in flat}
    same = ", ".join(f"{m} {v:.4f}" for m, v in flat.items())
    if not shown and not flat:
        return None
    if not shown:
        note = f"Not drawn: every query scores the same on each metric ({same})."
        return Section("distribution", "Per-query metric distribution", [Text(note, "muted")])
    caption = "one dot per query (mean over repeats)"
    if flat:
        caption += f"; not drawn, every query the same: {same}"
    chart = Chart(lazy_chart("metric_distribution", shown, engines), caption)
    return Section("distribution", "Per-query metric distribution", [chart])


def _threshold_section(checks: Sequence[Check]) -> Section:
    rows = [
        [
            c.check,
            c.engine,
            c.value,
            c.limit,
            "not evaluated" if not c.evaluated else "ok" if c.ok else "BREACHED",
            c.note,
        ]
        for c in checks
    ]
    css = ["" if c.ok else "failed" for c in checks]
    table = Table(
        ["check", "engine", "value", "limit", "result", "note"], rows, frozenset({2, 3}), css
    )
    return Section("thresholds", "Thresholds", [table])


def _stability_section(st: StabilityReport, shown: Sequence[str]) -> Section | None:
    """Per-repeat means (chart), label flips and alpha per engine; None with one repeat."""
    if max((x.n_repeats for x in st.engines.values()), default=1) < 2:
        return None
    per_repeat = {
        e: {
            m: x.metrics[m].per_repeat
            for m in shown
            if m in x.metrics and any(v is not None for v in x.metrics[m].per_repeat)
        }
        for e, x in st.engines.items()
    }
    firsts = {e: x.metrics.get(shown[0]) if shown else None for e, x in st.engines.items()}
    repeats = {e: first.repeats if first else () for e, first in firsts.items()}
    flips = [[e, x.flips.flip_rate, x.flips.n_passages, x.alpha] for e, x in st.engines.items()]
    return Section(
        "stability",
        "Stability across repeats",
        [
            Text(f"Krippendorff's alpha ({st.alpha_level}): {format_value(st.alpha)}"),
            Table(["engine", "label flip rate", "passages", "alpha"], flips, frozenset({1, 2, 3})),
            Chart(lazy_chart("stability_lines", per_repeat, repeats), "per-repeat means"),
        ],
    )


def _labels_section(results: Sequence[JudgedQuery], scale: Scale) -> Section:
    """Verdicts per label and failure kind, per engine (chart and table)."""
    labels = [lab.name for lab in sorted(scale.labels, key=lambda lab: lab.grade)]
    counts = _label_counts(results)
    caption = "unparsed and error are failures, never 'not relevant'"
    section = Section(
        "labels",
        "Verdict labels",
        [Chart(lazy_chart("label_distribution", counts, labels), caption)],
    )
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
    nights: Nights | None = None,
) -> list[Section]:
    """The report's content below the header, in order, for both renderers."""
    names = list(summary.metric_names)
    defined, _ = _defined(summary)
    rows = list(summary.queries) or list(
        query_rows(results, names, summary.config.scale, summary.policy, summary.label_scale)
    )
    health = _health(summary, results)
    found: list[Section | None] = [
        _metrics_section(summary, rows, worst),
        _threshold_section(summary.thresholds.checks) if summary.thresholds.checks else None,
        nightly_section(summary, nights, anchors(shown_rows(rows, defined))) if nights else None,
        compare_section(comparison) if comparison else None,
        sources_section(summary, results),
        coverage_section(summary.coverage, results),
        credibility_section(results),
        query_table_section(rows, defined),
        failed_section(results, shown_rows(rows, defined)),
        _health_section(health),
        _distribution_section(summary, rows, defined[:CHART_METRICS]),
        _stability_section(summary.stability, defined[:CHART_METRICS]),
        _labels_section(results, summary.config.scale),
        agreement_section(summary.stability.engines),
        corrected_section(summary),
        _history_section(history, names, list(summary.engines)) if len(history) > 1 else None,
        Section("overview", "Run", _overview(summary)),
        passages_section(results, rows, defined, summary.config.scale, summary.label_scale),
    ]
    return [s for s in found if s is not None]


def report_header(summary: Summary, results: Sequence[JudgedQuery]) -> Header:
    """The first screen: status, reasons, config, dataset, model and date."""
    return header(summary, _health(summary, results))


def markdown(summary: Summary, results: Sequence[JudgedQuery], **kwargs: Any) -> str:
    """report.md: the header and the sections without charts."""
    return render_markdown(report_header(summary, results), sections(summary, results, **kwargs))


def html_report(
    summary: Summary, results: Sequence[JudgedQuery], *, charts: bool = True, **kwargs: Any
) -> str:
    """report.html: one page, no script, nothing loaded from anywhere."""
    head = report_header(summary, results)
    return render_html(head, sections(summary, results, **kwargs), charts=charts)


def write_reports(
    out_dir: Path,
    summary: Summary,
    results: Sequence[JudgedQuery],
    *,
    history: Sequence[HistoryRow] = (),
    worst: int = 5,
    charts: bool = True,
    comparison: Comparison | None = None,
    nights: Nights | None = None,
) -> list[Path]:
    """Write report.md and report.html into ``out_dir``; ``history`` from
    :func:`judge.report.history.history_rows_for_report` adds the trend and regression flags;
    ``worst`` lowest-scoring queries are named under the metrics; ``nights`` (from
    :func:`judge.report.compared.night_diffs`) adds tonight against the baseline."""
    kwargs: dict[str, Any] = {
        "comparison": comparison or run_comparison(summary, results),
        "history": history,
        "worst": worst,
        "nights": nights,
    }
    md, page = Path(out_dir) / "report.md", Path(out_dir) / "report.html"
    # Built once for both pages: for a large run the sections are most of the work.
    head, body = report_header(summary, results), sections(summary, results, **kwargs)
    write_atomic(md, render_markdown(head, body))
    write_atomic(page, render_html(head, body, charts=charts))
    return [md, page]
