"""Run history: recording runs, trends, regression flags and ``judge history``."""

from __future__ import annotations

import json
import sqlite3
from functools import cache
from pathlib import Path

import pytest

from judge.config import load_config
from judge.errors import CacheError, ConfigError
from judge.report.history import (
    history_rows_for_report,
    list_runs,
    metric_trend,
    record_run,
    regressions,
)
from judge.report.summary import EngineSummary, MetricSummary, Summary, build_summary
from tests.servers import ScriptedServer
from tests.test_compare import run_cli, sample_results


@cache
def built() -> Summary:
    return build_summary(load_config(None, {"judge.scale": "graded"}), sample_results(), n_boot=20)


def engine(values: dict[str, float | None]) -> EngineSummary:
    none = dict.fromkeys(("ci_low", "ci_high", "std_across_repeats", "max_rel_diff"))
    metrics = {
        m: MetricSummary(mean=v, per_repeat=(v,), n_defined=1, n_undefined=0, **none)
        for m, v in values.items()
    }
    return EngineSummary(majority_vote={}, n_queries=9, n_repeats=2, metrics=metrics)


def summary(
    created: str,
    means: dict[str, dict[str, float | None]],
    *,
    source: str = "<defaults>",
    unparsed: int = 0,
    dataset: str | None = None,
) -> Summary:
    """A real summary with the parts history reads replaced."""
    base = built()
    counts = {"queries": 9, "repeats": 2, "verdicts": 100, "ok": 100 - unparsed}
    return base.model_copy(
        update={
            "created": created,
            "dataset": dataset,
            "config": base.config.model_copy(update={"source": source}),
            "counts": base.counts.model_copy(update=counts | {"unparsed": unparsed, "error": 0}),
            "usage": base.usage.model_copy(update={"cost_usd": 0.5}),
            "engines": {e: engine(values) for e, values in means.items()},
        }
    )


def nightly(path: Path, values: list[float | None], *, source: str = "<defaults>") -> list[int]:
    """One run per value of bm25's ndcg@5 (dense stays at 0.9), a day apart."""
    return [
        record_run(
            path,
            summary(
                f"2026-01-{i + 1:02d}T02:00:00+00:00",
                {"bm25": {"ndcg@5": v}, "dense": {"ndcg@5": 0.9}},
                source=source,
            ),
            f"runs/{i}",
        )
        for i, v in enumerate(values)
    ]


def test_a_recorded_run_reads_back_with_its_counts_and_means(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "history.sqlite"
    config = tmp_path / "nightly.toml"
    run_id = record_run(
        path,
        summary(
            "2026-01-01T02:00:00+00:00",
            {"bm25": {"ap": 0.5, "ndcg": None}},
            source=str(config),
            unparsed=3,
            dataset="data/prod.jsonl",
        ),
        "runs/one",
    )
    (run,) = list_runs(path)
    assert run.run_id == run_id
    assert (run.created, run.out_dir, run.dataset) == (
        "2026-01-01T02:00:00+00:00",
        "runs/one",
        "data/prod.jsonl",
    )
    assert (run.queries, run.verdicts, run.ok, run.unparsed, run.cost_usd) == (9, 100, 97, 3, 0.5)
    assert run.config_source == str(config.resolve())
    assert run.metrics == {"bm25": {"ap": 0.5, "ndcg": None}}
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_real_summary_is_recorded_per_engine_and_metric(tmp_path: Path) -> None:
    real = built()
    record_run(tmp_path / "h.sqlite", real, tmp_path / "runs" / "x")
    (run,) = list_runs(tmp_path / "h.sqlite")
    assert set(run.metrics) == {"bm25", "dense"}
    assert run.metrics["dense"]["ndcg@5"] == real.engines["dense"].mean("ndcg@5")
    assert run.verdicts == real.counts.verdicts
    assert run.out_dir == str(tmp_path / "runs" / "x")


def test_listing_and_trends_are_oldest_first_and_limited(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    ids = nightly(path, [0.70, 0.72, None, 0.71])
    assert [r.run_id for r in list_runs(path, 2)] == ids[2:]
    assert [r.run_id for r in list_runs(path, 0)] == ids
    trend = metric_trend(path, "ndcg@5", "bm25", last_n=3)
    assert [(p.run_id, p.value) for p in trend] == [(ids[1], 0.72), (ids[2], None), (ids[3], 0.71)]
    assert metric_trend(path, "ndcg@5", "nope") == []


def test_reading_a_missing_history_is_empty_and_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "none.sqlite"
    assert list_runs(path) == []
    assert history_rows_for_report(path, ["bm25"], ["ap"]) == []
    assert not path.exists()


def test_regressions_compare_with_the_previous_defined_value(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    ids = nightly(path, [0.80, 0.76, None, 0.70, 0.65, 0.80])
    flags = regressions(list_runs(path, 0), {"ndcg@5": 0.05})
    # 0.80 -> 0.76 is within 0.05; 0.76 -> (undefined) -> 0.70 drops 0.06 against run 2;
    # 0.70 -> 0.65 drops exactly 0.05 (allowed, up to rounding); a rise is never flagged.
    assert [(f.run_id, f.previous_run, f.engine) for f in flags] == [(ids[3], ids[1], "bm25")]
    assert flags[0].drop == pytest.approx(0.06)
    assert "bm25 ndcg@5 fell 0.0600" in flags[0].describe()
    assert regressions(list_runs(path, 0), {"ndcg@5": 0.2}) == []


def test_report_rows_check_the_oldest_shown_run_against_its_predecessor(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    ids = nightly(path, [0.9, 0.5, 0.5])
    rows = history_rows_for_report(path, ["bm25"], ["ndcg@5"], last_n=2, max_drop={"ndcg@5": 0.1})
    assert [r.run_id for r in rows] == ids[1:]
    assert [len(r.regressions) for r in rows] == [1, 0]
    assert rows[0].values == {"bm25": {"ndcg@5": 0.5}}
    unflagged = history_rows_for_report(path, ["dense"], ["ndcg@5"], last_n=2)
    assert all(not r.regressions for r in unflagged)


def test_runs_of_one_config_can_be_told_apart(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    nightly(path, [0.7], source=str(tmp_path / "a.toml"))
    nightly(path, [0.1, 0.2], source=str(tmp_path / "b.toml"))
    assert len(list_runs(path, source=str((tmp_path / "a.toml").resolve()))) == 1
    assert len(list_runs(path)) == 3


def test_a_file_that_is_not_a_history_is_a_clear_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(CacheError, match=r"junk\.sqlite"):
        list_runs(junk)


def test_cli_lists_runs_and_flags_the_regression(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "h.sqlite"
    config = tmp_path / "nightly.toml"
    config.write_text(f'[run]\nhistory = "{path}"\n[thresholds]\nmax_drop = {{"ndcg@5" = 0.05}}\n')
    ids = nightly(path, [0.80, 0.81, 0.60, 0.79], source=str(config))
    nightly(path, [0.1], source="<defaults>")
    assert run_cli(["history", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"last {len(ids)} run(s)" in out  # the <defaults> run is another config's
    bm25 = next(line for line in out.splitlines() if line.startswith("bm25"))
    assert f"REGRESSION run {ids[2]} -0.2100" in bm25
    assert "0.8000" in bm25 and "0.7900" in bm25
    dense = next(line for line in out.splitlines() if line.startswith("dense"))
    assert "REGRESSION" not in dense
    assert run_cli(["history", "--history", str(tmp_path / "none.sqlite")]) == 0
    assert "no runs recorded" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="unknown metric 'nosuch'"):  # an empty table, rc 0
        run_cli(["history", "--config", str(config), "--metric", "nosuch"])


def _damage(path: Path) -> None:
    """Every page of ``path`` after the first overwritten: the header still reads."""
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.seek(4096)
        fh.write(b"\xff" * max(size - 4096, 8192))


def test_a_history_judge_cannot_record_in_is_refused_before_paying(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A damaged history, or another program's database, is found before anything is paid
    (it had been found after every answer was paid, exit 2 and no reports; the other
    program's database had been given judge's tables and switched to WAL)."""
    from judge.cli.main import main
    from tests.test_runner import write_config, write_dataset

    dataset = write_dataset(tmp_path / "rows.jsonl", n_queries=3, n_passages=2)
    history = tmp_path / "h.sqlite"
    config = write_config(
        tmp_path / "c.toml", server, tmp_path / "cache.sqlite", {"run": {"history": str(history)}}
    )
    assert main(["run", str(config), str(dataset), "--out", str(tmp_path / "a")]) in (0, 1)
    paid = len(server.requests)
    _damage(history)
    assert main(["run", str(config), str(dataset), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert f"{history}: run history unreadable: database disk image is malformed" in err
    assert "(found before any call was made)" in err and "Traceback" not in err
    history.unlink()
    with sqlite3.connect(history) as app:
        app.execute("CREATE TABLE users (name TEXT)")
    assert main(["run", str(config), str(dataset), "--out", str(tmp_path / "c")]) == 2
    assert f"{history}: not a judge run history (it holds other tables: users)" in (
        capsys.readouterr().err
    )
    with sqlite3.connect(history) as app:
        assert [r[0] for r in app.execute("SELECT name FROM sqlite_master")] == ["users"]
        assert app.execute("PRAGMA journal_mode").fetchone()[0] != "wal"
    # One whose own table happens to be called runs too: it had passed, and been given
    # judge's run_metrics table.
    history.unlink()
    with sqlite3.connect(history) as app:
        app.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT)")
    assert main(["run", str(config), str(dataset), "--out", str(tmp_path / "d")]) == 2
    assert f"{history}: not a judge run history (it holds other tables: runs)" in (
        capsys.readouterr().err
    )
    with sqlite3.connect(history) as app:
        assert [r[0] for r in app.execute("SELECT name FROM sqlite_master")] == ["runs"]
    assert len(server.requests) == paid


def test_a_history_that_fails_after_judging_leaves_the_reports_and_one_row(
    server: ScriptedServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Judged and paid for: a history that cannot take the run is said, and the reports are
    written without its trend. A finish stopped after recording the run (a report path that
    is a folder) does not record it a second time when it is finished again."""
    from judge.config import load_config
    from judge.report.finish import finish_run
    from tests.test_compare import write_run

    out = write_run(tmp_path / "run", sample_results())
    history = tmp_path / "h.sqlite"
    config = load_config(None, {"run.history": str(history), "judge.scale": "graded"})
    finish_run(config, out, None)
    _damage(history)
    (out / "report.md").unlink()
    (out / "finished.json").unlink()
    finish_run(config, out, None)
    assert "this run is not in the history, and the reports show no trend" in caplog.text
    assert (out / "report.md").is_file()
    made = json.loads((out / "finished.json").read_text(encoding="utf-8"))
    assert made["complete"] is False  # a rerun with nothing new tries the history again
    fresh = tmp_path / "fresh.sqlite"
    again = load_config(None, {"run.history": str(fresh), "judge.scale": "graded"})
    (out / "finished.json").unlink()
    (out / "report.html").unlink()
    (out / "report.html").mkdir()
    with pytest.raises(IsADirectoryError):
        finish_run(again, out, None)
    (out / "report.html").rmdir()
    finish_run(again, out, None)
    assert len(list_runs(fresh)) == 1


def test_a_history_with_a_value_judge_never_writes_is_one_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "h.sqlite"
    nightly(path, [0.5, 0.6])
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE runs SET queries = 'lots'")
    with pytest.raises(CacheError, match=r"h\.sqlite: run history unreadable: a run's queries"):
        list_runs(path)
    from judge.cli.main import main

    assert main(["history", "--history", str(path), "--all"]) == 2
    err = capsys.readouterr().err
    assert "run history unreadable" in err and "Traceback" not in err
