"""Which queries a run judges: the dataset named on the command line or in [dataset], and a
reproducible sample of query ids (every engine's row of a sampled id comes along)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path

from judge.config import RunConfig
from judge.data.datasets import read_queries, read_trec_run
from judge.data.lines import capped
from judge.errors import ConfigError
from judge.schema import Query

log = logging.getLogger(__name__)


def load_queries(
    config: RunConfig, dataset: str | None = None, *, said: bool = False
) -> list[Query]:
    """The dataset named on the command line, else the config's [dataset]; its notes (a
    passage cut, a passage with no text) logged, unless ``said`` already (judge validate)."""
    ds = config.dataset
    if ds.trec_run and ds.path and dataset is None:  # a command line's dataset is judged
        raise ConfigError(
            f"{config.source}: [dataset] gives both path and trec_run: give one (which to judge?)"
        )
    if ds.trec_run and dataset is not None:
        log.warning(
            "the dataset on the command line (%s) is judged, not [dataset] trec_run (%s)",
            dataset,
            ds.trec_run,
        )
    if ds.trec_run and dataset is None:
        if not (ds.passage_store and ds.queries):
            raise ConfigError(
                f"{config.source}: [dataset] trec_run needs passage_store and queries"
            )
        trec = read_trec_run(
            ds.trec_run, ds.passage_store, ds.queries, max_passage_chars=ds.max_passage_chars
        )
        for problem in capped(trec.problems):  # a passage cut to the limit, no lines, ...
            log.warning("%s", problem)
        return list(trec.queries)
    path = dataset or ds.path
    if path is None:
        raise ConfigError(
            f"{config.source}: no dataset: give one on the command line or [dataset] path"
        )
    if dataset is None and not Path(path).exists():  # the config's: say which key, and how
        raise ConfigError(
            f"{config.source}: [dataset] path: {path}: no such file (a relative path is taken "
            "from the config's own folder)"
        )
    try:
        report = read_queries(
            path, columns=ds.columns or None, max_passage_chars=ds.max_passage_chars
        )
    except ConfigError as exc:  # the config's [dataset] settings: named by the config's path
        raise ConfigError(f"{config.source or '<config>'}: dataset.{exc}") from None
    for problem in () if said else capped(report.problems):
        log.warning("%s", problem)
    return list(report.queries)


def sample_queries(queries: Sequence[Query], n: int, seed: int) -> list[Query]:
    """A reproducible sample of n query ids; every engine's row of a sampled id comes along.

    The ids whose seeded hash ranks lowest: as a nightly dataset gains or loses queries, an id
    stays sampled unless a new one outranks it, so the drop checks compare mostly the same
    queries night after night (a seeded shuffle of the sorted ids swapped 9 of 20 when 10 ids
    were added)."""
    if n <= 0:
        return list(queries)
    ids = {q.query_id for q in queries}
    if n >= len(ids):
        return list(queries)
    chosen = set(sorted(ids, key=lambda qid: _rank(seed, qid))[:n])
    return [q for q in queries if q.query_id in chosen]


def _rank(seed: int, query_id: str) -> bytes:
    return hashlib.blake2b(f"{seed}\x1f{query_id}".encode(), digest_size=8).digest()
