"""Text from outside (passages, queries, engine names, a model's reasons) shown by judge: it
drives no terminal, makes no link or image in report.md, breaks no table of the GitHub step
summary and leaves the JUnit XML well-formed; an engine name that would do harm is refused
before anything is sent."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from judge.cli.main import main
from judge.schema import printable
from tests.servers import Answer, AnswerServer, Item, Recorded, ScriptedServer
from tests.test_runner import write_config

ESC = "\x1b[2J\x1b]0;pwned\x07"  # clear the screen, retitle the window
LINK = "[log in here](https://phish.example) ![t](https://tracker.example/p.png)"


def _answer(request: Recorded) -> Item:
    """A "yes" for the passages that say "pale", with a reason that carries ESC sequences."""
    label = "yes" if "pale" in request.prompt else "no"
    return Answer(json.dumps({"verdict": label, "reason": f"because {ESC} it says so"}))


def _dataset(path: Path, engines: tuple[str, str]) -> Path:
    rows = []
    for q in range(8):
        for engine, first in zip(engines, ("pale skin", "dog food"), strict=True):
            texts = [f"{first} {ESC} {LINK}", "back\\|slash nothing here"]
            rows.append(
                {
                    "query_id": f"q{q}",
                    "query": f"question {q} {LINK}",
                    "engine": engine,
                    "passages": [
                        {"id": f"e{len(rows)}-{i}", "text": t} for i, t in enumerate(texts)
                    ],
                }
            )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_the_console_streams_answer_as_the_streams_they_wrap() -> None:
    """A library asking the wrapped stdout or stderr its encoding gets the real one."""
    import io

    from judge.cli.main import _Printable

    inner = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    shown = _Printable(inner, returns=True)
    assert (shown.encoding, shown.errors) == ("utf-8", "strict")
    shown.write("a\r\x1b[2Jb")
    shown.flush()
    raw = inner.buffer
    assert isinstance(raw, io.BytesIO)
    assert raw.getvalue().decode("utf-8") == "a\r\u241b[2Jb"  # the progress line's \r kept


def test_printable_shows_controls_as_symbols() -> None:
    assert printable("a\x1b[2Jb\r\n\tc\u202ed\x7f") == "a\u241b[2Jb\u240d\n\tc\ufffdd\u2421"
    assert printable("plain text, 中文") == "plain text, 中文"
    # What XML 1.0 cannot hold: a JUnit file with it had not parsed.
    assert printable("x\uffff\ufffe\ud800") == "x\ufffd\ufffd\ufffd"


def test_chart_labels_show_controls_as_symbols() -> None:
    """Chart labels had been HTML-escaped only: an engine name's ESC reached the page raw."""
    from judge.report.svg import esc

    assert esc("x\x1b[2J<b>\u202e") == "x\u241b[2J&lt;b&gt;\ufffd"


def test_outside_text_drives_no_terminal_and_breaks_no_report(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = make_server(responder=_answer)
    dataset = _dataset(tmp_path / "d.jsonl", ("bm25|rerank", "dense"))
    tables = {"dataset": {"path": str(dataset), "label_scale": "binary"}}
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite", tables)
    step = tmp_path / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    out, junit = tmp_path / "out", tmp_path / "judge.xml"
    assert main(["run", str(config), "--out", str(out), "--junit", str(junit)]) == 0
    assert main(["render", str(config), "--query", "0"]) == 0
    assert main(["explain", str(out), "--query", "q0", "--engine", "dense"]) in (0, 1)
    captured = capsys.readouterr()
    assert "\x1b" not in captured.out and "\x07" not in captured.out
    assert "\x1b" not in captured.err
    assert "\u241b[2J" in captured.out  # shown, not obeyed

    md = (out / "report.md").read_text(encoding="utf-8")
    assert "\x1b" not in md and "\u241b" in md
    assert re.search(r"(?<!\\)\]\(", md) is None  # no link, no image
    assert "\\](https://phish.example)" in md
    assert "back\\\\\\|slash" in md  # the backslash kept, the pipe escaped
    assert "\x1b" not in (out / "report.html").read_text(encoding="utf-8")
    ET.parse(junit)  # well-formed

    lines = step.read_text(encoding="utf-8").splitlines()
    table = [line for line in lines if line.startswith("|")]
    cells = {line.replace("\\|", "").count("|") for line in table}
    assert len(cells) == 1, table  # every row of the step summary's table as wide as its head
    assert any(line.startswith("| bm25\\|rerank |") for line in table)


@pytest.mark.parametrize(
    ("engine", "said"),
    [
        ("dense\x1b[31m", "contains a control character (U+001B)"),
        ("dense\n# heading", "contains a control character (U+000A)"),
        (" dense", "begins or ends with white space"),
        ("bm25\u200b", "contains an invisible character (U+200B)"),
        ("dense\uffff", "contains an invisible character (U+FFFF)"),
    ],
)
def test_an_engine_name_that_would_do_harm_is_refused_before_anything_is_sent(
    server: ScriptedServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    engine: str,
    said: str,
) -> None:
    dataset = _dataset(tmp_path / "d.jsonl", ("bm25", engine))
    tables = {"dataset": {"path": str(dataset), "label_scale": "binary"}}
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite", tables)
    assert main(["run", str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "field 'engine'" in err and said in err and "\x1b" not in err
    assert not server.requests


def test_a_providers_error_with_control_characters_drives_no_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run's stop line quotes the provider's words: an ESC sequence in them had reached
    the terminal on stderr (retitled it, cleared the screen)."""
    said = {"object": "error", "message": f"model {ESC} gone"}  # vLLM's, sent with 200
    with AnswerServer(lambda _raw: (200, said)) as server:
        fake = cast(ScriptedServer, server)  # its URL is read
        config = write_config(tmp_path / "c.toml", fake, tmp_path / "cache.sqlite")
        assert main(["run", str(config), "--out", str(tmp_path / "out")]) == 3
    err = capsys.readouterr().err
    assert "gone" in err and "\x1b" not in err and "\x07" not in err
