"""summary.json: majority-vote metrics, counts, the threshold checks, and reading it back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from judge.config import load_config
from judge.errors import InputError
from judge.metrics.compute import metrics_for_queries
from judge.report.summary import (
    SCHEMA_VERSION,
    Check,
    Summary,
    build_summary,
    load_summary,
    write_summary,
)
from judge.schema import JudgedQuery, MetricPolicy, Passage, Query, Scale, Usage, Verdict

BINARY = Scale.binary()
QUERY = Query(
    query_id="q",
    query="x",
    engine="e",
    passages=tuple(Passage(id=f"p{i}", text=f"t{i}") for i in range(3)),
)


def judged(grades: list[int | None], repeat: int) -> JudgedQuery:
    verdicts = tuple(
        Verdict(passage_id=f"p{i}", rank=i + 1, status="error", error="boom")
        if g is None
        else Verdict(
            passage_id=f"p{i}",
            rank=i + 1,
            status="ok",
            label="yes" if g else "no",
            grade=g,
            relevant=bool(g),
        )
        for i, g in enumerate(grades)
    )
    metrics = metrics_for_queries(["ap", "relevancy_mean"], [(QUERY, verdicts)], BINARY)[0]
    return JudgedQuery(
        query=QUERY, repeat=repeat, scale="binary", verdicts=verdicts, metrics=metrics
    )


def test_majority_vote_metrics_across_repeats() -> None:
    config = load_config(None, {"metrics.names": ["ap", "relevancy_mean"]})
    results = [judged([1, 0, 1], 0), judged([1, 1, 0], 1), judged([1, 0, 0], 2)]
    summary = build_summary(config, results, n_boot=50)
    vote = summary.engines["e"].majority_vote
    # Votes per passage: p0 3x yes, p1 1 of 3, p2 1 of 3 -> [yes, no, no].
    assert vote["ap"] == pytest.approx(1.0)
    assert vote["relevancy_mean"] == pytest.approx(1 / 3)
    # The per-repeat mean differs from the vote: (5/6 + 1 + 1) / 3 for ap.
    assert summary.engines["e"].metrics["ap"].mean == pytest.approx((5 / 6 + 1 + 1) / 3)
    assert summary.counts.verdicts == 9 and summary.counts.ok == 9


def test_thresholds_min_and_drop_but_errors_are_no_threshold(tmp_path: Path) -> None:
    baseline = tmp_path / "base.json"
    write_summary(baseline, build_summary(load_config(None), [judged([1, 0, 0], 0)], n_boot=10))
    assert load_summary(baseline).engines["e"].mean("ap") == 1.0
    config = load_config(
        None,
        {
            "metrics.names": ["ap", "relevancy_mean"],
            "thresholds.min": {"relevancy_mean": 0.9},
            "thresholds.max_drop": {"ap": 0.05},
            "thresholds.baseline": str(baseline),
        },
    )
    summary = build_summary(config, [judged([0, 1, None], 0)], n_boot=50)
    breached = {c.check for c in summary.thresholds.breaches}
    # relevancy_mean undefined (< 0.9 fails); ap undefined vs 1.0. The error verdict is no
    # threshold: units left in error make the run incomplete instead (see the runner).
    assert breached == {"min relevancy_mean", "drop ap"}


def _on(query_id: str, text: str, grades: list[int], repeat: int = 0) -> JudgedQuery:
    row = judged(grades, repeat)  # type: ignore[arg-type]
    query = QUERY.model_copy(update={"query_id": query_id, "query": text})
    return row.model_copy(update={"query": query})


def _drops(summary: Summary) -> list[Check]:
    return [c for c in summary.thresholds.checks if c.check.startswith(("drop", "rise"))]


def test_a_drop_is_measured_over_the_queries_both_runs_hold(tmp_path: Path) -> None:
    """Tonight holds two of the baseline's four queries, each scoring what it scored there:
    nothing moved, so nothing fell (the means over different query sets had fallen 0.25).
    A query of the same id but another text is not the same query."""
    base_rows = [_on("q1", "a", [1, 0, 0]), _on("q2", "b", [0, 1, 0])]
    base_rows += [_on("q3", "c", [1, 0, 0]), _on("q4", "d", [1, 0, 0])]
    baseline = tmp_path / "base.json"
    write_summary(baseline, build_summary(load_config(None), base_rows, n_boot=10))
    config = load_config(
        None,
        {
            "metrics.names": ["ap"],
            "thresholds.max_drop": {"ap": 0.05},
            "thresholds.baseline": str(baseline),
        },
    )
    tonight = [_on("q1", "a", [1, 0, 0]), _on("q2", "b", [0, 1, 0])]
    assert build_summary(config, tonight, n_boot=10).engines["e"].mean("ap") == 0.75
    (drop,) = _drops(build_summary(config, tonight, n_boot=10))
    assert (drop.check, drop.ok, drop.value, drop.baseline) == ("drop ap", True, 0.0, 0.75)
    assert drop.note == "over the 2 queries both runs hold (tonight 2, the baseline 4)"
    # q1 now asks something else: only q2 is shared, and it did not fall either.
    moved = [_on("q1", "z", [0, 0, 1]), _on("q2", "b", [0, 1, 0])]
    (drop,) = _drops(build_summary(config, moved, n_boot=10))
    assert (drop.ok, drop.value, drop.baseline) == (True, 0.0, 0.5)
    # Mostly other queries (a fresh nightly sample): compared by the means, and said.
    other = [_on("q9", "y", [0, 0, 1]), _on("q8", "x", [0, 0, 1]), _on("q1", "a", [1, 0, 0])]
    (unpaired,) = _drops(build_summary(config, other, n_boot=10))
    assert unpaired.baseline == 0.875 and unpaired.current == pytest.approx((1 / 3 * 2 + 1) / 3)
    assert unpaired.note == (
        "means over other queries than the baseline's (1 of tonight's 3 in both): a change "
        "may be the queries'"
    )


def test_a_night_that_finds_nothing_relevant_where_the_baseline_did_is_a_drop(
    tmp_path: Path,
) -> None:
    """The baseline found a relevant passage at rank 2 on all 10 queries (AP 0.5 each);
    tonight the engine finds one at rank 1 on 4 and nothing on 6. AP is undefined on those 6,
    and over its defined queries tonight's mean rose to 1.0: the 6 count 0 instead (0.4), a
    drop the check catches and says how. A query tonight did not judge fully stays out."""
    base_rows = [_on(f"q{i}", f"query {i}", [0, 1, 0]) for i in range(10)]
    baseline = tmp_path / "baseline.json"
    write_summary(baseline, build_summary(load_config(None), base_rows, n_boot=10))
    config = load_config(
        None,
        {
            "metrics.names": ["ap"],
            "thresholds.max_drop": {"ap": 0.05},
            "thresholds.baseline": str(baseline),
        },
    )
    tonight = [_on(f"q{i}", f"query {i}", [1, 0, 0] if i < 4 else [0, 0, 0]) for i in range(10)]
    summary = build_summary(config, tonight, n_boot=10)
    assert summary.engines["e"].mean("ap") == 1.0  # each query's own: nothing relevant, no AP
    (drop,) = _drops(summary)
    assert (drop.ok, drop.baseline, drop.current) == (False, 0.5, pytest.approx(0.4))
    # A fall of 0.1 over 10 queries, 4 up and 6 down: the paired test does not find it
    # significant, and the note says so beside the breach.
    assert drop.note == (
        "6 queries where one night found nothing relevant and the other found something "
        "counted 0; not significant (p = 0.75, paired over 10 queries): it may be the "
        "judge's noise"
    )
    # One of the six was not judged fully tonight (an error verdict): it stays undefined.
    failed = judged([0, 0, None], 0).model_copy(update={"query": tonight[9].query})
    (drop,) = _drops(build_summary(config, [*tonight[:9], failed], n_boot=10))
    assert drop.current == pytest.approx(4 / 9) and drop.note is not None
    assert drop.note.startswith("5 queries")


def test_a_metric_the_baseline_never_computed_is_not_evaluated_not_counted_0(
    tmp_path: Path,
) -> None:
    """A baseline made with other metric names holds no value of hit@5 on any query: that is
    not a night that found nothing relevant, so its queries are not counted 0 (a drop in the
    metric could then never breach); the check says it is not in the baseline."""
    base_rows = [_on(f"q{i}", f"query {i}", [0, 1, 0]) for i in range(6)]
    baseline = tmp_path / "baseline.json"
    made = load_config(None, {"metrics.names": ["ap"]})
    write_summary(baseline, build_summary(made, base_rows, n_boot=10))
    config = load_config(
        None,
        {
            "metrics.names": ["ap", "hit@5"],
            "thresholds.max_drop": {"hit@5": 0.01, "ap": 0.05},
            "thresholds.baseline": str(baseline),
        },
    )
    tonight = [_on(f"q{i}", f"query {i}", [0, 1, 0]) for i in range(6)]
    checks = {c.check: c for c in _drops(build_summary(config, tonight, n_boot=10))}
    hit = checks["drop hit@5"]
    assert (hit.evaluated, hit.baseline, hit.value) == (False, None, None), hit
    assert hit.note is not None and "not in the baseline" in hit.note
    assert (checks["drop ap"].ok, checks["drop ap"].value) == (True, 0.0)


def test_a_breaching_fall_the_paired_test_does_not_find_is_said_to_be_maybe_noise(
    tmp_path: Path,
) -> None:
    """A point threshold fires on a judge's noise too (3 of 11 nights of a coin-flip judge
    failed): a breach the paired test over the queries does not find significant says so;
    one it finds does not."""
    base_rows = [_on(f"q{i}", f"query {i}", [1, 0, 0]) for i in range(12)]
    baseline = tmp_path / "baseline.json"
    write_summary(baseline, build_summary(load_config(None), base_rows, n_boot=10))
    options = {
        "metrics.names": ["ap"],
        "thresholds.max_drop": {"ap": 0.05},
        "thresholds.baseline": str(baseline),
    }
    config = load_config(None, options)
    # Two queries of 12 fell from 1 to 0.5: a fall of 0.083, past 0.05, on two queries.
    noisy = [_on(f"q{i}", f"query {i}", [0, 1, 0] if i < 2 else [1, 0, 0]) for i in range(12)]
    (drop,) = _drops(build_summary(config, noisy, n_boot=10))
    assert not drop.ok and drop.note == (
        "not significant (p = 0.5, paired over 12 queries): it may be the judge's noise"
    )
    fell = [_on(f"q{i}", f"query {i}", [0, 1, 0]) for i in range(12)]
    (drop,) = _drops(build_summary(config, fell, n_boot=10))
    assert not drop.ok and drop.note is None


def test_a_baseline_scored_under_other_metric_settings_skips_the_drop_checks(
    tmp_path: Path,
) -> None:
    """AP undefined when nothing relevant was retrieved, in the baseline; 0 tonight: the
    same rankings score lower, a drop that is the settings'. Skipped, and said."""
    rows = [_on(f"q{i}", f"query {i}", [0, 1, 0] if i else [0, 0, 0]) for i in range(4)]
    baseline = tmp_path / "baseline.json"
    write_summary(baseline, build_summary(load_config(None), rows, n_boot=10))
    options = {
        "metrics.names": ["ap"],
        "metrics.undefined_ap": "zero",
        "thresholds.max_drop": {"ap": 0.05},
        "thresholds.baseline": str(baseline),
    }
    summary = build_summary(load_config(None, options), rows, n_boot=10)
    assert not _drops(summary) and summary.thresholds.breached == 0
    (note,) = [c for c in summary.thresholds.checks if c.check == "baseline"]
    assert note.note == (
        f"{baseline} was scored under other [metrics] settings (undefined_ap: nan vs zero, "
        "the baseline's first): drop checks skipped for ap"
    )
    # Exponential gain moves NDCG, not AP: AP's drop is still checked beside it.
    options |= {"metrics.undefined_ap": "nan", "metrics.gain": "exponential"}
    options["thresholds.max_drop"] = {"ap": 0.05, "ndcg": 0.05}
    options["metrics.names"] = ["ap", "ndcg"]
    fell = [_on(f"q{i}", f"query {i}", [0, 0, 1] if i else [0, 0, 0]) for i in range(4)]
    summary = build_summary(load_config(None, options), fell, n_boot=10)
    (drop,) = _drops(summary)
    assert (drop.check, drop.ok) == ("drop ap", False)
    (note,) = [c for c in summary.thresholds.checks if c.check == "baseline"]
    assert note.note is not None and note.note.endswith("drop checks skipped for ndcg")


def test_missing_baseline_is_noted_not_fatal(tmp_path: Path) -> None:
    config = load_config(
        None,
        {
            "metrics.names": ["ap"],
            "thresholds.max_drop": {"ap": 0.05},
            "thresholds.baseline": str(tmp_path / "nope.json"),
        },
    )
    summary = build_summary(config, [judged([1, 0, 1], 0)], n_boot=50)
    notes = [c for c in summary.thresholds.checks if c.check == "baseline"]
    assert notes and "not found" in (notes[0].note or "")
    assert summary.thresholds.breached == 0


def test_summary_json_round_trips_and_carries_the_metric_policy(tmp_path: Path) -> None:
    config = load_config(
        None,
        {
            "metrics.names": ["ap"],
            "metrics.gain": "exponential",
            "prices.gpt-4o-mini": {"prompt": 1.0, "completion": 2.0},
        },
    )
    used = Usage(prompt_tokens=3000, completion_tokens=600)
    summary = build_summary(config, [judged([1, 0, 1], 0).model_copy(update={"usage": used})])
    path = write_summary(tmp_path / "summary.json", summary)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["schema_version"] == SCHEMA_VERSION == 2
    assert data["policy"]["gain"] == "exponential" and "gain" not in data
    assert data["run"] is None and data["config"]["scale"]["name"] == "binary"
    assert load_summary(path) == summary
    assert summary.policy == config.metrics.model_copy(update={"primary": "ap"})
    assert summary.config.scale == Scale.binary()
    assert summary.usage.cost_usd == pytest.approx((3000 * 1.0 + 600 * 2.0) / 1e6)
    assert summary.usage.prompt_tokens_per_passage == 1000


def test_a_version_1_summary_loads_as_a_baseline(tmp_path: Path) -> None:
    """Old summary.json files (gain and unjudged_policy at the top, "run": {}) are baselines."""
    old = tmp_path / "v1.json"
    v1 = {
        "schema_version": 1,
        "created": "2025-12-01T02:00:00+00:00",
        "gain": "exponential",
        "unjudged_policy": "skip",
        "metric_names": ["ap"],
        "run": {},
        "engines": {"e": {"metrics": {"ap": {"mean": 1.0, "ci_low": 0.9, "ci_high": 1.0}}}},
    }
    old.write_text(json.dumps(v1), encoding="utf-8")
    base = load_summary(old)
    assert base.schema_version == SCHEMA_VERSION
    assert base.policy == MetricPolicy(names=("ap",), gain="exponential", unjudged="skip")
    assert base.run is None and base.engines["e"].mean("ap") == 1.0
    assert base.engines["e"].metrics["ap"].ci_low == 0.9
    assert not base.health.known and not base.health.degenerate  # unknown, never "healthy"
    # Scored as the baseline was (unjudged = skip moves AP; gain does not).
    config = load_config(
        None,
        {
            "metrics.names": ["ap"],
            "metrics.unjudged": "skip",
            "thresholds.max_drop": {"ap": 0.05},
            "thresholds.baseline": str(old),
        },
    )
    summary = build_summary(config, [judged([0, 1, 1], 0)], n_boot=20)
    (drop,) = [c for c in summary.thresholds.checks if c.check == "drop ap"]
    assert (drop.engine, drop.baseline, drop.ok) == ("e", 1.0, False)
    assert drop.value == pytest.approx(1.0 - 7 / 12)


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1, 2]",
        '{"counts": {}}',
        '{"engines": {"e": 3}}',
        '{"engines": {"e": {"metrics": {"ap": "high"}}}}',
        '{"engines": {}, "gain": "cubic"}',
        '{"schema_version": 2, "engines": {}}',
        '{"schema_version": 7, "engines": {}}',
        '{"engines": {"e": {"metrics": {"ap": {"mean": NaN}}}}}',
        '{"engines": {"e": {"metrics": {"ap": {"mean": Infinity}}}}}',
    ],
)
def test_an_invalid_summary_is_an_input_error_naming_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match=r"bad\.json"):
        load_summary(path)
    with pytest.raises(InputError, match=r"nope\.json"):
        load_summary(tmp_path / "nope.json")


def test_summary_json_has_a_row_per_query_and_older_files_load_without_them(
    tmp_path: Path,
) -> None:
    labelled = QUERY.model_copy(update={"labels": {"p0": 3, "p1": 0, "p2": 2}})
    rows = [
        jq.model_copy(update={"query": labelled})
        for jq in (judged([1, 0, 1], 0), judged([1, None, 0], 1))
    ]
    config = load_config(None, {"metrics.names": ["ap"], "dataset.label_scale": "graded"})
    summary = build_summary(config, rows, n_boot=20)
    (row,) = summary.queries
    assert (row.query_id, row.engine, row.query, row.repeats, row.passages) == ("q", "e", "x", 2, 3)
    assert row.failed == 1  # the error verdict of repeat 1
    # Repeat 1 is undefined (an error verdict): the mean over the repeats where ap is defined.
    assert row.metrics == {"ap": pytest.approx((1 + 2 / 3) / 2), "relevancy_mean": 2 / 3}
    # Graded human labels against a yes/no judge: compared through relevance (grade >= 2).
    # p2 (human 2, relevant) got yes and no: a tie keeps "no", a disagreement.
    assert (row.labelled, row.disagreements) == (3, 1)
    assert summary.label_scale == Scale.graded()
    path = write_summary(tmp_path / "summary.json", summary)
    assert load_summary(path) == summary
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["queries"][0]["metrics"]["relevancy_mean"] == pytest.approx(2 / 3)
    del data["queries"], data["label_scale"]  # as written before they were added
    (tmp_path / "old.json").write_text(json.dumps(data), encoding="utf-8")
    old = load_summary(tmp_path / "old.json")
    assert old.queries == () and old.label_scale is None


def test_the_trust_line_does_not_call_a_judge_ok_on_too_few_verdicts() -> None:
    """Three verdicts are too few for the health checks to tell anything: the trust line
    said 'judge health ok' while the health note said it could not tell."""
    from judge.report.status import trust_line

    few = build_summary(load_config(None), [judged([1, 0, 1], 0)], n_boot=10)
    assert trust_line(few).startswith(
        "Trust: judge health unknown (only 3 ok verdicts: at least 20 are needed to tell)"
    )
    many = [_on(f"q{i}", f"t{i}", [1, 0, i % 2]) for i in range(8)]
    assert trust_line(build_summary(load_config(None), many, n_boot=10)).startswith(
        "Trust: judge health ok;"
    )


def test_a_baseline_of_another_judge_is_said_with_the_drop_checks(tmp_path: Path) -> None:
    baseline = tmp_path / "base.json"
    made = load_config(None, {"judge.model": "old-judge"})
    write_summary(baseline, build_summary(made, [judged([1, 0, 0], 0)], n_boot=10))
    config = load_config(
        None,
        {
            "judge.model": "new-judge",
            "metrics.names": ["ap"],
            "thresholds.max_drop": {"ap": 0.05},
            "thresholds.baseline": str(baseline),
        },
    )
    checks = build_summary(config, [judged([1, 0, 0], 0)], n_boot=10).thresholds.checks
    (said,) = [c for c in checks if c.check == "baseline"]
    assert said.ok and said.note == (
        f"{baseline} was judged by openai old-judge, this run by openai new-judge: a drop may "
        "be the judge's"
    )


def test_the_primary_metric_is_the_configs_not_one_earlier_rows_hold() -> None:
    """A rerun into a directory whose rows hold metrics of an earlier config (ap here) had
    led its verdict with one of those, not with a metric the config names."""
    from judge.metrics.facts import primary_metric

    config = load_config(None, {"metrics.names": ["relevancy_mean"]})
    summary = build_summary(config, [judged([1, 0, 1], 0)], n_boot=50)
    assert "ap" in summary.metric_names  # still shown
    assert primary_metric(summary.metric_names, summary.policy.primary) == "relevancy_mean"


def test_an_engine_the_baseline_has_and_tonight_lacks_is_said_not_skipped(
    tmp_path: Path,
) -> None:
    """An engine gone from tonight's run had dropped out of the drop checks without a word
    (a new engine is said: "not in the baseline")."""
    rows = [_on(f"q{i}", f"query {i}", [0, 1, 0]) for i in range(6)]
    gone = [
        r.model_copy(update={"query": r.query.model_copy(update={"engine": "old"})}) for r in rows
    ]
    baseline = tmp_path / "baseline.json"
    write_summary(baseline, build_summary(load_config(None), [*rows, *gone], n_boot=10))
    config = load_config(
        None, {"thresholds.max_drop": {"ndcg": 0.05}, "thresholds.baseline": str(baseline)}
    )
    checks = [c for c in build_summary(config, rows, n_boot=10).thresholds.checks]
    (said,) = [c for c in checks if c.engine == "old"]
    assert not said.evaluated and said.ok
    assert said.note == "not evaluated: in the baseline, but not in this run"


def test_the_console_leads_with_the_verdicts_metric_and_says_a_mean_over_fewer_queries() -> None:
    """The console showed the first six metrics (with [metrics] primary = "mrr", never the
    verdict's own) and a mean over half an engine's queries as if over all of them."""
    from judge.cli.main import _means

    config = load_config(None, {"metrics.names": ["relevancy_mean", "ap"]})
    rows = [_on("q0", "first", [1, 0, 1]), _on("q1", "second", [0, 0, 0])]
    summary = build_summary(config, rows, n_boot=10)
    said = _means(summary.engines["e"], "ap")
    assert said == "ap 0.8333 (1 of 2 queries), relevancy_mean 0.3333"
