"""``judge baseline set RUN_DIR --config CONFIG``: make a finished run the nightly baseline."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from judge.cli.common import EXIT_OK
from judge.config import RunConfig, load_config
from judge.data.lines import write_atomic
from judge.errors import ConfigError, JudgeError

if TYPE_CHECKING:
    from judge.report.summary import Summary


def cmd_baseline(args: argparse.Namespace) -> int:
    from judge.report.finish import summary_state
    from judge.report.summary import SUMMARY_FILE, load_summary

    config = load_config(args.config)
    if config.thresholds.baseline is None:
        raise ConfigError(f"{args.config}: [thresholds] baseline is not set: where should it go?")
    source = Path(args.run_dir) / SUMMARY_FILE
    summary = load_summary(source)  # a readable summary, or one line naming the problem
    if summary_state(Path(args.run_dir)) == "stale" and not args.force:
        raise ConfigError(
            f"{source}: made from other results than the run directory now holds (a run into "
            "it started since and has not finished): finish it first (--force to use the "
            "summary anyway)"
        )
    if summary.run is not None and summary.run.status != "complete" and not args.force:
        raise ConfigError(
            f"{source}: that run is incomplete ({summary.run.reason}); a baseline should be a "
            "finished run (--force to use it anyway)"
        )
    if (made := summary.config.scale.name) != (now := config.scale().name):
        raise ConfigError(
            f"{source}: that run was judged on the '{made}' scale, {args.config} judges on "
            f"'{now}': the nightly drop checks would compare the two scales' metrics"
        )
    means = [m.mean for e in summary.engines.values() for m in e.metrics.values()]
    if not args.force and not any(mean is not None for mean in means):
        c = summary.counts
        raise ConfigError(
            f"{source}: that run has no metric with a value ({c.ok} ok of {c.verdicts} "
            f"verdicts, {c.unparsed} unparsed, {c.failed_words()}): as a baseline it would "
            "leave every drop check unevaluated (--force to use it anyway)"
        )
    _fits_the_nights(summary, config, source, args.config)
    target = Path(config.thresholds.baseline)
    _holds_no_other_file(target, args.config)
    write_atomic(target, source.read_bytes())  # a nightly run sees the old file or the new
    print(f"baseline: {source} -> {target}")
    outcome = summary.outcome
    if outcome is not None and outcome.status not in ("PASSED", "INCOMPLETE"):
        # A new normal may be meant; said, so that it is not taken by mistake.
        why = "; ".join(outcome.reasons[:2]) or "see its report"
        print(f"note: that run {outcome.status} ({why}): later nights compare with it")
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``baseline set`` on the ``judge`` parser."""
    b = sub.add_parser("baseline", help="make a finished run the baseline of a nightly config")
    b.add_argument("action", choices=["set"])
    b.add_argument("run_dir")
    b.add_argument("--config", required=True, help="config whose [thresholds] baseline to set")
    b.add_argument("--force", action="store_true", help="accept an incomplete run")
    b.set_defaults(func=cmd_baseline)


def _holds_no_other_file(target: Path, config: str) -> None:
    """ConfigError when [thresholds] baseline names a file that is not a summary (the config
    itself, a run's verdicts.jsonl): writing the baseline there would replace it (it had,
    exit 0)."""
    from judge.report.summary import load_summary

    if not target.exists():
        return
    if target.is_dir():
        raise ConfigError(f"{config}: [thresholds] baseline {target} is a folder; name a file")
    try:
        load_summary(target)
    except JudgeError:
        raise ConfigError(
            f"{config}: [thresholds] baseline {target} holds a file that is not a summary: "
            "setting the baseline would replace it; point [thresholds] baseline elsewhere"
        ) from None


def _fits_the_nights(summary: Summary, config: RunConfig, source: Path, named: str) -> None:
    """What the next nights would find of this baseline, said now: a note when it holds none
    of the engines of the config's [dataset] path (a night of it would refuse the baseline;
    a night may give another dataset), when its judge is another, or when it lacks a metric
    a drop check reads (that check is skipped)."""
    th = config.thresholds
    if th.max_drop and config.dataset.path:
        from judge.run.queries import load_queries

        engines = sorted({q.engine for q in load_queries(config, None)})
        if engines and not set(engines) & set(summary.engines):  # a night may give another
            print(
                f"note: that run has none of the engines of {named}'s [dataset] path "
                f"({', '.join(engines)}; it has {', '.join(sorted(summary.engines)) or 'none'}): "
                "a night of that dataset would refuse this baseline"
            )
    if (was := summary.config.judge.get("model")) != config.judge.model:
        print(
            f"note: that run was judged by model '{was}', {named} judges with "
            f"'{config.judge.model}': a drop may be the judge's, not the engines'"
        )
    held = {m for e in summary.engines.values() for m in e.metrics}
    if lacking := [m for m in th.max_drop if m not in held]:
        print(
            f"note: that run has no {', '.join(lacking)}: the drop check of it is skipped "
            "each night until a baseline has it"
        )
