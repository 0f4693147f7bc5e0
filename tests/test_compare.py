"""Engines side by side: paired statistics, pooled metrics, and ``judge compare``."""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from judge.analysis.compare import (
    N_BOOT,
    compare,
    paired_diff,
    per_query_values,
    pooled_metrics,
    sign_flip_floor,
    sign_flip_p,
)
from judge.analysis.reliability import bootstrap_ci
from judge.cli.reports import add_commands, format_table, load_engines
from judge.config import load_config
from judge.data.datasets import append_result, read_queries
from judge.errors import ConfigError, InputError
from judge.metrics.compute import DEFAULT_METRICS, metrics_for_queries
from judge.report.compared import headline_lines, p_text
from judge.report.document import leading_engine
from judge.report.summary import build_summary
from judge.schema import JudgedQuery, MetricPolicy, Passage, Query, Scale, Verdict

GRADED = Scale.graded()
SAMPLE = Path(__file__).resolve().parent.parent / "datasets" / "sample.jsonl"


def verdict(
    pid: str, rank: int, grade: int | str, scale: Scale = GRADED, reason: str | None = None
) -> Verdict:
    """An ok verdict for an int grade; "unparsed" / "error" make a failed one."""
    if grade == "unparsed":
        return Verdict(passage_id=pid, rank=rank, status="unparsed", raw="maybe?")
    if grade == "error":
        return Verdict(passage_id=pid, rank=rank, status="error", error="HTTP 500")
    assert isinstance(grade, int)
    label = scale.by_grade(grade)
    return Verdict(
        passage_id=pid,
        rank=rank,
        status="ok",
        label=label.name,
        grade=grade,
        relevant=scale.relevant(grade),
        reason=reason or f"{pid} is {label.name}",
    )


def judged(
    qid: str,
    engine: str,
    passages: Sequence[tuple[str, str]],
    grades: Sequence[int | str],
    *,
    repeat: int = 0,
    scale: Scale = GRADED,
    metrics: Sequence[str] = DEFAULT_METRICS,
    text: str = "a query",
) -> JudgedQuery:
    """One judged ranked list; metrics computed the way the runner does."""
    query = Query(
        query_id=qid,
        query=text,
        engine=engine,
        passages=tuple(Passage(id=pid, text=t) for pid, t in passages),
    )
    verdicts = tuple(
        verdict(pid, rank, g, scale)
        for rank, ((pid, _), g) in enumerate(zip(passages, grades, strict=True), 1)
    )
    row = metrics_for_queries(metrics, [(query, verdicts)], scale)[0]
    return JudgedQuery(query=query, repeat=repeat, scale=scale.name, verdicts=verdicts, metrics=row)


def sample_results(
    repeats: int = 2, scale: Scale = GRADED, *, nudge: bool = True
) -> list[JudgedQuery]:
    """datasets/sample.jsonl judged by a synthetic judge: the human label, nudged down one grade
    for a few (query, rank, repeat) cells so repeats differ. Two engines, bm25 and dense."""
    out = []
    for qi, query in enumerate(read_queries(SAMPLE).queries):
        labels = query.labels or {}
        for r in range(repeats):
            grades: list[int | str] = []
            for rank, p in enumerate(query.passages, 1):
                g = min(labels.get(p.id, 0), scale.max_grade)
                grades.append(max(0, g - 1) if nudge and (qi + rank + r) % 7 == 0 else g)
            verdicts = tuple(
                verdict(p.id, rank, g, scale)
                for rank, (p, g) in enumerate(zip(query.passages, grades, strict=True), 1)
            )
            row = metrics_for_queries(DEFAULT_METRICS, [(query, verdicts)], scale)[0]
            out.append(
                JudgedQuery(query=query, repeat=r, scale=scale.name, verdicts=verdicts, metrics=row)
            )
    return out


def stored(
    qid: str, engine: str, value: float | None, repeat: int = 0, **more: float
) -> JudgedQuery:
    """A row that carries only stored values, ndcg's and ``more`` (compare uses stored values
    as they are)."""
    return JudgedQuery(
        query=Query(query_id=qid, query="q", engine=engine),
        repeat=repeat,
        scale="graded",
        verdicts=(),
        metrics={"ndcg": value, **more},
    )


def test_paired_difference_averages_repeats_and_pairs_only_shared_queries() -> None:
    rows = [
        stored("q1", "a", 0.2, 0),
        stored("q1", "a", 0.4, 1),  # q1 for a: mean over repeats 0.3
        stored("q2", "a", 0.5),
        stored("q3", "a", 0.9),  # b has no q3: not paired
        stored("q1", "b", 0.1),
        stored("q2", "b", 0.7),
        stored("q4", "b", None),  # undefined: not paired, not in b's mean
    ]
    cmp = compare(rows, ["ndcg"], GRADED, baseline="b", n_boot=200, n_permutations=100)
    assert cmp.engines == ("b", "a")
    assert cmp.means["ndcg"]["a"].mean == pytest.approx((0.3 + 0.5 + 0.9) / 3)
    assert cmp.means["ndcg"]["b"].n == 2
    (d,) = cmp.diffs
    assert (d.engine, d.baseline, d.n) == ("a", "b", 2)
    assert d.diff == pytest.approx(((0.3 - 0.1) + (0.5 - 0.7)) / 2)
    # Two paired queries: 4 sign vectors, every one as extreme as |mean| = 0 -> p = 1.
    assert d.p_value == 1.0 and d.exact


@pytest.mark.parametrize(
    ("diffs", "p"),
    [
        ([1.0] * 5, 2 / 32),  # only all-plus and all-minus reach |mean| = 1
        ([1.0, 2.0, 3.0], 2 / 8),
        ([3.0, -1.0, 1.0], 6 / 8),  # |sums| 5,3,3,1 and mirrors: 6 of 8 reach 3
        ([0.0, 0.0], 1.0),
        # Ties flip to themselves: 2 of 20 pairs differing is 4 sign vectors, p exactly 1/2
        # (it had been sampled over 2^20, and printed below the floor it stated).
        ([0.5, 0.5] + [0.0] * 18, 2 / 4),
        ([1.0] * 12 + [0.0] * 30, 2 / 2**12),
    ],
)
def test_sign_flip_exact_p_values_by_hand(diffs: list[float], p: float) -> None:
    value, exact = sign_flip_p(np.array(diffs), n_permutations=10_000, seed=0)
    assert exact
    assert value == pytest.approx(p)


def test_sampled_sign_flip_agrees_with_the_exact_test() -> None:
    rng = np.random.default_rng(7)
    d = rng.normal(0.3, 1.0, 14)
    exact, is_exact = sign_flip_p(d, n_permutations=20_000, seed=1)
    sampled, is_sampled_exact = sign_flip_p(d, n_permutations=10_000, seed=1)
    assert is_exact and not is_sampled_exact
    assert sampled == pytest.approx(exact, abs=0.02)
    # Same seed, same answer.
    assert sign_flip_p(d, n_permutations=10_000, seed=1)[0] == sampled


def test_large_consistent_difference_gets_the_smallest_sampled_p() -> None:
    p, exact = sign_flip_p(np.full(40, 0.2), n_permutations=2_000, seed=3)
    assert not exact
    assert p == pytest.approx(1 / 2001)


def test_bootstrap_ci_width_matches_the_normal_approximation() -> None:
    d = np.random.default_rng(11).normal(0.1, 1.0, 400)
    low, high = bootstrap_ci(d, n_boot=4_000, seed=0) or (math.nan, math.nan)
    assert low < d.mean() < high
    expected = 2 * 1.96 * d.std(ddof=1) / math.sqrt(d.size)
    assert high - low == pytest.approx(expected, rel=0.1)
    assert bootstrap_ci(d, n_boot=4_000, seed=0) == (low, high)
    assert bootstrap_ci(np.full(5, 0.25), n_boot=100, seed=0) == (0.25, 0.25)
    assert bootstrap_ci(np.array([]), n_boot=100, seed=0) is None


GOOD = ("g1", "Green tea is brewed at 80 °C for two minutes.")
OTHER = ("g2", "Let boiled water cool for three minutes before pouring it on green tea.")
BAD = ("x1", "Matcha is whisked with a bamboo whisk.")


def test_an_engine_that_found_fewer_good_passages_cannot_score_a_perfect_pooled_ndcg() -> None:
    a = judged("q", "a", [GOOD, BAD], [3, 0])
    b = judged("q", "b", [GOOD, OTHER, BAD], [3, 2, 0])
    assert a.metrics["ndcg"] == 1.0  # its own ideal: it is perfect by its own standard
    pa, pb = pooled_metrics([a, b], ["pooled_ndcg", "pooled_ndcg@1", "pooled_recall@1"], GRADED)
    ideal = 3 + 2 / math.log2(3)
    assert pa["pooled_ndcg"] == pytest.approx(3 / ideal)
    assert pb["pooled_ndcg"] == pytest.approx(1.0)
    assert pa["pooled_ndcg@1"] == 1.0  # the best passage is first: nothing better in the pool
    assert pa["pooled_recall@1"] == pytest.approx(1 / 2)


def test_the_pool_merges_passages_with_the_same_normalised_text() -> None:
    # The same passage under other ids, full-width letters, other case and spacing.
    twin = ("b-77", "  ＧＲＥＥＮ tea is   brewed at 80 °C\nfor two MINUTES. ")
    a = judged("q", "a", [GOOD], [3])
    b = judged("q", "b", [twin, BAD], [3, 0])
    pa, pb = pooled_metrics([a, b], ["pooled_ndcg", "pooled_recall@5"], GRADED)
    assert pa == {"pooled_ndcg": 1.0, "pooled_recall@5": 1.0}
    assert pb["pooled_ndcg"] == 1.0


def test_duplicates_in_one_list_gain_nothing() -> None:
    twin = ("g1-copy", GOOD[1].upper())
    a = judged("q", "a", [GOOD, twin], [3, 3])
    b = judged("q", "b", [GOOD, OTHER], [3, 2])
    pa, pb = pooled_metrics([a, b], ["pooled_ndcg", "pooled_recall@2"], GRADED)
    assert pa["pooled_ndcg"] == pytest.approx(3 / (3 + 2 / math.log2(3)))
    assert pa["pooled_recall@2"] == pytest.approx(1 / 2)
    assert pb == {"pooled_ndcg": 1.0, "pooled_recall@2": 1.0}


def test_pooled_metrics_are_undefined_without_anything_relevant_or_with_failed_verdicts() -> None:
    a = judged("q", "a", [BAD], [0])
    b = judged("q", "b", [OTHER], [1])  # related (grade 1) but below the threshold 2
    pa, pb = pooled_metrics([a, b], ["pooled_ndcg", "pooled_recall@3"], GRADED)
    assert pa == {"pooled_ndcg": 0.0, "pooled_recall@3": None}
    assert pb == {"pooled_ndcg": 1.0, "pooled_recall@3": None}
    nothing = pooled_metrics([judged("q", "a", [BAD], [0])], ["pooled_ndcg"], GRADED)
    assert nothing == [{"pooled_ndcg": None}]
    failed = judged("q", "a", [GOOD, BAD], [3, "unparsed"])
    assert pooled_metrics([failed], ["pooled_ndcg"], GRADED) == [{"pooled_ndcg": None}]
    skip = pooled_metrics([failed], ["pooled_ndcg"], GRADED, MetricPolicy(unjudged="skip"))
    assert skip == [{"pooled_ndcg": 1.0}]


def test_pool_is_per_repeat() -> None:
    rows = [
        judged("q", "a", [GOOD], [3], repeat=0),
        judged("q", "b", [OTHER], [0], repeat=0),
        judged("q", "a", [GOOD], [1], repeat=1),
        judged("q", "b", [OTHER], [3], repeat=1),
    ]
    values = per_query_values(rows, ["pooled_ndcg"], GRADED)["pooled_ndcg"]
    # Repeat 0 pools grades [3, 0]; repeat 1 pools [3, 1]: IDCG = 3 + 1 / log2(3).
    ideal_1 = 3 + 1 / math.log2(3)
    assert values["a"]["q"] == pytest.approx((3 / 3 + 1 / ideal_1) / 2)
    assert values["b"]["q"] == pytest.approx((0 / 3 + 3 / ideal_1) / 2)


def test_exponential_gain_changes_the_pooled_ideal() -> None:
    a = judged("q", "a", [GOOD, BAD], [3, 0])
    b = judged("q", "b", [OTHER], [2])
    (pa, _) = pooled_metrics([a, b], ["pooled_ndcg"], GRADED, MetricPolicy(gain="exponential"))
    assert pa["pooled_ndcg"] == pytest.approx(7 / (7 + 3 / math.log2(3)))


def test_compare_refuses_what_it_cannot_compare() -> None:
    one = [judged("q", "a", [GOOD], [3])]
    with pytest.raises(InputError, match="at least two engines"):
        compare(one, ["ndcg"], GRADED)
    two = [*one, judged("q", "b", [GOOD], [3])]
    with pytest.raises(InputError, match=r"baseline engine 'c' is not one of \['a', 'b'\]"):
        compare(two, ["ndcg"], GRADED, baseline="c")
    with pytest.raises(ConfigError, match="pooled_ndcg"):
        compare(two, ["pooled_ndgc@5"], GRADED)
    with pytest.raises(ConfigError, match="at least 1"):
        compare(two, ["pooled_ndcg@0"], GRADED)


def test_compare_on_the_sample_finds_dense_better_and_prints_a_table() -> None:
    results = sample_results()
    metrics = ["ndcg@5", "pooled_ndcg@5", "pooled_recall@5"]
    cmp = compare(results, metrics, GRADED, n_boot=2_000, n_permutations=5_000, seed=4)
    diffs = {d.metric: d for d in cmp.diffs}
    assert cmp.baseline == "bm25" and cmp.engines == ("bm25", "dense")
    for d in diffs.values():
        assert d.n == 5  # q1-q4 and q6: the query ids both engines answered
        assert d.ci_low is not None and d.ci_high is not None and d.diff is not None
        assert d.ci_low <= d.diff <= d.ci_high
    assert diffs["pooled_ndcg@5"].diff is not None and diffs["pooled_ndcg@5"].diff > 0
    table = format_table(cmp)
    assert "pooled_recall@5" in table and "(baseline)" in table
    assert "unpaired, each engine over the query ids it defines" in table
    assert "paired, over the query ids both the engine and its baseline (vs) define" in table
    # Five pairs: the exact test cannot go below 2 / 2^5, and the p-value says so.
    assert diffs["ndcg@5"].p_floor == 2 / 32 and diffs["ndcg@5"].too_few
    assert f"{diffs['ndcg@5'].p_value:.4f} (too few queries differ: min 0.0625)" in table
    again = compare(results, metrics, GRADED, n_boot=2_000, n_permutations=5_000, seed=4)
    assert again == cmp


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="judge")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


def write_run(directory: Path, rows: Sequence[JudgedQuery]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for jq in rows:
        append_result(directory / "verdicts.jsonl", jq)
    return directory


def test_cli_compares_run_directories_each_as_an_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = sample_results()
    as_default = [
        jq.model_copy(update={"query": jq.query.model_copy(update={"engine": "default"})})
        for jq in results
    ]
    old = write_run(tmp_path / "old", [jq for jq in as_default if jq.key[0] != "q9"])
    new = write_run(tmp_path / "new", [jq for jq in as_default if jq.key[0] != "q8"])
    out = tmp_path / "cmp.json"
    code = run_cli(
        [
            *["compare", str(old), f"candidate={new}", "--metric", "ndcg@5", "--baseline", "old"],
            *["--metric", "pooled_ndcg", "--n-boot", "500", "--json", str(out)],
        ]
    )
    text = capsys.readouterr().out
    assert code == 0
    assert "(baseline)" in text and "candidate" in text and "pooled_ndcg" in text
    data = json.loads(out.read_text())
    assert data["engines"] == ["old", "candidate"]
    assert data["baselines"] == {"candidate": "old"}
    assert "q9" in data["per_query"]["ndcg@5"]["candidate"]
    assert "q9" not in data["per_query"]["ndcg@5"]["old"]


def test_engines_in_one_file_keep_their_names_and_clashing_names_are_refused(
    tmp_path: Path,
) -> None:
    results = sample_results(repeats=1)
    run = write_run(tmp_path / "a" / "latest", results)
    assert {jq.query.engine for jq in load_engines([str(run)])} == {"bm25", "dense"}
    other = write_run(tmp_path / "b" / "latest", results)
    # Two folders of one name are told apart by their shortest distinct paths.
    both = {jq.query.engine for jq in load_engines([str(run), str(other)])}
    assert both == {"a/latest/bm25", "a/latest/dense", "b/latest/bm25", "b/latest/dense"}
    with pytest.raises(InputError, match="NAME=PATH"):
        load_engines([f"x={run}", f"x={other}"])
    named = load_engines([f"a={run}", f"b={other}"])
    assert {jq.query.engine for jq in named} == {"a/bm25", "a/dense", "b/bm25", "b/dense"}
    with pytest.raises(InputError, match="no such run directory"):
        load_engines([str(tmp_path / "missing")])


# --- statistics said plainly ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("diffs", "floor"),
    [
        ([0.1] * 5, 2 / 32),  # five pairs: never below 0.0625, however large the difference
        ([0.1] * 6, 2 / 64),  # six: p < 0.05 becomes possible
        ([0.1, 0.0, -0.2, 0.0, 0.3], 2 / 8),  # ties do not count: three differing pairs
        ([0.0, 0.0], 1.0),
    ],
)
def test_the_sign_flip_floor_is_the_smallest_p_the_test_can_give(
    diffs: list[float], floor: float
) -> None:
    d = np.array(diffs)
    assert sign_flip_floor(d) == pytest.approx(floor)
    # The floor is reached by differences that all point one way.
    same_way = np.abs(d)
    assert sign_flip_p(same_way)[0] == pytest.approx(floor)


def test_six_consistent_pairs_are_significant_and_five_are_said_to_be_too_few() -> None:
    five = [stored(f"q{i}", e, v) for i in range(5) for e, v in (("a", 0.5), ("b", 0.6))]
    six = [*five, stored("q5", "a", 0.5), stored("q5", "b", 0.6)]
    (d5,) = compare(five, ["ndcg"], GRADED, n_boot=100).diffs
    (d6,) = compare(six, ["ndcg"], GRADED, n_boot=100).diffs
    assert d5.p_value == pytest.approx(0.0625) and d5.too_few and not d5.worse()
    assert p_text(d5) == "0.0625 (too few queries differ: min 0.0625)"
    assert d6.p_value == pytest.approx(0.03125) and not d6.too_few
    assert p_text(d6) == "0.0312"
    assert (d6.wins, d6.ties, d6.losses) == (6, 0, 0)


def test_one_bootstrap_gives_every_ci() -> None:
    """compare's unpaired CI and paired CI are reliability.bootstrap_ci over the per-query
    values in query-id order: the function the summary's CIs come from."""
    value = {f"q{i}": (i * 7 % 10) / 10 for i in range(12)}
    rows = [stored(q, e, v + (0.05 if e == "b" else 0.0)) for q, v in value.items() for e in "ab"]
    cmp = compare(rows, ["ndcg"], GRADED, n_boot=3_000, seed=9)
    ids = sorted(value)  # q0, q1, q10, q11, q2, ...: the order every resample draws from
    a = cmp.means["ndcg"]["a"]
    assert (a.ci_low, a.ci_high) == bootstrap_ci([value[q] for q in ids], n_boot=3_000, seed=9)
    (d,) = cmp.diffs
    paired = [(value[q] + 0.05) - value[q] for q in ids]
    assert (d.ci_low, d.ci_high) == bootstrap_ci(paired, n_boot=3_000, seed=9)


def _ci_cells(text: str) -> list[str]:
    """The bracketed CIs on a line of text or a Markdown row."""
    return re.findall(r"\[[-+]?\d\.\d{4}, [-+]?\d\.\d{4}\]", text)


def test_report_and_compare_print_the_same_numbers_for_a_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from judge.config import load_config
    from judge.report.finish import finish_run

    run = write_run(tmp_path / "run", sample_results(repeats=2))
    config = load_config(
        None, {"judge.scale": "graded", "run.seed": 7, "run.history": str(tmp_path / "h.sqlite")}
    )
    summary = finish_run(config, run, None)
    assert summary.stability.n_boot == N_BOOT and summary.stability.seed == 7
    md = (run / "report.md").read_text(encoding="utf-8")
    assert run_cli(["compare", str(run)]) == 0
    text = capsys.readouterr().out
    assert f"({N_BOOT} resamples, seed 7)" in text
    # The unpaired CIs of the report's metric table, engine by engine...
    row = next(line for line in md.splitlines() if line.startswith("| ndcg@5 | "))
    line = [ln for ln in text.splitlines() if ln.startswith("ndcg@5 ")]
    assert _ci_cells(row) == [_ci_cells(ln)[0] for ln in line]
    # ...and the paired diff of its comparison section.
    paired = next(ln for ln in md.splitlines() if ln.startswith("| ndcg@5 | dense | bm25 |"))
    assert _ci_cells(paired) == _ci_cells(line[1])[1:]


# --- judge compare over runs: baseline, HTML, exit code ----------------------------------------


def _runs(
    tmp_path: Path, shift: float, n: int = 8, engines: Sequence[str] = ("default",)
) -> tuple[Path, Path]:
    """Two run directories of ``n`` queries; the second's ndcg is ``shift`` off the first's."""
    old = [stored(f"q{i}", e, 0.5 + 0.04 * i) for i in range(n) for e in engines]
    new = [stored(f"q{i}", e, 0.5 + 0.04 * i + shift) for i in range(n) for e in engines]
    return write_run(tmp_path / "old", old), write_run(tmp_path / "new", new)


def test_the_baseline_is_the_first_argument(tmp_path: Path) -> None:
    old, new = _runs(tmp_path, -0.1)
    out = tmp_path / "c.json"
    assert run_cli(["compare", str(new), str(old), "--metric", "ndcg", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["baseline"] == "new" and data["baselines"] == {"old": "new"}
    (d,) = data["diffs"]
    assert d["engine"] == "old" and d["diff"] == pytest.approx(0.1)


def test_runs_of_several_engines_compare_engine_by_engine(tmp_path: Path) -> None:
    old, new = _runs(tmp_path, 0.05, engines=("bm25", "dense"))
    out = tmp_path / "c.json"
    assert run_cli(["compare", str(old), str(new), "--metric", "ndcg", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["engines"] == ["old/bm25", "old/dense", "new/bm25", "new/dense"]
    assert data["baselines"] == {"new/bm25": "old/bm25", "new/dense": "old/dense"}
    # --baseline may name the other run.
    assert (
        run_cli(
            [
                "compare",
                str(old),
                str(new),
                "--metric",
                "ndcg",
                "--json",
                str(out),
                "--baseline",
                "new",
            ]
        )
        == 0
    )
    assert json.loads(out.read_text())["baselines"] == {
        "old/bm25": "new/bm25",
        "old/dense": "new/dense",
    }


def test_an_engine_is_compared_with_its_namesake_or_with_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run of one engine beside a baseline of several is paired with the engine of its own
    name; an engine the baseline lacks is paired with none, and cannot fail the check (it
    had been paired with the baseline's first engine, and 'significantly worse' than it)."""
    old = [
        stored(f"q{i}", e, (0.9 if e == "bad" else 0.3) + 0.01 * i)
        for i in range(8)
        for e in ("bad", "good")
    ]
    base = write_run(tmp_path / "clear", old)
    good = write_run(tmp_path / "g1", [stored(f"q{i}", "good", 0.3 + 0.01 * i) for i in range(8)])
    new = write_run(tmp_path / "fresh", [stored(f"q{i}", "new", 0.1) for i in range(8)])
    out = tmp_path / "c.json"
    argv = ["compare", str(base), str(good), str(new), "--metric", "ndcg", "--json", str(out)]
    assert run_cli([*argv, "--fail-if-worse", "ndcg"]) == 0
    data = json.loads(out.read_text())
    assert data["baselines"] == {"g1/good": "clear/good"}
    assert "fresh/new" in data["engines"]
    err = capsys.readouterr().err
    assert "fresh/new: the baseline clear has no engine 'new' (it has bad, good)" in err
    assert "significantly worse" not in err


def test_fail_if_worse_exits_1_only_for_a_significant_drop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = _runs(tmp_path / "worse", -0.05)
    assert run_cli(["compare", str(old), str(new), "--fail-if-worse", "ndcg"]) == 1
    out, err = capsys.readouterr()
    assert "judge: new is significantly worse than old on ndcg: -0.0500" in err
    # stdout says first what the exit code says, then the verdict.
    assert out.startswith("significantly worse: new vs old on ndcg: -0.0500")
    assert "p = 0.0078 over 8 paired queries" in err  # 2 / 2^8, exact
    old, new = _runs(tmp_path / "better", +0.05)
    assert run_cli(["compare", str(old), str(new), "--fail-if-worse", "ndcg"]) == 0
    # Five queries can never be significant: the guard says it cannot fire.
    old, new = _runs(tmp_path / "few", -0.05, n=5)
    assert run_cli(["compare", str(old), str(new), "--fail-if-worse", "ndcg"]) == 0
    assert "5 of 5 pairs differ, too few for p < 0.05" in capsys.readouterr().err
    old, new = _runs(tmp_path / "tied", 0.0)
    assert run_cli(["compare", str(old), str(new), "--fail-if-worse", "ndcg"]) == 0
    assert "new vs old on ndcg: no query differs, so" in capsys.readouterr().err


def test_compare_writes_an_offline_page_with_charts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = _runs(tmp_path, -0.05)
    page = tmp_path / "cmp.html"
    args = ["compare", str(old), str(new), "--metric", "ndcg", "--html", str(page)]
    assert run_cli([*args, "--fail-if-worse", "ndcg"]) == 1
    html = page.read_text(encoding="utf-8")
    assert "<title>WORSE · judge compare · old vs new</title>" in html
    assert "significantly worse: new vs old on ndcg: -0.0500" in html
    assert "old beats new on ndcg: +0.0500" in html  # the console's verdict, kept beside it
    assert "<script" not in html and "default-src 'none'" in html
    labels = re.findall(r'<svg role="img" aria-label="([^"]+)"', html)
    assert labels == ["mean per engine with 95% CI", "per-query new vs old"]
    assert "better 0 · tie 0 · worse 8" in html  # the win/tie/loss count, in the scatter
    assert "<th>better/tie/worse</th>" in html and '<td class="">0 / 0 / 8</td>' in html
    assert "Mean per engine (unpaired, 95% CI)" in html and "diff (paired)" in html


def test_ties_say_no_query_differs_and_the_headline_skips_them() -> None:
    """Every query ties on ndcg, one engine is better on ap on every query: the p says "no
    query differs" (not "too few"), the headline says no query differs on the primary metric
    and then names the largest significant change, never the tying metric as a winner."""
    rows = []
    for i in range(8):
        rows += [
            stored(f"q{i}", "a", 0.5, ap=0.2),
            stored(f"q{i}", "b", 0.5, ap=0.4 + i / 100),
        ]
    cmp = compare(rows, ["ndcg", "ap"], GRADED, n_boot=200)
    tie, gain = cmp.diffs
    assert p_text(tie) == "— (no query differs)"
    assert p_text(gain) == "0.0078"
    lines = headline_lines(cmp)
    assert lines[0] == (
        "no query differs between b and a on ndcg (better on 0, tied 8, worse 0 of 8 queries)"
    )
    # ndcg, on which no query differs, could never be significant: not one of Holm's tests.
    assert lines[1].startswith(
        "largest significant change, p = 0.0078 Holm-adjusted over 1 metric: b beats a on ap: +0.2"
    )
    assert lines[1].endswith("p = 0.008, better on 8, tied 0, worse 0 of 8 queries")


def _found_at(qid: str, engine: str, rank: int | None, grade: int | str = 0) -> JudgedQuery:
    """A list of three passages, the relevant one at ``rank`` (None: none); the others get
    ``grade`` (an "error" makes the list not judged fully)."""
    grades = [3 if i == rank else grade for i in (1, 2, 3)]
    passages = [(f"{engine}{qid}-{i}", f"text {i}") for i in (1, 2, 3)]
    return judged(qid, engine, passages, grades, text=f"query {qid}")


def test_an_engine_that_finds_nothing_relevant_loses_the_query_not_leaves_it() -> None:
    """a finds a relevant passage at rank 2 on all 20 queries; b finds one at rank 1 on 6 and
    nothing on 14. NDCG is undefined where nothing is relevant: paired on the 6 alone, b had
    "won". The 14 count 0 for b: a wins, on all 20 queries."""
    rows = [_found_at(f"q{i:02d}", "a", 2) for i in range(20)]
    rows += [_found_at(f"q{i:02d}", "b", 1 if i < 6 else None) for i in range(20)]
    cmp = compare(rows, ["ndcg"], GRADED, n_boot=200)
    (d,) = cmp.diffs
    assert (d.engine, d.baseline, d.n, d.wins, d.losses, d.left_out) == ("b", "a", 20, 6, 14, 0)
    line = headline_lines(cmp)[0]
    assert line.startswith("a beats b on ndcg: ")
    assert line.endswith("better on 14, tied 0, worse 6 of 20 queries")
    # Unpaired, each engine's mean stays over its own defined queries (the table's footnote).
    assert (cmp.means["ndcg"]["b"].mean, cmp.means["ndcg"]["b"].n) == (1.0, 6)


def test_a_third_engine_does_not_change_how_two_others_compare() -> None:
    """a and b find nothing relevant on the same 10 of 20 queries, where c finds something:
    a against b is the same with c in the run as without it (those 10 are left out, not
    ties that c made)."""
    rows = [_found_at(f"q{i:02d}", "a", 1 if i < 10 else None) for i in range(20)]
    rows += [_found_at(f"q{i:02d}", "b", 2 if i < 10 else None) for i in range(20)]
    pair = compare(rows, ["ndcg"], GRADED, n_boot=200).diffs
    rows += [_found_at(f"q{i:02d}", "c", 3) for i in range(20)]
    three = compare(rows, ["ndcg"], GRADED, baselines={"b": "a"}, n_boot=200).diffs
    assert [d.model_dump() for d in three] == [d.model_dump() for d in pair]
    assert (pair[0].n, pair[0].left_out) == (10, 10)


def test_queries_left_out_of_the_pairs_are_said_beside_the_verdict() -> None:
    """b's 6 weaker queries each hold an error verdict: undefined (not judged fully), they
    stay out of the pairs, and the verdict says how many were left out."""
    rows = [_found_at(f"q{i:02d}", "a", 2) for i in range(12)]
    rows += [
        _found_at(f"q{i:02d}", "b", 1) if i < 6 else _found_at(f"q{i:02d}", "b", 3, "error")
        for i in range(12)
    ]
    (d,) = compare(rows, ["ndcg"], GRADED, n_boot=200).diffs
    assert (d.n, d.left_out) == (6, 6)
    line = headline_lines(compare(rows, ["ndcg"], GRADED, n_boot=200))[0]
    assert line.endswith(
        "of 6 queries; 6 more left out: 6 not judged fully by b (unparsed or failed verdicts)"
    )
    # Left out for another reason: queries one side does not hold (another night's, say).
    held = [r for r in rows if not (r.query.engine == "b" and r.query.query_id >= "q06")]
    line = headline_lines(compare(held, ["ndcg"], GRADED, n_boot=200))[0]
    assert line.endswith("of 6 queries; 6 more left out: 6 held by one side only")


def test_the_leading_engine_is_not_one_asked_a_few_easy_queries() -> None:
    """a beats b on all 20 queries; c holds only 4 of them and ranks each perfectly. The
    engines are compared with a (the best of those that hold the run's queries), not with c,
    which would leave a against b unsaid."""
    rows = [_found_at(f"q{i:02d}", "a", 1 if i % 2 else 2) for i in range(20)]
    rows += [_found_at(f"q{i:02d}", "b", 3) for i in range(20)]
    rows += [_found_at(f"q{i:02d}", "c", 1) for i in range(4)]
    config = load_config(None, {"metrics.names": ["ndcg"], "judge.scale": "graded"})
    summary = build_summary(config, rows, n_boot=20)
    assert summary.engines["c"].mean("ndcg") == 1.0 > summary.engines["a"].mean("ndcg")
    assert leading_engine(summary) == "a"


def test_an_ndcg_win_that_pooled_ndcg_contradicts_is_said_beside_it() -> None:
    """b ranks its one relevant passage first; a finds four, one of them second. Each NDCG is
    over its own list's best order, so b "wins" on ndcg; against everything either found
    (pooled_ndcg) a is better, and the headline says so next to the ndcg verdict."""
    rows = []
    for i in range(10):
        a = [(f"a{i}-{r}", f"answer {i} part {r}") for r in range(5)]
        b = [(f"b{i}-{r}", f"other {i} text {r}") for r in range(5)]
        rows.append(judged(f"q{i}", "a", a, [3, 0, 3, 3, 3], text=f"query {i}"))
        rows.append(judged(f"q{i}", "b", b, [3, 0, 0, 0, 0], text=f"query {i}"))
    lines = headline_lines(compare(rows, ["ndcg", "pooled_ndcg"], GRADED, n_boot=200))
    assert lines[0].startswith("b beats a on ndcg: ")
    assert lines[1].startswith("but a beats b on pooled_ndcg: ")
    assert lines[1].endswith(
        "(ndcg ranks each engine against its own list's best order, so an engine that finds "
        "fewer relevant passages can score higher on it; pooled_ndcg ranks both against all "
        "they found)"
    )


def test_the_largest_change_is_claimed_only_once_its_p_is_adjusted_for_the_metrics() -> None:
    """ndcg and hit differ both ways (no significant difference); ap differs on 6 of 8
    queries, all one way: p = 2/64 = 0.031 alone, 0.094 once adjusted over the three metrics
    compared. No metric is named as having moved; with ap beside ndcg alone, the 6 pairs
    still fall short (0.0625), and with 7 they do not (0.031 once adjusted)."""

    def rows(differ: int) -> list[JudgedQuery]:
        out = []
        for i in range(8):
            swing = 0.1 if i % 2 else -0.1
            out.append(stored(f"q{i}", "a", 0.5, ap=0.2, hit=0.5))
            ap = 0.4 + i / 100 if i < differ else 0.2
            out.append(stored(f"q{i}", "b", 0.5 + swing, ap=ap, hit=0.5 - swing))
        return out

    three = compare(rows(6), ["ndcg", "ap", "hit"], GRADED, n_boot=200)
    (ap,) = [d for d in three.diffs if d.metric == "ap"]
    assert ap.p_value == pytest.approx(2 / 64) and ap.better()
    assert len(headline_lines(three)) == 1
    two = compare(rows(7), ["ndcg", "ap"], GRADED, n_boot=200)
    assert headline_lines(two)[1].startswith(
        "largest significant change, p = 0.031 Holm-adjusted over 2 metrics: b beats a on ap"
    )
    # Past what the exact test enumerates, a sampled p at its floor says only "below": 30
    # queries all one way had read "p = 0.0002", where the true p is about 2e-9.
    many = []
    for i in range(30):
        many.append(stored(f"q{i}", "a", 0.5, ap=0.2))
        many.append(stored(f"q{i}", "b", 0.5 + (0.1 if i % 2 else -0.1), ap=0.4 + i / 1000))
    sampled = compare(many, ["ndcg", "ap"], GRADED, n_boot=200)
    assert headline_lines(sampled)[1].startswith(
        "largest significant change, p < 0.0002 Holm-adjusted over 2 metrics: b beats a on ap"
    )


def test_an_engine_named_with_beats_does_not_hide_the_largest_change() -> None:
    rows = []
    for i in range(8):
        rows += [stored(f"q{i}", "new beats old", 0.5, ap=0.2), stored(f"q{i}", "z", 0.5, ap=0.6)]
    lines = headline_lines(compare(rows, ["ndcg", "ap"], GRADED, n_boot=200))
    assert lines[0].startswith("no query differs between z and new beats old on ndcg")
    assert "z beats new beats old on ap" in lines[1]


def test_a_baseline_summary_json_compares_like_its_run_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A nightly baseline is often only a summary.json (judge baseline set copies it): compare
    reads its per-query rows and gives the same paired numbers as the run it came from."""
    from judge.config import load_config
    from judge.report.finish import finish_run

    results = sample_results(repeats=1)
    as_default = [
        jq.model_copy(update={"query": jq.query.model_copy(update={"engine": "default"})})
        for jq in results
    ]
    monday = write_run(tmp_path / "monday" / "out", as_default)
    tuesday = write_run(
        tmp_path / "tuesday" / "out", [jq for jq in as_default if jq.key[0] != "q3"]
    )
    config = load_config(None, {"judge.scale": "graded", "run.history": str(tmp_path / "h.sqlite")})
    finish_run(config, monday, None)
    kept = tmp_path / "baseline" / "summary.json"
    kept.parent.mkdir()
    kept.write_bytes((monday / "summary.json").read_bytes())
    by_dir, by_file = tmp_path / "dir.json", tmp_path / "file.json"
    argv = ["--metric", "ndcg@5", "--n-boot", "300", "--seed", "1"]
    assert run_cli(["compare", str(monday), str(tuesday), *argv, "--json", str(by_dir)]) == 0
    text = capsys.readouterr().out
    assert "monday/out" in text and "tuesday/out" in text  # same folder name: told apart
    assert run_cli(["compare", str(kept), str(tuesday), *argv, "--json", str(by_file)]) == 0
    a, b = json.loads(by_dir.read_text()), json.loads(by_file.read_text())
    assert [d["diff"] for d in a["diffs"]] == [d["diff"] for d in b["diffs"]]
    assert a["diffs"][0]["n"] == b["diffs"][0]["n"] == len({jq.key[0] for jq in results}) - 1

    # Pooled metrics need verdicts: a summary.json source leaves them out, or refuses them.
    plain = tmp_path / "plain.json"
    assert run_cli(["compare", str(kept), str(tuesday), "--json", str(plain)]) == 0
    assert not [m for m in json.loads(plain.read_text())["metrics"] if m.startswith("pooled")]
    with pytest.raises(ConfigError, match="pooled metrics need every source's verdicts"):
        run_cli(["compare", str(kept), str(tuesday), "--metric", "pooled_ndcg"])
    # The configured baseline: --vs-baseline reads the config's [thresholds] baseline.
    conf = tmp_path / "nightly.toml"
    conf.write_text(f'[judge]\nscale = "graded"\n[thresholds]\nbaseline = "{kept}"\n')
    by_config = tmp_path / "config.json"
    argv2 = [*argv, "--json", str(by_config), "--config", str(conf), "--vs-baseline"]
    assert run_cli(["compare", str(tuesday), *argv2]) == 0
    c = json.loads(by_config.read_text())
    assert list(c["baselines"].values()) == ["baseline"] and c["engines"][0] == "baseline"
    assert [d["diff"] for d in c["diffs"]] == [d["diff"] for d in b["diffs"]]
    # A metric the summary was made without cannot come from its means (a hit@3 of rows
    # with no passages would read 0, and a query "found nothing"): refused when asked for,
    # left out of the defaults, said.
    made = json.loads(kept.read_text())["metric_names"]
    assert "hit@3" not in made
    with pytest.raises(ConfigError, match=r"hit@3: .*summary\.json was made without it"):
        run_cli(["compare", str(tuesday), str(kept), "--metric", "hit@3"])
    with pytest.raises(ConfigError, match=r"hit@3: .*summary\.json was made without it"):
        run_cli(["compare", str(tuesday), str(kept), "--fail-if-worse", "hit@3"])
    conf.write_text(
        f'[judge]\nscale = "graded"\n[metrics]\nnames = ["ndcg@5", "hit@3"]\n'
        f'[thresholds]\nbaseline = "{kept}"\n'
    )
    assert run_cli(["compare", str(tuesday), "--config", str(conf), "--vs-baseline"]) == 0
    said = capsys.readouterr()
    assert "hit@3: " in said.err and "left out of the comparison" in said.err
    assert "hit@3" not in said.out and "ndcg@5" in said.out


def test_a_run_without_judged_rows_among_several_is_refused_not_dropped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A baseline stopped before its first query would otherwise vanish: the other run's
    engines were compared with each other and --fail-if-worse passed."""
    _, judged = _runs(tmp_path, 0.0, engines=("bm25", "dense"))
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "verdicts.jsonl").write_text("", encoding="utf-8")
    args = ["compare", str(empty), str(judged), "--metric", "ndcg", "--fail-if-worse", "ndcg"]
    with pytest.raises(InputError, match=rf"^{re.escape(str(empty))}: no judged rows"):
        run_cli(args)


def test_compare_guards_its_inputs_and_its_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An output over an input (``--json RUN/verdicts.jsonl`` replaced the run's own file), a
    run given twice (merged into one and its engines compared with each other), resample
    counts below 1 (a negative count gave a false p < 0.0001) and an output into a missing
    directory (a traceback, exit 1) are each one line, exit 2, nothing written."""
    from judge.cli.main import main

    results = sample_results()
    old = write_run(tmp_path / "old", [jq for jq in results if jq.key[0] != "q9"])
    new = write_run(tmp_path / "new", [jq for jq in results if jq.key[0] != "q8"])
    before = (old / "verdicts.jsonl").read_bytes()
    assert main(["compare", str(old), str(new), "--json", str(old / "verdicts.jsonl")]) == 2
    assert "--json" in (err := capsys.readouterr().err) and "that is an input" in err
    assert (old / "verdicts.jsonl").read_bytes() == before
    assert main(["compare", str(old), str(old)]) == 2
    assert "a source is given twice" in capsys.readouterr().err
    for flag in ("--permutations", "--n-boot"):
        with pytest.raises(SystemExit) as exited:
            main(["compare", str(old), str(new), flag, "-3"])
        assert exited.value.code == 2
        assert "must be at least 1, got -3" in capsys.readouterr().err
    missing = tmp_path / "no" / "such" / "page.html"
    assert main(["compare", str(old), str(new), "--html", str(missing)]) == 2
    said = capsys.readouterr()
    assert f"judge: judge compare --html {missing}: its folder does not exist" in said.err
    assert "Traceback" not in said.err and said.out == ""  # refused before the comparison
    for flag in ("--html", "--json"):  # a folder: it failed after the comparison was printed
        assert main(["compare", str(old), str(new), flag, str(tmp_path)]) == 2
        said = capsys.readouterr()
        assert f"judge compare {flag} {tmp_path}: is a folder; name a file in it" in said.err
        assert said.out == ""


def test_a_query_id_that_asks_another_question_in_another_run_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Runs are paired by query id and question: an id that now holds another question (two
    samples numbered by line, say) is left out of the pairs, and said; it had been paired,
    and a night of other questions read as a significant fall."""
    old = [stored(f"q{i}", "e", 0.5) for i in range(8)]

    def asking(rows: list[JudgedQuery], texts: list[str]) -> list[JudgedQuery]:
        return [
            r.model_copy(update={"query": r.query.model_copy(update={"query": t})})
            for r, t in zip(rows, texts, strict=True)
        ]

    rotated = asking(
        [stored(f"q{i}", "e", 0.1) for i in range(8)], [f"other {i}" for i in range(8)]
    )
    a, b = write_run(tmp_path / "a", old), write_run(tmp_path / "b", rotated)
    argv = ["compare", str(a), str(b), "--metric", "ndcg", "--fail-if-worse", "ndcg"]
    assert run_cli(argv) == 0
    said = capsys.readouterr()
    assert "judge: 8 query id(s) ask different questions in different engines or runs" in said.err
    assert "left out of the pairs" in said.err
    assert "no query is paired (none both define, 8 ids asking another question in each)" in (
        said.err
    )
    assert "significantly worse" not in said.err
    assert said.out.startswith(
        "b and a share no query where ndcg is defined: 8 of their query ids ask another "
        "question in each, not paired"
    )
    # Six of eight ask the same question ("Q" spelt in another case is the same): those pair.
    half = asking(
        [stored(f"q{i}", "e", 0.1) for i in range(8)], ["Q", *("q" for _ in range(5)), "x", "y"]
    )
    c = write_run(tmp_path / "c", half)
    assert run_cli(["compare", str(a), str(c), "--metric", "ndcg"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("a beats c on ndcg: +0.4000 ")
    assert "of 6 queries; 2 more left out: the same id asks another question in each" in out


def test_runs_of_different_judges_or_unfinished_are_said_beside_the_comparison(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from judge.config import load_config
    from judge.report.finish import finish_run

    a, b = _runs(tmp_path, 0.05)
    for run, model in ((a, "judge-a"), (b, "judge-b")):
        options = {
            "judge.model": model,
            "judge.scale": "graded",
            "run.history": str(tmp_path / "h"),
        }
        config = load_config(None, options)
        finish_run(config, run, None)
    assert run_cli(["compare", str(a), str(b), "--metric", "ndcg"]) == 0
    err = capsys.readouterr().err
    assert "the runs were judged by different judges (openai judge-a, openai judge-b)" in err
    assert "[metrics] settings" not in err


def test_runs_scored_under_other_metric_settings_are_said_beside_the_comparison(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same verdicts give another NDCG under exponential gain: compared without a word,
    the settings' difference read as the engines'."""
    from judge.config import load_config
    from judge.report.finish import finish_run

    a, b = _runs(tmp_path, 0.05)
    for run, gain in ((a, "linear"), (b, "exponential")):
        options = {"metrics.gain": gain, "judge.scale": "graded", "run.history": str(tmp_path)}
        finish_run(load_config(None, options), run, None)
    assert run_cli(["compare", str(a), str(b), "--metric", "ndcg"]) == 0
    err = capsys.readouterr().err
    assert (
        "judge: the runs were scored under different [metrics] settings (gain: linear vs "
        "exponential, the first run's first): their numbers differ for the same rankings"
    ) in err


def test_runs_sharing_no_engine_name_are_compared_with_none_as_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two runs whose engines share no name: each of the second run's engines is said to be
    compared with none, and none is (it had been paired with the baseline's first engine
    anyway, and --fail-if-worse failed on that pairing)."""
    rows = sample_results(repeats=1)
    first = write_run(tmp_path / "first", rows)
    renamed = [
        jq.model_copy(update={"query": jq.query.model_copy(update={"engine": f"x{jq.key[1]}"})})
        for jq in rows
    ]
    second = write_run(tmp_path / "second", renamed)
    out = tmp_path / "cmp.json"
    argv = ["compare", str(first), str(second), "--metric", "ndcg", "--json", str(out)]
    assert run_cli([*argv, "--fail-if-worse", "ndcg"]) == 0
    said = capsys.readouterr()
    assert said.err.count("compared with none") == 2
    assert "--fail-if-worse ndcg: no engine was compared with another on it" in said.err
    assert json.loads(out.read_text())["diffs"] == []


def test_a_tiny_p_reads_p_below_not_p_equals_below() -> None:
    """The page's first screen had said "p = < 0.0001~"."""
    from judge.report.compared import one_line

    d = paired_diff(
        "ndcg", ("b", {f"q{i}": 1.0 for i in range(30)}), ("a", {f"q{i}": 0.0 for i in range(30)})
    )
    line = one_line(d)
    assert "p < 0.0001" in line and "p = <" not in line


def test_a_passage_id_with_other_text_in_another_run_is_said_beside_pooled_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pooled metrics grade one id once: two nights whose lists hold the same ids over other
    texts compare on one shared grade, which had gone unsaid (and read as "no query
    differs" beside a significant fall)."""
    first = [
        judged(f"q{i}", "e", [("a", "good text"), ("b", "weak text")], [3, 0]) for i in range(6)
    ]
    second = [
        judged(f"q{i}", "e", [("a", "now other text"), ("b", "weak text")], [0, 0])
        for i in range(6)
    ]
    a, b = write_run(tmp_path / "a", first), write_run(tmp_path / "b", second)
    assert run_cli(["compare", str(a), str(b), "--metric", "ndcg", "--metric", "pooled_ndcg"]) == 0
    err = capsys.readouterr().err
    assert "judge: 6 passage id(s) hold different texts in different engines or runs" in err
    assert run_cli(["compare", str(a), str(b), "--metric", "ndcg"]) == 0
    assert "passage id(s)" not in capsys.readouterr().err  # no pooled metric: nothing to say


def test_texts_the_pool_takes_as_one_are_not_said_to_differ(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The warning reads "the same text" as the pool does (NFKC too): a full-width or
    ligature spelling of one text had been said to be another passage."""
    first = [judged(f"q{i}", "e", [("a", "ﬁne text"), ("b", "ＡＢＣ")], [3, 0]) for i in range(6)]
    second = [judged(f"q{i}", "e", [("a", "fine  TEXT"), ("b", "abc")], [3, 0]) for i in range(6)]
    a, b = write_run(tmp_path / "a", first), write_run(tmp_path / "b", second)
    assert run_cli(["compare", str(a), str(b), "--metric", "pooled_ndcg"]) == 0
    assert "passage id(s)" not in capsys.readouterr().err


def test_the_best_of_several_engines_is_read_against_every_pair_of_them() -> None:
    """The best of four engines, chosen after the fact, beats the worst by chance alone in
    17% of runs of four equal engines: its p is read against the 6 pairs of 4 engines."""
    rows = []
    for i in range(8):
        rows += [stored(f"q{i}", e, 0.5) for e in ("a", "c", "d")]
        rows.append(stored(f"q{i}", "b", 0.6 + i / 100 if i < 6 else 0.5))
    raw = compare(rows, ["ndcg"], GRADED, baseline="b", n_boot=200)
    chosen = compare(rows, ["ndcg"], GRADED, baseline="b", n_boot=200, best_of=True)
    a_raw = next(d for d in raw.diffs if d.engine == "a")
    a_chosen = next(d for d in chosen.diffs if d.engine == "a")
    assert a_raw.p_value == a_chosen.p_value == pytest.approx(2 / 64)
    assert a_raw.worse() and not a_chosen.worse() and a_chosen.family == 6
    assert headline_lines(raw)[0].startswith("b beats a on ndcg")
    line = headline_lines(chosen)[0]
    assert line.startswith("no significant difference between a and b on ndcg")
    assert "p = 0.188 adjusted over 6 pairs of engines" in line
    two = compare([r for r in rows if r.query.engine in "ab"], ["ndcg"], GRADED, best_of=True)
    assert two.diffs[0].family == 1  # two engines: nothing was chosen


def test_queries_left_out_because_one_side_failed_are_named_with_the_verdict() -> None:
    """A winner over the queries where the other side's verdicts were unparsed (exactly those
    it would have lost) had been said with "left out, undefined for ..." and three possible
    reasons: the left-out queries are now counted as what they are."""
    rows = []
    for i in range(20):
        broken = i % 2 == 0
        rows.append(
            judged(f"q{i}", "solid", [("s", "x"), ("t", "y")], [3, 0] if broken else [0, 3])
        )
        grades: list[int | str] = ["unparsed", 3] if broken else [3, 0]
        rows.append(judged(f"q{i}", "flaky", [("f", "x"), ("g", "y")], grades))
    cmp = compare(rows, ["ndcg"], GRADED, baseline="solid", n_boot=200)
    (d,) = cmp.diffs
    assert (d.n, d.left_out, d.unjudged_engine, d.unjudged_baseline) == (10, 10, 10, 0)
    line = headline_lines(cmp)[0]
    assert line.startswith("flaky beats solid on ndcg"), line
    assert "; 10 more left out: 10 not judged fully by flaky (unparsed or failed verdicts)" in line


def test_compare_qualifies_its_verdict_when_a_runs_judge_was_found_unreliable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run whose judge said 'yes' to nearly everything leads its own verdict with "by a
    judge found unreliable"; judge compare of the same run had said it unqualified."""
    from judge.config import load_config
    from judge.report.finish import finish_run

    rows = []
    for i in range(12):
        rows.append(judged(f"q{i}", "a", [(f"a{i}", "x"), (f"b{i}", "y")], [3, 3]))
        rows.append(judged(f"q{i}", "b", [(f"c{i}", "x"), (f"d{i}", "y")], [3, 0 if i < 2 else 3]))
    run = write_run(tmp_path / "run", rows)
    config = load_config(None, {"judge.scale": "graded", "run.history": str(tmp_path / "h.sqlite")})
    assert finish_run(config, run).health.degenerate
    capsys.readouterr()
    assert run_cli(["compare", str(run), "--metric", "ndcg"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(f"(by a judge found unreliable in {run}: see its Trust line)"), lines


def test_ids_that_are_only_ranks_do_not_pool_other_engines_passages() -> None:
    """Rows without passage ids are numbered by rank ("1", "2", ...): bm25's "1" is not
    dense's "1". Pooled by id, they had merged different passages, their opposite verdicts
    tying to the lower grade (pooled_ndcg 1.0 for both engines here)."""
    from judge.analysis.judged_pool import pooled_metrics

    texts = ["pale fact", "dog fact", "oat fact"]
    rows = []
    for q in range(4):
        for engine, order in (("dense", texts), ("bm25", texts[::-1])):
            ranked = [(str(i), t) for i, t in enumerate(order, start=1)]
            rows.append(
                judged(f"q{q}", engine, ranked, [3 if t == "pale fact" else 0 for t in order])
            )
    values = pooled_metrics(rows, ["pooled_ndcg"], GRADED)
    by_engine = {jq.query.engine: v["pooled_ndcg"] for jq, v in zip(rows, values, strict=True)}
    assert by_engine == {"dense": pytest.approx(1.0), "bm25": pytest.approx(0.5)}
