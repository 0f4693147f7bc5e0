"""``judge run`` end to end against loopback servers: resume after kill -9, cache reuse,
repeats and flips, shared passages, budget and dry run, config fingerprints.

The CLI runs in-process through judge.cli.main, except where a process must be killed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from judge.cli.main import main
from judge.data.datasets import read_results
from judge.data.results import RESULTS_FILE
from tests.servers import (
    WEB_PAGE,
    Fault,
    Item,
    Recorded,
    ScriptedServer,
    hashed_responder,
    random_responder,
)

SAMPLE = Path(__file__).resolve().parent.parent / "datasets" / "sample.jsonl"
Key = tuple[str, str, int, str]  # (query_id, engine, repeat, passage_id)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def write_config(
    path: Path,
    server: ScriptedServer,
    cache: Path,
    tables: dict[str, dict[str, Any]] | None = None,
) -> Path:
    """A TOML config for ``server``; ``tables`` (by TOML header) add to or override keys."""
    sections: dict[str, dict[str, Any]] = {
        "judge": {"provider": "local", "model": "judge-test", "scale": "binary"},
        "provider": {"base_url": server.openai_base_url},
        "dataset": {"path": str(SAMPLE), "label_scale": "graded"},
        "run": {"cache": str(cache), "timeout_s": 5.0, "backoff_base_s": 0.01, "concurrency": 4},
    }
    for name, values in (tables or {}).items():
        sections[name] = {**sections.get(name, {}), **values}
    text = "\n".join(
        f"[{name}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in values.items())
        for name, values in sections.items()
    )
    path.write_text(text, encoding="utf-8")
    return path


def write_dataset(path: Path, n_queries: int, n_passages: int) -> Path:
    """``n_queries`` queries of one engine, each with its own ``n_passages`` passages."""
    rows = [
        {
            "query_id": f"q{q}",
            "query": f"question number {q}",
            "engine": "bm25",
            "passages": [
                {"id": f"q{q}-p{p}", "text": f"text {p} answering question {q}"}
                for p in range(n_passages)
            ],
        }
        for q in range(n_queries)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def verdict_labels(out: Path) -> dict[Key, str | None]:
    """Label per (query, engine, repeat, passage), asserting each appears exactly once."""
    seen = Counter[Key]()
    labels: dict[Key, str | None] = {}
    for jq in read_results(out / RESULTS_FILE):
        for v in jq.verdicts:
            key = (jq.query.query_id, jq.query.engine, jq.repeat, v.passage_id)
            seen[key] += 1
            labels[key] = v.label
    assert not [k for k, n in seen.items() if n > 1], "a verdict was written twice"
    return labels


def sample_keys(repeats: int = 1) -> set[Key]:
    keys = set()
    for line in SAMPLE.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        for r in range(repeats):
            keys |= {(row["query_id"], row["engine"], r, p["id"]) for p in row["passages"]}
    return keys


class CountingResponder:
    """Counts the answers it gives per request body (hashed), across every run."""

    def __init__(self, inner: Callable[[Recorded], Item] | None = None) -> None:
        self.inner = inner or hashed_responder()
        self.answered = Counter[str]()
        self._lock = threading.Lock()

    def __call__(self, request: Recorded) -> Item:
        digest = hashlib.sha256(json.dumps(request.body, sort_keys=True).encode()).hexdigest()
        with self._lock:
            self.answered[digest] += 1
        return self.inner(request)


def test_killed_run_resumes_to_the_uninterrupted_result_paying_only_in_flight_calls(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    concurrency, n_queries, n_passages = 2, 6, 16
    dataset = write_dataset(tmp_path / "data.jsonl", n_queries, n_passages)
    counting = CountingResponder()
    server = make_server(responder=counting, latency=0.05)
    config = write_config(
        tmp_path / "run.toml",
        server,
        tmp_path / "cache.sqlite",
        # No hedges: a hedge pays for an answer twice by design, which would blur "only the
        # calls in flight at the kill were paid again" on a loaded machine.
        {"run": {"concurrency": concurrency, "hedge_share": 0.0}},
    )
    out = tmp_path / "out"
    results = out / RESULTS_FILE
    proc = subprocess.Popen(
        [sys.executable, "-m", "judge", "run", str(config), str(dataset), "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        # Kill with one query written and the next one half judged: its answers so far are
        # only in the cache.
        half = n_passages + n_passages // 2
        while not (results.exists() and sum(counting.answered.values()) >= half):
            assert proc.poll() is None, "judge run ended before it could be killed"
            assert time.monotonic() < deadline, "judge run wrote nothing"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    lines_at_kill = results.read_bytes().count(b"\n")
    assert 1 <= lines_at_kill < n_queries - 1, "the kill did not land halfway"
    paid_before = sum(counting.answered.values())

    assert main(["run", str(config), str(dataset), "--out", str(out)]) == 0
    resumed = verdict_labels(out)

    reference_server = make_server()
    reference = write_config(tmp_path / "ref.toml", reference_server, tmp_path / "ref-cache.sqlite")
    assert main(["run", str(reference), str(dataset), "--out", str(tmp_path / "ref")]) == 0
    assert resumed == verdict_labels(tmp_path / "ref")
    assert len(resumed) == n_queries * n_passages

    # No answer already stored was paid for again; only calls in flight at the kill were.
    unique = len(counting.answered)
    assert unique == n_queries * n_passages
    assert sum(counting.answered.values()) > paid_before
    assert sum(counting.answered.values()) <= unique + concurrency
    assert sum(n - 1 for n in counting.answered.values()) <= concurrency


def test_second_identical_run_makes_no_calls_and_gives_identical_results(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite")
    assert main(["run", str(config), "--out", str(tmp_path / "a")]) == 0
    calls = len(server.requests)
    assert calls > 0
    first = verdict_labels(tmp_path / "a")
    assert set(first) == sample_keys()

    assert main(["run", str(config), "--out", str(tmp_path / "b")]) == 0
    assert len(server.requests) == calls
    assert verdict_labels(tmp_path / "b") == first
    second = read_results(tmp_path / "b" / RESULTS_FILE)
    assert all(v.cached for jq in second for v in jq.verdicts)
    summary = json.loads((tmp_path / "b" / "summary.json").read_text(encoding="utf-8"))
    assert summary["run"]["requests"] == 0
    assert summary["run"]["cache_hits"] == len(first)
    assert "0 calls" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("responder", "flips"),
    [(random_responder(seed=7), True), (hashed_responder(), False)],
    ids=["random", "deterministic"],
)
def test_repeats_flip_only_when_the_judge_is_noisy(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    responder: Callable[[Recorded], Item],
    flips: bool,
) -> None:
    server = make_server(responder=responder)
    config = write_config(
        tmp_path / "run.toml",
        server,
        tmp_path / "cache.sqlite",
        {"judge.params": {"temperature": 0.8}, "run": {"repeats": 3}},
    )
    assert main(["run", str(config), "--out", str(tmp_path / "out")]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text(encoding="utf-8"))
    engines = summary["stability"]["engines"]
    assert set(engines) == {"bm25", "dense"}
    for engine in engines.values():
        stats = engine["flips"]
        assert stats["n_passages"] > 0
        assert (stats["flip_rate"] > 0) is flips
    assert set(verdict_labels(tmp_path / "out")) == sample_keys(repeats=3)


def test_passage_returned_by_two_engines_is_judged_once_per_repeat(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    repeats = 2
    # A random judge: were the shared passages asked twice, the engines would disagree.
    server = make_server(responder=random_responder(seed=1), latency=0.01)
    config = write_config(
        tmp_path / "run.toml",
        server,
        tmp_path / "cache.sqlite",
        {"judge.params": {"temperature": 0.8}, "run": {"repeats": repeats, "concurrency": 8}},
    )
    assert main(["run", str(config), "--out", str(tmp_path / "out")]) == 0

    rows = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines()]
    pairs = {(r["query_id"], p["id"]) for r in rows for p in r["passages"]}
    engines_of = Counter((r["query_id"], p["id"]) for r in rows for p in r["passages"])
    shared = [pair for pair, n in engines_of.items() if n > 1]
    assert shared, "the sample dataset has no passage shared by two engines"

    prompts = Counter(r.prompt for r in server.requests)
    assert len(server.requests) == len(pairs) * repeats
    assert len(prompts) == len(pairs)
    assert set(prompts.values()) == {repeats}

    labels = verdict_labels(tmp_path / "out")
    for query_id, passage_id in shared:
        for r in range(repeats):
            bm25 = labels[(query_id, "bm25", r, passage_id)]
            dense = labels[(query_id, "dense", r, passage_id)]
            assert bm25 == dense and bm25 is not None


def test_budget_stops_cleanly_and_the_run_resumes_without_duplicates(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    counting = CountingResponder()
    server = make_server(responder=counting)
    config = write_config(
        tmp_path / "run.toml",
        server,
        tmp_path / "cache.sqlite",
        {"run": {"concurrency": 2}, 'prices."judge-test"': {"prompt": 200.0, "completion": 200.0}},
    )
    out = tmp_path / "out"

    assert main(["run", str(config), "--out", str(out), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    # 78 passages in the lists, 56 distinct: a passage both engines returned is asked once.
    assert re.search(r"56 calls \(0 already cached\)", printed), printed
    assert re.search(r"prompt \+ ~\d+ completion tokens", printed)
    assert re.search(r"estimated cost \$\d+\.\d{4}", printed)
    # Hedging may add 5% of the 56 requests, paid: the worst case says so.
    assert "and 2 slow calls were hedged" in printed
    assert "hedging: up to 2 more requests" in printed
    assert server.requests == []

    # Each call reserves its worst case (~$0.37 here) and really costs ~$0.04: with $1.00
    # some units finish before the next worst case no longer fits. Exit 4: budget stop.
    assert main(["run", str(config), "--out", str(out), "--max-cost", "1.0"]) == 4
    assert "budget reached" in capsys.readouterr().err
    partial = verdict_labels(out)
    assert 0 < len(partial) < len(sample_keys())
    paid = len(server.requests)

    assert main(["run", str(config), "--out", str(out)]) == 0
    final = verdict_labels(out)
    assert set(final) == sample_keys()
    assert {k: final[k] for k in partial} == partial
    assert len(server.requests) > paid
    assert sum(counting.answered.values()) <= len(counting.answered) + 2

    capsys.readouterr()
    assert main(["run", str(config), "--out", str(tmp_path / "again"), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "56 calls (56 already cached)" in printed and "hedging" not in printed
    assert len(server.requests) == sum(counting.answered.values())


def test_resuming_with_another_model_is_refused_and_fresh_starts_over(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = write_dataset(tmp_path / "data.jsonl", n_queries=2, n_passages=2)
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite")
    out = tmp_path / "out"
    assert main(["run", str(config), str(dataset), "--out", str(out)]) == 0
    before = (out / RESULTS_FILE).read_bytes()
    calls = len(server.requests)
    capsys.readouterr()

    other = ["--set", "judge.model=other-judge"]
    assert main(["run", str(config), str(dataset), "--out", str(out), *other]) == 2
    err = capsys.readouterr().err
    assert "different config" in err and "--fresh" in err
    assert 'judge.model "judge-test" -> "other-judge"' in err
    assert (out / RESULTS_FILE).read_bytes() == before
    assert len(server.requests) == calls

    assert main(["run", str(config), str(dataset), "--out", str(out), *other, "--fresh"]) == 0
    assert len(verdict_labels(out)) == 4
    models = {r.body["model"] for r in server.requests[calls:]}
    assert models == {"other-judge"}
    jqs = read_results(out / RESULTS_FILE)
    assert len(jqs) == 2 and not any(v.cached for jq in jqs for v in jq.verdicts)


def test_fresh_removes_the_old_run_s_summary_and_reports_before_judging(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--fresh starts a directory over: the old run's summary, reports, qrels and record of
    them go with its results, so a fresh run killed before its end leaves no summary that
    judge compare, baseline set or read_run would take for its own."""
    from judge.config import load_config
    from judge.run.resume import FINISH_FILES, check_fingerprint

    dataset = write_dataset(tmp_path / "data.jsonl", n_queries=2, n_passages=2)
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite")
    out = tmp_path / "out"
    assert main(["run", str(config), str(dataset), "--out", str(out)]) == 0
    assert all((out / name).is_file() for name in FINISH_FILES)
    check_fingerprint(out, load_config(config), fresh=True)  # what --fresh does first
    assert not any((out / name).exists() for name in FINISH_FILES)
    # A folder no run was started in keeps its files: refused before, never removed.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "qrels.txt").write_text("q0 0 p 1\n", encoding="utf-8")
    check_fingerprint(mine, load_config(config), fresh=True)
    assert (mine / "qrels.txt").is_file()


def test_units_with_errors_are_judged_again_on_resume(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "d.jsonl", n_queries=2, n_passages=2)
    with ScriptedServer(responder=hashed_responder()) as srv:
        config = write_config(
            tmp_path / "c.toml",
            srv,
            tmp_path / "cache.sqlite",
            {"run": {"concurrency": 1, "max_attempts": 1}},
        )
        out = tmp_path / "out"
        srv.enqueue(Fault("status", 503))  # the first call fails and is not retried
        # A unit left in error makes the run incomplete (3), never a threshold breach (1).
        assert main(["run", str(config), str(data), "--out", str(out)]) == 3
        first = read_results(out / RESULTS_FILE)
        assert sum(v.status == "error" for jq in first for v in jq.verdicts) == 1
        calls_before = len(srv.requests)
        assert main(["run", str(config), str(data), "--out", str(out)]) == 0
        # Only the failed passage is asked again; its sibling comes from the cache.
        assert len(srv.requests) == calls_before + 1
    latest = {jq.key: jq for jq in read_results(out / RESULTS_FILE)}
    assert len(latest) == 2
    assert all(v.status == "ok" for jq in latest.values() for v in jq.verdicts)
    summary = json.loads((out / "summary.json").read_text("utf-8"))
    assert summary["counts"]["error"] == 0 and summary["counts"]["verdicts"] == 4


def test_a_second_run_into_the_same_directory_is_refused_while_one_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import fcntl

    from judge.run.resume import LOCK_FILE

    data = write_dataset(tmp_path / "d.jsonl", n_queries=1, n_passages=1)
    out = tmp_path / "out"
    out.mkdir()
    with ScriptedServer(responder=hashed_responder()) as srv:
        config = write_config(tmp_path / "c.toml", srv, tmp_path / "cache.sqlite")
        with open(out / LOCK_FILE, "a+") as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # what a running `judge run` holds
            assert main(["run", str(config), str(data), "--out", str(out)]) == 2
        assert "another judge run" in capsys.readouterr().err
        assert srv.requests == []
        assert main(["run", str(config), str(data), "--out", str(out)]) == 0


def test_a_provider_refusing_every_request_stops_the_run_early(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ScriptedServer(responder=lambda _r: Fault("status", 401)) as srv:
        config = write_config(
            tmp_path / "c.toml", srv, tmp_path / "cache.sqlite", {"run": {"concurrency": 1}}
        )
        code = main(["run", str(config), "--out", str(tmp_path / "out")])
        asked = len(srv.requests)
    assert code == 3
    err = capsys.readouterr().err
    assert "refuses every request" in err and "401" in err
    # Stopped after the first few refusals, not after judging all 56 distinct passages.
    assert 3 <= asked < 20


HOLD_S = 1.5  # how long the scripted server holds one answer


def test_latency_counts_time_in_flight_not_the_wait_for_a_slot(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """One slot: the second passage waits HOLD_S for it behind the held answer, yet its
    latency is its own round trip; the held one's covers the hold."""
    server = make_server()
    server.enqueue(Fault("hang", seconds=HOLD_S))
    dataset = write_dataset(tmp_path / "data.jsonl", 1, 2)
    config = write_config(
        tmp_path / "run.toml",
        server,
        tmp_path / "cache.sqlite",
        {"run": {"concurrency": 1, "adaptive_concurrency": False}},
    )
    assert main(["run", str(config), str(dataset), "--out", str(tmp_path / "out")]) == 0
    [jq] = read_results(tmp_path / "out" / RESULTS_FILE)
    held, other = sorted((v.latency_s for v in jq.verdicts), reverse=True)
    assert held >= HOLD_S
    assert other < HOLD_S / 2  # with the wait for the slot it would be HOLD_S or more
    summary = json.loads((tmp_path / "out" / "summary.json").read_text(encoding="utf-8"))
    assert summary["run"]["elapsed_s"] >= held


def test_a_resumed_run_reports_the_judging_time_of_every_invocation(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """The first invocation judges one query whose answer is held HOLD_S; the second resumes
    the directory and judges one more: its run.elapsed_s counts both invocations."""
    server = make_server()
    server.enqueue(Fault("hang", seconds=HOLD_S))
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite")
    both = write_dataset(tmp_path / "both.jsonl", 2, 1)
    first = tmp_path / "first.jsonl"
    first.write_text(both.read_text(encoding="utf-8").splitlines()[0] + "\n", encoding="utf-8")
    out = tmp_path / "out"

    def elapsed() -> float:
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        return float(summary["run"]["elapsed_s"])

    assert main(["run", str(config), str(first), "--out", str(out)]) == 0
    phase_one = elapsed()
    assert phase_one >= HOLD_S
    assert main(["run", str(config), str(both), "--out", str(out)]) == 0
    assert elapsed() > phase_one
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert (summary["run"]["resumed"], summary["run"]["done"]) == (1, 2)
    # --fresh starts the count over with the directory.
    assert main(["run", str(config), str(both), "--out", str(out), "--fresh"]) == 0
    run_file = json.loads((out / "run.json").read_text(encoding="utf-8"))
    assert run_file["elapsed_s"] == elapsed()


def test_a_web_page_where_the_api_should_be_stops_the_run_in_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A base_url that reaches a web UI (200, an HTML page) is not retried, stops the run
    after a few such answers, and says what answered and what to check."""
    with ScriptedServer(responder=lambda _r: WEB_PAGE) as srv:
        config = write_config(
            tmp_path / "c.toml", srv, tmp_path / "cache.sqlite", {"run": {"concurrency": 2}}
        )
        code = main(["run", str(config), "--out", str(tmp_path / "out")])
        asked = len(srv.requests)
    assert code == 3
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "does not speak the API (not retried)" in last
    assert f"{srv.openai_base_url}/chat/completions answered with an HTML page" in last
    assert "'Model Chat UI'" in last and "ends in /v1" in last
    assert "Traceback" not in last
    # Each answer taken as final (no retries); nothing sent after the third, but what was in
    # flight then (at most twice the concurrency of 2).
    assert 3 <= asked <= 7, asked


@pytest.mark.parametrize("status", [301, 307, 308])
def test_a_redirect_is_named_with_its_target_and_not_retried(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], status: int
) -> None:
    """A base_url the server redirects (http to https, a moved API) is not followed by a POST:
    the run stops after the first few answers, naming where the redirect points."""
    target = "https://api.example.test/v1/chat/completions"
    fault = Fault("status", status, location=target)
    with ScriptedServer(responder=lambda _r: fault) as srv:
        config = write_config(
            tmp_path / "c.toml", srv, tmp_path / "cache.sqlite", {"run": {"concurrency": 1}}
        )
        code = main(["run", str(config), "--out", str(tmp_path / "out")])
        asked = len(srv.requests)
    assert code == 3
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"HTTP {status}: redirected to {target}: set base_url to the API's own" in last
    assert 3 <= asked < 20, asked  # none retried; stopped after the first refusals


def test_a_retry_after_longer_than_a_retry_may_wait_is_final_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 429 asking for a day's wait is not retried after capped waits (five 60 s sleeps per
    call): each call fails at once, and the line says what the server asked for."""
    fault = Fault("status", 429, retry_after="86400")
    with ScriptedServer(responder=lambda _r: fault) as srv:
        config = write_config(
            tmp_path / "c.toml", srv, tmp_path / "cache.sqlite", {"run": {"concurrency": 2}}
        )
        code = main(["run", str(config), "--out", str(tmp_path / "out")])
        asked = len(srv.requests)
    assert code == 3
    err = capsys.readouterr().err
    assert "the server asks to wait 86400 s, more than run.max_backoff_s 60 s allows" in err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text(encoding="utf-8"))
    assert summary["run"]["retries"] == 0 and asked == summary["run"]["requests"]


def test_a_server_that_never_answers_stops_the_run_after_a_few_retries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It takes the connection and says nothing: before, every call's every attempt waited
    the timeout out (374 s on the sample at 60 s); now three retries that time out too, with
    nothing ever answered, stop the run, saying so."""
    hang = Fault("hang", seconds=30)
    with ScriptedServer(responder=lambda _r: hang) as srv:
        run = {"concurrency": 2, "timeout_s": 0.5, "backoff_base_s": 0.01, "hedge_share": 0}
        config = write_config(tmp_path / "c.toml", srv, tmp_path / "cache.sqlite", {"run": run})
        code = main(["run", str(config), "--out", str(tmp_path / "out")])
        asked = len(srv.requests)
    assert code == 3
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"no answer from {srv.openai_base_url}/chat/completions: 3 requests" in last
    assert "requests timed out on a retry and none was answered" in last
    assert asked < 20, asked


def test_a_rerun_into_the_same_directory_follows_the_dataset_as_it_is_now(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Finished units were matched by (query id, engine, repeat) alone: a nightly dataset whose
    passages changed kept last night's verdicts (0 requests, the old metrics), and queries
    taken out stayed in the summary. Now a unit whose dataset row changed is judged again
    (only its changed passages are paid for: the rest come from the cache), and the summary
    holds the dataset's units only."""
    data = tmp_path / "d.jsonl"
    write_dataset(data, n_queries=6, n_passages=3)
    out = tmp_path / "out"
    with ScriptedServer(responder=hashed_responder()) as srv:
        config = write_config(tmp_path / "c.toml", srv, tmp_path / "cache.sqlite")
        assert main(["run", str(config), str(data), "--out", str(out)]) in (0, 1)
        assert len(srv.requests) == 18
        rows = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines()]
        rows[0]["passages"][1]["text"] = "a passage rewritten since last night"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        assert main(["run", str(config), str(data), "--out", str(out)]) in (0, 1)
        assert len(srv.requests) == 19  # the one changed passage, nothing else
        latest = {jq.key: jq for jq in read_results(out / RESULTS_FILE)}
        (unit,) = [jq for key, jq in latest.items() if key[0] == "q0"]
        assert unit.query.passages[1].text == "a passage rewritten since last night"
        fewer = tmp_path / "fewer.jsonl"
        fewer.write_text("".join(json.dumps(r) + "\n" for r in rows[:4]), encoding="utf-8")
        assert main(["run", str(config), str(fewer), "--out", str(out)]) in (0, 1)
        assert len(srv.requests) == 19
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["counts"]["queries"] == 4
    assert "not in this run's dataset or sample: left out of its summary" in caplog.text


def test_a_rebuilt_report_keeps_how_the_run_went_and_which_engine_is_better(
    tmp_path: Path,
) -> None:
    """judge report --rebuild lost the verdict, the trust line, the run's outcome and its
    dataset ("dataset not recorded"): the summary it writes is whole again."""
    data = tmp_path / "d.jsonl"
    write_dataset(data, n_queries=4, n_passages=3)
    out = tmp_path / "out"
    with ScriptedServer(responder=hashed_responder()) as srv:
        config = write_config(tmp_path / "c.toml", srv, tmp_path / "cache.sqlite")
        assert main(["run", str(config), str(data), "--out", str(out)]) in (0, 1)
        before = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        assert main(["report", str(out), "--rebuild", "--config", str(config)]) == 0
        asked = len(srv.requests)
    after = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    for field in ("verdict", "run", "outcome", "dataset"):
        assert after[field] == before[field], field
    assert after["dataset"] == str(data) and asked == 12


def test_the_same_results_summarised_again_are_one_night_of_the_history(
    tmp_path: Path,
) -> None:
    """A finished night summarised again (other metric names; a new baseline does the same)
    judges nothing and added a second, identical row to the history's trend."""
    from judge.config import load_config
    from judge.report.history import list_runs

    data = tmp_path / "d.jsonl"
    write_dataset(data, n_queries=4, n_passages=3)
    out = tmp_path / "out"
    with ScriptedServer(responder=hashed_responder()) as srv:
        run = {"history": str(tmp_path / "h.sqlite")}
        config = write_config(tmp_path / "c.toml", srv, tmp_path / "cache.sqlite", {"run": run})
        assert main(["run", str(config), str(data), "--out", str(out)]) in (0, 1)
        again = ["--set", 'metrics.names=["ap", "ndcg@3"]']
        assert main(["run", str(config), str(data), "--out", str(out), *again]) in (0, 1)
        assert len(srv.requests) == 12
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert "ndcg@3" in summary["metric_names"]  # made again, with the new names
    assert len(list_runs(load_config(config).history_path())) == 1


def test_what_a_run_paid_is_said_as_at_most_when_some_usage_was_never_reported(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """An unreadable answer is counted at its request's worst case (it may have been billed):
    the report said "this run paid" that sum, 2.5x what a server billed; now "at most", with
    how many requests were counted so."""
    from tests.wire import MALFORMED

    server = make_server(responder=hashed_responder(), fault_rate=0.3, faults=(MALFORMED,), seed=1)
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    assert main(["run", str(config), "--out", str(tmp_path / "out")]) in (0, 1)
    run = json.loads((tmp_path / "out" / "summary.json").read_text(encoding="utf-8"))["run"]
    malformed = server.outcomes["malformed"]
    assert malformed > 0 and run["worst_counted"] == malformed
    report = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "this run paid at most " in report
    assert f"({malformed} of them counted at their worst case: no usage was reported" in report
    clean = make_server(responder=hashed_responder())
    config = write_config(tmp_path / "d.toml", clean, tmp_path / "cache2.sqlite")
    assert main(["run", str(config), "--out", str(tmp_path / "clean")]) in (0, 1)
    report = (tmp_path / "clean" / "report.md").read_text(encoding="utf-8")
    assert "this run paid " in report and "at most" not in report


def test_a_sample_stays_the_same_queries_as_the_dataset_grows() -> None:
    """Ten queries added to thirty: the twenty sampled before stay sampled but for those the
    new ones outrank (a seeded shuffle swapped 9 of 20); and the sample is reproducible."""
    from judge.run.queries import sample_queries
    from judge.schema import Query

    def queries(n: int) -> list[Query]:
        return [Query(query_id=f"q{i}", query=f"question {i}") for i in range(n)]

    before = {q.query_id for q in sample_queries(queries(30), 20, seed=7)}
    after = {q.query_id for q in sample_queries(queries(40), 20, seed=7)}
    assert len(before) == len(after) == 20
    assert before == {q.query_id for q in sample_queries(queries(30), 20, seed=7)}
    assert after - before <= {f"q{i}" for i in range(30, 40)}  # only new ids come in
    assert before != {q.query_id for q in sample_queries(queries(30), 20, seed=8)}


def test_a_listwise_run_says_how_many_passages_it_asked_one_by_one(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A judge that does not answer lists (here: every answer is one verdict) has each
    passage asked alone, a request each: said, with the count, where it had gone unsaid."""
    from judge.cli.main import main

    dataset = write_dataset(tmp_path / "d.jsonl", n_queries=3, n_passages=4)
    tables = {"judge": {"mode": "listwise"}, "dataset": {"path": str(dataset)}}
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite", tables)
    assert main(["run", str(config), "--out", str(tmp_path / "o")]) in (0, 1)
    out = capsys.readouterr().out
    assert "listwise: 12 passage(s) were asked one by one, a request each" in out, out
    summary = json.loads((tmp_path / "o" / "summary.json").read_text(encoding="utf-8"))
    assert summary["run"]["asked_alone"] == 12
