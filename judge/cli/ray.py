"""``judge run --ray [ADDRESS] [--shards N]``: the run's arguments for sharding on Ray, and the
choice of runner (judge/run/ray_run.py). Nothing here imports Ray."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Coroutine
from typing import Any

from judge.config import RunConfig
from judge.run.ray_run import check_ray, run_on_ray
from judge.run.runner import RunOutcome

Runner = Callable[..., Coroutine[Any, Any, RunOutcome]]


def add_arguments(run: argparse.ArgumentParser) -> None:
    """``--ray`` and ``--shards`` on ``judge run``."""
    run.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="judge in shards on Ray (pip install 'judge[ray]'): no ADDRESS starts a local "
        "instance, 'auto' or ray://HOST:PORT joins a cluster ([run] ray); after the dataset",
    )
    run.add_argument(
        "--shards",
        type=int,
        metavar="N",
        help="shards for --ray (default: one per CPU of the cluster; [run] ray_shards)",
    )


def ray_overrides(args: argparse.Namespace) -> dict[str, tuple[str, Any]]:
    """The config keys ``--ray`` and ``--shards`` set, each with its flag."""
    out: dict[str, tuple[str, Any]] = {}
    if getattr(args, "ray", None) is not None:
        out["run.ray"] = ("--ray", args.ray)
    if getattr(args, "shards", None) is not None:
        out["run.ray_shards"] = ("--shards", args.shards)
    return out


def on_ray(config: RunConfig, single: Runner) -> Runner:
    """:func:`run_on_ray` when ``config`` asks for Ray (checked here, before anything is paid),
    else ``single``."""
    if config.run.ray is None:
        return single
    check_ray(config)
    return run_on_ray
