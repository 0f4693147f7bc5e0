"""The building blocks of a report and their two renderings, Markdown and one HTML page.

Report content (judge.report) is a list of :class:`Section` holding :class:`Text`,
:class:`Table` and :class:`Chart` blocks; this module only turns them into text. All data
text is escaped in both renderings; charts appear only in the HTML.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

_CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d232b}
main{max-width:1180px;margin:0 auto;padding:16px 24px 48px}h1{font-size:24px}
section{background:#fff;border:1px solid #dde1e6;border-radius:6px;padding:8px 18px;margin:14px 0}
h2{font-size:18px;margin:10px 0}h3{font-size:15px;margin:16px 0 4px}blockquote{margin:4px 0}
table{border-collapse:collapse;margin:6px 0;font-size:13px}th{background:#eef1f4}
th,td{border:1px solid #d5d9de;padding:3px 7px;text-align:left;vertical-align:top}
td.num{text-align:right;font-variant-numeric:tabular-nums}td.text{max-width:520px}
tr.relevant{background:#edf7ee}tr.failed{background:#fdecea}.muted{color:#667085}
.bad{color:#b3261e;font-weight:600}.ok{color:#1b6e2f}svg.chart{width:100%;height:auto}
section#warning{border:3px solid #b3261e;background:#fdecea}section#warning h2{color:#b3261e}
p.alert{color:#7a1712;font-weight:600}"""
_CSP = "default-src 'none'; style-src 'unsafe-inline'"


@dataclass(frozen=True)
class Text:
    """A paragraph; ``kind`` is p, h3, quote, muted, ok, bad or alert (a loud warning)."""

    text: str
    kind: str = "p"


@dataclass(frozen=True)
class Table:
    head: Sequence[str]
    rows: Sequence[Sequence[Any]]
    num: frozenset[int] = frozenset()
    row_css: Sequence[str] = ()


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


def format_value(value: Any) -> str:
    return "—" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)


def _md(value: Any) -> str:
    """Markdown-safe text: HTML escaped (renderers pass HTML through), pipes escaped."""
    return html.escape(" ".join(format_value(value).split()), quote=False).replace("|", "\\|")


def render_markdown(sections: Sequence[Section]) -> str:
    """Sections as Markdown; chart-only sections are left out."""
    out = ["# judge report"]
    prefix = {"h3": "### ", "quote": "> ", "bad": "**", "alert": "> **"}
    for section in sections:
        if all(isinstance(block, Chart) for block in section.blocks):
            continue
        out += ["", f"## {_md(section.title)}"]
        for block in section.blocks:
            if isinstance(block, Text):
                end = "**" if block.kind in {"bad", "alert"} else ""
                out += ["", f"{prefix.get(block.kind, '')}{_md(block.text)}{end}"]
            elif isinstance(block, Table):
                out += ["", "| " + " | ".join(_md(h) for h in block.head) + " |"]
                out.append("|" + "---|" * len(block.head))
                out += ["| " + " | ".join(_md(c) for c in row) + " |" for row in block.rows]
    return "\n".join(out) + "\n"


def _e(value: Any) -> str:
    return html.escape(format_value(value), quote=True)


def _html_block(block: Text | Table | Chart) -> str:
    if isinstance(block, Chart):
        caption = f'<figcaption class="muted">{_e(block.caption)}</figcaption>'
        return f"<figure>{block.draw()}{caption}</figure>"
    if isinstance(block, Text):
        tag = {"h3": "h3", "quote": "blockquote"}.get(block.kind, "p")
        return f'<{tag} class="{block.kind}">{_e(block.text)}</{tag}>'
    head = "".join(f"<th>{_e(h)}</th>" for h in block.head)
    css = list(block.row_css) or [""] * len(block.rows)
    body = "".join(
        f'<tr class="{c}">'
        + "".join(
            f'<td class="{"num" if i in block.num else "text" if h == "text" else ""}">{_e(v)}</td>'
            for i, (h, v) in enumerate(zip(block.head, row, strict=True))
        )
        + "</tr>"
        for c, row in zip(css, block.rows, strict=True)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(sections: Sequence[Section], *, charts: bool = True) -> str:
    """Sections as one self-contained page: no script, nothing loaded from anywhere.
    ``charts=False`` leaves the charts out (drawing them is most of a report's cost)."""
    body = "\n".join(
        f'<section id="{s.ident}"><h2>{_e(s.title)}</h2>'
        + "".join(_html_block(b) for b in s.blocks if charts or not isinstance(b, Chart))
        + "</section>"
        for s in sections
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>judge report</title><style>{_CSS}</style></head>"
        f"<body><main><h1>judge report</h1>\n{body}\n</main></body></html>\n"
    )
