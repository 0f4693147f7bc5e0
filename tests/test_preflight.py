"""Everything checkable is checked before the first paid call: each problem is one line naming
file, line and field, exit 2, and the loopback server sees zero requests. ``judge validate
CONFIG DATASET`` runs the same checks."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from judge.cli.main import main
from tests.servers import ScriptedServer
from tests.test_runner import write_config
from tests.wire import keyword_responder

ROW: dict[str, Any] = {
    "query_id": "q1",
    "query": "what do kettles do",
    "passages": [{"id": "p1", "text": "A kettle boils water."}, {"id": "p2", "text": "Tea."}],
}


def _dataset(tmp_path: Path, *rows: dict[str, Any]) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (ROW, *rows)), encoding="utf-8")
    return path


def _both(
    config: Path, dataset: Path, out: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[str, str]:
    """Run and validate; both exit 2; their error text."""
    assert main(["run", str(config), str(dataset), "--out", str(out), *extra]) == 2
    run_err = capsys.readouterr().err
    assert main(["validate", str(config), str(dataset), "--out", str(out), *extra]) == 2
    return run_err, capsys.readouterr().err


@pytest.fixture
def server(make_server: Callable[..., ScriptedServer]) -> ScriptedServer:
    return make_server()


def test_a_label_off_the_judges_scale_is_refused_before_paying(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = {**ROW, "query_id": "q2", "labels": {"p1": 7}}
    dataset = _dataset(tmp_path, bad)
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    config.write_text(config.read_text().replace('label_scale = "graded"', ""), encoding="utf-8")
    for err in _both(config, dataset, tmp_path / "out", capsys):
        assert f"{dataset}:2: field 'labels.p1': 7 is not a grade" in err
        assert "Traceback" not in err
    assert server.requests == []


def test_ids_the_trec_outputs_cannot_carry_are_refused(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spaced = {**ROW, "query_id": "q 2"}
    tabbed = {**ROW, "query_id": "q3", "passages": [{"id": "p\t1", "text": "x"}]}
    dataset = _dataset(tmp_path, spaced, tabbed)
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    for err in _both(config, dataset, tmp_path / "out", capsys):
        assert f"{dataset}:2: field 'query_id': 'q 2' contains whitespace" in err
        assert f"{dataset}:3: field 'passages.id'" in err
    assert server.requests == []


def test_a_base_url_that_is_not_a_url_is_a_config_error(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(
        tmp_path / "c.toml",
        server,
        tmp_path / "cache.sqlite",
        {"provider": {"base_url": "not a url"}},
    )
    for err in _both(config, _dataset(tmp_path), tmp_path / "out", capsys):
        assert "base_url" in err and "'not a url' is not an http(s) URL" in err
    assert server.requests == []


def test_an_output_directory_that_cannot_be_made_is_refused(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory", encoding="utf-8")
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    for err in _both(config, _dataset(tmp_path), blocker / "out", capsys):
        assert str(blocker / "out") in err and "Traceback" not in err
    assert server.requests == []


def test_a_missing_baseline_is_an_error_unless_it_is_the_first_night(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    baseline = tmp_path / "baseline" / "summary.json"
    config = write_config(
        tmp_path / "c.toml",
        server,
        tmp_path / "cache.sqlite",
        {"thresholds": {"baseline": str(baseline)}, "thresholds.max_drop": {"ap": 0.05}},
    )
    dataset = _dataset(tmp_path)
    for err in _both(config, dataset, tmp_path / "out", capsys):
        assert f"{baseline}: thresholds.baseline not found" in err
    assert server.requests == []
    out = str(tmp_path / "out")
    assert main(["run", str(config), str(dataset), "--out", out, "--first-night"]) == 0
    assert server.requests != []


def test_baseline_set_makes_a_finished_run_the_baseline_of_the_next_night(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = make_server(responder=keyword_responder({"boils": "yes"}))  # ap is defined
    baseline = tmp_path / "nightly" / "baseline.json"
    config = write_config(
        tmp_path / "c.toml",
        server,
        tmp_path / "cache.sqlite",
        {"thresholds": {"baseline": str(baseline)}, "thresholds.max_drop": {"ap": 0.05}},
    )
    dataset = _dataset(tmp_path)
    first = str(tmp_path / "night1")
    assert main(["run", str(config), str(dataset), "--out", first, "--first-night"]) == 0
    assert main(["baseline", "set", first, "--config", str(config)]) == 0
    assert json.loads(baseline.read_text(encoding="utf-8"))["engines"]
    # The second night needs no switch, and its drop check runs against the first.
    assert main(["run", str(config), str(dataset), "--out", str(tmp_path / "night2")]) == 0
    summary = json.loads((tmp_path / "night2" / "summary.json").read_text(encoding="utf-8"))
    assert any(c["check"] == "drop ap" for c in summary["thresholds"]["checks"])
    capsys.readouterr()


def test_a_graded_judge_with_coarser_labels_is_refused_before_paying(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(
        tmp_path / "c.toml",
        server,
        tmp_path / "cache.sqlite",
        {"judge": {"scale": "graded"}, "dataset": {"label_scale": "binary"}},
    )
    for err in _both(config, _dataset(tmp_path), tmp_path / "out", capsys):
        assert "labels on scale 'binary' cannot be compared with the graded judge" in err
    assert server.requests == []
