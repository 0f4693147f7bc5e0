"""The report's first screen: one status word, its reasons one line each, and what was run.

The status is the first that applies of:

- ``INCOMPLETE``: the run stopped before every (query, repeat) was judged; its numbers cover
  part of the queries, and a rerun resumes;
- ``JUDGE UNRELIABLE``: this run's evidence says the judge's labels are not informative (one
  label for nearly everything, flat probabilities, disagreement with the run's human labels,
  a language its model does not serve: :mod:`judge.analysis.health`), so no metric says
  anything about the engines, breached or not;
- ``FAILED``: a threshold check was breached (``judge run`` exits 1);
- ``PASSED``: none of these.

Every reason that applies is listed, not only the winning one's, and so are notes of checks
that passed but did not run as configured (a missing baseline on the first night).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path

from judge.analysis.health import MIN_VERDICTS, JudgeHealth
from judge.report.blocks import Header, format_value
from judge.report.summary import Check, Outcome, Summary

STATUS_CSS = {
    "INCOMPLETE": "incomplete",
    "JUDGE UNRELIABLE": "unreliable",
    "FAILED": "failed",
    "PASSED": "passed",
}


def describe_check(check: Check) -> str:
    """One line saying what a threshold check found."""
    where = f" ({check.engine})" if check.engine else ""
    name = f"{check.check}{where}"
    if check.check == "degenerate judge" and not check.ok:  # the reasons are listed already
        return f"{name}: fail_on_degenerate_judge is set, so a degenerate judge fails the run"
    if check.value is None:
        return f"{name}: {(check.note or 'no value').removeprefix('not evaluated: ')}"
    value, limit = format_value(check.value), format_value(check.limit)
    said = f" ({check.note})" if check.note else ""  # a drop over the queries both runs hold
    if check.check.startswith(("drop ", "rise ")) and check.baseline is not None:
        # value: how much worse (a fall; for a lower-is-better metric, a rise)
        before, now = format_value(check.baseline), format_value(check.current)
        worse = "fell" if check.check.startswith("drop ") else "rose"
        better = "rose" if worse == "fell" else "fell"
        moved = f"{worse if check.value > 0 else better} {format_value(abs(check.value))}"
        if check.value == 0:
            moved = "unchanged"
        return f"{name}: {moved} (from {before} to {now}){said}; at most {limit} allowed"
    if check.check.startswith("min "):
        return f"{name}: {value}; at least {limit} required"
    return f"{name}: {value}{said}; at most {limit} allowed"


def status(summary: Summary, health: JudgeHealth) -> tuple[str, list[str]]:
    """The status word and every reason behind it, one line each (see the module doc)."""
    run = summary.run
    reasons: list[str] = []
    if run is not None and run.status != "complete":
        why = run.reason or "stopped"
        c = summary.counts
        errors, unsent = c.error - c.not_sent, c.not_sent
        failed = f", {errors} passage(s) ended in provider errors" if errors else ""
        failed += f", {unsent} passage(s) not sent as it stopped" if unsent else ""
        reasons.append(
            f"incomplete: {why}; rerun the same command to resume ({run.done} of "
            f"{run.planned} query-repeats ran{failed})"
        )
    reasons += [f"judge unreliable: {p}" for p in health.problems]
    reasons += [f"judge caveat: {c}" for c in health.caveats]  # measured elsewhere: no status
    if not health.known and summary.counts.verdicts:
        reasons += [f"judge health {n}" for n in health.notes[:1]]
    breaches = summary.thresholds.breaches
    reasons += [f"breached: {describe_check(c)}" for c in breaches if c.evaluated]
    reasons += [f"not evaluated: {describe_check(c)}" for c in breaches if not c.evaluated]
    notes = [f"note: {describe_check(c)}" for c in summary.thresholds.checks if c.ok and c.note]
    if run is not None and run.status != "complete":
        word = "INCOMPLETE"
    elif health.degenerate:
        word = "JUDGE UNRELIABLE"
    elif breaches:
        word = "FAILED"
    else:
        word = "PASSED"
        checks = sum(c.evaluated for c in summary.thresholds.checks)  # the rest: notes
        reasons.append(
            f"all {checks} threshold check(s) passed" if checks else "no thresholds configured"
        )
    return word, reasons + notes


# Exit codes of ``judge run`` (cli/common.py names the same numbers).
_EXIT = {"PASSED": 0, "JUDGE UNRELIABLE": 0, "FAILED": 1, "INCOMPLETE": 3}
EXIT_BUDGET = 4


def uninformative(summary: Summary) -> list[str]:
    """The engines whose verdicts the judge's health found not informative (one label, or
    probabilities too flat to rank, on that engine alone)."""
    return [e for e, stats in summary.health.engines.items() if stats.problems]


def trust_line(summary: Summary) -> str:
    """How far the numbers can be trusted, in one line: the judge's health, its unparsed and
    error verdicts, and its agreement with human labels where there are any."""
    h, c = summary.health, summary.counts
    if h.degenerate:
        health = "UNRELIABLE (" + " ".join(h.problems) + ")"
    elif not h.known:
        health = "unknown" + (" (no verdict was answered)" if c.verdicts else "")
    elif c.ok - c.blank < MIN_VERDICTS:  # the checks could not tell: nothing says it is ok
        given = c.ok - c.blank  # an empty passage's "no" was given without asking
        health = f"unknown (only {given} ok verdicts: at least {MIN_VERDICTS} are needed to tell)"
    elif suspect := uninformative(summary):
        health = f"ok overall, but one-sided on {', '.join(suspect)} (see the notes)"
    else:
        health = "ok"
    line = (
        f"Trust: judge health {health}; {c.unparsed} unparsed and {c.failed_words()} of "
        f"{c.verdicts} verdicts"
    )
    kappas = [
        f"{engine} {st.agreement.majority.kappa:.2f}"
        for engine, st in summary.stability.engines.items()
        if st.agreement is not None and st.agreement.majority.kappa is not None
    ]
    if kappas:
        line += "; agreement with human labels (kappa, majority vote): " + ", ".join(kappas)
    return line


def outcome_of(summary: Summary) -> Outcome:
    """How the run ended: the status word, the exit code ``judge run`` gives for it (a budget
    stop: 4; a template failing on the data: 2; a degenerate judge fails only with
    ``fail_on_degenerate_judge``, as a check) and every reason, one line each."""
    word, reasons = status(summary, summary.health)
    code = _EXIT[word]
    stopped = summary.run.stopped_by if summary.run is not None else None
    if word == "INCOMPLETE" and stopped == "budget":
        code = EXIT_BUDGET
    elif word == "INCOMPLETE" and stopped == "template":  # the template failed on the data
        code = 2
    elif word == "JUDGE UNRELIABLE" and summary.thresholds.breaches:
        code = 1
    return Outcome(status=word, exit_code=code, reasons=tuple(reasons))


def _when(created: str) -> str:
    try:
        stamp = dt.datetime.fromisoformat(created)
    except ValueError:
        return created or "date unknown"
    return stamp.strftime("%Y-%m-%d %H:%M %Z").strip()


def config_name(source: str | None) -> str:
    """A config's short name: its file name without the extension."""
    return Path(source).stem if source and not source.startswith("<") else "default config"


def header(summary: Summary, health: JudgeHealth) -> Header:
    """The first screen: status, reasons, then config, dataset, model, date and counts."""
    word, reasons = status(summary, health)
    judge, c = summary.config.judge, summary.counts
    model = " ".join(str(judge[k]) for k in ("provider", "model") if judge.get(k))
    how = ", ".join(str(judge[k]) for k in ("scale", "mode") if judge.get(k))
    meta: Sequence[str] = [
        f"config {summary.config.source or 'defaults'}",
        f"dataset {summary.dataset or 'not recorded'}",
        f"judge {model or 'unknown'}" + (f" ({how})" if how else ""),
        _when(summary.created),
        f"{c.query_ids} query ids × {len(c.engines)} engine(s) × {c.repeats} repeat(s): "
        f"{c.verdicts} verdicts, {c.unparsed} unparsed, {c.failed_words()}",
    ]
    title = f"{word} · judge report · {config_name(summary.config.source)}"
    return Header(title, STATUS_CSS[word], reasons, meta, verdict=summary.verdict)
