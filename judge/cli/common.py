"""What the ``judge`` commands share: exit codes and ``--set`` / flag overrides of a config."""

from __future__ import annotations

import argparse
from typing import Any

from judge.config import parse_override

# What each exit code means (also in the README and `judge run --help`).
EXIT_OK, EXIT_THRESHOLD, EXIT_BAD_INPUT, EXIT_INCOMPLETE, EXIT_BUDGET = 0, 1, 2, 3, 4
EXIT_CODES = """exit codes:
  0  ok: every unit judged, no threshold breached
  1  a threshold in [thresholds] was breached (a metric regression)
  2  bad input or config (one line per problem naming file, line and field); nothing sent
  3  incomplete: interrupted (Ctrl-C, SIGTERM, SIGHUP), provider unavailable, or units left
     in provider errors; rerun the same command to resume
  4  the budget (--max-cost / --max-tokens) was reached; rerun with a larger one to resume"""


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = dict(parse_override(s) for s in getattr(args, "set", None) or [])
    mapping = {
        "repeats": "run.repeats",
        "sample": "run.sample",
        "seed": "run.seed",
        "max_cost": "run.max_cost",
        "max_tokens": "run.max_tokens",
        "concurrency": "run.concurrency",
        "cache": "run.cache",
        "no_charts": "run.charts",
        "dataset": "dataset.path",
    }
    for attr, key in mapping.items():
        value = getattr(args, attr, None)
        if value is not None:
            out[key] = value
    return out
