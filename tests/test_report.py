"""report.md and report.html: what a reader sees, escaping, self-containment, and the page in a
real headless browser (Debian's chromium, installed by the session fixture when missing)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image

from judge.config import load_config
from judge.metrics.compute import DEFAULT_METRICS, metrics_for_queries
from judge.report.document import write_reports
from judge.report.finish import finish_run
from judge.report.history import history_rows_for_report, list_runs, record_run
from judge.report.summary import EngineSummary, build_summary, load_summary
from judge.schema import JudgedQuery, Passage
from tests.test_compare import GRADED, run_cli, sample_results, verdict, write_run

EVIL = '<script>alert("pwned")</script></td></table><img src=x onerror=alert(1)>'
N_CHARTS = 5  # bm25-vs-dense scatter, distribution, stability, labels, history


def hostile(results: list[JudgedQuery]) -> list[JudgedQuery]:
    """q1/bm25 gains a passage carrying markup (graded 0, its reason quoting the markup), and
    q2/dense has one unparsed and one error verdict in repeat 1."""
    out = []
    for jq in results:
        if jq.key[:2] == ("q1", "bm25"):
            passages = (*jq.query.passages, Passage(id="evil", text=EVIL))
            rank = len(passages)
            bad = verdict("evil", rank, 0).model_copy(update={"reason": f"it says {EVIL}"})
            verdicts = (*jq.verdicts, bad)
            jq = jq.model_copy(update={"query": jq.query.model_copy(update={"passages": passages})})
        elif jq.key == ("q2", "dense", 1):
            verdicts = (
                verdict(jq.verdicts[0].passage_id, 1, "unparsed"),
                verdict(jq.verdicts[1].passage_id, 2, "error"),
                *jq.verdicts[2:],
            )
        else:
            out.append(jq)
            continue
        row = metrics_for_queries(DEFAULT_METRICS, [(jq.query, verdicts)], GRADED)[0]
        out.append(jq.model_copy(update={"verdicts": verdicts, "metrics": row}))
    return out


def shifted(engine: EngineSummary, by: float) -> EngineSummary:
    """The engine's metric means moved by ``by`` (an undefined mean taken as 0)."""
    metrics = {
        m: v.model_copy(update={"mean": (v.mean or 0.0) + by}) for m, v in engine.metrics.items()
    }
    return engine.model_copy(update={"metrics": metrics})


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """report.md and report.html of a 2-engine, 3-repeat run with 4 nights of history."""
    out = tmp_path_factory.mktemp("run")
    config = load_config(None, {"judge.scale": "graded"})
    results = hostile(sample_results(repeats=3))
    summary = build_summary(config, results, n_boot=200)
    history = out / "history.sqlite"
    for night, shift in enumerate([0.0, 0.01, -0.2, 0.0]):
        past = summary.model_copy(
            update={
                "created": f"2026-01-0{night + 1}T02:00:00+00:00",
                "engines": {e: shifted(d, shift) for e, d in summary.engines.items()},
                "dataset": f"/data/nightly/sample-0{night + 1}.jsonl",
            }
        )
        record_run(history, past, str(out))
    rows = history_rows_for_report(
        history, list(summary.engines), summary.metric_names, max_drop={"ndcg@5": 0.05}
    )
    md, page = write_reports(out, summary, results, history=rows)
    return md, page


def test_both_reports_are_written_and_say_what_was_judged(report: tuple[Path, Path]) -> None:
    md, page = report
    assert (md.name, page.name) == ("report.md", "report.html")
    text = md.read_text(encoding="utf-8")
    lines = text.splitlines()
    # The first lines answer at a glance: status, its reasons, then what was run.
    assert lines[0] == "# PASSED · judge report · default config"
    assert lines[2] == "- all 1 threshold check(s) passed"
    assert "judge openai gpt-4o-mini (graded, pointwise)" in lines[4]
    assert "9 query ids × 2 engine(s) × 3 repeat(s)" in lines[4]
    assert "1 unparsed, 1 error" in lines[4]
    assert lines[6] == "## Metrics (mean, 95% CI)"  # the headline comes right after
    assert re.search(r"\| ndcg@5 \| 0\.\d{4} \[0\.\d{4}, 0\.\d{4}\] \| 0\.\d{4} \[", text)
    assert "Unpaired: each engine's mean over its own queries (bm25 9, dense 5)" in text
    assert "Undefined for every query: rerank_max." in text  # no P(relevant): said once
    assert "## Engines compared, paired (baseline bm25)" in text and "pooled_ndcg@5" in text
    assert (
        "## History (last 4 runs)" in text and "**1 run(s) flagged as regressions: each run" in text
    )
    assert "| run | created | dataset |" in text and "| sample-03.jsonl |" in text
    assert "## Queries (14; lowest relevancy_mean first)" in text
    # A judge that uses the whole scale: its health is shown, with no warning.
    assert "## Judge health" in text and "Not degenerate." in text
    assert "JUDGE UNRELIABLE" not in text


class _Tags(HTMLParser):
    """Every start tag of a page with its attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def test_html_is_one_self_contained_page_without_scripts(report: tuple[Path, Path]) -> None:
    page = report[1].read_text(encoding="utf-8")
    parser = _Tags()
    parser.feed(page)
    names = {tag for tag, _ in parser.tags}
    assert names.isdisjoint({"script", "link", "iframe", "object", "embed", "img", "base"})
    assert {"svg", "table", "style"} <= names
    loads = [(t, a) for t, a in parser.tags for k in a if k in {"src", "href", "srcset", "action"}]
    # Only links within the page, each to an element that is there.
    targets = [a["href"] for t, a in loads if t == "a" and set(a) == {"href"}]
    assert len(targets) == len(loads) > 0
    ids = {a.get("id") for _, a in parser.tags}
    assert all(t is not None and t.startswith("#") and t[1:] in ids for t in targets)
    style = page[page.index("<style>") : page.index("</style>")]
    assert "url(" not in style and "@import" not in style
    assert "http:" not in page and "https:" not in page  # no URL at all, not even a namespace
    assert "Content-Security-Policy" in page and "default-src 'none'" in page


def test_untrusted_passage_text_shows_as_text(report: tuple[Path, Path]) -> None:
    md, page = (p.read_text(encoding="utf-8") for p in report)
    assert "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;" in page
    assert "<img" not in page and "onerror=alert" not in page.replace("onerror=alert(1)&gt;", "")
    assert "it says &lt;script&gt;" in page  # the judge's reason, escaped too
    assert "<script>" not in md and "&lt;script&gt;" in md


def test_every_chart_is_inline_svg(report: tuple[Path, Path]) -> None:
    page = report[1].read_text(encoding="utf-8")
    labels = re.findall(r'<svg role="img" aria-label="([^"]+)"', page)
    assert labels == [
        "per-query dense vs bm25",
        "metric distribution per engine",
        "stability across repeats",
        "verdict labels",
        "trend over previous runs",
    ]
    labels_chart = page[page.index('aria-label="verdict labels"') :]
    labels_chart = labels_chart[: labels_chart.index("</svg>")]
    for legend in ("unrelated", "answers", "unparsed", "error"):
        assert f">{legend}<" in labels_chart


def _section(page: str, ident: str) -> str:
    body = page[page.index(f'<section id="{ident}">') :]
    return body[: body.index("</section>")]


def test_every_query_is_listed_and_links_to_its_passages(report: tuple[Path, Path]) -> None:
    page = report[1].read_text(encoding="utf-8")
    queries = _section(page, "queries")
    default = queries[: queries.index("<details>")]
    assert default.count("<tr") == 1 + 14  # the header and every (query, engine)
    # Lowest first on the first metric: q9/bm25 (its passages are mostly unrelated).
    first = re.search(r'<a href="#(q-\d+)">(\w+)</a></td><td class="">(\w+)<', default)
    assert first is not None and first.group(2, 3) == ("q9", "bm25")
    # Two more orders of the same rows, folded, without any script.
    assert queries.count("<details>") == 2 and "the same queries by query id" in queries
    passages = _section(page, "passages")
    anchor = passages[passages.index(f'id="{first.group(1)}"') :]
    assert anchor.startswith(f'id="{first.group(1)}" class="h3">q9 / bm25</h3>')
    # Each passage: the judge's label and reason, the human label, disagreements marked.
    assert "<th>judge</th><th>human</th><th>reason</th>" in passages
    assert '<td class="human">partial (2)</td>' in passages
    assert "is unrelated</td>" in passages
    q2 = passages[passages.index(">q2 / dense</h3>") :]
    q2 = q2[: q2.index("</table>")]
    assert '<tr class="disagree">' in q2 and " ≠</td>" in q2
    failed = _section(page, "failed")
    assert "raw answer: maybe?" in failed and failed.count('<tr class="failed">') == 1


def test_summary_rows_match_the_query_table(report: tuple[Path, Path]) -> None:
    config = load_config(None, {"judge.scale": "graded"})
    results = hostile(sample_results(repeats=3))
    summary = build_summary(config, results, n_boot=50)
    rows = {(r.query_id, r.engine): r for r in summary.queries}
    assert len(rows) == 14
    q2 = rows[("q2", "dense")]
    assert (q2.repeats, q2.failed, q2.labelled, q2.disagreements) == (3, 2, 5, 1)
    assert q2.metrics["ndcg@5"] == pytest.approx(0.9958, abs=1e-4)
    assert rows[("q9", "bm25")].metrics["ap"] is None  # nothing relevant retrieved: undefined
    md = report[0].read_text(encoding="utf-8")
    assert "| q2 | dense | how long to boil an egg for a soft yolk | 0.4667 |" in md
    # A mean over fewer than the engine's queries says over how many, beside it.
    ap = summary.engines["bm25"].metrics["ap"]
    assert ap.n_defined < summary.engines["bm25"].n_queries
    ap_row = next(line for line in md.splitlines() if line.startswith("| ap |"))
    assert f"({ap.n_defined} of {summary.engines['bm25'].n_queries} queries)" in ap_row


def test_one_engine_one_repeat_gets_only_sections_with_something_to_say(tmp_path: Path) -> None:
    config = load_config(None, {"judge.scale": "graded"})
    results = [jq for jq in sample_results(repeats=1) if jq.query.engine == "dense"]
    summary = build_summary(config, results, n_boot=50)
    _, page = write_reports(tmp_path, summary, results)
    html = page.read_text(encoding="utf-8")
    for absent in ("compare", "history", "stability", "failed"):
        assert f'<section id="{absent}">' not in html, absent
    assert "label flip rate" not in html
    # The distribution and labels charts; rerank_max (no P(relevant)) gets no panel, and the
    # metrics every query scores the same are named instead of drawn.
    assert html.count("<svg") == 2
    dist = _section(html, "distribution")
    assert ">rerank_max<" not in dist and ">ndcg<" in dist
    assert "not drawn, every query the same: relevancy_max 1.0000" in dist


# --- the page in a real browser ---------------------------------------------------------

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--enable-logging=stderr",
    "--v=0",
]


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium; installed with apt-get when missing and we are root, else skipped."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("chromium is not installed and installing it needs root (apt-get)")
    if shutil.which("apt-get") is None:
        pytest.skip("chromium is not installed and this machine has no apt-get to install it")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
        try:
            subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=1200)
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"'{' '.join(cmd)}' failed, cannot install chromium: {exc.stderr[-500:]}")
        except subprocess.TimeoutExpired:
            pytest.skip(f"'{' '.join(cmd)}' took over 20 minutes; cannot install chromium")
    found = shutil.which("chromium")
    if found is None:
        pytest.skip("apt-get installed chromium but no 'chromium' is on PATH")
    return found


def browse(chromium: str, page: Path, tmp: Path, *action: str) -> subprocess.CompletedProcess[str]:
    profile = tmp / f"profile-{len(list(tmp.iterdir()))}"
    return subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *action, page.as_uri()],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def console_messages(stderr: str) -> list[str]:
    """What the page logged to the console (errors, CSP refusals, uncaught exceptions)."""
    return [
        line
        for line in stderr.splitlines()
        if "CONSOLE" in line or "Uncaught" in line or "Refused to" in line
    ]


def test_console_capture_sees_a_page_error(chromium: str, tmp_path: Path) -> None:
    """The probe the real page is checked with does catch a console error."""
    probe = tmp_path / "probe.html"
    probe.write_text("<!DOCTYPE html><script>console.error('probe-error')</script>")
    done = browse(chromium, probe, tmp_path, "--dump-dom")
    assert any("probe-error" in line for line in console_messages(done.stderr)), done.stderr


def test_the_report_renders_in_chromium(
    chromium: str, report: tuple[Path, Path], tmp_path: Path
) -> None:
    page = report[1]
    dom = browse(chromium, page, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert console_messages(dom.stderr) == []
    assert dom.stdout.count("<svg") == N_CHARTS
    assert "<title>PASSED · judge report" in dom.stdout and "&lt;script&gt;alert" in dom.stdout
    shot = tmp_path / "report.png"
    done = browse(chromium, page, tmp_path, f"--screenshot={shot}", "--window-size=1280,4000")
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    assert console_messages(done.stderr) == []
    pixels = image.imread(str(shot))[..., :3]
    assert pixels.shape[:2] == (4000, 1280)
    rgb = np.round(pixels * 255).astype(np.uint32)
    colours = np.unique((rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2])
    assert colours.size > 200  # charts, not a blank or flat page
    # Every 500-pixel band holds something besides the page background.
    for top in range(0, 4000, 500):
        band = pixels[top : top + 500]
        assert (np.abs(band - band[0, 0]).sum(axis=2) > 0.1).mean() > 0.01, top


def test_cli_report_rebuilds_a_run_directory_with_its_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_run(tmp_path / "run", sample_results(repeats=2))
    history = tmp_path / "history.sqlite"
    config = tmp_path / "nightly.toml"
    config.write_text(
        f'[judge]\nscale = "graded"\n[run]\nhistory = "{history}"\n'
        '[thresholds]\nmax_drop = {"ndcg@5" = 0.01}\n'
    )
    built = build_summary(load_config(config), sample_results(repeats=2), n_boot=50)
    bm25 = built.engines["bm25"]
    ndcg = bm25.metrics["ndcg@5"].model_copy(update={"mean": 0.8})
    for shift in (0.0, -0.1):
        night = {"bm25": shifted(bm25.model_copy(update={"metrics": {"ndcg@5": ndcg}}), shift)}
        record_run(history, built.model_copy(update={"engines": night}), str(run))
    assert run_cli(["report", str(run), "--config", str(config), "--worst", "2"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(run / "report.md"), str(run / "report.html")]
    assert (run / "summary.json").exists()  # built from the results, since there was none
    md = (run / "report.md").read_text(encoding="utf-8")
    lowest = next(line for line in md.splitlines() if line.startswith("Lowest "))
    assert lowest.count(" · ") == 1  # --worst 2: two queries named under the metrics
    assert "bm25 ndcg@5 fell 0.1000" in md


def test_cli_report_will_not_pass_a_run_that_never_finished_nor_keep_a_stale_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run directory whose run was killed before its summary (run.json, results, no
    summary) is incomplete, exit 3: its report had said PASSED, and `judge baseline set`
    then took it. A summary made from other results than the directory's is made again."""
    results = sample_results(repeats=2)
    killed = write_run(tmp_path / "killed", results)
    (killed / "run.json").write_text("{}", encoding="utf-8")
    from judge.cli.main import main

    assert main(["report", str(killed), "--config", str(_graded(tmp_path))]) == 3
    err = capsys.readouterr().err
    assert "a run into it stopped before it wrote a summary" in err and "Traceback" not in err
    assert not (killed / "summary.json").exists() and not (killed / "report.md").exists()
    done = write_run(tmp_path / "done", results)
    config = load_config(None, {"judge.scale": "graded", "run.history": str(tmp_path / "h")})
    before = finish_run(config, done, None)
    lines = (done / "verdicts.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (done / "verdicts.jsonl").write_text("".join(lines[:-4]), encoding="utf-8")
    assert main(["report", str(done), "--config", str(_graded(tmp_path))]) == 0
    after = load_summary(done / "summary.json")
    assert after.counts.judged_units == before.counts.judged_units - 4
    # A directory judge run made whose results changed after its summary (a later run into
    # it killed): not made again from the default config as PASSED, but incomplete.
    (done / "run.json").write_text("{}", encoding="utf-8")
    finish_run(config, done, None)
    with (done / "verdicts.jsonl").open("a", encoding="utf-8") as fh:
        fh.write(lines[-1])
    assert main(["report", str(done)]) == 3
    assert "a run into it stopped after its summary" in capsys.readouterr().err


def _graded(tmp_path: Path) -> Path:
    config = tmp_path / "graded.toml"
    config.write_text(f'[judge]\nscale = "graded"\n[run]\nhistory = "{tmp_path / "g.h"}"\n')
    return config


def test_finish_run_from_python_writes_everything_a_run_leaves(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", sample_results(repeats=2))
    history = tmp_path / "history.sqlite"
    config = load_config(None, {"judge.scale": "graded", "run.history": str(history)})
    summary = finish_run(config, run, None)
    for name in ("summary.json", "report.md", "report.html", "qrels.txt"):
        assert (run / name).stat().st_size > 0, name
    assert load_summary(run / "summary.json") == summary
    assert summary.run is None and set(summary.engines) == {"bm25", "dense"}
    assert summary.counts.repeats == 2
    assert summary.policy == config.metrics.model_copy(update={"primary": "ndcg"})
    assert [r.out_dir for r in list_runs(history)] == [str(run)]
    qrels = (run / "qrels.txt").read_text(encoding="utf-8").splitlines()
    assert qrels and all(len(line.split()) == 4 for line in qrels)
    assert "## Metrics (mean, 95% CI)" in (run / "report.md").read_text(encoding="utf-8")


def test_finish_run_of_rows_judged_in_python_into_a_new_directory_writes_them_too(
    tmp_path: Path,
) -> None:
    """finish_run(config, new_dir, results=rows) had written the summary and reports, and no
    verdicts.jsonl: read_run, judge report and compare of that directory then failed."""
    from judge import read_run

    rows = sample_results(repeats=1)
    config = load_config(
        None, {"judge.scale": "graded", "run.history": str(tmp_path / "history.sqlite")}
    )
    run = tmp_path / "new"
    summary = finish_run(config, run, None, results=rows)
    again = read_run(run)
    assert list(again) == rows and again.summary == summary
    assert run_cli(["report", str(run)]) == 0


def test_cli_report_renders_a_version_1_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run directory finished by an older judge (summary.json schema 1) still reports."""
    results = sample_results(repeats=2)
    run = write_run(tmp_path / "run", results)
    config = load_config(None, {"judge.scale": "graded", "metrics.gain": "exponential"})
    v1 = build_summary(config, results, n_boot=50).model_dump(mode="json")
    policy = v1.pop("policy")
    v1 |= {"schema_version": 1, "gain": policy["gain"], "unjudged_policy": "skip", "run": {}}
    (run / "summary.json").write_text(json.dumps(v1), encoding="utf-8")
    assert run_cli(["report", str(run)]) == 0
    assert capsys.readouterr().out.split() == [str(run / "report.md"), str(run / "report.html")]
    md = (run / "report.md").read_text(encoding="utf-8")
    assert "scored on their judged passages only" in md  # unjudged_policy "skip" was read
    assert "## Queries (14; lowest relevancy_mean first)" in md  # rows from the results
    assert json.loads((run / "summary.json").read_text(encoding="utf-8")) == v1  # not rewritten


def test_agreement_with_human_labels_is_reported(report: tuple[Path, Path]) -> None:
    md_path, html_path = report
    md = md_path.read_text("utf-8")
    section = md[md.index("## Agreement with human labels") :]
    section = section[: section.index("\n## ")]
    header = "| engine | n | accuracy | relevance accuracy | kappa | weighted kappa | AUC |"
    assert header in section
    assert "human (rows) x judge (columns)" in section
    for label in ("unrelated", "related", "partial", "answers"):
        assert f"human {label}" in section
    assert "Agreement with human labels" in html_path.read_text("utf-8")


@pytest.mark.parametrize(
    ("check", "value", "before", "now", "said"),
    [
        ("drop ndcg", 0.05, 0.8, 0.75, "fell 0.0500 (from 0.8000 to 0.7500)"),
        ("drop ndcg", -0.01, 0.8, 0.81, "rose 0.0100 (from 0.8000 to 0.8100)"),
        ("drop ndcg", 0.0, 0.8, 0.8, "unchanged (from 0.8000 to 0.8000)"),
        ("rise near_dup@5", 0.2, 0.0, 0.2, "rose 0.2000 (from 0.0000 to 0.2000)"),
        ("rise near_dup@5", -0.1, 0.3, 0.2, "fell 0.1000 (from 0.3000 to 0.2000)"),
    ],
)
def test_a_drop_or_rise_check_says_which_way_it_moved(
    check: str, value: float, before: float, now: float, said: str
) -> None:
    """A night that rose had read "fell -0.0100"; a rise check had no "from X to Y"."""
    from judge.report.status import describe_check
    from judge.report.summary import Check

    found = Check(check=check, value=value, limit=0.03, ok=value <= 0.03, engine="bm25")
    found = found.model_copy(update={"baseline": before, "current": now})
    name = check.split()[1]
    assert describe_check(found) == f"{check} (bm25): {said}; at most 0.0300 allowed", name


def test_the_status_is_the_first_that_applies_and_every_reason_is_listed() -> None:
    from judge.report.status import header
    from judge.report.summary import Check, ThresholdResult
    from judge.run.runner import RunOutcome

    config = load_config(None, {"judge.scale": "graded"})
    results = sample_results(repeats=1)
    summary = build_summary(config, results, n_boot=20)
    low = Check(check="min ndcg@5", value=0.41, limit=0.55, ok=False, engine="bm25")
    note = Check(check="baseline", value=None, limit=None, ok=True, note="b.json not found")
    failed = summary.model_copy(update={"thresholds": ThresholdResult.of([low, note])})
    head = header(failed, failed.health)
    assert (head.title, head.css) == ("FAILED · judge report · default config", "failed")
    assert list(head.lines) == [
        "breached: min ndcg@5 (bm25): 0.4100; at least 0.5500 required",
        "note: baseline: b.json not found",
    ]
    outcome = RunOutcome(
        out_dir="run",
        status="incomplete",
        reason="interrupted",
        stopped_by="interrupted",
        planned=18,
        done=11,
        resumed=0,
        requests=40,
        cache_hits=0,
        retries=0,
        prompt_tokens=0,
        completion_tokens=0,
        cost_usd=0.0,
        elapsed_s=1.0,
        errors_by_kind={},
    )
    stopped = header(failed.model_copy(update={"run": outcome}), failed.health)
    assert stopped.title.startswith("INCOMPLETE · ") and stopped.css == "incomplete"
    assert stopped.lines[0] == (
        "incomplete: interrupted; rerun the same command to resume (11 of 18 query-repeats ran)"
    )
    assert "breached: min ndcg@5 (bm25)" in stopped.lines[1]


def _svg_texts(svg: str) -> list[str]:
    """The chart's text: charts keep text as text, so tick labels can be read back."""
    return re.findall(r">([^<>]{1,24})</text>", svg)


def test_unit_metrics_share_the_0_to_1_axis_and_others_scale_freely() -> None:
    from judge.report import charts

    # An all-1.0 metric is drawn on [0, 1], not on an axis of 0.96-1.04 that fills the panel.
    flat = _svg_texts(charts.metric_distribution({"ap": {"a": [1.0, 1.0], "b": [1.0]}}, "ab"))
    assert {"0.0", "0.2", "1.0"} <= set(flat) and "1.04" not in flat
    wide = _svg_texts(charts.metric_distribution({"x": {"a": [1.0, 2.0], "b": [1.5]}}, "ab"))
    assert "0.0" not in wide and "2.0" in wide
    bars = _svg_texts(charts.metric_bars({"ap": {"a": (0.97, 0.95, 0.99)}}, ["a"]))
    assert {"0.0", "1.0"} <= set(bars)


def test_scatter_labels_never_print_over_each_other() -> None:
    from judge.report import charts

    # Twelve queries within a hair of each other: one label names them, not twelve on top.
    base = {f"q{i:02d}": 0.5 + i * 0.001 for i in range(12)}
    other = {q: v + 0.2 for q, v in base.items()}
    svg = charts.engine_scatter({"ndcg": (base, other)}, "a", "b")
    named = [t for t in _svg_texts(svg) if t.startswith("q")]
    assert named == ["q00 +11"]
    assert "better 12 · tie 0 · worse 0" in svg  # the counts sit in the title, off the data


def test_every_chart_is_well_formed_svg_and_escapes_names() -> None:
    """Each chart parses as XML, with engine, metric and query names that need escaping."""
    import xml.etree.ElementTree as ET

    from judge.report import charts

    engines = ['bm25 "v2" & <co>', "稠密检索"]
    q = {f"q&{i}": i / 10 for i in range(5)}
    svgs = [
        charts.metric_distribution({"ap<5": {e: [0.1, 0.9, 0.4] for e in engines}}, engines),
        charts.engine_scatter({"ndcg": (q, {k: v / 2 for k, v in q.items()})}, *engines),
        charts.metric_bars({"ap": {e: (0.5, 0.4, 0.6) for e in engines}}, engines),
        charts.stability_lines(
            {e: {"ap": [0.5, None, 0.6]} for e in engines}, {e: [1, 2, 3] for e in engines}
        ),
        charts.label_distribution(
            {e: {"no": 3, "yes": 5, "error": 1} for e in engines}, ["no", "yes"]
        ),
        charts.history_trend(
            [(1, {engines[0]: {"ap": 0.5}}), (2, {engines[0]: {"ap": 0.3}})],
            ["ap"],
            engines,
            {(2, engines[0], "ap")},
        ),
    ]
    for svg in svgs:
        root = ET.fromstring(svg)
        assert root.tag == "svg" and root.get("role") == "img"
        texts = "".join(root.itertext())
        assert "http" not in svg  # nothing outside the page
        assert any(name in texts for name in [*engines, "ap<5", "q&0", "ndcg", "ap"])
    assert (
        'bm25 "v2" &amp; <co>' not in svgs[0] and "bm25 &quot;v2&quot; &amp; &lt;co&gt;" in svgs[0]
    )


def test_tick_values_are_round_and_cover_the_range() -> None:
    from judge.report.svg import nice_ticks, tick_labels

    assert nice_ticks(-0.04, 1.04) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert tick_labels(nice_ticks(-0.04, 1.04)) == ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"]
    assert tick_labels(nice_ticks(0.9, 2.1)) == ["1.0", "1.2", "1.4", "1.6", "1.8", "2.0"]
    assert tick_labels([1.0, 1.25, 1.5]) == ["1.00", "1.25", "1.50"]
    assert tick_labels([0.0, 50.0, 100.0]) == ["0.0", "50.0", "100.0"]
    for lo, hi in [(0.0, 105.0), (-3.2, 7.9), (0.001, 0.0042), (1e6, 3e6)]:
        ticks = nice_ticks(lo, hi)
        assert 2 <= len(ticks) <= 6 and lo <= ticks[0] and ticks[-1] <= hi


def test_report_md_makes_no_link_or_image_of_data_text() -> None:
    """A query "[r]: http://evil.example/x.png" had defined a link target for the whole
    report.md, and an engine named "![r]" then loaded it as an image wherever it was said."""
    markdown_it = pytest.importorskip("markdown_it")
    from judge.report.blocks import Header, Section, Table, Text, render_markdown

    head = Header(title="FAILED · ![r]", css="failed", lines=("[r]: http://evil.example/x.png",))
    body = [
        Section("q", "[r]: http://evil.example/x.png", [Text("[r]: http://evil.example/x.png")]),
        Section(
            "t", "t", [Table(["engine", "[x]"], [["![r]", "[click][r]"], ["[a](http://e.x)", 1]])]
        ),
    ]
    page = markdown_it.MarkdownIt("commonmark").enable("table").render(render_markdown(head, body))
    assert "<img" not in page and "<a " not in page and "evil.example" in page


def test_a_summary_made_again_under_another_configs_policy_recomputes_the_metrics(
    tmp_path: Path,
) -> None:
    """``judge report --rebuild --config`` with another metric policy (here the gain; a cut
    written by ``judge calibrate --write`` alike) counts the metrics as it says: it had kept
    the run's stored per-query values beside a policy that said otherwise."""
    run = write_run(tmp_path / "run", sample_results(repeats=1))
    config = tmp_path / "c.toml"
    config.write_text('[judge]\nscale = "graded"\n[metrics]\ngain = "exponential"\n')
    assert run_cli(["report", str(run), "--rebuild", "--config", str(config)]) == 0
    summary = load_summary(run / "summary.json")
    policy = load_config(config).metrics
    again = metrics_for_queries(
        ["ndcg"], [(jq.query, jq.verdicts) for jq in sample_results(repeats=1)], GRADED, policy
    )
    want = [
        v["ndcg"]
        for jq, v in zip(sample_results(repeats=1), again, strict=True)
        if jq.query.engine == "bm25" and v["ndcg"] is not None
    ]
    assert summary.engines["bm25"].mean("ndcg") == pytest.approx(sum(want) / len(want))


def test_rebuild_makes_a_finished_runs_removed_or_damaged_summary_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run that finished (finished.json: complete, from these results) whose summary.json
    was removed or damaged is made again by --rebuild: it had been taken for a run killed
    before its summary (exit 3), or read first and refused (exit 2)."""
    from judge.cli.main import main

    done = write_run(tmp_path / "done", sample_results(repeats=1))
    config = load_config(None, {"judge.scale": "graded", "run.history": str(tmp_path / "h")})
    (done / "run.json").write_text("{}", encoding="utf-8")
    finish_run(config, done, None)
    graded = _graded(tmp_path)
    for damage in ("", "{trunc", None):
        if damage is None:
            (done / "summary.json").unlink()
        else:
            (done / "summary.json").write_text(damage, encoding="utf-8")
        assert main(["report", str(done), "--rebuild", "--config", str(graded)]) == 0, damage
        assert load_summary(done / "summary.json").engines
        assert "Traceback" not in capsys.readouterr().err
