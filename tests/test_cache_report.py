"""A damaged cache is reported in one line: how many entries, what was done, where they are.
``judge run`` through the real openai SDK against a loopback server that counts requests."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from judge.cli.main import main
from tests.servers import ScriptedServer
from tests.test_runner import write_config, write_dataset


def _cache_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the cache warned, line by line."""
    messages = [r.getMessage() for r in caplog.records if r.name == "judge.calling.cache"]
    return [line for m in messages for line in m.splitlines()]


def test_a_thousand_unreadable_entries_are_one_line_and_asked_again_once(
    server: ScriptedServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    dataset = write_dataset(tmp_path / "rows.jsonl", n_queries=10, n_passages=100)
    cache = tmp_path / "cache.sqlite"
    config = write_config(tmp_path / "run.toml", server, cache, {"run": {"concurrency": 16}})
    args = ["run", str(config), str(dataset), "--out", str(tmp_path / "out")]
    assert main(args) in (0, 1)
    assert len(server.requests) == 1000
    db = sqlite3.connect(cache)
    with db:  # every answer as a judge that stores them otherwise would have written it
        assert db.execute("""UPDATE answers SET value = '{"other": 1}'""").rowcount == 1000
        db.execute("DELETE FROM verdict_sets")  # whole queries' verdicts, read first
    db.close()
    caplog.clear()
    assert main([*args, "--fresh"]) in (0, 1)
    lines = _cache_lines(caplog)
    assert len(lines) == 1, lines
    assert str(cache) in lines[0]
    assert "1000 cache entries could not be read" in lines[0]
    assert "1000 asked again and overwritten in place, 0 left in place" in lines[0]
    assert len(server.requests) == 2000  # each asked again once, then read as usual
    caplog.clear()
    assert main([*args, "--fresh"]) in (0, 1)
    assert _cache_lines(caplog) == []
    assert len(server.requests) == 2000


def test_a_damaged_file_is_one_line_naming_its_entries_and_where_it_went(
    server: ScriptedServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    dataset = write_dataset(tmp_path / "rows.jsonl", n_queries=4, n_passages=50)
    cache = tmp_path / "cache.sqlite"
    config = write_config(tmp_path / "run.toml", server, cache)
    args = ["run", str(config), str(dataset), "--out", str(tmp_path / "out")]
    assert main(args) in (0, 1)
    size = cache.stat().st_size
    with open(cache, "r+b") as fh:  # every page but the schema's
        fh.seek(4096)
        fh.write(os.urandom(size - 4096))
    capsys.readouterr()
    caplog.clear()
    assert main([*args, "--fresh"]) in (0, 1)
    err = capsys.readouterr().err
    lines = _cache_lines(caplog)
    assert len(lines) == 1, lines
    (aside,) = tmp_path.glob("cache.sqlite.corrupt-*")
    assert "moved aside with its" in lines[0] and str(aside) in lines[0]
    assert "Traceback" not in err
    assert len(server.requests) == 400  # the moved answers are asked again, once


def test_inspecting_a_damaged_cache_reports_it_and_moves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache.sqlite"
    server = ScriptedServer().start()
    try:
        config = write_config(tmp_path / "run.toml", server, cache)
        dataset = write_dataset(tmp_path / "rows.jsonl", n_queries=2, n_passages=40)
        assert main(["run", str(config), str(dataset), "--out", str(tmp_path / "out")]) in (0, 1)
    finally:
        server.stop()
    size = cache.stat().st_size
    with open(cache, "r+b") as fh:  # every page but the schema's
        fh.seek(4096)
        fh.write(b"\xff" * (size - 4096))
    capsys.readouterr()
    for action in (["stats"], ["prune", "--older-than", "0"]):
        assert main(["cache", *action, "--cache", str(cache)]) == 2
        err = capsys.readouterr().err
        assert f"{cache}: " in err and "malformed" in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.glob("cache.sqlite.corrupt-*"))  # they report; they move nothing
    # A dry run sends nothing and changes nothing: it says what a run would find.
    dry = ["run", str(config), str(dataset), "--out", str(tmp_path / "dry"), "--dry-run"]
    assert main(dry) == 2
    err = capsys.readouterr().err
    assert "a run moves it aside and asks its answers again" in err and "Traceback" not in err
    assert not list(tmp_path.glob("cache.sqlite.corrupt-*"))
    assert main(["cache", "clear", "--cache", str(cache)]) == 0  # clear starts a new file
    assert list(tmp_path.glob("cache.sqlite.corrupt-*"))
    assert main(["cache", "stats", "--cache", str(cache)]) == 0


def test_a_file_that_is_not_sqlite_is_never_taken_for_a_cache(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The dataset given as the cache (or any file that does not begin as SQLite files do)
    is refused and left as it was, by a run, a dry run and every cache command: it had been
    moved aside as a damaged cache and replaced by one."""
    dataset = write_dataset(tmp_path / "rows.jsonl", n_queries=2, n_passages=5)
    before = dataset.read_bytes()
    config = write_config(tmp_path / "run.toml", server, dataset)
    for argv in (
        ["run", str(config), str(dataset), "--out", str(tmp_path / "out")],
        ["run", str(config), str(dataset), "--out", str(tmp_path / "dry"), "--dry-run"],
        ["cache", "clear", "--cache", str(dataset)],
        ["cache", "stats", "--cache", str(dataset)],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"{dataset}: not a SQLite file, so not a judge cache (left as it is)" in err
        assert "Traceback" not in err
    assert dataset.read_bytes() == before
    assert not list(tmp_path.glob("*corrupt*"))
    assert server.requests == []


def test_cache_check_calls_damaged_only_what_sqlite_finds_damaged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder where the cache should be cannot be opened: said as that, not as a damaged
    file the next run would move aside (the run refuses the path)."""
    folder = tmp_path / "cache.sqlite"
    folder.mkdir()
    assert main(["cache", "check", "--cache", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"{folder}: cannot open cache" in err and "file is damaged" not in err
