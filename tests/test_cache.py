"""The completion cache: shared by many tasks and processes, managed from the CLI, and
holding only answers that parsed."""

from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from judge.calling.cache import Cache
from judge.cli.main import main
from judge.config import RunConfig, load_config
from judge.data.datasets import read_results
from judge.data.results import RESULTS_FILE
from judge.providers.base import Completion, RerankResult
from judge.run.runner import run_async
from judge.schema import Passage, Query, Usage
from tests.servers import Fault, ScriptedServer

PER_PROCESS = 500
SHARED = 50  # keys both processes write


def completion(text: str) -> Completion:
    return Completion(text=text, model="m", usage=Usage(prompt_tokens=3, completion_tokens=1))


def _writer(path: str, name: str, start: Any) -> None:
    """One process's share: its own keys plus keys the other process writes too."""
    start.wait()  # both open the fresh file at once, then write at once
    cache = Cache(path)
    for i in range(PER_PROCESS):
        cache.put(f"{name}-{i}", completion(f"{name} {i}"), kind="chat", model=name)
        if i < SHARED:
            cache.put(f"shared-{i}", completion(f"shared {i}"), kind="chat", model="shared")
    cache.close()


def test_two_processes_writing_at_once_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "cache.sqlite")
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2, timeout=30)
    procs = [ctx.Process(target=_writer, args=(path, name, start)) for name in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        if p.exitcode is None:
            p.kill()
            p.join()
    assert [p.exitcode for p in procs] == [0, 0]

    cache = Cache(path)
    stats = cache.stats()
    assert stats.entries == 2 * PER_PROCESS + SHARED
    assert stats.by_model == {"a": PER_PROCESS, "b": PER_PROCESS, "shared": SHARED}
    for name in ("a", "b"):
        for i in range(PER_PROCESS):
            got = cache.get(f"{name}-{i}", Completion)
            assert got is not None and got.text == f"{name} {i}"
    cache.close()


def test_many_tasks_share_one_cache(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache.sqlite")

    async def task(n: int) -> list[str | None]:
        seen: list[str | None] = []
        for i in range(20):
            key = f"k{(n * 7 + i) % 100}"
            cache.put(key, completion(key), kind="chat", model="m")
            got = await asyncio.to_thread(cache.get, key, Completion)
            seen.append(got.text if got else None)
        return seen

    async def everyone() -> list[list[str | None]]:
        return await asyncio.gather(*(task(n) for n in range(50)))

    results = asyncio.run(everyone())
    assert all(text is not None and text.startswith("k") for seen in results for text in seen)
    assert cache.stats().entries == 100
    assert cache.get("k42", Completion) == completion("k42")
    cache.close()


def test_an_entry_that_no_longer_reads_is_a_miss(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache.sqlite")
    cache.put("k", RerankResult(scores=(0.5,)), kind="rerank", model="r")
    assert cache.get("k", RerankResult) == RerankResult(scores=(0.5,))
    assert cache.get("k", Completion) is None
    cache.close()


def test_an_answer_whose_logprobs_are_not_numbers_reads_back(tmp_path: Path) -> None:
    """A server's NaN or infinite logprob was stored as null (JSON has no NaN), then could
    not be read back: the answer was said to be another version's, and paid for again."""
    raw = (
        '{"text": "yes", "logprobs": [{"token": "yes", "logprob": NaN, '
        '"top": [{"token": "yes", "logprob": -Infinity}, {"token": "no", "logprob": -0.1}]}]}'
    )
    answer = Completion.model_validate_json(raw)
    cache = Cache(tmp_path / "c.sqlite")
    cache.put("k", answer, kind="chat", model="m")
    cache.close()
    again = Cache(tmp_path / "c.sqlite")
    found = again.get_stored("k", Completion)
    again.close()
    assert found is not None and found.value == answer


def test_a_thousand_unreadable_entries_make_one_warning_line_not_a_thousand(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = Cache(tmp_path / "cache.sqlite")
    for i in range(1000):
        cache.put(f"k{i}", RerankResult(scores=(0.5,)), kind="rerank", model="r")
    with caplog.at_level("WARNING", logger="judge.calling.cache"):
        assert all(cache.get(f"k{i}", Completion) is None for i in range(1000))
        for i in range(600):  # asked again: the new answers replace them
            cache.put(f"k{i}", completion(f"k{i}"), kind="chat", model="m")
        cache.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert "1000 cache entries could not be read" in lines[0]
    assert "600 asked again and overwritten in place, 400 left in place" in lines[0]
    assert Cache(tmp_path / "cache.sqlite").stats().entries == 1000  # none moved


def test_answers_named_by_many_aliases_are_read_in_one_lookup(tmp_path: Path) -> None:
    """What one query's cached passages are read with: each alias gets its own answer, an
    alias naming nothing (or an answer this version cannot read) is left for the caller."""
    cache = Cache(tmp_path / "cache.sqlite")
    for i in range(3):
        cache.put(f"k{i}", completion(f"k{i}"), kind="chat", model="m", alias=f"a{i}")
    cache.put("r", RerankResult(scores=(0.5,)), kind="rerank", model="r", alias="ar")
    found = cache.get_stored_many(["a2", "a0", "nope", "ar", "a1"], Completion)
    assert sorted(found) == ["a0", "a1", "a2"]
    assert all(found[f"a{i}"].value == completion(f"k{i}") for i in range(3))
    assert [found[f"a{i}"].key for i in range(3)] == ["k0", "k1", "k2"]
    assert cache.get_stored_many([], Completion) == {}
    cache.close()
    assert Cache(None).get_stored_many(["a0"], Completion) == {}


def test_disabled_cache_stores_nothing(tmp_path: Path) -> None:
    cache = Cache(None)
    cache.put("k", completion("x"), kind="chat", model="m")
    assert not cache.enabled and cache.get("k", Completion) is None


def _age(path: Path, days: float, model: str) -> None:
    """Backdate one model's entries, as if written ``days`` ago."""
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE answers SET created = ? WHERE model = ?", (time.time() - days * 86400, model)
        )
    conn.close()


def test_cache_stats_prune_and_clear_from_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cache.sqlite"
    cache = Cache(path)
    for i in range(6):
        cache.put(f"old-{i}", completion("x"), kind="chat", model="old-model")
    for i in range(4):
        cache.put(f"new-{i}", completion("y"), kind="chat", model="new-model")
    cache.close()
    _age(path, 30, "old-model")
    where = ["--cache", str(path)]

    assert main(["cache", "stats", *where]) == 0
    out = capsys.readouterr().out
    assert "10 answers" in out and "old-model: 6" in out and "new-model: 4" in out

    assert main(["cache", "prune", *where]) == 2
    assert "--older-than" in capsys.readouterr().err
    for age in ("-1", "nan", "inf"):  # a negative age would remove every answer
        assert main(["cache", "prune", "--older-than", age, *where]) == 2
        assert "--older-than must be a number of days >= 0" in capsys.readouterr().err
    assert main(["cache", "stats", *where]) == 0
    assert "10 answers" in capsys.readouterr().out

    assert main(["cache", "prune", "--older-than", "7", *where]) == 0
    assert "removed 6 answers older than 7.0 days" in capsys.readouterr().out
    assert main(["cache", "stats", *where]) == 0
    out = capsys.readouterr().out
    assert "4 answers" in out and "old-model" not in out

    # clear removes every answer: given an age (as prune takes), it refuses rather than that
    assert main(["cache", "clear", "--older-than", "5", *where]) == 2
    assert "judge cache clear takes no --older-than" in capsys.readouterr().err
    assert main(["cache", "clear", *where]) == 0
    assert "removed 4 answers" in capsys.readouterr().out
    assert main(["cache", "stats", *where]) == 0
    assert "0 answers" in capsys.readouterr().out


KETTLE = Query(query_id="q", query="what is a kettle", passages=(Passage(id="p", text="A pot."),))


def _one_passage_config(server: ScriptedServer, tmp_path: Path) -> RunConfig:
    """A judge of ``server`` whose cache is shared by every run in ``tmp_path``."""
    return load_config(
        None,
        {
            "judge.provider": "local",
            "judge.model": "judge-test",
            "provider.base_url": server.openai_base_url,
            "run.cache": str(tmp_path / "cache.sqlite"),
            "run.backoff_base_s": 0.01,
            "run.max_attempts": 2,
        },
    )


def _judge_once(
    server: ScriptedServer, tmp_path: Path, out: str, redo: frozenset[str] = frozenset()
) -> list[str]:
    """Judge one passage (fresh run directory, shared cache); its verdict statuses."""
    config = _one_passage_config(server, tmp_path)
    outcome = asyncio.run(run_async(config, [KETTLE], tmp_path / out, redo=redo))
    _judge_once.hits = outcome.cache_hits  # type: ignore[attr-defined]
    return [v.status for jq in read_results(tmp_path / out / RESULTS_FILE) for v in jq.verdicts]


def test_a_failed_answer_is_not_cached_and_is_asked_again(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    server = make_server()
    server.enqueue(*[Fault("status", 500)] * 2)
    assert _judge_once(server, tmp_path, "first") == ["error"]
    assert len(server.requests) == 2
    cache = Cache(tmp_path / "cache.sqlite")
    assert cache.stats().entries == 0
    cache.close()
    assert _judge_once(server, tmp_path, "second") == ["ok"]
    assert len(server.requests) == 3  # asked again, and this time the answer is kept
    assert _judge_once(server, tmp_path, "third") == ["ok"]
    assert len(server.requests) == 3


def test_an_answer_that_does_not_parse_is_kept_paid_once_and_asked_anew_only_by_redo(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """An answer the parser cannot read was paid: it is cached with its error, so a rerun (a
    resume after a stop before its re-ask, above all) reads it and goes on to the re-ask,
    paying neither again; --redo unparsed asks anew."""
    server = make_server()
    server.enqueue("not json at all", "still no verdict")
    assert _judge_once(server, tmp_path, "first") == ["unparsed"]
    assert len(server.requests) == 2  # the answer, and its re-ask
    cache = Cache(tmp_path / "cache.sqlite")
    assert cache.stats().entries == 2
    cache.close()
    assert _judge_once(server, tmp_path, "second") == ["unparsed"]
    assert len(server.requests) == 2  # both read from the cache, nothing paid again
    assert _judge_once.hits == 2  # type: ignore[attr-defined]
    # Found by the rendered request's key (no alias names it): read once, counted once.
    with sqlite3.connect(tmp_path / "cache.sqlite") as conn:
        conn.execute("DELETE FROM aliases")
    conn.close()
    assert _judge_once(server, tmp_path, "again") == ["unparsed"]
    assert len(server.requests) == 2 and _judge_once.hits == 2  # type: ignore[attr-defined]
    # What a dry run of --redo unparsed would pay: the answer it asks anew, not cached.
    from judge.run.estimate import estimate

    config, query = _one_passage_config(server, tmp_path), KETTLE
    assert estimate(config, [query], tmp_path / "dry").cached_calls == 1
    redone = estimate(config, [query], tmp_path / "dry", redo=frozenset({"unparsed"}))
    assert (redone.calls, redone.cached_calls) == (1, 0)
    assert _judge_once(server, tmp_path, "third", frozenset({"unparsed"})) == ["ok"]
    assert len(server.requests) == 3  # asked anew: this time it reads
    assert _judge_once(server, tmp_path, "fourth") == ["ok"]
    assert len(server.requests) == 3


def test_a_unit_stopped_between_an_unread_answer_and_its_re_ask_pays_only_the_re_ask(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """The first answer does not parse, its re-ask fails (the provider is down): the unit
    ends in an error and is asked again on the rerun, which reads the paid first answer from
    the cache and sends only the re-ask (it had paid for the first answer again)."""
    server = make_server()
    server.enqueue("not json at all", *[Fault("status", 500)] * 2)
    assert _judge_once(server, tmp_path, "run") == ["error"]
    assert len(server.requests) == 3
    assert _judge_once(server, tmp_path, "run") == ["ok"]
    assert len(server.requests) == 4
    said = [m["content"] for m in server.requests[-1].body["messages"]]
    assert "not json at all" in said  # the re-ask, after the answer it asks about


def test_a_database_that_is_not_a_cache_is_refused_not_written_into_nor_moved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run history (or any SQLite file of other tables) named as the cache: cache commands
    wrote the cache's tables into it (and clear would have moved it aside as damaged)."""
    import sqlite3

    other = tmp_path / "history.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY)")
    conn.close()
    for action in ("stats", "check", "clear"):
        assert main(["cache", action, "--cache", str(other)]) == 2
        assert f"{other}: not a judge cache (it holds other tables: runs)" in (
            capsys.readouterr().err
        )
    with sqlite3.connect(other) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    conn.close()
    assert tables == {"runs"} and other.exists()


def test_two_runs_sharing_a_cache_at_once_pay_for_each_answer_once(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """The cache is every run's of the user: two runs at once on the same passages had each
    paid for every answer (in-flight requests were shared within a process only). A request
    is claimed in the cache before it is sent, and the other run waits for its answer."""
    from tests.test_runner import write_config, write_dataset

    server = make_server(latency=0.2)
    dataset = write_dataset(tmp_path / "d.jsonl", n_queries=6, n_passages=5)
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "judge", "run", str(config), str(dataset), "--out", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for out in (tmp_path / "a", tmp_path / "b")
    ]
    try:
        errors = [run.communicate(timeout=120)[1] for run in runs]
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()
    assert [run.returncode for run in runs] == [0, 0], errors
    asked = Counter(r.prompt for r in server.requests if r.path.endswith("/chat/completions"))
    assert len(asked) == 30 and max(asked.values()) == 1, asked.most_common(3)
    for out in ("a", "b"):
        assert len(read_results(tmp_path / out / RESULTS_FILE)) == 6


def test_a_claim_its_process_left_behind_is_taken_over_at_once(tmp_path: Path) -> None:
    """A run killed outright leaves its claims: a claim whose process is gone is taken over,
    not waited on; a live one is waited on; one older than CLAIM_STALE_S is taken over."""
    from judge.calling import cache as cache_module

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    first, second = Cache(tmp_path / "c.sqlite"), Cache(tmp_path / "c.sqlite")
    assert first.claim("k") is True
    assert second.claim("k") is False  # this process lives: it is asked for now
    first._conn.execute("UPDATE claims SET pid = ? WHERE key = 'k'", (int(gone.stdout),))
    assert second.claim("k")  # its process is gone
    assert first.claim("other")
    first._conn.execute("UPDATE claims SET host = 'elsewhere', at = 0 WHERE key = 'other'")
    assert second.claim("other")  # too old, wherever its process was
    second.put("k", completion("answer"), kind="chat", model="m")
    # The answer let it go, and no claim is taken on an answer stored: it is read instead.
    assert first.claim("k") is None
    assert first.claim("unanswered") is True
    assert cache_module.CLAIM_STALE_S > 60
    first.close()
    second.close()
