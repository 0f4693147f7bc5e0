"""The judge's health (DESIGN rule 10): a judge that says one thing to every passage, or whose
probabilities barely move, is called degenerate in the summary, the report, the console and,
when asked, the threshold checks."""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from judge.analysis.health import (
    DOMINANT_SHARE,
    MIN_VERDICTS,
    JudgeHealth,
    judge_health,
    spread,
)
from judge.config import load_config
from judge.metrics.compute import metrics_for_queries
from judge.report.document import write_reports
from judge.report.summary import build_summary, load_summary, write_summary
from judge.schema import JudgedQuery, Passage, Query, Scale, Verdict
from tests.servers import ScriptedServer, label_responder

BINARY = Scale.binary()
GRADED = Scale.graded()


def judged(
    qid: str,
    grades: list[int],
    *,
    engine: str = "e",
    probs: list[float] | None = None,
    scale: Scale = BINARY,
) -> JudgedQuery:
    """One query's ok verdicts with these grades (and probabilities, when given)."""
    query = Query(
        query_id=qid,
        query=f"question {qid}",
        engine=engine,
        passages=tuple(Passage(id=f"{qid}-p{i}", text=f"text {i}") for i in range(len(grades))),
    )
    verdicts = tuple(
        Verdict(
            passage_id=f"{qid}-p{i}",
            rank=i + 1,
            status="ok",
            label=scale.by_grade(g).name,
            grade=g,
            relevant=scale.relevant(g),
            probability=probs[i] if probs else None,
        )
        for i, g in enumerate(grades)
    )
    metrics = metrics_for_queries(["ap", "relevancy_mean"], [(query, verdicts)], scale)[0]
    return JudgedQuery(query=query, repeat=0, scale=scale.name, verdicts=verdicts, metrics=metrics)


def all_yes(n_queries: int = 40, per_query: int = 3, engine: str = "e") -> list[JudgedQuery]:
    """What the default embedded judge did: "yes" to every passage."""
    return [judged(f"q{q}", [1] * per_query, engine=engine) for q in range(n_queries)]


def balanced(n_queries: int = 40) -> list[JudgedQuery]:
    """Half yes, half no, with probabilities spread between 0.05 and 0.95."""
    out = []
    for q in range(n_queries):
        grades = [(q + i) % 2 for i in range(4)]
        probs = [0.05 + 0.9 * ((q * 4 + i) % 10) / 9 for i in range(4)]
        out.append(judged(f"q{q}", grades, probs=probs))
    return out


def test_an_all_yes_judge_is_degenerate_and_says_why() -> None:
    health = judge_health(all_yes(), BINARY)
    assert health.known and health.degenerate
    (problem,) = health.problems
    assert "'yes'" in problem and "120 of 120" in problem and "100.0%" in problem
    assert "not informative" in problem
    for advice in ("another judge model", "judge calibrate", "graded scale"):
        assert advice in problem
    overall = health.overall
    assert (overall.ok, overall.top_label, overall.top_share) == (120, "yes", 1.0)
    assert [(c.label, c.count, c.share) for c in overall.labels] == [
        ("no", 0, 0.0),
        ("yes", 120, 1.0),
    ]
    assert health.engines["e"].degenerate and overall.probability.n == 0


def test_one_label_just_under_the_limit_is_not_degenerate() -> None:
    # 19 "no" out of 400 verdicts: yes takes 95.25% -> degenerate; 21 "no" -> 94.75%: not.
    def run(n_no: int) -> JudgeHealth:
        grades = [0] * n_no + [1] * (400 - n_no)
        return judge_health(
            [judged(f"q{i}", grades[i * 4 : i * 4 + 4]) for i in range(100)], BINARY
        )

    assert run(19).degenerate and "95.2%" in run(19).problems[0]
    assert not run(21).degenerate and run(21).overall.top_share == pytest.approx(0.9475)
    assert DOMINANT_SHARE == 0.95


def test_a_balanced_judge_is_healthy() -> None:
    health = judge_health(balanced(), BINARY)
    assert not health.degenerate and health.problems == () and health.notes == ()
    assert health.overall.top_share == 0.5
    p = health.overall.probability
    assert p.n == 160 and p.distinct == 10 and p.std is not None and p.std > 0.25
    assert p.p10 is not None and p.p90 is not None and p.p90 - p.p10 > 0.5


def test_a_judge_measured_too_weak_is_unreliable_whatever_its_verdicts_look_like() -> None:
    """The embedded 0.5B LLM failed the quality bench on TREC passages: a run with it says so
    plainly even when its labels happen to vary, and another provider on the same verdicts
    stays healthy."""
    embedded = judge_health(balanced(), BINARY, "embedded")
    assert embedded.degenerate
    assert embedded.problems[0].startswith("The embedded 0.5B LLM judge cannot tell")
    assert "AUC" in embedded.problems[0] and "rerank_*" in embedded.problems[0]
    assert not judge_health(balanced(), BINARY, "openai").degenerate


def test_a_cascade_run_labelled_mostly_by_the_reranker_says_what_fools_it() -> None:
    """When most labels of an embedded run came from the cascade's reranker, the warning is
    about the reranker (English only, fooled by query stuffing), not only the LLM."""

    def by(source: str, rows: list[JudgedQuery]) -> list[JudgedQuery]:
        out = []
        for i, jq in enumerate(rows):
            mine = i % 4 != 0 if source == "reranker" else i % 4 == 0
            verdicts = tuple(
                v.model_copy(update={"source": "reranker" if mine else "judge"})
                for v in jq.verdicts
            )
            out.append(jq.model_copy(update={"verdicts": verdicts}))
        return out

    cascade = judge_health(by("reranker", balanced()), BINARY, "embedded")
    assert cascade.degenerate
    assert cascade.problems[0].startswith("Most labels here come from the embedded reranker")
    assert "English" in cascade.problems[0] and "echoing the query" in cascade.problems[0]
    mostly_llm = judge_health(by("judge", balanced()), BINARY, "embedded")
    assert mostly_llm.problems[0].startswith("The embedded 0.5B LLM judge cannot tell")


def test_flat_probabilities_are_flagged_even_when_labels_vary() -> None:
    """Labels split half and half, but P(relevant) is 0.50 +- 0.02: coin flips, nothing ranks."""
    rows = [
        judged(f"q{q}", [(q + i) % 2 for i in range(4)], probs=[0.48 + 0.01 * i for i in range(4)])
        for q in range(10)
    ]
    health = judge_health(rows, BINARY)
    assert health.degenerate and health.overall.top_share == 0.5
    (problem,) = health.problems
    assert "too flat to rank" in problem and "standard deviation" in problem
    assert "not informative" in problem


def test_ties_with_a_few_outliers_are_flat_too() -> None:
    """96% of probabilities at 0.5 and a few at 0 and 1: std is large, but nearly all tie."""
    probs = [0.5] * 96 + [0.0, 0.0, 1.0, 1.0]
    rows = [
        judged(f"q{q}", [(q + i) % 2 for i in range(4)], probs=probs[q * 4 : q * 4 + 4])
        for q in range(25)
    ]
    health = judge_health(rows, BINARY)
    p = health.overall.probability
    assert p.std is not None and p.std >= 0.05 and p.peak_share == pytest.approx(0.96)
    assert health.degenerate and "96.0% of them within 0.05" in health.problems[0]


def test_bimodal_probabilities_that_match_varied_labels_are_not_flat() -> None:
    """92% "yes" at 0.99 and 8% "no" at 0.01: the label rule passes, so does the spread."""
    grades = [1] * 92 + [0] * 8
    rows = [
        judged(
            f"q{q}",
            grades[q * 4 : q * 4 + 4],
            probs=[0.99 if g else 0.01 for g in grades[q * 4 : q * 4 + 4]],
        )
        for q in range(25)
    ]
    assert not judge_health(rows, BINARY).degenerate


def test_too_few_verdicts_are_not_called_degenerate() -> None:
    rows = all_yes(n_queries=6)  # 18 verdicts, all "yes" at one probability
    rows = [
        r.model_copy(
            update={
                "verdicts": tuple(v.model_copy(update={"probability": 0.9}) for v in r.verdicts)
            }
        )
        for r in rows
    ]
    health = judge_health(rows, BINARY)
    assert not health.degenerate and health.problems == ()
    assert any("too few to tell" in n and f"{MIN_VERDICTS}" in n for n in health.notes)
    assert any("18 probabilities" in n for n in health.notes)
    empty = judge_health([], BINARY)
    assert not empty.degenerate and empty.overall.ok == 0 and empty.overall.top_label is None


def test_one_saturated_engine_is_a_note_not_a_degenerate_judge() -> None:
    rows = all_yes(n_queries=10, engine="good") + [
        judged(f"q{q}", [0, 1, 0], engine="weak") for q in range(10)
    ]
    health = judge_health(rows, BINARY)
    assert not health.degenerate and health.engines["good"].degenerate
    assert not health.engines["weak"].degenerate
    (note,) = health.notes
    assert "engine 'good'" in note and "'yes'" in note and "not degenerate" in note


def test_failed_verdicts_are_no_label_and_graded_scales_count_every_label() -> None:
    rows = [judged(f"q{q}", [3, 2, 1, 0], scale=GRADED) for q in range(10)]
    failed = Verdict(passage_id="x", rank=5, status="error", error="HTTP 500")
    rows[0] = rows[0].model_copy(update={"verdicts": (*rows[0].verdicts, failed)})
    health = judge_health(rows, GRADED)
    assert health.overall.ok == 40 and not health.degenerate
    assert [c.label for c in health.overall.labels] == [
        "unrelated",
        "related",
        "partial",
        "answers",
    ]
    assert all(c.share == 0.25 for c in health.overall.labels)
    # No graded scale to suggest when the scale is graded already.
    flat = judge_health([judged(f"q{q}", [2] * 4, scale=GRADED) for q in range(10)], GRADED)
    assert flat.degenerate and "'partial'" in flat.problems[0]
    assert "graded scale" not in flat.problems[0]


def test_spread_statistics() -> None:
    p = spread([0.1, 0.2, 0.2, 0.9, 0.904])
    assert p.n == 5 and p.distinct == 3
    assert p.mean == pytest.approx(0.4608) and p.peak_share == pytest.approx(0.4)
    assert p.p10 == pytest.approx(0.14) and p.p90 == pytest.approx(0.9024)
    assert spread([]).n == 0 and spread([]).mean is None


# --- the summary, its threshold and the report ----------------------------------------------


def test_the_summary_records_health_and_it_round_trips(tmp_path: Path) -> None:
    config = load_config(None, {"metrics.names": ["ap"]})
    summary = build_summary(config, all_yes(), n_boot=20)
    assert summary.health.degenerate and "'yes'" in summary.health.problems[0]
    assert summary.thresholds.breached == 0  # off by default: a warning, not a failure
    path = write_summary(tmp_path / "summary.json", summary)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["health"]["degenerate"] is True and data["health"]["overall"]["ok"] == 120
    assert load_summary(path) == summary
    healthy = build_summary(config, balanced(), n_boot=20)
    assert load_summary(write_summary(tmp_path / "ok.json", healthy)).health == healthy.health


def test_a_summary_without_health_loads_as_unknown(tmp_path: Path) -> None:
    config = load_config(None, {"metrics.names": ["ap"]})
    data = build_summary(config, balanced(), n_boot=20).model_dump(mode="json")
    del data["health"]
    (tmp_path / "old.json").write_text(json.dumps(data), encoding="utf-8")
    loaded = load_summary(tmp_path / "old.json")
    assert loaded.health == JudgeHealth.unknown()
    assert not loaded.health.known and not loaded.health.degenerate


def test_fail_on_degenerate_judge_makes_a_degenerate_judge_a_breach() -> None:
    config = load_config(
        None, {"metrics.names": ["ap"], "thresholds.fail_on_degenerate_judge": True}
    )
    summary = build_summary(config, all_yes(), n_boot=20)
    (breach,) = summary.thresholds.breaches
    assert breach.check == "degenerate judge" and not breach.ok
    assert breach.note is not None and "'yes'" in breach.note
    fine = build_summary(config, balanced(), n_boot=20)
    (check,) = [c for c in fine.thresholds.checks if c.check == "degenerate judge"]
    assert check.ok and fine.thresholds.breached == 0
    assert load_config(None).thresholds.fail_on_degenerate_judge is False


def test_the_report_opens_with_the_warning(tmp_path: Path) -> None:
    config = load_config(None, {"metrics.names": ["ap", "relevancy_mean"]})
    results = all_yes()
    md, page = write_reports(tmp_path, build_summary(config, results, n_boot=20), results)
    lines = md.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "# JUDGE UNRELIABLE · judge report · default config"
    assert lines[2].startswith("- judge unreliable: The judge gave 'yes' to 120 of 120")
    assert "not informative" in lines[2]
    text = "\n".join(lines)
    assert text.index("## Metrics") < text.index("## Judge health")
    assert "| all engines | 120 | 0 (0.0%) | 120 (100.0%) | yes |" in text
    html = page.read_text(encoding="utf-8")
    assert "<title>JUDGE UNRELIABLE · judge report" in html
    body = html[html.index("<main>") :]
    assert body.index('<header id="status" class="unreliable">') < body.index("<section")
    assert "The judge gave &#x27;yes&#x27;" in body  # escaped like every other text


def test_a_healthy_report_has_no_warning_but_shows_health(tmp_path: Path) -> None:
    config = load_config(None, {"metrics.names": ["ap"]})
    results = balanced()
    md, page = write_reports(tmp_path, build_summary(config, results, n_boot=20), results)
    text = md.read_text(encoding="utf-8")
    assert "UNRELIABLE" not in text and 'class="unreliable"' not in page.read_text("utf-8")
    health = text[text.index("## Judge health") :]
    assert "Not degenerate." in health and "| all engines | 160 |" in health
    assert "| with P(relevant) |" in health


def test_a_report_of_a_summary_without_health_measures_it_from_the_results(
    tmp_path: Path,
) -> None:
    config = load_config(None, {"metrics.names": ["ap"]})
    results = all_yes()
    old = build_summary(config, results, n_boot=20).model_copy(
        update={"health": JudgeHealth.unknown()}
    )
    md, _ = write_reports(tmp_path, old, results)
    assert md.read_text(encoding="utf-8").splitlines()[0].startswith("# JUDGE UNRELIABLE")


# --- the console ---------------------------------------------------------------------------


def test_judge_run_warns_on_stderr_and_fails_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from judge.cli.main import main
    from judge.run import runner
    from judge.run.progress import Progress
    from tests.test_runner import write_config, write_dataset

    # Progress's default stream may be an earlier test's closed capture (see test_cli.py).
    monkeypatch.setattr(runner, "Progress", partial(Progress, stream=sys.stderr))
    dataset = write_dataset(tmp_path / "d.jsonl", n_queries=8, n_passages=3)
    with ScriptedServer(responder=label_responder(lambda request: "yes")) as server:
        tables: dict[str, dict[str, Any]] = {
            "dataset": {"path": str(dataset), "label_scale": "binary"},
            "run": {"history": str(tmp_path / "history.sqlite")},
            "thresholds": {"fail_on_degenerate_judge": True},
        }
        config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite", tables)
        assert main(["run", str(config), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "judge: WARNING: the judge is degenerate" in err
    assert "gave 'yes' to 24 of 24 ok verdicts (100.0%" in err
    assert "threshold breached: degenerate judge" in err
    lines = (tmp_path / "out" / "report.md").read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# JUDGE UNRELIABLE")
    breach = "- breached: degenerate judge: fail_on_degenerate_judge is set, so a degenerate "
    assert f"{breach}judge fails the run" in lines
