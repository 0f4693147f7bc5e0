"""What the ``judge`` commands share: exit codes, ``--set`` / flag overrides of a config, and
the config and judged rows of a command over finished runs."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from judge.config import RunConfig, load_config, parse_override
from judge.data.results import RESULTS_FILE, resolve_scale, split_source
from judge.errors import ConfigError, JudgeError
from judge.schema import JudgedQuery, Scale

if TYPE_CHECKING:
    from judge.run.estimate import Estimate

# What each exit code means (also in the README and `judge run --help`).
EXIT_OK, EXIT_THRESHOLD, EXIT_BAD_INPUT, EXIT_INCOMPLETE, EXIT_BUDGET = 0, 1, 2, 3, 4
EXIT_CODES = """exit codes:
  0  ok: every unit judged, no threshold breached
  1  a threshold in [thresholds] was breached (a metric regression)
  2  bad input or config (one line per problem naming file, line and field); nothing sent
  3  incomplete: interrupted (Ctrl-C, SIGTERM, SIGHUP), provider unavailable, or units left
     in provider errors; rerun the same command to resume
  4  the budget (--max-cost / --max-tokens) was reached; rerun with a larger one to resume"""


def overrides(
    args: argparse.Namespace, flags: dict[str, tuple[str, Any]] | None = None
) -> dict[str, Any]:
    """The config keys ``--set`` and the command's own flags set (``flags``: more of them, a
    config key's flag and value). A flag and a ``--set`` of its key that disagree are
    refused: neither is quietly the one that counts."""
    out: dict[str, Any] = dict(parse_override(s) for s in getattr(args, "set", None) or [])
    given = dict(flags or {})
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
            given[key] = (f"--{attr.replace('_', '-')}", value)
    for key, (flag, value) in given.items():
        if key in out and out[key] != value:
            said = json.dumps(out[key], default=str)
            raise ConfigError(f"{flag} and --set {key}={said} disagree: give the value once")
        out[key] = value
    return out


def judged_input(
    args: argparse.Namespace,
    read: Callable[[], list[JudgedQuery]],
    empty: JudgeError | None = None,
) -> tuple[RunConfig | None, list[JudgedQuery], Scale]:
    """``--config`` (None without it), the judged rows ``read`` returns, and their scale (the
    config's, else the one the rows name); ``empty``, when given, is raised for no rows."""
    config = load_config(args.config) if args.config else None
    results = read()
    if not results and empty is not None:
        raise empty
    return config, results, resolve_scale(results, config)


def print_dry_run(est: Estimate) -> int:
    """What a ``--dry-run`` would send and spend, printed; exit 0."""
    cost = (
        f"${est.cost_usd:.4f}"
        if est.cost_usd is not None
        else "nothing: no LLM call to pay for"
        if est.calls == est.cached_calls
        else "unknown (no [prices] entry)"
    )
    print(
        f"dry run: {est.units} query-repeats to judge, {est.calls} calls "
        f"({est.cached_calls} already cached), ~{est.prompt_tokens} prompt + "
        f"~{est.completion_tokens} completion tokens "
        f"(~{est.tokens_per_passage:.0f} per passage), estimated cost {cost}"
        + (
            f"; verdict calls at most ${est.worst_cost_usd:.4f} if every answer ran to its "
            "max_tokens"
            + (f" and {est.hedge_calls} slow calls were hedged" if est.hedge_calls else "")
            + " (re-asks and retries not counted)"
            if est.worst_cost_usd is not None
            else ""
        )
    )
    if est.blank_passages:
        print(
            f"empty: {est.blank_passages} passage(s) have no text: not relevant, without asking "
            "the judge"
        )
    if est.earlier is not None:
        print(
            f"budget: earlier invocations of this run spent {est.earlier.total} tokens "
            f"({est.earlier.prompt_tokens} + {est.earlier.completion_tokens}); --max-cost "
            "and --max-tokens cap the run, so they count"
        )
    if est.hedge_calls:
        print(
            f"hedging: up to {est.hedge_calls} more requests (a second one for a slow call, "
            "both paid; [run] hedge_share of the requests sent), always within the budget"
        )
    if est.batch_cost_usd is not None and est.batch_worst_usd is not None:
        print(
            f"batch mode: estimated cost ${est.batch_cost_usd:.4f} at batch prices"
            + (" (this run: --batch)" if est.batch else " (with --batch)")
            + f"; the budget must hold the batch's worst case, ${est.batch_worst_usd:.4f}"
        )
    elif est.batch:
        print("batch mode: cost unknown (no [prices] entry for the model)")
    _print_rerank(est)
    return EXIT_OK


def _print_rerank(est: Estimate) -> None:
    """The dry run's rerank calls: a side reranker's, or a cascade's with what it labels."""
    if est.rerank_calls and est.side_rerank:
        print(
            f"rerank: {est.rerank_calls} rerank calls ({est.rerank_cached} already cached) for "
            "the rerank_* metrics, one a query whatever the repeats"
        )
    elif est.rerank_calls:
        bound = (
            "; the LLM figures are an upper bound: a dry run does not call the reranker, and "
            "without its cached scores (for a quantiles or max_error band: all of them) a "
            "passage counts as going to the LLM"
            if est.upper_bound
            else ""
        )
        print(
            f"cascade: {est.rerank_calls} rerank calls ({est.rerank_cached} already cached), "
            f"{est.reranker_passages} passages labelled by the reranker{bound}"
        )


def each_once(command: str, sources: Sequence[str]) -> None:
    """ConfigError when a run (directory or file, ``NAME=`` aside) is given twice, a directory
    and its results file too: its rows would count twice (a calibration of one run given
    twice had fitted on twice its labels)."""

    def read(source: str) -> str:
        path = Path(split_source(source)[1]).resolve()
        return str(path / RESULTS_FILE if path.is_dir() else path)

    if len({read(s) for s in sources}) < len(sources):
        raise ConfigError(f"judge {command}: a source is given twice: {' '.join(sources)}")


def outputs_spare_inputs(
    command: str, sources: Sequence[str], outputs: dict[str, str | None]
) -> None:
    """Refuse an output path that is one of the inputs, or a file a run directory given as
    one is read from (``--json RUN/summary.json`` replaced the run's own summary), one in a
    folder that does not exist, or a folder (both found after the whole comparison had been
    printed)."""
    read: set[Path] = set()
    for source in sources:
        path = Path(split_source(source)[1]).resolve()
        read |= {path, *(path.glob("*") if path.is_dir() else ())}
    for flag, out in outputs.items():
        if out is not None and Path(out).resolve() in read:
            raise ConfigError(f"judge {command} {flag} {out}: that is an input; write elsewhere")
        if out is not None and not Path(out).resolve().parent.is_dir():  # before the work
            raise ConfigError(f"judge {command} {flag} {out}: its folder does not exist")
        if out is not None and Path(out).is_dir():
            raise ConfigError(f"judge {command} {flag} {out}: is a folder; name a file in it")


def whole_number(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``minimum`` (a count of runs, queries, folds);
    argparse says what is wrong in one line and exits 2 otherwise."""

    def read(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return read


# A random seed: numpy's generators take whole numbers >= 0 only (a negative one had passed
# every check, then failed after paying).
seed_arg = whole_number(0)


# Resamples, permutations: at least one.
at_least_one = whole_number(1)
