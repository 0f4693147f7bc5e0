"""Batch mode (``judge run --batch``) end to end, through the real ``openai`` SDK, against a
loopback server speaking the Files and Batches endpoints (tests/batch_server.py).

Money is counted on the server: uploads, batch creations, status checks, batch lines run
(billed) and real-time chat requests. A batch is submitted once and only once, a rerun after a
kill polls it, what a batch leaves is asked exactly once more, and the results are those a
real-time run gives on the same answers, at half the price.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from judge.cli.main import main
from judge.run.batch_state import LIST_LAG_S
from tests.batch_server import BatchServer
from tests.servers import Item, Recorded, Responder, hashed_responder, listing_responder
from tests.test_runner import verdict_labels, write_config, write_dataset
from tests.wire import Answer, Fault, openai_error

PROMPT, COMPLETION = 100, 10  # tokens every answer reports using
PRICE = {"prompt": 10.0, "completion": 30.0}  # USD per 1M tokens
EACH = (PROMPT * PRICE["prompt"] + COMPLETION * PRICE["completion"]) / 1e6
CHAT = "/v1/chat/completions"
EXIT_BUDGET = 4


def metered(inner: Responder | None = None) -> Responder:
    """``inner`` (default: hashed yes/no) with every answer reporting the same usage."""
    answer = inner or hashed_responder()

    def respond(request: Recorded) -> Item:
        got = answer(request)
        assert isinstance(got, Answer)
        return dataclasses.replace(got, usage=(PROMPT, COMPLETION))

    return respond


@pytest.fixture
def make_batch_server() -> Iterator[Callable[..., BatchServer]]:
    started: list[BatchServer] = []

    def make(**kwargs: Any) -> BatchServer:
        kwargs.setdefault("responder", metered())
        server = BatchServer(**kwargs).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


def _config(
    path: Path,
    server: BatchServer,
    *,
    n_queries: int = 4,
    n_passages: int = 5,
    run: dict[str, Any] | None = None,
    judge: dict[str, Any] | None = None,
    price: dict[str, float] | None = None,
) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    dataset = write_dataset(path / "data.jsonl", n_queries, n_passages)
    fast = {"batch_poll_s": 0.01, "batch_max_poll_s": 0.02}
    return write_config(
        path / "run.toml",
        server,
        path / "cache.sqlite",
        {
            "judge": {"provider": "openai", **(judge or {})},
            "dataset": {"path": str(dataset), "label_scale": "binary"},
            "run": {**fast, **(run or {})},
            'prices."judge-test"': price or PRICE,
        },
    )


def _chats(server: BatchServer) -> list[Recorded]:
    return [r for r in server.requests if r.path == CHAT]


def _summary(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    return data


def _state(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "batch.json").read_text(encoding="utf-8"))
    return data


def _metrics(out: Path) -> dict[str, Any]:
    return {e: d["metrics"] for e, d in _summary(out)["engines"].items()}


@pytest.mark.parametrize(
    ("mode", "repeats", "responder"),
    [("pointwise", 1, hashed_responder()), ("listwise", 2, listing_responder())],
)
def test_a_batch_run_submits_once_costs_half_and_matches_a_realtime_run(
    make_batch_server: Callable[..., BatchServer],
    tmp_path: Path,
    fake_key: str,
    mode: str,
    repeats: int,
    responder: Responder,
) -> None:
    server = make_batch_server(responder=metered(responder), polls_in_progress=3)
    config = _config(tmp_path / "b", server, run={"repeats": repeats}, judge={"mode": mode})
    out = tmp_path / "b" / "out"
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 0
    requests = len(server.executed)
    assert requests == 4 * (5 if mode == "pointwise" else 1) * repeats
    assert (server.calls["upload"], server.calls["create"]) == (1, 1)
    assert server.calls["retrieve"] == 3 + 1  # in progress three times, then done
    assert _chats(server) == []  # every answer came from the batch
    # Collected, its files are deleted at the provider: the input (our passages) and output.
    assert server.calls["delete"] == 2 and server.files == {}
    assert _summary(out)["run"]["cost_usd"] == pytest.approx(requests * EACH / 2)
    assert _summary(out)["run"]["requests"] == 0
    assert sum(b["cost"] for b in _state(out)["batches"]) == pytest.approx(requests * EACH / 2)
    # The key never leaves the environment.
    assert fake_key not in (out / "batch.json").read_text(encoding="utf-8")

    # A real-time run on the same answers: the same verdicts and metrics, at twice the price.
    reference = _config(tmp_path / "r", server, run={"repeats": repeats}, judge={"mode": mode})
    assert main(["run", str(reference), "--out", str(tmp_path / "r" / "out")]) == 0
    assert len(_chats(server)) == requests
    assert verdict_labels(out) == verdict_labels(tmp_path / "r" / "out")
    assert _metrics(out) == _metrics(tmp_path / "r" / "out")
    assert _summary(tmp_path / "r" / "out")["run"]["cost_usd"] == pytest.approx(requests * EACH)

    # Everything cached: a second batch run into a new directory sends nothing at all.
    before = len(server.requests)
    assert main(["run", str(config), "--out", str(tmp_path / "again"), "--batch"]) == 0
    assert len(server.requests) == before
    assert verdict_labels(tmp_path / "again") == verdict_labels(out)


def test_the_budget_holds_the_batch_worst_case_at_batch_prices(
    make_batch_server: Callable[..., BatchServer],
    tmp_path: Path,
    fake_key: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = make_batch_server()
    config = _config(tmp_path, server)
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--batch", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    listed = re.search(r"estimated cost \$(\d+\.\d+)", printed)
    halved = re.search(r"cost \$(\d+\.\d+) at batch prices", printed)
    worst = re.search(r"worst case, \$(\d+\.\d+)", printed)
    assert listed and halved and worst, printed
    assert float(halved.group(1)) == pytest.approx(float(listed.group(1)) / 2, abs=1e-4)
    worst_usd = float(worst.group(1))

    # Below the worst case at batch prices: refused before anything is uploaded.
    cap = f"{worst_usd * 0.9:.4f}"
    assert main(["run", str(config), "--out", str(out), "--batch", "--max-cost", cap]) == 4
    assert "worst case" in capsys.readouterr().err
    assert server.requests == []

    # Above it, though below the same worst case at list price (twice as much): submitted.
    cap = f"{worst_usd * 1.5:.4f}"
    assert main(["run", str(config), "--out", str(out), "--batch", "--max-cost", cap]) == 0
    assert server.calls["create"] == 1
    (record,) = _state(out)["batches"]
    assert record["reserved_cost"] == pytest.approx(worst_usd, rel=1e-3)
    assert record["cost"] == pytest.approx(20 * EACH / 2)


def _killed_while_polling(config: Path, out: Path, server: BatchServer, polls: int) -> None:
    """Run ``judge run --batch`` in a process and SIGKILL it once it has checked its
    recorded batch ``polls`` times."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "judge", "run", str(config), "--out", str(out), "--batch"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while server.calls["retrieve"] < polls:  # recorded and being polled
            assert proc.poll() is None, "judge run ended before it could be killed"
            assert time.monotonic() < deadline, "judge run never polled its batch"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def test_a_killed_run_polls_its_recorded_batch_and_never_submits_it_again(
    make_batch_server: Callable[..., BatchServer],
    tmp_path: Path,
    fake_key: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = make_batch_server(polls_in_progress=10**9)  # never ends until told
    config = _config(tmp_path, server, run={"batch_poll_s": 0.02})
    out = tmp_path / "out"
    _killed_while_polling(config, out, server, 2)
    (record,) = _state(out)["batches"]
    assert record["batch_id"] in server.batches and not record["collected"]
    assert (server.calls["upload"], server.calls["create"]) == (1, 1)

    # Rerun without --batch: refused before any call (it paid all 20 again in real time,
    # while the provider went on to answer, and bill, the batch).
    assert main(["run", str(config), "--out", str(out)]) == 2
    said = capsys.readouterr().err
    assert f"batch {record['batch_id']} may still answer" in said and "--batch" in said, said
    assert _chats(server) == []
    # Nor does --fresh start over past it (the batch would still be billed), dry or not.
    for dry in ([], ["--dry-run"]):
        assert main(["run", str(config), "--out", str(out), "--fresh", *dry]) == 2
        assert "may still answer" in capsys.readouterr().err
    assert _chats(server) == [] and (out / "batch.json").is_file()

    server.polls_in_progress = 0  # the provider finishes it
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 0
    assert (server.calls["upload"], server.calls["create"]) == (1, 1)  # polled, not resubmitted
    assert len(server.executed) == 20 and _chats(server) == []
    assert len(verdict_labels(out)) == 20
    assert _summary(out)["run"]["cost_usd"] == pytest.approx(20 * EACH / 2)


def test_answers_a_changed_run_no_longer_needs_are_kept_not_thrown_away(
    make_batch_server: Callable[..., BatchServer], tmp_path: Path, fake_key: str
) -> None:
    """The batch of 20 was paid for; the run collecting it now judges 2 of the 4 queries
    (its dataset cut meanwhile). The 10 answers it does not need are kept in the cache: the
    full dataset judged later pays nothing (it paid all 10 again in real time)."""
    server = make_batch_server(polls_in_progress=10**9)
    config = _config(tmp_path, server, run={"batch_poll_s": 0.02})
    out = tmp_path / "out"
    _killed_while_polling(config, out, server, 2)
    write_dataset(tmp_path / "data.jsonl", 2, 5)  # the dataset cut to its first 2 queries
    server.polls_in_progress = 0
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 0
    assert len(server.executed) == 20 and len(verdict_labels(out)) == 10
    write_dataset(tmp_path / "data.jsonl", 4, 5)
    assert main(["run", str(config), "--out", str(tmp_path / "whole")]) == 0
    assert _chats(server) == [] and len(verdict_labels(tmp_path / "whole")) == 20


def _killed_during_create(server: BatchServer, config: Path, out: Path) -> None:
    """Run ``judge run --batch`` in a process and kill it while its create is held."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "judge", "run", str(config), "--out", str(out), "--batch"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        held = server.hold_create
        while not any(r.method == "POST" and r.path == "/v1/batches" for r in server.requests) or (
            held == "after" and not server.batches
        ):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    server.release()


@pytest.mark.parametrize("made", [True, False])
def test_a_run_killed_while_creating_adopts_the_batch_or_starts_it_once(
    make_batch_server: Callable[..., BatchServer], tmp_path: Path, fake_key: str, made: bool
) -> None:
    server = make_batch_server(hold_create="after" if made else "before")
    config = _config(tmp_path, server)
    out = tmp_path / "out"
    _killed_during_create(server, config, out)
    (record,) = _state(out)["batches"]
    assert record["input_file_id"] in server.files and record["batch_id"] is None
    assert len(server.batches) == (1 if made else 0)
    if not made:  # its fate unknown: looked for, never created again, while a list may lag
        assert main(["run", str(config), "--out", str(out), "--batch"]) == 3
        assert server.calls["create"] == 0 and server.calls["upload"] == 1
        _age_creates(out)  # ... and taken as never made once it would have shown
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 0
    assert len(server.batches) == 1  # never two batches for one run
    # Made: found and polled. Not made: nothing was started, so the requests went again.
    assert server.calls["upload"] == (1 if made else 2)
    assert server.calls["create"] == 1
    assert len(server.executed) == 20 and _chats(server) == []
    (record,) = _state(out)["batches"]
    assert record["collected"] and record["answered"] == 20


def _age_creates(out: Path) -> None:
    """Date batch.json's creates sent back by LIST_LAG_S, as if that long had passed."""
    state = _state(out)
    for record in state["batches"]:
        if record["create_sent"] is not None:
            record["create_sent"] -= LIST_LAG_S
    (out / "batch.json").write_text(json.dumps(state), encoding="utf-8")


def test_a_create_whose_answer_is_lost_is_found_not_made_twice(
    make_batch_server: Callable[..., BatchServer], tmp_path: Path, fake_key: str
) -> None:
    server = make_batch_server(lose_create_answers=1)
    config = _config(tmp_path, server, run={"backoff_base_s": 0.01})
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--batch"]) == 0
    assert len(server.batches) == 1 and server.calls["create"] == 1
    assert server.calls["list"] == 2  # looked for before each create attempt
    assert len(server.executed) == 20 and _chats(server) == []


def test_a_provider_unreachable_while_polling_leaves_the_run_incomplete_and_resumable(
    make_batch_server: Callable[..., BatchServer],
    tmp_path: Path,
    fake_key: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = make_batch_server(fail_retrieves=2)
    config = _config(tmp_path, server, run={"max_attempts": 2, "backoff_base_s": 0.01})
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 3
    err = capsys.readouterr().err
    assert "rerun the same command to keep waiting" in err and "Traceback" not in err
    assert server.calls["retrieve"] == 2 and not (out / "verdicts.jsonl").exists()
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 0
    assert (server.calls["upload"], server.calls["create"]) == (1, 1)
    assert len(server.executed) == 20 and _chats(server) == []


def test_a_damaged_batch_record_is_one_line_and_nothing_is_sent(
    make_batch_server: Callable[..., BatchServer],
    tmp_path: Path,
    fake_key: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = make_batch_server()
    config = _config(tmp_path, server)
    out = tmp_path / "out"
    out.mkdir()
    (out / "batch.json").write_text('{"provider": {"kind": "openai"}, "model": 3}', "utf-8")
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "batch.json: field 'model'" in err[0]
    assert server.requests == []


def _about(*passages: str) -> Callable[[Recorded], bool]:
    """Whether a request judges one of ``passages`` ("q<q>-p<p>", by its text: a pointwise
    prompt does not show the passage's id; see write_dataset)."""
    texts = ["text {1} answering question {0}".format(*p[1:].split("-p")) for p in passages]
    return lambda r: any(f"\n{t}\n" in r.prompt for t in texts)


def test_failed_lines_are_asked_again_in_real_time_and_only_they(
    make_batch_server: Callable[..., BatchServer], tmp_path: Path, fake_key: str
) -> None:
    failing = ("q0-p1", "q2-p3", "q3-p0")
    server = make_batch_server(fail_when=_about(*failing))
    config = _config(tmp_path, server)
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 0
    chats = _chats(server)
    assert sorted(p for r in chats for p in failing if _about(p)(r)) == sorted(failing)
    assert len(chats) == len(failing)
    (record,) = _state(out)["batches"]
    assert record["answered"] == 17
    assert {x["reason"] for x in record["leftovers"].values()} == {"failed"}
    labels = verdict_labels(out)
    assert len(labels) == 20 and None not in labels.values()
    # 17 answers at batch prices; the 3 failed lines are not billed; 3 real-time calls are.
    assert _summary(out)["run"]["cost_usd"] == pytest.approx(17 * EACH / 2 + 3 * EACH)
    assert _summary(out)["run"]["requests"] == 3


def test_repeated_output_lines_count_once_and_usage_not_a_count_is_the_worst_case(
    make_batch_server: Callable[..., BatchServer],
    tmp_path: Path,
    fake_key: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A batch output that repeats lines is counted once a custom id (it said 25 of 20
    answered, and billed 25); answers whose token counts are not counts are counted at their
    share of the reserved worst case (a negative count made the batch free, and gave the
    real-time follow-up the whole budget)."""
    inner = metered()

    def negative(request: Recorded) -> Item:
        answer = inner(request)
        assert isinstance(answer, Answer)
        return dataclasses.replace(answer, usage=(-100_000, -5))

    server = make_batch_server(batch_responder=negative, repeat_lines=5)
    config = _config(tmp_path, server)
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 0
    (record,) = _state(out)["batches"]
    assert record["answered"] == 20
    assert record["usage"]["prompt_tokens"] >= record["reserved"]["prompt_tokens"] > 0
    assert record["cost"] == pytest.approx(record["reserved_cost"], rel=0.01)
    assert _summary(out)["run"]["cost_usd"] == pytest.approx(record["cost"])
    assert "repeat a custom_id" in caplog.text and "not a count" in caplog.text
    assert _chats(server) == []


def _garbled(*passages: str) -> Responder:
    """Answers that do not parse for ``passages``, the hashed judge's for the rest."""
    good, bad = metered(), _about(*passages)

    def respond(request: Recorded) -> Item:
        return (
            Answer("I would rather not say.", usage=(PROMPT, COMPLETION))
            if bad(request)
            else good(request)
        )

    return respond


def test_unparsed_answers_are_re_asked_in_real_time_as_a_live_run_would(
    make_batch_server: Callable[..., BatchServer], tmp_path: Path, fake_key: str
) -> None:
    garbled = ("q1-p2", "q3-p4")
    server = make_batch_server(batch_responder=_garbled(*garbled))
    config = _config(tmp_path, server)
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 0
    chats = _chats(server)
    assert len(chats) == len(garbled)
    for chat in chats:  # the live re-ask: first prompt, the bad answer, what was wrong
        roles = [m["role"] for m in chat.messages]
        assert roles[-2:] == ["assistant", "user"]
        assert chat.messages[-2]["content"] == "I would rather not say."
    labels = verdict_labels(out)
    assert len(labels) == 20 and None not in labels.values()

    before = len(server.requests)
    assert main(["run", str(config), "--out", str(tmp_path / "again"), "--batch"]) == 0
    assert len(server.requests) == before  # the re-asks' answers are cached too
    assert verdict_labels(tmp_path / "again") == labels


def test_a_follow_up_batch_takes_what_the_first_left(
    make_batch_server: Callable[..., BatchServer], tmp_path: Path, fake_key: str
) -> None:
    seen: set[str] = set()

    def first_time(request: Recorded) -> bool:  # fails once per request, then answers
        digest = json.dumps(request.body, sort_keys=True)
        failed = _about("q0-p0", "q1-p1")(request) and digest not in seen
        seen.add(digest)
        return failed

    server = make_batch_server(batch_responder=_garbled("q2-p2"), fail_when=first_time)
    config = _config(tmp_path, server, run={"batch_followup": "batch"})
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 0
    first, follow = _state(out)["batches"]
    assert (first["round"], follow["round"]) == (0, 1)
    assert len(follow["custom_ids"]) == 3  # two failed lines again, one re-ask
    assert len(follow["answers"]) == 1  # the re-ask, answering a first-round request
    # Both batches answered everything between them: nothing was asked in real time.
    assert (server.calls["create"], _chats(server)) == (2, [])
    assert len(server.executed) == 18 + 3  # billed: two lines failed the first time
    labels = verdict_labels(out)
    assert len(labels) == 20 and None not in labels.values()
    assert _summary(out)["run"]["cost_usd"] == pytest.approx(21 * EACH / 2)


def test_an_expired_batch_keeps_its_answers_and_the_rest_are_asked_once(
    make_batch_server: Callable[..., BatchServer], tmp_path: Path, fake_key: str
) -> None:
    server = make_batch_server(expire_after=12)
    config = _config(tmp_path, server)
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 0
    (record,) = _state(out)["batches"]
    assert record["status"] == "expired" and record["answered"] == 12
    assert {x["reason"] for x in record["leftovers"].values()} == {"expired"}
    assert len(server.executed) == 12 and len(_chats(server)) == 8
    assert _summary(out)["run"]["cost_usd"] == pytest.approx(12 * EACH / 2 + 8 * EACH)
    assert len(verdict_labels(out)) == 20


def test_a_failed_batch_is_said_and_its_requests_asked_in_real_time(
    make_batch_server: Callable[..., BatchServer],
    tmp_path: Path,
    fake_key: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = make_batch_server(fail_batch="model judge-test does not support batch")
    config = _config(tmp_path, server)
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 0
    (record,) = _state(out)["batches"]
    assert record["status"] == "failed" and record["cost"] == 0
    assert all("does not support batch" in x["detail"] for x in record["leftovers"].values())
    assert server.executed == [] and len(_chats(server)) == 20
    assert "failed (model judge-test does not support batch" in caplog.text


def test_batch_status_and_cancel_work_from_the_run_directory(
    make_batch_server: Callable[..., BatchServer],
    tmp_path: Path,
    fake_key: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = make_batch_server(polls_in_progress=10**9, answer_before_cancel=5)
    config = _config(tmp_path, server, run={"batch_poll_s": 0.02})
    out = tmp_path / "out"
    _killed_while_polling(config, out, server, 1)
    capsys.readouterr()
    assert main(["batch", "status", str(out)]) == 0
    shown = capsys.readouterr().out
    (record,) = _state(out)["batches"]
    assert record["batch_id"] in shown and "in_progress" in shown and "20 requests" in shown

    assert main(["batch", "cancel", str(out)]) == 0
    assert server.calls["cancel"] == 1
    assert "cancelling" in capsys.readouterr().out
    # The next run reads what the batch answered before the cancel; the rest in real time.
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 0
    assert server.calls["create"] == 1
    assert len(server.executed) == 5 and len(_chats(server)) == 15
    (record,) = _state(out)["batches"]
    assert record["status"] == "cancelled" and record["answered"] == 5
    assert main(["batch", "cancel", str(out)]) == 0  # nothing left in flight
    assert server.calls["cancel"] == 1


@pytest.mark.parametrize(
    ("provider", "why"),
    [("dashscope", "compatible mode"), ("local", "vLLM"), ("embedded", "this machine")],
)
def test_providers_without_a_batch_api_are_refused_before_anything_is_sent(
    make_batch_server: Callable[..., BatchServer],
    tmp_path: Path,
    fake_key: str,
    capsys: pytest.CaptureFixture[str],
    provider: str,
    why: str,
) -> None:
    server = make_batch_server()
    config = _config(tmp_path, server, judge={"provider": provider})
    for extra in ([], ["--dry-run"]):
        code = main(["run", str(config), "--out", str(tmp_path / "out"), "--batch", *extra])
        err = capsys.readouterr().err
        assert code == 2
        assert "has no Batch API" in err and why in err and "Traceback" not in err
    assert server.requests == []
    assert not (tmp_path / "out" / "batch.json").exists()


def test_explicit_batch_prices_are_what_the_dry_run_and_the_run_charge(
    make_batch_server: Callable[..., BatchServer],
    tmp_path: Path,
    fake_key: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = make_batch_server()
    price = {**PRICE, "batch_prompt": 2.0, "batch_completion": 6.0}  # a fifth, not half
    config = _config(tmp_path, server, price=price)
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    listed = re.search(r"estimated cost \$(\d+\.\d+)", printed)
    batched = re.search(r"cost \$(\d+\.\d+) at batch prices \(with --batch\)", printed)
    assert listed and batched, printed
    assert float(batched.group(1)) == pytest.approx(float(listed.group(1)) / 5, abs=1e-4)
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 0
    assert _summary(out)["run"]["cost_usd"] == pytest.approx(20 * EACH / 5)


def test_files_the_provider_will_not_delete_are_named_and_the_run_still_ends_well(
    make_batch_server: Callable[..., BatchServer],
    tmp_path: Path,
    fake_key: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = make_batch_server(responder=metered(hashed_responder()), refuse_deletes=True)
    config = _config(tmp_path, server)
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--batch"]) == 0
    assert server.calls["delete"] == 2 and len(server.files) == 2  # input and output, kept
    for file_id in server.files:
        assert f"{file_id} was left at the provider (delete it there)" in caplog.text
    assert _chats(server) == []  # the answers were stored before the deletes were tried


def test_the_dry_run_prices_batch_only_where_the_provider_has_one_and_gives_a_ceiling(
    make_batch_server: Callable[..., BatchServer],
    tmp_path: Path,
    fake_key: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A local server has no Batch API: its dry run does not advertise --batch. Both name the
    verdict calls' ceiling, every answer at max_tokens, above the estimate."""
    server = make_batch_server()
    for provider, batch in (("openai", True), ("local", False)):
        config = _config(tmp_path / provider, server, judge={"provider": provider})
        out = tmp_path / provider / "out"
        assert main(["run", str(config), "--out", str(out), "--dry-run"]) == 0
        printed = capsys.readouterr().out
        assert ("batch mode:" in printed) == batch, printed
        estimate = re.search(r"estimated cost \$(\d+\.\d+)", printed)
        ceiling = re.search(r"verdict calls at most \$(\d+\.\d+) if every answer ran", printed)
        assert estimate and ceiling, printed
        assert float(ceiling.group(1)) > float(estimate.group(1))


def test_a_recorded_batch_the_provider_does_not_know_is_said_and_can_be_given_up(
    make_batch_server: Callable[..., BatchServer],
    tmp_path: Path,
    fake_key: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A batch deleted at the provider (or asked for with another key) answers 404: the run
    says so and how to give it up, not "rerun to keep waiting" forever; `judge batch cancel`
    gives it up, and the next run asks its requests again, once."""
    server = make_batch_server(polls_in_progress=10**9)
    config = _config(tmp_path, server, run={"batch_poll_s": 0.02})
    out = tmp_path / "out"
    _killed_while_polling(config, out, server, 2)
    server.batches.clear()  # deleted at the provider
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 3
    said = capsys.readouterr().err
    assert "the provider does not know it" in said and "judge batch cancel" in said, said
    assert "keep waiting" not in said
    assert main(["batch", "cancel", str(out)]) == 0
    assert "given up" in capsys.readouterr().out
    (record,) = _state(out)["batches"]
    assert record["collected"] and len(record["leftovers"]) == 20
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 0
    assert len(_chats(server)) == 20  # asked again in real time (batch_followup), once each
    assert len(verdict_labels(out)) == 20


def test_ctrl_c_while_a_batch_is_polled_ends_the_run_at_once_resumable(
    make_batch_server: Callable[..., BatchServer], tmp_path: Path, fake_key: str
) -> None:
    """Ctrl-C while the recorded batch is polled ends the run (exit 3), the batch kept in
    batch.json for the rerun: it is not held for after the polling, which may take hours."""
    server = make_batch_server(polls_in_progress=10**9)
    config = _config(tmp_path, server, run={"batch_poll_s": 0.02})
    out = tmp_path / "out"
    command = [sys.executable, "-m", "judge", "run", str(config), "--out", str(out), "--batch"]
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        deadline = time.monotonic() + 60
        while server.calls["retrieve"] < 2:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError("Ctrl-C did not end the polling") from None
    assert proc.returncode == 3, err
    assert b"interrupted" in err and b"Traceback" not in err
    (record,) = _state(out)["batches"]
    assert record["batch_id"] in server.batches and not record["collected"]


@pytest.mark.parametrize("reask", [True, False])
def test_a_batch_answer_that_never_parses_is_paid_once_as_in_a_live_run(
    make_batch_server: Callable[..., BatchServer], tmp_path: Path, fake_key: str, reask: bool
) -> None:
    """An unreadable batch answer had not been cached: the run bought the first-round answer
    again in real time (and, re-asking, the re-ask twice). Kept, it is read and re-asked
    from as a live run would: one re-ask each, or none without re-asks."""
    garbled = ("q1-p2", "q3-p4")
    server = make_batch_server(responder=_garbled(*garbled), batch_responder=_garbled(*garbled))
    config = _config(tmp_path, server, judge={"reask": reask})
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--batch"]) in (0, 1)
    chats = _chats(server)
    assert len(chats) == (len(garbled) if reask else 0)
    assert all(c.messages[-2]["content"] == "I would rather not say." for c in chats)
    bodies = [json.dumps(c.body, sort_keys=True) for c in chats]
    assert len(set(bodies)) == len(bodies)  # nothing asked twice
    rows = [json.loads(line) for line in (out / "verdicts.jsonl").read_text().splitlines()]
    unparsed = [v for r in rows for v in r["verdicts"] if v["status"] == "unparsed"]
    assert len(unparsed) == (0 if reask else len(garbled))  # the re-ask reads here
    before = len(server.requests)
    assert main(["run", str(config), "--out", str(tmp_path / "again"), "--batch"]) in (0, 1)
    assert len(server.requests) == before  # every answer, read or not, is in the cache


def test_an_output_line_for_a_request_never_sent_is_not_stored(
    make_batch_server: Callable[..., BatchServer],
    tmp_path: Path,
    fake_key: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A line whose custom_id the batch never held had been stored in the cache under that
    id, unread: an answer to nothing, served to any request that id ever named."""
    server = make_batch_server(foreign_lines=2)
    config = _config(tmp_path, server)
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--batch"]) == 0
    assert "2 output lines answer a custom_id the batch never held" in caplog.text
    from judge.calling.cache import Cache

    cache = Cache(tmp_path / "cache.sqlite")
    try:
        assert not cache.contains("never-sent-0") and not cache.contains("never-sent-1")
    finally:
        cache.close()
    assert _chats(server) == []


def test_a_batch_made_before_a_busy_organisations_hundred_others_is_still_found(
    make_batch_server: Callable[..., BatchServer], tmp_path: Path, fake_key: str
) -> None:
    """Killed after its create made the batch, the run looks for it on rerun: 150 batches
    made since by others had pushed it off the list's first page, and it was made again."""
    server = make_batch_server(hold_create="after")
    config = _config(tmp_path, server)
    out = tmp_path / "out"
    _killed_during_create(server, config, out)
    (ours,) = server.batches
    view = server.batches[ours]["view"]
    for n in range(150):  # others' batches, newer than ours
        other = {**view, "id": f"batch_other{n}", "input_file_id": f"file-other{n}"}
        other["created_at"] = view["created_at"] + 1 + n
        server.batches[other["id"]] = {"view": other, "lines": [], "polls": 0, "cancel": False}
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 0
    assert server.calls["create"] == 1 and server.calls["upload"] == 1
    assert len(server.executed) == 20 and _chats(server) == []
    (record,) = _state(out)["batches"]
    assert record["batch_id"] == ours and record["collected"]


def test_answers_a_batch_gave_that_the_cache_no_longer_holds_are_batched_again(
    make_batch_server: Callable[..., BatchServer], tmp_path: Path, fake_key: str
) -> None:
    """Rerun with --fresh and another cache, the directory's collected batch had counted as
    asking them: nothing was batched, and every request went in real time at list price."""
    server = make_batch_server()
    config = _config(tmp_path, server)
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 0
    assert len(server.executed) == 20 and _chats(server) == []
    other = ["--cache", str(tmp_path / "other.sqlite")]
    assert main(["run", str(config), "--out", str(out), "--batch", "--fresh", *other]) == 0
    assert len(server.executed) == 40 and _chats(server) == []  # batched again, at half price
    assert server.calls["create"] == 2
    assert len(verdict_labels(out)) == 20


def test_billed_lines_without_a_readable_answer_count_at_their_worst_case(
    make_batch_server: Callable[..., BatchServer],
    tmp_path: Path,
    fake_key: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two output lines ran (billed) with a 200 body that is no chat completion: they had
    counted nothing, so the batch's spend was short of its bill. Each counts its share of
    the batch's worst case, and is asked again."""
    server = make_batch_server(garble_lines=2)
    config = _config(tmp_path, server)
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 0
    (record,) = _state(out)["batches"]
    share = -(-record["reserved"]["prompt_tokens"] // 20)
    assert record["usage"]["prompt_tokens"] == 18 * PROMPT + 2 * share
    assert "2 output lines ran (billed) but hold no readable answer" in caplog.text
    assert len(_chats(server)) == 2 and len(verdict_labels(out)) == 20


def _worst_usd(config: Path, out: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> float:
    """The dry run's worst case for ``config`` into ``out`` (with ``flags``)."""
    assert main(["run", str(config), "--out", str(out), "--dry-run", *flags]) == 0
    printed = capsys.readouterr().out
    found = re.search(r"worst case, \$(\d+\.\d+)", printed)
    assert found, printed
    return float(found.group(1))


def test_what_batches_spent_counts_against_the_budget_of_a_later_real_time_run(
    make_batch_server: Callable[..., BatchServer],
    tmp_path: Path,
    fake_key: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = make_batch_server()
    config = _config(tmp_path, server)
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 0
    batch_cost = 20 * EACH / 2
    assert _summary(out)["run"]["cost_usd"] == pytest.approx(batch_cost)
    # The same run asked again in real time (another cache, so nothing is free): a cap that
    # holds a few requests' worst case (prompt bound and max_tokens 512), but not beside the
    # batch's tokens, pays nothing.
    again = _config(tmp_path / "again", server)
    cap = str(20 * (PROMPT + COMPLETION) + 500)
    assert main(["run", str(again), "--out", str(out), "--fresh", "--max-tokens", cap]) == 4
    assert "earlier invocations of this run" in capsys.readouterr().err
    assert _chats(server) == []
    # The dry run says what the directory spent, the batch's tokens included.
    assert main(["run", str(again), "--out", str(out), "--fresh", "--dry-run"]) == 0
    assert f"earlier invocations of this run spent {20 * (PROMPT + COMPLETION)} tokens" in (
        capsys.readouterr().out
    )


def test_what_real_time_runs_spent_counts_against_the_budget_of_a_later_batch(
    make_batch_server: Callable[..., BatchServer],
    tmp_path: Path,
    fake_key: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = make_batch_server()
    config = _config(tmp_path, server)
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == 0
    assert len(_chats(server)) == 20
    spent = 20 * EACH
    # Again as a batch, from another cache: its worst case fits the cap alone, not beside
    # what the real-time run spent. Refused before anything is uploaded.
    again = _config(tmp_path / "again", server)
    worst = _worst_usd(again, tmp_path / "elsewhere", capsys, "--batch")
    cap = f"{worst + spent / 2:.6f}"
    args = ["run", str(again), "--out", str(out), "--fresh", "--batch", "--max-cost", cap]
    assert main(args) == 4
    assert "worst case" in capsys.readouterr().err
    assert server.calls["upload"] == 0 and server.calls["create"] == 0
    # With room for both, the batch runs and the ledger keeps what it spent beside the rest.
    args[-1] = f"{worst + spent * 1.01:.6f}"
    assert main(args) == 0
    ledger = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert ledger["spent"] == {"prompt_tokens": 20 * PROMPT, "completion_tokens": 20 * COMPLETION}
    (batch,) = _state(out)["batches"]
    assert batch["usage"] == {"prompt_tokens": 20 * PROMPT, "completion_tokens": 20 * COMPLETION}


def test_a_create_whose_answer_is_lost_and_that_the_list_shows_late_is_never_made_twice(
    make_batch_server: Callable[..., BatchServer], tmp_path: Path, fake_key: str
) -> None:
    # The create makes the batch but answers 500; the next list does not show it yet.
    server = make_batch_server(lose_create_answers=1, list_lag=1)
    config = _config(tmp_path, server, run={"backoff_base_s": 0.01})
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--batch"]) == 0
    assert len(server.batches) == 1 and server.calls["create"] == 1
    assert server.calls["list"] == 3  # before the create, then until it showed
    assert len(server.executed) == 20 and _chats(server) == []


def test_a_batch_that_may_exist_but_never_shows_leaves_the_run_incomplete_not_made_twice(
    make_batch_server: Callable[..., BatchServer],
    tmp_path: Path,
    fake_key: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    attempts = 3
    server = make_batch_server(lose_create_answers=1, list_lag=attempts)
    config = _config(tmp_path, server, run={"backoff_base_s": 0.01, "max_attempts": attempts})
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 3
    err = capsys.readouterr().err
    assert "lists no batch made from it yet" in err and "rerun" in err and "Traceback" not in err
    assert len(server.batches) == 1 and server.calls["create"] == 1
    assert _chats(server) == []
    assert _state(out)["batches"][0]["status"] == "maybe made"
    # A rerun looks for it first; not listed yet, it ends the same way (never creating).
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 3
    assert "rerun in a few minutes" in capsys.readouterr().err
    assert len(server.batches) == 1 and server.calls["create"] == 1
    # The next finds it and polls it: still one batch, one create.
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 0
    assert len(server.batches) == 1 and server.calls["create"] == 1 and server.calls["upload"] == 1
    assert len(server.executed) == 20 and _chats(server) == []


def test_a_maybe_made_batch_is_never_made_again_while_the_list_lags_nor_when_it_fails(
    make_batch_server: Callable[..., BatchServer], tmp_path: Path, fake_key: str
) -> None:
    server = make_batch_server(lose_create_answers=1, list_lag=10)  # made; listed late
    config = _config(tmp_path, server, run={"backoff_base_s": 0.01, "max_attempts": 2})
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 3
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 3  # still not listed
    assert len(server.batches) == 1 and server.calls["create"] == 1
    # The provider unreachable on the next rerun: the record is kept, not taken as never made.
    real_list = server._list
    server._list = lambda target: (503, openai_error(503))  # type: ignore[method-assign]
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 3
    assert _state(out)["batches"][0]["status"] == "maybe made"
    # So a run without --batch is still refused: the batch may answer, and bill.
    server._list = real_list  # type: ignore[method-assign]
    assert main(["run", str(config), "--out", str(out)]) == 2
    assert _chats(server) == [] and len(server.batches) == 1


def test_batch_status_and_cancel_look_up_a_batch_whose_create_answer_never_came(
    make_batch_server: Callable[..., BatchServer],
    tmp_path: Path,
    fake_key: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = make_batch_server(lose_create_answers=1, list_lag=2)
    config = _config(tmp_path, server, run={"backoff_base_s": 0.01, "max_attempts": 2})
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 3
    (made,) = server.batches
    capsys.readouterr()
    assert main(["batch", "status", str(out)]) == 0  # not listed yet (one list call)
    assert "its create's answer never came" in capsys.readouterr().out
    assert main(["batch", "cancel", str(out)]) == 0  # listed now: found, and cancelled
    printed = capsys.readouterr().out
    assert server.calls["cancel"] == 1 and made in printed
    assert _state(out)["batches"][0]["batch_id"] == made


def test_cancel_gives_up_a_maybe_made_batch_the_provider_never_lists(
    make_batch_server: Callable[..., BatchServer],
    tmp_path: Path,
    fake_key: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = make_batch_server(hold_create="before")  # the create never makes it
    config = _config(tmp_path, server)
    out = tmp_path / "out"
    _killed_during_create(server, config, out)
    assert server.batches == {} and _state(out)["batches"][0]["status"] == "maybe made"
    assert main(["batch", "cancel", str(out)]) == 0
    assert "given up" in capsys.readouterr().out and server.calls["cancel"] == 0
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 0  # asked again
    assert len(server.batches) == 1 and len(server.executed) == 20


def test_a_run_killed_while_its_create_is_in_flight_never_creates_twice_when_the_list_lags(
    make_batch_server: Callable[..., BatchServer], tmp_path: Path, fake_key: str
) -> None:
    server = make_batch_server(hold_create="after", list_lag=1)
    config = _config(tmp_path, server, run={"backoff_base_s": 0.01})
    out = tmp_path / "out"
    _killed_during_create(server, config, out)  # made; the client never heard so
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 3  # not listed yet
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 0
    assert len(server.batches) == 1 and server.calls["create"] == 1
    assert len(server.executed) == 20 and _chats(server) == []


def test_ctrl_c_during_the_batch_phase_re_asks_keeps_what_they_spent_in_the_ledger(
    make_batch_server: Callable[..., BatchServer], tmp_path: Path, fake_key: str
) -> None:
    good, seen = metered(), []

    def realtime(request: Recorded) -> Item:  # the first re-ask answers; the second hangs
        seen.append(request)
        return good(request) if len(seen) == 1 else Fault("hang", seconds=60)

    server = make_batch_server(responder=realtime, batch_responder=_garbled("q1-p2", "q3-p4"))
    config = _config(tmp_path, server, run={"hedge_share": 0.0, "concurrency": 1})
    out = tmp_path / "out"
    command = [sys.executable, "-m", "judge", "run", str(config), "--out", str(out), "--batch"]
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        deadline = time.monotonic() + 60
        while len(seen) < 2:  # one re-ask answered, the other in flight
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    assert proc.returncode == 3
    ledger = json.loads((out / "run.json").read_text(encoding="utf-8"))
    # The answered re-ask at least, and the one in flight at its worst case: "at most".
    assert ledger["spent"]["prompt_tokens"] > PROMPT and ledger["spent_at_most"]


def test_a_budget_stop_after_the_batch_names_the_batch_as_what_was_spent_before(
    make_batch_server: Callable[..., BatchServer],
    tmp_path: Path,
    fake_key: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def huge(request: Recorded) -> Item:  # real-time answers use a lot: the run stops
        got = metered()(request)
        assert isinstance(got, Answer)
        return dataclasses.replace(got, usage=(200_000, 10))

    server = make_batch_server(
        responder=huge, batch_responder=metered(), fail_when=_about("q0-p1", "q2-p3", "q3-p0")
    )
    config = _config(tmp_path, server, run={"concurrency": 1, "hedge_share": 0.0})
    out = tmp_path / "out"  # a new directory: its first invocation
    worst = _worst_usd(config, tmp_path / "elsewhere", capsys, "--batch")
    args = ["run", str(config), "--out", str(out), "--batch", "--max-cost", f"{worst + 0.05:.6f}"]
    assert main(args) == 4
    err = capsys.readouterr().err
    assert "of it by this run's batches)" in err and "earlier invocations" not in err


def test_a_batch_record_that_is_not_utf8_is_one_line_for_status_cancel_and_run(
    make_batch_server: Callable[..., BatchServer],
    tmp_path: Path,
    fake_key: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = make_batch_server()
    config = _config(tmp_path, server)
    out = tmp_path / "out"
    out.mkdir()
    (out / "batch.json").write_bytes(b"\xff\xfe\x00{garbage")
    for argv in (["batch", "status", str(out)], ["batch", "cancel", str(out)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "batch.json: byte 0: not UTF-8" in err and "Traceback" not in err
    assert main(["run", str(config), "--out", str(out), "--batch"]) == 2
    assert server.requests == []
