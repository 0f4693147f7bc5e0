"""What the report stage would fail on once a run is paid for, checked before it is: a run
history that cannot record the run, the regression baseline read as the summary reads it,
and the files a finished run writes into its directory.

``judge run`` and ``judge validate`` give :func:`report_problems` to judge/run/preflight.py.
It is its own module so a run's first request does not wait for the report stage's imports
(the summary's analyses, the report's renderers): those load while the first answers are
awaited, and the summary's reader is imported here only for a run with a baseline.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from judge.config import RunConfig
from judge.errors import InputError
from judge.report.history import history_problem
from judge.run.resume import FINISH_FILES, RUN_FILE
from judge.schema import Query

log = logging.getLogger(__name__)


def report_problems(
    config: RunConfig, queries: Sequence[Query], first_night: bool, out_dir: Path | None = None
) -> list[str]:
    """What would fail only once a run is paid for, found before it is (``judge run`` and
    ``judge validate`` give this to judge/run/preflight.py): a run history that cannot
    record the run, the regression baseline read as the summary reads it, and the files the
    run writes into ``out_dir`` (when given)."""
    where = config.source or "<config>"
    problems = _baseline_problems(config, queries, first_night)
    if problem := history_problem(config.history_path()):
        problems.append(f"{where}: run.history: {problem}")
    return problems + (_output_problems(out_dir) if out_dir is not None else [])


# What finishing a run writes into its directory (report/summary.py, report/document.py,
# report/finish.py own these names; tests/test_finished_dir.py holds them to it). Named here,
# not imported: this module stays light.
WRITTEN = FINISH_FILES


def _output_problems(out_dir: Path) -> list[str]:
    """A file the finished run would write that is a folder (found after paying, else), or a
    user's file where a run would write one, in a directory no run was started in (no
    run.json): it would be replaced without a word (a TREC user's own qrels.txt)."""
    problems = [
        f"{out_dir / name}: is a directory, where the run writes its {name}"
        for name in WRITTEN
        if (out_dir / name).is_dir()
    ]
    if (out_dir / RUN_FILE).exists():
        return problems
    theirs = [name for name in WRITTEN if (out_dir / name).is_file()]
    if theirs:
        problems.append(
            f"{out_dir}: holds {', '.join(theirs)}, which no judge run there wrote (it has no "
            f"{RUN_FILE}): a run would replace them; use another --out"
        )
    return problems


def _baseline_problems(config: RunConfig, queries: Sequence[Query], first_night: bool) -> list[str]:
    """The baseline the drop checks compare with, read as the summary will read it; and one
    that names none of the dataset's engines (every drop check would be skipped: a renamed
    engine, or the wrong file)."""
    th = config.thresholds
    if not th.max_drop:
        if th.baseline is not None and not Path(th.baseline).is_file() and not first_night:
            log.warning(
                "%s: thresholds.baseline not found: the report compares with no baseline (and "
                "without thresholds.max_drop nothing is checked against one)",
                th.baseline,
            )
        return []
    where = config.source or "<config>"
    if th.baseline is None:
        return [f"{where}: thresholds.max_drop is set but thresholds.baseline is not"]
    path = Path(th.baseline)
    if not path.exists():
        if first_night:
            log.warning("%s: no baseline yet (first night): drop checks skipped", path)
            return []
        return [
            f"{path}: thresholds.baseline not found; the drop checks need it (pass "
            "--first-night on the first run, then `judge baseline set RUN_DIR --config "
            "CONFIG`)"
        ]
    from judge.report.summary import load_summary  # the analyses' records: only with a baseline

    try:
        base = load_summary(path)
    except InputError as exc:
        return [f"{exc} (thresholds.baseline)"]
    if (made := base.config.scale.name) != (now := config.scale().name):
        if first_night:  # the summary skips the drop checks, saying why
            log.warning("%s: a baseline of the '%s' scale: drop checks skipped", path, made)
            return []
        return [
            f"{path}: thresholds.baseline was judged on the '{made}' scale, this run judges on "
            f"'{now}': its metrics do not compare (pass --first-night to skip the drop checks "
            "tonight, then judge baseline set RUN_DIR --config CONFIG)"
        ]
    if (was := base.config.judge.get("model")) != config.judge.model:
        log.warning(
            "%s: thresholds.baseline was judged by model '%s', this run by '%s': a drop may be "
            "the judge's, not the engines'",
            path,
            was,
            config.judge.model,
        )
    engines = sorted({q.engine for q in queries})
    if engines and not set(engines) & set(base.engines):
        return [
            f"{path}: thresholds.baseline has none of the dataset's engines "
            f"({', '.join(engines)}; it has: {', '.join(sorted(base.engines)) or 'none'}): no "
            "drop check could be made (set a new baseline, or pass --first-night to skip them)"
        ]
    return []
