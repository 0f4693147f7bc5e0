"""``judge run --mlflow`` and ``judge.log_to_mlflow`` against a local MLflow file store in a
temporary directory, read back with ``MlflowClient``: params, per-engine metrics with CIs (the
summary's own numbers), outcome and exit code as tags, the run's files as artefacts; MLflow
missing or its store broken is one line and exit 2 before anything is paid.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

import judge
from judge.cli.main import main
from judge.errors import ConfigError
from judge.report.mlflow_run import check_mlflow
from tests.servers import ScriptedServer
from tests.test_runner import SAMPLE, write_config

EXPERIMENT = "judge-tests"


@pytest.fixture(autouse=True)
def _store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """MLflow's tracking store: a file store in this test's directory (MLflow 3 asks for the
    opt-in to a file store), never the user's."""
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", EXPERIMENT)
    mlflow.set_tracking_uri(uri)
    return uri


def _runs(client: MlflowClient) -> list[mlflow.entities.Run]:
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert experiment is not None
    return list(client.search_runs([experiment.experiment_id], order_by=["attributes.start_time"]))


def test_judge_run_mlflow_logs_the_run_and_two_runs_compare(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    server = make_server()
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite")
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--mlflow"]) == 0
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))

    client = MlflowClient()
    (run,) = _runs(client)
    params, metrics, tags = run.data.params, run.data.metrics, run.data.tags
    assert run.info.status == "FINISHED"
    assert params["judge.model"] == "judge-test"
    assert params["judge.scale"] == "binary"
    assert params["engines"] == "bm25,dense"
    assert params["repeats"] == "1"
    # Every engine's metrics with their CIs, the summary's numbers ('@' spelled '_at_').
    logged = 0
    for engine, data in summary["engines"].items():
        for name, m in data["metrics"].items():
            key = f"{engine}/{name.replace('@', '_at_')}"
            for suffix, value in (
                ("", m["mean"]),
                (".ci_low", m["ci_low"]),
                (".ci_high", m["ci_high"]),
            ):
                if value is not None:
                    assert metrics[key + suffix] == pytest.approx(value)
                    logged += 1
    assert logged >= 30
    assert metrics["judge/verdicts"] == summary["counts"]["verdicts"] == 78
    assert metrics["judge/requests"] == len(server.requests) == 56
    assert metrics["judge/spent_usd"] == summary["run"]["cost_usd"]
    assert "judge/cost_usd" not in metrics  # the list price is said as such, not as spend
    # The hashed judge disagrees with the sample's human labels: unreliable, exit 0.
    assert tags["judge.outcome"] == summary["outcome"]["status"] == "JUDGE UNRELIABLE"
    assert tags["judge.exit_code"] == "0"
    assert tags["judge.run_dir"] == str(out.resolve())
    assert tags["mlflow.note.content"].endswith(summary["verdict"][-1])
    files = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"summary.json", "report.html", "report.md", "verdicts.jsonl", "qrels.txt"} <= files
    copy = Path(client.download_artifacts(run.info.run_id, "summary.json", str(tmp_path)))
    assert copy.read_bytes() == (out / "summary.json").read_bytes()

    # A second run of the same data that breaches a threshold: exit 1, and the two runs carry
    # the same metric keys, so the MLflow UI compares them metric by metric.
    strict = write_config(tmp_path / "strict.toml", server, tmp_path / "cache.sqlite")
    strict.write_text(
        strict.read_text(encoding="utf-8") + '[thresholds.min]\n"ndcg@5" = 0.99\n',
        encoding="utf-8",
    )
    assert main(["run", str(strict), "--out", str(tmp_path / "strict"), "--mlflow"]) == 1
    first, second = _runs(client)
    assert second.data.tags["judge.outcome"] == "JUDGE UNRELIABLE"  # the same hashed judge
    assert second.data.tags["judge.exit_code"] == "1"
    assert "ndcg@5" in second.data.tags["judge.reasons"]
    assert set(second.data.metrics) == set(first.data.metrics)
    assert len(server.requests) == 56  # the second run's answers all came from the cache
    assert second.data.metrics["judge/spent_usd"] == 0.0  # so it paid nothing
    failed = client.search_runs(
        [first.info.experiment_id], filter_string="tags.`judge.exit_code` = '1'"
    )
    assert [r.info.run_id for r in failed] == [second.info.run_id]


def test_log_to_mlflow_logs_into_the_active_run(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    server = make_server()
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite")
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == 0
    mlflow.set_experiment(EXPERIMENT)
    with mlflow.start_run(run_name="my evaluation") as active:
        mlflow.log_param("retriever", "hybrid-v2")
        run_id = judge.log_to_mlflow(judge.read_run(out))
    assert run_id == active.info.run_id
    (run,) = _runs(MlflowClient())
    assert run.data.params["retriever"] == "hybrid-v2"
    assert run.data.params["judge.model"] == "judge-test"
    assert run.data.tags["judge.outcome"] == "JUDGE UNRELIABLE"


def test_a_second_judge_run_into_the_active_run_goes_into_a_nested_run_not_half_into_it(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """The active run held one judge run; a second, of another dataset, had its metrics
    written beside the first's before MLflow refused its params (a param cannot change)."""
    server = make_server()
    outs = []
    for name in ("first", "second"):
        data = tmp_path / f"{name}.jsonl"
        data.write_text(SAMPLE.read_text(encoding="utf-8"), encoding="utf-8")
        config = write_config(
            tmp_path / f"{name}.toml",
            server,
            tmp_path / "cache.sqlite",
            {"dataset": {"path": str(data)}},
        )
        outs.append(tmp_path / name)
        assert main(["run", str(config), "--out", str(outs[-1])]) == 0
    mlflow.set_experiment(EXPERIMENT)
    with mlflow.start_run(run_name="my evaluation") as active:
        first = judge.log_to_mlflow(outs[0])
        second = judge.log_to_mlflow(outs[1])
    assert first == active.info.run_id and second != first
    client = MlflowClient()
    outer, inner = client.get_run(first), client.get_run(second)
    assert inner.data.tags["mlflow.parentRunId"] == first
    assert outer.data.params["dataset"] != inner.data.params["dataset"]
    assert set(outer.data.metrics) == set(inner.data.metrics)  # nothing of the second in it


def test_a_directory_without_a_summary_is_refused(tmp_path: Path) -> None:
    with pytest.raises(judge.InputError, match=r"no summary\.json"):
        judge.log_to_mlflow(tmp_path)


def test_mlflow_missing_is_one_line_before_anything_is_paid(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = make_server()
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite")
    monkeypatch.setitem(sys.modules, "mlflow", None)  # what `import mlflow` meets uninstalled
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--mlflow"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["judge: mlflow: MLflow is not installed: pip install 'judge[mlflow]'"]
    assert server.requests == []
    assert not (tmp_path / "out" / "verdicts.jsonl").exists()


def test_an_unreachable_tracking_server_is_one_line_before_anything_is_paid(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    mlflow.set_tracking_uri(f"http://127.0.0.1:{port}")
    server = make_server()
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite")
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--mlflow"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"judge: mlflow: the tracking store http://127.0.0.1:{port} fails")
    assert "MLFLOW_TRACKING_URI is not set" not in err[0]
    assert server.requests == []


def test_a_failing_store_without_mlflow_tracking_uri_says_to_set_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the variable unset, MLflow falls back to a store of its own (a SQLite file, which
    a skinny install cannot open): the line says the variable is unset and what to set."""
    monkeypatch.chdir(tmp_path)
    mlflow.set_tracking_uri(None)  # type: ignore[arg-type]  # MLflow's own reset
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    try:
        check_mlflow()
    except ConfigError as exc:
        assert "MLFLOW_TRACKING_URI is not set" in str(exc) and "file:./mlruns" in str(exc)
    else:
        pytest.skip("this MLflow opens its default store")


def test_engines_whose_keys_would_be_one_are_told_apart_and_none_names_another_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """bm25+rm3 and bm25_rm3 were both logged as bm25_rm3/*, one's metrics over the other's;
    an engine named ../up failed the whole log (a key naming another)."""
    from judge.report.mlflow_run import engine_keys

    keys = engine_keys(["bm25+rm3", "bm25_rm3", "dense@v2", "../up", "a/b", "."])
    assert len(set(keys.values())) == 6
    assert keys["bm25+rm3"].startswith("bm25_rm3_") and keys["bm25_rm3"].startswith("bm25_rm3_")
    assert keys["dense@v2"] == "dense_at_v2"
    assert "/" not in "".join(keys.values()) and keys["."] == "_"
    assert "would share metric keys" in caplog.text


def test_a_tracking_server_that_is_down_is_said_at_once_with_its_cause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MLflow's own retries (7, with backoff) had taken four minutes to say so, and the line
    was cut before its cause."""
    import threading

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    mlflow.set_tracking_uri(f"http://127.0.0.1:{port}")
    caught: list[BaseException] = []

    def check() -> None:
        try:
            check_mlflow()
        except ConfigError as exc:
            caught.append(exc)

    worker = threading.Thread(target=check, daemon=True)
    worker.start()
    worker.join(timeout=60)  # a hang guard: MLflow's defaults took 4 minutes
    assert not worker.is_alive()
    (exc,) = caught
    assert "Connection refused" in str(exc) and len(str(exc)) < 500
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # put back as it was


def test_judged_results_in_memory_are_refused_with_the_way_to_log_them() -> None:
    with pytest.raises(TypeError, match=r"not a Judgements: .*finish_run"):
        judge.log_to_mlflow(judge.Judgements([]))  # type: ignore[arg-type]
