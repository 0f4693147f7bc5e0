"""Engines or runs compared, for people: the run report's comparison section and the page
``judge compare --html`` writes, both from one :class:`~judge.analysis.compare.Comparison`.

Numbers are labelled *unpaired* (an engine's mean over its own queries, with a 95% CI) or
*paired* (the mean difference over the queries both define, with its CI, sign-flip p-value and
win / tie / loss count). A p-value the test could not push below 0.05 whatever the data (too
few differing pairs, see :func:`judge.analysis.compare.sign_flip_floor`) says so beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from judge.analysis.compare import (
    SIGNIFICANCE,
    Comparison,
    PairedDiff,
    paired_diff,
    parse_pooled,
    question,
)
from judge.metrics.facts import lower_is_better, primary_metric
from judge.report.blocks import (
    Chart,
    Header,
    Link,
    Section,
    Table,
    Text,
    format_value,
    lazy_chart,
    render_html,
)
from judge.report.queries import night_values
from judge.report.summary import Summary

# Metrics drawn in the per-query scatter (the table holds them all).
SCATTER_METRICS = 3


def _signed(value: float | None) -> str:
    return "—" if value is None else f"{value:+.4f}"


def ci_text(low: float | None, high: float | None, *, signed: bool = False) -> str:
    if low is None or high is None:
        return "—"
    return f"[{_signed(low)}, {_signed(high)}]" if signed else f"[{low:.4f}, {high:.4f}]"


def p_text(d: PairedDiff) -> str:
    """The p-value ("< 0.0001" below it); "no query differs" when every pair ties; when the
    pairs that differ are too few for any p < 0.05, that it is so."""
    if d.p_value is None:
        return "—"
    if d.n and d.wins + d.losses == 0:
        return "— (no query differs)"
    text = "< 0.0001" if d.p_value < 0.0001 else f"{d.p_value:.4f}"
    text += "" if d.exact else "~"
    if d.too_few and d.p_floor is not None:
        text += f" (too few queries differ: min {d.p_floor:.4f})"
    return text


def p_said(d: PairedDiff) -> str:
    """ "p = 0.0123", or "p < 0.0001" (not "p = < 0.0001")."""
    said = p_text(d)
    return f"p {said}" if said.startswith("<") else f"p = {said}"


def wtl(d: PairedDiff) -> str:
    return f"{d.wins} / {d.ties} / {d.losses}"


def one_line(d: PairedDiff) -> str:
    """A paired difference in one sentence, for a page's first screen."""
    return (
        f"{d.engine} vs {d.baseline} on {d.metric}: {_signed(d.diff)} "
        f"{ci_text(d.ci_low, d.ci_high, signed=True)}, {p_said(d)} "
        f"(paired over {d.n} queries; better / tie / worse {wtl(d)})"
    )


# Rank metrics, most telling first: the verdict sentence's metric unless [metrics] primary says.
def pooled_counterpart(names: Sequence[str], chosen: str | None = None) -> list[str]:
    """The pooled metric that stands for the primary one (``pooled_ndcg@10`` for
    ``ndcg@10``), to be compared beside it: none for a primary without one."""
    primary = primary_metric(names, chosen)
    pooled = f"pooled_{primary}"
    return [pooled] if primary is not None and parse_pooled(pooled) is not None else []


def _p_short(d: PairedDiff) -> str:
    """The p a verdict is read at: adjusted, and said so, when read against several pairs."""
    p = d.p_read
    if p is None:
        return "p —"
    said = "p < 0.001" if p < 0.001 else f"p = {p:.3f}"
    return f"{said} adjusted over {d.family} pairs of engines" if d.family > 1 else said


def _left(d: PairedDiff) -> str:
    """The queries the pairs leave out, said beside those they hold, each by its reason."""
    said, undefined = "", d.left_out - d.unlike
    if d.reasons and undefined:
        unjudged = d.unjudged_engine + d.unjudged_baseline
        reasons = [
            (d.held_by_one, "held by one side only"),
            (d.unjudged_engine, f"not judged fully by {d.engine}"),
            (d.unjudged_baseline, f"not judged fully by {d.baseline}"),
            (
                undefined - d.held_by_one - unjudged,
                "nothing relevant found by either"
                if d.judged_known
                else "not judged fully, or nothing relevant found by either",
            ),
        ]
        why = ", ".join(f"{n} {reason}" for n, reason in reasons if n > 0)
        failed = " (unparsed or failed verdicts)" if unjudged else ""
        said += f"; {undefined} more left out: {why}{failed}"
    elif undefined:
        said += (
            f"; {undefined} more left out, undefined for {d.engine} or {d.baseline} (not "
            "judged fully, not held by both, or nothing relevant found by either)"
        )
    if d.unlike:
        said += f"; {d.unlike} more left out: the same id asks another question in each"
    return said


def decided(d: PairedDiff, p_value: float | None = None) -> bool:
    """Whether ``d`` names a better engine: some query differs, p (``p_value``, when adjusted
    over metrics; else the p it is read at) < 0.05 and the CI leaves out 0."""
    p = d.p_read if p_value is None else p_value
    low, high = d.ci_low, d.ci_high
    return (
        d.diff is not None
        and d.wins + d.losses > 0
        and p is not None
        and p < SIGNIFICANCE
        and low is not None
        and high is not None
        and not low <= 0 <= high
    )


def holm(diffs: Sequence[PairedDiff]) -> list[float | None]:
    """Each diff's p-value (as read: :attr:`PairedDiff.p_read`) adjusted by Holm's step-down
    over ``diffs`` (one pair of engines, several metrics): what a claim of "some metric
    moved" may be read at. A metric that could not reach p < 0.05 whatever the signs of its
    differences (none differ, or too few: Tarone's rule) is not one of the tests, and
    stays None: counting it had made 8 queries that all moved the same way on four
    metrics, among eleven, too few to name any."""
    ranked = sorted(
        (d.p_read, i)
        for i, d in enumerate(diffs)
        if d.p_read is not None and d.wins + d.losses > 0 and not d.too_few
    )
    adjusted: list[float | None] = [None] * len(diffs)
    running = 0.0
    for step, (p, i) in enumerate(ranked):
        running = max(running, min(1.0, (len(ranked) - step) * p))
        adjusted[i] = running
    return adjusted


def verdict_line(d: PairedDiff, *, moved: bool = False) -> str:
    """Which of two engines is better on ``d.metric``, or that neither is (a CI that holds 0,
    p >= 0.05, or no query that differs), with the paired figures. ``moved``: ``d`` pairs
    one engine tonight against the baseline (:func:`night_diffs`), and a decided difference
    is said as the metric rising or falling, better or worse, not as a side winning."""
    counts = f"better on {d.wins}, tied {d.ties}, worse {d.losses} of {d.n} queries{_left(d)}"
    if d.diff is None or d.n == 0:
        if d.baseline_lacks:
            return (
                f"{d.baseline} has no {d.metric} (it was summarised with other [metrics] "
                "names): nothing to pair"
            )
        if d.unlike:
            return (
                f"{d.engine} and {d.baseline} share no query where {d.metric} is defined: "
                f"{d.unlike} of their query ids ask another question in each, not paired"
            )
        return f"{d.engine} and {d.baseline} share no query where {d.metric} is defined"
    if d.wins + d.losses == 0:
        return f"no query differs between {d.engine} and {d.baseline} on {d.metric} ({counts})"
    figures = f"{_signed(d.diff)} {ci_text(d.ci_low, d.ci_high, signed=True)}, {_p_short(d)}"
    low, high = d.ci_low, d.ci_high
    if not decided(d) or low is None or high is None:
        few = " (too few queries differ for p < 0.05)" if d.too_few else ""
        return (
            f"no significant difference between {d.engine} and {d.baseline} on {d.metric}: "
            f"{figures}, {counts}{few}"
        )
    # Wins and losses are counted in the metric's direction; the sign of diff is not.
    lower = lower_is_better(d.metric)
    if moved:
        went, worse = "rose" if d.diff > 0 else "fell", (d.diff > 0) == lower
        return f"{d.metric} {went} ({'worse' if worse else 'better'}): {figures}, {counts}"
    said = f"{d.metric} (lower is better)" if lower else d.metric
    if (d.diff < 0) if lower else (d.diff > 0):
        return f"{d.engine} beats {d.baseline} on {said}: {figures}, {counts}"
    flipped = f"better on {d.losses}, tied {d.ties}, worse {d.wins} of {d.n} queries{_left(d)}"
    mirrored = ci_text(-high, -low, signed=True)
    return (
        f"{d.baseline} beats {d.engine} on {said}: {_signed(-d.diff)} {mirrored}, "
        f"{_p_short(d)}, {flipped}"
    )


def headline_lines(cmp: Comparison, chosen: str | None = None) -> list[str]:
    """What ``judge compare`` says first: the verdict on the primary metric, each pair's
    contradiction by the pooled metric that stands for it (an NDCG's ideal is the engine's
    own list, so one that finds less can score higher on it: ``pooled_ndcg`` ranks both
    against the passages either found), then, when the primary found no significant
    difference, the largest change on another metric still significant once its p is
    adjusted (Holm) over the metrics that pair was compared on (never a metric on which every
    query ties)."""
    primary = primary_metric(cmp.metrics, chosen)
    firsts = [d for d in cmp.diffs if d.metric == primary]
    lines = [verdict_line(d) for d in firsts]
    pooled = {(d.metric, d.engine, d.baseline): d for d in cmp.diffs}
    for d in firsts:
        other = pooled.get((f"pooled_{primary}", d.engine, d.baseline))
        if other is not None and decided(d) and decided(other) and _opposite(d, other):
            lines.append(
                f"but {verdict_line(other)} ({primary} ranks each engine against its own "
                "list's best order, so an engine that finds fewer relevant passages can "
                f"score higher on it; pooled_{primary} ranks both against all they found)"
            )
    if any(decided(d) for d in firsts):
        return lines
    moved: list[tuple[PairedDiff, float, int]] = []
    for engine, baseline in {(d.engine, d.baseline) for d in cmp.diffs}:
        pair = [d for d in cmp.diffs if (d.engine, d.baseline) == (engine, baseline)]
        adjusted = holm(pair)
        tested = sum(p is not None for p in adjusted)  # the metrics Holm adjusts over
        for d, p in zip(pair, adjusted, strict=True):
            if d.metric != primary and p is not None and decided(d, p):
                moved.append((d, p, tested))
    if moved:
        top, p, n = max(moved, key=lambda m: (abs(m[0].diff or 0.0), m[0].metric, m[0].engine))
        # A sampled p at its floor (no sampled sign flip as extreme) says only that p is below
        # it, and so does its adjusted value.
        floor = not top.exact and (top.p_value or 1.0) <= 1.0 / (cmp.n_permutations + 1)
        lines.append(
            f"largest significant change, p {'<' if floor else '='} {p:.2g} Holm-adjusted over "
            f"{n} metric{'' if n == 1 else 's'}: {verdict_line(top)}"
        )
    return lines


def _opposite(a: PairedDiff, b: PairedDiff) -> bool:
    """Whether two decided diffs of one pair name different winners."""
    return _won(a) != _won(b)


def _won(d: PairedDiff) -> bool:
    """Whether the engine (not its baseline) is the better of ``d``."""
    assert d.diff is not None
    return d.diff < 0 if lower_is_better(d.metric) else d.diff > 0


def verdict_lines(cmp: Comparison, chosen: str | None = None) -> list[str]:
    """One verdict sentence per compared pair of engines, on the primary metric."""
    metric = primary_metric(cmp.metrics, chosen)
    return [verdict_line(d) for d in cmp.diffs if d.metric == metric]


FOOTNOTE = (
    "Paired: over the queries both the engine and its baseline define, by id and question "
    "(an id asking another question in each is left out; on a label-free or "
    "soft metric, a query one judged fully and found nothing relevant in, where the other "
    "found something, counts 0 for it); diff = mean of the "
    "per-query differences, 95% CI by bootstrap over queries, p from the two-sided exact "
    "sign-flip test ('~': sampled). With m queries that differ no p can fall below 2 / 2^m, so "
    f"fewer than 6 give no p < {SIGNIFICANCE}. Unpaired means cover each engine's own queries "
    "and can disagree with the paired diff when the engines define different queries."
)


def paired_table(cmp: Comparison) -> Table:
    """Per metric and compared engine: pairs, paired diff, CI, p, win / tie / loss."""
    rows: list[list[Any]] = []
    css = []
    for d in cmp.diffs:
        if not d.n:
            continue
        rows.append(
            [
                d.metric,
                d.engine,
                d.baseline,
                d.n,
                _signed(d.diff),
                ci_text(d.ci_low, d.ci_high, signed=True),
                p_text(d),
                wtl(d),
            ]
        )
        css.append("failed" if d.worse() else "relevant" if d.better() else "")
    head = ["metric", "engine", "vs", "pairs", "diff (paired)", "95% CI", "p", "better/tie/worse"]
    return Table(head, rows, frozenset({3, 4}), css)


def means_table(cmp: Comparison) -> Table:
    """Metrics down, engines across: unpaired mean [95% CI] (n queries)."""
    rows = [
        [m]
        + [
            f"{format_value(x.mean)} {ci_text(x.ci_low, x.ci_high)} n={x.n}"
            for e in cmp.engines
            for x in [cmp.means[m][e]]
        ]
        for m in cmp.metrics
    ]
    return Table(["metric", *cmp.engines], rows)


def scatter_charts(cmp: Comparison, metrics: Sequence[str]) -> list[Chart]:
    """Per compared engine, its per-query values against its baseline's."""
    shown = [m for m in metrics if m in cmp.per_query][:SCATTER_METRICS]
    charts = []
    for engine, base in cmp.baselines.items():
        pairs = {m: (cmp.per_query[m][base], cmp.per_query[m][engine]) for m in shown}
        caption = f"per query: {engine} (y) against {base} (x); above the diagonal: {engine} better"
        charts.append(Chart(lazy_chart("engine_scatter", pairs, base, engine), caption))
    return charts


def compare_section(cmp: Comparison) -> Section:
    """The run report's comparison of its engines (paired; the unpaired means are above)."""
    shown = list(dict.fromkeys([*cmp.metrics[:2], "pooled_ndcg"]))
    blocks: list[Text | Table | Chart] = [paired_table(cmp), Text(FOOTNOTE, "muted")]
    blocks += scatter_charts(cmp, shown)
    return Section("compare", f"Engines compared, paired (baseline {cmp.baseline})", blocks)


def _bars(cmp: Comparison) -> Chart:
    means = {
        m: {e: (x.mean, x.ci_low, x.ci_high) for e, x in cmp.means[m].items()}
        for m in cmp.metrics
        if any(x.mean is not None for x in cmp.means[m].values())
    }
    caption = "unpaired: each engine's mean over its own queries; whiskers: 95% bootstrap CI"
    return Chart(lazy_chart("metric_bars", means, list(cmp.engines)), caption)


def worse_lines(cmp: Comparison, fail_if_worse: Sequence[str]) -> list[str]:
    """What ``--fail-if-worse`` fails on, said before anything else (console and page)."""
    worse = [d for d in cmp.diffs if d.metric in fail_if_worse and d.worse()]
    return [f"significantly worse: {one_line(d)}" for d in worse]


def compare_header(
    cmp: Comparison,
    sources: Sequence[str],
    fail_if_worse: Sequence[str] = (),
    chosen: str | None = None,
) -> Header:
    """The first screen of ``judge compare --html``: worse or not, and the headline diffs
    (``chosen``: the primary metric the runs name)."""
    lines = worse_lines(cmp, fail_if_worse)
    worse = bool(lines)
    lines += headline_lines(cmp, chosen)  # the verdicts the console gives, whatever failed
    if fail_if_worse:
        word, css = ("WORSE", "failed") if worse else ("NOT WORSE", "passed")
    else:
        word, css = "COMPARED", "neutral"
    paired = sorted(cmp.baselines.items())
    meta = [
        f"baseline {cmp.baseline}"
        if all(base == cmp.baseline for _, base in paired)
        else "compared: " + ", ".join(f"{e} with {base}" for e, base in paired),
        f"sources {', '.join(sources)}",
        f"{cmp.n_query_ids} query ids",
        f"{cmp.n_boot} bootstrap resamples, {cmp.n_permutations} permutations, seed {cmp.seed}",
    ]
    return Header(f"{word} · judge compare · {' vs '.join(cmp.engines)}", css, lines, meta)


def compare_page(
    cmp: Comparison,
    sources: Sequence[str],
    fail_if_worse: Sequence[str] = (),
    *,
    charts: bool = True,
    chosen: str | None = None,
) -> str:
    """``judge compare --html``: one offline page like report.html (``chosen``: the primary
    metric the runs name)."""
    means = Section(
        "means",
        "Mean per engine (unpaired, 95% CI)",
        [means_table(cmp), _bars(cmp)],
    )
    paired = Section(
        "paired",
        "Paired differences against the baseline",
        [paired_table(cmp), Text(FOOTNOTE, "muted")],
    )
    scatter = Section("scatter", "Per query, paired", [*scatter_charts(cmp, cmp.metrics)])
    sections = [means, paired] + ([scatter] if scatter.blocks else [])
    header = compare_header(cmp, sources, fail_if_worse, chosen)
    return render_html(header, sections, charts=charts)


# Per engine both nights hold: tonight against the baseline on the primary metric, and each
# night's values by query id (:func:`night_diffs`).
Nights = dict[str, tuple[PairedDiff, dict[str, float], dict[str, float]]]


def night_diffs(summary: Summary, baseline: Summary) -> Nights:
    """Per engine both nights hold: tonight against the baseline on the primary metric, paired
    over the query ids both define (the bootstrap and test of ``judge compare``), and each
    night's values by query id. Empty when the baseline holds no per-query rows."""
    metric = primary_metric(summary.metric_names, summary.policy.primary)
    if metric is None or not baseline.queries:
        return {}
    st, out = summary.stability, {}
    for engine in (e for e in summary.engines if e in baseline.engines):
        nights = {
            night: [r for r in rows if r.engine == engine]
            for night, rows in (("tonight", summary.queries), ("baseline", baseline.queries))
        }
        values, held, _ = night_values(metric, nights)
        now, before = values["tonight"], values["baseline"]
        asked = [{r.query_id: question(r.query) for r in nights[n]} for n in nights]
        d = paired_diff(
            metric,
            ("tonight", now),
            ("the baseline", before),
            n_boot=st.n_boot,
            seed=st.seed,
            held=(held["tonight"], held["baseline"]),
            asked=(asked[0], asked[1]),
        )
        if metric not in baseline.metric_names:
            d = d.model_copy(update={"baseline_lacks": True})
        out[engine] = (d, now, before)
    return out


def night_lines(nights: Nights) -> list[str]:
    """What a nightly run says beside which engine is better: whether each engine moved
    against the baseline on the primary metric, a sentence each (the report's "Tonight vs
    baseline" section in short)."""
    return [
        f"{engine} vs the baseline: {verdict_line(d, moved=True)}"
        for engine, (d, _, _) in nights.items()
    ]


# Queries listed under "tonight vs baseline": those that fell most on the primary metric.
FELL_SHOWN = 10


def nightly_section(
    summary: Summary, nights: Nights, ids: dict[tuple[str, str], str]
) -> Section | None:
    """Tonight against the baseline summary, engine by engine, on the primary metric: the
    paired difference with its CI and p (the same bootstrap and test as ``judge compare``),
    and the queries that fell most, linked to their passages (``ids``: their anchors)."""
    metric = primary_metric(summary.metric_names, summary.policy.primary)
    if metric is None or not nights:
        return None
    blocks: list[Text | Table | Chart] = []
    rise = lower_is_better(metric)
    for engine, (d, now, before) in nights.items():
        blocks.append(Text(f"{engine}: {verdict_line(d, moved=True)}"))
        change = {q: now[q] - before[q] for q in now.keys() & before.keys()}
        fell = sorted(
            (q for q in change if (change[q] > 0 if rise else change[q] < 0)),
            key=lambda q: -change[q] if rise else change[q],
        )[:FELL_SHOWN]
        if fell:
            rows = [
                [
                    Link(q, ids[(q, engine)]) if (q, engine) in ids else q,
                    before[q],
                    now[q],
                    _signed(change[q]),
                ]
                for q in fell
            ]
            head = ["query", f"baseline {metric}", f"tonight {metric}", "change"]
            blocks.append(Table(head, rows, frozenset({1, 2, 3})))
    note = (
        f"Paired over the query ids both tonight and the baseline define, per engine (a "
        f"query one night found nothing relevant in and the other did counts 0 for it); the "
        f"{FELL_SHOWN} queries that fell most are listed, linked to tonight's passages."
    )
    blocks.append(Text(note, "muted"))
    return Section("nightly", f"Tonight vs baseline on {metric}", blocks)
