"""The Python API for many queries: ``Judge.judge_many`` / ``ajudge_many`` through the real openai
SDK against loopback servers, its tables (``to_records`` / ``to_pandas``), ``read_run`` on what
``judge run`` wrote, and the sync edge inside a running event loop and under Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import judge
from judge import (
    BudgetExceeded,
    ConfigError,
    InputError,
    Judge,
    Judgements,
    Limits,
    ProviderError,
    Query,
    Scale,
)
from judge.calling.cache import open_cache
from judge.cli.main import main
from judge.config import Price, load_config
from judge.providers.base import ProviderSpec
from tests.servers import Fault, ScriptedServer, keyword_responder
from tests.test_budget import EACH, PRICE, Metered
from tests.test_cascade import text_scorer, write_config
from tests.test_e2e_embedded import llama_servers
from tests.test_embedded import require_embedded
from tests.test_embedded_rerank import require_minilm

ROOT = Path(__file__).resolve().parent.parent
FAST = Limits(max_attempts=3, backoff_base_s=0.01, timeout_s=5.0)
CHAT = "/v1/chat/completions"


def row(qid: str, engine: str, texts: list[str], **extra: Any) -> dict[str, Any]:
    """A dataset row whose passages are ``<qid>-<engine>-<i>``."""
    passages = [{"id": f"{qid}-{engine}-{i}", "text": t} for i, t in enumerate(texts)]
    base = {"query_id": qid, "query": f"question {qid}", "engine": engine, "passages": passages}
    return base | extra


def make_judge(srv: ScriptedServer, **kwargs: Any) -> Judge:
    options: dict[str, Any] = {"limits": FAST, **kwargs}
    return Judge(provider="local", model="judge-model", base_url=srv.openai_base_url, **options)


def chat_calls(srv: ScriptedServer) -> int:
    return sum(r.path == CHAT for r in srv.requests)


@pytest.fixture
def yes_if_pale() -> Iterator[ScriptedServer]:
    with ScriptedServer(responder=keyword_responder({"pale": "yes"}, "no")) as srv:
        yield srv


# --- rows in, judged queries out ------------------------------------------------------------


def test_rows_of_both_dataset_shapes_and_queries_are_judged_in_order(
    yes_if_pale: ScriptedServer,
) -> None:
    rows = [
        row("q1", "bm25", ["pale gums", "dog food", "pale and tired"], labels={"q1-bm25-0": 1}),
        {
            "query": "what is anaemia?",
            "retrieved_ids": ["x", "y"],
            "retrieved_texts": ["red", "pale"],
        },
        Query(query_id="q3", query="third", passages=(judge.Passage(id="z", text="pale"),)),
    ]
    with make_judge(yes_if_pale) as j:
        got = j.judge_many(rows, repeats=2, progress=False)
    assert isinstance(got, Judgements) and len(got) == 6
    # The rows' order, each row's repeats side by side; a dict without query_id is named by index.
    assert [jq.key for jq in got] == [
        ("q1", "bm25", 0),
        ("q1", "bm25", 1),
        ("row1", "default", 0),
        ("row1", "default", 1),
        ("q3", "default", 0),
        ("q3", "default", 1),
    ]
    assert [v.label for v in got[0].verdicts] == ["yes", "no", "yes"]
    assert [v.passage_id for v in got[2].verdicts] == ["x", "y"]
    assert got[0].metrics["ap"] == pytest.approx((1 + 2 / 3) / 2)  # relevant at ranks 1 and 3
    assert got[0].query.labels == {"q1-bm25-0": 1} and got[2].query.source == "rows[1]"
    # No cache: every passage of every repeat was asked once (6 passages x 2 repeats).
    assert chat_calls(yes_if_pale) == 12


def test_bad_rows_fail_together_naming_index_and_field_before_any_request(
    yes_if_pale: ScriptedServer,
) -> None:
    rows: list[Any] = [
        row("q1", "bm25", ["fine"]),
        {"query_id": "q2", "passages": [{"id": "a", "text": "no query"}]},
        "just a string",
        {"query": "q", "passages": [{"id": "a", "text": 3}]},
        row("q1", "bm25", ["the same (query, engine) again"]),
    ]
    with make_judge(yes_if_pale) as j, pytest.raises(InputError) as caught:
        j.judge_many(rows, progress=False)
    assert str(caught.value).splitlines() == [
        "4 input errors:",
        "  rows[1]: field 'query': missing",
        "  rows[2]: expected a dataset row (a dict) or a Query, got str",
        "  rows[3]: field 'passages[0].text': expected a string, got a number",
        "  rows[4]: field 'query_id': duplicate row for query 'q1', engine 'bm25'"
        " (first at rows[0])",
    ]
    assert yes_if_pale.requests == []
    with (
        make_judge(yes_if_pale) as j,
        pytest.raises(InputError, match=r"^rows\[0\]: field 'query'"),
    ):
        j.judge_many([{"query": " ", "passages": []}])
    with make_judge(yes_if_pale) as j, pytest.raises(judge.ConfigError, match="repeats"):
        j.judge_many([row("q", "e", ["x"])], repeats=0)
    assert yes_if_pale.requests == []


@pytest.mark.parametrize(
    ("query", "passages", "said"),
    [
        (
            "q",
            "one string",
            "passages: expected a list of passages (strings, dicts or Passages), got one str",
        ),
        ("q", {"id": "a", "text": "x"}, "passages: expected a list of passages"),
        ("q", ["fine", None], "passages[1]: expected a string, a dict or a Passage, got NoneType"),
        ("q", [b"bytes"], "passages[0]: expected a string, a dict or a Passage, got bytes"),
        ("q", [{"text": 5}], "passages[0]: field 'text': Input should be a valid string"),
        (123, ["a"], "query: expected a string or a Query, got int"),
        (" ", ["a"], "query: empty"),
        ("q", "DataFrame", "passages: got a DataFrame, whose iteration gives its column names"),
    ],
)
def test_judge_refuses_what_is_not_a_query_and_its_passages_before_any_request(
    yes_if_pale: ScriptedServer, query: Any, passages: Any, said: str
) -> None:
    """A string where the list goes would be judged (and paid for) a character at a time, a
    DataFrame a column name at a time."""
    if passages == "DataFrame":
        pandas = pytest.importorskip("pandas")
        passages = pandas.DataFrame({"text": ["pale gums", "dog food"]})
    with make_judge(yes_if_pale) as j, pytest.raises(InputError) as caught:
        j.judge(query, passages)
    assert str(caught.value).startswith(said)
    assert yes_if_pale.requests == []


def test_judge_cuts_a_long_passage_as_a_dataset_row_is_cut(yes_if_pale: ScriptedServer) -> None:
    long = " ".join(f"pale{i}" for i in range(5000))
    with make_judge(yes_if_pale) as j:
        one = j.judge("q", [{"id": "a", "text": long}]).query.passages[0]
        rows = [{"query": "q", "passages": [{"id": "a", "text": long}]}]
        many = j.judge_many(rows, progress=False)[0]
    assert one.truncated_from == len(long) and len(one.text) < 8100  # the cut and its marker
    assert one.text == many.query.passages[0].text


def test_calls_in_flight_stay_under_the_judges_concurrency_limit() -> None:
    """The server itself counts the requests it is answering at once."""
    lock, now, peak = threading.Lock(), [0], [0]
    inner = keyword_responder({"pale": "yes"}, "no")

    def slow(request: Any) -> Any:
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(0.05)  # hold the request so that others can pile up behind it
        with lock:
            now[0] -= 1
        return inner(request)

    rows = [row(f"q{i}", "bm25", [f"text {i} {k}" for k in range(4)]) for i in range(6)]
    with ScriptedServer(responder=slow) as srv:
        limits = Limits(concurrency=3, adaptive=False, timeout_s=5.0)
        with make_judge(srv, limits=limits) as j:
            got = j.judge_many(rows, progress=False)
    assert sum(len(jq.verdicts) for jq in got) == 24 == chat_calls(srv)
    assert 1 < peak[0] <= 3


def test_the_budget_stops_the_batch_and_is_a_hard_cap() -> None:
    metered = Metered()
    rows = [row(f"q{i}", "bm25", [f"text {i} {k}" for k in range(3)]) for i in range(10)]
    cap = 0.03  # 30 passages at $0.0013 would cost $0.039
    limits = Limits(max_cost=cap, price=Price(**PRICE), timeout_s=5.0, concurrency=4)
    with ScriptedServer(responder=metered, latency=0.02) as srv:
        with make_judge(srv, limits=limits) as j, pytest.raises(BudgetExceeded) as stop:
            j.judge_many(rows, progress=False)
    assert 0 < metered.billed * EACH <= cap
    assert metered.billed < 30
    # No cache: nothing judged is kept, so a rerun would not resume; said so.
    assert "this Judge has no cache, so what was judged is not kept" in str(stop.value)
    assert "rerun with a larger budget to resume" not in str(stop.value)


def test_a_provider_refusing_every_request_stops_the_batch_early() -> None:
    rows = [row(f"q{i}", "bm25", [f"text {i}"]) for i in range(30)]
    with ScriptedServer(responder=lambda _r: Fault("status", 401)) as srv:
        limits = Limits(concurrency=1, timeout_s=5.0)
        with make_judge(srv, limits=limits) as j, pytest.raises(ProviderError) as caught:
            j.judge_many(rows, progress=False)
        asked = chat_calls(srv)
    assert "refuses every request" in str(caught.value) and "401" in str(caught.value)
    assert 3 <= asked < 30


def test_progress_bar_on_stderr_unless_turned_off(
    yes_if_pale: ScriptedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [row(f"q{i}", "bm25", ["pale", "grey"]) for i in range(3)]
    with make_judge(yes_if_pale) as j:
        j.judge_many(rows)
        shown = capsys.readouterr()
        j.judge_many(rows, progress=False)
        quiet = capsys.readouterr()
    assert "judging: 100%" in shown.err and "6/6 [" in shown.err and "passages 6" in shown.err
    assert shown.out == "" and quiet.err == "" and quiet.out == ""


# --- the same as `judge run`: cache, cascade, results ------------------------------------------


def test_judge_many_and_judge_run_share_cascade_cache_and_results(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """judge_many first (fresh), then `judge run` on the same config: it pays nothing more,
    and read_run gives back the verdicts judge_many returned."""
    server = make_server(
        responder=keyword_responder({"passage 3": "yes"}, "no"), scorer=text_scorer
    )
    config_path = write_config(tmp_path, server, {"quantiles": [0.2, 0.8]})
    config = load_config(config_path)
    rows = [json.loads(line) for line in Path(config.dataset.path).read_text().splitlines()]
    cache = open_cache(config)
    with Judge.from_config(config, cache=cache, limits=Limits.from_config(config)) as j:
        got = j.judge_many(rows, progress=False)
        band = j.cascade.band if j.cascade else None
    # The band from quantiles 0.2 and 0.8 of all 20 scores, fitted before any LLM call: the
    # three middle passages of each of the 4 queries went to the LLM, the rest the reranker's.
    assert band is not None and (band.low, band.high) == pytest.approx((0.29, 0.70), abs=0.01)
    assert chat_calls(server) == 12
    # Per query: its scores, and its passage above the band with the query's words masked.
    assert sum(r.path == "/v1/rerank" for r in server.requests) == 4 * 2
    sources = [v.source for jq in got for v in jq.verdicts]
    assert sources.count("judge") == 12 and sources.count("reranker") == 8
    sent = len(server.requests)

    out = tmp_path / "out"
    assert main(["run", str(config_path), "--out", str(out)]) == 0
    assert len(server.requests) == sent  # every answer came from judge_many's cache entries

    run = judge.read_run(out)
    assert isinstance(run, Judgements) and run.summary is not None
    assert run.summary.counts.verdicts == 20 and run.path == out
    by_summary = judge.read_run(out / "summary.json")  # the run's summary names the run
    assert by_summary.path == out and len(by_summary) == len(run)

    def same(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        keys = ("query_id", "engine", "repeat", "passage_id", "label", "grade", "source")
        return sorted(tuple(r[k] for k in keys) for r in records)

    assert same(run.to_records()) == same(got.to_records())
    assert all(r["cached"] for r in run.to_records())
    by_key = {(r["query_id"], r["engine"]): r for r in got.to_records("queries")}
    for r in run.to_records("queries"):
        mine = by_key[(r["query_id"], r["engine"])]
        assert {k: r[k] for k in config.metrics.names} == {k: mine[k] for k in config.metrics.names}


def test_read_run_of_a_directory_without_results_names_it(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such run directory"):
        judge.read_run(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"empty/verdicts.jsonl: no results yet"):
        judge.read_run(tmp_path / "empty")


# --- tables ---------------------------------------------------------------------------------


def _judged(srv: ScriptedServer, **kwargs: Any) -> Judgements:
    rows = [
        row("q1", "bm25", ["pale gums", "dog food"], labels={"q1-bm25-0": 2, "q1-bm25-1": 0}),
        row("q1", "dense", ["dog food again", "pale and tired"]),
    ]
    with make_judge(srv, **kwargs) as j:  # graded human labels beside a binary judge
        return j.judge_many(rows, progress=False, label_scale=Scale.named("graded"))


def test_passage_records_are_one_tidy_row_per_passage(yes_if_pale: ScriptedServer) -> None:
    records = _judged(yes_if_pale).to_records()
    assert len(records) == 4
    first = records[0]
    assert list(first) == [
        "query_id", "engine", "repeat", "query", "rank", "passage_id", "text", "status", "label",
        "grade", "relevant", "probability", "human_grade", "reason", "source", "cached",
        "latency_s", "attempts", "prompt_tokens", "completion_tokens",
    ]  # fmt: skip
    assert all(list(r) == list(first) for r in records)
    assert (first["passage_id"], first["label"], first["relevant"], first["human_grade"]) == (
        "q1-bm25-0",
        "yes",
        True,
        2,
    )
    assert first["probability"] == pytest.approx(0.9) and first["text"] == "pale gums"
    # The dense row has no labels: its human grade is missing, not 0.
    assert [r["human_grade"] for r in records] == [2, 0, None, None]
    assert [r["rank"] for r in records] == [1, 2, 1, 2]


def test_query_records_have_a_column_per_metric(yes_if_pale: ScriptedServer) -> None:
    got = _judged(yes_if_pale, metrics=["ap", "ndcg@5", "precision@1"])
    records = got.to_records("queries")
    assert [(r["query_id"], r["engine"], r["repeat"]) for r in records] == [
        ("q1", "bm25", 0),
        ("q1", "dense", 0),
    ]
    assert list(records[0])[-3:] == ["ap", "ndcg@5", "precision@1"]
    assert [r["precision@1"] for r in records] == [1.0, 0.0]
    assert [r["labelled"] for r in records] == [2, None]
    assert records[0]["passages"] == records[0]["ok"] == 2 and records[0]["error"] == 0
    with pytest.raises(ValueError, match="kind must be one of"):
        got.to_records("verdicts")  # type: ignore[arg-type]


def test_optional_columns_appear_only_when_some_row_has_them(yes_if_pale: ScriptedServer) -> None:
    plain = _judged(yes_if_pale).to_records()
    assert not {"rerank_score", "error", "raw", "title", "url"} & set(plain[0])
    spec = ProviderSpec(kind="rerank", base_url=yes_if_pale.url)
    scored = _judged(yes_if_pale, rerank=spec, rerank_model="r").to_records()
    assert all(0.0 <= r["rerank_score"] <= 1.0 for r in scored)


def test_to_pandas_has_the_records_columns_and_keeps_missing_values_missing(
    yes_if_pale: ScriptedServer,
) -> None:
    got = _judged(yes_if_pale)
    passages = got.to_pandas()
    assert passages.shape == (4, len(got.to_records()[0]))
    assert list(passages.columns) == list(got.to_records()[0])
    assert str(passages["grade"].dtype) == "Int64" and str(passages["relevant"].dtype) == "boolean"
    assert passages["human_grade"].isna().tolist() == [False, False, True, True]
    assert (passages.relevant == (passages.human_grade > 0)).mean() == 1.0
    queries = got.to_pandas("queries")
    assert queries.shape[0] == 2 and "ndcg@5" in queries.columns
    assert str(queries["ndcg@5"].dtype) == "Float64"
    empty = Judgements([]).to_pandas()
    assert empty.shape == (0, 19) and "passage_id" in empty.columns
    # The queries table's columns are the same with rows or without (its error count too).
    none = Judgements([]).to_pandas("queries")
    assert list(none.columns) == [c for c in queries.columns if c in none.columns]
    assert "error" in none.columns and "error" in queries.columns


def test_without_pandas_to_pandas_says_what_to_install(
    yes_if_pale: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    got = _judged(yes_if_pale)
    monkeypatch.setitem(sys.modules, "pandas", None)  # what an environment without pandas gives
    with pytest.raises(ImportError, match=r"pip install 'judge\[pandas\]'"):
        got.to_pandas()
    assert len(got.to_records()) == 4  # plain records need nothing


# --- the sync edge: inside a running loop (Jupyter), Ctrl-C ---------------------------------


def test_judge_many_and_ajudge_many_inside_a_running_event_loop(
    yes_if_pale: ScriptedServer,
) -> None:
    """As in a Jupyter cell: the sync call from code running in a loop, then the async one."""
    rows = [row(f"q{i}", "bm25", ["pale", "grey"]) for i in range(4)]

    async def cell() -> tuple[Judgements, Judgements]:
        with make_judge(yes_if_pale) as sync_judge:
            from_sync = sync_judge.judge_many(rows, progress=False)
        async_judge = make_judge(yes_if_pale)
        try:
            from_async = await async_judge.ajudge_many(rows, progress=False)
        finally:
            await async_judge.aclose()
        return from_sync, from_async

    from_sync, from_async = asyncio.run(cell())
    assert [v.label for jq in from_sync for v in jq.verdicts] == ["yes", "no"] * 4
    assert from_sync.to_records() != [] and len(from_async) == 4
    assert [jq.metrics for jq in from_async] == [jq.metrics for jq in from_sync]
    assert chat_calls(yes_if_pale) == 16


@pytest.mark.parametrize("in_loop", [False, True], ids=["script", "jupyter"])
def test_ctrl_c_cancels_the_batch_and_the_judge_still_works(in_loop: bool) -> None:
    """A SIGINT while judge_many waits (Ctrl-C in a script, "interrupt kernel" in Jupyter, where
    the call runs in a worker thread) stops the batch: no more requests are sent for it."""
    rows = [row(f"q{i}", "bm25", [f"slow pale text {i}"]) for i in range(20)]
    with ScriptedServer(responder=keyword_responder({"pale": "yes"}, "no"), latency=0.5) as srv:
        j = make_judge(srv, limits=Limits(concurrency=1, adaptive=False, timeout_s=10.0))

        def interrupt() -> None:
            deadline = time.monotonic() + 30
            while not srv.requests and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)

        def cell() -> str | None:
            threading.Thread(target=interrupt, daemon=True).start()
            with pytest.raises(KeyboardInterrupt):
                j.judge_many(rows, progress=False)
            asked[0] = len(srv.requests)
            return j.judge("one more", ["pale"]).verdicts[0].label

        asked = [0]
        # Jupyter's kernel lets SIGINT raise KeyboardInterrupt in the cell's code.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            if in_loop:
                loop = asyncio.new_event_loop()

                async def in_a_cell() -> str | None:
                    return cell()

                try:
                    label = loop.run_until_complete(in_a_cell())
                finally:
                    loop.close()
            else:
                label = cell()
        finally:
            signal.signal(signal.SIGINT, previous)
            j.close()
        total = len(srv.requests)
    assert 1 <= asked[0] < 5  # of the 20 the batch would have sent (0.5 s each, one at a time)
    assert label == "yes" and total < 7


def test_two_threads_first_calls_at_once_share_one_loop_and_both_finish() -> None:
    """Two threads' first calls on a new Judge at the same moment each made a loop of its own
    (the lazily made loop had no lock): their clients and limits then belonged to the other
    loop, and both waited forever."""
    with ScriptedServer(responder=keyword_responder({"pale": "yes"}, "no"), latency=0.05) as srv:
        for attempt in range(5):  # the race needs the two starts together: try a few times
            j = make_judge(srv, limits=Limits(concurrency=8, adaptive=False, timeout_s=10.0))
            start = threading.Barrier(2)
            got: dict[str, Any] = {}
            before = {t for t in threading.enumerate() if t.name == "judge-loop"}

            def call(
                name: str, j: Judge = j, start: threading.Barrier = start, got: Any = got
            ) -> None:
                rows = [row(f"{name}{i}", "bm25", ["pale a", "dog b"]) for i in range(5)]
                start.wait()
                got[name] = j.judge_many(rows, progress=False)

            threads = [threading.Thread(target=call, args=(n,), daemon=True) for n in "AB"]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            loops = sum(t.name == "judge-loop" and t not in before for t in threading.enumerate())
            hung = [t for t in threads if t.is_alive()]
            if not hung:
                j.close()
            assert not hung, f"attempt {attempt}: a call never returned"
            assert loops == 1, f"attempt {attempt}: {loops} loops for one Judge"
            assert sorted(got) == ["A", "B"]
            assert all(len(got[n]) == 5 for n in "AB")


def test_ctrl_c_in_one_thread_leaves_another_threads_call_on_the_same_judge_alone() -> None:
    """Two threads share one Judge (one loop, one pool); Ctrl-C stops the main thread's
    batch, and the worker's batch finishes with every verdict, none cancelled or failed."""
    mine = [row(f"m{i}", "bm25", [f"slow mainpassage {i}"]) for i in range(20)]
    theirs = [row(f"w{i}", "bm25", [f"pale workerpassage {i}"]) for i in range(6)]
    with ScriptedServer(responder=keyword_responder({"pale": "yes"}, "no"), latency=0.3) as srv:
        j = make_judge(srv, limits=Limits(concurrency=2, adaptive=False, timeout_s=10.0))
        worker: dict[str, Any] = {}

        def other_thread() -> None:
            try:
                worker["got"] = j.judge_many(theirs, progress=False)
            except BaseException as exc:  # what the old code gave: its tasks cancelled
                worker["raised"] = exc

        def sent(marker: str) -> bool:
            return any(marker in json.dumps(body) for body in srv.bodies())

        def interrupt() -> None:
            deadline = time.monotonic() + 30
            while not (sent("mainpassage") and sent("workerpassage")):
                if time.monotonic() > deadline:
                    return
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)

        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            t = threading.Thread(target=other_thread)
            t.start()
            threading.Thread(target=interrupt, daemon=True).start()
            with pytest.raises(KeyboardInterrupt):
                j.judge_many(mine, progress=False)
            t.join(timeout=60)
        finally:
            signal.signal(signal.SIGINT, previous)
            j.close()
        main_sent = sum("mainpassage" in json.dumps(body) for body in srv.bodies())
    assert not t.is_alive()
    assert "raised" not in worker, worker.get("raised")
    got = worker["got"]
    assert [v.status for jq in got for v in jq.verdicts] == ["ok"] * 6
    assert [v.label for jq in got for v in jq.verdicts] == ["yes"] * 6
    assert 1 <= main_sent < 20


@pytest.mark.embedded
def test_the_notebooks_offline_judges_serve_every_call_of_a_running_loop() -> None:
    """The embedded judges of configs/cascade.toml (its band open: the LLM judges every
    passage) in a Jupyter-like cell: the llama.cpp server dies with the thread that started
    it, so that thread must outlive one call; every verdict is asked of a live server, and
    close() stops it."""
    require_embedded()
    require_minilm()
    before = set(llama_servers())
    config = load_config(
        ROOT / "configs" / "cascade.toml",
        {"judge.cascade.low": 0.0, "judge.cascade.high": 1.0},
    )
    rows = [row("stale", "bm25", ["Bread goes stale as its starch recrystallises.", "Egypt."])]

    async def cell() -> tuple[judge.JudgedQuery, Judgements]:
        with Judge.from_config(config, limits=Limits.from_config(config)) as j:
            first = j.judge("signs of anaemia in puppies", ["Anaemic puppies have pale gums."])
            return first, j.judge_many(rows, progress=False)

    first, many = asyncio.run(cell())
    statuses = [v.status for jq in (first, *many) for v in jq.verdicts]
    assert len(statuses) == 3 and "error" not in statuses, [
        v.error for jq in (first, *many) for v in jq.verdicts
    ]
    assert all(jq.rerank_scores for jq in (first, *many))  # the fused reranker beside it
    assert {v.source for jq in (first, *many) for v in jq.verdicts} == {"judge"}
    assert set(llama_servers()) <= before  # the one it started is stopped


@pytest.mark.parametrize("first", ["sync", "async"])
def test_sync_and_async_calls_mix_on_one_judge_in_either_order(
    yes_if_pale: ScriptedServer, first: str
) -> None:
    """A notebook calls ``judge.judge()`` in one cell and ``await judge.ajudge()`` in the
    next (or the other way round, each ``asyncio.run`` a loop of its own): every call works,
    since the Judge's clients live on its own loop whatever loop asks."""
    texts = ["pale gums and weakness", "a shiny coat"]

    async def ask_async(j: Judge, q: str) -> list[str | None]:
        return [v.label for v in (await j.ajudge(q, texts)).verdicts]

    def ask_sync(j: Judge, q: str) -> list[str | None]:
        return [v.label for v in j.judge(q, texts).verdicts]

    with make_judge(yes_if_pale) as j:
        order = ["sync", "async", "sync", "async"] if first == "sync" else ["async", "sync"] * 2
        for i, how in enumerate(order):
            q = f"signs of anemia in dogs, take {i}"  # a new query each time: no cache hits
            got = ask_sync(j, q) if how == "sync" else asyncio.run(ask_async(j, q))
            assert got == ["yes", "no"], (i, how)
    assert chat_calls(yes_if_pale) == 2 * len(order)


def test_judge_many_and_judge_run_judge_alike_through_one_unit_loop(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """The same dataset judged apart, each with a cache of its own, by `judge run` and by
    judge_many: the same verdicts and metrics, for the same requests to the provider."""
    server = make_server(responder=keyword_responder({"passage 3": "yes", "passage 1": "yes"}))
    config_path = write_config(tmp_path, server, None, rerank=False, run={"repeats": 2})
    config = load_config(config_path)
    rows = [json.loads(line) for line in Path(config.dataset.path).read_text().splitlines()]

    out = tmp_path / "out"
    assert main(["run", str(config_path), "--out", str(out)]) == 0
    by_run = len(server.requests)
    config = config.model_copy(
        update={"run": config.run.model_copy(update={"cache": str(tmp_path / "own.sqlite")})}
    )
    cache = open_cache(config)
    with Judge.from_config(config, cache=cache, limits=Limits.from_config(config)) as j:
        got = j.judge_many(rows, repeats=2, progress=False)
    assert by_run == 40 and len(server.requests) == 2 * by_run  # nothing shared, nothing skipped
    run = judge.read_run(out)

    def verdicts(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        keys = ("query_id", "engine", "repeat", "passage_id", "status", "label", "reason")
        return sorted(tuple(r[k] for k in keys) for r in records)

    assert verdicts(run.to_records()) == verdicts(got.to_records())
    assert {r["label"] for r in got.to_records()} == {"yes", "no"}
    names = config.metrics.names
    mine = {(r["query_id"], r["repeat"]): r for r in got.to_records("queries")}
    for r in run.to_records("queries"):
        assert {k: r[k] for k in names} == {k: mine[(r["query_id"], r["repeat"])][k] for k in names}


# --- misuse is refused before anything is paid ------------------------------------------------


def test_the_api_checks_limits_metrics_and_repeat_before_any_request(
    yes_if_pale: ScriptedServer,
) -> None:
    """A dollar cap without a price (which could never be met), a bad limit, an unknown metric
    and a bad repeat are each one error before the first request; one metric name given as a
    string is that metric, not its characters."""
    srv = yes_if_pale
    with pytest.raises(ConfigError, match=r"Judge: limits: max_cost needs the model's price"):
        make_judge(srv, limits={"max_cost": 0.0005})
    # Keywords that belong in limits= or params= say where (they had been "unknown provider
    # settings", and max_cost's hint had named price= as if a keyword of Judge).
    with pytest.raises(ConfigError, match=r"Judge: price is a limit: Judge\(\.\.\., limits="):
        make_judge(srv, price={"prompt": 1.0, "completion": 2.0})
    with pytest.raises(ConfigError, match=r"temperature is a sampling setting: .*params="):
        make_judge(srv, temperature=0.5)
    priced = {"max_cost": 1.0, "price": {"prompt": 1.0, "completion": 2.0}}
    make_judge(srv, limits=priced).close()  # the way the hint says works
    with pytest.raises(ConfigError, match=r"limits\.concurrency: Input should be greater"):
        make_judge(srv, limits={"concurrency": 0})
    with pytest.raises(ConfigError, match="limits: expected a Limits or a dict, got int"):
        make_judge(srv, limits=3)
    with pytest.raises(ConfigError, match="unknown metric 'precison@5'"):
        make_judge(srv, metrics=["ndcg@10", "precison@5"])
    with make_judge(srv, metrics="ndcg@3", limits={"concurrency": 2}) as j:
        assert j.policy.names == ("ndcg@3",) and j.caller.limits.concurrency == 2
        for bad in (-1, 1.5, True):
            with pytest.raises(InputError, match="repeat: expected a whole number >= 0"):
                j.judge("pale sky?", ["pale", "dark"], repeat=bad)  # type: ignore[arg-type]
    assert chat_calls(srv) == 0


def test_a_dimension_is_read_as_its_table_or_refused(yes_if_pale: ScriptedServer) -> None:
    """``nuggets=`` is a switch or the [nuggets] table: a string, an unknown field or a judge
    with no LLM is refused (each had switched nugget judging on, at its default settings,
    which costs calls); a table's settings and its ``enabled`` are kept."""
    srv = yes_if_pale
    for bad, said in (
        ("no", "nuggets: expected True, False, a dict of [nuggets] settings"),
        ({"bogus_field": 1}, "nuggets.bogus_field: Extra inputs are not permitted"),
    ):
        with pytest.raises(ConfigError, match=re.escape(said)):
            make_judge(srv, nuggets=bad)
    with make_judge(srv, nuggets={"enabled": False}) as off:
        assert off.dimensions is None
    with make_judge(srv, nuggets={"max_nuggets": 3}) as on:
        assert on.dimensions is not None and on.dimensions.nuggets is not None
        assert on.dimensions.nuggets.section.max_nuggets == 3
    with pytest.raises(ConfigError, match="has no LLM to judge nuggets with"):
        Judge("embedded-fused", nuggets=True)
    assert chat_calls(srv) == 0


def test_human_labels_off_the_label_scale_are_refused_as_judge_run_refuses_them(
    yes_if_pale: ScriptedServer,
) -> None:
    """A 3 on the binary scale had been kept and read by agreement and label metrics."""
    rows = [row("q", "e", ["pale"], labels={"q-e-0": 3})]
    with make_judge(yes_if_pale) as j:
        with pytest.raises(InputError, match=r"field 'labels.q-e-0': 3 is not a grade of the"):
            j.judge_many(rows, progress=False)
        graded = j.judge_many(rows, progress=False, label_scale=Scale.named("graded"))
        # By name too, as Judge(scale=) and the config's label_scale take it (it had raised
        # AttributeError); a name that is no scale is one ConfigError.
        named = j.judge_many(rows, progress=False, label_scale="graded")
        with pytest.raises(ConfigError, match="scale 'graeded' is not a built-in scale"):
            j.judge_many(rows, progress=False, label_scale="graeded")
    assert len(graded) == len(named) == 1
    assert chat_calls(yes_if_pale) == 2  # this Judge has no cache: once each


def test_a_closed_judge_refuses_to_judge_instead_of_paying_without_its_cache(
    yes_if_pale: ScriptedServer, tmp_path: Path
) -> None:
    cache = tmp_path / "c.sqlite"
    others = {t for t in threading.enumerate() if t.name == "judge-loop"}  # earlier tests'
    with make_judge(yes_if_pale, cache=cache) as j:
        j.judge("pale sky?", ["pale one"])
    for call in (
        lambda: j.judge("pale sky?", ["two"]),
        lambda: j.judge_many([row("q", "e", ["x"])]),
    ):
        with pytest.raises(ConfigError, match="this Judge is closed"):
            call()
    assert chat_calls(yes_if_pale) == 1
    # The refusal starts no loop again: its thread would outlive the Judge. (Another test's
    # Judge left to the collector may still be stopping its own on a busy machine.)
    assert not {t for t in threading.enumerate() if t.name == "judge-loop"} - others
    with pytest.raises(ConfigError, match="this Judge is closed"):
        j.fit_cascade([])


def test_arguments_of_a_kind_judge_cannot_read_are_one_error_naming_them(
    yes_if_pale: ScriptedServer,
) -> None:
    """Each had failed deep inside (AttributeError, TypeError) or, for the cache, on the
    first call and again at close()."""
    for kwargs, said in (
        ({"provider": 3}, "Judge: provider: expected a preset name"),
        ({"scale": 3}, "Judge: scale: expected a scale name or a Scale, got int"),
        ({"metrics": 5}, "Judge: metrics: expected metric names or a MetricPolicy, got int"),
        ({"metrics": None}, "Judge: metrics: expected metric names or a MetricPolicy"),
        ({"cache": 5}, "Judge: cache: expected a path or a Cache, got int"),
    ):
        args = {"provider": "local", "model": "m", "base_url": yes_if_pale.openai_base_url}
        with pytest.raises(ConfigError, match=re.escape(said)):
            Judge(**(args | kwargs))  # type: ignore[arg-type]
    with make_judge(yes_if_pale) as j:
        for repeats in ("2", 2.5, 0, True):
            with pytest.raises(ConfigError, match="repeats: expected a whole number >= 1"):
                j.judge_many([row("q", "e", ["x"])], repeats=repeats)  # type: ignore[arg-type]
    assert chat_calls(yes_if_pale) == 0


def test_passages_may_come_as_a_numpy_array_or_a_pandas_series(
    yes_if_pale: ScriptedServer,
) -> None:
    np = pytest.importorskip("numpy")
    pd = pytest.importorskip("pandas")
    with make_judge(yes_if_pale) as j:
        for passages in (np.array(["pale a", "dark b"]), pd.Series(["pale a", "dark b"])):
            got = j.judge("which colour?", passages)
            assert [v.label for v in got.verdicts] == ["yes", "no"]


def test_a_budget_stop_through_the_api_leaves_no_task_error_behind() -> None:
    """Asks cancelled when the budget is reached may have failed on their own first: their
    failures are read, so asyncio logs no "Task exception was never retrieved"."""
    script = (
        "import gc\n"
        "from judge import BudgetExceeded, Judge, Limits\n"
        "from tests.servers import ScriptedServer\n"
        "from tests.test_budget import Metered\n"
        "rows = [{'query_id': f'r{i}', 'query': 'q', 'retrieved_texts': [f't {i} {x}' for x in "
        "range(3)]} for i in range(20)]\n"
        "with ScriptedServer(responder=Metered(), latency=0.02) as srv:\n"
        "    limits = Limits(max_tokens=1000, concurrency=16)\n"
        "    with Judge(provider='local', model='m', base_url=srv.openai_base_url, "
        "limits=limits) as j:\n"
        "        try:\n"
        "            j.judge_many(rows, progress=False)\n"
        "        except BudgetExceeded as exc:\n"
        "            print('stopped:', exc)\n"
        "gc.collect()\n"
    )
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "stopped: token budget reached: spent " in done.stdout
    assert "never retrieved" not in done.stderr and "Traceback" not in done.stderr


def test_colliding_passage_ids_and_one_row_for_rows_are_named(
    yes_if_pale: ScriptedServer,
) -> None:
    with make_judge(yes_if_pale) as j:
        with pytest.raises(InputError, match=r"passages\[1\]: id '2' is passages\[0\]'s too"):
            j.judge("which colour?", [{"id": "2", "text": "pale"}, "dark"])
        with pytest.raises(InputError, match=r"rows: expected rows .* got one dict"):
            j.judge_many(row("q", "e", ["pale"]))  # type: ignore[arg-type]
    assert chat_calls(yes_if_pale) == 0


def test_a_judge_dropped_without_close_gives_back_its_thread_and_connections(
    yes_if_pale: ScriptedServer,
) -> None:
    """A notebook cell run again makes a new Judge and drops the old one unclosed: each kept
    its loop's thread, its connections and its cache (30 of them: 60 threads, 150 files)."""
    import gc

    def loops() -> int:
        return sum(t.name == "judge-loop" for t in threading.enumerate())

    before = loops()
    for _ in range(5):
        j = make_judge(yes_if_pale)
        assert j.judge("why so wan?", ["pale gums"]).verdicts[0].label == "yes"
        del j
    gc.collect()
    deadline = time.monotonic() + 30
    while loops() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert loops() == before


def test_ids_and_label_keys_are_read_alike_however_they_come() -> None:
    """judge() had made the id 'None' of None and '1.0' of 1.0; dict rows refused numpy's
    integers that a DataFrame's rows gave; a Python dict's integer label keys named no
    passage."""
    np = pytest.importorskip("numpy")
    from judge.judging.rows import as_passages, as_queries

    read = as_passages([{"id": 1.0, "text": "a"}, {"id": np.int64(3), "text": "b"}])
    assert [p.id for p in read] == ["1", "3"]
    with pytest.raises(InputError, match=r"passages\[0\]: field 'id': expected a string or"):
        as_passages([{"id": None, "text": "a"}])
    (q,) = as_queries(
        [
            {
                "query_id": np.int64(5),
                "query": "x",
                "passages": [{"id": np.int64(1), "text": "b"}],
                "labels": {1: np.int64(1)},
            }
        ]
    )
    assert (q.query_id, q.passages[0].id, q.labels) == ("5", "1", {"1": 1})


def test_a_judge_that_could_not_reach_its_server_asks_again_once_it_is_up() -> None:
    """A Judge that once met a closed port had refused every later call at once ("cannot
    reach"), sending nothing, though the server was up by then."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    judge = Judge(
        provider="local",
        model="m",
        base_url=f"http://127.0.0.1:{port}/v1",
        limits={"backoff_base_s": 0.01},
    )
    try:
        with pytest.raises(ProviderError, match=r"cannot reach|refuses every request"):
            judge.judge("what is rust?", ["Rust is a systems language.", "Bananas."])
        with ScriptedServer(port=port) as srv:
            got = judge.judge("what is rust?", ["Rust is a systems language."])
            assert [v.status for v in got.verdicts] == ["ok"] and len(srv.requests) == 1
    finally:
        judge.close()


_FULL_DISK = """
import resource, signal, sys
from judge.judging.judge import Judge

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the cap fails (EFBIG)
base_url, cache = sys.argv[1], sys.argv[2]
with Judge("local", "judge-test", base_url=base_url, cache=cache) as j:
    j.judge("warm up", ["the cache file made"])  # before the cap: its pages exist
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))  # the disk full
    first = j.judge("which kettle?", [f"kettle {i} " + "x" * 4000 for i in range(3)])
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # space freed
    second = j.judge("which pot?", ["a pot", "a pan"])
print([v.status for v in first.verdicts], [v.status for v in second.verdicts])
"""


def test_a_cache_that_cannot_be_written_keeps_the_verdicts_and_the_judge_goes_on(
    tmp_path: Path,
) -> None:
    """A Judge whose cache fails a write (a full disk) still gives the answers it paid for, is
    warned once, and answers later calls once there is room again: it had refused every
    later call ("not sent: the cache cannot be written")."""
    import subprocess

    with ScriptedServer(responder=keyword_responder({"kettle": "yes"})) as server:
        done = subprocess.run(
            [sys.executable, "-c", _FULL_DISK, server.openai_base_url, str(tmp_path / "c.db")],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=Path(__file__).resolve().parent.parent,
        )
        asked = len(server.requests)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['ok', 'ok', 'ok'] ['ok', 'ok']", done.stderr
    assert done.stderr.count("the answers are kept, not cached") == 1, done.stderr
    assert asked == 6  # each passage asked once


@pytest.mark.parametrize("limit", [0, 20])
def test_a_judge_from_a_config_cuts_passages_as_judge_run_does(
    yes_if_pale: ScriptedServer, limit: int
) -> None:
    """``[dataset] max_passage_chars`` had been judge run's alone: Judge.from_config, its
    judge() and judge_many() cut at 8,000 whatever the config said."""
    config = load_config(
        None,
        {
            "judge.provider": "local",
            "judge.model": "judge-model",
            "provider.base_url": yes_if_pale.openai_base_url,
            "dataset.max_passage_chars": limit,
        },
    )
    text = "pale " * 2000 + "end"  # 10,003 characters
    with Judge.from_config(config, limits=FAST) as j:
        one = j.judge("question?", [text])
        (many,) = j.judge_many([row("q", "e", [text])], progress=False)
    for judged in (one, many):
        (passage,) = judged.query.passages
        assert passage.truncated_from == (None if limit == 0 else len(text))
        assert (passage.text == text) if limit == 0 else len(passage.text) < 40


def test_async_with_and_aclose_release_the_loop_thread_and_the_cache(
    yes_if_pale: ScriptedServer, tmp_path: Path
) -> None:
    """``async with Judge(...)`` had been a TypeError, and ``await aclose()`` had left the
    Judge's loop thread running and its cache file open (only close() released them)."""
    import os

    def held() -> tuple[int, int]:
        loops = sum(t.name == "judge-loop" for t in threading.enumerate())
        paths = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                paths.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:  # closed since it was listed (the listing's own, say)
                continue
        return loops, sum(str(tmp_path) in path for path in paths)

    async def cell() -> None:
        async with make_judge(yes_if_pale, cache=tmp_path / "c.sqlite") as j:
            await j.ajudge("pale sky?", ["pale one"])
            assert held()[0] >= 1 and held()[1] >= 1
        other = make_judge(yes_if_pale, cache=tmp_path / "d.sqlite")
        await other.ajudge("pale sky?", ["pale two"])
        await other.aclose()

    before = held()
    asyncio.run(cell())
    assert held() == before
