"""Redundancy and authority end to end: ``judge run`` over a dataset with urls against a
loopback judge, the summary and both reports, ``--dry-run``, thresholds, history and
``judge compare`` reading near_dup / low_quality as lower-is-better.

datasets/sources.jsonl: six queries (three Chinese, three English), two engines. "clean"
returns four distinct sources (government, academic, reference ...); "farm" reposts of one
text on content-farm hosts, spam hosts and one good source. Per query, by hand (top 4):

    query   engine  near_dup  sites  authority  low_quality
    s1      farm    2/4       3      0.200      3/4
    s2      farm    2/4       3      0.225      3/4
    s3      farm    2/4       3      0.225      3/4
    s4      farm    1/4       3      0.225      3/4    (f4 rewrites numbers: Jaccard 0.32)
    s5      farm    1/4       4      0.425      2/4
    s6      farm    1/4       3      0.450      2/4
    s1..s6  clean   0         4 (s3: 3, one passage without url)   0.725..0.825   0
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from judge.cli.main import main
from judge.data.datasets import read_queries
from judge.data.trec import read_trec_run
from judge.judging.judge import Judge
from judge.schema import MetricPolicy, Passage, Query
from judge.tiers import AuthorityTiers
from tests.servers import ScriptedServer

SOURCES = Path(__file__).resolve().parent.parent / "datasets" / "sources.jsonl"
NAMES = ["ndcg@4", "near_dup@4", "sites@4", "authority@4", "low_quality@4"]
TIERS = """[metrics.authority]
reference = ["wikipedia.org", "baike.baidu.com"]
low_quality = ["*.content-farm.example", 're:seo-spam\\d*\\.example']
"""
# Means over the six queries, from the table in the module doc.
FARM = {"near_dup@4": 0.375, "sites@4": 19 / 6, "authority@4": 1.75 / 6, "low_quality@4": 4 / 6}
CLEAN = {"near_dup@4": 0.0, "sites@4": 23 / 6, "authority@4": 4.625 / 6, "low_quality@4": 0.0}


def _config(
    tmp_path: Path, server: ScriptedServer, names: list[str] = NAMES, extra: str = ""
) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(
        '[judge]\nprovider = "local"\nmodel = "judge-test"\n'
        f'[provider]\nbase_url = "{server.openai_base_url}"\n'
        f'[run]\ncache = "{tmp_path / "cache.sqlite"}"\nhistory = "{tmp_path / "history.sqlite"}"\n'
        "timeout_s = 5.0\nbackoff_base_s = 0.01\nconcurrency = 4\ncharts = false\n"
        f"[metrics]\nnames = {json.dumps(names)}\n{TIERS}{extra}",
        encoding="utf-8",
    )
    return path


def _summary(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    return data


def _means(summary: dict[str, Any], engine: str) -> dict[str, float]:
    metrics = summary["engines"][engine]["metrics"]
    return {name: metrics[name]["mean"] for name in FARM}


def _planned_calls(capsys: pytest.CaptureFixture[str], argv: list[str]) -> int:
    assert main([*argv, "--dry-run"]) == 0
    found = re.search(r"dry run: \d+ query-repeats to judge, (\d+) calls", capsys.readouterr().out)
    assert found, "the dry run printed no call count"
    return int(found.group(1))


def test_a_run_reports_redundancy_and_authority_at_no_extra_cost(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "plain").mkdir()
    plain = _config(tmp_path / "plain", server, ["ndcg@4"])
    config = _config(tmp_path, server)
    out = tmp_path / "out"
    argv = ["run", str(config), str(SOURCES), "--out", str(out)]
    calls = _planned_calls(capsys, argv)
    plain_argv = ["run", str(plain), str(SOURCES), "--out", str(out)]
    # 48 passages, 41 distinct texts (the farm reposts a page under new ids: asked once each);
    # the four metrics cost nothing.
    assert calls == _planned_calls(capsys, plain_argv) == 41
    assert server.requests == []

    assert main(argv) == 0
    assert len(server.requests) == calls
    summary = _summary(out)
    assert _means(summary, "farm") == pytest.approx(FARM)
    assert _means(summary, "clean") == pytest.approx(CLEAN)
    assert summary["policy"]["authority"]["low_quality"] == [
        "*.content-farm.example",
        "re:seo-spam\\d*\\.example",
    ]
    row = next(r for r in summary["queries"] if (r["query_id"], r["engine"]) == ("s1", "farm"))
    assert row["metrics"]["near_dup@4"] == 0.5 and row["metrics"]["low_quality@4"] == 0.75

    md = (out / "report.md").read_text(encoding="utf-8")
    section = md.split("## Authority and redundancy", 1)[1].split("\n## ", 1)[0]
    assert "near_dup@4 (lower is better)" in section
    sites = [line.split(" | ") for line in section.splitlines() if line.startswith("| ")]
    by_site = {row[0].strip("| "): row[1:] for row in sites}
    assert by_site["content-farm.example"][1:] == ["low_quality", "0.0000", "0", "10 |"]
    assert by_site["content-farm.example"][0].endswith("(+6 more)")  # nine hosts, three shown
    assert by_site["baidu.com"] == ["baike.baidu.com", "reference", "0.7000", "2", "0 |"]
    assert by_site["gov.cn"] == ["www.gov.cn", "government", "0.9000", "1", "0 |"]
    assert by_site["nhs.uk"][1:3] == ["unknown", "0.5000"]  # not a TLD class: no default tier
    assert "Passages without a url (unknown sources): clean 1 of 24." in section
    # The paired comparison in the same report: farm loses every query on low_quality@4.
    assert re.search(r"\| low_quality@4 \| farm \| clean \| 6 \| \+0\.6667 .*\| 0 / 0 / 6 \|", md)
    page = (out / "report.html").read_text(encoding="utf-8")
    assert '<section id="sources"><h2>Authority and redundancy</h2>' in page
    # The paired table marks a significant rise of a lower-is-better metric as worse.
    for metric in ("low_quality@4", "near_dup@4", "authority@4"):
        assert f'<tr class="failed"><td class="">{metric}</td><td class="">farm</td>' in page


def test_the_readers_keep_urls_and_titles(tmp_path: Path) -> None:
    rows = read_queries(SOURCES).queries
    first = rows[0].passages[0]
    assert (first.url, first.title) == ("https://vet.cau.edu.cn/kb/anemia", "犬贫血的临床表现")
    assert sum(p.url is None for q in rows for p in q.passages) == 1
    store = tmp_path / "store.jsonl"
    store.write_text(
        json.dumps({"id": "d1", "text": "t", "title": "T", "url": "https://www.gov.cn/x"}) + "\n",
        encoding="utf-8",
    )
    (tmp_path / "run.txt").write_text("q1 Q0 d1 1 2.5 bm25\n", encoding="utf-8")
    report = read_trec_run(tmp_path / "run.txt", store, {"q1": "query"})
    (passage,) = report.queries[0].passages
    assert (passage.url, passage.title) == ("https://www.gov.cn/x", "T")


def test_without_these_metrics_the_report_has_no_such_section(
    server: ScriptedServer, tmp_path: Path
) -> None:
    config = _config(tmp_path, server, ["ndcg@4"])
    assert main(["run", str(config), str(SOURCES), "--out", str(tmp_path / "out")]) == 0
    assert "Authority and redundancy" not in (tmp_path / "out" / "report.md").read_text("utf-8")


def test_compare_marks_more_low_quality_sources_and_duplicates_as_worse(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["run", str(_config(tmp_path, server)), str(SOURCES), "--out", str(out)]) == 0
    capsys.readouterr()
    metrics = [arg for name in FARM for arg in ("--metric", name)]
    compare = ["compare", str(out), *metrics, "--baseline", "clean"]
    assert main([*compare, "--fail-if-worse", "low_quality@4"]) == 1
    text = capsys.readouterr()
    assert "farm is significantly worse than clean on low_quality@4: +0.6667" in text.err
    assert "p = 0.0312 over 6 paired queries" in text.err  # 2 / 2^6, exact
    # Higher near_dup and low_quality lose every query; so does lower authority.
    for metric, diff in (("low_quality@4", "+0.6667"), ("near_dup@4", "+0.3750")):
        assert re.search(rf"{metric} +farm .* clean +6 +\{diff} .* 0 / 0 / 6", text.out)
    assert re.search(r"authority@4 +farm .* clean +6 +-0\.4792 .* 0 / 0 / 6", text.out)
    assert main([*compare, "--fail-if-worse", "near_dup@4"]) == 1
    assert main([*compare, "--fail-if-worse", "authority@4"]) == 1  # higher is better here
    # The other way round, clean has fewer low-quality sources: not worse.
    capsys.readouterr()
    reverse = ["compare", str(out), *metrics, "--baseline", "farm"]
    assert main([*reverse, "--fail-if-worse", "low_quality@4"]) == 0
    text = capsys.readouterr()
    assert "significantly worse" not in text.err
    assert re.search(r"low_quality@4 +clean .* farm +6 +-0\.6667 .* 6 / 0 / 0", text.out)


def _engine_rows(engine: str, renamed: str, path: Path) -> Path:
    rows = [json.loads(line) for line in SOURCES.read_text(encoding="utf-8").splitlines()]
    picked = [{**row, "engine": renamed} for row in rows if row["engine"] == engine]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in picked), "utf-8")
    return path


def test_thresholds_and_history_read_a_rise_in_duplicates_as_a_regression(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    baseline = tmp_path / "baseline.json"
    extra = (
        f'[thresholds]\nbaseline = "{baseline}"\n'
        'max = { "low_quality@4" = 0.5 }\nmin = { "sites@4" = 3.5 }\n'
        'max_drop = { "near_dup@4" = 0.1, "authority@4" = 0.1 }\n'
    )
    config = _config(tmp_path, server, extra=extra)
    night1, night2 = tmp_path / "night1", tmp_path / "night2"
    clean = _engine_rows("clean", "web", tmp_path / "clean.jsonl")
    argv = ["run", str(config), str(clean), "--out", str(night1), "--first-night"]
    assert main(argv) == 0
    shutil.copy(night1 / "summary.json", baseline)

    farm = _engine_rows("farm", "web", tmp_path / "farm.jsonl")
    assert main(["run", str(config), str(farm), "--out", str(night2)]) == 1
    checks = {c["check"]: c for c in _summary(night2)["thresholds"]["checks"]}
    assert checks["rise near_dup@4"]["value"] == pytest.approx(0.375)
    assert checks["drop authority@4"]["value"] == pytest.approx(4.625 / 6 - 1.75 / 6)
    assert checks["max low_quality@4"]["value"] == pytest.approx(4 / 6)
    assert checks["min sites@4"]["value"] == pytest.approx(19 / 6)
    assert not any(c["ok"] for name, c in checks.items() if name != "unparsed_rate")
    md = (night2 / "report.md").read_text(encoding="utf-8")
    assert "rise near_dup@4 (web): rose 0.3750 (from 0.0000 to 0.3750); at most 0.1000" in md
    assert "max low_quality@4 (web): 0.6667; at most 0.5000 allowed" in md
    assert "web near_dup@4 rose 0.3750" in md  # the history's regression flag
    assert "web authority@4 fell 0.4792" in md
    capsys.readouterr()
    assert main(["history", "--config", str(config)]) == 0
    rows = capsys.readouterr().out.splitlines()
    near_dup = next(line for line in rows if line.startswith("web") and "near_dup@4" in line)
    assert near_dup.endswith("+0.3750")  # it rose; "-0.3750" had read as a fall
    authority = next(line for line in rows if line.startswith("web") and "authority@4" in line)
    assert authority.endswith("-0.4792")


def test_the_python_api_carries_the_tier_list(server: ScriptedServer) -> None:
    policy = MetricPolicy(
        names=("near_dup@3", "authority@3", "low_quality@3"),
        authority=AuthorityTiers(low_quality=("*.farm.example",)),
    )
    passages = [
        Passage(id="a", text="the same words here", url="https://www.cdc.gov/x"),
        Passage(id="b", text="The same words, here!", url="https://a.farm.example/x"),
        Passage(id="c", text="something else", url=None),
    ]
    with Judge("local", "m", base_url=server.openai_base_url, metrics=policy) as judge:
        jq = judge.judge(Query(query_id="q", query="words", passages=tuple(passages)))
    assert jq.metrics == pytest.approx(
        {"near_dup@3": 1 / 3, "authority@3": (0.9 + 0.0 + 0.5) / 3, "low_quality@3": 1 / 3}
    )
    assert len(server.requests) == 3  # one verdict per passage, nothing for these metrics


def test_a_misspelt_metric_stops_the_run_before_any_call(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, server, ["ndcg@4", "near_dupe@4"])
    assert main(["run", str(config), str(SOURCES), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{config}: metrics.names: unknown metric 'near_dupe@4'" in err
    assert "near_dup, sites, authority, low_quality" in err  # the valid names are listed
    assert server.requests == []
