"""What keeps a large single-repeat run's summary and report linear and readable: the shortcuts
give what the general path gives, and a report lists at most SHOWN queries' passages."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path

from judge.analysis.reliability import krippendorff_alpha
from judge.analysis.stability import (
    _grade_matrix,
    _no_flips,
    consensus_votes,
    majority_vote,
    one_repeat_each,
    passage_flips,
)
from judge.config import load_config
from judge.data.results import load_results
from judge.metrics.compute import DEFAULT_METRICS, metrics_for_queries
from judge.report.document import write_reports
from judge.report.queries import SHOWN, query_rows, shown_rows
from judge.report.summary import build_summary
from judge.run.queries import load_queries
from judge.run.runner import run_async
from judge.schema import JudgedQuery, Passage, Query, Scale
from tests.servers import ScriptedServer, hashed_responder
from tests.test_calls import make_config
from tests.test_compare import sample_results, verdict

BINARY = Scale.binary()


def _many(n_queries: int, labelled: int = 0) -> list[JudgedQuery]:
    """``n_queries`` one-repeat rows of 4 passages, some failed; the first ``labelled`` queries
    carry human labels that differ from the judge on one passage."""
    rows = []
    for q in range(n_queries):
        pids = [f"q{q}-p{i}" for i in range(4)]
        grades: list[int | str] = [(q + i) % 2 for i in range(4)]
        if q % 9 == 0:
            grades[3] = "error"
        labels = {pids[0]: 1 - int(grades[0]), pids[1]: int(grades[1])} if q < labelled else None
        query = Query(
            query_id=f"q{q:04d}",
            query=f"question {q}",
            engine="e1",
            passages=tuple(Passage(id=p, text=f"text of {p}") for p in pids),
            labels=labels,
        )
        verdicts = tuple(
            verdict(p, rank, g, BINARY)
            for rank, (p, g) in enumerate(zip(pids, grades, strict=True), 1)
        )
        metrics = metrics_for_queries(DEFAULT_METRICS, [(query, verdicts)], BINARY)[0]
        rows.append(
            JudgedQuery(query=query, repeat=0, scale="binary", verdicts=verdicts, metrics=metrics)
        )
    return rows


def test_one_repeat_shortcuts_give_what_the_general_path_gives() -> None:
    rows = _many(60, labelled=10)
    assert one_repeat_each(rows) and not one_repeat_each(sample_results(repeats=2))
    assert _no_flips(rows) == passage_flips(rows, BINARY)
    assert krippendorff_alpha(_grade_matrix(rows), "nominal") is None
    assert consensus_votes(rows)[1] == 0
    # A row's own metrics are its majority vote's.
    voted = majority_vote(rows, DEFAULT_METRICS, BINARY)
    for row, vote in zip(rows, voted, strict=True):
        assert row.metrics == vote.metrics


def test_a_large_run_lists_the_lowest_queries_and_says_how_many_it_left_out(
    tmp_path: Path,
) -> None:
    n = SHOWN + 40
    rows = _many(n, labelled=30)
    config = load_config(None, {"judge.scale": "binary", "run.cache": str(tmp_path / "c")})
    summary = build_summary(config, rows, n_boot=200)
    assert len(summary.queries) == n  # summary.json keeps every row
    listed = shown_rows(summary.queries, list(summary.metric_names))
    first = summary.metric_names[0]
    lowest = sorted(
        summary.queries,
        key=lambda r: (r.metrics[first] is None, r.metrics[first] or 0.0, r.query_id),
    )[:SHOWN]
    disagreeing = {(r.query_id, r.engine) for r in summary.queries if r.disagreements}
    assert disagreeing and len(disagreeing) <= 30
    expected = {(r.query_id, r.engine) for r in lowest} | disagreeing
    assert {(r.query_id, r.engine) for r in listed} == expected
    assert len(listed) < n

    write_reports(tmp_path, summary, rows, charts=False)
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    md = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert f"Queries ({len(listed)} of {n};" in page and f"Queries ({len(listed)} of {n};" in md
    assert "summary.json has every query" in page and "verdicts.jsonl every passage" in md
    # Every link to a query's passages lands on a heading that is on the page.
    targets = set(re.findall(r'href="#(q-\d+)"', page))
    anchors = set(re.findall(r'id="(q-\d+)"', page))
    assert targets and targets <= anchors and len(anchors) == len(listed)
    left_out = sorted({r.query_id for r in summary.queries} - {r.query_id for r in listed})
    assert left_out and f"{left_out[0]} / e1" not in page


def test_a_small_run_lists_every_query_and_its_passages(tmp_path: Path) -> None:
    rows = _many(12, labelled=3)
    config = load_config(None, {"judge.scale": "binary", "run.cache": str(tmp_path / "c")})
    summary = build_summary(config, rows, n_boot=200)
    assert shown_rows(summary.queries, list(summary.metric_names)) == list(summary.queries)
    assert query_rows(rows, list(summary.metric_names), BINARY) == summary.queries
    write_reports(tmp_path, summary, rows, charts=False)
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "Queries (12;" in page and " of 12;" not in page  # the heading: none left out
    assert all(f"q{q:04d} / e1" in page for q in range(12))


def test_a_run_into_a_new_directory_hands_over_exactly_the_rows_it_wrote(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    server = make_server(responder=hashed_responder())
    config = make_config(server, tmp_path)
    queries = load_queries(config)
    out = tmp_path / "out"
    kept: list[JudgedQuery] = []
    outcome = asyncio.run(run_async(config, queries, out, keep=kept))
    assert outcome.status == "complete" and kept
    back = load_results(out)  # what the summary would have read back, row for row
    held = {"verdicts": {"__all__": {"raw"}}}  # an ok verdict's raw answer beside its reason
    assert [r.model_dump(exclude=held) for r in kept] == [r.model_dump(exclude=held) for r in back]
    assert all(
        (v.raw is None) == (w.status == "ok" and bool(w.reason)) and w.raw
        for r, b in zip(kept, back, strict=True)
        for v, w in zip(r.verdicts, b.verdicts, strict=True)
    )
    # A directory that already held rows hands nothing over: the summary reads the file.
    again: list[JudgedQuery] = []
    asyncio.run(run_async(config, queries, out, keep=again))
    assert again == []
    # Both ways give the same summary.
    assert build_summary(config, kept, n_boot=200).model_dump(exclude={"created"}) == (
        build_summary(config, load_results(out), n_boot=200).model_dump(exclude={"created"})
    )


def test_coverage_in_the_majority_vote_is_the_mean_over_repeats_as_with_one_repeat(
    tmp_path: Path,
) -> None:
    """The vote recomputes verdict metrics; coverage reads the nugget judgments, so with
    several repeats its majority-vote figure is each query's mean over the repeats."""
    rows = []
    for repeat, values in enumerate(([0.5, 1.0], [1.0, 0.0])):
        for q, value in zip(_many(2), values, strict=True):
            metrics = {**q.metrics, "coverage@5": value}
            rows.append(q.model_copy(update={"repeat": repeat, "metrics": metrics}))
    config = load_config(None, {"judge.scale": "binary", "run.cache": str(tmp_path / "c")})
    summary = build_summary(config, rows, n_boot=200)
    # q0: (0.5 + 1.0) / 2, q1: (1.0 + 0.0) / 2; their mean 0.625.
    assert summary.engines["e1"].majority_vote["coverage@5"] == 0.625
    one = build_summary(config, [r for r in rows if r.repeat == 0], n_boot=200)
    assert one.engines["e1"].majority_vote["coverage@5"] == 0.75
