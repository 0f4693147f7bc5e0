"""``judge.read_run(out_dir)``: a run directory back in Python, as the tables ``judge_many`` gives,
and engines compared as ``judge compare`` compares them, as a DataFrame.

The results are read as every other reader of a run reads them (one row per (query, engine,
repeat), the last written winning; see :func:`judge.data.results.load_results`) into a
:class:`JudgedRun`, the :class:`~judge.judging.tables.Judgements` of a run on disk, which also
carries the run's summary.json when the run got that far (None for a run that was stopped
before it was summarised).

:func:`compare_engines` (and :meth:`JudgedRun.compare`) is ``judge compare`` on one source
for a notebook: the same :func:`judge.analysis.compare.compare` with the same defaults (a
run's metrics, policy, bootstrap resamples and seed from its summary.json, plus the pooled
metrics; every engine against the first by name), one row per (metric, engine against its
baseline) with the fields of ``judge compare --json``'s ``diffs``. It lives here, not on
:class:`Judgements` itself: judging is stage 5 and the statistics are analysis, stage 7.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from judge.analysis.compare import DEFAULT_POOLED, N_BOOT, N_PERMUTATIONS, PairedDiff, compare
from judge.data.results import load_results, resolve_scale
from judge.errors import InputError
from judge.judging.tables import Judgements, pandas
from judge.report.compared import pooled_counterpart
from judge.report.summary import SUMMARY_FILE, Summary, load_summary
from judge.schema import JudgedQuery, MetricPolicy

__all__ = ["COMPARE_COLUMNS", "JudgedRun", "compare_engines", "read_run"]

# compare_engines' columns with their nullable pandas dtypes: PairedDiff's fields (what
# `judge compare --json` writes under "diffs"), then better / worse / None at p < 0.05.
COMPARE_COLUMNS: dict[str, str] = {
    "metric": "string",
    "engine": "string",
    "baseline": "string",
    "n": "Int64",
    "mean_engine": "Float64",
    "mean_baseline": "Float64",
    "diff": "Float64",
    "ci_low": "Float64",
    "ci_high": "Float64",
    "p_value": "Float64",
    "exact": "boolean",
    "p_floor": "Float64",
    "wins": "Int64",
    "ties": "Int64",
    "losses": "Int64",
    "left_out": "Int64",
    "unlike": "Int64",
    "unjudged_engine": "Int64",
    "unjudged_baseline": "Int64",
    "held_by_one": "Int64",
    "reasons": "boolean",
    "judged_known": "boolean",
    "family": "Int64",
    "baseline_lacks": "boolean",
    "significant": "string",
}


class JudgedRun(Judgements):
    """The judged queries of one run directory (or results file), and its summary if any."""

    def __init__(
        self, judged: Iterable[JudgedQuery], *, path: Path, summary: Summary | None
    ) -> None:
        super().__init__(judged)
        self.path = path
        self.summary = summary

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, from {self.path}>"

    def _notes(self) -> list[str]:
        if self.summary is None:
            return []
        health = self.summary.health
        if not health.known:
            return [f"judge health: {'; '.join(health.notes) or 'unknown'}"]
        # A caption: the verdict on the judge and its caveats; the rest is in summary.json.
        caveats = [f"judge health caveat: {c}" for c in health.caveats]
        if health.degenerate:
            return [f"judge health: unreliable: {' '.join(health.problems)}", *caveats]
        return ["judge health: ok", *caveats]

    def compare(self, baseline: str | None = None, metrics: Sequence[str] | None = None) -> Any:
        """:func:`compare_engines` of this run: what ``judge compare RUN --json`` says."""
        return compare_engines(self, baseline=baseline, metrics=metrics)


def _significant(d: PairedDiff) -> str | None:
    return "better" if d.better() else "worse" if d.worse() else None


def compare_engines(
    judged: Sequence[JudgedQuery],
    *,
    baseline: str | None = None,
    metrics: Sequence[str] | None = None,
) -> Any:
    """Every engine against ``baseline`` (default: the first by name) as a pandas DataFrame,
    one row per (metric, engine): :data:`COMPARE_COLUMNS`, the paired table of ``judge
    compare`` (pairs ``n``, paired ``diff``, its 95% CI, the sign-flip ``p_value``, wins /
    ties / losses) as numbers. ``metrics`` defaults to the run's (a :class:`JudgedRun`'s
    summary, else the metrics the rows carry) and the pooled ones; a JudgedRun's summary also
    gives the policy, bootstrap resamples and seed, as it does for ``judge compare``."""
    pd = pandas("compare_engines", "or judge compare RUN --json for the same numbers")
    if not judged:
        raise InputError("no judged queries to compare")
    summary = judged.summary if isinstance(judged, JudgedRun) else None
    # The policy and scale the metrics were computed by: a run's summary's, else a Judge's.
    made = judged if isinstance(judged, Judgements) else None
    policy = summary.policy if summary else (made.policy if made else None) or MetricPolicy()
    scale = summary.config.scale if summary else (made.scale if made else None)
    if metrics is None:
        names = summary.metric_names if summary else tuple(judged[0].metrics)
        chosen = summary.policy.primary if summary else None
        pooled = [*DEFAULT_POOLED, *pooled_counterpart(names, chosen)]
        metrics = list(dict.fromkeys([*names, *pooled]))
    cmp = compare(
        judged,
        list(metrics),
        scale or resolve_scale(judged, None),
        baseline=baseline,
        n_boot=summary.stability.n_boot if summary else N_BOOT,
        n_permutations=N_PERMUTATIONS,
        seed=summary.stability.seed if summary else 0,
        policy=policy,
    )
    records = [{**d.model_dump(), "significant": _significant(d)} for d in cmp.diffs]
    frame = pd.DataFrame.from_records(records, columns=list(COMPARE_COLUMNS))
    return frame.astype(COMPARE_COLUMNS)


def read_run(out_dir: str | Path) -> JudgedRun:
    """A run directory's results (or a results JSONL's) and, for a directory, its summary.json;
    a run's summary.json stands for its directory (it had been read as results: "1792 input
    errors").

    A missing directory, a directory without results or a malformed line is an InputError
    naming the file (and line); so is a summary.json that is not one.
    """
    path = Path(out_dir)
    if path.name == SUMMARY_FILE and path.is_file():  # its run, as log_to_mlflow takes it
        path = path.parent
    results = load_results(path)
    summary_file = path / SUMMARY_FILE
    summary = load_summary(summary_file) if path.is_dir() and summary_file.is_file() else None
    return JudgedRun(results, path=path, summary=summary)
