"""Nugget files: one :class:`~judge.aspects.NuggetSet` per line (JSONL), for people to read,
edit and give back.

A line looks like::

    {"query_id": "q1", "query": "what is rust?", "source": "human",
     "nuggets": [{"id": "n1", "text": "Rust is a systems programming language", "vital": true}]}

:func:`read_nuggets` checks every line and reports each problem as ``file:line: field``
(InputError, exit 2), all of them at once: a line that is not a nugget set, a query id given
twice, a nugget id given twice within a set, a set without nuggets. :func:`write_nuggets`
replaces a file atomically (a reader sees the old file or the new one).
"""

from __future__ import annotations

import os
import tempfile
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import ValidationError

from judge.aspects import NuggetSet
from judge.data.lines import Sink, json_lines
from judge.schema import Query

__all__ = ["NUGGETS_FILE", "given_sets", "read_nuggets", "same_query", "write_nuggets"]

# The nugget set a run used, written into its run directory.
NUGGETS_FILE = "nuggets.jsonl"


def read_nuggets(path: str | Path) -> dict[str, NuggetSet]:
    """Every nugget set in a nugget file, by query id, in file order."""
    name, sink = str(path), Sink()
    sets: dict[str, NuggetSet] = {}
    for n, value in json_lines(Path(path), sink):
        try:
            found = NuggetSet.model_validate(value)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(part) for part in err["loc"]) or None
            sink.error(f"not a nugget set: {err['msg']}", name, n, field)
            continue
        ids = [nugget.id for nugget in found.nuggets]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if not ids:
            sink.error("no nuggets (a set needs at least one)", name, n, "nuggets")
        elif twice:
            sink.error(f"nugget id(s) given twice: {', '.join(twice)}", name, n, "nuggets.id")
        elif found.query_id in sets:
            sink.error(f"query '{found.query_id}' has a set already", name, n, "query_id")
        else:
            sets[found.query_id] = found
    sink.raise_if_any()
    return sets


def write_nuggets(path: str | Path, sets: Iterable[NuggetSet]) -> Path:
    """Write ``sets`` as a nugget file, replacing ``path`` atomically; return the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            for found in sets:
                fh.write(found.model_dump_json(exclude_defaults=False).encode("utf-8") + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


def same_query(a: str, b: str) -> bool:
    """Whether two query texts are the same query (case, width and spacing aside)."""
    return " ".join(unicodedata.normalize("NFKC", a).casefold().split()) == " ".join(
        unicodedata.normalize("NFKC", b).casefold().split()
    )


def given_sets(
    path: str | Path | None, run_dir: Path | None, queries: Sequence[Query]
) -> dict[str, NuggetSet]:
    """The nugget sets a run starts from: the file ``[nuggets] path`` names, then the one an
    earlier invocation of the run wrote into ``run_dir`` (which wins: every unit of one run
    uses one set). A set for a query id whose text in ``queries`` is another query's is an
    InputError (a stale file), raised before anything is asked."""
    sets: dict[str, tuple[str, NuggetSet]] = {}
    written = None if run_dir is None else run_dir / NUGGETS_FILE
    for file in (path, written if written is not None and written.exists() else None):
        if file:
            sets |= {qid: (str(file), found) for qid, found in read_nuggets(file).items()}
    sink = Sink()
    texts = {q.query_id: q.query for q in queries}
    for qid, (file, found) in sets.items():
        if qid in texts and not same_query(found.query, texts[qid]):
            sink.error(
                f"query '{qid}': the set is for {found.query!r}, the dataset asks {texts[qid]!r}",
                file,
                None,
                "query",
            )
    sink.raise_if_any()
    return {qid: found for qid, (_, found) in sets.items()}
