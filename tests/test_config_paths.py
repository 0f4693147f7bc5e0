"""Paths in a config file are taken from the file's folder (the same config works from any
directory); paths on the command line from the current one. Output files get ordinary modes."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from judge.cli.main import main
from judge.config import load_config
from tests.servers import ScriptedServer
from tests.test_runner import write_dataset


def test_config_paths_follow_the_config_file_and_overrides_the_cwd(tmp_path: Path) -> None:
    folder = tmp_path / "configs"
    folder.mkdir()
    config = folder / "c.toml"
    config.write_text(
        '[dataset]\npath = "../data/d.jsonl"\n[run]\nout = "../runs/x"\ncache = "/abs/c.sqlite"\n'
        '[thresholds]\nbaseline = "base/summary.json"\n',
        encoding="utf-8",
    )
    loaded = load_config(config)
    assert loaded.dataset.path == str(tmp_path / "data" / "d.jsonl")
    assert loaded.run.out == str(tmp_path / "runs" / "x")
    assert loaded.run.cache == "/abs/c.sqlite"
    assert loaded.thresholds.baseline == str(folder / "base" / "summary.json")
    assert load_config(config, {"dataset.path": "here.jsonl"}).dataset.path == "here.jsonl"


def test_a_path_under_the_home_folder_is_the_users_not_a_folder_named_tilde(
    tmp_path: Path,
) -> None:
    """ "~/..." in a config or on the command line is under the user's home (HOME is the
    test's own: tests/conftest.py), as a shell says it; it had made a folder named "~"."""
    config = tmp_path / "c.toml"
    config.write_text('[run]\nout = "~/runs/x"\ncache = "~/c/cache.sqlite"\n', encoding="utf-8")
    home = Path(os.environ["HOME"])
    loaded = load_config(config)
    assert loaded.run.out == str(home / "runs" / "x")
    assert loaded.run.cache == str(home / "c" / "cache.sqlite")
    assert load_config(config, {"run.history": "~/h.sqlite"}).run.history == str(home / "h.sqlite")


def test_a_run_from_another_directory_finds_the_configs_dataset_and_writes_plain_files(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = make_server()
    (tmp_path / "data").mkdir()
    write_dataset(tmp_path / "data" / "d.jsonl", n_queries=2, n_passages=2)
    folder = tmp_path / "configs"
    folder.mkdir()
    config = folder / "c.toml"
    config.write_text(
        '[judge]\nprovider = "local"\nmodel = "m"\n'
        f'[provider]\nbase_url = "{server.openai_base_url}"\n'
        '[dataset]\npath = "../data/d.jsonl"\n'
        '[run]\nout = "../runs/x"\ncache = "../cache.sqlite"\n',
        encoding="utf-8",
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    old = os.umask(0o022)
    try:
        assert main(["run", str(config)]) in (0, 1)
    finally:
        os.umask(old)
    out = tmp_path / "runs" / "x"
    for name in ("qrels.txt", "summary.json", "verdicts.jsonl", "report.md"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o644, name


def test_a_missing_dataset_of_the_config_names_the_config_and_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The config moved away from its dataset: said as the config's [dataset] path, resolved
    as it is read (it had been only the path, with no word of where it came from)."""
    from judge.cli.main import main

    config = tmp_path / "elsewhere" / "c.toml"
    config.parent.mkdir()
    config.write_text('[dataset]\npath = "../datasets/sample.jsonl"\n', encoding="utf-8")
    assert main(["run", str(config), "--dry-run", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"{config}: [dataset] path: {tmp_path / 'datasets' / 'sample.jsonl'}: no such file" in (
        err
    ), err


def test_a_primary_metric_the_run_does_not_compute_is_refused_not_passed_over(
    tmp_path: Path,
) -> None:
    """``[metrics] primary`` not among the names (a typo, or one the names leave out) had been
    replaced in silence by another metric, while summary.json named it as the primary."""
    from judge.errors import ConfigError

    config = tmp_path / "c.toml"
    config.write_text('[metrics]\nnames = ["ap", "ndcg"]\nprimary = "ndcg@10"\n')
    with pytest.raises(ConfigError, match=r"c\.toml: metrics\.primary: 'ndcg@10' is not one of"):
        load_config(config)
    with pytest.raises(ConfigError, match=r"^--set metrics\.primary: 'ndcgg' is not one of"):
        load_config(None, {"metrics.primary": "ndcgg"})
    assert load_config(config, {"metrics.primary": "ap"}).metrics.primary == "ap"


@pytest.mark.parametrize(
    ("key", "meant"),
    [("judge.modle", "model"), ("judge.mdoe", "mode"), ("run.repeatz", "repeats")],
)
def test_a_misspelt_key_is_matched_to_the_key_of_the_same_letters_first(
    key: str, meant: str
) -> None:
    """Two letters swapped is one slip: "modle" meant "model", not "mode"."""
    from judge.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"unknown key \(did you mean '{meant}'\?\)"):
        load_config(None, {key: "x"})


def test_an_empty_metric_list_is_refused(tmp_path: Path) -> None:
    from judge.errors import ConfigError

    config = tmp_path / "c.toml"
    config.write_text("[metrics]\nnames = []\n")
    with pytest.raises(ConfigError, match=r"c\.toml: metrics\.names: empty: name at least one"):
        load_config(config)
    with pytest.raises(ConfigError, match=r"^--set metrics\.names: empty"):
        load_config(None, {"metrics.names": []})
