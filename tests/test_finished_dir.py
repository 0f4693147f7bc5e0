"""``judge run`` again on a finished run directory: with nothing new to judge and nothing its
summary and reports were made from changed, they are reused, not made again; any change to
the results, the config or the baseline makes them again."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from judge.cli.main import main
from judge.report.finish import FINISHED_FILE
from judge.report.history import list_runs
from tests.servers import ScriptedServer
from tests.test_runner import write_config

MADE = ("summary.json", "report.md", "report.html", "qrels.txt")


def _stamps(out: Path) -> dict[str, int]:
    return {name: (out / name).stat().st_mtime_ns for name in MADE}


def _setup(make_server: Callable[..., ScriptedServer], tmp_path: Path, **run: object) -> Path:
    server = make_server()
    tables = {"run": {"history": str(tmp_path / "history.sqlite"), **run}}
    return write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite", tables)


def test_a_rerun_with_nothing_new_reuses_the_summary_and_reports(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    config, out = _setup(make_server, tmp_path), tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == 0
    made = json.loads((out / FINISHED_FILE).read_text(encoding="utf-8"))
    assert made["results"] and made["config"]
    before, summary = _stamps(out), (out / "summary.json").read_bytes()

    assert main(["run", str(config), "--out", str(out)]) == 0
    assert _stamps(out) == before and (out / "summary.json").read_bytes() == summary
    assert len(list_runs(tmp_path / "history.sqlite", 0)) == 1  # the same results, once

    # A changed results file makes them again.
    rows = (out / "verdicts.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (out / "verdicts.jsonl").write_text("".join(rows[:-1]), encoding="utf-8")
    assert main(["run", str(config), "--out", str(out)]) == 0  # judges the unit it lost
    assert _stamps(out)["summary.json"] != before["summary.json"]
    assert len(list_runs(tmp_path / "history.sqlite", 0)) == 2


def test_a_changed_config_or_baseline_makes_them_again(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    config, out = _setup(make_server, tmp_path), tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == 0
    baseline = tmp_path / "baseline.json"
    shutil.copy(out / "summary.json", baseline)

    # A threshold against the baseline: the same results, checked anew.
    text = config.read_text(encoding="utf-8")
    config.write_text(
        text + f'[thresholds]\nbaseline = "{baseline}"\nmax_drop = {{ndcg = 0.01}}\n',
        encoding="utf-8",
    )
    before = _stamps(out)
    assert main(["run", str(config), "--out", str(out)]) == 0
    after = _stamps(out)
    assert after["summary.json"] != before["summary.json"]
    checks = json.loads((out / "summary.json").read_text(encoding="utf-8"))["thresholds"]
    assert any(c["check"] == "drop ndcg" for c in checks["checks"]), checks

    # A baseline whose ndcg is far above this run's: the same command now breaches.
    data = json.loads(baseline.read_text(encoding="utf-8"))
    for engine in data["engines"].values():
        engine["metrics"]["ndcg"]["mean"] = 1.0
    baseline.write_text(json.dumps(data), encoding="utf-8")
    assert main(["run", str(config), "--out", str(out)]) == 1
    assert _stamps(out)["summary.json"] != after["summary.json"]
    # Unchanged again: reused, and the breach is still reported by the exit code.
    stamps = _stamps(out)
    assert main(["run", str(config), "--out", str(out)]) == 1
    assert _stamps(out) == stamps


def test_the_reports_of_a_run_equal_those_made_again_from_its_results_file(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """The run hands its rows to the summary (slimmed of what the reports never read: an ok
    verdict's raw answer beside its reason); rebuilt from the results file, which keeps every
    raw answer, the reports say the same."""
    config, out = _setup(make_server, tmp_path), tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) in (0, 1)
    rows = [json.loads(line) for line in (out / "verdicts.jsonl").read_text().splitlines()]
    assert all(v["raw"] for row in rows for v in row["verdicts"] if v["status"] == "ok")
    first = (out / "report.md").read_text(encoding="utf-8").splitlines()
    assert main(["report", str(out), "--config", str(config), "--rebuild"]) == 0
    again = (out / "report.md").read_text(encoding="utf-8").splitlines()
    dated = {i for i, line in enumerate(first) if "UTC" in line}  # when each was made
    assert len(first) == len(again) and dated
    assert [x for i, x in enumerate(first) if i not in dated] == [
        x for i, x in enumerate(again) if i not in dated
    ]


def test_a_summary_made_again_without_config_is_made_with_the_runs_own(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`judge report --rebuild` without --config reads the config run.json names (its metrics
    and thresholds are the config's alone; the default config had named another judge and
    other metrics), from any working directory; a config gone or changed is one line."""
    server = make_server()
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite")
    text = config.read_text(encoding="utf-8")
    config.write_text(text + '[metrics]\nnames = ["ap", "precision@3"]\n', encoding="utf-8")
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == 0
    first = (out / "report.md").read_text(encoding="utf-8")
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["report", str(out), "--rebuild"]) == 0
    assert (out / "report.md").read_text(encoding="utf-8") == first
    again = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert again["metric_names"] == summary["metric_names"] == ["ap", "precision@3"]
    assert again["config"] == summary["config"] and again["created"] == summary["created"]
    capsys.readouterr()

    config.write_text(config.read_text(encoding="utf-8").replace("judge-test", "other"))
    assert main(["report", str(out), "--rebuild"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has changed since the run" in err[0] and "judge.model" in err[0]
    config.unlink()
    assert main(["report", str(out), "--rebuild"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pass --config" in err[0] and str(config) in err[0]
    assert (out / "report.md").read_text(encoding="utf-8") == first  # nothing was rewritten


def test_the_files_a_run_writes_are_checked_before_it_pays(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user's own qrels.txt or notes in a folder no run was started in are not replaced, and
    a report path that is a folder is found before paying (exit 3 after, else)."""
    from judge.report.checks import WRITTEN
    from judge.report.document import write_reports  # noqa: F401 -- owns report.md/.html
    from judge.report.finish import FINISHED_FILE, QRELS_FILE
    from judge.report.summary import SUMMARY_FILE

    assert {SUMMARY_FILE, QRELS_FILE, FINISHED_FILE, "report.md", "report.html"} == set(WRITTEN)
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "qrels.txt").write_text("q1 0 p1 3\n", encoding="utf-8")
    (mine / "notes.txt").write_text("my notes\n", encoding="utf-8")
    assert main(["run", str(config), "--out", str(mine)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds qrels.txt, which no judge run there wrote" in err[0]
    assert (mine / "qrels.txt").read_text(encoding="utf-8") == "q1 0 p1 3\n"
    assert not server.requests

    out = tmp_path / "out"
    (out / "report.html").mkdir(parents=True)
    assert main(["run", str(config), "--out", str(out)]) == 2
    assert "report.html: is a directory" in capsys.readouterr().err
    assert not server.requests
    (out / "report.html").rmdir()
    assert main(["run", str(config), "--out", str(out)]) == 0
    assert main(["run", str(config), "--out", str(out)]) == 0  # its own files: a rerun is fine


def test_a_run_started_with_set_is_made_again_with_its_settings(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """run.json keeps the command line's settings over the config (paths made absolute), so
    `judge report --rebuild` without --config makes the run's summary, not the file's alone
    (it had been refused as "changed since the run")."""
    server = make_server()
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite")
    out = tmp_path / "out"
    sets = ["--set", "judge.model=judge-other", "--set", 'metrics.names=["ap"]']
    monkeypatch.chdir(tmp_path)
    sets += ["--set", "run.history=h.sqlite"]  # relative: from the folder it ran in
    assert main(["run", str(config), "--out", str(out), *sets]) in (0, 1)
    first = (out / "report.md").read_text(encoding="utf-8")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["report", str(out), "--rebuild"]) == 0
    assert (out / "report.md").read_text(encoding="utf-8") == first
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert (
        summary["metric_names"] == ["ap"] and summary["config"]["judge"]["model"] == "judge-other"
    )
