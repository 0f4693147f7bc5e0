"""A ``judge run`` that was not running while its request was answered (suspended with
Ctrl-Z and resumed, or starved by a loaded machine) does not abandon that answer at the
deadline that passed meanwhile, and so does not pay for the passage twice. The process is
stopped (SIGSTOP) by the loopback server as the request arrives, past the attempt's deadline,
then continued; the server counts the requests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from judge.data.results import RESULTS_FILE
from tests.servers import Item, Recorded, ScriptedServer
from tests.test_runner import write_config
from tests.wire import hashed_responder

REPO = Path(__file__).resolve().parent.parent
DEADLINE_S = 1.0  # the attempt's deadline (fixed: no p95 to draw it from)
STOPPED_S = 3.0  # how long the run is stopped, from when its request arrives


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state T in /proc; a process already gone: no)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


class _StopOnFirst:
    """Answers every request; before answering the first, stops process :attr:`pid` and has
    it continued :data:`STOPPED_S` later."""

    def __init__(self) -> None:
        self.pid = 0
        self.inner = hashed_responder()
        self.was_stopped = False
        self._once = threading.Lock()
        self._continue: threading.Timer | None = None

    def __call__(self, request: Recorded) -> Item:
        if self._once.acquire(blocking=False):
            os.kill(self.pid, signal.SIGSTOP)
            deadline = time.monotonic() + 10
            while not _stopped(self.pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            self.was_stopped = _stopped(self.pid)
            self._continue = threading.Timer(STOPPED_S, os.kill, (self.pid, signal.SIGCONT))
            self._continue.start()
        return self.inner(request)

    def close(self) -> None:
        if self._continue is not None:
            self._continue.cancel()
        if self.pid:
            with contextlib.suppress(ProcessLookupError):  # already ended and reaped
                os.kill(self.pid, signal.SIGCONT)


def test_an_answer_that_came_while_the_run_was_stopped_is_read_not_paid_again(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    responder = _StopOnFirst()
    server = make_server(responder=responder)
    run = {
        "attempt_timeout_s": DEADLINE_S,
        "timeout_s": 30.0,
        "hedge_share": 0.0,
        "concurrency": 1,
    }
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite", {"run": run})
    row = {
        "query_id": "q0",
        "query": "which kettles boil fastest?",
        "engine": "bm25",
        "passages": [{"id": "p0", "text": "an electric kettle boils a litre in two minutes"}],
    }
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text(json.dumps(row) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "judge", "run", str(config), str(dataset)]
    proc = subprocess.Popen(
        [*command, "--out", str(out)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    responder.pid = proc.pid
    try:
        _, stderr = proc.communicate(timeout=120)
    finally:
        responder.close()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert responder.was_stopped  # the run was stopped past its deadline with the answer sent
    assert proc.returncode == 0, stderr
    assert len(server.requests) == 1  # read when the run went on, not abandoned and asked again
    (line,) = (out / RESULTS_FILE).read_text(encoding="utf-8").splitlines()
    [verdict] = json.loads(line)["verdicts"]
    assert (verdict["status"], verdict["attempts"]) == ("ok", 1)
