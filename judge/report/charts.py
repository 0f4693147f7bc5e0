"""The report's charts, drawn as inline SVG with :mod:`judge.report.svg`.

Every chart function returns one ``<svg role="img" aria-label="..." class="chart">`` element as
a string: text stays text (the browser draws Chinese names with its own fonts, and the page
can be searched), and nothing refers outside the page.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from judge.metrics.facts import lower_is_better
from judge.report.svg import TAB10, Figure, Mark, Panel, nice_ticks, ramp, text_width, tick_labels

FAILED_STYLES = {"unparsed": ("#9e9e9e", "//"), "error": ("#3b3b3b", "xx")}
_RED = "#d62728"


def engine_colour(index: int) -> str:
    """The colour an engine gets in every chart (the tab10 cycle)."""
    return TAB10[index % 10]


def _limits(values: Sequence[float], *, unit: bool = True) -> tuple[float, float]:
    """Every metric judge knows lies in [0, 1]: such axes share that range, so two metrics (or
    two runs) are drawn to the same scale and a flat 1.0 does not fill the panel. Other values
    get their own range, padded by 5%."""
    finite = [v for v in values if math.isfinite(v)]
    if unit and all(0.0 <= v <= 1.0 for v in finite):
        return (-0.04, 1.04)
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    pad = 0.05 * (hi - lo) or 0.5
    return (lo - pad, hi + pad)


def _ticks(lim: tuple[float, float]) -> list[tuple[float, str]]:
    values = nice_ticks(*lim)
    return list(zip(values, tick_labels(values), strict=True))


def _slanted(names: Sequence[str], panel_width: float) -> bool:
    """Whether names under an axis would run into each other set straight."""
    return sum(text_width(n) + 6 for n in names) > panel_width


def _whiskers(data: np.ndarray) -> tuple[float, float, float, float, float]:
    """A box plot's whisker ends, quartiles and median: whiskers reach the furthest points
    within 1.5 inter-quartile ranges of the box."""
    q1, median, q3 = np.percentile(data, [25, 50, 75])
    reach = 1.5 * (q3 - q1)
    low = float(data[data >= q1 - reach].min())
    high = float(data[data <= q3 + reach].max())
    return low, float(q1), float(median), float(q3), high


def metric_distribution(
    values: Mapping[str, Mapping[str, Sequence[float]]], engines: Sequence[str]
) -> str:
    """Box plots of per-query values, one panel per metric, one box per engine; the points
    themselves are drawn over the boxes (jittered sideways) so small samples are visible."""
    metrics = list(values)
    slant = _slanted(engines, 720 / min(3, max(1, len(metrics))) - 58)
    bottom = 34 + (min(70.0, max(map(text_width, engines), default=0) * 0.45) if slant else 0)
    fig = Figure(len(metrics), margins=(46.0, 24.0, 12.0, bottom), panel_height=190 + bottom)
    rng = np.random.default_rng(0)
    for panel, metric in zip(fig.panels, metrics, strict=True):
        data = [np.asarray(values[metric].get(e, ()), dtype=float) for e in engines]
        panel.xlim = (0.4, len(engines) + 0.6)
        panel.ylim = _limits([float(v) for d in data for v in d])
        panel.frame(
            xticks=[(i + 1, e) for i, e in enumerate(engines)],
            yticks=_ticks(panel.ylim),
            grid="y",
            title=[metric],
            slant=slant,
        )
        for i, d in enumerate(data):
            if not len(d):
                continue
            low, q1, median, q3, high = _whiskers(d)
            x = i + 1
            panel.segment(x, low, x, q1)
            panel.segment(x, q3, x, high)
            for end in (low, high):
                panel.segment(x - 0.12, end, x + 0.12, end)
            panel.box(x - 0.25, x + 0.25, q1, q3, engine_colour(i), opacity=0.35, stroke="#222")
            panel.segment(x - 0.25, median, x + 0.25, median, "#e07000")
            panel.dots(list(x + rng.uniform(-0.12, 0.12, len(d))), list(d), engine_colour(i))
    return fig.svg("metric distribution per engine")


def _clusters(
    names: Sequence[str], x: Sequence[float], y: Sequence[float], panel: Panel
) -> list[tuple[float, float, str]]:
    """Points closer than 4% of the panel joined under one label ("q1, q2", or "q1 +3")."""
    spans = [max(1e-9, hi - lo) for lo, hi in (panel.xlim, panel.ylim)]
    groups: list[tuple[float, float, list[str]]] = []
    for q, xi, yi in sorted(zip(names, x, y, strict=True), key=lambda t: (t[2], t[1], t[0])):
        near = [g for g in groups if abs(g[0] - xi) < 0.04 * spans[0]]
        near = [g for g in near if abs(g[1] - yi) < 0.04 * spans[1]]
        if near:
            near[0][2].append(q)
        else:
            groups.append((float(xi), float(yi), [q]))
    return [
        (xi, yi, ", ".join(qs) if len(qs) <= 3 else f"{qs[0]} +{len(qs) - 1}")
        for xi, yi, qs in groups
    ]


def _point_labels(
    panel: Panel, names: Sequence[str], x: Sequence[float], y: Sequence[float]
) -> None:
    """Query ids beside their points, never over each other or outside the panel: each label
    tries the four corners around its point (the ones facing the panel's middle first) and is
    left out when all four would overprint one already placed; its point stays."""
    placed: list[tuple[float, float, float, float]] = []
    mid_x, mid_y = sum(panel.xlim) / 2, sum(panel.ylim) / 2
    size, height = 7.0, 8.0
    right, bottom = panel.left + panel.width, panel.top + panel.height
    for xi, yi, text in _clusters(names, x, y, panel):
        width = text_width(text, size)
        sides = [(4.0, "start"), (-4.0, "end")]
        heights = [-4.0, 10.0]  # baseline above the point, or below it (pixels grow down)
        sides = sides[::-1] if xi > mid_x else sides
        heights = heights[::-1] if yi > mid_y else heights
        px, py = panel.px(xi), panel.py(yi)
        for dy in heights:
            fitted = None
            for dx, anchor in sides:
                x0 = px + dx if anchor == "start" else px + dx - width
                box = (x0, py + dy - height, x0 + width, py + dy)
                inside = panel.left <= box[0] and box[2] <= right
                inside = inside and panel.top <= box[1] and box[3] <= bottom
                clear = all(
                    box[2] <= b[0] or b[2] <= box[0] or box[3] <= b[1] or b[3] <= box[1]
                    for b in placed
                )
                if inside and clear:
                    fitted = (box, px + dx, anchor)
                    break
            if fitted:
                placed.append(fitted[0])
                panel.label(fitted[1], py + dy, text, anchor=fitted[2], size=size)
                break


def engine_scatter(
    pairs: Mapping[str, tuple[Mapping[str, float], Mapping[str, float]]],
    baseline: str,
    engine: str,
) -> str:
    """Per query, ``engine``'s value (y) against ``baseline``'s (x), one panel per metric.

    Points above the diagonal are queries where ``engine`` scored higher: better, except on a
    lower-is-better metric (``near_dup``); the better / tie / worse counts are in each panel's
    title, off the data. Query ids label the points when few.
    """
    fig = Figure(len(pairs), panel_height=238, margins=(50.0, 38.0, 12.0, 40.0))
    for panel, (metric, (base, other)) in zip(fig.panels, pairs.items(), strict=True):
        common = sorted(base.keys() & other.keys())
        x = [base[q] for q in common]
        y = [other[q] for q in common]
        lo = min(0.0, *x, *y) if common else 0.0
        hi = max(1.0, *x, *y) if common else 1.0
        pad = 0.04 * (hi - lo)
        panel.xlim = panel.ylim = (lo - pad, hi + pad)
        d = np.subtract(x, y) if lower_is_better(metric) else np.subtract(y, x)
        wins, losses = int((d > 1e-12).sum()), int((d < -1e-12).sum())
        ticks = _ticks(panel.xlim)
        panel.frame(
            xticks=ticks,
            yticks=ticks,
            grid="xy",
            title=[metric, f"better {wins} · tie {len(common) - wins - losses} · worse {losses}"],
            xlabel=baseline,
            ylabel=engine,
        )
        panel.line([lo, hi], [lo, hi], "#888888", width=0.8, dash="4 3")
        panel.dots(x, y, engine_colour(1), radius=3.0, opacity=0.7)
        if len(common) <= 15:
            _point_labels(panel, common, x, y)
    return fig.svg(f"per-query {engine} vs {baseline}")


def metric_bars(
    means: Mapping[str, Mapping[str, tuple[float | None, float | None, float | None]]],
    engines: Sequence[str],
) -> str:
    """One panel per metric: each engine's (or run's) mean as a horizontal bar with its 95%
    CI as a whisker, on the shared [0, 1] axis; engine names on the left, never overprinted."""
    metrics = list(means)
    names = min(170.0, max(map(text_width, engines), default=0) + 10)
    fig = Figure(
        len(metrics),
        panel_height=64 + 23 * len(engines),
        margins=(names, 24.0, 12.0, 30.0),
    )
    for n, (panel, metric) in enumerate(zip(fig.panels, metrics, strict=True)):
        rows = [means[metric].get(e, (None, None, None)) for e in engines]
        ends = [float(v) for m, lo, hi in rows for v in (m, lo, hi) if v is not None]
        panel.xlim = _limits([0.0, *ends])  # bars start at 0
        panel.ylim = (len(engines) - 0.5, -0.5)  # the first engine on top
        labels = [(i, e if n % fig.cols == 0 else "") for i, e in enumerate(engines)]
        panel.frame(xticks=_ticks(panel.xlim), grid="x", title=[metric])
        for i, name in labels:
            if name:
                panel.label(panel.left - 5, panel.py(i) + 3.5, name, anchor="end")
        for i, (mean, low, high) in enumerate(rows):
            if mean is None:
                continue
            panel.box(0.0, mean, i - 0.3, i + 0.3, engine_colour(i), opacity=0.75)
            if low is not None and high is not None:
                panel.segment(low, i, high, i)
                for end in (low, high):
                    panel.segment(end, i - 0.12, end, i + 0.12)
    return fig.svg("mean per engine with 95% CI")


def _series_panels(
    fig: Figure,
    panels: Sequence[tuple[str, Sequence[int], Mapping[str, Sequence[float | None]]]],
    xlabel: str,
    ylabel: str,
) -> None:
    """Line panels: per panel a title, the x values, and one line per named series."""
    for panel, (title, xs, series) in zip(fig.panels, panels, strict=True):
        drawn = [float(v) for ys in series.values() for v in ys if v is not None]
        panel.xlim = (min(xs) - 0.5, max(xs) + 0.5) if xs else (0.0, 1.0)
        panel.ylim = _limits(drawn)
        step = max(1, math.ceil(len(xs) / 12))
        panel.frame(
            xticks=[(x, str(x)) for x in list(xs)[::step]],
            yticks=_ticks(panel.ylim),
            grid="xy",
            title=[title],
            xlabel=xlabel,
            ylabel=ylabel,
        )
        for j, ys in enumerate(series.values()):
            panel.line(list(xs), list(ys), engine_colour(j), markers=True)


def stability_lines(
    per_repeat: Mapping[str, Mapping[str, Sequence[float | None]]],
    repeats: Mapping[str, Sequence[int]],
) -> str:
    """Per engine, each metric's mean in each repeat: flat lines mean a stable judge. One
    legend for all panels sits under them, off the data."""
    engines = list(per_repeat)
    fig = Figure(len(engines), cols=2, panel_height=230, margins=(56.0, 24.0, 12.0, 40.0))
    _series_panels(
        fig,
        [(e, list(repeats[e]), per_repeat[e]) for e in engines],
        "repeat",
        "mean over queries",
    )
    names = list(per_repeat[engines[0]]) if engines else []
    fig.legend([Mark(m, engine_colour(j), line=True) for j, m in enumerate(names)])
    return fig.svg("stability across repeats")


def label_distribution(counts: Mapping[str, Mapping[str, int]], labels: Sequence[str]) -> str:
    """Stacked horizontal bars per engine: each scale label (worst to best on a red-to-green
    ramp), then ``unparsed`` (grey, hatched) and ``error`` (dark, cross-hatched)."""
    engines = list(counts)
    names = min(170.0, max(map(text_width, engines), default=0) + 10)
    fig = Figure(1, cols=1, panel_height=60 + 30 * len(engines), margins=(names, 10.0, 16.0, 40.0))
    panel = fig.panels[0]
    styles = {
        name: (ramp(0.1 + 0.8 * i / max(1, len(labels) - 1)), "") for i, name in enumerate(labels)
    }
    styles.update(FAILED_STYLES)
    totals = [sum(counts[e].values()) for e in engines]
    panel.xlim = (0.0, 1.05 * max(totals, default=1) or 1.0)
    panel.ylim = (len(engines) - 0.5, -0.5)
    ticks = nice_ticks(0.0, panel.xlim[1])
    panel.frame(xticks=[(t, f"{t:g}") for t in ticks if t == int(t)], grid="x", xlabel="verdicts")
    patterns = {
        name: fig.pattern(name, hatch, "#ffffff") for name, (_, hatch) in styles.items() if hatch
    }
    biggest = max(totals, default=1)
    for i, engine in enumerate(engines):
        panel.label(panel.left - 5, panel.py(i) + 3.5, engine, anchor="end")
        left = 0.0
        for name, (colour, _) in styles.items():
            width = counts[engine].get(name, 0)
            if not width:
                continue
            panel.box(
                left,
                left + width,
                i - 0.4,
                i + 0.4,
                colour,
                stroke="#ffffff",
                pattern=patterns.get(name, ""),
            )
            if width >= 0.03 * biggest:
                middle = panel.px(left + width / 2)
                panel.label(middle, panel.py(i) + 3, f"{width:.0f}", anchor="middle", size=8)
            left += width
    fig.legend(
        [
            Mark(name, colour, pattern=patterns.get(name, ""))
            for name, (colour, _) in styles.items()
        ],
        cols=len(styles),
    )
    return fig.svg("verdict labels")


def history_trend(
    runs: Sequence[tuple[int, Mapping[str, Mapping[str, float | None]]]],
    metrics: Sequence[str],
    engines: Sequence[str],
    flagged: set[tuple[int, str, str]],
) -> str:
    """Metric means over past runs (x = run id), one panel per metric, one line per engine;
    a red cross marks a run flagged as a regression for that engine and metric."""
    fig = Figure(len(metrics), cols=2, panel_height=216, margins=(46.0, 24.0, 12.0, 40.0))
    xs = [run_id for run_id, _ in runs]
    _series_panels(
        fig,
        [
            (m, xs, {e: [values.get(e, {}).get(m) for _, values in runs] for e in engines})
            for m in metrics
        ],
        "run",
        "",
    )
    for panel, metric in zip(fig.panels, metrics, strict=True):
        for engine in engines:
            for x, values in runs:
                y = values.get(engine, {}).get(metric)
                if y is not None and (x, engine, metric) in flagged:
                    panel.cross(x, y, _RED)
    fig.legend([Mark(e, engine_colour(i), line=True) for i, e in enumerate(engines)])
    return fig.svg("trend over previous runs")
