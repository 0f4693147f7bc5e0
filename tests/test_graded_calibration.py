"""Graded calibration: a graded judge's expected grade E[g] from its label logprobs, cut points
on it chosen against human grades (cross-validated over queries, with CIs), written to
``[metrics] grade_cuts`` and applied at metric time."""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from judge.analysis.calibration import GradePairs, calibrate_grades, grade_pairs
from judge.analysis.cutpoints import best_cuts, grade_kappa
from judge.cli.main import main
from judge.config import load_config
from judge.data.results import RESULTS_FILE, append_result, read_results
from judge.errors import InputError
from judge.judging.verdicts import parse_pointwise
from judge.metrics.compute import metrics_for_queries
from judge.metrics.cuts import cut_index
from judge.providers.base import Completion, TokenLogprob, TopLogprob
from judge.schema import JudgedQuery, MetricPolicy, Passage, Query, Scale, Verdict
from tests.servers import ScriptedServer
from tests.wire import Item, Recorded, probs_answer

GRADED = Scale.graded()
GRADES = (0, 1, 2, 3)
# E[g] = 0.6 + 0.5 * true grade (+ noise): the cuts that separate the grades are the midpoints.
TRUE_CUTS = (0.85, 1.35, 1.85)


def noisy_judge(n_queries: int, per_query: int, sd: float, seed: int) -> list[JudgedQuery]:
    """A graded judge whose expected grade is a compressed, shifted, noisy function of the true
    grade; its arg-max label is E[g] rounded, so it under-grades relevant passages."""
    rng = np.random.default_rng(seed)
    out = []
    for q in range(n_queries):
        truth = rng.integers(0, 4, per_query)
        expected = np.clip(0.6 + 0.5 * truth + rng.normal(0, sd, per_query), 0, 3)
        said = np.clip(np.round(expected), 0, 3).astype(int)
        verdicts = tuple(
            Verdict(
                passage_id=f"p{i}",
                rank=i + 1,
                status="ok",
                label=GRADED.by_grade(int(said[i])).name,
                grade=int(said[i]),
                relevant=GRADED.relevant(int(said[i])),
                probability=float(expected[i]) / 3,
                expected_grade=float(expected[i]),
            )
            for i in range(per_query)
        )
        query = Query(
            query_id=f"q{q}",
            query="x",
            passages=tuple(Passage(id=f"p{i}", text="t") for i in range(per_query)),
            labels={f"p{i}": int(truth[i]) for i in range(per_query)},
        )
        out.append(
            JudgedQuery(query=query, repeat=0, scale="graded", verdicts=verdicts, metrics={})
        )
    return out


# --- the cut search ------------------------------------------------------------------------


def test_the_search_recovers_known_cuts_and_reports_cross_validated_kappa() -> None:
    cal = calibrate_grades(grade_pairs(noisy_judge(60, 10, 0.12, seed=0), GRADED), GRADED)
    assert cal.cuts == pytest.approx(TRUE_CUTS, abs=0.08)
    assert cal.n_pairs == 600 and cal.n_queries == 60 and cal.folds == 5
    assert cal.kappa_before is not None and cal.kappa_after is not None
    # Rounding E[g] is what the arg-max judge does here; the calibrated cuts fix it.
    assert cal.kappa_rounded == pytest.approx(cal.kappa_before)
    assert cal.kappa_after > cal.kappa_before + 0.3
    assert cal.kappa_after_ci is not None and cal.kappa_before_ci is not None
    assert cal.kappa_after_ci[0] <= cal.kappa_after <= cal.kappa_after_ci[1]
    assert cal.kappa_before_ci[1] < cal.kappa_after_ci[0]
    assert cal.kappa_in_sample is not None and cal.kappa_after <= cal.kappa_in_sample + 1e-9
    assert cal.auc is not None and cal.auc > 0.95


def test_coordinate_ascent_is_at_or_next_to_the_exhaustive_optimum() -> None:
    """Small, noisy samples (the hard case): never below the rounding cuts it starts from, the
    exhaustive optimum on nearly every sample, within 0.01 of it on the rest."""
    gaps = []
    for seed in range(12):
        rng = np.random.default_rng(seed)
        truth = rng.integers(0, 4, 30)
        expected = np.clip(0.4 + 0.6 * truth + rng.normal(0, 0.5, 30), 0, 3)
        found = grade_kappa(cut_index(expected, best_cuts(expected, truth, GRADES)), truth, GRADES)
        rounded = grade_kappa(cut_index(expected, (0.5, 1.5, 2.5)), truth, GRADES)
        assert found is not None and rounded is not None and found >= rounded
        # Every way to place three cuts: one point per gap between distinct values, shared or not.
        values = np.unique(expected)
        points = np.concatenate([[values[0] - 1], (values[1:] + values[:-1]) / 2, [values[-1] + 1]])
        best = max(
            grade_kappa(cut_index(expected, cuts), truth, GRADES) or -1.0
            for cuts in itertools.combinations_with_replacement(points, 3)
        )
        gaps.append(best - found)
    assert max(gaps) < 0.01
    assert sum(gap < 1e-12 for gap in gaps) >= 10


def test_uninformative_data_keeps_the_rounding_cuts() -> None:
    # Every passage at E[g] = 1.5 (ties everywhere): no cut can do better than another.
    expected = np.full(40, 1.5)
    truth = np.tile([0, 1, 2, 3], 10)
    assert best_cuts(expected, truth, GRADES) == (0.5, 1.5, 2.5)


def test_too_few_pairs_or_one_human_grade_is_an_input_error() -> None:
    with pytest.raises(InputError, match="at least 20"):
        calibrate_grades(grade_pairs(noisy_judge(1, 10, 0.1, seed=1), GRADED), GRADED)
    one_grade = GradePairs(
        expected_grade=(1.0,) * 30, judge_grade=(1,) * 30, human_grade=(2,) * 30, query=("q",) * 30
    )
    with pytest.raises(InputError, match=r"two\s+different grades"):
        calibrate_grades(one_grade, GRADED)


def test_verdicts_without_an_expected_grade_are_left_out() -> None:
    results = noisy_judge(3, 10, 0.1, seed=2)
    old = results[0].model_copy(
        update={
            "verdicts": tuple(
                v.model_copy(update={"expected_grade": None}) for v in results[0].verdicts
            )
        }
    )
    assert len(grade_pairs([old, *results[1:]], GRADED).expected_grade) == 20


# --- the expected grade, parsed from label logprobs ------------------------------------------


def _completion(text: str, label: str, top: dict[str, float]) -> Completion:
    head, _, tail = text.partition(label)
    alts = tuple(TopLogprob(token=t, logprob=lp) for t, lp in top.items())
    tokens = (
        TokenLogprob(token=head, logprob=0.0),
        TokenLogprob(token=label, logprob=top[label], top=alts),
        TokenLogprob(token=tail, logprob=0.0),
    )
    return Completion(text=text, finish_reason="stop", logprobs=tokens)


def test_a_graded_verdict_carries_its_expected_grade_and_a_binary_one_does_not() -> None:
    top = {"partial": -0.4, "answers": -1.2, "related": -2.0, "unrelated": -3.5}
    parsed = parse_pointwise(_completion('{"verdict": "partial"}', "partial", top), GRADED)
    mass = {2: math.exp(-0.4), 3: math.exp(-1.2), 1: math.exp(-2.0), 0: math.exp(-3.5)}
    expected = sum(g * m for g, m in mass.items()) / sum(mass.values())
    assert parsed.expected_grade == pytest.approx(expected)
    assert parsed.probability == pytest.approx(expected / 3)
    yes = parse_pointwise(
        _completion('{"verdict": "yes"}', "yes", {"yes": -0.1, "no": -2.4}), Scale.binary()
    )
    assert yes.probability is not None and yes.expected_grade is None
    # Verdict files written before the field existed still load.
    old = {"passage_id": "p", "rank": 1, "status": "ok", "label": "partial", "grade": 2}
    assert Verdict.model_validate(old).expected_grade is None


# --- applying the cuts at metric time ---------------------------------------------------------


def _query(expected: list[float | None], grades: list[int]) -> tuple[Query, list[Verdict]]:
    query = Query(
        query_id="q", query="x", passages=tuple(Passage(id=f"p{i}", text="t") for i in range(3))
    )
    verdicts = [
        Verdict(
            passage_id=f"p{i}",
            rank=i + 1,
            status="ok",
            label=GRADED.by_grade(g).name,
            grade=g,
            relevant=GRADED.relevant(g),
            expected_grade=e,
        )
        for i, (e, g) in enumerate(zip(expected, grades, strict=True))
    ]
    return query, verdicts


def test_cuts_decide_the_grade_from_the_expected_grade() -> None:
    names = ["relevancy_mean", "precision@3", "hit@1"]
    # Labels 0, 1, 3; expected grades 0.55, 1.4 and (no logprobs) none.
    scored = [_query([0.55, 1.4, None], [0, 1, 3])]
    plain = metrics_for_queries(names, scored, GRADED)[0]
    assert plain == pytest.approx({"relevancy_mean": 4 / 9, "precision@3": 1 / 3, "hit@1": 0.0})
    # Cuts 0.5 < 1.0 < 1.2: E 0.55 -> 1 (one cut at or below), E 1.4 -> 3; the third keeps 3.
    policy = MetricPolicy(grade_cuts=(0.5, 1.0, 1.2))
    cut = metrics_for_queries(names, scored, GRADED, policy)[0]
    assert cut == pytest.approx({"relevancy_mean": 7 / 9, "precision@3": 2 / 3, "hit@1": 0.0})
    # A cut exactly at E[g] counts as at or below it.
    at = metrics_for_queries(names, scored, GRADED, MetricPolicy(grade_cuts=(0.55, 2, 2.5)))[0]
    assert at["relevancy_mean"] == pytest.approx((1 + 1 + 3) / 9)


# --- the config key ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cuts", "scale", "message"),
    [
        (
            "[1.5, 0.5, 2.5]",
            "graded",
            r"metrics\.grade_cuts: must be finite and strictly increasing",
        ),
        (
            "[0.5, 0.5, 2.5]",
            "graded",
            r"metrics\.grade_cuts: must be finite and strictly increasing",
        ),
        ("[0.5, 1.5]", "graded", r"metrics\.grade_cuts: scale 'graded' has 4 grades, so 3 cut"),
        ("[0.5]", "binary", r"metrics\.grade_cuts needs a graded scale"),
    ],
)
def test_bad_grade_cuts_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cuts: str, scale: str, message: str
) -> None:
    results = tmp_path / "verdicts.jsonl"
    append_result(results, noisy_judge(1, 3, 0.1, seed=3)[0])
    config = tmp_path / "c.toml"
    config.write_text(f'[judge]\nscale = "{scale}"\n[metrics]\ngrade_cuts = {cuts}\n')
    assert main(["metrics", str(results), "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"judge: {config}: ")
    assert re.search(message, err)


def test_calibrate_writes_grade_cuts_that_round_trip_through_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "verdicts.jsonl"
    for jq in noisy_judge(30, 10, 0.12, seed=4):
        append_result(results, jq)
    config = tmp_path / "c.toml"
    config.write_text(
        '# nightly graded judge\n[judge]\nscale = "graded"  # keep me\n', encoding="utf-8"
    )
    args = ["calibrate", str(results), "--config", str(config), "--n-boot", "200"]
    assert main([*args, "--write", "--json", str(tmp_path / "cal.json")]) == 0
    out = capsys.readouterr().out
    assert "weighted kappa at calibrated cut points, cross-validated:" in out
    assert "wrote [metrics] grade_cuts = [" in out
    text = config.read_text(encoding="utf-8")
    assert "# nightly graded judge" in text and "# keep me" in text
    written = load_config(config).metrics.grade_cuts
    cal = json.loads((tmp_path / "cal.json").read_text())
    assert written == pytest.approx(cal["cuts"], abs=1e-4)
    assert written == pytest.approx(TRUE_CUTS, abs=0.1)
    # Re-scored with the written cuts, each query's relevancy is close to its human one.
    rows = read_results(results)
    scored = [(jq.query, jq.verdicts) for jq in rows]
    human = np.array([np.mean(list((jq.query.labels or {}).values())) / 3 for jq in rows])

    def error(policy: MetricPolicy) -> float:
        got = metrics_for_queries(["relevancy_mean"], scored, GRADED, policy)
        return float(np.mean(np.abs([m["relevancy_mean"] for m in got] - human)))

    assert error(load_config(config).metrics) < 0.02 < 0.05 < error(MetricPolicy())


# --- end to end: judge run over HTTP --------------------------------------------------------

# Passage p of every query: the label probabilities the loopback judge answers with.
PROBS = {
    0: {"unrelated": 0.6, "related": 0.3, "partial": 0.05, "answers": 0.05},  # E 0.55
    1: {"unrelated": 0.1, "related": 0.45, "partial": 0.4, "answers": 0.05},  # E 1.4
    2: {"unrelated": 0.05, "related": 0.15, "partial": 0.3, "answers": 0.5},  # E 2.25
}


def graded_responder(request: Recorded) -> Item:
    found = re.search(r"text (\d) answering", request.prompt)
    assert found is not None, request.prompt
    return probs_answer(PROBS[int(found.group(1))])


def test_judge_run_writes_expected_grades_and_cuts_change_the_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from judge.run import runner
    from judge.run.progress import Progress
    from tests.test_runner import write_config, write_dataset

    monkeypatch.setattr(runner, "Progress", partial(Progress, stream=sys.stderr))
    dataset = write_dataset(tmp_path / "d.jsonl", n_queries=4, n_passages=3)
    names = ["relevancy_mean", "precision@3", "ndcg"]
    with ScriptedServer(responder=graded_responder) as server:
        tables: dict[str, dict[str, Any]] = {
            "judge": {"scale": "graded"},
            "dataset": {"path": str(dataset)},
            "run": {"history": str(tmp_path / "history.sqlite"), "charts": False},
        }
        config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite", tables)
        config.write_text(
            config.read_text() + f"[metrics]\nnames = {json.dumps(names)}\n", encoding="utf-8"
        )
        assert main(["run", str(config), "--out", str(tmp_path / "plain")]) == 0
        cuts = ["--set", "metrics.grade_cuts=[0.5, 1.0, 1.2]"]
        assert main(["run", str(config), "--out", str(tmp_path / "cut"), *cuts]) == 0
        asked = len(server.requests)
    assert asked == 12  # the second run came from the cache
    plain = read_results(tmp_path / "plain" / RESULTS_FILE)
    cut = read_results(tmp_path / "cut" / RESULTS_FILE)
    grade = {label.name: label.grade for label in GRADED.labels}
    assert len(plain) == len(cut) == 4
    for jq in plain:
        for v in jq.verdicts:
            p = int(v.passage_id.rsplit("p", 1)[1])
            mean = sum(grade[name] * q for name, q in PROBS[p].items())
            assert v.expected_grade == pytest.approx(mean, abs=1e-6)
            assert v.label == max(PROBS[p], key=lambda name: PROBS[p][name])
    # Arg-max grades 0, 1, 3; with the cuts E[g] 0.55, 1.4, 2.25 give 1, 3, 3.
    for rows, mean, precision in ((plain, 4 / 9, 1 / 3), (cut, 7 / 9, 2 / 3)):
        for jq in rows:
            assert jq.metrics["relevancy_mean"] == pytest.approx(mean)
            assert jq.metrics["precision@3"] == pytest.approx(precision)

    # The verdicts themselves are the same: the cuts act at metric time.
    def seen(rows: list[JudgedQuery]) -> set[tuple[str, str, str | None, float | None]]:
        return {
            (jq.query.query_id, v.passage_id, v.label, v.expected_grade)
            for jq in rows
            for v in jq.verdicts
        }

    assert seen(plain) == seen(cut)
