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
        ax.set_xticks(range(1, len(engines) + 1), list(engines))
        ax.set_xlim(0.4, len(engines) + 0.6)
        ax.set_title(metric)
        ax.grid(axis="y", alpha=0.3)
    return to_svg(fig, "metric distribution per engine")


def engine_scatter(
    pairs: Mapping[str, tuple[Mapping[str, float], Mapping[str, float]]],
    baseline: str,
    engine: str,
) -> str:
    """Per query, ``engine``'s value (y) against ``baseline``'s (x), one panel per metric.

    Points above the diagonal are queries where ``engine`` did better; the counts above and
    below are written in the panel. Query ids label the points when there are few.
    """
    fig = _figure(len(pairs))
    for ax, (metric, (base, other)) in zip(_axes(fig), pairs.items(), strict=False):
        common = sorted(base.keys() & other.keys())
        x = np.array([base[q] for q in common])
        y = np.array([other[q] for q in common])
        lo = min(0.0, *x, *y) if common else 0.0
        hi = max(1.0, *x, *y) if common else 1.0
        ax.plot([lo, hi], [lo, hi], color="#888888", lw=0.8, ls="--")
        ax.scatter(x, y, s=18, color=engine_colour(1), alpha=0.7, zorder=3)
        if len(common) <= 15:
            for q, xi, yi in zip(common, x, y, strict=True):
                ax.annotate(q, (xi, yi), fontsize=7, xytext=(3, 3), textcoords="offset points")
        better, worse = int((y > x).sum()), int((y < x).sum())
        ax.text(0.03, 0.95, f"{engine} better: {better}", transform=ax.transAxes, va="top")
        ax.text(0.97, 0.05, f"{baseline} better: {worse}", transform=ax.transAxes, ha="right")
        ax.set(xlabel=baseline, ylabel=engine, title=metric, xlim=(lo, hi), ylim=(lo, hi))
        ax.grid(alpha=0.3)
    return to_svg(fig, f"per-query {engine} vs {baseline}")


def stability_lines(
    per_repeat: Mapping[str, Mapping[str, Sequence[float | None]]],
    repeats: Mapping[str, Sequence[int]],
) -> str:
    """Per engine, each metric's mean in each repeat: flat lines mean a stable judge."""
    engines = list(per_repeat)
    fig = _figure(len(engines), cols=2, height=3.2)
    for ax, engine in zip(_axes(fig), engines, strict=False):
        for j, (metric, means) in enumerate(per_repeat[engine].items()):
            xs = list(repeats[engine])
            ys = [np.nan if m is None else m for m in means]
            ax.plot(xs, ys, marker="o", ms=4, label=metric, color=engine_colour(j))
        ax.set(title=engine, xlabel="repeat", ylabel="mean over queries")
        ax.set_xticks(list(repeats[engine]))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best", ncols=2)
    return to_svg(fig, "stability across repeats")


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
    ax.legend(ncols=len(styles), loc="upper center", bbox_to_anchor=(0.5, -0.35), fontsize=8)
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
        for i, engine in enumerate(engines):
            ys = [values.get(engine, {}).get(metric) for _, values in runs]
            shown = [np.nan if y is None else y for y in ys]
            ax.plot(xs, shown, marker="o", ms=4, color=engine_colour(i), label=engine)
            bad = [(x, y) for x, y in zip(xs, ys, strict=True) if (x, engine, metric) in flagged]
            if bad:
                bx, by = zip(*bad, strict=True)
                ax.scatter(bx, by, marker="x", s=80, color="#d62728", zorder=4)
        ax.set(title=metric, xlabel="run")
        ax.set_xticks(xs)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return to_svg(fig, "trend over previous runs")
