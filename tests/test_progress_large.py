"""One query of 3,000 passages: ``judge run`` (a process) shows its progress inside the query,
writes its verdicts as they come (verdicts.partial.jsonl), and a kill at any point loses
nothing paid for: the resumed run pays no passage twice. Through the real openai SDK against
a loopback server that counts every request by passage."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from judge.cli.common import EXIT_INCOMPLETE
from judge.cli.main import main
from judge.data.results import RESULTS_FILE
from judge.run.resume import PARTIAL_FILE
from tests.servers import ScriptedServer
from tests.test_runner import write_config

REPO = Path(__file__).resolve().parent.parent
PASSAGES = 3000
CONCURRENCY = 8
_PASSAGE = re.compile(r"\bP(\d{4})\b")  # however the prompt marks the words
_PROGRESS = re.compile(r"queries (\d+)/1  passages (\d+)/3000")


def _one_huge_query(path: Path) -> Path:
    row = {
        "query_id": "q0",
        "query": "which kettles boil fastest?",
        "engine": "bm25",
        "passages": [
            {"id": f"p{i:04d}", "text": f"passage P{i:04d} about kettles"} for i in range(PASSAGES)
        ],
    }
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    return path


def _asked(server: ScriptedServer) -> Counter[str]:
    """Requests per passage, by the passage's token in the prompt."""
    return Counter(m for r in server.requests for m in _PASSAGE.findall(json.dumps(r.body)))


class _Run:
    """``judge run`` as a process, its stderr read line by line as it comes."""

    def __init__(self, config: Path, dataset: Path, out: Path) -> None:
        command = [sys.executable, "-m", "judge", "run", str(config), str(dataset)]
        self.proc = subprocess.Popen(
            [*command, "--out", str(out)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 120
        try:
            while not ready():
                assert self.proc.poll() is None, ("the run ended first", self.lines[-5:])
                assert time.monotonic() < deadline, f"timed out waiting for {what}"
                time.sleep(0.02)
        except BaseException:  # a failed wait leaves no run behind (nor its pipe)
            self.proc.kill()
            self.end(signal.SIGKILL)
            raise

    def progress(self) -> list[tuple[int, int]]:
        """(queries, passages) of every progress line so far."""
        found = (_PROGRESS.search(line) for line in list(self.lines))
        return [(int(m[1]), int(m[2])) for m in found if m]

    def end(self, sig: signal.Signals) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=120)
        self._reader.join(timeout=10)
        assert self.proc.stderr is not None
        self.proc.stderr.close()
        return code


def _partial(out: Path) -> list[dict[str, object]]:
    path = out / PARTIAL_FILE
    if not path.exists():
        return []
    # A line being appended as it is read is not yet a verdict: whole lines only.
    lines = path.read_bytes().splitlines(keepends=True)
    return [json.loads(line) for line in lines if line.endswith(b"\n")]


def _setup(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> tuple[ScriptedServer, Path, Path, Path]:
    server = make_server(latency=0.01)
    # No hedging and a fixed attempt deadline far beyond any answer's time: a slow call's
    # second request is paid by design (tests/test_hedging.py), and on a loaded machine a
    # loopback answer can take longer than the 1 s a deadline drawn from 10 ms answers gives.
    # Here every request beyond one per passage must be a call in flight at the kill.
    run = {
        "concurrency": CONCURRENCY,
        "progress_interval_s": 0.2,
        "grace_s": 30.0,
        "hedge_share": 0.0,
        "attempt_timeout_s": 30.0,
    }
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite", {"run": run})
    return server, config, _one_huge_query(tmp_path / "rows.jsonl"), tmp_path / "out"


def test_progress_inside_one_query_then_sigterm_and_a_resume_pay_each_passage_once(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    server, config, dataset, out = _setup(make_server, tmp_path)
    run = _Run(config, dataset, out)
    # A progress line counts passages while the only query is still being judged.
    run.wait_for(lambda: any(q == 0 and 0 < p < PASSAGES for q, p in run.progress()), "progress")
    run.wait_for(lambda: server.successes >= 1000, "1,000 answers")
    run.wait_for(lambda: len(_partial(out)) >= 100, "verdicts written as they come")
    assert not (out / RESULTS_FILE).exists() or not (out / RESULTS_FILE).read_bytes()
    assert run.end(signal.SIGTERM) == EXIT_INCOMPLETE, run.lines[-5:]
    served = server.successes
    # The unit in flight ended with its unsent passages as errors, written whole; its partial
    # lines went with it.
    (line,) = (out / RESULTS_FILE).read_text(encoding="utf-8").splitlines()
    statuses = Counter(v["status"] for v in json.loads(line)["verdicts"])
    assert statuses["ok"] == served and statuses["ok"] + statuses["error"] == PASSAGES
    assert not (out / PARTIAL_FILE).exists()
    assert max(run.progress())[1] == PASSAGES  # the final line counts every verdict

    assert main(["run", str(config), str(dataset), "--out", str(out)]) in (0, 1)
    asked = _asked(server)
    assert len(asked) == PASSAGES and set(asked.values()) == {1}  # none paid twice
    (line,) = (out / RESULTS_FILE).read_text(encoding="utf-8").splitlines()
    assert Counter(v["status"] for v in json.loads(line)["verdicts"]) == {"ok": PASSAGES}
    assert not (out / PARTIAL_FILE).exists()


def test_a_kill_mid_query_leaves_the_paid_verdicts_on_disk_and_a_resume_pays_none_again(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    server, config, dataset, out = _setup(make_server, tmp_path)
    run = _Run(config, dataset, out)
    run.wait_for(lambda: len(_partial(out)) >= 1000, "1,000 verdicts written")
    run.end(signal.SIGKILL)
    # Nothing of the unfinished query in verdicts.jsonl; its paid verdicts in the partial file.
    assert not (out / RESULTS_FILE).exists() or not (out / RESULTS_FILE).read_bytes()
    written = _partial(out)
    assert len(written) >= 1000
    assert {(r["query_id"], r["engine"], r["repeat"]) for r in written} == {("q0", "bm25", 0)}
    verdicts = {str(r["verdict"]["passage_id"]): r["verdict"] for r in written}  # type: ignore[index]
    assert len(verdicts) == len(written)
    assert all(v["status"] == "ok" and v["cached"] is False for v in verdicts.values())
    before = _asked(server)
    assert all(before[pid[1:]] == 1 for pid in verdicts)

    assert main(["run", str(config), str(dataset), "--out", str(out)]) in (0, 1)
    asked = _asked(server)
    assert len(asked) == PASSAGES
    # Only the calls in flight at the kill (unanswered, so never cached) are asked again.
    twice = [p for p, n in asked.items() if n > 1]
    assert len(twice) <= CONCURRENCY and all(asked[p] == 2 for p in twice)
    assert not any(f"p{p}" in verdicts for p in twice)
    (line,) = (out / RESULTS_FILE).read_text(encoding="utf-8").splitlines()
    final = {v["passage_id"]: v for v in json.loads(line)["verdicts"]}
    assert len(final) == PASSAGES
    assert all(final[pid]["label"] == v["label"] for pid, v in verdicts.items())
    assert not (out / PARTIAL_FILE).exists()


def test_the_progress_line_counts_passages_never_sent_apart_from_errors() -> None:
    """A stopping run's unsent passages had been counted as errors on the progress line,
    beside a summary that says "0 error, N not sent"."""
    import io

    from judge.calling.caller import Caller
    from judge.errors import NOT_SENT
    from judge.run.progress import Progress
    from judge.schema import Verdict

    shown = Progress(total_units=1, total_passages=3, caller=Caller(None), stream=io.StringIO())
    for i, error in enumerate((f"{NOT_SENT}the run stopped", "HTTP 500")):
        verdict = Verdict(passage_id=str(i), rank=i + 1, status="error", error=error)
        shown.told(("q", "e", 0), verdict)
    assert "  errors 1  not sent 1  " in shown.line()
