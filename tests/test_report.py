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
N_CHARTS = 5  # distribution, bm25-vs-dense scatter, stability, labels, history


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
    assert "## Metrics (mean, 95% CI)" in text
    assert re.search(r"\| bm25 \| 0\.\d{4} \[0\.\d{3}, 0\.\d{3}\]", text)
    assert "## Engines compared (baseline bm25)" in text and "pooled_ndcg@5" in text
    assert "1 unparsed, 1 error" in text
    assert "## History (last 4 runs)" in text and "**1 run(s) flagged as regressions.**" in text
    assert "## Lowest relevancy_mean" in text
    # A judge that uses the whole scale: its health is shown, with no warning.
    assert "## Judge health" in text and "Not degenerate." in text and "WARNING" not in text


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
    assert loads == []
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
        "metric distribution per engine",
        "per-query dense vs bm25",
        "stability across repeats",
        "verdict labels",
        "trend over previous runs",
    ]
    labels_chart = page[page.index('aria-label="verdict labels"') :]
    labels_chart = labels_chart[: labels_chart.index("</svg>")]
    for legend in ("unrelated", "answers", "unparsed", "error"):
        assert f">{legend}<" in labels_chart


def test_the_worst_queries_come_with_the_judges_reasons(report: tuple[Path, Path]) -> None:
    page = report[1].read_text(encoding="utf-8")
    worst = page[page.index('<section id="worst">') :]
    worst = worst[: worst.index("</section>")]
    assert worst.count("<h3") == 5
    first = re.search(r"<h3[^>]*>(\w+) / (\w+) \(repeat (\d)\): relevancy_mean (0\.\d+)", worst)
    assert first is not None
    assert "is unrelated</td>" in worst  # the reason column
    failed = page[page.index('<section id="failed">') :]
    assert "q2 / dense (repeat 1): metrics undefined" in failed
    assert "raw answer: maybe?" in failed and "HTTP 500" in failed
    assert failed.count('<tr class="failed">') == 2


def test_one_engine_gets_no_comparison_and_no_history_without_rows(tmp_path: Path) -> None:
    config = load_config(None, {"judge.scale": "graded"})
    results = [jq for jq in sample_results(repeats=1) if jq.query.engine == "dense"]
    summary = build_summary(config, results, n_boot=50)
    _, page = write_reports(tmp_path, summary, results)
    html = page.read_text(encoding="utf-8")
    assert 'id="compare"' not in html and 'id="history"' not in html
    assert html.count("<svg") == 3


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
    assert "judge report" in dom.stdout and "&lt;script&gt;alert" in dom.stdout
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
    assert md.count("\n### ") == 2
    assert "bm25 ndcg@5 fell 0.1000" in md


def test_finish_run_from_python_writes_everything_a_run_leaves(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", sample_results(repeats=2))
    history = tmp_path / "history.sqlite"
    config = load_config(None, {"judge.scale": "graded", "run.history": str(history)})
    summary = finish_run(config, run, None)
    for name in ("summary.json", "report.md", "report.html", "qrels.txt"):
        assert (run / name).stat().st_size > 0, name
    assert load_summary(run / "summary.json") == summary
    assert summary.run is None and set(summary.engines) == {"bm25", "dense"}
    assert summary.counts.repeats == 2 and summary.policy == config.metrics
    assert [r.out_dir for r in list_runs(history)] == [str(run)]
    qrels = (run / "qrels.txt").read_text(encoding="utf-8").splitlines()
    assert qrels and all(len(line.split()) == 4 for line in qrels)
    assert "## Metrics (mean, 95% CI)" in (run / "report.md").read_text(encoding="utf-8")


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
