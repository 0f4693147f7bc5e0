"""Answers a re-ask obtained are never paid twice: a redo (``--fresh``, a resume, the same
query asked again) reads them from the cache, through the real openai SDK against a loopback
server that counts every request."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from judge.cli.main import main
from judge.data.datasets import read_results
from judge.data.results import RESULTS_FILE
from judge.judging.judge import Judge
from tests.servers import Item, Recorded, ScriptedServer, listing_responder
from tests.test_runner import write_config

MUMBLE = "mumble"  # the passage whose first answer never parses


def first_mumbles(marker: str = MUMBLE) -> Callable[[Recorded], Item]:
    """An answer no parser reads to a first-round prompt about ``marker``; its re-ask (the
    conversation carries an assistant turn) and every other prompt get verdicts (a list's
    verdict per passage)."""
    answer = listing_responder()

    def respond(request: Recorded) -> Item:
        reasked = any(m.get("role") == "assistant" for m in request.messages)
        if marker in json.dumps(request.messages) and not reasked:
            return "I would say it is somewhat relevant, perhaps"
        return answer(request)

    return respond


def about(server: ScriptedServer, marker: str) -> int:
    return sum(marker in json.dumps(r.body) for r in server.requests)


def write_rows(path: Path) -> Path:
    rows = [
        {
            "query_id": f"q{q}",
            "query": f"question {q}",
            "engine": "bm25",
            "passages": [
                {"id": f"q{q}-p{p}", "text": f"{MUMBLE if (q, p) == (0, 1) else 'text'} {q} {p}"}
                for p in range(3)
            ],
        }
        for q in range(2)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_a_rerun_with_fresh_pays_no_reasked_passage_again(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    server = make_server(responder=first_mumbles())
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite")
    dataset, out = write_rows(tmp_path / "rows.jsonl"), tmp_path / "out"
    assert main(["run", str(config), str(dataset), "--out", str(out)]) == 0
    assert about(server, MUMBLE) == 2  # the first answer did not parse; its re-ask did
    assert len(server.requests) == 6 + 1
    first = {v.passage_id: v for jq in read_results(out / RESULTS_FILE) for v in jq.verdicts}
    assert first["q0-p1"].status == "ok" and not first["q0-p1"].cached

    assert main(["run", str(config), str(dataset), "--out", str(out), "--fresh"]) == 0
    assert len(server.requests) == 7  # nothing new: the re-asked answer came from the cache
    again = {v.passage_id: v for jq in read_results(out / RESULTS_FILE) for v in jq.verdicts}
    assert again["q0-p1"].status == "ok" and again["q0-p1"].cached
    assert again["q0-p1"].raw == first["q0-p1"].raw
    assert {k: v.label for k, v in again.items()} == {k: v.label for k, v in first.items()}


def test_the_python_api_asks_a_reasked_passage_once_pointwise_and_listwise(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    passages = [f"{MUMBLE} kettles", "teapots", "cups"]
    for mode, marker in (("pointwise", MUMBLE), ("listwise", "teapots")):
        server = make_server(responder=first_mumbles(marker))
        cache = tmp_path / f"{mode}.sqlite"
        labels = []
        for _ in range(2):
            with Judge(
                "local", "judge-model", base_url=server.openai_base_url, cache=cache, mode=mode
            ) as judge:
                jq = judge.judge("kettle?", passages)
            labels.append([v.label for v in jq.verdicts])
            assert all(v.status == "ok" for v in jq.verdicts)
        assert about(server, marker) == 2, mode  # once, and its re-ask once: never again
        assert labels[0] == labels[1]
