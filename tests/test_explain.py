"""`judge explain`: an LLM's reason for a finished run's passages, through the real CLI, the
real OpenAI SDK and the run's cache, against a loopback server with scripted answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from judge.cli.main import main
from judge.data.results import append_result, load_results
from judge.schema import JudgedQuery, Passage, Query, Verdict
from tests.servers import Answer, ScriptedServer
from tests.test_runner import write_config, write_dataset


def explained(reason: str, label: str) -> Answer:
    """The explainer's answer: the reason first, then the verdict, as it is asked for."""
    return Answer(text=json.dumps({"reason": reason, "verdict": label}))


@pytest.fixture
def run_dir(server: ScriptedServer, tmp_path: Path) -> Path:
    """A finished run of the loopback LLM judge: 2 queries x 3 passages, engine bm25; asked,
    as a small local judge is, for the verdict first and a short reason."""
    data = write_dataset(tmp_path / "d.jsonl", 2, 3)
    tables = {
        "dataset": {"path": str(data)},
        "judge": {"verdict_first": True, "max_reason_words": 8},
        "judge.params": {"max_tokens": 16},
    }
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite", tables)
    out = tmp_path / "run"
    assert main(["run", str(config), "--out", str(out), "--no-charts"]) == 0
    server.reset()
    return out


def run_label(out: Path, qid: str, pid: str) -> str:
    row = next(jq for jq in load_results(out) if jq.query.query_id == qid)
    label = next(v.label for v in row.verdicts if v.passage_id == pid)
    assert label is not None
    return label


def test_explain_prints_the_reason_and_a_second_explain_pays_nothing(
    run_dir: Path, server: ScriptedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    said = run_label(run_dir, "q0", "q0-p1")
    server.enqueue(explained("It says what question 0 asks.", said))
    assert main(["explain", str(run_dir), "--query", "q0", "--passage", "q0-p1"]) == 0
    assert len(server.requests) == 1
    out = capsys.readouterr().out
    assert "query q0 (bm25): question number 0" in out
    assert "passage q0-p1: text 1 answering question 0" in out
    assert f"run:       {said}" in out
    assert "reason:    It says what question 0 asks." in out
    assert "DISAGREES" not in out
    # The request asks for the reason before the verdict, with room to write it.
    body = server.requests[0].body
    system = body["messages"][0]["content"]
    assert system.index('"reason"') < system.index('"verdict": "<')
    assert body["max_tokens"] >= 96

    assert main(["explain", str(run_dir), "--query", "q0", "--passage", "q0-p1"]) == 0
    assert len(server.requests) == 1  # the cache answered: nothing sent, nothing paid
    again = capsys.readouterr().out
    assert "reason:    It says what question 0 asks." in again and "cached" in again


def test_an_empty_passage_is_not_credited_to_the_explainer(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty passage is judged without asking, and explain asks nothing of it either: it
    had printed the explainer's name beside the run's own verdict and reason, as if given."""
    data = tmp_path / "d.jsonl"
    passages = [
        {"id": "full", "text": "question number 0 is answered here"},
        {"id": "blank", "text": " "},
    ]
    row = {"query_id": "q0", "query": "question number 0", "engine": "bm25", "passages": passages}
    data.write_text(json.dumps(row) + "\n", encoding="utf-8")
    tables = {"dataset": {"path": str(data)}}
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite", tables)
    out = tmp_path / "run"
    assert main(["run", str(config), "--out", str(out), "--no-charts"]) == 0
    server.reset()
    capsys.readouterr()
    assert main(["explain", str(out), "--query", "q0", "--passage", "blank"]) == 0
    said = capsys.readouterr().out
    assert "not asked: the passage is empty, nothing to explain" in said
    assert "P(relevant)" not in said and server.requests == []


def test_an_explain_the_run_already_asked_is_its_cached_answer(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run that asked for the reason first with room for it asked the explainer's question
    already: its answer is read back from the cache, nothing is sent."""
    data = write_dataset(tmp_path / "d.jsonl", 1, 2)
    config = write_config(
        tmp_path / "c.toml", server, tmp_path / "cache.sqlite", {"dataset": {"path": str(data)}}
    )
    out = tmp_path / "run"
    assert main(["run", str(config), "--out", str(out), "--no-charts"]) == 0
    server.reset()
    assert main(["explain", str(out), "--query", "q0", "--passage", "q0-p0"]) == 0
    assert server.requests == []
    assert "reason:    scripted answer" in capsys.readouterr().out


def test_explain_applies_the_settings_the_run_was_started_with(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run started with ``--set`` is explained under those settings (run.json keeps them):
    its answers are in the cache it was given, so nothing is paid again."""
    data = write_dataset(tmp_path / "d.jsonl", 1, 2)
    config = write_config(
        tmp_path / "c.toml", server, tmp_path / "cache.sqlite", {"dataset": {"path": str(data)}}
    )
    moved = tmp_path / "moved.sqlite"
    out = tmp_path / "run"
    argv = ["run", str(config), "--out", str(out), "--no-charts", "--set", f"run.cache={moved}"]
    assert main(argv) == 0
    server.reset()
    assert main(["explain", str(out), "--query", "q0", "--passage", "q0-p0"]) == 0
    assert server.requests == []
    assert "reason:    scripted answer" in capsys.readouterr().out
    assert not (tmp_path / "cache.sqlite").exists()


def test_a_disagreeing_explainer_is_said_plainly(
    run_dir: Path, server: ScriptedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    said = run_label(run_dir, "q1", "q1-p2")
    other = "no" if said == "yes" else "yes"
    server.enqueue(explained("A reason for the other verdict.", other))
    assert main(["explain", str(run_dir), "--query", "q1", "--passage", "q1-p2"]) == 0
    out = capsys.readouterr().out
    assert f"DISAGREES: the run said '{said}'" in out
    assert f"this reason argues for '{other}' and does not explain the run's verdict" in out


def test_every_passage_of_the_query_without_passage_flags(
    run_dir: Path, server: ScriptedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["explain", str(run_dir), "--query", "q1"]) == 0
    assert len(server.requests) == 3
    out = capsys.readouterr().out
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("passage ")] == [
        "passage q1-p0",
        "passage q1-p1",
        "passage q1-p2",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--query", "q9"], "no query 'q9' in this run; its queries: q0, q1"),
        (["--query", "q0", "--passage", "nope"], "has no passage 'nope'"),
        (["--query", "q0", "--engine", "dense"], "has no engine 'dense'; its engines: bm25"),
        (["--query", "q0", "--provider", "openai"], "--provider openai: name its model"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_sent(
    run_dir: Path,
    server: ScriptedServer,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    assert main(["explain", str(run_dir), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert server.requests == []


def test_a_missing_run_directory_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["explain", str(tmp_path / "nope"), "--query", "q0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"judge: {tmp_path / 'nope'}: no such run directory"


def test_a_run_without_its_config_asks_for_one(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (run_dir / "run.json").unlink()
    assert main(["explain", str(run_dir), "--query", "q0"]) == 2
    assert "pass --config" in capsys.readouterr().err


def test_a_run_judged_by_score_is_explained_by_the_llm_named(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A judge by score gives no reasons; the explainer named on the command line does,
    over the run's cache: the second time, nothing is sent."""
    cache = tmp_path / "cache.sqlite"
    config = tmp_path / "score.toml"
    config.write_text(
        '[judge]\nprovider = "embedded-fused"\nmodel = "minilm-e5"\nscale = "binary"\n'
        f'[run]\ncache = "{cache}"\ntimeout_s = 5.0\n',
        encoding="utf-8",
    )
    out = tmp_path / "run"
    passages = (Passage(id="a", text="Paris is the capital of France."),)
    query = Query(query_id="q", query="capital of france", engine="e", passages=passages)
    verdict = Verdict(
        passage_id="a",
        rank=1,
        status="ok",
        label="yes",
        grade=1,
        relevant=True,
        probability=0.81,
        source="reranker",
    )
    append_result(
        out / "verdicts.jsonl",
        JudgedQuery(query=query, repeat=0, scale="binary", verdicts=(verdict,), metrics={}),
    )
    (out / "run.json").write_text(json.dumps({"source": str(config)}), encoding="utf-8")
    argv = [
        "explain",
        str(out),
        "--query",
        "q",
        "--provider",
        "local",
        "--model",
        "judge-test",
        "--set",
        f"provider.base_url={server.openai_base_url}",
    ]
    server.enqueue(explained("It names Paris as the capital.", "yes"))
    assert main(argv) == 0
    shown = capsys.readouterr().out
    assert "run:       yes, score 0.81, by reranker" in shown
    assert "local/judge-test: yes" in shown and "It names Paris as the capital." in shown
    assert main(argv) == 0
    assert len(server.requests) == 1


def test_an_answer_that_does_not_read_is_said_once_and_is_not_incomplete(
    run_dir: Path, server: ScriptedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 3 says a rerun may finish it: an answer that came and does not read is paid and
    kept, and a rerun reads the same one (it had exited 3 every time)."""
    for _ in range(2):  # the answer and its re-ask
        server.enqueue(Answer(text="I think it is fine, more or less."))
    argv = ["explain", str(run_dir), "--query", "q0", "--passage", "q0-p1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert ": unparsed" in out and "a rerun reads the same one" in out
    sent = len(server.requests)
    assert main(argv) == 0 and len(server.requests) == sent  # nothing paid again


def test_a_run_with_repeats_is_compared_by_the_label_it_gave_most_often(
    run_dir: Path, server: ScriptedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Repeat 0 is not the run's verdict when the repeats split: the label given most often
    is (an explainer agreeing with two of three repeats had been said to disagree)."""
    rows = load_results(run_dir)
    first = next(jq for jq in rows if jq.query.query_id == "q0")
    said = run_label(run_dir, "q0", "q0-p1")
    other = "no" if said == "yes" else "yes"
    flipped = tuple(
        v.model_copy(
            update={"label": other, "grade": int(other == "yes"), "relevant": other == "yes"}
        )
        if v.passage_id == "q0-p1"
        else v
        for v in first.verdicts
    )
    for r in (1, 2):
        append_result(
            run_dir / "verdicts.jsonl", first.model_copy(update={"repeat": r, "verdicts": flipped})
        )
    server.enqueue(explained("Most repeats said so.", other))
    assert main(["explain", str(run_dir), "--query", "q0", "--passage", "q0-p1"]) == 0
    out = capsys.readouterr().out
    assert f"(repeat 0 of 3; over the repeats: {other} 2, {said} 1: {other} most often)" in out
    assert "DISAGREES" not in out
