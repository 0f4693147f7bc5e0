"""Input and environment faults: one line and an exit code that means one thing, never a
traceback; error units make a run incomplete (exit 3), never a regression (exit 1); SIGTERM
stops gracefully with a summary marked incomplete; a damaged cache is moved aside."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from judge.cli.main import main
from judge.config import load_config
from judge.data.datasets import read_results
from judge.data.results import RESULTS_FILE
from judge.judging.prompts import MARK
from judge.run.queries import load_queries
from judge.run.runner import run_async, signals_held
from tests.servers import Fault, Item, Recorded, ScriptedServer, hashed_responder
from tests.test_runner import verdict_labels, write_config, write_dataset
from tests.wire import Answer

EXIT_INCOMPLETE = 3
REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "content",
    [
        b'{"query_id": "q1", "query": "\\ud800 lone", "passages": [{"id": "p", "text": "a"}]}\n',
        b"[" * 100_000 + b"]" * 100_000 + b"\n",
        b'{"query_id": "q1", "query": "x", "passages": [], "n": ' + b"9" * 5000 + b"}\n",
        json.dumps([{"query_id": "q1", "query": "x", "passages": []}], indent=2).encode(),
        b'{"query_id": "q1", "query": "\xff\xfe", "passages": []}\n',
    ],
    ids=["lone-surrogate", "deep-nesting", "huge-integer", "json-array", "bad-bytes"],
)
def test_a_bad_dataset_is_one_clear_error_and_costs_nothing(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: bytes,
) -> None:
    server = make_server()
    dataset = tmp_path / "bad.jsonl"
    dataset.write_bytes(content)
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    assert main(["validate", str(dataset)]) == 2
    assert main(["run", str(config), str(dataset), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{dataset}:1:" in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("judge:")]) == 2
    assert server.requests == []


def test_a_quoted_model_name_in_an_override_is_the_name(
    make_server: Callable[..., ScriptedServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = make_server()
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    price = 'prices."judge-test"={prompt=1.0, completion=2.0}'
    args = ["run", str(config), "--out", str(tmp_path / "o"), "--max-cost", "5", "--set", price]
    assert main([*args, "--dry-run"]) == 0
    assert "estimated cost $" in capsys.readouterr().out


def test_units_left_in_error_are_incomplete_not_a_regression_and_a_rerun_finishes(
    make_server: Callable[..., ScriptedServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    failing = {"on": True}
    inner = hashed_responder()

    def flaky(request: Recorded) -> Item:
        if failing["on"] and "question 1" in request.prompt:
            return Fault("status", 503)
        return inner(request)

    server = make_server(responder=flaky)
    dataset = write_dataset(tmp_path / "d.jsonl", n_queries=8, n_passages=3)
    config = write_config(
        tmp_path / "c.toml",
        server,
        tmp_path / "cache.sqlite",
        {"dataset": {"path": str(dataset), "label_scale": "binary"}, "run": {"max_attempts": 2}},
    )
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == EXIT_INCOMPLETE
    err = capsys.readouterr().err
    assert "provider errors (for example: " in err and "threshold" not in err
    assert "503" in err  # in the server's words
    assert f"(at {server.openai_base_url}/chat/completions)" in err  # and which server
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["run"]["status"] == "incomplete"
    failing["on"] = False
    assert main(["run", str(config), "--out", str(out)]) == 0
    assert len(verdict_labels(out)) == 24
    # One line per unit after the resume: the errored line was replaced, not kept.
    assert (out / RESULTS_FILE).read_bytes().count(b"\n") == 8


def test_once_too_many_errors_stop_the_run_no_request_leaves_after_the_decision(
    make_server: Callable[..., ScriptedServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every answer unreadable (retried as a protocol error): the run stops at
    abort_error_rate, and the units in flight neither retry nor send their next passages
    (every one of the 300 possible requests was still sent after the decision)."""
    server = make_server(responder=lambda request: Fault("malformed"))
    dataset = write_dataset(tmp_path / "d.jsonl", n_queries=10, n_passages=10)
    config = write_config(
        tmp_path / "c.toml",
        server,
        tmp_path / "cache.sqlite",
        {
            "dataset": {"path": str(dataset), "label_scale": "binary"},
            "run": {
                "max_attempts": 3,
                "concurrency": 8,
                "adaptive_concurrency": False,
                "hedge_share": 0,
            },
        },
    )
    assert main(["run", str(config), "--out", str(tmp_path / "o")]) == EXIT_INCOMPLETE
    captured = capsys.readouterr()
    err = captured.err
    assert "too many errors" in err and "Traceback" not in err
    # The decision comes as the 20th passage fails (its 3 attempts: 60 requests); passages
    # started meanwhile (a failed attempt's backoff frees its slot) add a few tens, and
    # nothing leaves after it: 85-90 requests here, all 300 before.
    assert len(server.requests) <= 120, len(server.requests)
    # Every page says the passages never sent as such, not as errors (the header had said
    # "N error" beside the trust line's "0 error, N not sent"), and nothing claims a judgement.
    out = captured.out
    md = (tmp_path / "o" / "report.md").read_text(encoding="utf-8")
    summary = json.loads((tmp_path / "o" / "summary.json").read_text(encoding="utf-8"))
    unsent = summary["counts"]["not_sent"]
    assert unsent > 0 and md.count("not sent") >= 2, md[:800]
    assert f"{unsent} error" not in md.split("Trust:")[0]
    assert "(no passage was judged before it stopped)" in out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_before_the_run_installs_its_handlers_still_stops_it(
    make_server: Callable[..., ScriptedServer], tmp_path: Path, sig: signal.Signals
) -> None:
    """Ctrl-C in the first half-second of `judge run` (before the run's own handlers) was
    taken by asyncio.run's, whose cancel start-up swallowed: the whole run was paid for and
    ended "ok". Held from before asyncio.run, it stops the run as a later one does."""
    server = make_server(responder=hashed_responder(), latency=0.05)
    dataset = write_dataset(tmp_path / "d.jsonl", n_queries=20, n_passages=5)
    config = load_config(
        write_config(
            tmp_path / "c.toml",
            server,
            tmp_path / "cache.sqlite",
            {"dataset": {"path": str(dataset), "label_scale": "binary"}},
        )
    )
    with signals_held() as unheard:
        os.kill(os.getpid(), sig)  # arrives now, before asyncio.run
        outcome = asyncio.run(run_async(config, load_queries(config), tmp_path / "out"))
    assert unheard == []  # taken up by the run
    assert (outcome.status, outcome.stopped_by) == ("incomplete", "interrupted")
    assert server.requests == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back


def test_a_provider_that_goes_dark_mid_run_stops_the_run_saying_so(
    make_server: Callable[..., ScriptedServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After 30 answers every request hangs: the run went on retrying for as long as it
    lasted (2,030 hung requests in 280 s). Requests in a row that time out at timeout_s with
    no answer between them now make the provider unreachable, and the run stops, saying so."""
    inner = hashed_responder()
    served = [0]

    def then_dark(request: Recorded) -> Item:
        served[0] += 1
        return inner(request) if served[0] <= 30 else Fault("hang", seconds=300)

    server = make_server(responder=then_dark)
    dataset = write_dataset(tmp_path / "d.jsonl", n_queries=40, n_passages=5)
    config = write_config(
        tmp_path / "c.toml",
        server,
        tmp_path / "cache.sqlite",
        {
            "dataset": {"path": str(dataset), "label_scale": "binary"},
            "run": {"timeout_s": 2.0, "concurrency": 16, "hedge_share": 0, "grace_s": 1.0},
        },
    )
    code = main(["run", str(config), "--out", str(tmp_path / "o")])
    printed = capsys.readouterr()
    err = printed.err
    assert code == EXIT_INCOMPLETE, err
    assert "stopped answering" in err and "Traceback" not in err
    assert len(server.requests) < 200  # of 200 passages x 6 attempts
    # The means printed are of the part judged, and say so on their line.
    assert re.search(r"^  bm25: .* query-repeats that ran before it stopped\)$", printed.out, re.M)


@pytest.mark.parametrize("finish", ["stop", "length"])
def test_a_server_that_answers_every_request_with_no_text_stops_the_run(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    finish: str,
) -> None:
    """Every answer empty (a gateway that blanks them, a model name it answers so, max_tokens
    spent thinking): each had been counted unparsed, the run went to the end and exited 1 as
    a threshold breach. Eight empty answers before any with text make the provider
    unreachable: exit 3, saying so, and why when each was cut off by max_tokens."""
    server = make_server(responder=lambda request: Answer(text="", finish_reason=finish))
    dataset = write_dataset(tmp_path / "d.jsonl", n_queries=40, n_passages=5)
    config = write_config(
        tmp_path / "c.toml",
        server,
        tmp_path / "cache.sqlite",
        {"dataset": {"path": str(dataset), "label_scale": "binary"}, "run": {"concurrency": 4}},
    )
    code = main(["run", str(config), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == EXIT_INCOMPLETE, err
    assert f"{server.openai_base_url} answered 8 requests with no text and none with text" in err
    assert "threshold" not in err and "Traceback" not in err
    assert ("raise [judge.params] max_tokens" in err) == (finish == "length")
    assert len(server.requests) < 40  # of 200 passages, each asked and re-asked


def test_a_server_that_is_down_is_incomplete(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make_server: Callable[..., ScriptedServer]
) -> None:
    server = make_server()
    config = write_config(
        tmp_path / "c.toml", server, tmp_path / "cache.sqlite", {"run": {"max_attempts": 2}}
    )
    server.stop()  # nothing listens on its port any more
    dataset = write_dataset(tmp_path / "d.jsonl", n_queries=2, n_passages=2)
    assert main(["run", str(config), str(dataset), "--out", str(tmp_path / "o")]) == 3
    assert "Traceback" not in capsys.readouterr().err


def test_redo_unparsed_asks_exactly_those_units_again(
    make_server: Callable[..., ScriptedServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    garble = {"on": True}
    inner = hashed_responder()

    def answer(request: Recorded) -> Item:
        body = json.dumps(request.body).replace(MARK, " ")  # read through the datamark
        if garble["on"] and "question 0" in body:  # re-asks too
            return Answer(text="I cannot say.")
        return inner(request)

    server = make_server(responder=answer)
    dataset = write_dataset(tmp_path / "d.jsonl", n_queries=3, n_passages=2)
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    out = str(tmp_path / "out")
    assert main(["run", str(config), str(dataset), "--out", out]) in (0, 1)
    first = len(server.requests)
    assert main(["run", str(config), str(dataset), "--out", out]) in (0, 1)
    assert len(server.requests) == first  # unparsed units are kept unless asked
    garble["on"] = False
    capsys.readouterr()
    # A dry run counts what --redo will judge again, as the run does; it sends nothing.
    assert main(["run", str(config), str(dataset), "--out", out, "--dry-run"]) == 0
    assert "dry run: 0 query-repeats to judge" in capsys.readouterr().out
    redo = ["--redo", "unparsed"]
    assert main(["run", str(config), str(dataset), "--out", out, "--dry-run", *redo]) == 0
    assert "dry run: 1 query-repeats to judge" in capsys.readouterr().out
    assert len(server.requests) == first
    assert main(["run", str(config), str(dataset), "--out", out, *redo]) == 0
    # Question 0's two passages, asked once each (no re-ask is needed any more).
    assert len(server.requests) == first + 2
    labels = verdict_labels(tmp_path / "out")
    assert all(label is not None for label in labels.values())
    capsys.readouterr()


def test_a_damaged_cache_is_moved_aside_and_the_run_goes_on(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = make_server()
    cache = tmp_path / "cache.sqlite"
    config = write_config(tmp_path / "c.toml", server, cache)
    assert main(["run", str(config), "--out", str(tmp_path / "a")]) in (0, 1)
    assert main(["cache", "check", "--config", str(config)]) == 0
    size = cache.stat().st_size
    assert size > 16384
    with open(cache, "r+b") as fh:  # every page but the schema's: whatever a run reads
        fh.seek(4096)
        fh.write(os.urandom(size - 4096))
    assert main(["cache", "check", "--config", str(config)]) == 2
    assert "damaged" in capsys.readouterr().err
    assert main(["run", str(config), "--out", str(tmp_path / "b")]) in (0, 1)
    assert "Traceback" not in capsys.readouterr().err
    warned = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert warned and "moved aside" in warned[0]
    assert list(tmp_path.glob("cache.sqlite.corrupt-*"))
    assert main(["cache", "check", "--config", str(config)]) == 0


def _sigterm_when_paid(
    server: ScriptedServer,
    config: Path,
    dataset: Path,
    out: Path,
    paid: int,
    need_results: bool,
) -> tuple[int, str, float]:
    """``judge run`` as a process, sent SIGTERM once ``paid`` answers were served (and its
    results file exists, when ``need_results``): its exit code, stderr and when signalled."""
    command = [sys.executable, "-m", "judge", "run", str(config), str(dataset), "--out", str(out)]
    with subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        deadline = time.monotonic() + 120
        while server.successes < paid or (need_results and not (out / RESULTS_FILE).exists()):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the run never started judging"
            time.sleep(0.05)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    return proc.returncode, err, signalled


def test_sigterm_stops_gracefully_with_a_summary_marked_incomplete(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    server = make_server(latency=0.2)
    dataset = write_dataset(tmp_path / "d.jsonl", n_queries=30, n_passages=4)
    config = write_config(
        tmp_path / "c.toml", server, tmp_path / "cache.sqlite", {"run": {"concurrency": 2}}
    )
    out = tmp_path / "out"
    code, err, _ = _sigterm_when_paid(server, config, dataset, out, 8, True)
    assert code == EXIT_INCOMPLETE, err
    assert "SIGTERM" in err and "Traceback" not in err
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["run"]["status"] == "incomplete"
    assert summary["run"]["stopped_by"] == "interrupted"
    done = len(verdict_labels(out))
    assert 0 < done < 120
    assert main(["run", str(config), str(dataset), "--out", str(out)]) in (0, 1)
    assert len(verdict_labels(out)) == 120


def test_an_unreachable_provider_leaves_no_sentence_about_the_engines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make_server: Callable[..., ScriptedServer]
) -> None:
    """Two engines and no verdict at all: the first line says nothing was judged, not that the
    engines share no query where a metric is defined."""
    server = make_server()
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    server.stop()
    rows = [
        json.loads(line)
        for line in write_dataset(tmp_path / "one.jsonl", 4, 3).read_text().splitlines()
    ]
    both = [*rows, *({**r, "engine": "dense"} for r in rows)]
    dataset = tmp_path / "d.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in both), encoding="utf-8")
    out = tmp_path / "o"
    assert main(["run", str(config), str(dataset), "--out", str(out), "--no-charts"]) == 3
    printed = capsys.readouterr().out.splitlines()
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    # None was sent: no connection was ever made (each had said "8 attempts", as if made).
    said = (
        "no verdict on the engines: none of the 24 passages was judged (0 error, 24 not sent, "
        "0 unparsed)"
    )
    assert summary["verdict"][0] == said
    assert printed[printed.index(said) - 1].startswith("judged 0 of 24 passages")


def test_an_unreachable_provider_stops_after_a_few_attempts_saying_where_and_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make_server: Callable[..., ScriptedServer]
) -> None:
    """A closed port: no connection is ever made, so after a handful of attempts the run stops
    (resumable, exit 3) naming the URL and the cause, instead of retrying every passage; the
    summary's outcome says so first, and no threshold reads as passed or breached."""
    server = make_server()
    url = server.openai_base_url
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    server.stop()  # nothing listens on its port any more
    dataset = write_dataset(tmp_path / "d.jsonl", n_queries=20, n_passages=5)
    out = tmp_path / "o"
    assert main(["run", str(config), str(dataset), "--out", str(out), "--no-charts"]) == 3
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"judge: run incomplete: cannot reach {url}/chat/completions (")
    assert "attempts, none connected" in last and "Traceback" not in err
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert next(iter(summary)) == "outcome"
    assert (summary["outcome"]["status"], summary["outcome"]["exit_code"]) == ("INCOMPLETE", 3)
    assert any(r.startswith("not evaluated: unparsed_rate") for r in summary["outcome"]["reasons"])
    assert summary["health"]["known"] is False
    # 100 passages with 3 attempts each would be 300 tries; the stop came after a handful.
    verdicts = [json.loads(line) for line in (out / RESULTS_FILE).read_text().splitlines()]
    attempts = sum(v["attempts"] for jq in verdicts for v in jq["verdicts"])
    assert attempts <= 40, attempts


@pytest.mark.parametrize("where", ["closed port", "no such host"])
def test_an_unreachable_dashscope_is_named_and_costs_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    make_server: Callable[..., ScriptedServer],
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    """DashScope's native SDK (aiohttp): a host name that does not resolve had been read as a
    paid request (aiohttp's DNS error subclasses the connector error judge looked for by
    name), so the budget ran out (exit 4) where nothing was ever sent; and the stop line
    named neither the URL nor, for a hung server, a cause ("CancelledError")."""
    monkeypatch.setenv("DASHSCOPE_API_KEY", "sk-test")
    server = make_server()
    url = (
        server.dashscope_base_url if where == "closed port" else "http://judge-test.invalid/api/v1"
    )
    tables = {
        "judge": {"provider": "dashscope"},
        "provider": {"base_url": url},
        'prices."judge-test"': {"prompt": 1000.0, "completion": 2000.0},
    }
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite", tables)
    server.stop()
    dataset = write_dataset(tmp_path / "d.jsonl", n_queries=10, n_passages=5)
    argv = ["run", str(config), str(dataset), "--out", str(tmp_path / "o"), "--max-cost", "20"]
    assert main(argv) == 3
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"judge: run incomplete: cannot reach {url} ("), last
    assert "attempts, none connected" in last and "Traceback" not in err
    run = json.loads((tmp_path / "o" / "run.json").read_text(encoding="utf-8"))
    spent = run.get("spent") or {}
    assert spent.get("prompt_tokens", 0) + spent.get("completion_tokens", 0) == 0, spent


def test_a_timeout_s_cause_is_the_timeout_not_the_cancellation_inside_it() -> None:
    """An SDK's own timeout (asyncio.wait_for) raises TimeoutError from the CancelledError
    of the request it stopped: the stop line had said "(CancelledError)"."""
    import asyncio

    from judge.calling.retries import root_cause

    try:
        try:
            raise asyncio.CancelledError()
        except asyncio.CancelledError:
            raise TimeoutError() from None
    except TimeoutError as exc:
        exc.__context__ = asyncio.CancelledError()
        assert root_cause(exc) == "TimeoutError"


def test_the_python_api_raises_when_the_provider_cannot_be_reached(
    make_server: Callable[..., ScriptedServer],
) -> None:
    from judge import Judge, Limits, ProviderError

    server = make_server()
    url = server.openai_base_url
    server.stop()
    rows = [{"query": f"q{i}", "retrieved_texts": ["a", "b"]} for i in range(10)]
    limits = Limits(max_attempts=3, backoff_base_s=0.01, timeout_s=5.0)
    with Judge("local", "m", base_url=url, limits=limits) as j:
        with pytest.raises(ProviderError, match=f"cannot reach {url}") as caught:
            j.judge_many(rows, progress=False)
        # One query of one passage too (its retries are fewer than make a provider
        # unreachable): it had come back with an error verdict and no exception, where two
        # passages raised.
        for passages in (["a"], ["a", "b"]):
            with pytest.raises(ProviderError, match="the provider cannot be reached: "):
                j.judge("q", passages)
    assert caught.value.kind == "unreachable"


def test_after_sigterm_no_new_request_leaves_and_a_rerun_pays_nothing_twice(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """Big units (40 passages each), 2 calls in flight: after SIGTERM the passages of the
    units in flight that were not sent yet are not sent at all (the server timestamps every
    request); the rerun asks exactly those, never an answer already received."""
    arrivals: list[float] = []
    inner = hashed_responder()

    def stamped(request: Recorded) -> Item:
        arrivals.append(time.monotonic())
        return inner(request)

    server = make_server(latency=0.2, responder=stamped)
    dataset = write_dataset(tmp_path / "d.jsonl", n_queries=3, n_passages=40)
    # No hedges: on a busy machine a slow answer may be hedged, and a hedge is a second paid
    # answer by design (tests/test_hedging.py), not the double payment this test looks for.
    run = {"concurrency": 2, "hedge_share": 0}
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite", {"run": run})
    out = tmp_path / "out"
    code, err, signalled = _sigterm_when_paid(server, config, dataset, out, 6, False)
    assert code == EXIT_INCOMPLETE, err
    # The passages never sent are said as such, not as provider errors (616 "error" said a
    # provider failed where the run had stopped sending).
    counts = json.loads((out / "summary.json").read_text(encoding="utf-8"))["counts"]
    assert counts["not_sent"] > 0 and counts["error"] == counts["not_sent"], counts
    assert "ended in provider errors" not in err
    # Requests sent before the signal may still be arriving for a moment; none after that.
    late = [t - signalled for t in arrivals if t > signalled + 0.5]
    assert not late, f"{len(late)} requests arrived after SIGTERM"
    paid = server.successes
    assert paid < 120
    assert main(["run", str(config), str(dataset), "--out", str(out)]) in (0, 1)
    assert len(verdict_labels(out)) == 120
    assert server.successes == 120  # every passage answered once over both runs


def test_a_cache_that_cannot_be_written_stops_the_run_as_incomplete(tmp_path: Path) -> None:
    """A full disk (here: a file-size limit) failing the cache's writes mid-run: exit 2, "bad
    input", after paying. Now the run stops as a signal stops it: exit 3, one line naming the
    file and what to do, resumable; the answers paid before and as the writes failed keep
    their verdicts (they had been lost, and paid again on resume)."""
    import resource

    data = write_dataset(tmp_path / "d.jsonl", n_queries=40, n_passages=5)
    with ScriptedServer(responder=hashed_responder()) as srv:
        config = write_config(
            tmp_path / "c.toml", srv, tmp_path / "cache.sqlite", {"run": {"history": "h.sqlite"}}
        )

        def small_files() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

        command = [sys.executable, "-m", "judge", "run", str(config), str(data)]
        done = subprocess.run(
            [*command, "--out", str(tmp_path / "out")],
            cwd=REPO,
            preexec_fn=small_files,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == EXIT_INCOMPLETE, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert f"{tmp_path / 'cache.sqlite'}: cannot write cache" in last, last
        assert "then rerun" in last and "a full disk?" not in last, last
        assert "Traceback" not in done.stderr
        paid = len(srv.requests)
        assert 0 < paid < 200
        # Every answer paid has its verdict in the run directory (a unit that ended, or the
        # partial file of one that did not), though the cache holds few of them.
        out = tmp_path / "out"
        kept = sum(v.status == "ok" for jq in read_results(out / RESULTS_FILE) for v in jq.verdicts)
        partial = out / "verdicts.partial.jsonl"
        kept += len(partial.read_bytes().splitlines()) if partial.exists() else 0
        assert kept == paid, (kept, paid, done.stderr[-2000:])
        # The disk freed, the rerun judges the rest: every passage answered. (A unit the stop
        # left with unsent passages is judged again whole, and its answered passages, which
        # the cache could not take, are paid again: at most the units in flight.)
        assert main(["run", str(config), str(data), "--out", str(out)]) == 0
        prompts = Counter(r.prompt for r in srv.requests)
        assert len(prompts) == 200 and len(srv.requests) < 200 + paid


CAP = 300_000
_FILE_CAP = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the cap fails (EFBIG)
cap = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (cap, cap))
from judge.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def test_a_file_that_cannot_be_written_after_paying_is_incomplete_not_bad_input(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No file may grow past CAP bytes (as on a full disk): the run stops incomplete (exit 3),
    naming the file, not 'bad input, nothing sent' (exit 2, no file named); the rerun without
    the cap finishes, paying only what no file kept. A report path that is a folder is found
    before anything is paid."""
    dataset = write_dataset(tmp_path / "rows.jsonl", n_queries=20, n_passages=10)
    long = "a long passage about the question, " * 60  # results lines outgrow the cache
    rows = [json.loads(line) for line in dataset.read_text(encoding="utf-8").splitlines()]
    for row in rows:
        row["passages"] = [{**p, "text": p["text"] + long} for p in row["passages"]]
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    out = tmp_path / "out"
    argv = ["run", str(config), str(dataset), "--out", str(out)]
    capped = subprocess.run(
        [sys.executable, "-c", _FILE_CAP, str(CAP), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert capped.returncode == 3, capped.stderr
    said = capped.stderr.strip().splitlines()[-1]  # the cache's WAL reaches the cap first
    assert "cannot write" in said and "rerun" in said and "Traceback" not in capped.stderr
    paid = len(server.requests)
    assert 0 < paid < 200
    assert main(argv) in (0, 1)
    assert len(server.requests) < paid + 200  # what was kept is not asked again
    blocked = tmp_path / "blocked"  # a report path that is a folder: found before paying
    (blocked / "report.html").mkdir(parents=True)
    before = len(server.requests)
    assert main(["run", str(config), str(dataset), "--out", str(blocked)]) == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{blocked / 'report.html'}: is a directory" in said
    assert len(server.requests) == before and not (blocked / "summary.json").exists()


def test_means_of_a_run_whose_every_unit_ran_do_not_say_it_stopped_before_them(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every unit ran, one passage's verdict failed for good: the run is incomplete, and its
    means had been said to be "of the 24 of 24 query-repeats that ran before it stopped"."""
    inner = hashed_responder()

    def one_fails(request: Recorded) -> Item:
        failing = "text 1 answering question 0" in request.prompt
        return Fault("status", 500) if failing else inner(request)

    server = make_server(responder=one_fails)
    dataset = write_dataset(tmp_path / "d.jsonl", n_queries=4, n_passages=3)
    config = write_config(
        tmp_path / "c.toml",
        server,
        tmp_path / "cache.sqlite",
        {
            "dataset": {"path": str(dataset), "label_scale": "binary"},
            "run": {"max_attempts": 2, "backoff_base_s": 0.01},
        },
    )
    assert main(["run", str(config), "--out", str(tmp_path / "o")]) == EXIT_INCOMPLETE
    out = capsys.readouterr().out
    assert "that ran before it stopped" not in out
    assert re.search(r"^  bm25: .*\(every query-repeat ran; those with failed", out, re.M), out
