"""Everything checkable is checked before the first paid call: each problem is one line naming
file, line and field, exit 2, and the loopback server sees zero requests. ``judge validate
CONFIG DATASET`` runs the same checks."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from judge.calling.cache import Cache
from judge.cli.main import main
from tests.servers import ScriptedServer
from tests.test_runner import SAMPLE, write_config
from tests.wire import Answer, Recorded, keyword_responder, verdict_json

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


@pytest.mark.parametrize(
    ("provider", "options", "said"),
    [
        ("local", {"clinet": "sdk"}, "unknown provider option(s) clinet"),
        ("local", {"client": "sdkk"}, "client = 'sdkk': use one of lean, sdk"),
        ("embedded-fused", {"english": "crosss"}, "english must be one of"),
        ("embedded-fused", {"englsh": "cross"}, "unknown option(s) englsh"),
        ("embedded-rerank", {"batch_size": 0}, "batch_size must be an integer >= 1"),
        ("dashscope", {"client": "sdk"}, "kind 'dashscope' takes no options (got client)"),
    ],
)
def test_provider_options_a_run_would_refuse_are_refused_by_validate_too(
    server: ScriptedServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    provider: str,
    options: dict[str, Any],
    said: str,
) -> None:
    """``judge validate`` had said "ready to run" for options the run then refused, and a
    local server's misspelt option was ignored by both."""
    tables: dict[str, Any] = {"judge": {"provider": provider}, "provider.options": options}
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite", tables)
    if provider != "local":  # no server to name: the embedded models, or a key it reads
        text = config.read_text(encoding="utf-8")
        config.write_text(text.replace(f'base_url = "{server.openai_base_url}"\n', ""))
    for err in _both(config, _dataset(tmp_path), tmp_path / "out", capsys):
        assert said in err, err
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
    # A night judged on another scale compares with nothing made on this one: refused before
    # any request, and baseline set refuses such a run for this config.
    asked = len(server.requests)
    night3 = str(tmp_path / "night3")
    other = ["--set", "judge.scale=graded", "--set", "dataset.label_scale=graded"]
    assert main(["run", str(config), str(dataset), "--out", night3, *other]) == 2
    err = capsys.readouterr().err
    assert (
        "thresholds.baseline was judged on the 'binary' scale, this run judges on 'graded'" in err
    )
    assert len(server.requests) == asked
    tonight = ["run", str(config), str(dataset), "--out", night3, *other, "--first-night"]
    assert main(tonight) in (0, 1)  # let through: its drop checks are skipped, and said so
    summary = json.loads((tmp_path / "night3" / "summary.json").read_text(encoding="utf-8"))
    notes = [c["note"] for c in summary["thresholds"]["checks"] if c["check"] == "baseline"]
    assert notes == [f"{baseline} was judged on the 'binary' scale: drop checks skipped"]
    assert main(["baseline", "set", night3, "--config", str(config)]) == 2
    assert "that run was judged on the 'graded' scale" in capsys.readouterr().err


def test_baseline_set_refuses_a_summary_older_than_the_run_s_results(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A run into the directory started since its summary was made, and did not finish (a
    kill): the summary is not of the results the directory holds, as judge report says; it
    had been taken as the baseline without a word."""
    server = make_server(responder=keyword_responder({"boils": "yes"}))
    baseline = tmp_path / "nightly" / "baseline.json"
    tables = {"thresholds": {"baseline": str(baseline)}, "thresholds.max_drop": {"ap": 0.05}}
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite", tables)
    night = tmp_path / "night"
    argv = ["run", str(config), str(_dataset(tmp_path)), "--out", str(night), "--first-night"]
    assert main(argv) == 0
    results = night / "verdicts.jsonl"
    first = results.read_text(encoding="utf-8").splitlines(keepends=True)[0]
    with results.open("a", encoding="utf-8") as fh:  # what a later run appended before dying
        fh.write(first)
    capsys.readouterr()
    assert main(["baseline", "set", str(night), "--config", str(config)]) == 2
    assert "made from other results than the run directory now holds" in capsys.readouterr().err
    assert not baseline.exists()
    assert main(["baseline", "set", str(night), "--config", str(config), "--force"]) == 0


def test_baseline_set_refuses_a_run_with_no_metric_value(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No answer names a label: no metric has a value, and such a baseline would leave every
    drop check unevaluated, so the gate could never fire (it was taken without a word)."""
    server = make_server(responder=lambda request: "I would rather not say.")
    baseline = tmp_path / "base" / "summary.json"
    tables = {"thresholds": {"baseline": str(baseline)}, "thresholds.max_drop": {"ap": 0.05}}
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite", tables)
    night = str(tmp_path / "night")
    main(["run", str(config), str(_dataset(tmp_path)), "--out", night, "--first-night"])
    capsys.readouterr()
    assert main(["baseline", "set", night, "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "that run has no metric with a value" in err and "--force" in err
    assert not baseline.exists()
    assert main(["baseline", "set", night, "--config", str(config), "--force"]) == 0


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


def test_a_run_history_that_cannot_record_the_run_is_refused_before_paying(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    garbage = tmp_path / "history.sqlite"
    garbage.write_bytes(b"not a database, but a file someone put here\n" * 40)
    dataset = _dataset(tmp_path)
    for history, why in ((garbage, "cannot open the run history"), (tmp_path, "not a file")):
        config = write_config(
            tmp_path / "c.toml",
            server,
            tmp_path / "cache.sqlite",
            {"run": {"history": str(history)}},
        )
        for err in _both(config, dataset, tmp_path / "out", capsys):
            assert f"run.history: {history}: " in err and why in err
            assert "Traceback" not in err
    assert server.requests == []


# Root writes a read-only file; without the capability it does so by, it cannot.
_NOT_ROOT = ["setpriv", "--bounding-set=-dac_override", "--inh-caps=-dac_override"]


@pytest.mark.skipif(
    shutil.which("setpriv") is None or not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="needs setpriv and root, to drop root's permission to write read-only files",
)
@pytest.mark.parametrize("suffix", ["", "-shm"])
def test_a_read_only_cache_file_is_refused_before_paying(
    server: ScriptedServer, tmp_path: Path, suffix: str
) -> None:
    """The checks probed the cache's folder only: a read-only cache file (or its -shm) passed
    them, and the run paid for answers, then stopped unable to keep them."""
    cache = tmp_path / "cache.sqlite"
    Cache(cache).close()  # a cache judge made, which opens read-only as it is
    locked = cache.with_name(cache.name + suffix)
    locked.touch()
    locked.chmod(0o444)
    config = write_config(tmp_path / "c.toml", server, cache)
    dataset = _dataset(tmp_path)
    for command in ("run", "validate"):
        argv = [*_NOT_ROOT, sys.executable, "-m", "judge", command, str(config), str(dataset)]
        done = subprocess.run(
            [*argv, "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2, done.stderr
        assert f"run.cache: {locked} is read-only: make it writable" in done.stderr
        assert "Traceback" not in done.stderr
    assert server.requests == []


@pytest.mark.parametrize(
    ("table", "name", "said"),
    [
        ("thresholds.max_drop", "ndgc", "unknown metric 'ndgc'"),
        ("thresholds.min", "foo", "unknown metric 'foo'"),
        ("thresholds.max", "ndcg@10", "'ndcg@10' is not a metric this run computes"),
    ],
)
def test_a_threshold_on_a_metric_the_run_does_not_compute_is_refused_before_paying(
    server: ScriptedServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    table: str,
    name: str,
    said: str,
) -> None:
    baseline = tmp_path / "baseline.json"  # never read: the metric is refused first
    config = write_config(
        tmp_path / "c.toml",
        server,
        tmp_path / "cache.sqlite",
        {"thresholds": {"baseline": str(baseline)}, table: {f'"{name}"': 0.5}},  # a TOML key
    )
    for err in _both(config, _dataset(tmp_path), tmp_path / "out", capsys, "--first-night"):
        assert f"{table}: {said}" in err
    assert server.requests == []


@pytest.mark.parametrize(
    ("engines", "field"),
    [
        ({"default": {"metrics": {"ap": "high"}}}, "'engines.default.metrics.ap' is not a table"),
        ({"default": 5}, "'engines.default' is not a table"),
        ({"default": {"metrics": {"ap": {"mean": "x"}}}}, "engines.default.metrics.ap.mean"),
    ],
)
def test_a_baseline_with_malformed_engines_is_refused_before_paying(
    server: ScriptedServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    engines: dict[str, Any],
    field: str,
) -> None:
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"engines": engines}), encoding="utf-8")
    config = write_config(
        tmp_path / "c.toml",
        server,
        tmp_path / "cache.sqlite",
        {"thresholds": {"baseline": str(baseline)}, "thresholds.max_drop": {"ap": 0.05}},
    )
    for err in _both(config, _dataset(tmp_path), tmp_path / "out", capsys):
        assert f"{baseline}: " in err and field in err and "(thresholds.baseline)" in err
        assert "Traceback" not in err and "operand" not in err
    assert server.requests == []


def test_drop_checks_against_a_baseline_without_an_engine_are_said_not_skipped(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = make_server(responder=keyword_responder({"boils": "yes"}))  # ap is defined
    baseline = tmp_path / "baseline.json"
    config = write_config(
        tmp_path / "c.toml",
        server,
        tmp_path / "cache.sqlite",
        {"thresholds": {"baseline": str(baseline)}, "thresholds.max_drop": {"ap": 0.05}},
    )
    dataset = _dataset(tmp_path, {**ROW, "engine": "dense"})
    first = tmp_path / "night1"
    assert main(["run", str(config), str(dataset), "--out", str(first), "--first-night"]) == 0
    summary = json.loads((first / "summary.json").read_text(encoding="utf-8"))
    # Neither of the dataset's engines in the baseline: no drop check could be made.
    renamed = {f"old-{e}": v for e, v in summary["engines"].items()}
    baseline.write_text(json.dumps({**summary, "engines": renamed}), encoding="utf-8")
    capsys.readouterr()
    for err in _both(config, dataset, tmp_path / "out", capsys):
        assert "thresholds.baseline has none of the dataset's engines (default, dense" in err
    asked = len(server.requests)
    # One engine renamed: its drop check is not made, and that is said, not a breach.
    renamed = {**summary["engines"], "old-dense": summary["engines"]["dense"]}
    del renamed["dense"]
    baseline.write_text(json.dumps({**summary, "engines": renamed}), encoding="utf-8")
    assert main(["run", str(config), str(dataset), "--out", str(tmp_path / "night2")]) == 0
    err = capsys.readouterr().err
    assert "threshold not evaluated: drop checks (dense): not in the baseline" in err
    assert len(server.requests) == asked  # the first night's answers, from the cache
    checks = json.loads((tmp_path / "night2" / "summary.json").read_text(encoding="utf-8"))
    by = {(c["check"], c["engine"]): c for c in checks["thresholds"]["checks"]}
    assert by["drop ap", "default"]["evaluated"] is True
    unmade = by["drop checks", "dense"]
    assert unmade["ok"] is True and unmade["evaluated"] is False


def test_a_dataset_without_a_single_passage_is_refused(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = tmp_path / "empty.jsonl"
    rows = [{**ROW, "passages": []}, {**ROW, "query_id": "q2", "passages": []}]
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    for err in _both(config, dataset, tmp_path / "out", capsys):
        assert f"{dataset}: field 'passages': none of its 2 queries has a passage" in err
    assert server.requests == []


def test_an_empty_model_name_is_a_config_error(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(
        tmp_path / "c.toml", server, tmp_path / "cache.sqlite", {"judge": {"model": ""}}
    )
    for err in _both(config, _dataset(tmp_path), tmp_path / "out", capsys):
        assert "judge.model" in err and "Traceback" not in err
    assert server.requests == []


def test_a_dry_run_refuses_a_changed_config_as_the_run_would(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset, out = _dataset(tmp_path), str(tmp_path / "out")
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    assert main(["run", str(config), str(dataset), "--out", out]) == 0
    asked = len(server.requests)
    changed = write_config(
        tmp_path / "c2.toml", server, tmp_path / "cache.sqlite", {"judge": {"model": "other"}}
    )
    capsys.readouterr()
    assert main(["run", str(changed), str(dataset), "--out", out, "--dry-run"]) == 2
    dry = capsys.readouterr().err
    assert main(["run", str(changed), str(dataset), "--out", out]) == 2
    assert capsys.readouterr().err == dry and "different" in dry
    assert main(["run", str(changed), str(dataset), "--out", out, "--dry-run", "--fresh"]) == 0
    assert len(server.requests) == asked


def test_a_template_of_the_users_failing_on_one_querys_data_is_refused_before_paying(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found only when that query is rendered: every query is rendered before any call (it
    was found mid-run, after paying for the queries before it, with exit 2: "nothing was
    sent"), by `judge validate` too, naming the row."""
    templates = tmp_path / "templates"
    templates.mkdir()
    builtin = Path(__file__).resolve().parent.parent / "prompts" / "binary.pointwise.en.j2"
    text = builtin.read_text(encoding="utf-8").replace(
        "Query: {{ query }}", "Title: {{ passage.title.upper() }}\nQuery: {{ query }}"
    )
    (templates / "binary.pointwise.en.j2").write_text(text, encoding="utf-8")
    titled = [
        {
            "query_id": f"q{i}",
            "query": f"question {i}",
            "passages": [{"id": f"p{i}", "text": f"text {i}", "title": f"title {i}"}],
        }
        for i in range(3)
    ]
    untitled = {"query_id": "qz", "query": "question z", "passages": [{"id": "pz", "text": "z"}]}
    dataset = tmp_path / "data.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in [*titled, untitled]), "utf-8")
    config = write_config(
        tmp_path / "c.toml",
        server,
        tmp_path / "cache.sqlite",
        {"judge": {"template_dir": str(templates)}, "run": {"concurrency": 1}},
    )
    out = str(tmp_path / "out")
    for err in _both(config, dataset, tmp_path / "out", capsys):
        assert f"{dataset}:4: query 'qz' (default): template 'binary.pointwise.en.j2'" in err
        assert "found before any call was made" in err and "Traceback" not in err
    assert server.requests == []
    dataset.write_text("".join(json.dumps(r) + "\n" for r in titled), "utf-8")
    assert main(["run", str(config), str(dataset), "--out", out]) == 0
    assert len(server.requests) == 3


def test_one_query_id_with_two_texts_is_refused(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Engines are paired by query id: two questions under one id would be compared as one."""
    other = {**ROW, "engine": "b", "query": "why do cats shed"}
    same = {**ROW, "engine": "c", "query": "What do  Kettles do"}  # case and spaces: one text
    dataset = _dataset(tmp_path, other, same)
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    for err in _both(config, dataset, tmp_path / "out", capsys):
        assert f"{dataset}:2: field 'query': query 'q1' is 'why do cats shed' here" in err
        assert f"another text at {dataset}:1" in err and f"{dataset}:3" not in err
    assert server.requests == []


@pytest.mark.parametrize(
    ("bad_id", "said"),
    [
        ("a\x00b", "a control character (U+0000)"),
        ("q\u202e2", "a control character (U+202E)"),
        ("x" * 600, "600 characters (at most 512)"),
    ],
)
def test_ids_the_outputs_cannot_carry_safely_are_refused(
    server: ScriptedServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    bad_id: str,
    said: str,
) -> None:
    """NUL breaks qrels.txt, a bidi control reverses the report line after it, and a 10,000
    character id was echoed whole in every message."""
    dataset = _dataset(tmp_path, {**ROW, "query_id": bad_id})
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    for err in _both(config, dataset, tmp_path / "out", capsys):
        assert f"{dataset}:2: field 'query_id': " in err and f"contains {said}" in err
        assert len(err) < 400
    assert server.requests == []


DATASETS = Path(__file__).resolve().parent.parent / "datasets"


def _trec_config(tmp_path: Path, server: ScriptedServer, run: Path) -> Path:
    """A config whose [dataset] is the TREC run ``run`` with the bundled store and topics."""
    trec = {
        "trec_run": str(run),
        "passage_store": str(DATASETS / "passages.jsonl"),
        "queries": str(DATASETS / "queries.tsv"),
    }
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    text = config.read_text(encoding="utf-8").replace(f'path = "{SAMPLE}"\n', "")
    text = text.replace(
        "[dataset]\n", "[dataset]\n" + "".join(f'{k} = "{v}"\n' for k, v in trec.items())
    )
    config.write_text(text, encoding="utf-8")
    return config


def test_validate_reads_a_trec_run_config_as_judge_run_does(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _trec_config(tmp_path, server, DATASETS / "sample.run")
    data = DATASETS
    assert main(["validate", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"{data / 'sample.run'}: " in out and "ready to run; no problems found" in out
    assert server.requests == []


def test_an_empty_trec_run_or_two_datasets_in_one_config_are_refused(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty run file judged nothing, then failed its unparsed-rate threshold with exit 1
    (a regression, to CI); [dataset] path beside trec_run judged the run file silently."""
    empty = tmp_path / "empty.run"
    empty.write_text("", encoding="utf-8")
    config = _trec_config(tmp_path, server, empty)
    text = config.read_text(encoding="utf-8")
    for command in (["validate", str(config)], ["run", str(config), "--out", str(tmp_path / "o")]):
        assert main(command) == 2
        assert f"{empty}: no run lines: nothing to judge" in capsys.readouterr().err
    config.write_text(text.replace("[dataset]\n", f'[dataset]\npath = "{SAMPLE}"\n'), "utf-8")
    assert main(["run", str(config), "--out", str(tmp_path / "o")]) == 2
    assert "gives both path and trec_run" in capsys.readouterr().err
    assert server.requests == []


def test_one_file_for_cache_and_history_or_a_directory_as_either_is_refused_before_paying(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """judge validate said "ready to run" where judge run then failed (a directory for the
    cache) or mixed two databases in one file (the cache named as the history)."""
    same = tmp_path / "state.sqlite"
    config = write_config(tmp_path / "c.toml", server, same, {"run": {"history": str(same)}})
    dataset = _dataset(tmp_path)
    for err in _both(config, dataset, tmp_path / "out", capsys):
        assert "run.cache and run.history are one file" in err
    folder = tmp_path / "a-folder"
    folder.mkdir()
    config = write_config(tmp_path / "d.toml", server, folder)
    for err in _both(config, dataset, tmp_path / "out", capsys):
        assert f"run.cache: {folder} is a directory, not a file" in err
    assert server.requests == []


@pytest.mark.parametrize(
    ("sets", "said"),
    [
        (["thresholds.min.ndcg=1.5"], "thresholds.min.ndcg: 1.5 is outside [0, 1]"),
        (['thresholds.max."precision@5"=-1'], "thresholds.max.precision@5: -1.0 is outside [0, 1]"),
        (["thresholds.min.ndcg=nan"], "thresholds.min.ndcg: nan is not a finite number"),
        (
            ["thresholds.max_drop.ap=-0.1", "thresholds.baseline=runs/x"],
            "thresholds.max_drop.ap: -0.1 is below 0",
        ),
        (
            ["thresholds.min.ap=0.6", "thresholds.max.ap=0.5"],
            "ap must be at least 0.6 and at most 0.5: no run can pass",
        ),
        (["judge.params.temperature=nan"], "judge.params.temperature: Input should be a finite"),
        (["judge.params.extra_body={seed = nan}"], "extra_body: seed is not a finite number"),
        (["judge.params.max_tokens=0"], "judge.params.max_tokens: Input should be greater"),
        (["run.concurrency=true"], "run.concurrency: Input should be a valid integer"),
        (['run.concurrency="4"'], "run.concurrency: Input should be a valid integer"),
        (["run.repeats=3.0"], "run.repeats: Input should be a valid integer"),
        (["run.repeats=1000000000"], "run.repeats: Input should be less than or equal to 1000"),
        (['run.adaptive_concurrency="no"'], "run.adaptive_concurrency: Input should be a valid"),
        (["run.repeats=0"], "--set run.repeats: run.repeats: Input should be greater"),
        (["dataset.label_scale=grade"], "dataset.label_scale 'grade' is not one of"),
        (['metrics.names=["ndcg", "ap", "ndcg"]'], "each metric once: ndcg named more than"),
    ],
)
def test_thresholds_no_run_can_meet_and_params_no_request_can_carry_are_refused(
    server: ScriptedServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    sets: list[str],
    said: str,
) -> None:
    """A bound outside the metric's range (or NaN) failed every run with exit 1 after paying
    for it; a NaN temperature made every request fail, exit 3 "rerun to resume"; a count or
    a switch of another type was read as something else (true as 1 slot, "no" as on), and a
    billion repeats hung the dry run."""
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    extra = [arg for s in sets for arg in ("--set", s)]
    for err in _both(config, SAMPLE, tmp_path / "out", capsys, *extra):
        assert said in err, err
        assert "Traceback" not in err
    assert server.requests == []
    # A bound at the end of the range, and a sampling temperature, are fine.
    ok = ["--set", "thresholds.min.ndcg=0", "--set", "judge.params.temperature=0.7"]
    assert main(["validate", str(config), str(SAMPLE), *ok]) == 0


def test_engines_disagreeing_on_a_passage_are_said_not_refused(
    server: ScriptedServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One passage id with two texts (pooled metrics take them as one passage) or two human
    labels across engines' rows was accepted without a word; it is said, once each."""
    rows = [
        {**ROW, "engine": "a", "passages": [{"id": "p1", "text": "honey"}], "labels": {"p1": 1}},
        {**ROW, "engine": "b", "passages": [{"id": "p1", "text": "wax"}], "labels": {"p1": 0}},
    ]
    dataset = tmp_path / "data.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    config.write_text(config.read_text().replace('label_scale = "graded"', ""), encoding="utf-8")
    assert main(["validate", str(config), str(dataset)]) == 0
    said = caplog.text
    assert "passage 'p1' is another text in engine 'b' than in 'a'" in said
    assert "passage 'p1' is labelled 0 in engine 'b's row and 1 in 'a's" in said
    assert server.requests == []


def test_validate_finds_what_the_run_would_refuse_a_template_that_does_not_load_and_a_cache(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`judge validate CONFIG DATASET` had said "ready to run" of a template with a syntax
    error and of a cache that is not SQLite, both of which the run refuses."""
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    templates = tmp_path / "tmpl"
    templates.mkdir()
    (templates / "binary.pointwise.en.j2").write_text("broken {{ \n", encoding="utf-8")
    for err in _both(
        config, SAMPLE, tmp_path / "out", capsys, "--set", f"judge.template_dir={templates}"
    ):
        assert "judge.template_dir: template 'binary.pointwise.en.j2' line 1: syntax error" in err
    mine = tmp_path / "mine.txt"
    mine.write_text("not a cache\n", encoding="utf-8")
    for err in _both(config, SAMPLE, tmp_path / "out", capsys, "--set", f"run.cache={mine}"):
        assert "run.cache: " in err and "not a SQLite file" in err
    assert mine.read_text(encoding="utf-8") == "not a cache\n" and server.requests == []


def test_a_dataset_on_the_command_line_is_judged_over_the_configs_trec_run(
    server: ScriptedServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As validate says: the command line's dataset, with a warning (the run had refused it as
    "[dataset] gives both path and trec_run", blaming a path the config never gave)."""
    config = _trec_config(tmp_path, server, DATASETS / "sample.run")
    out = tmp_path / "out"
    assert main(["run", str(config), str(SAMPLE), "--out", str(out), "--dry-run"]) == 0
    assert "is judged, not [dataset] trec_run" in caplog.text
    assert "dry run: 14 query-repeats" in capsys.readouterr().out  # the sample's 14 lists


def test_a_nightly_run_says_first_whether_it_moved_against_the_baseline(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With a baseline, the console's first lines say whether each engine moved on the
    primary metric (the report's "Tonight vs baseline", in short), not only a threshold line
    at the end; one that holds still says so too."""
    server = make_server(responder=keyword_responder({"boils": "yes"}))
    baseline = tmp_path / "baseline.json"
    tables = {"thresholds": {"baseline": str(baseline)}}
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite", tables)
    with config.open("a", encoding="utf-8") as fh:
        fh.write('[metrics]\nnames = ["ndcg", "ap"]\n')

    def night(name: str, answer_first: bool, asked: str = "kettles") -> Path:
        rows = []
        for i in range(8):
            found = {"id": f"a{i}", "text": f"A kettle boils water, {i}."}
            other = {"id": f"b{i}", "text": f"Tea is a drink, {i}."}
            passages = [found, other] if answer_first else [other, found]
            row = {"query_id": f"q{i}", "query": f"{asked} {i}", "engine": "bm25"}
            rows.append({**row, "passages": passages})
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        return path

    first = str(tmp_path / "night1")
    argv = ["run", str(config), str(night("n1", True)), "--out", first, "--first-night"]
    assert main(argv) == 0
    assert main(["baseline", "set", first, "--config", str(config)]) == 0
    capsys.readouterr()
    assert main(["run", str(config), str(night("n2", True)), "--out", str(tmp_path / "n2")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == (
        "bm25 vs the baseline: no query differs between tonight and the baseline on ndcg "
        "(better on 0, tied 8, worse 0 of 8 queries)"
    )
    third = tmp_path / "n3"
    assert main(["run", str(config), str(night("n3", False)), "--out", str(third)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("bm25 vs the baseline: ndcg fell (worse): -0.3691 ")
    assert out[1].endswith("p = 0.008, better on 0, tied 0, worse 8 of 8 queries")
    assert out[2].startswith("Trust: ")
    # The report says it in the same words, and so does one made again by `judge report`.
    moved = f"bm25: {out[1].removeprefix('bm25 vs the baseline: ')}"
    assert moved in (third / "report.md").read_text(encoding="utf-8")
    for again in (["--config", str(config)], ["--rebuild"]):
        (third / "report.md").unlink()
        assert main(["report", str(third), *again]) == 0
        assert moved in (third / "report.md").read_text(encoding="utf-8"), again
    # The same ids asking other questions are not paired: no fall is read from them.
    other = str(night("n4", False, asked="teapots"))
    capsys.readouterr()
    assert main(["run", str(config), other, "--out", str(tmp_path / "n4")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == (
        "bm25 vs the baseline: tonight and the baseline share no query where ndcg is defined: "
        "8 of their query ids ask another question in each, not paired"
    )


def test_an_engine_left_unscored_by_unparsed_verdicts_fails_the_run(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One unparsed verdict in each of an engine's lists is 5% of the run's verdicts, under
    max_unparsed_rate, yet leaves every one of its queries without a metric: the run had
    PASSED with no number for that engine."""
    sane = keyword_responder({"boils": "yes"})

    def respond(request: Recorded) -> Answer | str:
        return "no idea" if "garble" in json.dumps(request.messages) else sane(request)

    server = make_server(responder=respond)
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    with config.open("a", encoding="utf-8") as fh:
        fh.write('[metrics]\nnames = ["ndcg", "ap"]\n')
    rows = []
    for engine in ("a", "b"):
        for i in range(8):
            passages = [{"id": f"k{i}", "text": f"A kettle boils water, {i}."}]
            passages += [{"id": f"t{i}-{j}", "text": f"Tea is a drink, {i} {j}."} for j in range(8)]
            last = "garble garble" if engine == "a" else "A teapot holds tea"
            passages.append({"id": f"x{i}", "text": f"{last}, {i}."})
            row = {"query_id": f"q{i}", "query": f"kettles {i}", "engine": engine}
            rows.append({**row, "passages": passages})
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert main(["run", str(config), str(data), "--out", str(tmp_path / "out")]) == 1
    said = capsys.readouterr()
    out = said.out + said.err
    assert "breached: unscored ndcg (a): 1.0000 (8 of 8 queries hold an unparsed verdict " in out
    assert "not scored on ndcg" in out and "unscored ndcg (b)" not in out
    # The verdict says why there is none.
    assert "b and a share no query where ndcg is defined" in out
    report = json.loads((tmp_path / "out" / "summary.json").read_text(encoding="utf-8"))
    assert report["counts"]["unparsed"] == 8 and report["outcome"]["status"] == "FAILED"


def test_a_threshold_on_a_soft_metric_a_judge_without_logprobs_cannot_give_is_refused(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """soft_ap is read from P(relevant), which a judge asked for no logprobs never gives: the
    run had paid for every call, found it undefined everywhere, and failed (exit 1)."""
    extra = '[metrics]\nnames = ["ap", "soft_ap"]\n[thresholds]\nmin = { soft_ap = 0.5 }\n'

    def config_with(logprobs: bool) -> Path:
        tables = {"judge.params": {"logprobs": logprobs}}
        config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite", tables)
        with config.open("a", encoding="utf-8") as fh:
            fh.write(extra)
        return config

    dataset = _dataset(tmp_path)
    for err in _both(config_with(False), dataset, tmp_path / "out", capsys):
        assert "thresholds.min.soft_ap: 0.5 can never be evaluated" in err, err
    assert server.requests == []
    argv = ["validate", str(config_with(True)), str(dataset), "--out", str(tmp_path / "out")]
    assert main(argv) == 0


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_pipe_as_the_cache_is_refused_not_waited_on(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reading a named pipe's first bytes waits for a writer that never comes: the run had
    hung in its checks, saying nothing."""
    pipe = tmp_path / "cache.sqlite"
    os.mkfifo(pipe)
    config = write_config(tmp_path / "c.toml", server, pipe)
    for err in _both(config, _dataset(tmp_path), tmp_path / "out", capsys):
        assert f"run.cache: {pipe}: not a regular file (a pipe or a device)" in err, err
    assert server.requests == []


def test_validate_cuts_passages_as_its_config_does_and_refuses_the_flag_beside_one(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--max-passage-chars beside a config had been ignored in silence."""
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    dataset = _dataset(tmp_path)
    assert main(["validate", str(config), str(dataset), "--max-passage-chars", "5"]) == 2
    err = capsys.readouterr().err
    assert "--max-passage-chars is for a dataset validated without a config" in err
    assert main(["validate", str(dataset), "--max-passage-chars", "5"]) == 0
    cut = re.search(r"(\d+) truncated", capsys.readouterr().out)
    assert cut and int(cut.group(1)) > 0


def test_counts_out_of_range_and_a_run_given_twice_are_refused_in_one_line(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A negative --worst, --last or --limit had been taken, calibrate's --folds 1 quietly
    became 2, calibrate counted one run given twice as twice its labels, and history printed
    its whole table before saying a --metric was unknown."""
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    run = tmp_path / "o"
    for argv, said in (
        (["report", str(run), "--worst", "-1"], "must be at least 0, got -1"),
        (["report", str(run), "--last", "-1"], "must be at least 0, got -1"),
        (["history", "--config", str(config), "--limit", "-1"], "must be at least 0, got -1"),
        (["calibrate", str(run), "--folds", "1"], "must be at least 2, got 1"),
    ):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2, argv
        assert said in capsys.readouterr().err, argv
    run.mkdir()
    assert main(["calibrate", str(run), str(run)]) == 2
    assert "judge calibrate: a source is given twice" in capsys.readouterr().err
    assert main(["history", "--config", str(config), "--metric", "nope"]) == 2
    said = capsys.readouterr()
    assert said.out == "" and "nope" in said.err


def test_a_negative_seed_is_refused_before_paying(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A seed of -1 had passed every check; the run paid for every call, then failed in numpy
    with a traceback and exit 1 (a threshold breach), and so did compare and calibrate."""
    config = write_config(
        tmp_path / "c.toml", server, tmp_path / "cache.sqlite", {"run": {"seed": -1}}
    )
    dataset = _dataset(tmp_path)
    for err in _both(config, dataset, tmp_path / "out", capsys):
        assert "run.seed" in err and "Traceback" not in err, err
    plain = write_config(tmp_path / "p.toml", server, tmp_path / "cache.sqlite")
    for argv in (
        ["run", str(plain), str(dataset), "--out", str(tmp_path / "o"), "--seed", "-1"],
        ["compare", str(tmp_path / "o"), str(tmp_path / "o2"), "--seed", "-1"],
        ["calibrate", str(tmp_path / "o"), "--seed", "-1"],
    ):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2, argv
        assert "must be at least 0, got -1" in capsys.readouterr().err
    assert server.requests == []


def test_a_cache_path_from_the_command_line_is_not_blamed_on_the_config(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    folder = tmp_path / "a-folder"
    folder.mkdir()
    extra = ("--set", f"run.cache={folder}")
    for err in _both(config, _dataset(tmp_path), tmp_path / "out", capsys, *extra):
        assert f"the command line: run.cache: {folder} is a directory, not a file" in err
        assert f"{config}: run.cache" not in err
    assert server.requests == []


def test_baseline_set_says_when_the_run_it_takes_did_not_pass(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A run that FAILED its thresholds may be a new normal, but it is said, not taken in
    silence."""
    render = {"yes": verdict_json("yes"), "no": "I would rather not say."}.__getitem__
    server = make_server(responder=keyword_responder({"boils": "yes"}, render=render))
    baseline = tmp_path / "baseline.json"
    tables = {
        "thresholds": {"baseline": str(baseline), "max_unparsed_rate": 0.0},
        "metrics": {"unjudged": "skip"},
    }
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite", tables)
    night = str(tmp_path / "night")
    argv = ["run", str(config), str(_dataset(tmp_path)), "--out", night, "--first-night"]
    assert main(argv) == 1
    capsys.readouterr()
    assert main(["baseline", "set", night, "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "note: that run FAILED (" in out and "later nights compare with it" in out


def test_a_night_line_that_finds_no_difference_carries_the_drop_check_that_failed(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The shared queries tie, but the engine's mean over all tonight's queries fell past
    max_drop: the line that leads says both, not "no query differs" above a FAILED."""
    server = make_server(responder=keyword_responder({"boils": "yes"}))
    baseline = tmp_path / "baseline.json"
    tables = {"thresholds": {"baseline": str(baseline)}}
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite", tables)
    with config.open("a", encoding="utf-8") as fh:
        fh.write('[metrics]\nnames = ["ndcg", "ap"]\n[thresholds.max_drop]\nndcg = 0.1\n')

    def night(name: str, ids: range, answer_first: bool) -> Path:
        rows = []
        for i in ids:
            found = {"id": f"a{i}", "text": f"A kettle boils water, {i}."}
            other = {"id": f"b{i}", "text": f"Tea is a drink, {i}."}
            passages = [found, other] if answer_first or i < 8 else [other, found]
            row = {"query_id": f"q{i}", "query": f"kettles {i}", "engine": "bm25"}
            rows.append({**row, "passages": passages})
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        return path

    first = str(tmp_path / "night1")
    argv = ["run", str(config), str(night("n1", range(8), True)), "--out", first, "--first-night"]
    assert main(argv) == 0
    assert main(["baseline", "set", first, "--config", str(config)]) == 0
    capsys.readouterr()
    tonight = str(night("n2", range(3, 14), False))  # q3..q7 shared, all tied; 6 new, worse
    assert main(["run", str(config), tonight, "--out", str(tmp_path / "n2")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("bm25 vs the baseline: no query differs"), out[1]
    assert "; but its drop check failed: drop ndcg (bm25): fell" in out[1], out[1]


def test_a_baseline_without_the_primary_metric_is_said_so_not_that_no_query_is_shared(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = make_server(responder=keyword_responder({"boils": "yes"}))
    baseline = tmp_path / "baseline.json"
    tables = {"thresholds": {"baseline": str(baseline)}}
    configs = {}
    for names in ('["ap"]', '["ndcg", "ap"]'):
        config = write_config(
            tmp_path / f"c{len(configs)}.toml", server, tmp_path / "cache.sqlite", tables
        )
        with config.open("a", encoding="utf-8") as fh:
            fh.write(f"[metrics]\nnames = {names}\n")
        configs[names] = config
    rows = [
        {
            "query_id": f"q{i}",
            "query": f"kettles {i}",
            "engine": "bm25",
            "passages": [{"id": f"a{i}", "text": f"A kettle boils water, {i}."}],
        }
        for i in range(4)
    ]
    data = tmp_path / "n.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    first = str(tmp_path / "night1")
    argv = ["run", str(configs['["ap"]']), str(data), "--out", first, "--first-night"]
    assert main(argv) == 0
    assert main(["baseline", "set", first, "--config", str(configs['["ap"]'])]) == 0
    capsys.readouterr()
    argv = ["run", str(configs['["ndcg", "ap"]']), str(data), "--out", str(tmp_path / "n2")]
    main(argv)
    out = capsys.readouterr().out.splitlines()
    assert out[1] == (
        "bm25 vs the baseline: the baseline has no ndcg (it was summarised with other "
        "[metrics] names): nothing to pair"
    )


def test_baseline_set_never_writes_over_a_file_that_is_not_a_summary(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = make_server(responder=keyword_responder({"boils": "yes"}))
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    first = tmp_path / "night1"
    dataset = _dataset(tmp_path)
    assert main(["run", str(config), str(dataset), "--out", str(first), "--first-night"]) == 0
    for target in (first / "verdicts.jsonl", config):
        with config.open("a", encoding="utf-8") as fh:
            fh.write(f'[thresholds]\nbaseline = "{target}"\n')
        before = target.read_bytes()
        assert main(["baseline", "set", str(first), "--config", str(config)]) == 2
        assert "holds a file that is not a summary" in capsys.readouterr().err
        assert target.read_bytes() == before
        text = config.read_text(encoding="utf-8")
        config.write_text(text[: text.index("[thresholds]")], encoding="utf-8")


def test_validate_refuses_a_run_directory_that_run_would_refuse(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = make_server(responder=keyword_responder({"boils": "yes"}))
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    dataset = _dataset(tmp_path)
    out = tmp_path / "out"
    assert main(["run", str(config), str(dataset), "--out", str(out)]) == 0
    other = write_config(
        tmp_path / "other.toml", server, tmp_path / "cache.sqlite", {"judge": {"model": "m2"}}
    )
    capsys.readouterr()
    run_err, validate_err = _both(other, dataset, out, capsys)
    assert "made with a different config" in run_err
    assert validate_err == run_err


def test_baseline_set_says_what_the_next_nights_would_refuse_or_skip(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = make_server(responder=keyword_responder({"boils": "yes"}))
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    first = tmp_path / "night1"
    assert main(["run", str(config), str(_dataset(tmp_path)), "--out", str(first)]) == 0
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({**ROW, "engine": "renamed"}) + "\n", encoding="utf-8")
    nightly = write_config(
        tmp_path / "nightly.toml",
        server,
        tmp_path / "cache.sqlite",
        {
            "judge": {"model": "another-judge"},
            "dataset": {"path": str(other)},
            "thresholds": {"baseline": str(tmp_path / "base.json")},
            "thresholds.max_drop": {'"ndcg@10"': 0.05},
        },
    )
    capsys.readouterr()
    assert main(["baseline", "set", str(first), "--config", str(nightly)]) == 0
    out = capsys.readouterr().out
    assert "that run has none of the engines of" in out
    assert "a night of that dataset would refuse this baseline" in out
    # ... as it does: said before any request.
    asked = len(server.requests)
    assert main(["run", str(nightly), "--out", str(tmp_path / "night2")]) == 2
    assert len(server.requests) == asked
    other.write_text(json.dumps(ROW) + "\n", encoding="utf-8")  # the engine the run has
    capsys.readouterr()
    assert main(["baseline", "set", str(first), "--config", str(nightly)]) == 0
    out = capsys.readouterr().out
    assert "none of the engines" not in out
    assert "judged by model 'judge-test'" in out and "that run has no ndcg@10" in out
