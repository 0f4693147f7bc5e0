"""``judge metrics`` recomputes with the whole [metrics] policy of --config."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from judge.cli.main import main
from judge.data.results import append_result
from judge.schema import JudgedQuery, Passage, Query, Verdict
from tests.servers import ScriptedServer, keyword_responder
from tests.test_runner import write_config


def _results(tmp_path: Path, grades: list[int], scale: str) -> Path:
    query = Query(
        query_id="q1",
        query="why is the sky blue",
        passages=tuple(Passage(id=f"p{i}", text=f"passage {i}") for i in range(len(grades))),
    )
    verdicts = tuple(
        Verdict(passage_id=f"p{i}", rank=i + 1, status="ok", label=str(g), grade=g)
        for i, g in enumerate(grades)
    )
    path = tmp_path / "verdicts.jsonl"
    append_result(
        path, JudgedQuery(query=query, repeat=0, scale=scale, verdicts=verdicts, metrics={})
    )
    return path


def _value(out: str, column: str) -> str:
    head, row = out.strip().splitlines()[-2:]
    return dict(zip(head.split("\t"), row.split("\t"), strict=True))[column]


def test_metrics_with_config_uses_its_undefined_ap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = _results(tmp_path, [0, 0, 0], "binary")
    assert main(["metrics", str(results), "--metric", "ap"]) == 0
    assert _value(capsys.readouterr().out, "ap") == "—"  # nothing relevant: undefined
    config = tmp_path / "zero.toml"
    config.write_text('[metrics]\nundefined_ap = "zero"\n', encoding="utf-8")
    assert main(["metrics", str(results), "--config", str(config), "--metric", "ap"]) == 0
    assert _value(capsys.readouterr().out, "ap") == "0.0000"


def test_metrics_with_config_uses_its_gain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = _results(tmp_path, [1, 3], "graded")
    linear = tmp_path / "linear.toml"
    linear.write_text('[judge]\nscale = "graded"\n', encoding="utf-8")
    exponential = tmp_path / "exp.toml"
    exponential.write_text(
        '[judge]\nscale = "graded"\n[metrics]\ngain = "exponential"\n', encoding="utf-8"
    )
    assert main(["metrics", str(results), "--config", str(linear), "--metric", "ndcg"]) == 0
    lin = float(_value(capsys.readouterr().out, "ndcg"))
    assert main(["metrics", str(results), "--config", str(exponential), "--metric", "ndcg"]) == 0
    exp = float(_value(capsys.readouterr().out, "ndcg"))
    # [1, 3]: linear (1 + 3/log2 3) / (3 + 1/log2 3); exponential (1 + 7/log2 3) / (7 + 1/log2 3)
    assert lin == pytest.approx(0.7967, abs=1e-4)
    assert exp == pytest.approx(0.7098, abs=1e-4)


def test_a_line_written_twice_counts_its_query_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two results files concatenated (or a resumed unit's newer line): the same query,
    engine and repeat was counted twice (n=2); the last line is the unit's, as a run reads."""
    results = _results(tmp_path, [1, 0], "binary")
    line = results.read_bytes()
    results.write_bytes(line + line)
    assert main(["metrics", str(results), "--metric", "precision"]) == 0
    assert _value(capsys.readouterr().out, "n") == "1"


def test_metrics_of_a_run_directory_use_the_runs_policy_without_config(
    make_server: Callable[..., ScriptedServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --config the run's own policy, read from its summary.json (AP of a query with
    nothing relevant as 0 here), so the numbers are the report's; --config still decides."""
    server = make_server(responder=keyword_responder({"nothing": "yes"}, "no"))
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite")
    config.write_text(
        config.read_text(encoding="utf-8") + '[metrics]\nnames = ["ap"]\nundefined_ap = "zero"\n',
        encoding="utf-8",
    )
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) in (0, 1)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    capsys.readouterr()
    assert main(["metrics", str(out / "verdicts.jsonl")]) == 0
    printed = capsys.readouterr().out.strip().splitlines()[1:]
    for line in printed:
        engine, _, ap = line.split("\t")
        assert float(ap) == pytest.approx(summary["engines"][engine]["metrics"]["ap"]["mean"])
    assert any(float(line.split("\t")[2]) == 0.0 for line in printed)
