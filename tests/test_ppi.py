"""Prediction-powered inference: our PPI++ mean matches the ppi_py package, and on a biased
judge the corrected estimate recovers the human mean with a CI narrower than human-only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ppi_py import ppi_mean_ci, ppi_mean_pointestimate

from judge.analysis.ppi import ppi_mean, ppi_metrics
from judge.config import load_config
from judge.report.document import markdown
from judge.report.summary import build_summary
from judge.schema import JudgedQuery, Passage, Query, Scale, Verdict


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("lam", [None, 1.0, 0.3])
def test_ppi_mean_matches_ppi_py(seed: int, lam: float | None) -> None:
    rng = np.random.default_rng(seed)
    truth = rng.uniform(0, 1, size=400)
    f_all = np.clip(truth + 0.2 + rng.normal(0, 0.15, size=400), 0, 1)  # a biased judge
    y, f, fu = truth[:60], f_all[:60], f_all[60:]
    got = ppi_mean(y, f, fu, lam=lam)
    assert got is not None
    estimate, _ = got
    low, high = ppi_mean_ci(y, f, fu, alpha=0.05, lam=lam)
    point = ppi_mean_pointestimate(y, f, fu, lam=lam)
    assert estimate.mean == pytest.approx(float(np.squeeze(point)), abs=1e-10)
    assert estimate.ci_low == pytest.approx(float(np.squeeze(low)), abs=1e-10)
    assert estimate.ci_high == pytest.approx(float(np.squeeze(high)), abs=1e-10)


def _results(n: int, labelled: int, seed: int) -> list[JudgedQuery]:
    """``n`` queries of 5 passages; the judge also says yes to a third of the irrelevant ones;
    the first ``labelled`` queries carry human labels."""
    rng = np.random.default_rng(seed)
    scale = Scale.binary()
    out = []
    for q in range(n):
        truth = rng.random(5) < 0.4
        said = truth | (rng.random(5) < 0.33)
        passages = tuple(Passage(id=f"p{i}", text="t") for i in range(5))
        labels = {f"p{i}": int(truth[i]) for i in range(5)} if q < labelled else None
        verdicts = tuple(
            Verdict(
                passage_id=f"p{i}",
                rank=i + 1,
                status="ok",
                label=scale.by_grade(int(said[i])).name,
                grade=int(said[i]),
                relevant=bool(said[i]),
            )
            for i in range(5)
        )
        query = Query(query_id=f"q{q}", query="x", passages=passages, labels=labels)
        out.append(
            JudgedQuery(query=query, repeat=0, scale="binary", verdicts=verdicts, metrics={})
        )
    return out


def test_a_biased_judge_is_corrected_with_a_narrower_ci_than_humans_alone() -> None:
    results = _results(n=600, labelled=60, seed=3)
    [row] = ppi_metrics(results, ["relevancy_mean"], Scale.binary())
    assert row.n_labelled == 60 and row.n_unlabelled == 540
    assert row.judge_only and row.human_only and row.corrected
    true_mean = 0.4
    # The judge over-reports relevance (0.4 + 0.6/3 = 0.6): its tight CI misses the truth.
    assert row.judge_only.ci_low > true_mean + 0.1
    assert row.corrected.ci_low < true_mean < row.corrected.ci_high
    assert row.narrower is not None and row.narrower > 0.1
    assert row.lam is not None and 0.0 <= row.lam <= 1.0


def test_without_labels_only_the_judge_estimate_exists() -> None:
    [row] = ppi_metrics(_results(n=50, labelled=0, seed=1), ["ap"], Scale.binary())
    assert row.judge_only is not None
    assert row.human_only is None and row.corrected is None and row.narrower is None


def test_the_summary_and_report_show_metrics_corrected_by_human_labels(tmp_path: Path) -> None:
    results = _results(n=120, labelled=30, seed=5)
    config = load_config(None, {"metrics.names": ["relevancy_mean", "ap"]})
    summary = build_summary(config, results, n_boot=50)
    rows = {m.metric: m for m in summary.corrected["default"]}
    assert set(rows) == {"relevancy_mean", "ap"}
    assert rows["relevancy_mean"].n_labelled == 30 and rows["relevancy_mean"].corrected
    text = markdown(summary, results)
    assert "Metrics corrected by human labels" in text and "PPI-corrected" in text
    # Without labels there is no such section.
    bare = [
        jq.model_copy(update={"query": jq.query.model_copy(update={"labels": None})})
        for jq in results
    ]
    assert "corrected by human" not in markdown(build_summary(config, bare, n_boot=50), bare)


def test_intervals_of_a_metric_near_its_bound_stay_within_0_and_1() -> None:
    """A hit rate of 8 in 9 had a human-only interval up to 1.09: past 1 it says nothing."""
    y = np.array([1.0] * 8 + [0.0])
    f = np.array([1.0] * 9)
    got = ppi_mean(y, f, np.array([1.0] * 30))
    assert got is not None and 0.0 <= got[0].ci_low <= got[0].ci_high <= 1.0
    from judge.analysis.ppi import _clt

    human = _clt(y, 0.95)
    assert human is not None and human.ci_high == 1.0 and 0.0 < human.ci_low < human.mean
