"""The judged pool: for each (query id, repeat), every engine's judged passages, a passage being
the same when it shares an id or its normalised text (NFKC, casefolded, whitespace collapsed).
Two uses of one pool: pooled metrics, whose ideal ranking comes from it, and verdicts borrowed
from it for a ranked list no one judged (TREC-style pooled evaluation at no cost).

Pooled metrics (``pooled_ndcg``, ``pooled_ndcg@k``, ``pooled_recall@k``) are computed per
(query id, repeat) over the pool of every engine's ``ok`` verdicts; a pooled passage's grade
is the one most of its verdicts gave it, a tie going to the lower (as qrels.txt grades it, so
trec_eval over qrels.txt gives these numbers). Then::

    pooled_ndcg@k   = DCG@k / IDCG@k, DCG over the engine's list (each passage at the
                      pool's grade), IDCG over the pool's
                      grades sorted descending (gain rel or 2^rel - 1, discount log2(i + 1))
    pooled_recall@k = |relevant pooled passages in the engine's top k| / |relevant in pool|

A passage repeated lower in an engine's list (same id or text) gains nothing, so an engine
cannot pad its score with duplicates and an engine that found fewer good passages than the
pool holds cannot reach 1. Both are undefined when the pool holds nothing graded above 0
(nothing relevant, for recall). Unparsed/error verdicts follow the ``unjudged`` policy.

Borrowed verdicts (:func:`borrow_verdicts`): a never-judged ranked list takes, per passage, the
highest-graded ``ok`` verdict the judged engines' runs hold for the same passage in the same
repeat. A passage no judged engine returned stays unjudged (an ``error`` verdict saying so),
so its query's metrics are undefined, never 0.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from judge.data.results import majority_grade
from judge.errors import ConfigError
from judge.metrics.compute import Gain, metrics_for_queries, normalise_text
from judge.schema import JudgedQuery, MetricPolicy, Query, Scale, Verdict

__all__ = [
    "DEFAULT_POOLED",
    "POOLED_BASES",
    "PassagePool",
    "borrow_verdicts",
    "parse_pooled",
    "pooled_metrics",
]

log = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float64]
POOLED_BASES = ("pooled_ndcg", "pooled_recall")
DEFAULT_POOLED = ("pooled_ndcg", "pooled_ndcg@5", "pooled_recall@5")
_POOLED = re.compile(r"^(pooled_ndcg|pooled_recall)(?:@(\d+))?$")


def parse_pooled(name: str) -> tuple[str, int | None] | None:
    """``"pooled_ndcg@5" -> ("pooled_ndcg", 5)``; None when ``name`` is not a pooled metric."""
    match = _POOLED.match(name)
    if not match:
        return None
    k = None if match.group(2) is None else int(match.group(2))
    if k is not None and k < 1:
        raise ConfigError(f"metric '{name}': the cutoff after '@' must be at least 1")
    return match.group(1), k


def id_scope(query: Query) -> str:
    """Where ``query``'s passage ids name a passage: everywhere (""), or, for ids that are
    only its ranks ("1", "2", ... as a dataset without ids is numbered), its engine's list
    alone: rank 1 of one engine is not rank 1 of another (pooling them by id had merged
    other passages, and their opposite verdicts tied to the lower grade)."""
    ranks = all(p.id == str(i) for i, p in enumerate(query.passages, start=1))
    return query.engine if ranks and query.passages else ""


class PassagePool:
    """Union-find over passage keys: a passage's id and its normalised text are one passage;
    an id in a ``scope`` (:func:`id_scope`) only within it."""

    def __init__(self) -> None:
        self.parent: dict[tuple[str, str], tuple[str, str]] = {}

    def find(self, key: tuple[str, str]) -> tuple[str, str]:
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def add(self, passage_id: str, text: str, scope: str = "") -> None:
        root = self.root(passage_id, scope)
        norm = normalise_text(text)
        if norm:
            self.parent[root] = self.find(("text", norm))

    def root(self, passage_id: str, scope: str = "") -> tuple[str, str]:
        return self.find(("id", f"{scope}\x1f{passage_id}" if scope else passage_id))


def _gain(grades: Sequence[float], gain: Gain) -> FloatArray:
    values = np.asarray(grades, dtype=np.float64)
    return values if gain == "linear" else np.exp2(values) - 1.0


def _discounted(gains: FloatArray, k: int | None) -> float:
    top = gains[:k]
    return float((top / np.log2(np.arange(2, top.size + 2))).sum())


def _build_pool(rows: Sequence[JudgedQuery]) -> tuple[PassagePool, dict[tuple[str, str], int]]:
    pool = PassagePool()
    for jq in rows:
        for p in jq.query.passages:
            pool.add(p.id, p.text, id_scope(jq.query))
    votes: dict[tuple[str, str], list[int]] = {}
    for jq in rows:
        scope = id_scope(jq.query)
        for v in jq.verdicts:
            if v.status == "ok" and v.grade is not None:
                votes.setdefault(pool.root(v.passage_id, scope), []).append(v.grade)
    return pool, {root: majority_grade(grades) for root, grades in votes.items()}


def pooled_metrics(
    results: Sequence[JudgedQuery],
    names: Sequence[str],
    scale: Scale,
    policy: MetricPolicy = MetricPolicy(),
) -> list[dict[str, float | None]]:
    """Pooled metric values (None = undefined) for each result, in order; see the module doc."""
    parsed = [(name, parse_pooled(name)) for name in names]
    groups: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, jq in enumerate(results):
        groups[(jq.query.query_id, jq.repeat)].append(i)
    out: list[dict[str, float | None]] = [{} for _ in results]
    for members in groups.values():
        pool, pooled = _build_pool([results[i] for i in members])
        ideal = _gain(sorted(pooled.values(), reverse=True), policy.gain)
        n_relevant = sum(1 for g in pooled.values() if scale.relevant(g))
        for i in members:
            scope = id_scope(results[i].query)
            ordered = sorted(results[i].verdicts, key=lambda v: v.rank)
            failed = any(v.status != "ok" for v in ordered)
            grades: list[int] = []
            hits: list[bool] = []
            seen: set[tuple[str, str]] = set()
            for v in ordered:
                if v.status != "ok" or v.grade is None:
                    continue
                root = pool.root(v.passage_id, scope)
                fresh = root not in seen
                seen.add(root)
                grade = pooled[root]  # the pool's grade, as trec_eval reads qrels.txt
                grades.append(grade if fresh else 0)
                hits.append(fresh and scale.relevant(grade))
            for name, spec in parsed:
                if spec is None:
                    raise ConfigError(f"'{name}' is not a pooled metric")
                base, k = spec
                value: float | None = None
                if not (failed and policy.unjudged == "undefined"):
                    if base == "pooled_ndcg":
                        ideal_dcg = _discounted(ideal, k)
                        dcg = _discounted(_gain(grades, policy.gain), k)
                        value = dcg / ideal_dcg if ideal_dcg > 0 else None
                    elif n_relevant:
                        value = sum(hits[:k]) / n_relevant
                out[i][name] = value
    return out


UNJUDGED = "not judged: no judged engine returned this passage (judge this engine to score it)"


def borrow_verdicts(
    queries: Sequence[Query],
    judged: Sequence[JudgedQuery],
    metrics: Sequence[str],
    scale: Scale,
    policy: MetricPolicy = MetricPolicy(),
) -> list[JudgedQuery]:
    """Judged rows for never-judged ranked lists, from the verdicts ``judged`` holds.

    Per (query id, repeat) of ``judged``, a passage takes the highest-graded ok verdict given
    to the same passage (id or normalised text); others get an ``error`` verdict (unjudged).
    Queries with no judged rows at all are skipped with a warning.
    """
    groups: dict[tuple[str, int], list[JudgedQuery]] = {}
    for jq in judged:
        groups.setdefault((jq.query.query_id, jq.repeat), []).append(jq)
    out: list[JudgedQuery] = []
    for query in queries:
        repeats = sorted(r for qid, r in groups if qid == query.query_id)
        if not repeats:
            log.warning(
                "query '%s' (%s): no judged rows to borrow from; skipped",
                query.query_id,
                query.engine,
            )
        for repeat in repeats:
            pool, ours = PassagePool(), id_scope(query)
            for p in query.passages:
                pool.add(p.id, p.text, ours)
            for jq in groups[(query.query_id, repeat)]:
                for p in jq.query.passages:
                    pool.add(p.id, p.text, id_scope(jq.query))
            best: dict[tuple[str, str], Verdict] = {}
            for jq in groups[(query.query_id, repeat)]:
                scope = id_scope(jq.query)
                for v in jq.verdicts:
                    root = pool.root(v.passage_id, scope)
                    if v.status == "ok" and (v.grade or 0) >= (
                        best[root].grade or 0 if root in best else -1
                    ):
                        best[root] = v
            verdicts = tuple(
                best[pool.root(p.id, ours)].model_copy(
                    update={"passage_id": p.id, "rank": rank, "cached": True}
                )
                if pool.root(p.id, ours) in best
                else Verdict(passage_id=p.id, rank=rank, status="error", error=UNJUDGED, attempts=0)
                for rank, p in enumerate(query.passages, start=1)
            )
            out.append(
                JudgedQuery(
                    query=query, repeat=repeat, scale=scale.name, verdicts=verdicts, metrics={}
                )
            )
    plain = [m for m in metrics if parse_pooled(m) is None]
    values = metrics_for_queries(plain, [(jq.query, jq.verdicts) for jq in out], scale, policy)
    return [jq.model_copy(update={"metrics": row}) for jq, row in zip(out, values, strict=True)]
