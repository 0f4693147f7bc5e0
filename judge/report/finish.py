"""What happens after a run: the nightly chain summary -> history -> report -> qrels.

:func:`finish_run` reads the latest result per (query, engine, repeat) from a run directory,
builds its :class:`~judge.report.summary.Summary` and writes it to summary.json, records the
run in the config's history, writes report.md and report.html (with the history trend and
regression flags) and qrels.txt, and returns the Summary. ``judge run`` calls it after
judging; Python users can call it on any finished (or partly finished) run directory::

    outcome = asyncio.run(run_async(config, queries, out_dir))
    summary = finish_run(config, out_dir, outcome)
    if summary.thresholds.breached: ...

A run directory remembers what its summary and reports were made from (``finished.json``:
digests of the results file, the config and the baseline, and the judge version). ``judge
run`` again on a finished directory with all of those unchanged judges nothing and finds
its summary and reports current: it reuses them instead of making them again, and records
no second history row for the same results.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from judge.analysis.compare import Comparison
from judge.config import RunConfig
from judge.data.lines import write_atomic
from judge.data.results import RESULTS_FILE, UnitKey, load_results, write_qrels
from judge.errors import CacheError, JudgeError
from judge.metrics.compute import counted
from judge.metrics.facts import primary_metric
from judge.report.compared import (
    Nights,
    headline_lines,
    night_diffs,
    night_lines,
    verdict_lines,
)
from judge.report.document import run_comparison, write_reports
from judge.report.history import HistoryRow, history_rows_for_report, record_run, source_key
from judge.report.status import describe_check, outcome_of, trust_line, uninformative
from judge.report.summary import (
    SUMMARY_FILE,
    Summary,
    build_summary,
    load_summary,
    write_summary,
)
from judge.run.runner import RunOutcome
from judge.schema import JudgedQuery
from judge.version import __version__

log = logging.getLogger(__name__)

QRELS_FILE = "qrels.txt"
# What a run directory's summary and reports were made from (see the module doc).
FINISHED_FILE = "finished.json"
_REPORTS = ("report.md", "report.html")
# Past runs the report's history section shows.
HISTORY_SHOWN = 10


def _verdict(summary: Summary, comparison: Comparison | None) -> list[str]:
    """Which engine is better, a sentence per pair, then what ``judge compare`` says next
    (the largest significant change on another metric, when the primary shows none); one
    saying nothing was judged when no verdict was answered (not that the engines share no
    query where the metric is defined)."""
    said = verdict_lines(comparison, summary.policy.primary) if comparison else []
    c = summary.counts
    if said and not c.ok:
        return [
            f"no verdict on the engines: none of the {c.verdicts} passages was judged "
            f"({c.failed_words()}, {c.unparsed} unparsed)"
        ]
    more = headline_lines(comparison, summary.policy.primary)[len(said) :] if comparison else []
    if summary.health.degenerate:  # a difference a judge found unreliable measured is no verdict
        return [f"{line} (by a judge found unreliable: see Trust)" for line in [*said, *more]]
    suspect = uninformative(summary)
    if not suspect or comparison is None:
        return [*said, *more]
    metric = primary_metric(comparison.metrics, summary.policy.primary)
    diffs = [d for d in comparison.diffs if d.metric == metric]
    marked = []
    for line, d in zip(said, diffs, strict=True):
        which = [e for e in (d.engine, d.baseline) if e in suspect]
        if which:  # one label throughout: earned or bought, said where the verdict is read
            line += (
                f" (the judge gave nearly every passage of {' and '.join(which)} one label: an "
                "engine that good, or verdicts its passages bought; see Trust)"
            )
        marked.append(line)
    return [*marked, *more]


def finish_run(
    config: RunConfig,
    out_dir: Path,
    outcome: RunOutcome | None = None,
    results: Sequence[JudgedQuery] | None = None,
    plan: Collection[UnitKey] | None = None,
) -> Summary:
    """Summarise ``out_dir``'s results and write summary.json, history, reports and qrels.

    ``outcome`` is what :func:`judge.run.runner.run_async` returned (None when the run was
    judged elsewhere or earlier); it is kept in the summary as ``run``. ``results``: the
    directory's rows as :func:`load_results` reads them, when already in memory (empty or
    None: read). ``plan``: the run's (query_id, engine, repeat) units; rows of others the
    directory holds (queries since taken out of the dataset, another sample) are left out of
    the summary. Raises :class:`~judge.errors.InputError` when the directory has no results
    yet.
    """
    out_dir = Path(out_dir)
    if results and not (out_dir / RESULTS_FILE).exists():  # judged in Python, a new directory:
        # its rows are written too, as a run leaves them (read_run, report and compare read them)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(out_dir / RESULTS_FILE, "".join(f"{jq.model_dump_json()}\n" for jq in results))
    current = _made_from(config, out_dir, plan)
    if outcome is not None and outcome.resumed == outcome.planned and _still(out_dir, current):
        log.info("nothing new to judge: %s's summary and reports are current", out_dir)
        return load_summary(out_dir / SUMMARY_FILE)
    results = _of_plan(results or load_results(out_dir), plan, out_dir)
    results = counted(results, config.scale(), config.metrics)  # labelled as the metrics count
    summary, comparison, nights = complete_summary(config, results, outcome)
    write_summary(out_dir / SUMMARY_FILE, summary)
    run_id, rows, kept = _in_history(config, summary, out_dir, outcome, current)
    written = write_reports(
        out_dir,
        summary,
        results,
        history=rows,
        charts=config.run.charts,
        comparison=comparison,
        nights=nights,
    )
    write_qrels(out_dir / QRELS_FILE, results)
    recorded = run_id is not None or _recorded(out_dir, current)
    # A history that failed leaves the finish incomplete: the next run tries to record again.
    _write_made(out_dir, {**current, "recorded": recorded, "complete": kept})
    log.debug(
        "run %s recorded in %s; wrote %s, %s and %s",
        "not (incomplete)" if run_id is None else run_id,
        config.history_path(),
        SUMMARY_FILE,
        ", ".join(p.name for p in written),
        QRELS_FILE,
    )
    return summary


def _in_history(
    config: RunConfig,
    summary: Summary,
    out_dir: Path,
    outcome: RunOutcome | None,
    current: dict[str, str | None],
) -> tuple[int | None, list[HistoryRow], bool]:
    """The run recorded in the config's history (its id: see :func:`_record`), the rows of
    the report's trend, and whether the history could be read. A history that cannot take
    them is said, not raised: the run was judged and paid for, and its reports are written
    without the trend."""
    history = config.history_path()
    try:
        run_id = _record(history, summary, out_dir, outcome, current)
        if run_id is not None:  # said at once: a finish stopped before its end records once
            _write_made(out_dir, {**current, "recorded": True, "complete": False})
        rows = history_rows_for_report(
            history,
            list(summary.engines),
            summary.metric_names,
            HISTORY_SHOWN,
            max_drop=config.thresholds.max_drop,
            source=source_key(config.source),
        )
    except CacheError as exc:
        log.warning("%s; this run is not in the history, and the reports show no trend", exc)
        return None, [], False
    return run_id, rows, True


def _record(
    history: Path,
    summary: Summary,
    out_dir: Path,
    outcome: RunOutcome | None,
    current: dict[str, str | None],
) -> int | None:
    """The run recorded in the history (its id), unless it stopped before it finished (its
    partial means would join the trend as a night of its own; its rerun, once finished, is
    recorded) or these very results are there already."""
    stopped = outcome is not None and outcome.status != "complete"
    if stopped or _recorded(out_dir, current):
        return None
    return record_run(history, summary, out_dir)


def _of_plan(
    results: Sequence[JudgedQuery], plan: Collection[UnitKey] | None, out_dir: Path
) -> Sequence[JudgedQuery]:
    """The rows of the run's own units (all of them without a plan): a directory may hold
    others, of queries since taken out of the dataset or of another sample."""
    if plan is None or not (others := sum(jq.key not in plan for jq in results)):
        return results
    log.warning(
        "%d unit(s) in %s are not in this run's dataset or sample: left out of its summary",
        others,
        out_dir,
    )
    return [jq for jq in results if jq.key in plan]


def complete_summary(
    config: RunConfig,
    results: Sequence[JudgedQuery],
    outcome: RunOutcome | None,
    dataset: str | None = None,
) -> tuple[Summary, Comparison | None, Nights]:
    """The summary a run's reports are made from, whole: its numbers, which engine is better,
    whether each moved against the baseline, and the trust line, its outcome; the comparison
    behind the verdict and the nights behind the moves. ``dataset``: where the rows came
    from, when known better than the config says (a rebuilt summary keeps the run's: its
    dataset may have been given on the command line)."""
    summary = build_summary(config, results, run=outcome)
    if dataset is not None:
        summary = summary.model_copy(update={"dataset": dataset})
    comparison = run_comparison(summary, results)
    nights = nights_of(config, summary)
    moved = [
        _with_breach(line, engine, summary)
        for engine, line in zip(nights, night_lines(nights), strict=True)
    ]
    if summary.health.degenerate:
        moved = [f"{line} (by a judge found unreliable: see Trust)" for line in moved]
    said = [*_verdict(summary, comparison), *moved]
    summary = summary.model_copy(update={"verdict": (*said, trust_line(summary))})
    summary = summary.model_copy(update={"outcome": outcome_of(summary)})
    return summary, comparison, nights


def _with_breach(line: str, engine: str, summary: Summary) -> str:
    """An engine's line against the baseline, and the drop checks of it that failed: those
    read its mean over all its queries tonight, the line only the queries both runs hold, so
    it may find nothing where a check fails (and the line leads, the check comes last)."""
    failed = [
        describe_check(c)
        for c in summary.thresholds.breaches
        if c.engine == engine and c.evaluated and c.check.startswith(("drop ", "rise "))
    ]
    return line + "".join(f"; but its drop check failed: {f}" for f in failed)


def nights_of(config: RunConfig, summary: Summary) -> Nights:
    """Each engine tonight against the ``[thresholds] baseline`` on the primary metric
    (:func:`night_diffs`); none without a baseline to read (the first night)."""
    base = config.thresholds.baseline
    if not base or not Path(base).is_file():
        return {}
    try:
        baseline = load_summary(base)
    except JudgeError:  # the checks before the run said why; the drop checks say it again
        return {}
    return night_diffs(summary, baseline)


def _digest(path: Path) -> str | None:
    """sha256 of a file's bytes, None when there is no such file."""
    try:
        with open(path, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()
    except FileNotFoundError:
        return None


def _made_from(
    config: RunConfig, out_dir: Path, plan: Collection[UnitKey] | None = None
) -> dict[str, str | None]:
    """What ``out_dir``'s summary and reports are made from, as digests (the units summarised
    too: a dataset that lost queries changes no result, but the summary)."""
    baseline = config.thresholds.baseline
    units = "\n".join(sorted(f"{q}\x1f{e}\x1f{r}" for q, e, r in plan)) if plan else None
    return {
        "judge": __version__,
        "config": hashlib.sha256(config.model_dump_json().encode()).hexdigest(),
        "results": _digest(out_dir / RESULTS_FILE),
        "baseline": _digest(Path(baseline)) if baseline else None,
        "units": hashlib.sha256(units.encode()).hexdigest() if units else None,
    }


def _made(out_dir: Path) -> dict[str, Any]:
    """What ``out_dir``'s summary and reports were last made from ({}: never, or unreadable)."""
    try:
        made = json.loads((out_dir / FINISHED_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return made if isinstance(made, dict) else {}


def summary_state(out_dir: Path) -> str:
    """What ``out_dir``'s summary.json is to its results: ``current`` (made from these very
    results), ``stale`` (from others: the results changed since), ``unknown`` (no record of
    what it was made from), or ``missing``."""
    if not (out_dir / SUMMARY_FILE).is_file():
        return "missing"
    made = _made(out_dir).get("results")
    if made is None:
        return "unknown"
    return "current" if made == _digest(out_dir / RESULTS_FILE) else "stale"


def finished(out_dir: Path) -> bool:
    """Whether a finish of ``out_dir`` completed from the results it holds now (its summary
    may since have been removed or damaged: made again from them, not an unfinished run)."""
    made = _made(out_dir)
    return made.get("complete") is True and made.get("results") == _digest(out_dir / RESULTS_FILE)


def _write_made(out_dir: Path, made: dict[str, Any]) -> None:
    """``finished.json``: what the summary and reports were made from, whether the history
    has these results, and whether every file of the finish was written (``complete``)."""
    write_atomic(out_dir / FINISHED_FILE, json.dumps(made, indent=1) + "\n")


def _still(out_dir: Path, current: dict[str, str | None]) -> bool:
    """Whether ``out_dir``'s summary, reports and qrels exist and were made from ``current``
    (a finish that stopped before its end, after recording the run, made none of them)."""
    made = _made(out_dir)
    files = (SUMMARY_FILE, QRELS_FILE, *_REPORTS)
    return (
        {k: made.get(k) for k in current} == current
        and made.get("complete", True) is True
        and all((out_dir / name).is_file() for name in files)
    )


def _recorded(out_dir: Path, current: dict[str, str | None]) -> bool:
    """Whether these very results (of these units) are in the history already: a summary made
    again (a new baseline, other metric names, --fresh judging nothing new) is the same night,
    not another row of the trend."""
    made = _made(out_dir)
    same = all(made.get(k) == current[k] for k in ("judge", "results", "units"))
    return same and made.get("recorded") is True
