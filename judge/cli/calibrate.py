"""``judge calibrate``: the relevance cut on P(relevant) that agrees best with human labels."""

from __future__ import annotations

import argparse
from pathlib import Path

from judge.analysis.calibration import Calibration, calibrate, relevance_pairs
from judge.cli.common import EXIT_OK
from judge.config import load_config, set_config_value
from judge.data.results import load_engines, resolve_scale
from judge.errors import ConfigError


def _ci(ci: tuple[float, float] | None) -> str:
    return f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def describe(cal: Calibration) -> str:
    """The calibration as a few lines for the console."""
    return "\n".join(
        [
            f"{cal.n_pairs} labelled passages over {cal.n_queries} queries "
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


def cmd_calibrate(args: argparse.Namespace) -> int:
    config = load_config(args.config) if args.config else None
    results = load_engines(args.sources)
    scale = resolve_scale(results, config)
    labels = config.label_scale() if config else scale
    cal = calibrate(
        relevance_pairs(results, labels), folds=args.folds, n_boot=args.n_boot, seed=args.seed
    )
    print(describe(cal))
    if args.json:
        Path(args.json).write_text(cal.model_dump_json(indent=2), encoding="utf-8")
    if args.write:
        if config is None or config.source is None:
            raise ConfigError("--write needs --config: the file the threshold is written to")
        if not scale.is_binary:
            raise ConfigError(
                f"the threshold applies to binary judges; this one uses the {scale.name} scale"
            )
        set_config_value(
            Path(config.source), "metrics.relevance_threshold", round(cal.threshold, 4)
        )
        print(f"wrote [metrics] relevance_threshold = {cal.threshold:.4f} to {config.source}")
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``calibrate`` on the ``judge`` parser."""
    c = sub.add_parser(
        "calibrate",
        help="choose the P(relevant) cut that agrees best with human labels (cross-validated)",
    )
    c.add_argument("sources", nargs="+", metavar="RUN_DIR_OR_VERDICTS")
    c.add_argument("--config", help="config giving the scale and label scale; --write target")
    c.add_argument("--write", action="store_true", help="write the threshold into --config")
    c.add_argument("--folds", type=int, default=5, help="cross-validation folds (by query)")
    c.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples for the CIs")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--json", metavar="OUT", help="also write the calibration as JSON")
    c.set_defaults(func=cmd_calibrate)
