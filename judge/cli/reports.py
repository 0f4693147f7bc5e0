"""``judge compare``, ``judge report`` and ``judge history``: commands over finished runs.

None of them calls a judge. ``compare`` reads one results file whose rows carry several
engines, or several run directories / results files each taken as an engine or run
(``NAME=PATH`` names one); the first argument is the baseline unless ``--baseline`` names
another. Runs that hold several engines are compared engine by engine (``new/bm25`` with
``old/bm25``). A run directory's summary.json gives the defaults (metrics, policy, bootstrap
resamples and seed), so ``judge compare RUN`` prints the numbers that run's report shows.
``--html`` writes the comparison as an offline page with charts; ``--fail-if-worse METRIC``
exits 1 when an engine or run is significantly worse (lower, sign-flip p < 0.05) than its
baseline on METRIC. It can also add a TREC run as an engine whose passages take the verdicts
the other engines' runs already hold for the same passage (same id or normalised text, same
repeat): TREC-style pooled evaluation at no cost. A passage no judged engine returned stays
unjudged (an ``error`` verdict saying so), so its query's metrics are undefined, never 0.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from judge.analysis.compare import (
    DEFAULT_POOLED,
    N_BOOT,
    N_PERMUTATIONS,
    Comparison,
    asked_by,
    check_metric,
    compare,
)
from judge.analysis.judged_pool import borrow_verdicts, id_scope, parse_pooled
from judge.cli.common import (
    EXIT_OK,
    EXIT_THRESHOLD,
    at_least_one,
    each_once,
    judged_input,
    outputs_spare_inputs,
    seed_arg,
    whole_number,
)
from judge.config import RunConfig, load_config
from judge.data.results import load_engines, load_results, source_labels, split_source
from judge.errors import ConfigError, InputError, RunUnfinished
from judge.metrics.compute import normalise_text
from judge.metrics.facts import parse_metric_name
from judge.schema import JudgedQuery, MetricPolicy, Query

if TYPE_CHECKING:
    from judge.report.compared import Nights
    from judge.report.summary import Summary

log = logging.getLogger(__name__)
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
    """A plain-text table: per metric, each engine's unpaired mean and CI, and its paired
    difference with its baseline."""
    from judge.report.compared import ci_text, p_text, wtl

    head = ["metric", "engine", "n", "mean", "95% CI", "vs", "pairs", "diff", "95% CI", "p"]
    head.append("better/tie/worse")
    rows: list[list[str]] = []
    diffs = {(d.metric, d.engine): d for d in cmp.diffs}
    for metric in cmp.metrics:
        for engine in cmp.engines:
            m, d = cmp.means[metric][engine], diffs.get((metric, engine))
            mean = [metric, engine, str(m.n), _num(m.mean), ci_text(m.ci_low, m.ci_high)]
            if d is None:
                rows.append([*mean, "(baseline)" if engine in cmp.baselines.values() else "(none)"])
                rows[-1] += [""] * (len(head) - len(rows[-1]))
                continue
            ci = ci_text(d.ci_low, d.ci_high, signed=True)
            rows.append([*mean, d.baseline, str(d.n), _num(d.diff, True), ci, p_text(d), wtl(d)])
    out = [columns(head, rows, "<<>>><>>><>")]
    out.append(
        f"\n{cmp.n_query_ids} query ids. n, mean, 95% CI: unpaired, each engine over the query "
        "ids it defines. pairs, diff, 95% CI, p, better/tie/worse: paired, over the query ids "
        f"both the engine and its baseline (vs) define. CIs: bootstrap ({cmp.n_boot} "
        f"resamples, seed {cmp.seed}); p: two-sided sign-flip test ({cmp.n_permutations} "
        "permutations; '~' sampled, else exact); with fewer than 6 differing pairs no p can "
        "be below 0.05, and the p says so."
    )
    return "\n".join(out)


def _labels(sources: Sequence[str]) -> list[str]:
    """Each source's name as :func:`judge.data.results.load_engines` gives it to its engines."""
    split = [split_source(s) for s in sources]
    by_path = source_labels([path for _, path in split])
    return [name or label for (name, _), label in zip(split, by_path, strict=True)]


def read_source(path: Path) -> list[JudgedQuery]:
    """A run directory's or results file's rows, or a summary.json's per-query rows (each
    metric's mean over repeats, as stored: compare reads stored values as they are)."""
    from judge.report.summary import load_summary

    if not (path.is_file() and path.suffix == ".json"):
        return load_results(path)
    summary = load_summary(path)
    if not summary.queries:
        raise InputError("this summary holds no per-query rows to compare", file=str(path))
    scale = summary.config.scale.name
    return [
        JudgedQuery(
            query=Query(query_id=row.query_id, query=row.query, engine=row.engine),
            repeat=0,
            scale=scale,
            verdicts=(),
            metrics=row.metrics,
        )
        for row in summary.queries
    ]


def plan(
    sources: Sequence[str], results: Sequence[JudgedQuery], baseline: str | None
) -> tuple[list[str], str, dict[str, str]]:
    """The engines in argument order, the baseline engine, and what each other engine is
    compared with. The baseline is ``baseline`` (an engine, or a run holding several) or the
    first argument's; a run of several engines is compared engine by engine, and an engine
    the baseline run has no engine of the same name for is compared with none (said)."""
    order = list(dict.fromkeys(jq.query.engine for jq in results))
    if len(sources) == 1:
        order = sorted(order)
    labels = _labels(sources) if len(sources) > 1 else []
    runs = {lab: [e for e in order if e.startswith(f"{lab}/")] for lab in labels}
    run = baseline if runs.get(baseline or "") else None
    if baseline is None and labels and runs[labels[0]]:
        run = labels[0]
    if run is None:
        base = baseline or order[0]
        return order, base, {e: base for e in order if e != base}
    own = {e.removeprefix(f"{run}/"): e for e in runs[run]}
    pairs = {}
    for engine in order:
        if engine not in runs[run]:
            inner = next((engine[len(lab) + 1 :] for lab in labels if engine in runs[lab]), engine)
            if inner in own:
                pairs[engine] = own[inner]
            else:
                print(
                    f"judge: {engine}: the baseline {run} has no engine '{inner}' "
                    f"(it has {', '.join(sorted(own))}): shown unpaired, compared with none",
                    file=sys.stderr,
                )
    return order, runs[run][0], pairs


def _summaries(sources: Sequence[str]) -> list[tuple[Path, Summary]]:
    """The summary.json of every source that is a finished run directory, beside its path."""
    from judge.report.summary import SUMMARY_FILE, load_summary

    found = []
    for source in sources:
        _, path = split_source(source)
        if (path / SUMMARY_FILE).is_file():
            found.append((path, load_summary(path / SUMMARY_FILE)))
        elif path.is_file() and path.suffix == ".json":
            found.append((path, load_summary(path)))
    return found


def _say_unlike_runs(
    sources: Sequence[str], runs: Sequence[Summary], metrics: Sequence[str]
) -> None:
    """Say what makes runs' numbers unlike beside their engines: a run that did not finish
    (its means are of a part), and runs judged by different judges (a difference may be the
    judges', not the engines')."""
    for run in runs:
        if run.run is not None and run.run.status != "complete":
            print(
                f"judge: {run.run.out_dir} is incomplete ({run.run.done} of {run.run.planned} "
                f"query-repeats ran: {run.run.reason}); its means are of the part judged",
                file=sys.stderr,
            )
    for run in runs[1:]:
        if unlike := runs[0].policy.unlike(run.policy, metrics):
            print(
                f"judge: the runs were scored under different [metrics] settings "
                f"({'; '.join(unlike)}, the first run's first): their numbers differ for the "
                "same rankings, so a difference may be the settings'",
                file=sys.stderr,
            )
            break
    judges = {(str(r.config.judge.get("provider")), str(r.config.judge.get("model"))) for r in runs}
    if len(judges) > 1:
        said = ", ".join(f"{p} {m}" for p, m in sorted(judges))
        print(
            f"judge: the runs were judged by different judges ({said}): a difference may be "
            "the judges', not the engines'",
            file=sys.stderr,
        )


def _say_other_questions(results: Sequence[JudgedQuery]) -> None:
    """Engines are paired by query id: say it when one id asks different questions in
    different engines or runs (a dataset's ids reused for other queries, or given by line
    number): such ids are left out of the pairs."""
    asked: dict[str, dict[str, str]] = {}
    for engine, questions in asked_by(results).items():
        for qid, said in questions.items():
            asked.setdefault(qid, {}).setdefault(said, engine)
    other = {qid: texts for qid, texts in asked.items() if len(texts) > 1}
    if other:
        qid, texts = next(iter(sorted(other.items())))
        (a, ea), (b, eb) = list(texts.items())[:2]
        print(
            f"judge: {len(other)} query id(s) ask different questions in different engines or "
            f"runs: '{qid}' is {a!r} in {ea} but {b!r} in {eb}; they are left out of the "
            "pairs of engines that ask them differently",
            file=sys.stderr,
        )


def _say_other_passages(results: Sequence[JudgedQuery], metrics: Sequence[str]) -> None:
    """Pooled metrics take one passage id as one passage, graded once by the majority of its
    verdicts (as qrels.txt is): say it when an id holds different texts in different engines
    or runs (a night's updated documents), whose pooled values then share one grade."""
    if not any(parse_pooled(m) is not None for m in metrics):
        return
    # A hash of each text as the pool normalises it (the pool's own sameness), not a copy.
    texts: dict[tuple[str, str, str], dict[int, str]] = {}
    for jq in results:
        scope = id_scope(jq.query)  # ids that are ranks name a passage in their list alone
        for p in jq.query.passages:
            said = hash(normalise_text(p.text))
            key = (jq.query.query_id, scope, p.id)
            texts.setdefault(key, {}).setdefault(said, jq.query.engine)
    other = [key for key, found in texts.items() if len(found) > 1]
    if other:
        (qid, _, pid), (ea, eb) = other[0], list(texts[other[0]].values())[:2]
        print(
            f"judge: {len(other)} passage id(s) hold different texts in different engines or "
            f"runs ('{pid}' of query '{qid}' in {ea} and {eb}): pooled metrics grade each id "
            "once, by the majority of its verdicts, so their pooled values share that grade",
            file=sys.stderr,
        )


def _check_worse(cmp: Comparison, metrics: Sequence[str]) -> int:
    """Exit 1 when an engine is significantly worse than its baseline on one of ``metrics``;
    say so when the pairs are too few for the test to ever say it."""
    from judge.report.compared import ci_text, p_said

    code = EXIT_OK
    for metric in dict.fromkeys(metrics):
        if not any(d.metric == metric for d in cmp.diffs):
            print(
                f"judge: --fail-if-worse {metric}: no engine was compared with another on it, "
                "so it cannot fail",
                file=sys.stderr,
            )
    for d in cmp.diffs:
        if d.metric not in metrics:
            continue
        if d.worse():
            code = EXIT_THRESHOLD
            print(
                f"judge: {d.engine} is significantly worse than {d.baseline} on {d.metric}: "
                f"{_num(d.diff, True)} {ci_text(d.ci_low, d.ci_high, signed=True)}, "
                f"{p_said(d)} over {d.n} paired queries",
                file=sys.stderr,
            )
        elif d.n == 0:
            why = f", {d.unlike} ids asking another question in each" if d.unlike else ""
            print(
                f"judge: {d.engine} vs {d.baseline} on {d.metric}: no query is paired (none "
                f"both define{why}), so --fail-if-worse cannot fail on them",
                file=sys.stderr,
            )
        elif d.too_few:
            differ = d.wins + d.losses
            why = (
                "no query differs"
                if not differ
                else f"{differ} of {d.n} pairs differ, too few for p < 0.05"
            )
            print(
                f"judge: {d.engine} vs {d.baseline} on {d.metric}: {why}, so --fail-if-worse "
                "cannot fail on them",
                file=sys.stderr,
            )
    return code


def _leader(args: argparse.Namespace, runs: Sequence[Summary]) -> str | None:
    """One run of three engines or more: the engine its own verdict compares the others with
    (the best on the primary metric), so compare leads as the run did; else None."""
    if len(args.sources) != 1 or len(runs) != 1:
        return None
    from judge.report.document import leading_engine

    return leading_engine(runs[0])


def cmd_compare(args: argparse.Namespace) -> int:
    from judge.data.datasets import read_trec_run

    if args.vs_baseline:
        args.sources = [f"baseline={_configured_baseline(args.config)}", *args.sources]
        args.baseline = args.baseline or "baseline"

    no_rows = InputError(f"no judged rows in {', '.join(args.sources)}")
    outputs_spare_inputs("compare", args.sources, {"--json": args.json, "--html": args.html})
    each_once("compare", args.sources)

    def read() -> list[JudgedQuery]:
        return load_engines(args.sources, read_source)

    config, results, scale = judged_input(args, read, no_rows)
    named = _summaries(args.sources)
    runs = [summary for _, summary in named]
    policy = _policy(config, runs)
    metrics = _held_by_summaries(args, _metrics(args, config, runs, results))
    _say_unlike_runs(args.sources, runs, metrics)
    if args.trec_run:
        if not (args.passage_store and args.queries):
            raise ConfigError("--trec-run needs --passage-store and --queries")
        report = read_trec_run(
            args.trec_run, args.passage_store, args.queries, engine=args.trec_engine
        )
        results = [*results, *borrow_verdicts(report.queries, results, metrics, scale, policy)]
    _say_other_questions(results)
    _say_other_passages(results, metrics)
    leader = None if args.baseline else _leader(args, runs)
    order, base, pairs = plan(args.sources, results, args.baseline or leader)
    first = runs[0].stability if runs else None
    cmp = compare(
        results,
        metrics,
        scale,
        baseline=base,
        engines=order,
        baselines=pairs,
        n_boot=args.n_boot or (first.n_boot if first else N_BOOT),
        n_permutations=args.permutations,
        seed=args.seed if args.seed is not None else (first.seed if first else 0),
        policy=policy,
        best_of=leader is not None,
    )
    for line in _said_first(cmp, policy, named, args.fail_if_worse or ()):
        print(line)
    print()
    print(format_table(cmp))
    if args.json:
        Path(args.json).write_text(cmp.model_dump_json(indent=2), encoding="utf-8")
    if args.html:
        from judge.report.compared import compare_page

        page = compare_page(cmp, args.sources, args.fail_if_worse or (), chosen=policy.primary)
        Path(args.html).write_text(page, encoding="utf-8")
        print(args.html)
    return _check_worse(cmp, args.fail_if_worse or ())


def _said_first(
    cmp: Comparison,
    policy: MetricPolicy,
    named: Sequence[tuple[Path, Summary]],
    fail_if_worse: Sequence[str],
) -> list[str]:
    """What compare prints first: what the exit code says (--fail-if-worse), then the
    verdicts, qualified as a run's own are when a judge of a run compared was found
    unreliable (they had been said plain)."""
    from judge.report.compared import headline_lines, worse_lines

    said = headline_lines(cmp, policy.primary)
    if unreliable := [str(path) for path, run in named if run.health.degenerate]:
        why = f"(by a judge found unreliable in {', '.join(unreliable)}: see its Trust line)"
        said = [f"{line} {why}" for line in said]
    return [*worse_lines(cmp, fail_if_worse), *said]


def _held_by_summaries(args: argparse.Namespace, metrics: list[str]) -> list[str]:
    """``metrics`` every summary.json source holds: its per-query means of the metrics it was
    made with. A pooled metric needs every source's verdicts, and one made with other metric
    names cannot be computed from means (its rows have no passages: a hit@5 of nothing would
    read 0). One asked for by name (``--metric``, ``--fail-if-worse``) is a ConfigError; one
    of the defaults is left out, said."""
    from judge.report.summary import load_summary

    held: dict[str, set[str]] = {}
    for source in args.sources:
        path = split_source(source)[1]
        if path.is_file() and path.suffix == ".json":
            names = load_summary(path).metric_names
            held[str(path)] = {m for m in names if not m.startswith("pooled_")}
    if not held:
        return metrics
    lacking = {m: [p for p, names in held.items() if m not in names] for m in metrics}
    asked = {*(args.metric or ()), *(args.fail_if_worse or ())}
    for metric, where in lacking.items():
        if not where:
            continue
        why = (
            "pooled metrics need every source's verdicts"
            if metric.startswith("pooled_")
            else f"{', '.join(where)} was made without it"
        )
        if metric in asked:
            raise ConfigError(
                f"{metric}: {why}; a summary.json holds only the per-query means it was made "
                "with (give its run directory instead)"
            )
        if not metric.startswith("pooled_"):
            print(f"judge: {metric}: {why}: left out of the comparison", file=sys.stderr)
    return [m for m in metrics if not lacking[m]]


def _configured_baseline(config_path: str | None) -> str:
    """The ``[thresholds] baseline`` summary a config names; ConfigError when there is none."""
    if not config_path:
        raise ConfigError("--vs-baseline needs --config (its [thresholds] baseline)")
    baseline = load_config(config_path).thresholds.baseline
    if not baseline:
        raise ConfigError(f"{config_path}: no [thresholds] baseline to compare with")
    if not Path(baseline).is_file():
        raise ConfigError(f"{config_path}: thresholds.baseline {baseline} does not exist")
    return str(baseline)


def _policy(config: RunConfig | None, runs: Sequence[Summary]) -> MetricPolicy:
    if config is not None:
        return config.metrics
    return runs[0].policy if runs else MetricPolicy()


def _metrics(
    args: argparse.Namespace,
    config: RunConfig | None,
    runs: Sequence[Summary],
    results: Sequence[JudgedQuery],
) -> list[str]:
    """--metric, else the config's or the first run's metrics and the pooled ones; with every
    --fail-if-worse metric."""
    if config is not None:
        default, chosen = list(config.metrics.names), config.metrics.primary
    else:
        default = list(runs[0].metric_names) if runs else list(results[0].metrics)
        chosen = runs[0].policy.primary if runs else None
    from judge.report.compared import pooled_counterpart

    pooled = [*DEFAULT_POOLED, *pooled_counterpart(default, chosen)]
    metrics = list(
        dict.fromkeys([*(args.metric or [*default, *pooled]), *(args.fail_if_worse or [])])
    )
    for name in metrics:
        check_metric(name)
    return metrics


def cmd_report(args: argparse.Namespace) -> int:
    from judge.metrics.compute import counted, rescored
    from judge.report.document import write_reports
    from judge.report.finish import finished, nights_of, summary_state
    from judge.report.history import history_rows_for_report, source_key
    from judge.report.summary import SUMMARY_FILE, load_summary
    from judge.run.resume import RUN_FILE, config_source

    out_dir = Path(args.run_dir)
    if not out_dir.is_dir():  # summary.json was read as results: "1794 input errors"
        raise ConfigError(f"{out_dir}: not a directory: give the run directory")
    results: Sequence[JudgedQuery] = load_results(out_dir)
    config = load_config(args.config) if args.config else None
    named = args.config  # the config file the history is kept by
    summary_path = out_dir / SUMMARY_FILE
    state = summary_state(out_dir)
    if state in ("missing", "stale") and (out_dir / RUN_FILE).is_file() and not finished(out_dir):
        when = "before it wrote a summary" if state == "missing" else "after its summary"
        raise RunUnfinished(
            f"{out_dir}: a run into it stopped {when} (killed, say): its results are not what "
            "any summary says, and cannot be reported as passed; rerun the same `judge run` "
            "command to resume and finish it"
        )
    if state == "stale" and not args.rebuild:
        log.warning("%s: the results changed since its summary was made: made again", out_dir)
    if summary_path.exists() and not args.rebuild and state != "stale":
        summary = load_summary(summary_path)
        nights = nights_of(config, summary) if config else {}
        results = counted(results, summary.config.scale, summary.policy)
    else:
        if config is None and (config := _the_runs_config(out_dir, *config_source(out_dir))):
            named = config.source
        made = config or load_config(None)
        if args.config:  # its policy may not be the run's: the metrics follow it
            results = rescored(results, made.scale(), made.metrics)
        results = counted(results, made.scale(), made.metrics)
        summary, nights = _rebuilt(out_dir, made, results, given=config is not None)
    history_path = args.history or (config.history_path() if config else None)
    rows = []
    if history_path is not None:
        rows = history_rows_for_report(
            history_path,
            list(summary.engines),
            summary.metric_names,
            args.last,
            max_drop=config.thresholds.max_drop if config else None,
            source=source_key(named),
        )
    written = write_reports(
        out_dir, summary, results, history=rows, worst=args.worst, nights=nights
    )
    for path in written:
        print(path)
    return 0


def _rebuilt(
    out_dir: Path, config: RunConfig, results: Sequence[JudgedQuery], *, given: bool
) -> tuple[Summary, Nights]:
    """``out_dir``'s summary made again from its results (and written), with its nights
    against the baseline; it keeps what the results cannot say: how the run went, its
    dataset and date. ``config``: the run's when ``given``, else the default config (said to
    be the wrong one when it cannot summarise them)."""
    from judge.report.finish import complete_summary
    from judge.report.summary import SUMMARY_FILE, load_summary, write_summary

    path = out_dir / SUMMARY_FILE
    try:  # what it keeps of the old summary; a damaged one is what --rebuild is for
        old = load_summary(path) if path.exists() else None
    except InputError as exc:
        log.warning("%s; made again from the results without it", exc)
        old = None
    run, dataset = (old.run, old.dataset) if old else (None, None)
    try:
        summary, _, nights = complete_summary(config, results, run, dataset)
    except (ConfigError, InputError) as exc:
        if given:
            raise
        raise ConfigError(
            f"{out_dir}: no run config is known, and the default config cannot summarise "
            f"its results ({exc}): pass --config with the run's config"
        ) from None
    if old is not None:  # the run's summary made again: still the run's date
        summary = summary.model_copy(update={"created": old.created})
    write_summary(path, summary)
    return summary, nights


def _the_runs_config(out_dir: Path, source: str | None, given: dict[str, Any]) -> RunConfig | None:
    """The config the run into ``out_dir`` was started with (run.json names it), to make its
    summary again when --config names none: the metrics, thresholds and prices are the
    config's alone, and the default config's would say other things of the same verdicts.
    None when no run recorded one (a results file alone: the default config's summary)."""
    from judge.run.resume import config_changes

    if source is None or source.startswith("<"):
        return None
    if not Path(source).is_file():
        raise ConfigError(
            f"{out_dir}: its summary is made from the run's config, {source} (run.json), which "
            "is not there from here: pass --config with it"
        )
    config = load_config(source, given)  # with the run's --set and flags over it
    if (changes := config_changes(out_dir, config)) is not None:
        raise ConfigError(
            f"{out_dir}: the run's config, {source}, has changed since the run ({changes}): "
            "pass --config with the config the run used"
        )
    log.warning("%s: summary made again with the run's config, %s", out_dir, source)
    return config


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
    for name in args.metric or ():  # as compare and metrics check a name: one line, exit 2,
        parse_metric_name(name)  # before anything is printed
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
                    f"run {g.run_id} {g.current - g.previous:+.4f}"
                    for g in flags
                    if (g.engine, g.metric) == (engine, metric)
                ]
                rows.append([engine, metric, sparkline(values), _num(known[0]), _num(known[-1])])
                rows[-1].append("REGRESSION " + ", ".join(bad) if bad else "")
    print("\ntrend, oldest to newest:")
    print(columns(["engine", "metric", "trend", "first", "last", "flags"], rows, "<<<>><"))
    return 0


def _add_compare(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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
        "--baseline",
        help="engine or run the others are compared with (default: the first argument's; "
        "by name for the engines of one run)",
    )
    c.add_argument(
        "--n-boot",
        type=at_least_one,
        help=f"bootstrap resamples for the CIs (default: the run's, else {N_BOOT})",
    )
    c.add_argument(
        "--permutations",
        type=at_least_one,
        default=N_PERMUTATIONS,
        help="sign-flip permutations for p",
    )
    c.add_argument("--seed", type=seed_arg, help="random seed (default: the run's, else 0)")
    c.add_argument("--json", metavar="OUT", help="also write the comparison as JSON")
    c.add_argument("--html", metavar="OUT", help="also write an offline HTML page with charts")
    c.add_argument(
        "--fail-if-worse",
        action="append",
        metavar="METRIC",
        help="exit 1 when an engine or run is significantly worse than its baseline on METRIC "
        "(lower, two-sided sign-flip p < 0.05); repeatable",
    )
    c.add_argument("--config", help="config giving the scale, metric names and gain")
    c.add_argument(
        "--vs-baseline",
        action="store_true",
        help="compare the sources with the config's [thresholds] baseline summary (needs "
        "--config): 'tonight vs baseline'",
    )
    c.add_argument(
        "--trec-run", help="add a TREC run as an engine, judged from the pooled verdicts"
    )
    c.add_argument("--passage-store", help="passage store JSONL for --trec-run")
    c.add_argument("--queries", help="query texts (TSV or JSONL) for --trec-run")
    c.add_argument("--trec-engine", help="engine name for --trec-run (default: its run tag)")
    c.set_defaults(func=cmd_compare)


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``compare``, ``report`` and ``history`` on the ``judge`` parser."""
    _add_compare(sub)

    r = sub.add_parser("report", help="rewrite report.md and report.html for a run directory")
    r.add_argument("run_dir")
    r.add_argument("--config", help="config (history file, max_drop, and the summary if rebuilt)")
    r.add_argument("--history", help="history file (default: the config's run.history)")
    r.add_argument("--last", type=whole_number(0), default=10, help="runs of history shown")
    r.add_argument(
        "--worst",
        type=whole_number(0),
        default=5,
        help="lowest-scoring queries named under the metrics",
    )
    r.add_argument("--rebuild", action="store_true", help="recompute summary.json from the results")
    r.set_defaults(func=cmd_report)

    h = sub.add_parser(
        "history", help="past runs and the trend of each metric, regressions flagged"
    )
    h.add_argument("--config", help="config (history file, max_drop); shows only its runs")
    h.add_argument("--history", help="history file (default: the config's run.history)")
    h.add_argument("--limit", type=whole_number(0), default=20, help="runs shown (0 = all)")
    h.add_argument("--metric", action="append", help="metric to show (repeatable; default all)")
    h.add_argument("--all", action="store_true", help="runs of every config, not just --config's")
    h.set_defaults(func=cmd_history)
