"""The report's charts: matplotlib figures rendered to inline SVG strings.

Figures are built with ``matplotlib.figure.Figure`` on an Agg canvas, never through pyplot,
so no global backend is chosen and nothing leaks between charts or into a caller's plots.
Text stays text (``svg.fonttype = none``): the browser draws it with its own fonts, so
Chinese engine or query names show, and the report can be searched. The SVG prolog,
metadata and namespace URLs are stripped: the page makes no reference outside itself.
Every chart function returns one ``<svg>`` element as a string.
"""

from __future__ import annotations

import html
import io
import math
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from judge.metrics.sources import lower_is_better

FAILED_STYLES = {"unparsed": ("#9e9e9e", "//"), "error": ("#3b3b3b", "xx")}
_STRIP = (
    re.compile(r"<\?xml[^>]*\?>\s*"),
    re.compile(r"<!DOCTYPE[^>]*>\s*"),
    re.compile(r"<metadata>.*?</metadata>\s*", re.S),
    re.compile(r'\s+xmlns(:\w+)?="[^"]*"'),
)


def engine_colour(index: int) -> str:
    """The colour an engine gets in every chart (matplotlib's tab10 cycle)."""
    return str(matplotlib.colors.to_hex(matplotlib.colormaps["tab10"](index % 10)))


def _figure(n_panels: int, *, cols: int = 3, width: float = 10.0, height: float = 3.0) -> Figure:
    cols = max(1, min(cols, n_panels))
    rows = max(1, math.ceil(n_panels / cols))
    fig = Figure(figsize=(width, height * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[n_panels:]:
        ax.set_visible(False)
    return fig


def _axes(fig: Figure) -> list[Axes]:
    return [ax for ax in fig.axes if ax.get_visible()]


def to_svg(fig: Figure, name: str) -> str:
    """The figure as one ``<svg>`` element with no external references; ids salted by name."""
    buf = io.StringIO()
    with (
        matplotlib.rc_context(
            {"svg.fonttype": "none", "svg.hashsalt": name, "font.size": 9.0, "axes.titlesize": 10.0}
        ),
        warnings.catch_warnings(),
    ):
        # Glyphs the bundled font lacks (CJK names) are drawn by the browser, not by us.
        warnings.filterwarnings("ignore", message="Glyph .* missing from", category=UserWarning)
        fig.savefig(buf, format="svg", metadata={"Date": None})
    svg = buf.getvalue()
    for pattern in _STRIP:
        svg = pattern.sub("", svg)
    label = html.escape(name, quote=True)
    return svg.replace("<svg ", f'<svg role="img" aria-label="{label}" class="chart" ', 1).strip()


def _unit_axis(ax: Axes, values: Sequence[float], axis: str = "y") -> None:
    """Every metric judge knows lies in [0, 1]: such panels share that axis, so two metrics
    (or two runs) are drawn to the same scale and a flat 1.0 does not fill the panel."""
    if all(0.0 <= v <= 1.0 for v in values):
        (ax.set_ylim if axis == "y" else ax.set_xlim)(-0.04, 1.04)


def _tick_labels(ax: Axes, names: Sequence[str]) -> None:
    """Engine names under the x axis, slanted when they would run into each other."""
    ax.set_xticks(range(1, len(names) + 1), list(names))
    if sum(len(n) for n in names) > 30:
        ax.tick_params(axis="x", labelrotation=25)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")


def metric_distribution(
    values: Mapping[str, Mapping[str, Sequence[float]]], engines: Sequence[str]
) -> str:
    """Box plots of per-query values, one panel per metric, one box per engine; the points
    themselves are drawn over the boxes (jittered sideways) so small samples are visible."""
    metrics = list(values)
    fig = _figure(len(metrics))
    rng = np.random.default_rng(0)
    for ax, metric in zip(_axes(fig), metrics, strict=False):
        data = [list(values[metric].get(e, ())) for e in engines]
        shown = [i for i, d in enumerate(data) if d]
        if shown:
            box = ax.boxplot(
                [data[i] for i in shown],
                positions=[i + 1 for i in shown],
                widths=0.5,
                patch_artist=True,
                showfliers=False,
            )
            for patch, i in zip(box["boxes"], shown, strict=True):
                patch.set(facecolor=engine_colour(i), alpha=0.35)
        for i, d in enumerate(data):
            x = i + 1 + rng.uniform(-0.12, 0.12, len(d))
            ax.scatter(x, d, s=10, color=engine_colour(i), alpha=0.8, zorder=3)
        _tick_labels(ax, engines)
        ax.set_xlim(0.4, len(engines) + 0.6)
        _unit_axis(ax, [v for d in data for v in d])
        ax.set_title(metric)
        ax.grid(axis="y", alpha=0.3)
    return to_svg(fig, "metric distribution per engine")


def _clusters(names: Sequence[str], x: Any, y: Any, ax: Axes) -> list[tuple[float, float, str]]:
    """Points closer than 4% of the axes joined under one label ("q1, q2", or "q1 +3")."""
    spans = [max(1e-9, hi - lo) for lo, hi in (ax.get_xlim(), ax.get_ylim())]
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


def _point_labels(ax: Axes, names: Sequence[str], x: Any, y: Any) -> None:
    """Query ids beside their points, never over each other or outside the panel: each label
    tries the four corners around its point (the ones facing the panel's middle first) and is
    left out when all four would overprint one already placed; its point stays."""
    renderer = ax.figure.canvas.get_renderer()  # type: ignore[attr-defined]
    frame = ax.get_window_extent(renderer)
    placed: list[Any] = []
    mid_x, mid_y = (sum(ax.get_xlim()) / 2, sum(ax.get_ylim()) / 2)
    for xi, yi, text in _clusters(names, x, y, ax):
        sides = [(4, "left"), (-4, "right")]
        heights = [4, -10]
        sides = sides[::-1] if xi > mid_x else sides
        heights = heights[::-1] if yi > mid_y else heights
        for dy in heights:
            for dx, ha in sides:
                label = ax.annotate(
                    text, (xi, yi), fontsize=7, xytext=(dx, dy), textcoords="offset points", ha=ha
                )
                label.set_in_layout(False)
                box = label.get_window_extent(renderer)
                fits = frame.contains(box.x0, box.y0) and frame.contains(box.x1, box.y1)
                if fits and not any(box.overlaps(b) for b in placed):
                    placed.append(box)
                    break
                label.remove()
            else:
                continue
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
    fig = _figure(len(pairs), height=3.3)
    labels: list[tuple[Axes, list[str], Any, Any]] = []
    for ax, (metric, (base, other)) in zip(_axes(fig), pairs.items(), strict=False):
        common = sorted(base.keys() & other.keys())
        x = np.array([base[q] for q in common])
        y = np.array([other[q] for q in common])
        lo = min(0.0, *x, *y) if common else 0.0
        hi = max(1.0, *x, *y) if common else 1.0
        ax.plot([lo, hi], [lo, hi], color="#888888", lw=0.8, ls="--")
        ax.scatter(x, y, s=18, color=engine_colour(1), alpha=0.7, zorder=3)
        pad = 0.04 * (hi - lo)
        ax.set(xlabel=baseline, ylabel=engine, xlim=(lo - pad, hi + pad), ylim=(lo - pad, hi + pad))
        d = (x - y) if lower_is_better(metric) else (y - x)
        wins, losses = int((d > 1e-12).sum()), int((d < -1e-12).sum())
        ties = len(common) - wins - losses
        ax.set_title(f"{metric}\nbetter {wins} · tie {ties} · worse {losses}", fontsize=9)
        ax.grid(alpha=0.3)
        labels.append((ax, common, x, y))
    labels = [panel for panel in labels if len(panel[1]) <= 15]
    if labels:
        fig.draw_without_rendering()  # settle the layout, so the labels can see where they land
    for ax, common, x, y in labels:
        _point_labels(ax, common, x, y)
    return to_svg(fig, f"per-query {engine} vs {baseline}")


def metric_bars(
    means: Mapping[str, Mapping[str, tuple[float | None, float | None, float | None]]],
    engines: Sequence[str],
) -> str:
    """One panel per metric: each engine's (or run's) mean as a horizontal bar with its 95%
    CI as a whisker, on the shared [0, 1] axis; engine names on the left, never overprinted."""
    metrics = list(means)
    fig = _figure(len(metrics), height=0.9 + 0.32 * len(engines))
    for n, (ax, metric) in enumerate(zip(_axes(fig), metrics, strict=False)):
        rows = [means[metric].get(e, (None, None, None)) for e in engines]
        ys = np.arange(len(engines))
        mean = np.array([np.nan if m is None else m for m, _, _ in rows])
        low = np.array([np.nan if lo is None or m is None else m - lo for m, lo, _ in rows])
        high = np.array([np.nan if hi is None or m is None else hi - m for m, _, hi in rows])
        colours = [engine_colour(i) for i in range(len(engines))]
        ax.barh(ys, np.nan_to_num(mean), color=colours, alpha=0.75, height=0.6)
        ax.errorbar(mean, ys, xerr=[low, high], fmt="none", ecolor="#222222", capsize=3, lw=1)
        ax.set_yticks(ys, list(engines) if n % 3 == 0 else [""] * len(engines))
        ax.invert_yaxis()
        _unit_axis(ax, [float(v) for v in mean if not np.isnan(v)], axis="x")
        ax.set_title(metric)
        ax.grid(axis="x", alpha=0.3)
    return to_svg(fig, "mean per engine with 95% CI")


def stability_lines(
    per_repeat: Mapping[str, Mapping[str, Sequence[float | None]]],
    repeats: Mapping[str, Sequence[int]],
) -> str:
    """Per engine, each metric's mean in each repeat: flat lines mean a stable judge. One
    legend for all panels sits under them, off the data."""
    engines = list(per_repeat)
    fig = _figure(len(engines), cols=2, height=3.2)
    for ax, engine in zip(_axes(fig), engines, strict=False):
        drawn: list[float] = []
        for j, (metric, means) in enumerate(per_repeat[engine].items()):
            xs = list(repeats[engine])
            ys = [np.nan if m is None else m for m in means]
            drawn += [m for m in means if m is not None]
            ax.plot(xs, ys, marker="o", ms=4, label=metric, color=engine_colour(j))
        ax.set(title=engine, xlabel="repeat", ylabel="mean over queries")
        ax.set_xticks(list(repeats[engine]))
        _unit_axis(ax, drawn)
        ax.grid(alpha=0.3)
    _legend_below(fig)
    return to_svg(fig, "stability across repeats")


def _legend_below(fig: Figure) -> None:
    """One legend for the figure, under its panels (the first panel's series name them all)."""
    handles, labels = fig.axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(6, len(labels)))


def label_distribution(
    counts: Mapping[str, Mapping[str, int]], labels: Sequence[str], *, colour_map: str = "RdYlGn"
) -> str:
    """Stacked horizontal bars per engine: each scale label (worst to best on a red-to-green
    ramp), then ``unparsed`` (grey, hatched) and ``error`` (dark, cross-hatched)."""
    engines = list(counts)
    fig = Figure(figsize=(10.0, 1.2 + 0.5 * len(engines)), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ramp = matplotlib.colormaps[colour_map]
    styles: dict[str, tuple[Any, str]] = {
        name: (ramp(0.1 + 0.8 * i / max(1, len(labels) - 1)), "") for i, name in enumerate(labels)
    }
    styles.update(FAILED_STYLES)
    left = np.zeros(len(engines))
    for name, (colour, hatch) in styles.items():
        widths = np.array([counts[e].get(name, 0) for e in engines], dtype=float)
        bars = ax.barh(
            engines, widths, left=left, color=colour, hatch=hatch, edgecolor="white", label=name
        )
        big = widths >= 0.03 * max((sum(c.values()) for c in counts.values()), default=1)
        ax.bar_label(
            bars,
            labels=[f"{w:.0f}" if b else "" for w, b in zip(widths, big, strict=True)],
            label_type="center",
            size=8,
        )
        left += widths
    ax.invert_yaxis()
    ax.set_xlabel("verdicts")
    fig.legend(loc="outside lower center", ncols=len(styles), fontsize=8)
    return to_svg(fig, "verdict labels")


def history_trend(
    runs: Sequence[tuple[int, Mapping[str, Mapping[str, float | None]]]],
    metrics: Sequence[str],
    engines: Sequence[str],
    flagged: set[tuple[int, str, str]],
) -> str:
    """Metric means over past runs (x = run id), one panel per metric, one line per engine;
    a red cross marks a run flagged as a regression for that engine and metric."""
    fig = _figure(len(metrics), cols=2, height=3.0)
    xs = [run_id for run_id, _ in runs]
    for ax, metric in zip(_axes(fig), metrics, strict=False):
        drawn: list[float] = []
        for i, engine in enumerate(engines):
            ys = [values.get(engine, {}).get(metric) for _, values in runs]
            drawn += [y for y in ys if y is not None]
            shown = [np.nan if y is None else y for y in ys]
            ax.plot(xs, shown, marker="o", ms=4, color=engine_colour(i), label=engine)
            bad = [(x, y) for x, y in zip(xs, ys, strict=True) if (x, engine, metric) in flagged]
            if bad:
                bx, by = zip(*bad, strict=True)
                ax.scatter(bx, by, marker="x", s=80, color="#d62728", zorder=4)
        ax.set(title=metric, xlabel="run")
        ax.set_xticks(xs)
        _unit_axis(ax, drawn)
        ax.grid(alpha=0.3)
    _legend_below(fig)
    return to_svg(fig, "trend over previous runs")
