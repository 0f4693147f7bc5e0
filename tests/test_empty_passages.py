"""Blank passages (no text a reader sees: empty, white space, zero-width characters) are judged
not relevant without a call, in every path that would have paid for one: pointwise, listwise,
the cascade's LLM band, the dry run's count, the cached re-run's verdict sets and the Python
API. Against the loopback server, counting its requests."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from judge.cli.main import main
from judge.data.datasets import read_results
from judge.data.results import RESULTS_FILE
from judge.judging.judge import Judge
from judge.judging.verdicts import EMPTY_REASON
from judge.schema import Passage
from tests.servers import Answer, Item, Recorded, ScriptedServer, verdict_json
from tests.test_cascade import calls
from tests.test_cascade import write_config as cascade_config
from tests.test_runner import write_config

CHAT, RERANK = "/v1/chat/completions", "/v1/rerank"
BLANKS = {"e1": "", "e2": "  \n\t ", "e3": "\u200b\ufeff \u2060"}


def write_dataset(path: Path) -> Path:
    """Two queries of one engine: each with two passages to read and the three blank ones
    between them; a third query whose passages are all blank."""
    rows = []
    for q in range(2):
        passages = [{"id": f"q{q}-a", "text": f"an answer to question {q}"}]
        passages += [{"id": f"q{q}-{pid}", "text": text} for pid, text in BLANKS.items()]
        passages += [{"id": f"q{q}-t", "text": " ", "title": f"a title about question {q}"}]
        rows.append(
            {"query_id": f"q{q}", "query": f"question {q}", "engine": "e", "passages": passages}
        )
    rows.append(
        {
            "query_id": "q9",
            "query": "question 9",
            "engine": "e",
            "passages": [{"id": pid, "text": text} for pid, text in BLANKS.items()],
        }
    )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def says_yes(request: Recorded) -> Item:
    """ "yes" to every passage asked about, pointwise or in a list (by its fenced id)."""
    text = "\n".join(str(m.get("content", "")) for m in request.messages)
    if '"verdicts"' not in text:
        return Answer(verdict_json("yes"))
    ids = [json.loads(raw) for raw in re.findall(r"<passage id=(\"[^\"]*\")>", text)]
    return Answer(json.dumps({"verdicts": [{"id": i, "verdict": "yes"} for i in ids]}))


def _is_blank(passage_id: str) -> bool:
    return passage_id.rsplit("-", 1)[-1] in BLANKS


def _config(tmp_path: Path, server: ScriptedServer, mode: str) -> Path:
    dataset = write_dataset(tmp_path / "data.jsonl")
    return write_config(
        tmp_path / "run.toml",
        server,
        tmp_path / "cache.sqlite",
        {"judge": {"mode": mode}, "dataset": {"path": str(dataset), "label_scale": "binary"}},
    )


def test_the_passage_says_when_it_is_blank() -> None:
    assert all(Passage(id="p", text=text).blank for text in BLANKS.values())
    assert not Passage(id="p", text=" x ").blank
    assert not Passage(id="p", text="", title="a title").blank
    assert Passage(id="p", text="\u00a0", title="\u200b").blank  # no-break space, zero width


@pytest.mark.parametrize("mode", ["pointwise", "listwise"])
def test_blank_passages_are_not_relevant_and_never_sent_or_paid(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    mode: str,
) -> None:
    server = make_server(responder=says_yes)
    config = _config(tmp_path, server, mode)
    assert main(["run", str(config), "--out", str(tmp_path / "dry"), "--dry-run"]) == 0
    dry = capsys.readouterr().out
    expected = 4 if mode == "pointwise" else 2  # two passages to read in each of two queries
    assert f"{expected} calls (0 already cached)" in dry
    assert "empty: 9 passage(s) have no text" in dry
    assert not server.requests

    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert len(server.requests) == expected
    prompts = " ".join(r.prompt for r in server.requests)
    assert "title^about" in prompts or "title about" in prompts  # a title alone is read
    if mode == "listwise":  # each list holds only the two passages to read
        assert all(len(re.findall(r"<passage id=", r.raw_prompt)) == 2 for r in server.requests)
    rows = {jq.query.query_id: jq for jq in read_results(out / RESULTS_FILE)}
    assert set(rows) == {"q0", "q1", "q9"}
    for jq in rows.values():
        assert [v.rank for v in jq.verdicts] == list(range(1, len(jq.verdicts) + 1))
        for v in jq.verdicts:
            assert v.status == "ok"
            if _is_blank(v.passage_id):
                assert (v.label, v.relevant, v.source) == ("no", False, "empty")
                assert v.reason == EMPTY_REASON and v.usage.total == 0 and v.attempts == 0
            else:
                assert (v.label, v.source) == ("yes", "judge") and v.usage.total > 0
    assert rows["q0"].metrics["relevancy_mean"] == pytest.approx(2 / 5)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["counts"]["blank"] == 9 and summary["counts"]["ok"] == 13
    assert summary["run"]["requests"] == expected
    assert "empty: 9 verdict(s) of empty passages (no text): not relevant, without asking" in stdout
    assert "Empty passages: 9 verdict(s)" in (out / "report.md").read_text(encoding="utf-8")
    # The judge said "yes" to all it read: its health is read from those, not the blanks'.
    assert "no to every" not in json.dumps(summary["health"])

    # A cached re-run pays nothing, gives the same verdicts and counts only real cache hits.
    again = tmp_path / "again"
    assert main(["run", str(config), "--out", str(again)]) == 0
    assert len(server.requests) == expected
    rerun = {jq.query.query_id: jq for jq in read_results(again / RESULTS_FILE)}
    for qid, jq in rows.items():
        assert [(v.label, v.source) for v in rerun[qid].verdicts] == [
            (v.label, v.source) for v in jq.verdicts
        ]
    rerun_summary = json.loads((again / "summary.json").read_text(encoding="utf-8"))
    assert rerun_summary["run"]["cache_hits"] == expected  # answers found, not blanks


def test_a_cascade_sends_no_blank_passage_to_the_llm_or_the_reranker(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """A blank passage is neither asked of the LLM nor sent to the reranker (some rerank
    servers refuse an empty document, failing the whole query's scores): it scores 0. Nor is
    a passage whose text is blank beside a title (a reranker scores the text alone), nor one
    whose every word the sanitiser flagged as aimed at the judge (the LLM reads that one)."""

    def scorer(query: str, document: str) -> float:
        return 0.9 if not document.strip() else 0.5  # blank: above the band; the rest in it

    server = make_server(scorer=scorer, responder=says_yes)
    config = cascade_config(tmp_path, server, {"low": 0.3, "high": 0.7, "echo_floor": 0})
    write_dataset(tmp_path / "data.jsonl")  # over the cascade helper's dataset
    rows = [json.loads(line) for line in (tmp_path / "data.jsonl").read_text().splitlines()]
    for row in rows[:2]:  # one passage to read, besides the one the sanitiser takes whole
        row["passages"].append({"id": f"{row['query_id']}-k", "text": "kettles boil water"})
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == 0
    # q9's passages are all blank: no request. q0 and q1 send the one passage with text left.
    sent = [r.body["documents"] for r in server.requests if r.path == RERANK]
    assert sent == [["kettles boil water"], ["kettles boil water"]]
    # The LLM reads the passage the sanitiser flagged whole, and the one in the band.
    assert calls(server, CHAT) == 4
    for jq in read_results(out / RESULTS_FILE):
        for v in jq.verdicts:
            if _is_blank(v.passage_id):
                assert (v.label, v.source, v.usage.total) == ("no", "empty", 0)
            elif v.passage_id.endswith("-t"):  # its text is blank: scored 0, below the band
                assert (v.label, v.source) == ("no", "reranker")
            else:
                assert v.source == "judge"


def test_the_python_api_judges_a_blank_passage_without_asking(server: ScriptedServer) -> None:
    with Judge(provider="local", model="judge-test", base_url=server.openai_base_url) as judge:
        judged = judge.judge("what is rust?", ["", "Rust is a systems language.", " \u200b"])
        assert len(server.requests) == 1
        assert [(v.passage_id, v.source) for v in judged.verdicts] == [
            ("1", "empty"),
            ("2", "judge"),
            ("3", "empty"),
        ]
        assert judge.judge("what is rust?", ["\n"]).verdicts[0].label == "no"
        assert len(server.requests) == 1


def test_a_long_list_is_asked_in_windows_each_fitting_its_answer(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Listwise, 25 passages with list_size 10: three requests of 10, 10 and 5, every passage
    judged once, as the dry run says. With a max_tokens that holds four verdicts and their
    reasons, windows of four (one request for a whole list had been cut off at max_tokens)."""
    server = make_server(responder=says_yes)
    rows = [
        {
            "query_id": "q",
            "query": "question",
            "passages": [{"id": f"p{i}", "text": f"answer {i}"} for i in range(25)],
        }
    ]
    dataset = tmp_path / "long.jsonl"
    dataset.write_text(json.dumps(rows[0]) + "\n", encoding="utf-8")
    tables = {
        "judge": {"mode": "listwise", "list_size": 10},
        "judge.params": {"max_tokens": 2000},  # room for 26 verdicts: the list_size decides
        "dataset": {"path": str(dataset), "label_scale": "binary"},
    }
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite", tables)
    assert main(["run", str(config), "--out", str(tmp_path / "dry"), "--dry-run"]) == 0
    assert "3 calls (0 already cached)" in capsys.readouterr().out
    assert main(["run", str(config), "--out", str(tmp_path / "out")]) == 0
    sizes = sorted(len(re.findall(r"<passage id=", r.raw_prompt)) for r in server.requests)
    assert sizes == [5, 10, 10]
    (jq,) = read_results(tmp_path / "out" / RESULTS_FILE)
    assert [v.passage_id for v in jq.verdicts] == [f"p{i}" for i in range(25)]
    assert all(v.status == "ok" and v.label == "yes" for v in jq.verdicts)
    tight = tables | {"judge.params": {"max_tokens": 4 * 76}}
    config = write_config(tmp_path / "tight.toml", server, tmp_path / "cache2.sqlite", tight)
    assert main(["run", str(config), "--out", str(tmp_path / "dry2"), "--dry-run"]) == 0
    assert "7 calls (0 already cached)" in capsys.readouterr().out  # 25 in windows of 4


def test_a_run_directory_made_before_list_size_existed_resumes() -> None:
    """list_size unset is no setting of the fingerprint (a run directory's run.json from
    before it existed had been refused as "changed: judge.list_size unset -> 20")."""
    from judge.config import load_config
    from judge.run.resume import _settings

    unset = load_config(None, {"judge.provider": "openai"}).fingerprint()
    assert "judge.list_size" not in _settings(unset)
    given = load_config(None, {"judge.list_size": 10}).fingerprint()
    assert _settings(given)["judge.list_size"] == 10


def test_a_listwise_cascade_counts_a_call_a_window(
    make_server: Callable[..., ScriptedServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The cascade's line had counted one LLM call a query in listwise mode."""
    from tests.test_cascade import calls as calls_to
    from tests.test_cascade import text_scorer

    server = make_server(scorer=text_scorer, responder=says_yes)
    band = {"low": 0.3, "high": 0.7, "echo_floor": 0}
    config = cascade_config(tmp_path, server, band, n_queries=3)
    text = config.read_text(encoding="utf-8").replace(
        "[judge]\n", '[judge]\nmode = "listwise"\nlist_size = 2\n'
    )
    config.write_text(text, encoding="utf-8")
    assert main(["run", str(config), "--out", str(tmp_path / "out")]) == 0
    assert calls_to(server, CHAT) == 6  # three band passages a query: windows of 2 and 1
    assert "(6 LLM calls, 3 saved" in capsys.readouterr().out  # 15 passages: 9 calls else


def test_a_run_of_blank_passages_alone_says_so_in_its_health(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every passage blank: each verdict is an ok "no" given without asking; the judge's
    health is unknown because nothing had text, not "every one unparsed or an error"."""
    data = tmp_path / "blank.jsonl"
    rows = [{"query_id": f"q{i}", "query": "x", "passages": [{"id": "a", "text": " "}]}
            for i in range(3)]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    config = _config(tmp_path, server, "pointwise")
    assert main(["run", str(config), str(data), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "judge health: unknown: no verdict was answered (no passage had text to judge)" in out
    assert not server.requests


def test_passages_cut_to_the_length_limit_are_counted_and_said(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A passage cut to ``max_passage_chars`` is marked on the passage; the console, the
    report and summary.json count it (stderr had said it once, the outputs never)."""
    data = tmp_path / "long.jsonl"
    long = "word " * 400
    row = {"query_id": "q", "query": "x", "passages": [{"id": "a", "text": long}]}
    row["passages"].append({"id": "b", "text": "short"})
    data.write_text(json.dumps(row) + "\n", encoding="utf-8")
    config = _config(tmp_path, server, "pointwise")
    out = tmp_path / "out"
    argv = [
        "run",
        str(config),
        str(data),
        "--out",
        str(out),
        "--set",
        "dataset.max_passage_chars=300",
    ]
    assert main(argv) == 0
    said = "1 passage(s) were cut to a length limit (max_passage_chars or the context window)"
    assert f"truncated: {said}" in capsys.readouterr().out
    assert f"Truncated: {said}" in (out / "report.md").read_text(encoding="utf-8")
    assert (
        json.loads((out / "summary.json").read_text(encoding="utf-8"))["counts"]["truncated"] == 1
    )
