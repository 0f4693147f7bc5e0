"""Results JSONL (append, resume after a kill, corruption) and TREC qrels files."""

from __future__ import annotations

from pathlib import Path

import ir_measures
import pytest

from judge.data.datasets import append_result, read_qrels, read_results, write_qrels
from judge.errors import ConfigError, InputError
from judge.schema import JudgedQuery, Query, Verdict


def judged(qid: str, engine: str, repeat: int, grades: dict[str, int | None]) -> JudgedQuery:
    verdicts = tuple(
        Verdict(passage_id=pid, rank=i, status="ok", label=str(g), grade=g)
        if g is not None
        else Verdict(passage_id=pid, rank=i, status="unparsed", raw="hmm")
        for i, (pid, g) in enumerate(grades.items(), start=1)
    )
    query = Query(query_id=qid, query="小狗贫血的表现", engine=engine, source="d.jsonl:1")
    return JudgedQuery(query=query, repeat=repeat, scale="graded", verdicts=verdicts, metrics={})


def test_results_round_trip_and_a_truncated_last_line(tmp_path: Path) -> None:
    path = tmp_path / "out" / "results.jsonl"
    first = judged("q1", "bm25", 0, {"p1": 3, "p2": None})
    second = judged("q1", "dense", 0, {"p1": 2})
    append_result(path, first)
    append_result(path, second)
    assert read_results(path) == [first, second]
    whole = path.read_bytes()
    path.write_bytes(whole + whole[:40])  # a writer killed mid-line
    problems: list[str] = []
    assert read_results(path, problems=problems) == [first, second]
    assert problems == [
        f"{path}:3: incomplete last line (the writer was stopped mid-line); dropped"
    ]
    third = judged("q2", "bm25", 1, {"p7": 0})
    append_result(path, third)  # resuming cuts the fragment, never fuses with it
    assert read_results(path) == [first, second, third]


def test_results_corruption_before_the_end_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    append_result(path, judged("q1", "bm25", 0, {"p1": 1}))
    with path.open("a") as fh:
        fh.write('{"query": 1}\n')
    append_result(path, judged("q1", "bm25", 1, {"p1": 1}))
    with pytest.raises(InputError) as err:
        read_results(path)
    assert str(err.value).startswith(f"{path}:2: field 'query': not a judged result")


def test_qrels_pool_engines_and_repeats_by_majority(tmp_path: Path) -> None:
    results = [
        judged("q2", "bm25", 0, {"p1": 3, "p2": 0, "p3": None}),
        judged("q2", "bm25", 1, {"p1": 2, "p2": 1, "p3": None}),
        judged("q2", "dense", 0, {"p1": 3, "p4": 1}),
        judged("q1", "bm25", 0, {"b": 1, "a": 2}),
    ]
    path = tmp_path / "qrels.txt"
    assert write_qrels(path, results) == 5
    assert path.read_text().splitlines() == [
        "q1 0 a 2",
        "q1 0 b 1",
        "q2 0 p1 3",  # 3, 2, 3 -> 3
        "q2 0 p2 0",  # 0, 1 tie -> the lower grade
        "q2 0 p4 1",  # p3 only unparsed: omitted
    ]
    expected = {"q1": {"a": 2, "b": 1}, "q2": {"p1": 3, "p2": 0, "p4": 1}}
    assert read_qrels(path) == expected
    oracle: dict[str, dict[str, int]] = {}
    for qrel in ir_measures.read_trec_qrels(str(path)):  # type: ignore[no-untyped-call]
        oracle.setdefault(qrel.query_id, {})[qrel.doc_id] = qrel.relevance
    assert oracle == expected
    write_qrels(path, results, repeat_policy="max")
    assert "q2 0 p2 1" in path.read_text().splitlines()
    with pytest.raises(ConfigError, match="repeat_policy"):
        write_qrels(path, results, repeat_policy="mean")


def test_qrels_reader_names_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "q.txt"
    path.write_text("q1 0 d1 2\nq1 0 d2 two\n")
    with pytest.raises(InputError, match=rf"^{path}:2: field 'grade': not an integer"):
        read_qrels(path)
    path.write_text("q1 0 d1 \u00b2\n", encoding="utf-8")  # a digit to isdigit, not to int
    with pytest.raises(InputError, match=rf"^{path}:1: field 'grade': not an integer"):
        read_qrels(path)
