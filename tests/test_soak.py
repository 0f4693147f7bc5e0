"""Soak: 5,000 passages against a loopback server whose faults rotate, ``judge run`` stopped
four times and resumed: by SIGTERM, by SIGKILL, by its token budget, then run to the end.

The server's fault changes every 400 requests (a quarter of them fail): 429s, 500s, bodies
that are not JSON, dropped connections, then hung requests (held 30 s, then dropped: a hung
request is never answered). Every well-formed answer is recorded with the invocation that
was running when it was sent. At the end:

- **0 lost**: every passage has exactly one verdict, with its label;
- **0 paid twice**: no request body answered in one invocation is answered again in a later
  one, except those in flight at the SIGKILL (the process died before it could keep them);
  within an invocation, a body answered twice is a hedge and its first request racing
  (the first answer wins, both are paid), and hedges are at most 5% of the requests;
- **the budget held**: the invocation with ``--max-tokens`` stopped on it (exit 4) having been
  billed at most that many tokens by the server;
- **exact accounting**: each summary.json counts as many requests as the server received
  while that invocation ran.
Throughput is measured in bench/bench_faults.py, not here: tests never assert on wall-clock.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from judge.cli.main import main
from judge.data.results import RESULTS_FILE
from tests.servers import (
    DROP,
    MALFORMED,
    Answer,
    Fault,
    Item,
    Recorded,
    ScriptedServer,
    hashed_responder,
)
from tests.test_runner import verdict_labels, write_config, write_dataset

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
QUERIES, PER_QUERY = 500, 10
PASSAGES = QUERIES * PER_QUERY
CEILING = 32  # [run] concurrency: the most requests in flight at the SIGKILL
PHASE, FAULT_RATE = 400, 0.25
HANG = Fault("hang")  # a marker: the responder itself holds the request, then drops it
ROTATION = (Fault("status", 429), Fault("status", 500), MALFORMED, DROP, HANG)
USAGE = (100, 5)  # what each answer bills: exact token counts for the budget
HELD_S = 30.0
EXIT_INCOMPLETE, EXIT_BUDGET = 3, 4


class Rotating:
    """The soak's provider: a fault from the current phase's kind for a quarter of the
    requests (drawn from the arrival number: the same sequence every run), else an answer."""

    def __init__(self) -> None:
        self.inner = hashed_responder()
        self.arrivals = 0
        self.invocation = ""  # which invocation is running, set by the test
        # By request body: the invocations that were answered a well-formed 200 for it.
        self.answered: defaultdict[str, list[str]] = defaultdict(list)
        self.billed: Counter[str] = Counter()  # tokens billed, by invocation
        self.hung = 0
        self._released = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, request: Recorded) -> Item:
        with self._lock:
            n, self.arrivals = self.arrivals, self.arrivals + 1
            invocation = self.invocation
        if random.Random(n).random() < FAULT_RATE:
            fault = ROTATION[(n // PHASE) % len(ROTATION)]
            if fault is not HANG:
                return fault
            with self._lock:
                self.hung += 1
            self._released.wait(HELD_S)
            return DROP
        answer = self.inner(request)
        assert isinstance(answer, Answer)
        body = hashlib.sha256(json.dumps(request.body, sort_keys=True).encode()).hexdigest()
        with self._lock:
            self.answered[body].append(invocation)
            self.billed[invocation] += sum(USAGE)
        return dataclasses.replace(answer, usage=USAGE)

    def release(self) -> None:
        self._released.set()


def _summary(out: Path) -> dict[str, Any]:
    run: dict[str, Any] = json.loads((out / "summary.json").read_text(encoding="utf-8"))["run"]
    return run


def _settled(server: ScriptedServer) -> int:
    """The requests the server has received, once no more are arriving."""
    seen = -1
    while (now := len(server.requests)) != seen:
        seen = now
        time.sleep(0.3)
    return seen


def _run_until(
    rotating: Rotating, command: list[str], answers: int, out: Path, sig: signal.Signals
) -> tuple[int, str]:
    """``judge run`` as a process, sent ``sig`` once ``answers`` well-formed answers were
    given in all (and its results file exists): its exit code and stderr."""
    with subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as proc:
        deadline = time.monotonic() + 150
        while (
            sum(rotating.billed.values()) < answers * sum(USAGE)
            or not (out / RESULTS_FILE).exists()
        ):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the run never got that far"
            time.sleep(0.05)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def test_soak_rotating_faults_two_kills_a_budget_stop_nothing_lost_nothing_paid_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rotating = Rotating()
    with ScriptedServer(responder=rotating, latency=0.01) as server:
        try:
            _soak(rotating, server, tmp_path, capsys)
        finally:
            rotating.release()


def _soak(
    rotating: Rotating,
    server: ScriptedServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Long because it is one story: four invocations, then what they add up to."""
    dataset = write_dataset(tmp_path / "d.jsonl", n_queries=QUERIES, n_passages=PER_QUERY)
    run = {
        "concurrency": CEILING,
        "timeout_s": 5.0,
        "max_attempts": 10,
        "backoff_base_s": 0.01,
        "max_backoff_s": 0.2,
        "history": str(tmp_path / "history.sqlite"),
    }
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite", {"run": run})
    out = tmp_path / "out"
    args = ["run", str(config), str(dataset), "--out", str(out), "--no-charts"]
    command = [sys.executable, "-m", "judge", *args]
    received: dict[str, int] = {}

    def invocation(name: str) -> None:
        _settled(server)
        rotating.invocation = name
        received[name] = len(server.requests)

    def ended(name: str) -> None:
        received[name] = _settled(server) - received[name]

    invocation("sigterm")
    code, err = _run_until(rotating, command, 1200, out, signal.SIGTERM)
    ended("sigterm")
    assert code == EXIT_INCOMPLETE and "Traceback" not in err, err
    assert _summary(out)["stopped_by"] == "interrupted"
    assert _summary(out)["requests"] == received["sigterm"]

    invocation("sigkill")
    code, err = _run_until(rotating, command, 2800, out, signal.SIGKILL)
    ended("sigkill")
    assert code == -signal.SIGKILL

    # The budget caps the run: what run.json's ledger says earlier invocations spent counts
    # (the SIGTERM'd one's, and the SIGKILL'd one's up to its last few seconds).
    ledger = json.loads((out / "run.json").read_text(encoding="utf-8"))["spent"]
    earlier = ledger["prompt_tokens"] + ledger["completion_tokens"]
    assert earlier >= rotating.billed["sigterm"]  # requests lost in flight: their worst case
    cap = earlier + 150_000  # about a third of what is left: the budget stops this one
    invocation("budget")
    assert main([*args, "--max-tokens", str(cap)]) == EXIT_BUDGET
    ended("budget")
    assert "token budget reached" in capsys.readouterr().err
    assert 0 < rotating.billed["budget"] <= cap - earlier
    assert _summary(out)["stopped_by"] == "budget"
    assert _summary(out)["requests"] == received["budget"]

    invocation("last")
    assert main(args) in (0, 1)
    ended("last")
    capsys.readouterr()
    assert _summary(out)["status"] == "complete"
    assert _summary(out)["requests"] == received["last"]

    # Every fault of the rotation was met, hung requests included.
    outcomes = server.outcomes
    assert outcomes["status_429"] and outcomes["status_500"] and outcomes["malformed"]
    assert outcomes["drop"] and rotating.hung

    # 0 lost: one verdict per passage, each with its label.
    labels = verdict_labels(out)
    assert len(labels) == PASSAGES and all(label is not None for label in labels.values())
    results = (out / RESULTS_FILE).read_text(encoding="utf-8").splitlines()
    written = Counter(v["passage_id"] for line in results for v in json.loads(line)["verdicts"])
    assert len(written) == PASSAGES and set(written.values()) == {1}

    # 0 paid twice: an answer given in one invocation is never bought again in a later one,
    # except those in flight when the SIGKILL landed (at most CEILING), each once: in the
    # budget's invocation, or in the last when the budget stopped before their units.
    order = ["sigterm", "sigkill", "budget", "last"]
    again = Counter(
        (first, later)
        for invocations in rotating.answered.values()
        for first, later in itertools.pairwise(invocations)
        if first != later
    )
    assert set(again) <= {("sigkill", "budget"), ("sigkill", "last")}, again
    assert again[("sigkill", "budget")] + again[("sigkill", "last")] <= CEILING
    assert all(order.index(a) <= order.index(b) for a, b in again)
    # Within one invocation a body answered twice is a hedge that raced its first request;
    # hedges are at most 5% of the requests.
    for name in order:
        twice = sum(
            invocations.count(name) - 1
            for invocations in rotating.answered.values()
            if name in invocations
        )
        assert twice <= 0.05 * received[name], (name, twice, received[name])
