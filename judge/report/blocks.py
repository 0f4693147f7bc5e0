"""The building blocks of a report and their two renderings, Markdown and one HTML page.

Report content (judge.report) is a :class:`Header` (the status word, its reasons one line
each, and what was run) and a list of :class:`Section` holding :class:`Text`, :class:`Table`
and :class:`Chart` blocks; this module only turns them into text. The header's title is the
page's ``<title>``, its ``<h1>`` and report.md's first line. All data text is escaped in both
renderings; charts appear only in the HTML; a :class:`Link` cell jumps within the page.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from judge.schema import printable

_CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d232b}
main{max-width:1180px;margin:0 auto;padding:16px 24px 48px}h1{font-size:24px}
.verdict{font-size:16px;margin:6px 0}.trust{color:#4a5360;margin:4px 0 8px}
section{background:#fff;border:1px solid #dde1e6;border-radius:6px;padding:8px 18px;margin:14px 0}
h2{font-size:18px;margin:10px 0}h3{font-size:15px;margin:16px 0 4px}blockquote{margin:4px 0}
table{border-collapse:collapse;margin:6px 0;font-size:13px}th{background:#eef1f4}
th,td{border:1px solid #d5d9de;padding:3px 7px;text-align:left;vertical-align:top}
td.num{text-align:right;font-variant-numeric:tabular-nums}td.text{max-width:520px;overflow-wrap:anywhere}
tr.relevant{background:#edf7ee}tr.failed{background:#fdecea}.muted{color:#667085}
.bad{color:#b3261e;font-weight:600}.ok{color:#1b6e2f}svg.chart{width:100%;height:auto}
section#warning{border:3px solid #b3261e;background:#fdecea}section#warning h2{color:#b3261e}
p.alert{color:#7a1712;font-weight:600}tr.disagree td.human{background:#fff3c4;font-weight:600}
header{border-radius:6px;padding:6px 18px;margin:10px 0;border:3px solid #1b6e2f;background:#edf7ee}
header h1{margin:6px 0}header ul{margin:4px 0;padding-left:20px}header li{margin:2px 0}
header.failed,header.unreliable{border-color:#b3261e;background:#fdecea}
header.failed h1,header.unreliable h1{color:#b3261e}header.incomplete{border-color:#b26a00;
background:#fff4e0}header.incomplete h1{color:#8a5300}header p{margin:4px 0;color:#3d4652}
header.neutral{border-color:#8a94a3;background:#fff}header.neutral h1{color:#1d232b}
details>summary{cursor:pointer;color:#1f4e99;margin:6px 0}a{color:#1f4e99}"""
_CSP = "default-src 'none'; style-src 'unsafe-inline'"


@dataclass(frozen=True)
class Header:
    """What the first screen says: ``title`` (status word first), one line per reason, and
    ``meta`` (config, dataset, model, date); ``css`` colours it (passed, failed, ...)."""

    title: str
    css: str
    lines: Sequence[str] = ()
    meta: Sequence[str] = ()
    # Which engine is better, and how far to trust it: said before everything else.
    verdict: Sequence[str] = ()


@dataclass(frozen=True)
class Link:
    """A table cell that jumps to the element with id ``target`` (plain text in Markdown)."""

    text: str
    target: str


@dataclass(frozen=True)
class Text:
    """A paragraph; ``kind`` is p, h3, quote, muted, ok, bad or alert (a loud warning);
    ``anchor`` is its id in the page, where a :class:`Link` can jump to."""

    text: str
    kind: str = "p"
    anchor: str | None = None


@dataclass(frozen=True)
class Table:
    """Rows under ``head``; ``num`` columns align right; ``fold`` puts the table in a closed
    ``<details>`` with that summary (the HTML's way to offer another order of the same rows)."""

    head: Sequence[str]
    rows: Sequence[Sequence[Any]]
    num: frozenset[int] = frozenset()
    row_css: Sequence[str] = ()
    fold: str | None = None


@dataclass(frozen=True)
class Chart:
    """A chart drawn only for the HTML page (``draw`` returns an ``<svg>`` element)."""

    draw: Callable[[], str]
    caption: str


@dataclass(frozen=True)
class Section:
    ident: str
    title: str
    blocks: list[Text | Table | Chart] = field(default_factory=list)


def lazy_chart(name: str, *args: Any) -> Callable[[], str]:
    """Chart function ``name`` of :mod:`judge.report.charts` on ``args``, for a :class:`Chart`;
    the chart code is imported only when it is drawn (--no-charts needs none)."""

    def draw() -> str:
        from judge.report import charts

        chart: Callable[..., str] = getattr(charts, name)
        return chart(*args)

    return draw


def format_value(value: Any) -> str:
    if isinstance(value, Link):
        return value.text
    return "—" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)


# Values whose text has nothing to escape (an exact type: a str subclass may say anything).
_PLAIN = frozenset({int, float, bool, type(None)})


# What makes Markdown of plain text: a backslash escape, the "](" of a link or an image, the
# "]:" of a link reference definition (which would give "![r]" anywhere in the page a target).
_MD_SYNTAX = re.compile(r"\\|\](?=[(:])")


def md_text(value: Any) -> str:
    """Markdown-safe text: HTML escaped (renderers pass HTML through), pipes, backslashes and
    the bracket that closes a link's text or a link reference's label escaped (no link or
    image made of text from outside), controls shown."""
    if type(value) in _PLAIN:  # nothing to escape: most of a report's cells
        return format_value(value)
    text = printable(" ".join(format_value(value).split()))
    text = _MD_SYNTAX.sub(r"\\\g<0>", text)
    return html.escape(text, quote=False).replace("|", "\\|")


def render_markdown(header: Header, sections: Sequence[Section]) -> str:
    """The header, then the sections as Markdown; charts and folded tables are left out."""
    out = [f"# {md_text(header.title)}", ""]
    out += [f"**{md_text(line)}**  " for line in header.verdict[:-1]]
    out += [f"{md_text(header.verdict[-1])}", ""] if header.verdict else []
    out += [f"- {md_text(line)}" for line in header.lines]
    out += ["", " · ".join(md_text(m) for m in header.meta)] if header.meta else []
    prefix = {"h3": "### ", "quote": "> ", "bad": "**", "alert": "> **"}
    for section in sections:
        if all(isinstance(b, Chart) or getattr(b, "fold", None) for b in section.blocks):
            continue
        out += ["", f"## {md_text(section.title)}"]
        for block in section.blocks:
            if isinstance(block, Text):
                end = "**" if block.kind in {"bad", "alert"} else ""
                out += ["", f"{prefix.get(block.kind, '')}{md_text(block.text)}{end}"]
            elif isinstance(block, Table) and block.fold is None:
                out += ["", "| " + " | ".join(md_text(h) for h in block.head) + " |"]
                out.append("|" + "---|" * len(block.head))
                out += ["| " + " | ".join(md_text(c) for c in row) + " |" for row in block.rows]
    return "\n".join(out) + "\n"


def _e(value: Any) -> str:
    if type(value) in _PLAIN:
        return format_value(value)
    return html.escape(printable(format_value(value)), quote=True)


# Header names whose cells get a class of their own (wide text, the highlighted human label).
_COLUMN_CSS = {"text": "text", "reason": "text", "query": "text", "human": "human"}


def _cell(value: Any, css: str) -> str:
    if isinstance(value, Link):
        target = html.escape(value.target, quote=True)
        return f'<td class="{css}"><a href="#{target}">{_e(value.text)}</a></td>'
    return f'<td class="{css}">{_e(value)}</td>'


def _html_table(block: Table) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in block.head)
    css = list(block.row_css) or [""] * len(block.rows)
    columns = [
        "num" if i in block.num else _COLUMN_CSS.get(h, "") for i, h in enumerate(block.head)
    ]
    body = "".join(
        f'<tr class="{c}">'
        + "".join(_cell(v, k) for k, v in zip(columns, row, strict=True))
        + "</tr>"
        for c, row in zip(css, block.rows, strict=True)
    )
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    return f"<details><summary>{_e(block.fold)}</summary>{table}</details>" if block.fold else table


def _html_block(block: Text | Table | Chart) -> str:
    if isinstance(block, Chart):
        caption = f'<figcaption class="muted">{_e(block.caption)}</figcaption>'
        return f"<figure>{block.draw()}{caption}</figure>"
    if isinstance(block, Text):
        tag = {"h3": "h3", "quote": "blockquote"}.get(block.kind, "p")
        anchor = f' id="{html.escape(block.anchor, quote=True)}"' if block.anchor else ""
        return f'<{tag}{anchor} class="{block.kind}">{_e(block.text)}</{tag}>'
    return _html_table(block)


def _html_header(header: Header) -> str:
    lines = "".join(f"<li>{_e(line)}</li>" for line in header.lines)
    meta = " · ".join(_e(m) for m in header.meta)
    return (
        f'<header id="status" class="{html.escape(header.css, quote=True)}">'
        f"<h1>{_e(header.title)}</h1>"
        + "".join(f'<p class="verdict"><strong>{_e(v)}</strong></p>' for v in header.verdict[:-1])
        + (f'<p class="trust">{_e(header.verdict[-1])}</p>' if header.verdict else "")
        + (f"<ul>{lines}</ul>" if lines else "")
        + (f'<p class="meta">{meta}</p>' if meta else "")
        + "</header>"
    )


def render_html(header: Header, sections: Sequence[Section], *, charts: bool = True) -> str:
    """The header and the sections as one self-contained page: no script, nothing loaded from
    anywhere. ``charts=False`` leaves the charts out (drawing them is most of a report's cost)."""
    body = "\n".join(
        f'<section id="{html.escape(s.ident, quote=True)}"><h2>{_e(s.title)}</h2>'
        + "".join(_html_block(b) for b in s.blocks if charts or not isinstance(b, Chart))
        + "</section>"
        for s in sections
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{_e(header.title)}</title><style>{_CSS}</style></head>"
        f"<body><main>{_html_header(header)}\n{body}\n</main></body></html>\n"
    )
