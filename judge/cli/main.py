"""The ``judge`` command. A JudgeError prints as one line and exits with its code (2 for bad
input or config, 3 for an incomplete run); a breached threshold exits 1.

Exit codes of ``judge run``: 0 ok; 1 a threshold breached; 2 bad config or input;
3 run incomplete (too many errors, provider unavailable, interrupted) — rerun to resume;
4 budget reached — rerun with a larger budget to resume.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import io
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from judge.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_BUDGET,
    EXIT_CODES,
    EXIT_INCOMPLETE,
    EXIT_OK,
    EXIT_THRESHOLD,
    judged_input,
    overrides,
    print_dry_run,
    seed_arg,
)
from judge.errors import ConfigError, JudgeError, WriteError
from judge.schema import MetricPolicy, printable
from judge.version import __version__

if TYPE_CHECKING:
    from judge.config import RunConfig
    from judge.judging.judge import Judge
    from judge.report.summary import EngineSummary, Summary
    from judge.run.runner import RunOutcome
    from judge.schema import JudgedQuery, Query

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _written(out_dir: Path) -> Iterator[None]:
    """A file that cannot be written once judging began (a full disk, say) as a WriteError:
    the run is incomplete, not bad input (exit 3), and the same command resumes it."""
    try:
        yield
    except OSError as exc:
        where = exc.filename or out_dir
        raise WriteError(
            f"{where}: cannot write: {exc.strerror or exc}; what was judged is kept (results "
            "and cache): fix that and rerun the same command to resume"
        ) from None


def _write_junit(path: str, summary: Summary) -> None:
    """The JUnit file, after a paid run: a failure to write it is incomplete, not bad input."""
    from judge.report.junit import write_junit

    with _written(Path(path).parent):
        write_junit(path, summary)


def cmd_run(args: argparse.Namespace) -> int:
    """Judge, then :func:`judge.report.finish.finish_run`; print the outcome, pick the exit code."""
    from judge.cli.ray import on_ray, ray_overrides
    from judge.config import load_config
    from judge.providers import planning_only
    from judge.report.checks import report_problems
    from judge.run.batch import check_batch, run_batched
    from judge.run.estimate import estimate
    from judge.run.preflight import preflight
    from judge.run.queries import load_queries, sample_queries
    from judge.run.resume import resume_problem
    from judge.run.runner import run_async, signals_held

    batch = {"run.batch": ("--batch", True)} if args.batch else {}
    config = load_config(args.config, overrides(args, batch | ray_overrides(args)))
    if args.shards is not None and config.run.ray is None:
        raise ConfigError("--shards shards a run on Ray: give --ray too (or [run] ray)")
    queries = sample_queries(load_queries(config, args.dataset), config.run.sample, config.run.seed)
    # The dataset's records (and, below, the run's rows) live until the summary is written: the
    # cyclic collector need not walk them again and again (reference counting still frees
    # them). At 100,000 passages that walking was ~0.25 s of a cached re-run.
    gc.freeze()
    out_dir = _out_dir(args.out, config.run.out)
    # A dry run sends nothing, so it needs no API key; every other check is the same.
    with planning_only() if args.dry_run else contextlib.nullcontext():
        preflight(config, queries, out_dir, first_night=args.first_night, later=report_problems)
        if args.junit:
            _check_writable_parent(Path(args.junit), "--junit")
        _mlflow(args, None)
        if config.run.batch:
            check_batch(config)
    redo = frozenset(args.redo or ())
    if args.dry_run:  # refused as the run itself would refuse it
        if (problem := resume_problem(out_dir, config, fresh=args.fresh)) is not None:
            raise ConfigError(problem)
        return print_dry_run(estimate(config, queries, out_dir, fresh=args.fresh, redo=redo))
    run = on_ray(config, run_batched if config.run.batch else run_async)
    # A plain run hands its rows over to the summary (the other ways leave ``kept`` empty).
    kept: list[JudgedQuery] = []
    more = {"keep": kept} if run is run_async else {}
    preload = threading.Thread(target=_import_report_stage, name="judge-import", daemon=True)
    preload.start()
    # A plain run takes signals from its start; a batch or Ray run keeps asyncio.run's Ctrl-C.
    with signals_held(run is run_async) as unheard, _written(out_dir):
        outcome = asyncio.run(run(config, queries, out_dir, fresh=args.fresh, redo=redo, **more))
    if unheard:  # a signal no run handler took up: the run is not to be trusted as finished
        raise KeyboardInterrupt
    plan = {(q.query_id, q.engine, r) for q in queries for r in range(config.run.repeats)}
    del queries  # the summary reads the results; a large dataset need not stay in memory
    preload.join()
    from judge.report.finish import finish_run

    gc.freeze()
    with _written(out_dir):
        summary = finish_run(config, out_dir, outcome, kept, plan)
    _print_outcome(outcome, summary, out_dir)
    if args.junit:
        _write_junit(args.junit, summary)
    _mlflow(args, out_dir)
    return _exit_code(outcome, summary)


def _out_dir(given: str | None, configured: str) -> Path:
    """The run directory: ``--out``, else ``[run] out``; an empty ``--out`` (an unset
    ``$OUTDIR``) is refused, not taken as runs/latest."""
    if given is not None and not given.strip():
        raise ConfigError("--out is empty: name the run directory")
    return Path(given or configured)


def _import_report_stage() -> None:
    """The report stage's modules (the summary's analyses, the renderers), imported while the
    run waits for its first answers rather than after it: ~0.05 s of a 200 ms run's wall time.
    The run's own modules are all imported before this starts, and judge's imports form no
    cycle, so the two threads never wait on each other's module locks. A failure here is
    left for the import after the run to raise as usual."""
    with contextlib.suppress(Exception):
        from judge.report import finish  # noqa: F401


def _exit_code(outcome: RunOutcome, summary: Summary) -> int:
    """The exit code of a finished ``judge run``, its reason said on stderr."""
    from judge.report.status import describe_check

    if outcome.stopped_by == "budget":
        print(f"judge: {outcome.reason}", file=sys.stderr)
        return EXIT_BUDGET
    if outcome.stopped_by == "template":  # bad input, found on the data; rerun to resume
        print(f"judge: {outcome.reason}; fix it and rerun to resume", file=sys.stderr)
        return EXIT_BAD_INPUT
    if outcome.status != "complete":
        reason = outcome.reason or "stopped"
        again = "" if "rerun" in reason else "; rerun to resume"  # said once, not twice
        print(f"judge: run incomplete: {reason}{again}", file=sys.stderr)
        return EXIT_INCOMPLETE
    for b in summary.thresholds.breaches:
        said = "breached" if b.evaluated else "not evaluated, counted as breached"
        print(f"judge: threshold {said}: {describe_check(b)}", file=sys.stderr)
    for c in summary.thresholds.checks:  # not made, but no breach: a baseline without it
        if c.ok and not c.evaluated:
            print(f"judge: threshold not evaluated: {describe_check(c)}", file=sys.stderr)
    return EXIT_THRESHOLD if summary.thresholds.breached else EXIT_OK


def _mlflow(args: argparse.Namespace, out_dir: Path | None) -> None:
    """``--mlflow``: MLflow and its tracking store checked before anything is paid (no
    ``out_dir`` yet), then the finished run in ``out_dir`` logged (report/mlflow_run.py)."""
    if not args.mlflow:
        return
    from judge.report.mlflow_run import check_mlflow, log_to_mlflow

    if out_dir is None:
        check_mlflow()
    else:
        log_to_mlflow(out_dir)


def _judged_line(outcome: RunOutcome, summary: Summary, out_dir: Path) -> str:
    """The console's first line of a run: what was judged, how, and at how many calls."""
    c = summary.counts
    # Passages a stopping run never sent are not judged: "judged 192 of 480 passages".
    judged = f"{c.verdicts - c.not_sent} of {c.verdicts}" if c.not_sent else f"{c.verdicts}"
    return (
        f"judged {judged} passages of {c.queries} ranked lists ({c.query_ids} queries) x "
        f"{c.repeats} repeat(s): {c.ok} ok, {c.unparsed} unparsed, {c.failed_words()}; "
        f"{outcome.requests} calls, {outcome.cache_hits} cache hits -> {out_dir}"
    )


def _means(data: EngineSummary, primary: str | None) -> str:
    """An engine's means on the console: the verdict's metric first, six in all; a mean over
    fewer of the engine's queries says over how many (the report's table does)."""
    names = sorted(data.metrics, key=lambda n: n != primary)[:6]
    return ", ".join(
        f"{name} —"
        if (m := data.metrics[name]).mean is None
        else f"{name} {m.mean:.4f}"
        + (f" ({m.n_defined} of {data.n_queries} queries)" if m.n_defined < data.n_queries else "")
        for name in names
    )


def _print_outcome(outcome: RunOutcome, summary: Summary, out_dir: Path) -> None:
    from judge.metrics.facts import primary_metric

    c = summary.counts
    if outcome.resumed:
        print(
            f"resumed: {outcome.resumed} of {outcome.planned} query-repeats were already in "
            f"{out_dir} (--fresh starts over)"
        )
    print(_judged_line(outcome, summary, out_dir))
    for line in summary.verdict:  # first: which engine is better, and how far to trust it
        print(line)
    # A stopped run's means are of the part judged: said on their lines, not only below.
    part = (
        ""
        if outcome.status == "complete"
        else " (no passage was judged before it stopped)"
        if not c.ok
        else " (every query-repeat ran; those with failed verdicts are asked again on a rerun)"
        if outcome.done >= outcome.planned
        else f" (of the {outcome.done} of {outcome.planned} query-repeats that ran before it "
        "stopped)"
    )
    primary = primary_metric(summary.metric_names, summary.policy.primary)
    for engine, data in summary.engines.items():
        print(f"  {engine}: {_means(data, primary)}{part}")
    if outcome.asked_alone:
        print(
            f"listwise: {outcome.asked_alone} passage(s) were asked one by one, a request "
            "each: their list's answers did not judge them (a judge that answers lists "
            "poorly costs that much more; pointwise mode asks so from the start)"
        )
    if c.blank:
        print(f"empty: {c.blank_words()}")
    if c.truncated:
        print(f"truncated: {c.truncated_words()}")
    if summary.cascade is not None:
        print(summary.cascade.line())
    if c.sanitised:
        print(
            f"sanitised: {c.sanitised} passage(s) carried text aimed at the judge, taken out "
            'before judging ("removed" in verdicts.jsonl)'
        )
    for line in c.flag_lines():
        print(f"flagged: {line}")
    health = summary.health
    if health.degenerate:  # DESIGN rule 10: said where nobody can miss it
        print(
            "judge: WARNING: JUDGE UNRELIABLE, these metrics are not informative:",
            file=sys.stderr,
        )
        for problem in health.problems:
            print(f"judge:   {problem}", file=sys.stderr)
    for line in health.findings + health.caveats + health.notes:  # summary.json's own words
        print(f"judge health: {line}")
    _step_summary(summary)


def _check_writable_parent(path: Path, what: str) -> None:
    """ConfigError (exit 2, before anything is paid) when ``path``'s folder cannot be written."""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if path.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
        raise ConfigError(f"{what} {path}: cannot write there")


def _step_summary(summary: Summary) -> None:
    """The verdict and each engine's means, appended to ``$GITHUB_STEP_SUMMARY`` when a GitHub
    Actions step sets it (the job's summary page shows it as Markdown)."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return
    from judge.report.blocks import md_text  # names and sentences made of the user's text

    outcome = summary.outcome.status if summary.outcome else "judge run"
    reasons = summary.outcome.reasons if summary.outcome else ()
    names = list(summary.metric_names)
    lines = [f"### {outcome} · judge", "", *(f"- **{md_text(r)}**" for r in reasons)]
    lines += [*(f"- {md_text(v)}" for v in summary.verdict), ""]
    head = " | ".join(md_text(n) for n in names)
    lines += [f"| engine | {head} |", "|---" * (len(names) + 1) + "|"]
    for engine, data in summary.engines.items():
        means = [data.mean(n) for n in names]
        lines.append(
            f"| {md_text(engine)} | "
            + " | ".join("—" if m is None else f"{m:.4f}" for m in means)
            + " |"
        )
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n\n")
    except OSError as exc:
        print(f"judge: cannot write GITHUB_STEP_SUMMARY {path}: {exc.strerror}", file=sys.stderr)


def _passage_limit(args: argparse.Namespace, config: RunConfig | None) -> int:
    """The characters a passage is cut to: a config's [dataset] max_passage_chars, as in judge
    run (--max-passage-chars beside a config is refused: it had been ignored), else the
    flag's, 8000 by default."""
    if config is None:
        return 8000 if args.max_passage_chars is None else int(args.max_passage_chars)
    if args.max_passage_chars is not None:
        raise ConfigError(
            f"{config.source}: --max-passage-chars is for a dataset validated without a "
            "config; with one, [dataset] max_passage_chars decides, as in judge run (--set "
            "dataset.max_passage_chars=N)"
        )
    return config.dataset.max_passage_chars


def cmd_validate(args: argparse.Namespace) -> int:
    """``judge validate [CONFIG] DATASET``: the dataset's counts and problems; with a config,
    every check ``judge run`` makes before its first call, and nothing is sent."""
    from judge.config import load_config
    from judge.data.datasets import validate
    from judge.data.lines import capped
    from judge.report.checks import report_problems
    from judge.run.preflight import preflight
    from judge.run.queries import load_queries

    config_path, dataset = _validate_paths(args.paths)
    config = load_config(config_path, overrides(args)) if config_path else None
    ds = config.dataset if config else None
    if config is not None and dataset is None and config.dataset.trec_run:
        return _validate_trec(args, config)
    dataset = dataset or (ds.path if ds else None)
    if dataset is None:
        raise ConfigError(f"{config_path}: no dataset: give one or set [dataset] path")
    try:
        result = validate(
            dataset,
            columns=(ds.columns or None) if ds else None,
            max_passage_chars=_passage_limit(args, config),
        )
    except ConfigError as exc:  # [dataset] columns or max_passage_chars: the config's
        raise ConfigError(f"{config_path}: dataset.{exc}" if ds else str(exc)) from None
    print(
        f"{result.path}: {result.n_queries} rows ({result.n_query_ids} query ids, "
        f"engines: {', '.join(result.engines) or '—'}), {result.n_passages} passages, "
        f"{result.n_labelled} rows with human labels, {result.n_truncated} truncated, "
        f"{result.n_empty} rows without passages"
    )
    for problem in capped(result.problems):
        print(f"note: {problem}")
    for error in capped(result.errors):
        print(f"error: {error}", file=sys.stderr)
    if result.errors:
        print(f"judge: {len(result.errors)} error(s) in {result.path}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if config is not None:
        out_dir = Path(args.out or config.run.out)
        queries = load_queries(config, dataset, said=True)  # its notes are printed above
        preflight(config, queries, out_dir, first_night=args.first_night, later=report_problems)
        _resumable(out_dir, config)
        print(f"{config_path}: ready to run; no problems found")
    return EXIT_OK


def _resumable(out_dir: Path, config: RunConfig) -> None:
    """ConfigError when ``judge run`` would refuse ``out_dir`` with ``config`` (made with
    another config, a batch that may still answer): validate said "ready to run" of it."""
    from judge.run.resume import resume_problem

    if (problem := resume_problem(out_dir, config)) is not None:
        raise ConfigError(problem)


def _validate_trec(args: argparse.Namespace, config: RunConfig) -> int:
    """``judge validate CONFIG`` of a config whose dataset is a TREC run (``[dataset]
    trec_run``, ``passage_store``, ``queries``): read as ``judge run`` reads it, then every
    check it makes before its first call."""
    from judge.report.checks import report_problems
    from judge.run.preflight import preflight
    from judge.run.queries import load_queries

    queries = load_queries(config, None)
    engines = sorted({q.engine for q in queries})
    print(
        f"{config.dataset.trec_run}: {len(queries)} rows "
        f"({len({q.query_id for q in queries})} query ids, engines: {', '.join(engines) or '—'}), "
        f"{sum(len(q.passages) for q in queries)} passages"
    )
    out_dir = Path(args.out or config.run.out)
    preflight(config, queries, out_dir, first_night=args.first_night, later=report_problems)
    _resumable(out_dir, config)
    print(f"{config.source}: ready to run; no problems found")
    return EXIT_OK


def _validate_paths(paths: Sequence[str]) -> tuple[str | None, str | None]:
    """(config, dataset) from ``validate``'s one or two paths; a lone .toml is a config."""
    if len(paths) == 2:
        return paths[0], paths[1]
    if len(paths) == 1:
        return (paths[0], None) if paths[0].endswith(".toml") else (None, paths[0])
    raise ConfigError("judge validate takes DATASET, CONFIG, or CONFIG DATASET")


def cmd_metrics(args: argparse.Namespace) -> int:
    from judge.data.results import latest_rows, read_results
    from judge.metrics.compute import metrics_for_queries

    no_results = ConfigError(f"{args.results}: no results")
    # One row per (query, engine, repeat), the last written, as a run reads its results: a
    # line written twice (two files concatenated, a resumed unit) counted its query twice.
    read = lambda: latest_rows(read_results(args.results))  # noqa: E731
    config, results, scale = judged_input(args, read, no_results)
    policy = config.metrics if config else _run_policy(Path(args.results)) or MetricPolicy()
    names = args.metric or (list(policy.names) if config else list(results[0].metrics))
    pairs = [(jq.query, jq.verdicts) for jq in results]
    reranked = [jq.rerank_scores for jq in results]
    rows = metrics_for_queries(names, pairs, scale, policy, reranked)
    by_engine: dict[str, list[dict[str, float | None]]] = {}
    for jq, row in zip(results, rows, strict=True):
        by_engine.setdefault(jq.query.engine, []).append(row)
    print("engine\tn\t" + "\t".join(names))
    for engine, engine_rows in sorted(by_engine.items()):
        cells = []
        for name in names:
            values = [v for r in engine_rows if (v := r.get(name)) is not None]
            cells.append(f"{sum(values) / len(values):.4f}" if values else "—")
        print(f"{engine}\t{len(engine_rows)}\t" + "\t".join(cells))
    return EXIT_OK


def _run_policy(results: Path) -> MetricPolicy | None:
    """The metric policy of the run whose results file ``results`` is (its summary.json beside
    it: undefined AP as 0, grade cuts, ...), so the metrics made again are the run's; None
    when there is no readable summary there."""
    from judge.report.summary import SUMMARY_FILE, load_summary

    path = results.parent / SUMMARY_FILE
    if not path.is_file():
        return None
    try:
        return load_summary(path).policy
    except JudgeError:
        return None


def cmd_render(args: argparse.Namespace) -> int:
    from judge.config import load_config
    from judge.judging.judge import Judge
    from judge.providers import planning_only
    from judge.run.queries import load_queries

    config = load_config(args.config, overrides(args))
    queries = load_queries(config, args.dataset)
    if not 0 <= args.query < len(queries):
        raise ConfigError(f"--query {args.query}: the dataset has queries 0..{len(queries) - 1}")
    query = queries[args.query]
    with planning_only():  # nothing is sent: no API key needed to see the prompts
        judge = Judge.from_config(config)
    if judge.caller.chat is None:  # a judge by score: what its reranker reads
        return _render_scored(judge, query, args.query)
    requests = judge.first_requests(query)
    shown = requests if args.all else requests[:1]
    print(f"# query {args.query}: {query.query_id} / {query.engine} — {len(requests)} request(s)")
    blank = [p.id for p in judge.fit(query).passages if p.blank]
    if blank:
        print(f"(empty, never sent, judged not relevant: passage(s) {', '.join(blank)})")
    for i, request in enumerate(shown):
        print(
            f"\n## request {i + 1}: model={request.model} "
            f"params={request.params.model_dump(exclude_defaults=True)}"
        )
        for m in request.messages:
            print(f"\n--- {m.role} ---\n{m.content}")
    if len(requests) > len(shown):
        each = (
            f"one per window of up to {judge.asker.list_size} passages"
            if judge.mode == "listwise"
            else "one per passage"
        )
        print(
            f"\n({len(requests) - len(shown)} more request(s) like this, {each}; --all shows them)"
        )
    return EXIT_OK


def _render_scored(judge: Judge, query: Query, index: int) -> int:
    """``judge render`` for a judge by score: the one rerank request, documents as scored."""
    from judge.judging.cascade import rerank_request, scored_documents, scored_passages
    from judge.judging.echo import RESTATED_WEIGHT

    assert judge.rerank_model is not None
    fitted = judge.fit(query)
    documents = scored_documents(fitted)
    request = rerank_request(judge.rerank_model, fitted, documents)
    floor = judge.cascade.section.echo_floor if judge.cascade is not None else None
    echo = (
        "; a passage scored at or above the cut is scored again with the query's words masked "
        f"(the echo check, floor {floor})"
        if floor
        else ""
    )
    print(
        f"# query {index}: {query.query_id} / {query.engine} — a judge by score: 1 rerank "
        f"request to {judge.settings.provider} (no LLM){echo}"
    )
    print(f"\n--- query ---\n{request.query}")
    read = scored_passages(fitted)  # a blank passage is scored 0 without being sent
    for passage, (text, _) in zip(read, documents, strict=True):
        print(f"\n--- document {passage.id} ---\n{text}")
    for passage, (_, bare) in zip(read, documents, strict=True):
        if bare is not None:
            print(
                f"\n--- document {passage.id} without its restatement of the query (the two "
                f"scores weighed {RESTATED_WEIGHT}:{1 - RESTATED_WEIGHT}) ---\n{bare}"
            )
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """The ``judge`` argument parser.

    Long because it is one flat list of argparse declarations, read top to bottom like the
    command's help; splitting it per command would scatter the CLI's shape.
    """
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

    r = sub.add_parser(
        "run",
        help="judge a dataset and write verdicts, summary, report and qrels",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("config", help="TOML run config (see configs/)")
    r.add_argument(
        "dataset", nargs="?", help="dataset JSONL (default: the config's [dataset] path)"
    )
    r.add_argument("--out", help="run directory (default: the config's run.out)")
    r.add_argument("--repeats", type=int)
    r.add_argument("--sample", type=int, help="judge a reproducible sample of N query ids")
    r.add_argument("--seed", type=seed_arg)
    r.add_argument("--concurrency", type=int)
    r.add_argument("--max-cost", type=float, help="stop cleanly at this spend (USD); rerun resumes")
    r.add_argument("--max-tokens", type=int, help="stop cleanly at this many tokens; rerun resumes")
    r.add_argument("--cache", help="cache file (default: ~/.cache/judge/cache.sqlite)")
    r.add_argument(
        "--dry-run", action="store_true", help="estimate calls, tokens and cost; call nothing"
    )
    r.add_argument(
        "--batch",
        action="store_true",
        help="first ask through the provider's Batch API at its batch price (results within "
        "24 h; [run] batch = true); a rerun collects a recorded batch, never resubmits it",
    )
    r.add_argument(
        "--fresh", action="store_true", help="discard the run directory's earlier results"
    )
    r.add_argument(
        "--redo",
        action="append",
        choices=["unparsed", "error"],
        help="ask units with these verdicts again (error units always are); repeatable",
    )
    r.add_argument(
        "--no-charts",
        action="store_false",
        default=None,
        help="leave the charts out of report.html (much faster for large runs)",
    )
    r.add_argument(
        "--junit",
        metavar="PATH",
        help="also write the run as JUnit XML: run complete, each threshold check, each engine "
        "verdict (for CI test reports)",
    )
    r.add_argument(
        "--first-night",
        action="store_true",
        help="no baseline summary yet: skip the drop checks instead of refusing to run",
    )
    r.add_argument(
        "--mlflow",
        action="store_true",
        help="also log the run to MLflow (pip install 'judge[mlflow]'): params, metrics with "
        "CIs, outcome, reports; MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME say where",
    )
    common(r)
    r.set_defaults(func=cmd_run)

    v = sub.add_parser(
        "validate",
        help="check a dataset (and, with a config, everything judge run checks before paying)",
    )
    v.add_argument("paths", nargs="+", metavar="[CONFIG] DATASET")
    v.add_argument(
        "--max-passage-chars",
        type=int,
        help="without a config: cut passages to this many characters (default 8000); with one, "
        "[dataset] max_passage_chars decides, as in judge run",
    )
    v.add_argument("--out", help="run directory to check (default: the config's run.out)")
    v.add_argument(
        "--first-night", action="store_true", help="no baseline yet: skip the drop checks"
    )
    common(v)
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

    from judge.cli.admin import add_commands as add_admin
    from judge.cli.baseline import add_commands as add_baseline
    from judge.cli.batch import add_commands as add_batch
    from judge.cli.calibrate import add_commands as add_calibrate
    from judge.cli.explain import add_commands as add_explain
    from judge.cli.ray import add_arguments as add_ray
    from judge.cli.reports import add_commands

    add_ray(r)
    add_admin(sub, common)
    add_batch(sub)
    add_calibrate(sub)
    add_baseline(sub)
    add_explain(sub)

    add_commands(sub)
    return p


class _Printable(io.TextIOBase):
    """A text stream that shows control characters as symbols (``printable``) before they
    reach the terminal: commands print passages, queries, engine names and a model's reasons,
    and an ESC sequence in one would drive the terminal (clear it, retitle it, hide lines)."""

    def __init__(self, inner: TextIO, *, returns: bool = False) -> None:
        self.inner = inner
        self.returns = returns  # carriage returns kept: stderr's progress line rewrites itself

    def write(self, text: str) -> int:
        try:
            if self.returns and "\r" in text:
                self.inner.write("\r".join(printable(part) for part in text.split("\r")))
            else:
                self.inner.write(printable(text))
        except BrokenPipeError:
            self._reader_left()
        return len(text)

    def flush(self) -> None:
        try:
            self.inner.flush()
        except BrokenPipeError:
            self._reader_left()

    def _reader_left(self) -> None:
        """The reader left (``judge validate ... | head``): the rest goes to the null device,
        and the command goes on to its own exit code (a pipe's end is not a command's)."""
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.inner.fileno())
            os.close(devnull)

    def isatty(self) -> bool:
        return self.inner.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.inner.encoding  # what a library asking the stream's encoding expects

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return self.inner.errors

    def fileno(self) -> int:
        return self.inner.fileno()


class _OneLine(logging.Formatter):
    """``judge: message``, a line per record: a library's traceback is left out (bad input or
    a broken environment is one line; ``--verbose`` keeps tracebacks)."""

    def __init__(self) -> None:
        super().__init__("judge: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record.message = printable(record.getMessage())
        return self.formatMessage(record)


def main(argv: Sequence[str] | None = None) -> int:
    # A run holds hundreds of thousands of small records for its whole life, and the cyclic
    # collector's default (a pass every 700 allocations, a full one every 100 passes) walks
    # them again and again: a third of a large cached re-run. Cycles are rare here.
    gc.set_threshold(50_000, 20, 100)
    try:
        parser = build_parser()  # the commands' modules load: Ctrl-C here sent nothing
    except KeyboardInterrupt:
        print("judge: interrupted", file=sys.stderr)
        return EXIT_INCOMPLETE
    args = parser.parse_args(argv)
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Printable(stdout), _Printable(stderr, returns=True)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("judge: %(message)s") if args.verbose else _OneLine())
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, handlers=[handler])
    for noisy in ("httpx", "httpx2", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # MLflow's HTTP client warns of each retry: the one line judge says is the failure's.
    logging.getLogger("urllib3").setLevel(logging.DEBUG if args.verbose else logging.ERROR)
    # The dashscope SDK logs each failed request with its traceback, then raises it to us:
    # the retry layer decides and reports it (--verbose shows the SDK's own lines).
    logging.getLogger("dashscope").setLevel(logging.DEBUG if args.verbose else logging.CRITICAL)
    # SIGTERM and SIGHUP end a command as Ctrl-C does (one line, exit 3), not silently with
    # 143; a run takes all three over while it judges (run/runner.py).
    terminate = _as_interrupt()
    try:
        code: int = args.func(args)
    except JudgeError as exc:
        print(f"judge: {printable(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        # Only a run resumes (its results and ledger are kept as it goes); other commands
        # start again, from what the cache already holds.
        again = "resume" if args.command == "run" else "do it again"
        print(f"judge: interrupted; rerun the same command to {again}", file=sys.stderr)
        return EXIT_INCOMPLETE
    except BrokenPipeError:  # `judge history | head`: the reader left; nothing more to say
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 -- so exit's flush is quiet
        return EXIT_OK
    except OSError as exc:  # an output path the commands write (a report, --json, --html)
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"judge: {where}cannot write or read: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        for sig, previous in terminate.items():
            signal.signal(sig, previous)
        if isinstance(sys.stdout, _Printable):  # a broken pipe left devnull in its place
            sys.stdout = stdout
        sys.stderr = stderr
    return code


def _as_interrupt() -> dict[signal.Signals, Any]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt, as SIGINT does (the main thread only);
    the handlers they replace, to restore."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    return {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}


if __name__ == "__main__":
    sys.exit(main())
