"""``judge calibrate``: the relevance cut on P(relevant) (binary judges), or the cut points
on the expected grade (graded judges), that agree best with human labels."""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from judge.analysis.calibration import (
    Calibration,
    GradeCalibration,
    calibrate,
    calibrate_grades,
    grade_pairs,
    relevance_pairs,
)
from judge.cli.common import (
    EXIT_OK,
    at_least_one,
    each_once,
    judged_input,
    outputs_spare_inputs,
    seed_arg,
    whole_number,
)
from judge.config import RunConfig, set_config_value
from judge.data.results import load_engines
from judge.errors import ConfigError
from judge.schema import JudgedQuery, Scale


def _ci(ci: tuple[float, float] | None) -> str:
    return f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def describe(cal: Calibration) -> str:
    """The calibration as a few lines for the console."""
    return "\n".join(
        [
            f"{cal.n_pairs} labelled verdicts (a passage once per repeat) over "
            f"{cal.n_queries} queries "
            f"({cal.folds}-fold cross-validation by query; 95% CIs by query bootstrap)",
            f"AUC of P(relevant): {_num(cal.auc)}{_ci(cal.auc_ci)}",
            f"kappa of the judge's labels (cut at 0.5): {_num(cal.kappa_before)}"
            f"{_ci(cal.kappa_before_ci)}",
            f"kappa at a calibrated cut, cross-validated: {_num(cal.kappa_after)}"
            f"{_ci(cal.kappa_after_ci)}",
            f"threshold: relevant when P(relevant) >= {cal.threshold:.4f} "
            f"(in-sample kappa {_num(cal.kappa_in_sample)})",
        ]
    )


def describe_grades(cal: GradeCalibration) -> str:
    """The graded calibration as a few lines for the console."""
    cuts = ", ".join(f"{c:.4f}" for c in cal.cuts)
    return "\n".join(
        [
            f"{cal.n_pairs} labelled verdicts (a passage once per repeat) over "
            f"{cal.n_queries} queries "
            f"({cal.folds}-fold cross-validation by query; 95% CIs by query bootstrap)",
            f"AUC of the expected grade, for relevance: {_num(cal.auc)}{_ci(cal.auc_ci)}",
            f"weighted kappa of the judge's labels: {_num(cal.kappa_before)}"
            f"{_ci(cal.kappa_before_ci)}",
            f"weighted kappa of the expected grade rounded: {_num(cal.kappa_rounded)}",
            f"weighted kappa at calibrated cut points, cross-validated: {_num(cal.kappa_after)}"
            f"{_ci(cal.kappa_after_ci)}",
            f"cut points on the expected grade (grades {', '.join(map(str, cal.grades))}): "
            f"{cuts} (in-sample weighted kappa {_num(cal.kappa_in_sample)})",
        ]
    )


def _written(cuts: tuple[float, ...]) -> list[float]:
    """The cuts to 4 decimals, unless that would make two of them equal."""
    short = [round(c, 4) for c in cuts]
    return short if all(a < b for a, b in itertools.pairwise(short)) else list(cuts)


def _graded(
    args: argparse.Namespace, config: RunConfig | None, results: list[JudgedQuery], scale: Scale
) -> int:
    """``judge calibrate`` for a graded judge: cut points, written as ``grade_cuts``."""
    labels = config.comparable_label_scale() if config else scale
    cal = calibrate_grades(
        grade_pairs(results, labels), labels, folds=args.folds, n_boot=args.n_boot, seed=args.seed
    )
    cuts = _written(cal.cuts)
    return _emit(args, config, cal, describe_grades(cal), ("grade_cuts", cuts, f"{cuts}"))


# What --write puts into the config, by [metrics] key, for the message when it cannot.
_WRITTEN = {"grade_cuts": "cut points are", "relevance_threshold": "threshold is"}


def _emit(
    args: argparse.Namespace,
    config: RunConfig | None,
    cal: Calibration | GradeCalibration,
    text: str,
    setting: tuple[str, float | list[float], str],
) -> int:
    """Print ``text``, write ``cal`` as JSON (``--json``) and, with ``--write``, the setting
    (a ``[metrics]`` key, its value, the value as printed) into the config."""
    print(text)
    if args.json:
        Path(args.json).write_text(cal.model_dump_json(indent=2), encoding="utf-8")
    if args.write:
        key, value, shown = setting
        if config is None or config.source is None:
            what = _WRITTEN[key]
            raise ConfigError(f"--write needs --config: the file the {what} written to")
        if cal.kappa_after is None or cal.kappa_after <= 0:
            raise ConfigError(
                f"not written to {config.source}: at its calibrated cut the judge agrees with "
                f"the human labels no better than chance (cross-validated kappa "
                f"{_num(cal.kappa_after)}); check the labels and the judge first"
            )
        before = cal.kappa_before
        if before is not None and cal.kappa_after < before and not args.force:
            raise ConfigError(
                f"not written to {config.source}: the calibrated cut agrees with the human "
                f"labels less than the current one does (cross-validated kappa "
                f"{_num(cal.kappa_after)} against {_num(before)}); --force writes it anyway"
            )
        set_config_value(Path(config.source), f"metrics.{key}", value)
        print(f"wrote [metrics] {key} = {shown} to {config.source}")
    return EXIT_OK


def cmd_calibrate(args: argparse.Namespace) -> int:
    each_once("calibrate", args.sources)
    # Neither the runs read nor the config (read, and written by --write) is an output.
    inputs = [*args.sources, *([args.config] if args.config else [])]
    outputs_spare_inputs("calibrate", inputs, {"--json": args.json})
    config, results, scale = judged_input(args, lambda: load_engines(args.sources))
    if config is None:
        _labels_fit(results, scale)
    if not scale.is_binary:
        return _graded(args, config, results, scale)
    labels = config.label_scale() if config else scale
    cal = calibrate(
        relevance_pairs(results, labels), folds=args.folds, n_boot=args.n_boot, seed=args.seed
    )
    threshold = ("relevance_threshold", round(cal.threshold, 4), f"{cal.threshold:.4f}")
    return _emit(args, config, cal, describe(cal), threshold)


def _labels_fit(results: list[JudgedQuery], scale: Scale) -> None:
    """Without --config the human labels are read on the judge's scale: labels above its top
    grade (the 0-3 of TREC on a binary judge) would be read as yes or no, and the cut fitted
    to that; refused instead, saying what to pass."""
    top = max((g for jq in results for g in (jq.query.labels or {}).values()), default=None)
    most = max(label.grade for label in scale.labels)
    if top is not None and top > most:
        raise ConfigError(
            f"judge calibrate: human labels go up to {top}, the judge's '{scale.name}' scale to "
            f"{most}: pass --config with the run's config ([dataset] label_scale says how to "
            "read them)"
        )


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``calibrate`` on the ``judge`` parser."""
    c = sub.add_parser(
        "calibrate",
        help="choose the P(relevant) cut (graded judges: the cut points on the expected grade) "
        "that agrees best with human labels (cross-validated)",
    )
    c.add_argument("sources", nargs="+", metavar="RUN_DIR_OR_VERDICTS")
    c.add_argument("--config", help="config giving the scale and label scale; --write target")
    c.add_argument(
        "--write", action="store_true", help="write the threshold (or grade_cuts) into --config"
    )
    c.add_argument(
        "--folds", type=whole_number(2), default=5, help="cross-validation folds (by query)"
    )
    c.add_argument(
        "--n-boot", type=at_least_one, default=1000, help="bootstrap resamples for the CIs"
    )
    c.add_argument("--seed", type=seed_arg, default=0)
    c.add_argument(
        "--force",
        action="store_true",
        help="--write even a cut that agrees with the labels less than the current one",
    )
    c.add_argument("--json", metavar="OUT", help="also write the calibration as JSON")
    c.set_defaults(func=cmd_calibrate)
