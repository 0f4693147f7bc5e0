"""A run directory an older judge wrote: refused as an upgrade (which version wrote it, which
reads it) with the command that keeps the paid answers, and that command pays nothing again.
Through the real openai SDK against a loopback server that counts every request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from judge.cli.main import main
from judge.data.results import RESULTS_FILE
from judge.run.resume import RUN_FILE
from judge.version import __version__
from tests.servers import ScriptedServer
from tests.test_runner import verdict_labels, write_config, write_dataset


def _older(out: Path, version: str | None, change: dict[str, Any]) -> None:
    """Make ``out``'s run.json look written by judge ``version`` (None: one that recorded no
    version), its ``[judge]`` fingerprint changed by ``change`` (a None value: a setting that
    judge did not have)."""
    data = json.loads((out / RUN_FILE).read_text(encoding="utf-8"))
    assert data.pop("judge_version") == __version__
    if version is not None:
        data["judge_version"] = version
    judge = data["fingerprint"]["judge"]
    for key, value in change.items():
        if value is None:
            del judge[key]
        else:
            judge[key] = value
    (out / RUN_FILE).write_text(json.dumps(data), encoding="utf-8")


@pytest.fixture
def paid_run(server: ScriptedServer, tmp_path: Path) -> tuple[Path, list[str]]:
    dataset = write_dataset(tmp_path / "rows.jsonl", n_queries=3, n_passages=4)
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite")
    args = ["run", str(config), str(dataset), "--out", str(tmp_path / "out")]
    assert main(args) == 0
    assert len(server.requests) == 12
    return tmp_path / "out", args


def test_an_older_judge_s_directory_is_refused_as_an_upgrade_and_fresh_pays_nothing_again(
    server: ScriptedServer, paid_run: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    out, args = paid_run
    labels = verdict_labels(out)
    # An older judge had no max_reason_words setting and one this version dropped.
    _older(out, None, {"max_reason_words": None, "old_knob": 3})
    before = (out / RESULTS_FILE).read_bytes()
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "written by an older judge (one that did not record its version)" in err
    assert f"this is judge {__version__}" in err and "an upgrade" in err
    assert "judge.max_reason_words unset -> " in err and "judge.old_knob 3 -> unset" in err
    assert "--fresh" in err and "not paid again" in err
    assert "different config" not in err
    assert (out / RESULTS_FILE).read_bytes() == before

    # What the message says: --dry-run --fresh counts the answers it reuses...
    assert main([*args, "--fresh", "--dry-run"]) == 0
    assert "12 calls (12 already cached)" in capsys.readouterr().out
    # ... and --fresh re-judges the directory from the cache: nothing is paid again.
    assert main([*args, "--fresh"]) == 0
    assert len(server.requests) == 12
    assert verdict_labels(out) == labels
    assert json.loads((out / RUN_FILE).read_text())["judge_version"] == __version__
    assert main(args) == 0  # resumes now: the directory is this version's


def test_a_version_recorded_is_named_and_a_changed_config_is_still_a_changed_config(
    server: ScriptedServer, paid_run: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    out, args = paid_run
    _older(out, "0.0.9", {"max_reason_words": 7})
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "written by judge 0.0.9 and this is judge" in err and "an upgrade" in err
    assert "judge.max_reason_words 7 -> " in err

    # This version's own directory with the model changed: the config, not an upgrade.
    assert main([*args, "--fresh"]) == 0
    capsys.readouterr()
    assert main([*args, "--set", "judge.model=other"]) == 2
    err = capsys.readouterr().err
    assert "made with a different config" in err and "upgrade" not in err
    assert "--fresh" in err and "not paid again" in err
    # An older directory whose only change is a value both versions have: the config too.
    _older(out, None, {"max_reason_words": 7})
    assert main(args) == 2
    assert "different config" in capsys.readouterr().err
    assert len(server.requests) == 12
