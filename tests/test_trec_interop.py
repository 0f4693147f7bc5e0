"""TREC interop: our qrels and runs through ir_measures (pytrec_eval) give our numbers, and a
TREC run joins a comparison as an engine."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ir_measures
import pytest
from ir_measures import AP, Measure, P, R, nDCG

from judge.analysis.compare import compare
from judge.analysis.judged_pool import borrow_verdicts, pooled_metrics
from judge.data.datasets import read_trec_run, write_qrels
from judge.metrics.compute import metrics_for_queries
from judge.schema import JudgedQuery, Scale
from tests.test_compare import judged, run_cli, sample_results, write_run

DATA = Path(__file__).resolve().parent.parent / "datasets"
GRADED = Scale.graded()


def write_trec_run(
    path: Path, rows: Sequence[JudgedQuery], tag: str
) -> dict[str, dict[str, float]]:
    """A TREC run file from ranked lists: score n - rank, so the ranking survives sorting."""
    run: dict[str, dict[str, float]] = {}
    with open(path, "w", encoding="utf-8") as fh:
        for jq in rows:
            n = len(jq.query.passages)
            for rank, p in enumerate(jq.query.passages, 1):
                fh.write(f"{jq.query.query_id} Q0 {p.id} {rank} {n - rank}.0 {tag}\n")
                run.setdefault(jq.query.query_id, {})[p.id] = float(n - rank)
    return run


def trec(qrels: Path, run: Path, measures: list[Measure]) -> dict[tuple[str, str], float]:
    """Per (query id, measure name), from the files as written (read by ir_measures)."""
    read_qrels: Callable[[str], Any] = ir_measures.read_trec_qrels
    read_run: Callable[[str], Any] = ir_measures.read_trec_run
    values = ir_measures.pytrec_eval.iter_calc(measures, read_qrels(str(qrels)), read_run(str(run)))
    return {(m.query_id, str(m.measure)): m.value for m in values}


@pytest.mark.parametrize("scale", [Scale.graded(), Scale.binary()], ids=["graded", "binary"])
def test_trec_eval_gives_our_ap_ndcg_and_precision(tmp_path: Path, scale: Scale) -> None:
    rows = [jq for jq in sample_results(repeats=1, scale=scale) if jq.query.engine == "bm25"]
    assert write_qrels(tmp_path / "qrels.txt", rows) > 0
    write_trec_run(tmp_path / "run.txt", rows, "bm25")
    t = scale.threshold
    names = {"ap": AP(rel=t), "ndcg@5": nDCG @ 5, "precision@5": P(rel=t) @ 5}
    theirs = trec(tmp_path / "qrels.txt", tmp_path / "run.txt", list(names.values()))
    ours = metrics_for_queries(list(names), [(jq.query, jq.verdicts) for jq in rows], scale)
    checked = 0
    for jq, values in zip(rows, ours, strict=True):
        for name, measure in names.items():
            other = theirs[(jq.query.query_id, str(measure))]
            mine = values[name]
            if mine is None:
                # Undefined for us (nothing relevant / nothing graded), 0 for trec_eval.
                assert other == 0.0
                continue
            assert mine == pytest.approx(other, abs=1e-9), (jq.query.query_id, name)
            checked += 1
    assert checked >= 2 * len(rows)


def test_pooled_ndcg_and_recall_are_trec_eval_over_the_pooled_qrels(tmp_path: Path) -> None:
    """With qrels pooled from both engines, trec_eval's nDCG@5 and R@5 are our pooled metrics
    (the sample has no passage under two ids, so pooling by id alone is the same pool), also
    where the engines' verdicts on one passage differ: both take the grade most verdicts gave,
    a tie going to the lower (the pool had taken the highest, qrels.txt the lower)."""
    rows = sample_results(repeats=1, nudge=False)
    shared = {
        (jq.query.query_id, v.passage_id): v.grade
        for jq in rows
        if jq.query.engine == "dense"
        for v in jq.verdicts
    }
    changed = 0
    for i, jq in enumerate(rows):
        if jq.query.engine != "bm25":
            continue
        verdicts = list(jq.verdicts)
        for j, v in enumerate(verdicts):
            other = shared.get((jq.query.query_id, v.passage_id))
            if other is not None and changed < 3:  # this engine's verdict says otherwise
                grade = 3 if other < 3 else 0
                verdicts[j] = v.model_copy(update={"grade": grade, "label": str(grade)})
                changed += 1
        rows[i] = jq.model_copy(update={"verdicts": tuple(verdicts)})
    assert changed == 3
    write_qrels(tmp_path / "qrels.txt", rows)
    names = ["pooled_ndcg@5", "pooled_recall@5"]
    ours = pooled_metrics(rows, names, GRADED)
    for engine in ("bm25", "dense"):
        mine = [(jq, v) for jq, v in zip(rows, ours, strict=True) if jq.query.engine == engine]
        write_trec_run(tmp_path / f"{engine}.run", [jq for jq, _ in mine], engine)
        measures = [nDCG @ 5, R(rel=GRADED.threshold) @ 5]
        theirs = trec(tmp_path / "qrels.txt", tmp_path / f"{engine}.run", measures)
        for jq, values in mine:
            qid = jq.query.query_id
            assert values["pooled_ndcg@5"] == pytest.approx(theirs[(qid, "nDCG@5")], abs=1e-9)
            recall = theirs[(qid, str(measures[1]))]
            if values["pooled_recall@5"] is None:
                assert recall == 0.0
            else:
                assert values["pooled_recall@5"] == pytest.approx(recall, abs=1e-9)


def trec_engine_pool() -> list[JudgedQuery]:
    """A judged engine "dense" on the TREC sample's queries (passages from passages.jsonl):
    it ranks the answering passages first; water-4 (freezing) and bees-4 are never returned."""
    store = {
        "t1": [("bees-2", 3), ("bees-1", 3), ("bees-5", 1), ("bees-3", 0)],
        "t2": [("tea-s1", 3), ("tea-s2", 2), ("tea-s3", 2), ("tea-s4", 0), ("tea-s5", 0)],
        "t3": [("water-1", 3), ("water-3", 1), ("water-2", 1)],
    }
    report = read_trec_run(DATA / "sample.run", DATA / "passages.jsonl", DATA / "queries.tsv")
    texts = {p.id: p.text for q in report.queries for p in q.passages}
    return [
        judged(qid, "dense", [(pid, texts[pid]) for pid, _ in ranked], [g for _, g in ranked])
        for qid, ranked in store.items()
    ]


def test_a_trec_run_is_judged_from_the_pool_and_compared(tmp_path: Path) -> None:
    report = read_trec_run(DATA / "sample.run", DATA / "passages.jsonl", DATA / "queries.tsv")
    assert {q.engine for q in report.queries} == {"bm25"}
    pool = trec_engine_pool()
    names = ["ndcg@5", "ap"]
    bm25 = borrow_verdicts(report.queries, pool, names, GRADED)
    by_qid = {jq.query.query_id: jq for jq in bm25}
    # t2: every passage bm25 returned was judged by dense; its grades come across.
    t2 = by_qid["t2"]
    assert [v.grade for v in t2.verdicts] == [0, 3, 2, 0, 2]  # tea-s4, s1, s2, s5, s3
    assert t2.verdicts[1].reason == "tea-s1 is answers"
    # Relevant (grade >= 2) at ranks 2, 3 and 5.
    assert t2.metrics["ap"] == pytest.approx((1 / 2 + 2 / 3 + 3 / 5) / 3)
    # t1: bees-4 was never judged: unjudged, so t1's metrics are undefined, not 0.
    missing = [v for v in by_qid["t1"].verdicts if v.status != "ok"]
    assert [v.passage_id for v in missing] == ["bees-4"]
    assert "not judged" in (missing[0].error or "")
    assert by_qid["t1"].metrics["ndcg@5"] is None
    cmp = compare([*pool, *bm25], ["ndcg@5", "pooled_ndcg@5"], GRADED, baseline="dense")
    assert cmp.means["ndcg@5"]["bm25"].n == 1  # t1 and t3 hold a passage nobody judged
    per_query = cmp.per_query["pooled_ndcg@5"]
    assert per_query["dense"]["t2"] == pytest.approx(1.0)
    assert 0 < per_query["bm25"]["t2"] < 1


def test_cli_compare_takes_a_trec_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "dense-run", trec_engine_pool())
    code = run_cli(
        [
            *["compare", str(run), "--trec-run", str(DATA / "sample.run")],
            *[
                "--passage-store",
                str(DATA / "passages.jsonl"),
                "--queries",
                str(DATA / "queries.tsv"),
            ],
            *["--metric", "ndcg@5", "--metric", "pooled_ndcg@5", "--baseline", "dense"],
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    rows = [line.split() for line in out.splitlines() if line.startswith("pooled_ndcg@5")]
    assert [r[1] for r in rows] == ["dense", "bm25"]
    assert not math.isnan(float(rows[1][3]))
