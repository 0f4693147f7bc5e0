"""The three reports people read, judged through the real ``judge run`` against a loopback
server and opened in headless Chromium: the quickstart's (a yes/no judge that says yes to
everything), two engines compared over repeats, and a nightly run that fell below its baseline.

What a reader sees first is checked where they see it: the status word in the page title, the
status header as the page's first element, and, on a 1280 x 800 screenshot, the header's
coloured frame at the top and the metric table's header row inside the first screen. The
screenshots land in ``$JUDGE_SCREENSHOTS`` when that is set (a full page too), to look at.

Chromium comes from ``tests.test_report``'s fixture: Debian's package, installed with apt-get
when missing and the tests run as root, else these tests are skipped saying why (a report
test should not fail a developer's run for want of a browser; CI's machine has one).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image

from judge.cli.main import main
from tests import test_report
from tests.servers import (
    Recorded,
    Responder,
    ScriptedServer,
    hashed_responder,
    label_responder,
)

SAMPLE = Path(__file__).resolve().parent.parent / "datasets" / "sample.jsonl"
chromium = test_report.chromium  # the session fixture, shared
browse, console_messages = test_report.browse, test_report.console_messages

# The frame colour of each status (judge/report/blocks.py) and the table header's background.
FRAME = {
    "PASSED": (27, 110, 47),
    "FAILED": (179, 38, 30),
    "JUDGE UNRELIABLE": (179, 38, 30),
}
TABLE_HEAD = (238, 241, 244)
FIRST_SCREEN = (1280, 800)


def unlabelled(path: Path) -> Path:
    """The sample without its human labels: a scripted judge that answers by a prompt's hash
    disagrees with them, which the health check rightly calls unreliable."""
    rows = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines() if line]
    path.write_text(
        "".join(json.dumps({k: v for k, v in row.items() if k != "labels"}) + "\n" for row in rows),
        encoding="utf-8",
    )
    return path


def write_toml(
    path: Path, server: ScriptedServer, cache: Path, body: str, dataset: Path = SAMPLE
) -> Path:
    """A config for ``server`` on ``dataset`` (the sample: graded human labels) plus ``body``."""
    path.write_text(
        f'[provider]\nbase_url = "{server.openai_base_url}"\n'
        f'[dataset]\npath = "{dataset}"\nlabel_scale = "graded"\n'
        f'[run]\ncache = "{cache}"\ntimeout_s = 5.0\nbackoff_base_s = 0.01\nconcurrency = 4\n'
        f'history = "{path.parent / "history.sqlite"}"\n' + body,
        encoding="utf-8",
    )
    return path


def judge_run(
    tmp: Path,
    name: str,
    responder: Responder,
    body: str,
    *extra: str,
    dataset: Path = SAMPLE,
) -> tuple[int, Path]:
    """``judge run`` of the config ``body`` against a server answering with ``responder``."""
    out = tmp / name
    with ScriptedServer(responder=responder) as server:
        config = write_toml(tmp / f"{tmp.name}.toml", server, tmp / f"{name}.sqlite", body, dataset)
        code = main(["run", str(config), "--out", str(out), *extra])
    return code, out


QUICKSTART = """
[judge]
provider = "local"
model = "judge-test"
scale = "binary"
mode = "pointwise"
[judge.params]
temperature = 0.0
max_tokens = 16
logprobs = true
top_logprobs = 5
[metrics]
names = ["relevancy_mean", "relevancy_max", "ap", "ndcg", "ndcg@5", "precision@5", "mrr",
         "rerank_max"]
"""

TWO_ENGINES = """
[judge]
provider = "local"
model = "judge-test"
scale = "graded"
[metrics]
names = ["ndcg@5", "ap", "precision@5", "mrr", "relevancy_mean"]
"""

NIGHTLY = """
[judge]
provider = "local"
model = "judge-test"
scale = "binary"
[metrics]
names = ["ndcg@5", "ap", "precision@5", "mrr"]
[thresholds]
min = { "precision@5" = 0.1 }
max_drop = { "precision@5" = 0.03, "ndcg@5" = 0.03 }
baseline = "BASELINE"
"""

GRADED_LABELS = ("unrelated", "related", "partial", "answers")


def stricter(request: Recorded) -> str:
    """Yes where ``hashed_responder()`` says yes (an even prompt hash), unless the hash is
    also a multiple of 3."""
    digest = int(hashlib.sha256(request.prompt.encode()).hexdigest(), 16)
    return "yes" if digest % 2 == 0 and digest % 3 != 0 else "no"


@pytest.fixture(scope="module")
def reports(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, tuple[int, Path]]]:
    """The exit code and run directory of each of the three runs."""
    tmp = tmp_path_factory.mktemp("screens")
    with pytest.MonkeyPatch.context() as mp:
        # Progress's default stream may be an earlier test's closed capture (see test_cli.py).
        from judge.run import runner
        from judge.run.progress import Progress

        mp.setattr(runner, "Progress", partial(Progress, stream=sys.stderr))
        quick = tmp / "quickstart"
        quick.mkdir()
        yes = label_responder(lambda request: "yes")
        runs = {
            "quickstart": judge_run(quick, "run", yes, QUICKSTART, "--sample", "3", "--seed", "1")
        }
        two = tmp / "compare"
        two.mkdir()
        graded = hashed_responder(GRADED_LABELS)
        bare = unlabelled(tmp / "sample.jsonl")
        runs["two engines"] = judge_run(
            two, "run", graded, TWO_ENGINES, "--repeats", "2", dataset=bare
        )
        night = tmp / "nightly"
        night.mkdir()
        body = NIGHTLY.replace("BASELINE", str(night / "baseline" / "summary.json"))
        first = judge_run(night, "night1", hashed_responder(), body, "--first-night", dataset=bare)
        assert first[0] == 0
        assert (
            main(
                [
                    "baseline",
                    "set",
                    str(first[1]),
                    "--config",
                    str(night / "nightly.toml"),
                ]
            )
            == 0
        )
        # The second night's judge takes back a third of the first night's yes answers (and
        # gives no new one), so precision@5 can only fall: a drop, whatever the prompts say.
        runs["nightly"] = judge_run(night, "night2", label_responder(stricter), body, dataset=bare)
    yield runs


def _rows_with(pixels: np.ndarray, colour: tuple[int, int, int]) -> np.ndarray:
    """Indexes of the screenshot's rows that hold a pixel of ``colour`` (within 3 per channel)."""
    rgb = np.round(pixels[..., :3] * 255).astype(int)
    near = (np.abs(rgb - np.array(colour)) <= 3).all(axis=2)
    return np.nonzero(near.any(axis=1))[0]


@pytest.mark.parametrize(
    ("name", "code", "word"),
    [
        ("quickstart", 0, "JUDGE UNRELIABLE"),
        ("two engines", 0, "PASSED"),
        ("nightly", 1, "FAILED"),
    ],
)
def test_the_first_screen_says_how_the_run_went(
    chromium: str,
    reports: dict[str, tuple[int, Path]],
    tmp_path: Path,
    name: str,
    code: int,
    word: str,
) -> None:
    got, run = reports[name]
    assert got == code
    page = run / "report.html"
    dom = browse(chromium, page, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert console_messages(dom.stderr) == []
    config = run.parent.name  # the config's name: quickstart, compare or nightly
    assert f"<title>{word} · judge report · {config}</title>" in dom.stdout
    body = dom.stdout[dom.stdout.index("<main>") :]
    assert body.index('<header id="status"') < body.index("<section")
    assert f"<h1>{word} · judge report · {config}</h1>" in body
    shot = tmp_path / "first-screen.png"
    width, height = FIRST_SCREEN
    done = browse(
        chromium,
        page,
        tmp_path,
        f"--screenshot={shot}",
        f"--window-size={width},{height}",
    )
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    pixels = image.imread(str(shot))
    assert pixels.shape[:2] == (height, width)
    frame = _rows_with(pixels, FRAME[word])
    assert frame.size and frame.min() < 60, "the status frame is not at the top"
    # The metric table's header row is on the first screen too: the headline numbers.
    head = _rows_with(pixels, TABLE_HEAD)
    assert head.size and head.min() < height, "no table on the first screen"
    keep = os.environ.get("JUDGE_SCREENSHOTS")
    if keep:
        target = Path(keep)
        target.mkdir(parents=True, exist_ok=True)
        stem = name.replace(" ", "-")
        shutil.copy(shot, target / f"{stem}-first-screen.png")
        full = target / f"{stem}-full.png"
        browse(chromium, page, tmp_path, f"--screenshot={full}", "--window-size=1280,9000")


def test_the_three_reports_say_what_matters_to_their_reader(
    reports: dict[str, tuple[int, Path]],
) -> None:
    quick = (reports["quickstart"][1] / "report.md").read_text(encoding="utf-8")
    lines = quick.splitlines()
    # The verdict on the engines first, then how far to trust it, then the status's reasons.
    assert lines[2].startswith("**no query differs between dense and bm25 on ndcg")
    assert lines[3].startswith("Trust: judge health UNRELIABLE (The judge gave 'yes' to")
    assert next(x for x in lines if x.startswith("- ")).startswith(
        "- judge unreliable: The judge gave 'yes' to"
    )
    assert "Stability across repeats" not in quick  # one repeat: nothing to say
    # Every query scores 1 (and every P(relevant) is 0.9): nothing to draw, and it says so.
    assert "Not drawn: every query scores the same on each metric (relevancy_mean 1.0000" in quick
    assert "precision@5 1.0000)" in quick  # the first six metrics are drawn, or named
    two = (reports["two engines"][1] / "report.md").read_text(encoding="utf-8")
    assert "## Engines compared, paired (baseline bm25)" in two
    assert "## Stability across repeats" in two
    nightly = (reports["nightly"][1] / "report.md").read_text(encoding="utf-8")
    breaches = [line for line in nightly.splitlines()[:16] if line.startswith("- breached: drop")]
    assert breaches and "fell" in breaches[0] and "at most 0.0300 allowed" in breaches[0]
    assert "## History (last 2 runs)" in nightly
    # Tonight against the baseline: the paired difference per engine on the primary metric,
    # and the queries that fell most on it.
    assert "## Tonight vs baseline on " in nightly
    section = nightly.split("## Tonight vs baseline on ", 1)[1].split("\n## ", 1)[0]
    assert "tonight" in section and "baseline" in section and "of " in section
    assert "| query | baseline " in section
