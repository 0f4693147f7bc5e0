"""report.md (and, later, report.html) from a run's summary and results."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from judge.schema import JudgedQuery


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def markdown(summary: dict[str, Any], results: Sequence[JudgedQuery], *, worst: int = 5) -> str:
    c = summary["counts"]
    u = summary["usage"]
    lines = [
        "# judge report",
        "",
        f"{c['queries']} queries ({c['query_ids']} ids, engines: {', '.join(c['engines'])}), "
        f"{c['repeats']} repeat(s), {c['verdicts']} verdicts: {c['ok']} ok, "
        f"{c['unparsed']} unparsed, {c['error']} error.",
        f"Tokens: {u['prompt_tokens']} prompt + {u['completion_tokens']} completion "
        f"({u['prompt_tokens_per_passage']:.1f} + {u['completion_tokens_per_passage']:.1f} per passage); "
        f"cost {_fmt(u['cost_usd'])} USD.",
        "",
    ]
    if summary.get("unjudged_policy") == "skip":
        lines += ["Metrics of queries with unparsed/error verdicts are computed over the judged passages only.", ""]
    else:
        lines += ["Queries with an unparsed or error verdict have undefined metrics (not counted as 0).", ""]
    names = summary["metric_names"]
    lines += ["## Metrics", "", "| engine | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for engine, data in summary["engines"].items():
        cells = []
        for name in names:
            m = data["metrics"].get(name, {})
            cell = _fmt(m.get("mean"))
            if m.get("ci_low") is not None:
                cell += f" [{m['ci_low']:.3f}, {m['ci_high']:.3f}]"
            cells.append(cell)
        lines.append(f"| {engine} | " + " | ".join(cells) + " |")
    st = summary["stability"]
    lines += ["", "## Stability across repeats", "", f"Krippendorff's alpha ({st['alpha_level']}): {_fmt(st['alpha'])}", ""]
    for engine, est in st["engines"].items():
        flips = est["flips"]
        lines.append(
            f"- {engine}: flip rate {_fmt(flips['flip_rate'])} over {flips['n_passages']} passages; "
            f"alpha {_fmt(est['alpha'])}"
        )
        agreement = est.get("agreement")
        if agreement:
            per = agreement["per_judgement"]
            lines.append(
                f"  - vs human labels: accuracy {_fmt(per['accuracy'])}, kappa {_fmt(per['kappa'])}, "
                f"weighted kappa {_fmt(per['weighted_kappa'])}, AUC {_fmt(per['auc'])}"
            )
    th = summary["thresholds"]
    lines += ["", "## Thresholds", ""]
    if not th["checks"]:
        lines.append("No thresholds configured.")
    for chk in th["checks"]:
        mark = "ok" if chk["ok"] else "**BREACHED**"
        engine = f" ({chk['engine']})" if "engine" in chk else ""
        lines.append(f"- {chk['check']}{engine}: {_fmt(chk['value'])} vs {_fmt(chk['limit'])} — {mark}")
    key = summary["metric_names"][0] if summary["metric_names"] else None
    if key:
        scored = [jq for jq in results if jq.metrics.get(key) is not None]
        scored.sort(key=lambda jq: jq.metrics[key] or 0.0)
        lines += ["", f"## Lowest {key}", ""]
        for jq in scored[:worst]:
            lines.append(f"### {jq.query.query_id} / {jq.query.engine} (repeat {jq.repeat}): {key} {_fmt(jq.metrics[key])}")
            lines.append(f"> {jq.query.query}")
            lines.append("")
            for v in jq.verdicts:
                reason = (v.reason or v.error or "").replace("\n", " ")
                lines.append(f"- #{v.rank} `{v.passage_id}` {v.status} {v.label or ''}: {reason}")
            lines.append("")
    return "\n".join(lines) + "\n"


def write_reports(out_dir: Path, summary: dict[str, Any], results: Sequence[JudgedQuery]) -> list[Path]:
    path = out_dir / "report.md"
    path.write_text(markdown(summary, results), encoding="utf-8")
    return [path]
