"""judge calibrate: the cut on P(relevant) that agrees best with people, cross-validated over
queries, with CIs; written to the config so the run's metrics use it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from judge.analysis.calibration import Pairs, calibrate
from judge.cli.main import main
from judge.config import load_config
from judge.data.results import append_result
from judge.errors import InputError
from judge.schema import JudgedQuery, Passage, Query, Scale, Verdict


def lenient_judge(n_queries: int, seed: int, shift: float = 2.5) -> list[JudgedQuery]:
    """A judge whose P(yes) is pushed up (by ``shift``): its arg-max says yes to most
    passages, but its probabilities still rank the relevant ones higher."""
    rng = np.random.default_rng(seed)
    scale = Scale.binary()
    out = []
    for q in range(n_queries):
        truth = rng.random(8) < 0.35
        score = np.where(truth, 1.0, -1.0) + rng.normal(0, 0.8, 8)
        p_yes = 1 / (1 + np.exp(-(score + shift)))
        verdicts = tuple(
            Verdict(
                passage_id=f"p{i}",
                rank=i + 1,
                status="ok",
                label="yes" if p_yes[i] >= 0.5 else "no",
                grade=int(p_yes[i] >= 0.5),
                relevant=bool(p_yes[i] >= 0.5),
                probability=float(p_yes[i]),
            )
            for i in range(8)
        )
        query = Query(
            query_id=f"q{q}",
            query="x",
            passages=tuple(Passage(id=f"p{i}", text="t") for i in range(8)),
            labels={f"p{i}": int(truth[i]) for i in range(8)},
        )
        out.append(
            JudgedQuery(query=query, repeat=0, scale=scale.name, verdicts=verdicts, metrics={})
        )
    return out


def _pairs(results: list[JudgedQuery]) -> Pairs:
    from judge.analysis.calibration import relevance_pairs

    return relevance_pairs(results, Scale.binary())


def test_calibration_moves_a_lenient_judges_cut_up_and_raises_kappa() -> None:
    cal = calibrate(_pairs(lenient_judge(60, seed=0)), n_boot=200)
    assert cal.threshold > 0.7
    assert cal.kappa_before is not None and cal.kappa_after is not None
    assert cal.kappa_after > cal.kappa_before + 0.2
    assert cal.kappa_after_ci is not None
    assert cal.kappa_after_ci[0] <= cal.kappa_after <= cal.kappa_after_ci[1]
    assert cal.auc is not None and cal.auc > 0.8
    # Cross-validated kappa is not above the in-sample one (the fit is not free).
    assert cal.kappa_in_sample is not None and cal.kappa_after <= cal.kappa_in_sample + 1e-9


def test_too_few_labelled_passages_is_an_input_error() -> None:
    with pytest.raises(InputError, match="at least 20"):
        calibrate(_pairs(lenient_judge(2, seed=1)))


def test_judge_calibrate_writes_the_threshold_into_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "verdicts.jsonl"
    for jq in lenient_judge(40, seed=2):
        append_result(results, jq)
    config = tmp_path / "c.toml"
    config.write_text('# our nightly judge\n[judge]\nmodel = "m"  # keep me\n', encoding="utf-8")
    assert main(["calibrate", str(results), "--config", str(config), "--write"]) == 0
    out = capsys.readouterr().out
    assert "kappa" in out and "threshold" in out
    text = config.read_text(encoding="utf-8")
    assert "# our nightly judge" in text and "# keep me" in text
    written = load_config(config).metrics.relevance_threshold
    assert written is not None and written > 0.7
    assert main(["calibrate", str(results), "--json", str(tmp_path / "cal.json")]) == 0
    assert json.loads((tmp_path / "cal.json").read_text())["threshold"] == pytest.approx(
        written, abs=1e-4
    )


def test_a_cut_no_better_than_chance_is_not_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "verdicts.jsonl"
    for jq in lenient_judge(40, seed=2):  # the same labels, a judge that says 0.9 to all
        flat = tuple(v.model_copy(update={"probability": 0.9}) for v in jq.verdicts)
        append_result(results, jq.model_copy(update={"verdicts": flat}))
    config = tmp_path / "c.toml"
    config.write_text('[judge]\nmodel = "m"\n', encoding="utf-8")
    assert main(["calibrate", str(results), "--config", str(config), "--write"]) == 2
    assert "no better than chance" in capsys.readouterr().err
    assert load_config(config).metrics.relevance_threshold is None


def test_labels_above_the_judges_scale_without_a_config_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """TREC's 0-3 labels on a binary judge's results, no --config: they were read as yes or
    no and a cut fitted to that (0.18 against 0.53 read as graded)."""
    results = tmp_path / "verdicts.jsonl"
    for jq in lenient_judge(40, seed=2):
        graded = {pid: 3 * grade for pid, grade in (jq.query.labels or {}).items()}
        query = jq.query.model_copy(update={"labels": graded})
        append_result(results, jq.model_copy(update={"query": query}))
    assert main(["calibrate", str(results)]) == 2
    err = capsys.readouterr().err
    assert "human labels go up to 3, the judge's 'binary' scale to 1: pass --config" in err


def test_calibrate_never_writes_over_what_it_reads_nor_reads_one_run_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    results = run / "verdicts.jsonl"
    run.mkdir()
    for jq in lenient_judge(40, seed=2):
        append_result(results, jq)
    (run / "summary.json").write_text("{}", encoding="utf-8")
    config = tmp_path / "c.toml"
    config.write_text('[judge]\nmodel = "m"\n', encoding="utf-8")
    before = {p: p.read_bytes() for p in (results, run / "summary.json", config)}
    for out in (results, run / "summary.json", config):
        argv = ["calibrate", str(run), "--config", str(config), "--json", str(out)]
        assert main(argv) == 2
        assert "that is an input; write elsewhere" in capsys.readouterr().err
    assert main(["calibrate", str(run), "--json", str(tmp_path / "no" / "c.json")]) == 2
    assert "its folder does not exist" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in before} == before
    # A run directory and its results file are one run: not fitted on twice its labels.
    assert main(["calibrate", str(run), str(results)]) == 2
    assert "a source is given twice" in capsys.readouterr().err


def test_a_cut_that_agrees_less_than_the_current_one_is_not_written_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "verdicts.jsonl"
    for jq in lenient_judge(40, seed=3, shift=0.0):  # its 0.5 cut is already the right one
        append_result(results, jq)
    config = tmp_path / "c.toml"
    config.write_text('[judge]\nmodel = "m"\n', encoding="utf-8")
    assert main(["calibrate", str(results), "--config", str(config), "--write"]) == 2
    assert "agrees with the human labels less than the current one" in capsys.readouterr().err
    assert load_config(config).metrics.relevance_threshold is None
    assert main(["calibrate", str(results), "--config", str(config), "--write", "--force"]) == 0
    assert load_config(config).metrics.relevance_threshold is not None
