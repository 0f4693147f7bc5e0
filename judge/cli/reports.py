"""``judge compare``, ``judge report`` and ``judge history``: commands over finished runs.

None of them calls a judge. ``compare`` reads one results file whose rows carry several
engines, or several run directories / results files each taken as an engine (``NAME=PATH``
names one), and can add a TREC run as an engine whose passages take the verdicts the other
engines' runs already hold for the same passage (same id or normalised text, same repeat):
TREC-style pooled evaluation at no cost. A passage no judged engine returned stays unjudged
(an ``error`` verdict saying so), so its query's metrics are undefined, never 0.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from judge.analysis.borrow import borrow_verdicts
from judge.analysis.compare import DEFAULT_POOLED, Comparison, check_metric, compare
from judge.config import load_config
from judge.data.results import load_engines, resolve_scale
from judge.errors import ConfigError, InputError
from judge.schema import MetricPolicy

SPARKS = "▁▂▃▄▅▆▇█"


def _num(value: float | None, sign: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value:+.4f}" if sign else f"{value:.4f}"


def columns(head: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    """Text columns under a dashed rule; ``align`` has one ``<`` or ``>`` per column."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(f"{c:{a}{w}}" for c, a, w in zip(cells, align, widths, strict=True))

    return "\n".join(line(r).rstrip() for r in [head, ["-" * w for w in widths], *rows])


def format_table(cmp: Comparison) -> str:
    """A plain-text table: per metric, each engine's mean and its paired difference."""
    head = ["metric", "engine", "n", "mean", f"diff vs {cmp.baseline}", "95% CI", "p", "paired"]
    rows: list[list[str]] = []
    diffs = {(d.metric, d.engine): d for d in cmp.diffs}
    for metric in cmp.metrics:
        for engine in cmp.engines:
            m, d = cmp.means[metric][engine], diffs.get((metric, engine))
            if d is None:
                rows.append([metric, engine, str(m.n), _num(m.mean), "(baseline)", "", "", ""])
                continue
            ci = (
                f"[{_num(d.ci_low, True)}, {_num(d.ci_high, True)}]"
                if d.ci_low is not None
                else "—"
            )
            p = "—" if d.p_value is None else f"{d.p_value:.4f}" + ("" if d.exact else "~")
            rows.append(
                [metric, engine, str(m.n), _num(m.mean), _num(d.diff, True), ci, p, str(d.n)]
            )
    out = [columns(head, rows, "<<>>>>>>")]
    out.append(
        f"\n{cmp.n_query_ids} query ids. diff: mean paired difference over the query ids both "
        f"engines define (paired); 95% bootstrap CI ({cmp.n_boot} resamples); p: two-sided "
        f"sign-flip test ({cmp.n_permutations} permutations; '~' sampled, else exact); "
        f"seed {cmp.seed}."
    )
    return "\n".join(out)


def cmd_compare(args: argparse.Namespace) -> int:
    from judge.data.datasets import read_trec_run

    config = load_config(args.config) if args.config else None
    results = load_engines(args.sources)
    if not results:
        raise InputError(f"no judged rows in {', '.join(args.sources)}")
    scale = resolve_scale(results, config)
    default = list(config.metrics.names) if config else list(results[0].metrics)
    metrics = args.metric or [*default, *DEFAULT_POOLED]
    for name in metrics:
        check_metric(name)
    if args.trec_run:
        if not (args.passage_store and args.queries):
            raise ConfigError("--trec-run needs --passage-store and --queries")
        report = read_trec_run(
            args.trec_run, args.passage_store, args.queries, engine=args.trec_engine
        )
        policy = config.metrics if config else MetricPolicy()
        results = [*results, *borrow_verdicts(report.queries, results, metrics, scale, policy)]
    cmp = compare(
        results,
        metrics,
        scale,
        baseline=args.baseline,
        n_boot=args.n_boot,
        n_permutations=args.permutations,
        seed=args.seed,
        policy=config.metrics if config else MetricPolicy(),
    )
    print(format_table(cmp))
    if args.json:
        Path(args.json).write_text(cmp.model_dump_json(indent=2), encoding="utf-8")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from judge.data.results import load_results
    from judge.report.document import write_reports
    from judge.report.history import history_rows_for_report, source_key
    from judge.report.summary import SUMMARY_FILE, build_summary, load_summary, write_summary

    out_dir = Path(args.run_dir)
    results = load_results(out_dir)
    config = load_config(args.config) if args.config else None
    summary_path = out_dir / SUMMARY_FILE
    if summary_path.exists() and not args.rebuild:
        summary = load_summary(summary_path)
    else:
        summary = build_summary(config or load_config(None), results)
        write_summary(summary_path, summary)
    history_path = args.history or (config.history_path() if config else None)
    rows = []
    if history_path is not None:
        rows = history_rows_for_report(
            history_path,
            list(summary.engines),
            summary.metric_names,
            args.last,
            max_drop=config.thresholds.max_drop if config else None,
            source=source_key(args.config),
        )
    for path in write_reports(out_dir, summary, results, history=rows, worst=args.worst):
        print(path)
    return 0


def sparkline(values: Sequence[float | None]) -> str:
    """One character per value, ``▁`` (lowest shown) to ``█`` (highest); a space if undefined."""
    known = [v for v in values if v is not None]
    if not known:
        return " " * len(values)
    lo, hi = min(known), max(known)
    top = len(SPARKS) - 1
    return "".join(
        " " if v is None else SPARKS[round((v - lo) / (hi - lo) * top) if hi > lo else top // 2]
        for v in values
    )


def cmd_history(args: argparse.Namespace) -> int:
    from judge.report.history import list_runs, regressions, source_key

    config = load_config(args.config)
    path = Path(args.history) if args.history else config.history_path()
    source = None if args.all else source_key(args.config)
    runs = list_runs(path, args.limit, source=source)
    if not runs:
        print(f"{path}: no runs recorded" + (f" for {source}" if source else ""))
        return 0
    print(f"{path}: last {len(runs)} run(s), oldest first")
    head = ["run", "created", "queries", "verdicts", "unparsed", "error", "config / dataset"]
    rows = [
        [*map(str, (r.run_id, r.created, r.queries, r.verdicts, r.unparsed, r.error)), where]
        for r in runs
        for where in [" / ".join(x for x in (r.config_source, r.dataset) if x)]
    ]
    print(columns(head, rows, "><>>>><"))
    flags = regressions(runs, config.thresholds.max_drop)
    names = args.metric or list(
        dict.fromkeys(m for r in runs for v in r.metrics.values() for m in v)
    )
    rows = []
    for engine in sorted({e for r in runs for e in r.metrics}):
        for metric in names:
            values = [r.metrics.get(engine, {}).get(metric) for r in runs]
            known = [v for v in values if v is not None]
            if known:
                bad = [
                    f"run {g.run_id} -{g.drop:.4f}"
                    for g in flags
                    if (g.engine, g.metric) == (engine, metric)
                ]
                rows.append([engine, metric, sparkline(values), _num(known[0]), _num(known[-1])])
                rows[-1].append("REGRESSION " + ", ".join(bad) if bad else "")
    print("\ntrend, oldest to newest:")
    print(columns(["engine", "metric", "trend", "first", "last", "flags"], rows, "<<<>><"))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``compare``, ``report`` and ``history`` on the ``judge`` parser."""
    c = sub.add_parser(
        "compare", help="engines side by side: paired differences, CIs, p-values, pooled NDCG"
    )
    c.add_argument(
        "sources",
        nargs="+",
        metavar="RUN_DIR_OR_VERDICTS",
        help="run directory or results JSONL; NAME=PATH names an engine",
    )
    c.add_argument(
        "--metric",
        action="append",
        help="metric (repeatable), e.g. ndcg@5, pooled_ndcg@5, pooled_recall@5",
    )
    c.add_argument(
        "--baseline", help="engine the others are compared with (default: first by name)"
    )
    c.add_argument("--n-boot", type=int, default=10_000, help="bootstrap resamples for the CIs")
    c.add_argument("--permutations", type=int, default=10_000, help="sign-flip permutations for p")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--json", metavar="OUT", help="also write the comparison as JSON")
    c.add_argument("--config", help="config giving the scale, metric names and gain")
    c.add_argument(
        "--trec-run", help="add a TREC run as an engine, judged from the pooled verdicts"
    )
    c.add_argument("--passage-store", help="passage store JSONL for --trec-run")
    c.add_argument("--queries", help="query texts (TSV or JSONL) for --trec-run")
    c.add_argument("--trec-engine", help="engine name for --trec-run (default: its run tag)")
    c.set_defaults(func=cmd_compare)

    r = sub.add_parser("report", help="rewrite report.md and report.html for a run directory")
    r.add_argument("run_dir")
    r.add_argument("--config", help="config (history file, max_drop, and the summary if rebuilt)")
    r.add_argument("--history", help="history file (default: the config's run.history)")
    r.add_argument("--last", type=int, default=10, help="runs of history shown")
    r.add_argument("--worst", type=int, default=5, help="lowest-scoring queries shown")
    r.add_argument("--rebuild", action="store_true", help="recompute summary.json from the results")
    r.set_defaults(func=cmd_report)

    h = sub.add_parser(
        "history", help="past runs and the trend of each metric, regressions flagged"
    )
    h.add_argument("--config", help="config (history file, max_drop); shows only its runs")
    h.add_argument("--history", help="history file (default: the config's run.history)")
    h.add_argument("--limit", type=int, default=20, help="runs shown (0 = all)")
    h.add_argument("--metric", action="append", help="metric to show (repeatable; default all)")
    h.add_argument("--all", action="store_true", help="runs of every config, not just --config's")
    h.set_defaults(func=cmd_history)
