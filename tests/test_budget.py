"""The budget is a hard cap: what the loopback server reports as used never passes it, even
with many calls in flight, retries and re-asks; a budget stop has its own exit code and a
rerun with a larger cap resumes without paying twice."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from judge.cli.main import main
from judge.config import load_config
from judge.report.history import list_runs
from tests.servers import Fault, Item, Recorded, ScriptedServer, hashed_responder
from tests.test_runner import verdict_labels, write_config, write_dataset
from tests.wire import Answer

PROMPT, COMPLETION = 100, 10  # tokens every answer reports using
PRICE = {"prompt": 10.0, "completion": 30.0}  # USD per 1M tokens
EACH = (PROMPT * PRICE["prompt"] + COMPLETION * PRICE["completion"]) / 1e6  # $0.0013 per call
EXIT_BUDGET = 4


class Metered:
    """Answers like ``hashed_responder`` with fixed usage. With ``fail_every``, the first
    attempt of every prompt whose hash falls in that share fails with a 500 (not billed), so
    retries are exercised deterministically: no unit can lose all its attempts to the luck of
    how concurrent requests interleave. Counts the answers it bills."""

    def __init__(self, fail_every: int = 0) -> None:
        self.inner = hashed_responder()
        self.fail_every = fail_every
        self.billed = 0
        self.failed: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, request: Recorded) -> Item:
        digest = hashlib.sha256(request.prompt.encode()).hexdigest()
        with self._lock:
            first = digest not in self.failed
            if self.fail_every and int(digest, 16) % self.fail_every == 0 and first:
                self.failed.add(digest)
                return Fault(kind="status", status=500)
            self.billed += 1
        answer = self.inner(request)
        assert isinstance(answer, Answer)
        return dataclasses.replace(answer, usage=(PROMPT, COMPLETION))


def _config(tmp_path: Path, server: ScriptedServer, concurrency: int) -> Path:
    dataset = write_dataset(tmp_path / "data.jsonl", n_queries=40, n_passages=6)
    return write_config(
        tmp_path / "run.toml",
        server,
        tmp_path / "cache.sqlite",
        {
            "dataset": {"path": str(dataset), "label_scale": "binary"},
            # No hedges: a hedge is a second paid answer by design (tests/test_hedging.py),
            # which a busy machine's slow answer may draw; these tests count answers paid once.
            "run": {
                "concurrency": concurrency,
                "max_attempts": 4,
                "hedge_share": 0,
                "history": str(tmp_path / "history.sqlite"),
            },
            'prices."judge-test"': PRICE,
        },
    )


@pytest.mark.parametrize("fail_every", [0, 5])
def test_cost_cap_holds_at_high_concurrency_and_a_larger_cap_resumes(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fail_every: int,
) -> None:
    metered = Metered(fail_every)
    server = make_server(responder=metered, latency=0.05)
    config = _config(tmp_path, server, concurrency=64)
    out = tmp_path / "out"
    cap = 0.1  # room for 76 of the 240 calls

    assert main(["run", str(config), "--out", str(out), "--max-cost", str(cap)]) == EXIT_BUDGET
    history = load_config(config).history_path()
    assert list_runs(history) == []  # a stopped night is no night of the history's
    err = capsys.readouterr().err
    spent = metered.billed * EACH
    assert 0 < spent <= cap
    assert metered.billed < 240
    stated = re.search(r"spent \$(\d+\.\d+)", err)
    assert stated, err
    assert float(stated.group(1)) == pytest.approx(spent, abs=1e-4)
    partial = verdict_labels(out)
    first = metered.billed

    assert main(["run", str(config), "--out", str(out), "--max-cost", "10"]) == 0
    final = verdict_labels(out)
    assert len(final) == 240 and {k: final[k] for k in partial} == partial
    assert len(list_runs(history)) == 1  # the finished rerun is
    # Every passage was paid for exactly once over the two runs.
    assert metered.billed == 240
    assert metered.billed - first == 240 - first
    assert bool(metered.failed) == bool(fail_every)  # the 500s really happened


def test_token_cap_holds(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    metered = Metered()
    server = make_server(responder=metered, latency=0.05)
    config = _config(tmp_path, server, concurrency=32)
    cap = 5000
    code = main(["run", str(config), "--out", str(tmp_path / "o"), "--max-tokens", str(cap)])
    assert code == EXIT_BUDGET
    assert "token budget reached" in capsys.readouterr().err
    assert 0 < metered.billed * (PROMPT + COMPLETION) <= cap


def test_the_budget_caps_the_run_not_each_invocation_of_it(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """'rerun with a larger budget to resume': the same budget again pays nothing more (a CI
    retry loop had paid a budget's worth on every try); a larger one pays only the rest."""
    metered = Metered()
    server = make_server(responder=metered, latency=0.02)
    config = _config(tmp_path, server, concurrency=8)
    argv = ["run", str(config), "--out", str(tmp_path / "o"), "--max-tokens", "5000"]
    assert main(argv) == EXIT_BUDGET
    first = metered.billed
    assert 0 < first * (PROMPT + COMPLETION) <= 5000
    capsys.readouterr()
    assert main([*argv, "--dry-run"]) == 0  # the dry run says what the cap already counts
    spent = first * (PROMPT + COMPLETION)
    assert f"budget: earlier invocations of this run spent {spent} tokens" in (
        capsys.readouterr().out
    )
    for _ in range(2):
        assert main(argv) == EXIT_BUDGET
        err = capsys.readouterr().err
        assert "of it by earlier invocations of this run" in err, err
    assert metered.billed == first
    argv[-1] = str(5000 + 30 * (PROMPT + COMPLETION))
    assert main(argv) == EXIT_BUDGET
    assert first < metered.billed <= first + 30
    assert (metered.billed) * (PROMPT + COMPLETION) <= int(argv[-1])
    summary = json.loads((tmp_path / "o" / "summary.json").read_text(encoding="utf-8"))
    assert summary["run"]["prompt_tokens"] == (metered.billed - first) * PROMPT  # this one's


def test_a_run_killed_outright_resumes_under_what_it_may_have_paid(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """kill -9 gives a run no chance to say what it spent: the budget keeps in run.json what
    it may have spent (settled answers and the worst case of those in flight) before each
    request that takes it a step further, so the resumed run stays under the cap. It had
    kept its ledger every 5 s only, and a run killed sooner resumed as if it had paid
    nothing: the two paid the cap twice over."""
    metered = Metered()
    server = make_server(responder=metered, latency=0.02)
    config = _config(tmp_path, server, concurrency=4)
    cap = 20_000  # about 180 of the 240 answers
    argv = ["run", str(config), "--out", str(tmp_path / "o"), "--max-tokens", str(cap)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "judge", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while metered.billed < 20:
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "the run never got going"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert metered.billed < 120  # killed well before its cap
    capsys.readouterr()
    assert main(argv) == EXIT_BUDGET
    assert metered.billed * (PROMPT + COMPLETION) <= cap
    # What the killed run spent is a bound (its requests in flight at their worst case), and
    # the line says so rather than "spent".
    err = capsys.readouterr().err
    assert "token budget reached: spent at most " in err, err
    assert "one was stopped outright, its requests in flight counted at their worst case" in err
    # --fresh starts the judging over, not the budget: it pays nothing past the cap either.
    billed = metered.billed
    assert main([*argv, "--fresh"]) == EXIT_BUDGET
    assert metered.billed == billed


def test_what_an_uncapped_run_killed_outright_spent_counts_under_a_later_cap(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A run without a cap kept what it spent only on its 5 s timer: killed sooner, its
    rerun under a cap counted nothing of it, and the two together passed the cap."""
    metered = Metered()
    server = make_server(responder=metered, latency=0.02)
    config = _config(tmp_path, server, concurrency=4)
    out = tmp_path / "o"
    proc = subprocess.Popen(
        [sys.executable, "-m", "judge", "run", str(config), "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def kept() -> int:  # the tokens run.json says were spent (0: none said)
        try:
            said = json.loads((out / "run.json").read_text(encoding="utf-8")).get("spent")
        except (OSError, ValueError):
            return 0
        return int(said["prompt_tokens"] + said["completion_tokens"]) if said else 0

    try:  # killed just after it said what it spent (every 10,000 tokens, uncapped)
        deadline = time.monotonic() + 60
        while not kept():
            assert proc.poll() is None, "the run ended before it said what it spent"
            assert time.monotonic() < deadline, "the run never said what it spent"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    before = metered.billed
    assert 0 < before < 200 and kept() >= before * (PROMPT + COMPLETION) // 2
    cap = 20_000  # the 240 answers cost 26,400: the rest would fit, had the first not counted
    capsys.readouterr()
    assert main(["run", str(config), "--out", str(out), "--max-tokens", str(cap)]) == EXIT_BUDGET
    # Within the answers sent between the ledger's last word and the kill.
    assert metered.billed * (PROMPT + COMPLETION) <= cap + 8 * (PROMPT + COMPLETION)
    assert "spent at most " in capsys.readouterr().err


@pytest.mark.parametrize(
    "spent", ['"a lot"', '{"prompt_tokens": -5000, "completion_tokens": 0}', "[]"]
)
def test_a_damaged_spend_record_is_refused_not_read_as_nothing_spent(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    spent: str,
) -> None:
    """run.json's spend, damaged, had counted as nothing spent (or a negative spend), and the
    rerun paid the whole cap again."""
    metered = Metered()
    server = make_server(responder=metered)
    config = _config(tmp_path, server, concurrency=4)
    out = tmp_path / "o"
    argv = ["run", str(config), "--out", str(out), "--max-tokens", "5000"]
    assert main(argv) == EXIT_BUDGET
    paid = metered.billed
    data = json.loads((out / "run.json").read_text(encoding="utf-8"))
    (out / "run.json").write_text(
        json.dumps({**data, "spent": json.loads(spent)}), encoding="utf-8"
    )
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{out / 'run.json'}" in err[0] and "field 'spent'" in err[0], err
    assert metered.billed == paid


def test_the_budget_stop_states_what_was_spent_in_the_end(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Long passages' worst cases stop fitting before short ones' do, so requests go on after
    the first refusal, and those in flight settle after it: the line printed says the final
    spend, which is what the server billed."""
    metered = Metered()
    server = make_server(responder=metered, latency=0.05)
    rows = [
        {
            "query_id": f"q{q}",
            "query": f"question number {q}",
            "engine": "bm25",
            "passages": [
                {"id": f"q{q}-p{p}", "text": " ".join(["long"] * (900 if p % 2 else 3))}
                for p in range(6)
            ],
        }
        for q in range(20)
    ]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    config = write_config(
        tmp_path / "run.toml",
        server,
        tmp_path / "cache.sqlite",
        {"dataset": {"path": str(data)}, "run": {"concurrency": 16}},
    )
    cap = 8_000
    code = main(["run", str(config), "--out", str(tmp_path / "o"), "--max-tokens", str(cap)])
    assert code == EXIT_BUDGET
    err = capsys.readouterr().err
    stated = re.search(r"judge: token budget reached: spent (\d+) of 8000 tokens", err)
    assert stated, err
    billed = metered.billed * (PROMPT + COMPLETION)
    assert 0 < billed <= cap and int(stated.group(1)) == billed


def test_a_dollar_cap_without_a_price_is_refused_before_any_call(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = make_server(responder=Metered())
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite")
    assert main(["run", str(config), "--out", str(tmp_path / "o"), "--max-cost", "1"]) == 2
    err = capsys.readouterr().err
    assert "max_cost" in err and "judge-test" in err and "[prices" in err
    assert server.requests == []


@pytest.mark.parametrize("provider", ["local", "dashscope"])
@pytest.mark.parametrize(
    ("usage", "name"),
    [
        ((-1_000_000, -5), "negative"),
        (("100", "ten"), "text"),
        ((2.7, 3), "fractional"),
        ((0, 0), "zero"),
        (None, "missing"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_usage_that_is_not_a_count_is_counted_at_the_worst_case_and_keeps_the_cap(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    usage: tuple[Any, Any] | None,
    name: str,
    provider: str,
) -> None:
    """A server whose usage counts are not counts neither lifts the budget (a negative count
    was a negative spend, and no usage or zero counts no spend: every request went out past
    the cap, on either wire protocol) nor costs the verdict (text counts failed the answer,
    retried six times): the answer is kept and counted at the worst case its request
    reserved."""
    inner = hashed_responder()

    def odd(request: Recorded) -> Item:
        answer = inner(request)
        assert isinstance(answer, Answer)
        if usage is None:
            return dataclasses.replace(answer, usage_left_out=True)
        return dataclasses.replace(answer, usage=usage)

    server = make_server(responder=odd)
    tables: dict[str, dict[str, Any]] = {"run": {"concurrency": 4}}
    if provider == "dashscope":
        monkeypatch.setenv("DASHSCOPE_API_KEY", "sk-test")
        tables |= {
            "judge": {"provider": "dashscope"},
            "provider": {"base_url": server.dashscope_base_url},
        }
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite", tables)
    code = main(["run", str(config), "--out", str(tmp_path / "o"), "--max-tokens", "8000"])
    err = capsys.readouterr().err
    assert code == EXIT_BUDGET, err
    assert "token usage that is not a count" in caplog.text
    assert "token budget reached: spent at most" in err  # worst cases: an upper bound
    answered = [r for r in server.requests if r.path.endswith(("/chat/completions", "/generation"))]
    assert 1 <= len(answered) < 20  # each answer priced at its worst case, under the cap
    labels = verdict_labels(tmp_path / "o")
    assert labels and all(label is not None for label in labels.values())
    # Its rerun says the same of what was spent before it: "at most" (it had said "spent").
    code = main(["run", str(config), "--out", str(tmp_path / "o"), "--max-tokens", "8000"])
    assert code == EXIT_BUDGET
    assert "token budget reached: spent at most" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra",
    [
        # The README's recipe for a reasoning model: its limit under another name.
        '[judge.params]\nomit = ["max_tokens"]\nextra_body = {max_completion_tokens = 20000}\n',
        # The same limit in the provider's extra body.
        '[judge.params]\nomit = ["max_tokens"]\n'
        "[provider.extra_body]\nmax_completion_tokens = 20000\n",
        # No limit sent at all: the budget's own generous bound.
        '[judge.params]\nomit = ["max_tokens"]\n',
    ],
    ids=["params", "provider", "none"],
)
def test_a_completion_limit_sent_under_another_name_is_the_worst_case_reserved(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: str,
) -> None:
    """With max_tokens omitted, each request had reserved the 512 tokens it no longer sent:
    a cap of 8,000 tokens let out requests answered with 15,080."""
    inner = hashed_responder()

    def long(request: Recorded) -> Item:
        answer = inner(request)
        assert isinstance(answer, Answer)
        return dataclasses.replace(answer, usage=(80, 15000))

    server = make_server(responder=long)
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite")
    with config.open("a", encoding="utf-8") as fh:
        fh.write(extra)
    code = main(["run", str(config), "--out", str(tmp_path / "o"), "--max-tokens", "8000"])
    err = capsys.readouterr().err
    assert code == EXIT_BUDGET, err
    assert [r for r in server.requests if r.path.endswith("/chat/completions")] == []
    with config.open("a", encoding="utf-8") as fh:  # priced: the dry run says its worst case
        fh.write('[prices."judge-test"]\nprompt = 10.0\ncompletion = 30.0\n')
    assert main(["run", str(config), "--dry-run"]) == 0
    out = capsys.readouterr().out
    worst = re.search(r"at most \$(\d+\.\d+)", out)
    assert worst, out
    # 56 calls, each at least 8,192 completion tokens at $30 per 1M: above $13.
    assert float(worst.group(1)) > 56 * 8192 * 30 / 1e6, out


def test_usage_above_what_the_request_allowed_is_counted_as_reported_and_said(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An answer said to use 100,000 completion tokens, for a request allowed 512, had been
    counted in silence: the spend passed the cap with no word of why."""
    inner = hashed_responder()

    def over(request: Recorded) -> Item:
        answer = inner(request)
        assert isinstance(answer, Answer)
        return dataclasses.replace(answer, usage=(100, 100_000))

    server = make_server(responder=over)
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite")
    code = main(["run", str(config), "--out", str(tmp_path / "o"), "--max-tokens", "8000"])
    assert code == EXIT_BUDGET
    spent = re.search(r"spent (\d+) of 8000 tokens", capsys.readouterr().err)
    assert spent and int(spent.group(1)) % 100_100 == 0 and int(spent.group(1)) > 8000
    said = [
        r.message for r in caplog.records if "more tokens than their requests allow" in r.message
    ]
    assert len(said) == 1 and "100000 completion, for at most" in said[0], said


@pytest.mark.parametrize("flag", ["--max-cost", "--max-tokens"])
def test_a_budget_of_zero_is_refused_not_taken_for_none(
    server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    """0 had meant "no budget": a user who passed it to spend nothing spent without limit."""
    config = write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite")
    assert main(["run", str(config), "--out", str(tmp_path / "out"), flag, "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "0 caps nothing" in err[0]
    assert not server.requests


def test_the_bound_is_kept_a_step_after_the_last_one_kept_even_when_that_was_lower() -> None:
    """A ledger kept on a timer tells the bound after requests settled far below their worst
    case: the next step counts from that lower bound. It had counted from the highest bound
    told, and 22 requests of 2,000 tokens left with the ledger 44,000 tokens behind."""
    import asyncio

    from judge.calling.limits import Budget, Limits
    from judge.schema import Usage

    async def scenario() -> list[int]:
        budget = Budget(Limits(max_tokens=100_000))  # a step: 2,000 tokens
        told: list[int] = []
        budget.on_bound = lambda bound: told.append(bound.total)
        held = [await budget.reserve(1_000, 1_000) for _ in range(32)]  # 64,000 worst case
        for reservation in held:
            budget.settle(reservation, Usage(prompt_tokens=500, completion_tokens=100))
        budget.tell_bound()  # the timer's ledger: 19,200 spent, nothing in flight
        told.clear()
        for _ in range(3):
            await budget.reserve(1_000, 1_000)
        return told

    assert asyncio.run(scenario()) == [21_200, 23_200, 25_200]  # each step told, from 19,200
