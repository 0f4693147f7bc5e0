"""The judge's health (DESIGN rule 10): a judge that says one thing to every passage, or whose
probabilities barely move, is called degenerate in the summary, the report, the console and,
when asked, the threshold checks."""

from __future__ import annotations

import html
import json
import sys
from collections.abc import Callable
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
from judge.schema import JudgedQuery, Passage, Query, Scale, Usage, Verdict
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


def cascade_run(
    n_queries: int = 40, *, llm_every: int = 0, language: str = "en", prefix: str = "q"
) -> list[JudgedQuery]:
    """A reranker's run of 5 passages a query (scores 0.1 0.3 0.5 0.7 0.9, cut at 0.6: 40%
    "yes"); with ``llm_every`` n, the 0.5 passage of every n-th query went to the LLM (a paid
    call), which said "yes" to it in every other such query."""
    out = []
    for q in range(n_queries):
        jq = judged(f"{prefix}{q}", [0, 0, 0, 1, 1], probs=[0.1, 0.3, 0.5, 0.7, 0.9])
        if language != "en":
            text = {
                "zh": "北京的天气怎么样",
                "fr": "La météo de Paris est douce et le ciel est"
                " souvent gris, mais il ne pleut pas tous les jours dans la ville.",
                "ar": "الطقس في باريس معتدل",
            }[language]
            passages = tuple(p.model_copy(update={"text": text}) for p in jq.query.passages)
            jq = jq.model_copy(update={"query": jq.query.model_copy(update={"passages": passages})})
        asked = bool(llm_every) and q % llm_every == 0
        verdicts = []
        for v in jq.verdicts:
            if asked and v.rank == 3:
                yes = q % (2 * llm_every) == 0
                update: dict[str, Any] = {
                    "source": "judge",
                    "usage": Usage(prompt_tokens=90, completion_tokens=3),
                    "grade": int(yes),
                    "label": "yes" if yes else "no",
                    "relevant": yes,
                }
            else:
                update = {"source": "reranker"}
            verdicts.append(v.model_copy(update=update))
        scores = {v.passage_id: v.probability or 0.0 for v in verdicts}
        out.append(jq.model_copy(update={"verdicts": tuple(verdicts), "rerank_scores": scores}))
    return out


def test_a_reranker_only_run_with_40_percent_yes_is_not_unreliable() -> None:
    """A judge by score that says "yes" to 40% of passages is a measured judge, not a degenerate
    one, and nothing mentions an LLM that was never asked, whatever the config's LLM is."""
    for llm in (None, "embedded"):
        health = judge_health(
            cascade_run(),
            BINARY,
            llm=llm,
            language="en",
            served=("en", "zh"),
            served_by="the judge (embedded-fused)",
        )
        assert health.known and not health.degenerate and health.problems == ()
        assert health.sources == {"reranker": 200, "llm": 0} and health.band is None
        assert (
            health.findings[0]
            == "200 of 200 labels came from the reranker's score; no LLM was asked."
        )
        assert health.caveats == ()
        assert not any("LLM judge" in line or "0.5B" in line for line in health.said())
        assert health.findings[-1] == (
            "Language: 0 of 200 passages detected as Chinese (0%), the rest taken as English; "
            '[judge] language "en"; the judge (embedded-fused) serves English and Chinese.'
        )


def test_a_cascade_says_what_the_llm_decided_and_how_it_follows_the_reranker() -> None:
    """LLM verdicts exist: their share, their agreement with the reranker's score on the band
    as a figure, and the embedded LLM's dev-set caveat, which never makes the judge unreliable."""
    rows = cascade_run(llm_every=1)  # every query's 0.5 passage went to the LLM
    health = judge_health(
        rows, BINARY, llm="embedded", served=("en",), served_by="the reranker (embedded-rerank)"
    )
    assert not health.degenerate and health.sources == {"reranker": 160, "llm": 40}
    assert health.findings[0] == (
        "Labels: 160 of 200 (80%) from the reranker's score, 40 (20%) from the LLM judge on "
        "the band."
    )
    # Every band passage scores 0.5: the LLM's yes and no cannot follow the score (AUC 0.5).
    assert health.band is not None and (health.band.n, health.band.relevant) == (40, 20)
    assert health.band.auc == pytest.approx(0.5)
    assert health.findings[1].startswith(
        "On the band the LLM's labels follow the reranker's score at AUC 0.50 over 40 passages"
    )
    (caveat,) = health.caveats
    assert caveat.startswith("The embedded 0.5B LLM decided 40 of 200 labels here (20%);")
    assert "AUC about 0.6" in caveat and "bench/bench_quality.py" in caveat
    # Another LLM: no caveat; too few band passages: said, with no figure.
    few = judge_health(cascade_run(llm_every=4), BINARY, llm="openai")
    assert few.caveats == () and few.band is not None and few.band.auc is None
    assert few.findings[1].startswith(
        "Too few band passages with a label each way (10, 5 called relevant)"
    )


def with_labels(rows: list[JudgedQuery], truth: Any) -> list[JudgedQuery]:
    """``rows`` with human labels ``truth(judge grade)`` on every passage."""
    out = []
    for jq in rows:
        labels = {v.passage_id: truth(v.grade) for v in jq.verdicts}
        out.append(jq.model_copy(update={"query": jq.query.model_copy(update={"labels": labels})}))
    return out


def test_a_judge_that_disagrees_with_the_human_labels_is_unreliable_with_the_figure() -> None:
    wrong = judge_health(with_labels(balanced(), lambda g: 1 - g), BINARY)
    assert wrong.degenerate and wrong.human is not None
    (problem,) = wrong.problems
    assert problem.startswith(
        "The judge disagrees with the human labels: on 160 human-labelled passages (80 relevant), "
        "relevance kappa -1.00 (under 0.2) and AUC of P(relevant) 0.50 (under 0.6): the metrics "
        "are not informative. Try another judge model"
    )
    # Right labels but P(relevant) unrelated to them (balanced's probabilities cycle): the
    # soft metrics read those, so an AUC under the bar is enough.
    shuffled = judge_health(with_labels(balanced(), lambda g: g), BINARY)
    assert shuffled.degenerate
    assert "relevance kappa 1.00 and AUC of P(relevant) 0.50 (under 0.6):" in shuffled.problems[0]
    tracking = [judged(f"q{q}", [0, 1, 0, 1], probs=[0.2, 0.8, 0.3, 0.7]) for q in range(40)]
    right = judge_health(with_labels(tracking, lambda g: g), BINARY)
    assert not right.degenerate and right.human is not None and right.human.kappa == 1.0
    assert right.findings[0].startswith(
        "The judge agrees with the human labels: on 160 human-labelled passages (80 relevant), "
        "relevance kappa 1.00 and AUC of P(relevant) 1.00 (bars: kappa 0.2, AUC 0.6)."
    )
    # Ten labelled queries of one passage each are too few to tell: a note, not a verdict.
    few = with_labels(balanced(), lambda g: 1 - g)[:3] + balanced()[3:]
    told = judge_health(few, BINARY)
    assert not told.degenerate and told.notes[0].startswith(
        "12 judged passages carry human labels (6 relevant): too few"
    )


def test_a_language_the_model_does_not_serve_is_said_and_most_of_it_is_unreliable() -> None:
    chinese = cascade_run(language="zh")
    english_only = judge_health(
        chinese, BINARY, language="en", served=("en",), served_by="the reranker (embedded-rerank)"
    )
    assert english_only.degenerate
    assert english_only.problems == (
        "200 of the 200 passages (100%) are Chinese, which the reranker (embedded-rerank) does "
        "not serve (it serves English): the metrics are not informative. Use a judge that "
        "serves Chinese.",
    )
    both = judge_health(
        chinese, BINARY, language="zh", served=("en", "zh"), served_by="the judge (embedded-fused)"
    )
    assert not both.degenerate
    assert "200 of 200 passages detected as Chinese (100%)" in both.findings[-1]
    unknown = judge_health(chinese, BINARY, language="zh")
    assert not unknown.degenerate and "serves" not in unknown.findings[-1]
    # A few Chinese passages among English ones: a note for them, not an unreliable judge.
    mixed = cascade_run(36) + cascade_run(4, language="zh", prefix="zh")
    some = judge_health(mixed, BINARY, served=("en",), served_by="the reranker (embedded-rerank)")
    assert not some.degenerate
    assert any(n.startswith("20 of the 200 passages (10%) are Chinese") for n in some.notes)


def test_passages_in_neither_english_nor_chinese_are_found_by_script_and_words() -> None:
    """French (by its function words) and Arabic (by its script) passages had been taken as
    English: an English-only reranker's labels on them counted, and the health said ok."""
    served = {"served": ("en", "zh"), "served_by": "the judge (embedded-fused)"}
    for language in ("fr", "ar"):
        found = judge_health(cascade_run(language=language), BINARY, **served)  # type: ignore[arg-type]
        assert found.degenerate, language
        assert found.problems[0].startswith(
            "200 of the 200 passages (100%) are in neither English nor Chinese, which the judge "
            "(embedded-fused) does not serve"
        )
        assert found.problems[0].endswith("Use a judge that serves their language.")
    english = judge_health(cascade_run(), BINARY, **served)  # type: ignore[arg-type]
    assert not english.degenerate and "neither" not in " ".join(english.said())
    mixed = cascade_run(36) + cascade_run(4, language="fr", prefix="fr")
    some = judge_health(mixed, BINARY, **served)  # type: ignore[arg-type]
    assert not some.degenerate
    assert any(n.startswith("20 of the 200 passages (10%) are in neither") for n in some.notes)


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
    assert "judge: WARNING: JUDGE UNRELIABLE, these metrics are not informative:" in err
    assert "gave 'yes' to 24 of 24 ok verdicts (100.0%" in err
    assert "threshold breached: degenerate judge" in err
    lines = (tmp_path / "out" / "report.md").read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# JUDGE UNRELIABLE")
    breach = "- breached: degenerate judge: fail_on_degenerate_judge is set, so a degenerate "
    assert f"{breach}judge fails the run" in lines


# --- one record, said the same way everywhere ----------------------------------------------


def _said_everywhere(out: Path, console: str) -> dict[str, Any]:
    """summary.json's health; each of its sentences is in the console, report.md and the HTML."""
    data: dict[str, Any] = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    health = data["health"]
    sentences = health["problems"] + health["findings"] + health["caveats"] + health["notes"]
    md = (out / "report.md").read_text(encoding="utf-8")
    page = html.unescape((out / "report.html").read_text(encoding="utf-8"))
    for sentence in sentences:
        assert sentence in console and sentence in md and sentence in page, sentence
    return health


def test_a_judge_disagreeing_with_the_runs_human_labels_is_said_alike_everywhere(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An LLM judge saying "yes" exactly where the human labels say "no" (scores 0.05 and 0.35
    are labelled 0, the rest 1): JUDGE UNRELIABLE from this run's labels, with the figure."""
    from judge.cli.main import main
    from tests.test_cascade import write_config

    def backwards(request: Any) -> str:
        return "yes" if "score=0.05" in request.prompt or "score=0.35" in request.prompt else "no"

    server = make_server(responder=label_responder(backwards))
    config = write_config(tmp_path, server, None, n_queries=5, labels=[0, 0, 1, 1, 1], rerank=False)
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == 0  # a warning, not a failure
    console = capsys.readouterr()
    health = _said_everywhere(out, console.out + console.err)
    assert health["degenerate"] is True
    assert health["human"]["n"] == 25 and health["human"]["relevant"] == 15
    # Never agreeing, expected agreement (10*15 + 15*10) / 25**2 = 0.48: kappa -0.48/0.52.
    assert health["problems"][0].startswith(
        "The judge disagrees with the human labels: on 25 human-labelled passages (15 relevant), "
        "relevance kappa -0.92 (under 0.2) and AUC of P(relevant) 0.00 (under 0.6): the metrics "
        "are not informative."
    )
    lines = (out / "report.md").read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# JUDGE UNRELIABLE")
    data = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert data["outcome"]["status"] == "JUDGE UNRELIABLE"
    assert f"judge unreliable: {health['problems'][0]}" in data["outcome"]["reasons"]


def test_a_cascade_run_names_the_llm_it_asked_and_its_agreement_alike_everywhere(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The reranker labels 0.05 and 0.9, the LLM the band [0.3, 0.7): 40% of labels from the
    reranker; the LLM says "yes" from 0.5 up, so on the band it follows the score (AUC 1)."""
    from judge.cli.main import main
    from tests.test_cascade import BAND, text_scorer, write_config

    def by_score(request: Any) -> str:
        return "no" if "score=0.35" in request.prompt else "yes"

    server = make_server(responder=label_responder(by_score), scorer=text_scorer)
    config = write_config(tmp_path, server, BAND, n_queries=8)
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == 0
    console = capsys.readouterr()
    health = _said_everywhere(out, console.out + console.err)
    assert health["degenerate"] is False and health["sources"] == {"reranker": 16, "llm": 24}
    assert health["findings"][:2] == [
        "Labels: 16 of 40 (40%) from the reranker's score, 24 (60%) from the LLM judge on the "
        "band.",
        "On the band the LLM's labels follow the reranker's score at AUC 1.00 over 24 passages "
        "(16 called relevant; 0.5 is no relation to the score).",
    ]
    assert health["caveats"] == []  # an LLM other than the embedded one: nothing recited
    assert "judge health: Labels: 16 of 40 (40%)" in console.out


def test_a_reranker_as_the_judge_never_mentions_an_llm(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from judge.cli.main import main
    from tests.test_cascade import text_scorer
    from tests.test_score_judge import _config

    server = make_server(scorer=text_scorer)
    judge = {"provider": "rerank", "model": "rerank-test"}
    config = _config(tmp_path, judge, f'[provider]\nbase_url = "{server.url}"\n')
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == 0
    console = capsys.readouterr()
    health = _said_everywhere(out, console.out + console.err)
    assert health["degenerate"] is False and health["sources"] == {"reranker": 15, "llm": 0}
    assert health["findings"][0] == (
        "15 of 15 labels came from the reranker's score; no LLM was asked."
    )
    assert not any("LLM judge" in s for s in health["findings"] + health["notes"])
    assert "JUDGE UNRELIABLE" not in (out / "report.md").read_text(encoding="utf-8")


def test_a_summary_whose_health_predates_the_measured_sentences_still_loads(
    tmp_path: Path,
) -> None:
    config = load_config(None, {"metrics.names": ["ap"]})
    data = build_summary(config, all_yes(), n_boot=20).model_dump(mode="json")
    for field in ("findings", "caveats", "sources", "human", "band", "language"):
        del data["health"][field]
    (tmp_path / "older.json").write_text(json.dumps(data), encoding="utf-8")
    health = load_summary(tmp_path / "older.json").health
    assert health.known and health.degenerate and health.findings == () and health.sources == {}
    assert health.said() == health.problems + health.notes


def test_judgements_of_repeats_are_not_counted_as_passages() -> None:
    """Three repeats of 160 labelled passages were said as "480 human-labelled passages"."""
    rows = with_labels(balanced(), lambda g: 1 - g)
    repeated = [jq.model_copy(update={"repeat": r}) for r in range(3) for jq in rows]
    health = judge_health(repeated, BINARY)
    assert health.human is not None and health.human.passages == 160
    assert health.problems[0].startswith(
        "The judge disagrees with the human labels: on 480 judgements of 160 human-labelled "
        "passages (240 relevant), relevance kappa -1.00"
    )
