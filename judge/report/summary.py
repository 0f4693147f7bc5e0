"""summary.json: the machine-readable result of a run, and the threshold checks on it.

``summary.model_dump_json(indent=2)`` of a :class:`Summary` is what summary.json holds:
counts (ok / unparsed / error — never folded into "not relevant"), usage and cost, per-engine
metric means with repeat stability and bootstrap CIs, label flips, alpha, agreement with
human labels, the judge's health (:mod:`judge.analysis.health`) and the threshold checks.

The ``[thresholds]`` checks (:func:`check_thresholds`): minimum and maximum metric means, the
unparsed rate, the drop (or rise) against a baseline summary, and a degenerate judge. A breach
makes ``judge run`` exit 1.

``SCHEMA_VERSION`` is bumped whenever a field changes meaning or moves (2: "gain" /
"unjudged_policy" became ``policy``); version 1 still loads (:func:`_from_v1`), so old files
kept as baselines still work. A field added since is filled when missing: ``health`` (added
within version 2) loads as unknown, and its sentences and figures added since (``findings``,
``caveats``, ``sources``, ``human``, ``band``, ``language``) as none; ``queries`` (per query
and engine, :mod:`judge.report.queries`) as none, ``label_scale`` as None.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from judge.analysis.cascade import CascadeSummary, cascade_summary
from judge.analysis.compare import N_BOOT, paired_diff, question
from judge.analysis.coverage import CoverageSummary, coverage_summary
from judge.analysis.health import JudgeHealth, judge_health
from judge.analysis.ppi import MetricPPI, ppi_by_engine
from judge.analysis.stability import (
    StabilityReport,
    majority_vote,
    one_repeat_each,
    stability_report,
)
from judge.config import RunConfig
from judge.data.lines import write_atomic
from judge.errors import NOT_SENT, InputError, JudgeError
from judge.metrics.facts import (
    family_of,
    lower_is_better,
    primary_metric,
    primary_named,
)
from judge.providers import ADAPTERS, judges_by_score, resolve_spec
from judge.report.queries import QueryRow, labels_on_scale, night_values, query_rows
from judge.run.runner import RunOutcome
from judge.schema import BUILTIN_SCALES, JudgedQuery, MetricPolicy, Record, Scale, Usage
from judge.version import __version__

SCHEMA_VERSION = 2
SUMMARY_FILE = "summary.json"


class Counts(Record):
    """What was judged: (query, engine) pairs, verdicts by status, and their rates."""

    queries: int
    query_ids: int
    engines: tuple[str, ...]
    repeats: int
    judged_units: int
    verdicts: int
    ok: int
    unparsed: int
    error: int  # not_sent among them
    error_rate: float
    unparsed_rate: float
    empty_queries: int
    cached_verdicts: int
    sanitised: int = 0  # distinct passages that had text aimed at the judge taken out
    # Errors of passages a stopping run never sent (a signal, a budget, too many errors):
    # asked on the next run, not failures of the provider.
    not_sent: int = 0
    # Verdicts of blank passages (no text to read): not relevant, given without a call.
    blank: int = 0
    # Distinct passages cut before judging (max_passage_chars or the context window): the
    # judge read their start, marked as cut (``truncated_from`` in verdicts.jsonl).
    truncated: int = 0
    # Per engine: its distinct passages, and how many carried each signal (a verdict's
    # ``signals``: echo, sanitised) in any repeat.
    flagged: dict[str, dict[str, int]] = Field(default_factory=dict)

    def failed_words(self) -> str:
        """The error verdicts in words: ``3 error`` (``3 error, 12 not sent`` apart)."""
        sent = self.error - self.not_sent
        return f"{sent} error" + (f", {self.not_sent} not sent" if self.not_sent else "")

    def blank_words(self) -> str:
        """The blank passages' verdicts in words ("" when none)."""
        if not self.blank:
            return ""
        return (
            f"{self.blank} verdict(s) of empty passages (no text): not relevant, without asking "
            "the judge"
        )

    def truncated_words(self) -> str:
        """The cut passages in words ("" when none)."""
        if not self.truncated:
            return ""
        return (
            f"{self.truncated} passage(s) were cut to a length limit (max_passage_chars or the "
            'context window) and judged by their start ("truncated_from" in verdicts.jsonl)'
        )

    def flag_lines(self) -> list[str]:
        """One line per engine with flagged passages, and one calling out an engine flagged
        far more often (at least twice the least-flagged engine's share, and 5% of its own
        passages): such an engine may be gaming the judge, or its verdicts are the judge's
        least sure."""
        lines, shares = [], {}
        for engine, got in sorted(self.flagged.items()):
            total, marks = got.get("passages", 0), {k: v for k, v in got.items() if k != "passages"}
            shares[engine] = sum(marks.values()) / total if total else 0.0
            if any(marks.values()):
                said = ", ".join(f"{n} {signal}" for signal, n in sorted(marks.items()) if n)
                lines.append(f"{engine}: {said} of {total} passages flagged")
        if len(shares) > 1:
            top = max(shares, key=lambda e: shares[e])
            low = min(shares.values())
            if shares[top] >= 0.05 and shares[top] >= 2 * low:
                lines.append(
                    f"{top}: flagged {shares[top]:.0%} of its passages, against {low:.0%} for "
                    'the least-flagged engine: check them (verdicts.jsonl, "signals")'
                )
        return lines


class UsageSummary(Record):
    """Tokens of the results and their list-price cost (None without a [prices] entry)."""

    prompt_tokens: int
    completion_tokens: int
    prompt_tokens_per_passage: float
    completion_tokens_per_passage: float
    cost_usd: float | None


class SummaryConfig(Record):
    """Where the config came from and its fingerprint (what changes the answers)."""

    source: str | None
    judge: dict[str, Any]
    provider: dict[str, Any]
    rerank: dict[str, Any] | None
    scale: Scale
    repeats: int
    aspects: dict[str, Any] | None = None  # [nuggets] and [credibility], when on


class MetricSummary(Record):
    """One metric of one engine: mean over repeats, its bootstrap CI and repeat spread."""

    mean: float | None
    ci_low: float | None
    ci_high: float | None
    std_across_repeats: float | None
    max_rel_diff: float | None
    per_repeat: tuple[float | None, ...]
    n_defined: int
    n_undefined: int


class EngineSummary(Record):
    """One engine's metrics; ``majority_vote`` holds them recomputed from the voted verdicts."""

    majority_vote: dict[str, float | None]
    n_queries: int
    n_repeats: int
    metrics: dict[str, MetricSummary]

    def mean(self, metric: str) -> float | None:
        found = self.metrics.get(metric)
        return found.mean if found else None


class Check(Record):
    """One threshold check; ``ok`` False is a breach (``judge run`` exits 1). A check that
    could not be evaluated (no value: the metric is undefined for every query, or nothing was
    answered) has ``evaluated`` False: it is neither passed nor breached, and a complete run
    with one does not pass; except a drop check the baseline cannot make (an engine or metric
    it lacks), which is ``ok`` with a note: a new engine has no baseline yet."""

    check: str
    value: float | None
    limit: float | None
    ok: bool
    engine: str | None = None
    baseline: float | None = None
    current: float | None = None
    note: str | None = None
    evaluated: bool = True


class Outcome(Record):
    """How the run ended, first in summary.json: the report's status word, the exit code
    ``judge run`` gave (0 ok, 1 a threshold not passed, 3 incomplete, 4 budget) and why."""

    status: str
    exit_code: int
    reasons: tuple[str, ...]


class ThresholdResult(Record):
    checks: tuple[Check, ...]
    breached: int
    breaches: tuple[Check, ...]

    @classmethod
    def of(cls, checks: Sequence[Check]) -> ThresholdResult:
        breaches = tuple(c for c in checks if not c.ok)
        return cls(checks=tuple(checks), breached=len(breaches), breaches=breaches)


class Summary(Record):
    """Everything summary.json says about a run."""

    # First, so a dashboard reads it before anything else (None in files written before it).
    outcome: Outcome | None = None
    # Which engine is better on the primary metric, a sentence per pair, then one trust line
    # (judge/report/compared.py, status.py); empty for older files.
    verdict: tuple[str, ...] = ()
    schema_version: int
    judge_version: str
    created: str
    config: SummaryConfig
    dataset: str | None
    policy: MetricPolicy
    metric_names: tuple[str, ...]
    counts: Counts
    usage: UsageSummary
    run: RunOutcome | None
    engines: dict[str, EngineSummary]
    stability: StabilityReport
    # Whether the judge tells passages apart at all (DESIGN rule 10); unknown in old files.
    health: JudgeHealth
    thresholds: ThresholdResult
    # Per engine, each label-free metric judge-only, human-only and PPI-corrected; empty when
    # no query carries human labels (and in older files).
    corrected: dict[str, tuple[MetricPPI, ...]] = Field(default_factory=dict)
    queries: tuple[QueryRow, ...] = ()  # each metric's mean over repeats, per query and engine
    label_scale: Scale | None = None  # the human labels' scale, when not the judge's
    # A [judge.cascade] run: passages and calls the reranker took from the LLM, cost saved,
    # agreement with human labels (judge.analysis.cascade); None without a cascade.
    cascade: CascadeSummary | None = None
    coverage: CoverageSummary | None = None  # [nuggets]: each query's nuggets, who found them


def _mean(values: Iterable[float | None]) -> float | None:
    defined = [v for v in values if v is not None]
    return sum(defined) / len(defined) if defined else None


def _rate(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def counts(results: Sequence[JudgedQuery]) -> Counts:
    status: Counter[str] = Counter(v.status for jq in results for v in jq.verdicts)
    total = sum(status.values())
    return Counts(
        queries=len({(jq.query.query_id, jq.query.engine) for jq in results}),
        query_ids=len({jq.query.query_id for jq in results}),
        engines=tuple(sorted({jq.query.engine for jq in results})),
        repeats=len({jq.repeat for jq in results}),
        judged_units=len(results),
        verdicts=total,
        ok=status["ok"],
        unparsed=status["unparsed"],
        error=status["error"],
        error_rate=_rate(status["error"], total),
        unparsed_rate=_rate(status["unparsed"], total),
        empty_queries=sum(1 for jq in results if not jq.verdicts),
        cached_verdicts=sum(1 for jq in results for v in jq.verdicts if v.cached),
        sanitised=len(
            {
                (q.query_id, q.engine, p.id)
                for q in (jq.query for jq in results)
                for p in q.passages
                if p.removed
            }
        ),
        flagged=_flagged(results),
        blank=sum(1 for jq in results for v in jq.verdicts if v.source == "empty"),
        truncated=len(
            {
                (q.query_id, q.engine, p.id)
                for q in (jq.query for jq in results)
                for p in q.passages
                if p.truncated_from is not None
            }
        ),
        not_sent=sum(
            1
            for jq in results
            for v in jq.verdicts
            if v.status == "error" and v.error is not None and NOT_SENT in v.error
        ),
    )


def _flagged(results: Sequence[JudgedQuery]) -> dict[str, dict[str, int]]:
    """Per engine: distinct passages, and those carrying each signal in any repeat."""
    passages: dict[str, set[tuple[str, str]]] = {}
    marked: dict[str, dict[str, set[tuple[str, str]]]] = {}
    for jq in results:
        engine = jq.query.engine
        seen = passages.setdefault(engine, set())
        for v in jq.verdicts:
            key = (jq.query.query_id, v.passage_id)
            seen.add(key)
            for signal in v.signals:
                marked.setdefault(engine, {}).setdefault(signal, set()).add(key)
    return {
        engine: {"passages": len(seen)}
        | {signal: len(keys) for signal, keys in marked.get(engine, {}).items()}
        for engine, seen in passages.items()
    }


def usage(results: Sequence[JudgedQuery], config: RunConfig) -> UsageSummary:
    total = sum((jq.usage for jq in results), Usage())
    n = sum(len(jq.verdicts) for jq in results)
    price = config.price()
    return UsageSummary(
        prompt_tokens=total.prompt_tokens,
        completion_tokens=total.completion_tokens,
        prompt_tokens_per_passage=_rate(total.prompt_tokens, n),
        completion_tokens_per_passage=_rate(total.completion_tokens, n),
        # What these results cost at list price, cached answers included (what a cold run pays).
        cost_usd=price.cost(total) if price else None,
    )


# MetricStability fields a summary keeps as they are (``std`` becomes std_across_repeats).
_KEPT = {"mean", "ci_low", "ci_high", "max_rel_diff", "per_repeat", "n_defined", "n_undefined"}


def _engines(
    results: Sequence[JudgedQuery],
    names: Sequence[str],
    report: StabilityReport,
    config: RunConfig,
    rows: Sequence[QueryRow],
) -> dict[str, EngineSummary]:
    # Majority-vote metrics (ties -> the lower grade; one repeat: a row's own). Coverage and
    # credibility read nugget judgments, not verdicts: each query's mean over repeats (rows).
    voted = (
        results
        if one_repeat_each(results)
        else majority_vote(results, names, config.scale(), config.metrics)
    )
    aspects = {n for n in names if family_of(n) == "coverage"}
    by_engine: dict[str, list[JudgedQuery]] = {}
    for jq in voted:
        by_engine.setdefault(jq.query.engine, []).append(jq)
    return {
        engine: EngineSummary(
            majority_vote={
                name: _mean(r.metrics.get(name) for r in rows if r.engine == engine)
                if name in aspects
                else _mean(jq.metrics.get(name) for jq in by_engine.get(engine, ()))
                for name in names
            },
            n_queries=est.n_queries,
            n_repeats=est.n_repeats,
            metrics={
                name: MetricSummary(std_across_repeats=ms.std, **ms.model_dump(include=_KEPT))
                for name, ms in est.metrics.items()
            },
        )
        for engine, est in report.engines.items()
    }


def build_summary(
    config: RunConfig,
    results: Sequence[JudgedQuery],
    *,
    run: RunOutcome | None = None,
    n_boot: int = N_BOOT,
) -> Summary:
    """The summary of ``results`` (one row per query, engine and repeat) under ``config``."""
    names = list(config.metrics.names)
    present = {name for jq in results for name in jq.metrics}
    names += sorted(present - set(names))
    labels = config.comparable_label_scale()
    results = labels_on_scale(results, config)
    report = stability_report(results, names, config.scale(), n_boot=n_boot, seed=config.run.seed)
    rows = query_rows(results, names, config.scale(), config.metrics)
    summary = Summary(
        schema_version=SCHEMA_VERSION,
        judge_version=__version__,
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        config=SummaryConfig.model_validate({"source": config.source, **config.fingerprint()}),
        dataset=config.dataset.path or config.dataset.trec_run,
        policy=primary_named(config.metrics),
        metric_names=tuple(names),
        counts=counts(results),
        usage=usage(results, config),
        run=run,
        engines=_engines(results, names, report, config, rows),
        stability=report,
        health=run_health(results, config),
        thresholds=ThresholdResult.of(()),
        corrected=ppi_by_engine(results, names, config.scale(), config.metrics),
        cascade=cascade_summary(results, config),
        coverage=coverage_summary(results),
        queries=rows,
        label_scale=None if labels == config.scale() else labels,
    )
    return summary.model_copy(update={"thresholds": check_thresholds(config, summary)})


def run_health(results: Sequence[JudgedQuery], config: RunConfig) -> JudgeHealth:
    """The judge's health (judge.analysis.health) with what the config tells it: the LLM
    judge's kind, ``[judge] language``, and the languages the model that decides most labels
    serves (the reranker of a cascade or a judge by score, else the judge; its registry
    entry's ``languages``). A provider that does not resolve leaves them unknown."""
    judge = config.judge
    try:
        spec = resolve_spec(judge.provider, config.provider.overrides())
        scorer = spec if judges_by_score(spec) else None
        if scorer is None and judge.cascade is not None and config.rerank is not None:
            scorer = resolve_spec(config.rerank.provider, config.rerank.overrides())
    except JudgeError:
        return judge_health(results, config.scale(), language=judge.language)
    decider = scorer or spec
    role = "the reranker" if scorer is not None and scorer is not spec else "the judge"
    return judge_health(
        results,
        config.scale(),
        llm=None if scorer is spec else spec.kind,
        language=judge.language,
        served=ADAPTERS[decider.kind].languages,
        served_by=f"{role} ({decider.kind})",
    )


# --- [thresholds] ------------------------------------------------------------------------


def check_thresholds(config: RunConfig, summary: Summary) -> ThresholdResult:
    """Compare the summary with [thresholds]; a breach makes ``judge run`` exit 1."""
    th, c = config.thresholds, summary.counts
    checks = [_at_most("unparsed_rate", c.unparsed_rate, th.max_unparsed_rate)]
    if c.ok + c.unparsed == 0:  # nothing was answered: a rate of 0 unparsed says nothing
        checks = [
            checks[0].model_copy(
                update={"value": None, "ok": False, "evaluated": False, "note": _NOTHING}
            )
        ]
    checks += _unscored(summary, th.max_unparsed_rate)
    for engine, data in summary.engines.items():
        for kind, metric, limit in th.bounds():
            mean = data.mean(metric)
            ok = mean is not None and (mean >= limit if kind == "min" else mean <= limit)
            check = Check(
                check=f"{kind} {metric}",
                value=mean,
                limit=limit,
                ok=ok,
                engine=engine,
                evaluated=mean is not None,
                note=None if mean is not None else f"{metric} is undefined for every query",
            )
            checks.append(check)
    checks += _baseline_checks(config, summary)
    if th.fail_on_degenerate_judge:  # no value or limit: the note says why (analysis.health)
        health = summary.health
        problems = " ".join(health.problems or health.notes[:1]) or "not degenerate"
        ok = health.known and not health.degenerate
        checks.append(
            Check(
                check="degenerate judge",
                value=None,
                limit=None,
                ok=ok,
                note=problems,
                evaluated=health.known,
            )
        )
    return ThresholdResult.of(checks)


def _unscored(summary: Summary, limit: float) -> list[Check]:
    """Per engine with a query its unparsed verdicts leave without the primary metric
    (``[metrics] unjudged = "undefined"``): the share of its queries so left, at most
    ``max_unparsed_rate`` as for verdicts. One unparsed verdict in each list, 5% of them,
    leaves every query unscored, and the engine with no number at all had passed. (Errors
    are no threshold: units left in error make the run incomplete instead.)"""
    metric = primary_metric(summary.metric_names, summary.policy.primary)
    checks = []
    for engine in summary.engines:
        rows = [r for r in summary.queries if r.engine == engine]
        left = sum(r.unparsed > 0 and r.metrics.get(metric or "") is None for r in rows)
        if metric is None or not left:
            continue
        note = (
            f"{left} of {len(rows)} queries hold an unparsed verdict and are not "
            f'scored on {metric} ([metrics] unjudged = "skip" scores them on the rest)'
        )
        rate = left / len(rows)
        check, ok = f"unscored {metric}", rate <= limit
        checks.append(Check(check=check, value=rate, limit=limit, ok=ok, engine=engine, note=note))
    return checks


def _baseline_checks(config: RunConfig, summary: Summary) -> list[Check]:
    """The drop checks against ``[thresholds] baseline``, or the one note that says why they
    were not made (no baseline yet, another scale, other [metrics] settings)."""
    th, checks = config.thresholds, []
    if th.baseline and th.max_drop and not Path(th.baseline).exists():
        # The first night has no baseline yet: say so in the report instead of failing.
        note = f"{th.baseline} not found: drop checks skipped"
        checks.append(Check(check="baseline", value=None, limit=None, ok=True, note=note))
    elif th.baseline and th.max_drop:
        base = load_summary(th.baseline)
        if (made := base.config.scale.name) != summary.config.scale.name:  # (--first-night)
            note = f"{th.baseline} was judged on the '{made}' scale: drop checks skipped"
            checks.append(Check(check="baseline", value=None, limit=None, ok=True, note=note))
        else:
            # A metric the baseline scored under other [metrics] settings has other numbers
            # for the same rankings: its drop check is skipped, the others made.
            unlike = {m: base.policy.unlike(summary.policy, [m]) for m in th.max_drop}
            skipped = [m for m, said in unlike.items() if said]
            if skipped:
                settings = "; ".join(dict.fromkeys(x for m in skipped for x in unlike[m]))
                note = (
                    f"{th.baseline} was scored under other [metrics] settings ({settings}, "
                    f"the baseline's first): drop checks skipped for {', '.join(skipped)}"
                )
                checks.append(Check(check="baseline", value=None, limit=None, ok=True, note=note))
            kept = {m: limit for m, limit in th.max_drop.items() if m not in skipped}
            checks += _drop_checks(summary, base, kept)
            then, now = (_judged_by(x.config) for x in (base, summary))
            if then != now:  # said where the drop checks are read, not only on the console
                note = (
                    f"{th.baseline} was judged by {then}, this run by {now}: a drop may be "
                    "the judge's"
                )
                checks.append(Check(check="baseline", value=None, limit=None, ok=True, note=note))
    return checks


_NOTHING = "not evaluated: no verdict was answered"


def _judged_by(config: SummaryConfig) -> str:
    return f"{config.judge.get('provider')} {config.judge.get('model')}"


def _at_most(name: str, value: float, limit: float) -> Check:
    return Check(check=name, value=value, limit=limit, ok=value <= limit)


def _unmade(check: str, engine: str, why: str) -> Check:
    """A drop check the baseline cannot make: not evaluated, and not a breach (a new engine or
    metric has no baseline yet), said in the report and on the console."""
    return Check(
        check=check,
        value=None,
        limit=None,
        ok=True,
        engine=engine,
        evaluated=False,
        note=f"not evaluated: {why}",
    )


def _drop_checks(summary: Summary, base: Summary, max_drop: dict[str, float]) -> list[Check]:
    """Each engine's fall against the baseline (rise: lower-is-better), per metric; an engine
    or metric one night lacks is said (:func:`_unmade`), never skipped in silence. When
    tonight's queries are not the baseline's, both means are taken over the queries the two
    share (same id and text) when those are most of tonight's, said in the check's note:
    means over different queries move with the queries, not the engine. A night that shares
    fewer (a fresh sample of production queries) is compared by its means, also said."""
    checks = []
    for engine, data in summary.engines.items():
        if engine not in base.engines:  # a new or renamed engine: said, not failed
            has = ", ".join(sorted(base.engines)) or "none"
            checks.append(_unmade("drop checks", engine, f"not in the baseline (it has: {has})"))
            continue
        shared = _shared_rows(summary, base, engine)
        for metric, limit in max_drop.items():
            rise = lower_is_better(metric)
            before, now = base.engines[engine].mean(metric), data.mean(metric)
            note: str | None = None
            if shared is None:  # the same queries (or no rows): all of them
                ours = [r for r in summary.queries if r.engine == engine]
                theirs = [r for r in base.queries if r.engine == engine]
            else:
                ours, theirs, note = shared
                if ours:
                    before = _mean(r.metrics.get(metric) for r in theirs)
                    now = _mean(r.metrics.get(metric) for r in ours)
            nights = {"tonight": ours, "baseline": theirs}
            values, _, scored = night_values(metric, nights) if ours and theirs else ({}, {}, 0)
            if scored:  # one night found nothing relevant where the other found something
                before, now = _mean(values["baseline"].values()), _mean(values["tonight"].values())
                missed = f"{scored} quer{'y' if scored == 1 else 'ies'} where one night found "
                missed += "nothing relevant and the other found something counted 0"
                note = f"{note}; {missed}" if note else missed
            if before is None:
                why = "not in the baseline, or undefined for every query there"
                checks.append(_unmade(f"{'rise' if rise else 'drop'} {metric}", engine, why))
                continue
            drop = (now - before if rise else before - now) if now is not None else None
            if drop is not None and drop > limit and (noise := _noise(metric, values)):
                note = f"{note}; {noise}" if note else noise
            checks.append(
                Check(
                    check=f"{'rise' if rise else 'drop'} {metric}",
                    value=drop,
                    limit=limit,
                    ok=drop is not None and drop <= limit,
                    engine=engine,
                    baseline=before,
                    current=now,
                    evaluated=drop is not None,
                    note=note if drop is not None else f"{metric} is undefined for every query",
                )
            )
    gone = sorted(set(base.engines) - set(summary.engines))
    return checks + [
        _unmade("drop checks", e, "in the baseline, but not in this run") for e in gone
    ]


def _noise(metric: str, values: dict[str, dict[str, float]]) -> str | None:
    """A breaching fall the paired test over the queries both nights define does not find
    significant, said as such (a point threshold also fires on the judge's noise); None when
    it is significant, or there are no per-query values to test."""
    if not values:
        return None
    d = paired_diff(metric, ("tonight", values["tonight"]), ("baseline", values["baseline"]))
    if d.n == 0 or d.worse():
        return None
    p = "no query differs" if d.p_value is None else f"p = {d.p_value:.2g}"
    return f"not significant ({p}, paired over {d.n} queries): it may be the judge's noise"


def _shared_rows(
    summary: Summary, base: Summary, engine: str
) -> tuple[list[QueryRow], list[QueryRow], str] | None:
    """The engine's per-query rows of tonight and of the baseline over the queries both hold,
    with a note saying so; None when the two hold the same queries (or a summary predates
    per-query rows: its means are all there is)."""
    ours = {r.query_id: r for r in summary.queries if r.engine == engine}
    theirs = {r.query_id: r for r in base.queries if r.engine == engine}
    if not ours or not theirs:
        return None
    same = [q for q in ours if q in theirs and question(ours[q].query) == question(theirs[q].query)]
    if len(same) == len(ours) == len(theirs):
        return None
    if 2 * len(same) < len(ours):  # mostly other queries: their means are all there is
        note = (
            f"means over other queries than the baseline's ({len(same)} of tonight's "
            f"{len(ours)} in both): a change may be the queries'"
        )
        return [], [], note
    note = (
        f"over the {len(same)} queries both runs hold (tonight {len(ours)}, "
        f"the baseline {len(theirs)})"
    )
    return [ours[q] for q in same], [theirs[q] for q in same], note


def write_summary(path: str | Path, summary: Summary) -> Path:
    """Write ``summary`` as JSON (what :func:`load_summary` reads); return the path."""
    write_atomic(path, summary.model_dump_json(indent=2))
    return Path(path)


def load_summary(path: str | Path) -> Summary:
    """A summary.json of this schema or of version 1; anything else is an InputError."""
    name = str(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"), parse_constant=_not_a_number)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"not a JSON summary: {exc}", file=name) from None
    except ValueError as exc:  # NaN or Infinity: judge writes an undefined number as null
        raise InputError(f"{exc}: not a valid judge summary", file=name) from None
    except OSError as exc:
        raise InputError(f"cannot read the summary: {exc.strerror}", file=name) from None
    if not isinstance(data, dict) or "engines" not in data:
        raise InputError("not a judge summary.json (no 'engines')", file=name)
    version = data.get("schema_version", 1)
    if version not in (1, SCHEMA_VERSION):
        msg = f"summary schema version {version!r}; this judge reads 1 and {SCHEMA_VERSION}"
        raise InputError(msg, file=name)
    try:
        data = _from_v1(data) if version == 1 else data
        # Written before the judge's health was measured: unknown, never "healthy".
        data.setdefault("health", JudgeHealth.unknown().model_dump(mode="json"))
        return Summary.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        msg = f"{err['msg']}{more}: not a valid judge summary"
        raise InputError(msg, file=name, field=where or None) from None
    except (ValueError, TypeError, AttributeError) as exc:  # a v1 table of the wrong type
        raise InputError(f"not a version-1 judge summary: {exc}", file=name) from None


def _not_a_number(token: str) -> float:
    raise ValueError(f"it holds {token}, a number no summary holds (undefined is null)")


# --- version-1 files ----------------------------------------------------------------------

# What a version-1 file may leave out, as this schema's empty tables (built from the records'
# fields, so a new field is filled too).
_V1_COUNTS: dict[str, Any] = dict.fromkeys(Counts.model_fields, 0) | {"engines": [], "flagged": {}}
_V1_USAGE: dict[str, Any] = dict.fromkeys(UsageSummary.model_fields, 0) | {"cost_usd": None}
_V1_ENGINE: dict[str, Any] = {"majority_vote": {}, "n_queries": 0, "n_repeats": 0}
_V1_METRIC: dict[str, Any] = dict.fromkeys(MetricSummary.model_fields) | {
    "per_repeat": [],
    "n_defined": 0,
    "n_undefined": 0,
}


def _table(
    data: dict[str, Any], key: str, defaults: dict[str, Any], within: str = ""
) -> dict[str, Any]:
    """``data[key]`` (a table: a JSON object) over ``defaults``; ``within``: where ``data``
    is in the file, for the error (``engines.bm25``)."""
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ValueError(f"'{within}{key}' is not a table")
    return {**defaults, **value}


def _from_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A version-1 summary in this schema's shape, for old files kept as baselines.

    Version 1 kept the policy as top-level "gain" and "unjudged_policy" (its "undefined_ap"
    was not recorded: the default is assumed) and wrote ``"run": {}`` for no run outcome;
    early writers left out "dataset", "gain" and each engine's "majority_vote". What a file
    does not say (a hand-written baseline may give only engine means) is filled with empty
    values: zero counts and tokens, no stability per engine, no checks. Raises ValueError or
    TypeError for a table of the wrong type.
    """
    config = _table(data, "config", {"source": None, "judge": {}, "provider": {}, "rerank": None})
    if config.get("scale") is None:  # the built-in scale the stability names, else binary
        named = str(_table(data, "stability", {}).get("scale"))
        config["scale"] = BUILTIN_SCALES.get(named, Scale.binary)()
    scale = Scale.model_validate(config["scale"])
    counts = _table(data, "counts", _V1_COUNTS)
    config.setdefault("repeats", counts["repeats"] or 1)
    engines = _table(data, "engines", {})
    engines = {engine: _table(engines, engine, _V1_ENGINE, "engines.") for engine in engines}
    for engine, body in engines.items():
        at = f"engines.{engine}."
        metrics = _table(body, "metrics", {}, at)
        body["metrics"] = {m: _table(metrics, m, _V1_METRIC, f"{at}metrics.") for m in metrics}
    names = data.get("metric_names") or sorted({m for b in engines.values() for m in b["metrics"]})
    gain, unjudged = data.get("gain", "linear"), data.get("unjudged_policy", "undefined")
    policy = {"names": names, "gain": gain, "unjudged": unjudged}
    level = "nominal" if scale.is_binary else "ordinal"
    stability = {"scale": scale.name, "alpha_level": level, "alpha": None, "n_boot": 2000}
    return {
        "schema_version": SCHEMA_VERSION,
        "judge_version": data.get("judge_version", "unknown"),
        "created": data.get("created", ""),
        "config": config,
        "dataset": data.get("dataset"),
        "policy": policy,
        "metric_names": names,
        "counts": counts,
        "usage": _table(data, "usage", _V1_USAGE),
        "run": data.get("run") or None,
        "engines": engines,
        "stability": _table(data, "stability", stability | {"seed": 0, "engines": {}}),
        "thresholds": _table(data, "thresholds", {"checks": [], "breached": 0, "breaches": []}),
    }
