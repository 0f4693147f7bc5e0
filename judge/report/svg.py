"""A small SVG plotting kit: the panels, axes, marks and legends the report's charts draw.

Why not a plotting library: matplotlib, which drew these charts before, costs about 0.45 s to
import and 0.1-0.2 s per chart, more than half of the one second a small cached run may take
from start to end (issue 16); the light SVG libraries (pygal) draw no box plot with its points
over it, place no labels around points, and bring their own script and style sheet, which an
offline report must not reference. The charts here need little: rectangles, lines, circles
and text in panels with linear axes. Text stays text, so the browser draws Chinese names with
its own fonts and the page can be searched; nothing refers outside the page.

Coordinates: a :class:`Figure` is ``width`` pixels wide (the page scales it to its column);
each :class:`Panel` maps data to pixels inside its frame, y growing upwards.
"""

from __future__ import annotations

import hashlib
import html
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from judge.schema import printable

__all__ = ["TAB10", "Figure", "Mark", "Panel", "nice_ticks", "ramp", "text_width"]

# matplotlib's tab10 cycle: the colours engines had in earlier reports.
TAB10 = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
# ColorBrewer's red-yellow-green, worst to best.
_RDYLGN = (
    "#a50026",
    "#d73027",
    "#f46d43",
    "#fdae61",
    "#fee08b",
    "#ffffbf",
    "#d9ef8b",
    "#a6d96a",
    "#66bd63",
    "#1a9850",
    "#006837",
)
FONT = 10.0
SMALL = 8.0
_INK = "#222222"
_GRID = "#dddddd"


def esc(value: object) -> str:
    """Text for a chart: controls shown (an engine's name may carry ESC), HTML escaped."""
    return html.escape(printable(str(value)), quote=True)


def _n(value: float) -> str:
    """A pixel coordinate, short."""
    return f"{value:.1f}".rstrip("0").rstrip(".")


def text_width(text: str, size: float = FONT) -> float:
    """About how wide ``text`` is drawn at ``size`` px (CJK characters count double)."""
    return sum(size if ord(c) > 0x2E80 else 0.58 * size for c in text)


def ramp(share: float) -> str:
    """The red-yellow-green colour at ``share`` in [0, 1], interpolated between its stops."""
    at = min(max(share, 0.0), 1.0) * (len(_RDYLGN) - 1)
    i = min(int(at), len(_RDYLGN) - 2)
    t = at - i
    a, b = (
        (int(_RDYLGN[i][k : k + 2], 16) for k in (1, 3, 5)),
        (int(_RDYLGN[i + 1][k : k + 2], 16) for k in (1, 3, 5)),
    )
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(a, b, strict=True))


def nice_ticks(lo: float, hi: float, most: int = 6) -> list[float]:
    """Round tick values covering [lo, hi]: steps of 1, 2, 2.5 or 5 times a power of ten, at
    most ``most`` of them."""
    span = hi - lo
    if not math.isfinite(span) or span <= 0:
        return [lo]
    for power in range(math.floor(math.log10(span / most)) - 1, 20):
        for unit in (1.0, 2.0, 2.5, 5.0):
            step = unit * 10.0**power
            first = math.ceil(lo / step - 1e-9)
            last = math.floor(hi / step + 1e-9)
            if last - first + 1 <= most:
                return [round(k * step, 12) for k in range(first, last + 1)]
    return [lo, hi]


def tick_labels(ticks: Sequence[float]) -> list[str]:
    """Tick values with as many decimals as their step needs (at least one)."""
    step = min((b - a for a, b in itertools.pairwise(ticks)), default=1.0)
    decimals = max(1, -math.floor(math.log10(step) + 1e-9)) if step > 0 else 1
    if decimals == 1 and any(abs(t * 10 - round(t * 10)) > 1e-6 for t in ticks):
        decimals = 2
    return [f"{t:.{decimals}f}" for t in ticks]


@dataclass(frozen=True)
class Mark:
    """A legend entry: a line with a marker (``line``), or a filled box (``fill``)."""

    name: str
    colour: str
    line: bool = False
    pattern: str = ""


@dataclass
class Panel:
    """One plot: a frame at (``left``, ``top``) of ``width`` x ``height`` pixels showing
    ``xlim`` x ``ylim``."""

    left: float
    top: float
    width: float
    height: float
    xlim: tuple[float, float] = (0.0, 1.0)
    ylim: tuple[float, float] = (0.0, 1.0)
    parts: list[str] = field(default_factory=list)

    def px(self, x: float) -> float:
        lo, hi = self.xlim
        return self.left + (x - lo) / ((hi - lo) or 1.0) * self.width

    def py(self, y: float) -> float:
        lo, hi = self.ylim
        return self.top + self.height - (y - lo) / ((hi - lo) or 1.0) * self.height

    def frame(
        self,
        *,
        xticks: Sequence[tuple[float, str]] = (),
        yticks: Sequence[tuple[float, str]] = (),
        grid: str = "",
        title: Sequence[str] = (),
        xlabel: str = "",
        ylabel: str = "",
        slant: bool = False,
    ) -> None:
        """The frame, its ticks and their labels, grid lines (``"x"``, ``"y"`` or ``"xy"``),
        a title of one or more lines above it and axis labels."""
        right, bottom = self.left + self.width, self.top + self.height
        for x, label in xticks:
            at = self.px(x)
            if "x" in grid:
                self._line(at, self.top, at, bottom, _GRID)
            self._line(at, bottom, at, bottom + 3, _INK)
            if slant:
                self.parts.append(
                    f'<text x="{_n(at)}" y="{_n(bottom + 12)}" font-size="{FONT}" '
                    f'text-anchor="end" transform="rotate(-25 {_n(at)} {_n(bottom + 12)})">'
                    f"{esc(label)}</text>"
                )
            else:
                self.label(at, bottom + 13, label, anchor="middle")
        for y, label in yticks:
            at = self.py(y)
            if "y" in grid:
                self._line(self.left, at, right, at, _GRID)
            self._line(self.left - 3, at, self.left, at, _INK)
            self.label(self.left - 5, at + 3.5, label, anchor="end")
        self.parts.append(
            f'<rect x="{_n(self.left)}" y="{_n(self.top)}" width="{_n(self.width)}" '
            f'height="{_n(self.height)}" fill="none" stroke="{_INK}" stroke-width="0.8"/>'
        )
        for i, line in enumerate(reversed(title)):
            self.label(self.left + self.width / 2, self.top - 6 - 13 * i, line, anchor="middle")
        if xlabel:
            self.label(self.left + self.width / 2, bottom + 27, xlabel, anchor="middle")
        if ylabel:
            x, y = self.left - 34, self.top + self.height / 2
            self.parts.append(
                f'<text x="{_n(x)}" y="{_n(y)}" font-size="{FONT}" text-anchor="middle" '
                f'transform="rotate(-90 {_n(x)} {_n(y)})">{esc(ylabel)}</text>'
            )

    def _line(self, x0: float, y0: float, x1: float, y1: float, colour: str) -> None:
        self.parts.append(
            f'<line x1="{_n(x0)}" y1="{_n(y0)}" x2="{_n(x1)}" y2="{_n(y1)}" '
            f'stroke="{colour}" stroke-width="0.8"/>'
        )

    def label(
        self, x: float, y: float, text: str, *, anchor: str = "start", size: float = FONT
    ) -> None:
        """``text`` at pixel (x, y) (its baseline)."""
        self.parts.append(
            f'<text x="{_n(x)}" y="{_n(y)}" font-size="{size}" text-anchor="{anchor}">'
            f"{esc(text)}</text>"
        )

    def line(
        self,
        xs: Sequence[float],
        ys: Sequence[float | None],
        colour: str,
        *,
        width: float = 1.5,
        dash: str = "",
        markers: bool = False,
    ) -> None:
        """A polyline through the points; a missing y (None, NaN) breaks it."""
        runs: list[list[tuple[float, float]]] = [[]]
        for x, y in zip(xs, ys, strict=True):
            if y is None or not math.isfinite(y):
                runs.append([])
            else:
                runs[-1].append((self.px(x), self.py(y)))
        style = f' stroke-dasharray="{dash}"' if dash else ""
        for run in runs:
            if len(run) > 1:
                points = " ".join(f"{_n(a)},{_n(b)}" for a, b in run)
                self.parts.append(
                    f'<polyline points="{points}" fill="none" stroke="{colour}" '
                    f'stroke-width="{width}"{style}/>'
                )
            if markers:
                for a, b in run:
                    self._dot(a, b, 3.0, colour, 1.0)

    def dots(
        self,
        xs: Sequence[float],
        ys: Sequence[float],
        colour: str,
        *,
        radius: float = 2.5,
        opacity: float = 0.8,
    ) -> None:
        for x, y in zip(xs, ys, strict=True):
            self._dot(self.px(x), self.py(y), radius, colour, opacity)

    def _dot(self, x: float, y: float, radius: float, colour: str, opacity: float) -> None:
        self.parts.append(
            f'<circle cx="{_n(x)}" cy="{_n(y)}" r="{radius}" fill="{colour}" '
            f'fill-opacity="{opacity}"/>'
        )

    def cross(self, x: float, y: float, colour: str, size: float = 5.0) -> None:
        a, b = self.px(x), self.py(y)
        self.parts.append(
            f'<path d="M{_n(a - size)},{_n(b - size)}L{_n(a + size)},{_n(b + size)}'
            f'M{_n(a - size)},{_n(b + size)}L{_n(a + size)},{_n(b - size)}" '
            f'stroke="{colour}" stroke-width="2"/>'
        )

    def box(
        self,
        x0: float,
        x1: float,
        y0: float,
        y1: float,
        colour: str,
        *,
        opacity: float = 1.0,
        stroke: str = "none",
        pattern: str = "",
    ) -> None:
        """A rectangle between data coordinates (x0, y0) and (x1, y1)."""
        a, b = sorted((self.px(x0), self.px(x1)))
        c, d = sorted((self.py(y0), self.py(y1)))
        rect = (
            f'x="{_n(a)}" y="{_n(c)}" width="{_n(b - a)}" height="{_n(d - c)}" '
            f'stroke="{stroke}" stroke-width="0.8"'
        )
        self.parts.append(f'<rect {rect} fill="{colour}" fill-opacity="{opacity}"/>')
        if pattern:
            self.parts.append(f'<rect {rect} fill="url(#{pattern})"/>')

    def segment(self, x0: float, y0: float, x1: float, y1: float, colour: str = _INK) -> None:
        """A thin line between two data points."""
        self._line(self.px(x0), self.py(y0), self.px(x1), self.py(y1), colour)


class Figure:
    """Panels on a grid of ``cols`` columns, each ``panel_height`` tall, in a ``width``-pixel
    figure; ``margins`` (left, top, right, bottom) leave room for ticks, labels and titles."""

    def __init__(
        self,
        n_panels: int,
        *,
        cols: int = 3,
        width: float = 720.0,
        panel_height: float = 216.0,
        margins: tuple[float, float, float, float] = (46.0, 24.0, 12.0, 34.0),
    ) -> None:
        self.cols = max(1, min(cols, n_panels))
        self.rows = max(1, math.ceil(n_panels / self.cols))
        self.width = width
        left, top, right, bottom = margins
        cell = width / self.cols
        self.panels = [
            Panel(
                left=(i % self.cols) * cell + left,
                top=(i // self.cols) * panel_height + top,
                width=cell - left - right,
                height=panel_height - top - bottom,
            )
            for i in range(max(1, n_panels))
        ][:n_panels]
        self.height = self.rows * panel_height
        self.defs: list[str] = []
        self.legend_parts: list[str] = []

    def pattern(self, name: str, kind: str, colour: str) -> str:
        """A hatch pattern (``"//"`` diagonal or ``"xx"`` crossed) in ``colour``; its id."""
        ident = f"hatch-{name}-{len(self.defs)}"
        strokes = '<path d="M0,6L6,0" stroke="{c}" stroke-width="1"/>'
        if kind == "xx":
            strokes += '<path d="M0,0L6,6" stroke="{c}" stroke-width="1"/>'
        self.defs.append(
            f'<pattern id="{ident}" width="6" height="6" patternUnits="userSpaceOnUse">'
            + strokes.format(c=colour)
            + "</pattern>"
        )
        return ident

    def legend(self, marks: Sequence[Mark], *, cols: int = 6) -> None:
        """One legend under the panels, centred, at most ``cols`` entries a row."""
        if not marks:
            return
        cols = max(1, min(cols, len(marks)))
        cell = max(text_width(m.name, SMALL + 1) for m in marks) + 30
        rows = math.ceil(len(marks) / cols)
        top = self.height + 4
        for i, mark in enumerate(marks):
            row, col = divmod(i, cols)
            in_row = min(cols, len(marks) - row * cols)
            x = (self.width - in_row * cell) / 2 + col * cell
            y = top + row * 16 + 8
            if mark.line:
                self.legend_parts.append(
                    f'<line x1="{_n(x)}" y1="{_n(y)}" x2="{_n(x + 18)}" y2="{_n(y)}" '
                    f'stroke="{mark.colour}" stroke-width="1.5"/>'
                    f'<circle cx="{_n(x + 9)}" cy="{_n(y)}" r="3" fill="{mark.colour}"/>'
                )
            else:
                box = f'x="{_n(x + 2)}" y="{_n(y - 5)}" width="14" height="10"'
                self.legend_parts.append(f'<rect {box} fill="{mark.colour}"/>')
                if mark.pattern:
                    self.legend_parts.append(f'<rect {box} fill="url(#{mark.pattern})"/>')
            self.legend_parts.append(
                f'<text x="{_n(x + 23)}" y="{_n(y + 3.5)}" font-size="{SMALL + 1}">'
                f"{esc(mark.name)}</text>"
            )
        self.height += rows * 16 + 8

    def svg(self, name: str) -> str:
        """The figure as one ``<svg>`` element, named for screen readers; pattern ids are
        salted by ``name`` so two charts on one page never share one."""
        salt = hashlib.sha256(name.encode()).hexdigest()[:8]
        body = "".join(p for panel in self.panels for p in panel.parts) + "".join(self.legend_parts)
        defs = "".join(self.defs)
        if defs:
            defs = defs.replace('id="hatch-', f'id="{salt}-hatch-')
            body = body.replace("url(#hatch-", f"url(#{salt}-hatch-")
            defs = f"<defs>{defs}</defs>"
        return (
            f'<svg role="img" aria-label="{esc(name)}" class="chart" '
            f'viewBox="0 0 {_n(self.width)} '
            f'{_n(self.height)}" width="{_n(self.width)}" height="{_n(self.height)}" '
            f'font-family="DejaVu Sans, Arial, sans-serif" fill="{_INK}">'
            f'<rect width="100%" height="100%" fill="#ffffff"/>{defs}{body}</svg>'
        )
