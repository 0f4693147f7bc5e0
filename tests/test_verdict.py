"""The verdict first: which engine is better on the primary metric, said before anything else
in the console, report.md, report.html, summary.json and a GitHub step summary."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from judge.cli.main import main
from tests.servers import ScriptedServer
from tests.test_runner import write_config
from tests.wire import keyword_responder


def test_the_verdict_sentence_comes_first_in_console_report_summary_and_step_summary(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    make_server: Callable[..., ScriptedServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Engines of known quality: the good one ranks its answering passage ("pale") first, the
    others last. The verdict names the better engine on ndcg@10 first everywhere, each other
    engine against the best one, then a trust line."""
    server = make_server(responder=keyword_responder({"pale": "yes"}, "no"))
    rows = []
    for q in range(12):
        for engine, first in (("good", "pale skin"), ("bad", "dog food"), ("twin", "dog food")):
            passages = [first, "nothing here", "pale again" if engine != "good" else "car parts"]
            rows.append(
                {
                    "query_id": f"q{q}",
                    "query": f"question {q}",
                    "engine": engine,
                    "passages": [
                        {"id": f"{engine}{q}-{i}", "text": t} for i, t in enumerate(passages)
                    ],
                }
            )
    dataset = tmp_path / "d.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    config = write_config(
        tmp_path / "c.toml", server, tmp_path / "cache.sqlite", {"dataset": {"path": str(dataset)}}
    )
    with config.open("a", encoding="utf-8") as fh:
        fh.write('[metrics]\nnames = ["ap", "ndcg@10"]\n')
    step = tmp_path / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    out = tmp_path / "out"
    junit = tmp_path / "ci" / "judge.xml"
    argv = ["run", str(config), "--out", str(out), "--no-charts", "--junit", str(junit)]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    verdict = summary["verdict"]
    assert verdict[0].startswith("good beats bad on ndcg@10: +")
    assert (
        "p = 0.001 adjusted over 3 pairs of engines, better on 12, tied 0, worse 0 of 12"
        in verdict[0]
    )
    # Three engines: each is compared with the best on the primary metric (twin and bad tie
    # with each other; each falls short of good on every query).
    assert verdict[1].startswith("good beats twin on ndcg@10: +")
    assert "better on 12, tied 0, worse 0 of 12 queries" in verdict[1]
    assert verdict[-1].startswith("Trust: judge health ")
    assert "0 unparsed and 0 error of 108 verdicts" in verdict[-1]
    stdout = capsys.readouterr().out.strip().splitlines()
    # The console says it first, right under the line that says what was judged.
    first = next(i for i, line in enumerate(stdout) if line.startswith("judged "))
    assert stdout[first + 1 : first + 1 + len(verdict)] == verdict
    report = (out / "report.md").read_text(encoding="utf-8").splitlines()
    assert report[2].startswith("**good beats bad on ndcg@10: +")
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.index("good beats bad on ndcg@10") < page.index("<ul>")
    text = step.read_text(encoding="utf-8")
    assert text.startswith("### PASSED · judge") and "- good beats bad on ndcg@10" in text
    assert "| engine | ap | ndcg@10 |" in text
    # JUnit: the run, its threshold check, each verdict as a case; nothing failed.
    suite = ET.parse(junit).getroot()
    cases = {(c.get("classname"), c.get("name")) for c in suite.iter("testcase")}
    assert ("judge.run", "run complete") in cases
    assert ("judge.thresholds", "unparsed_rate") in cases
    assert ("judge.verdict", "good beats bad on ndcg@10") in cases
    assert (suite.get("tests"), suite.get("failures")) == (str(len(cases)), "0")
    # judge compare on the run leads with the run's own sentences.
    assert main(["compare", str(out)]) == 0
    lead = capsys.readouterr().out.splitlines()
    assert lead[: len(verdict) - 1] == verdict[:-1]


def test_junit_marks_breached_and_unevaluated_checks_and_an_incomplete_run(
    tmp_path: Path, make_server: Callable[..., ScriptedServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = make_server(responder=keyword_responder({}, "no"))
    config = write_config(
        tmp_path / "c.toml", server, tmp_path / "cache.sqlite", {"thresholds.min": {"ap": 0.5}}
    )
    junit = tmp_path / "judge.xml"
    out = tmp_path / "out"
    step = tmp_path / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    assert main(["run", str(config), "--out", str(out), "--junit", str(junit)]) == 1
    # The CI page's summary says why it failed, not only that it did.
    text = step.read_text(encoding="utf-8")
    assert text.startswith("### JUDGE UNRELIABLE · judge\n\n- **judge unreliable: ")
    assert "min ap" in text
    suite = ET.parse(junit).getroot()
    failed = {
        c.get("name"): c.find("failure")
        for c in suite.iter("testcase")
        if c.find("failure") is not None or c.find("skipped") is not None
    }
    # Every passage "no": AP is undefined for every query, so min ap cannot be evaluated; it
    # fails the run (exit 1), so it is a failure here too, saying why (it was "skipped", and
    # the suite said 0 failures of a failed run).
    assert failed and all(v is not None for v in failed.values()), failed
    assert all(n.startswith("min ap") for n in failed)
    assert all(
        (v.get("message") or "").startswith("not evaluated, counted as breached: ")
        for v in failed.values()
        if v is not None
    )
    assert suite.get("failures") == str(len(failed)) and suite.get("skipped") == "0"
    unwritable = tmp_path / "file"
    unwritable.write_text("x")
    argv = ["run", str(config), "--out", str(tmp_path / "o2"), "--cache", str(tmp_path / "new")]
    argv += ["--junit", str(unwritable / "j.xml")]  # a fresh cache: a run would call
    asked = len(server.requests)
    assert main(argv) == 2  # refused before anything is sent
    assert len(server.requests) == asked


def test_a_verdict_by_a_judge_found_unreliable_says_so_in_its_own_sentence(
    tmp_path: Path, make_server: Callable[..., ScriptedServer]
) -> None:
    """The sentence saying which engine is better stood unqualified above a JUDGE UNRELIABLE
    trust line: each now says by whom it was measured."""
    server = make_server(responder=keyword_responder({}, "no"))  # every passage "no"
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    out = tmp_path / "out"
    main(["run", str(config), "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["health"]["degenerate"]
    *said, trust = summary["verdict"]
    assert said and all(s.endswith("(by a judge found unreliable: see Trust)") for s in said)
    assert trust.startswith("Trust: ")


def test_a_winner_the_judge_said_yes_to_throughout_is_said_to_be_one_sided() -> None:
    """The judge answered 'yes' to every passage of one engine: that engine 'beats' the
    other, earned (every passage relevant) or bought (passages that tell the judge to).
    The verdict line and the trust line say both where they are read (only a note said it;
    then they had called an engine that good "not informative")."""
    from judge.config import load_config
    from judge.metrics.compute import metrics_for_queries
    from judge.report.finish import complete_summary
    from judge.schema import JudgedQuery, Passage, Query, Scale, Verdict

    rows = []
    for q in range(12):
        for engine, grades in (("zebra", [1, 1, 1]), ("good", [q % 2, 1 - q % 2, 0])):
            query = Query(
                query_id=f"q{q}",
                query=f"question {q}",
                engine=engine,
                passages=tuple(Passage(id=f"{engine}{q}-{i}", text="t") for i in range(3)),
            )
            verdicts = tuple(
                Verdict(
                    passage_id=p.id,
                    rank=i + 1,
                    status="ok",
                    label="yes" if g else "no",
                    grade=g,
                    relevant=bool(g),
                )
                for i, (p, g) in enumerate(zip(query.passages, grades, strict=True))
            )
            metrics = metrics_for_queries(["ndcg"], [(query, verdicts)], Scale.binary())[0]
            rows.append(
                JudgedQuery(
                    query=query, repeat=0, scale="binary", verdicts=verdicts, metrics=metrics
                )
            )
    summary, _, _ = complete_summary(load_config(None, {"metrics.names": ["ndcg"]}), rows, None)
    first, trust = summary.verdict[0], summary.verdict[-1]
    assert first.startswith("zebra beats good on ndcg") or first.startswith("good ")
    assert first.endswith(
        "(the judge gave nearly every passage of zebra one label: an engine that good, or "
        "verdicts its passages bought; see Trust)"
    )
    assert trust.startswith("Trust: judge health ok overall, but one-sided on zebra")


def test_the_run_says_first_what_judge_compare_says_first() -> None:
    """No difference on the primary metric, a significant one on another: the run's verdict
    and ``judge compare`` lead with the same lines (the run had stopped at the first)."""
    from judge.config import load_config
    from judge.report.compared import headline_lines
    from judge.report.finish import complete_summary
    from judge.schema import JudgedQuery, Passage, Query, Verdict

    rows = []
    for q in range(8):
        for engine, ap in (("a", 0.2), ("b", 0.4 + q / 100)):
            query = Query(
                query_id=f"q{q}",
                query=f"question {q}",
                engine=engine,
                passages=(Passage(id=f"{engine}{q}", text="t"),),
            )
            seen = Verdict(
                passage_id=f"{engine}{q}", rank=1, status="ok", label="yes", grade=1, relevant=True
            )
            rows.append(
                JudgedQuery(
                    query=query,
                    repeat=0,
                    scale="binary",
                    verdicts=(seen,),
                    metrics={"ndcg": 0.5, "ap": ap},
                )
            )
    config = load_config(None, {"metrics.names": ["ndcg", "ap"], "metrics.primary": "ndcg"})
    summary, comparison, _ = complete_summary(config, rows, None)
    assert comparison is not None
    lead = headline_lines(comparison, "ndcg")
    assert lead[-1].startswith("largest significant change, p = ")
    assert "Holm-adjusted over 1 metric: b beats a on ap" in lead[-1]  # the rest tie throughout
    assert list(summary.verdict[:-1]) == lead  # then the trust line


@pytest.mark.parametrize(("b_value", "winner"), [(0.0, "b beats a"), (0.6, "a beats b")])
def test_on_a_lower_is_better_metric_the_engine_with_less_wins(b_value: float, winner: str) -> None:
    """near_dup rises as an engine gets worse: the sentence names the engine with less of it,
    and its counts agree with the paired table's (they had named the other engine, 'better on
    0 ... worse 7 of 7')."""
    from judge.analysis.compare import paired_diff
    from judge.report.compared import verdict_line

    a = {f"q{q}": 0.3 + q / 100 for q in range(8)}
    b = {q: b_value for q in a}
    d = paired_diff("near_dup@5", ("b", b), ("a", a))
    line = verdict_line(d)
    assert line.startswith(f"{winner} on near_dup@5 (lower is better): ")
    assert "better on 8, tied 0, worse 0 of 8 queries" in line
