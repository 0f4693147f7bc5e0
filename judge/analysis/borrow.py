"""Pooled evaluation at no cost: a never-judged ranked list takes the verdicts other engines'
runs already hold for the same passage (same id or normalised text, same repeat).

A passage no judged engine returned stays unjudged (an ``error`` verdict saying so), so its
query's metrics are undefined, never 0.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from judge.analysis.compare import PassagePool, parse_pooled
from judge.metrics.compute import metrics_for_queries
from judge.schema import JudgedQuery, MetricPolicy, Query, Scale, Verdict

log = logging.getLogger(__name__)
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
            pool = PassagePool()
            for p in [
                *query.passages,
                *(p for jq in groups[(query.query_id, repeat)] for p in jq.query.passages),
            ]:
                pool.add(p.id, p.text)
            best: dict[tuple[str, str], Verdict] = {}
            for jq in groups[(query.query_id, repeat)]:
                for v in jq.verdicts:
                    root = pool.root(v.passage_id)
                    if v.status == "ok" and (v.grade or 0) >= (
                        best[root].grade or 0 if root in best else -1
                    ):
                        best[root] = v
            verdicts = tuple(
                best[pool.root(p.id)].model_copy(
                    update={"passage_id": p.id, "rank": rank, "cached": True}
                )
                if pool.root(p.id) in best
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
