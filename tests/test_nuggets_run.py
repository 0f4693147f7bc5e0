"""Coverage and credibility through ``judge run`` against a loopback server, over the real
openai SDK: what is asked and how often, what is written, cached re-runs, given nugget files,
unparsed and failed assignments, resume, dry-run counts, the report and ``judge compare``."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from judge.cli.main import main
from judge.data.nuggets import NUGGETS_FILE, read_nuggets
from judge.data.results import RESULTS_FILE, read_results
from judge.judging.judge import Judge
from tests.aspect_wire import aspect_responder, fenced, kind_of
from tests.servers import SERVER_ERROR, Item, Recorded, Responder, ScriptedServer
from tests.test_runner import write_config

RUST_1 = "Rust is a systems language. Rust has no garbage collector."
ROWS = [
    {
        "query_id": "q1",
        "query": "what is rust?",
        "engine": "a",
        "passages": [
            {"id": "p1", "text": RUST_1, "url": "https://www.rust-lang.org/"},
            {"id": "p2", "text": "Bananas are yellow.", "url": "https://fruit.example.com/"},
            {"id": "p3", "text": "Cargo is the Rust package manager.", "url": "https://x.edu/"},
        ],
    },
    {
        "query_id": "q1",
        "query": "what is rust?",
        "engine": "b",
        "passages": [
            {"id": "p1", "text": RUST_1, "url": "https://www.rust-lang.org/"},
            {"id": "p4", "text": "Rust was first released in 2015.", "url": "https://h.gov/"},
        ],
    },
    {
        "query_id": "q2",
        "query": "what is tea?",
        "engine": "a",
        "passages": [
            {"id": "t1", "text": "Tea is a drink. Tea contains caffeine."},
            {"id": "t2", "text": "Green tea is not oxidised."},
        ],
    },
    {
        "query_id": "q2",
        "query": "what is tea?",
        "engine": "b",
        "passages": [
            {"id": "t3", "text": "Tea comes from Camellia sinensis."},
            {"id": "t1", "text": "Tea is a drink. Tea contains caffeine."},
        ],
    },
]
# One nugget set per query id (not per engine); one assignment per unit; one credibility and
# one relevance call per distinct passage of a query (p1 and t1 are shared by both engines).
EXPECTED = {"nuggets": 2, "support": 4, "credibility": 7, "relevance": 7}
ON = {"nuggets": {"enabled": True}, "credibility": {"enabled": True}}


def setup(tmp_path: Path, server: ScriptedServer, tables: dict[str, Any] | None = None) -> Path:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    extra = {"dataset": {"path": str(data)}, **ON, **(tables or {})}
    return write_config(tmp_path / "run.toml", server, tmp_path / "cache.sqlite", extra)


def kinds(server: ScriptedServer) -> Counter[str]:
    return Counter(kind_of(r) for r in server.requests)


def by_unit(out: Path) -> dict[tuple[str, str], Any]:
    return {(jq.query.query_id, jq.query.engine): jq for jq in read_results(out / RESULTS_FILE)}


@pytest.fixture
def aspect_server(make_server: Callable[..., ScriptedServer]) -> ScriptedServer:
    return make_server(responder=aspect_responder())


def test_nuggets_are_written_once_per_query_and_every_unit_is_measured_against_them(
    aspect_server: ScriptedServer, tmp_path: Path
) -> None:
    config = setup(tmp_path, aspect_server)
    out = tmp_path / "a"
    assert main(["run", str(config), "--out", str(out)]) == 0
    assert kinds(aspect_server) == EXPECTED
    units = by_unit(out)
    a, b = units[("q1", "a")], units[("q1", "b")]
    assert a.coverage is not None and b.coverage is not None
    assert a.coverage.nuggets == b.coverage.nuggets  # one list for every engine
    # Pooled by rank: p1 (2 facts), p2, p4, p3; the first three of five vital.
    texts = [(n.text, n.vital) for n in a.coverage.nuggets]
    assert texts == [
        ("Rust is a systems language.", True),
        ("Rust has no garbage collector.", True),
        ("Bananas are yellow.", True),
        ("Rust was first released in 2015.", False),
        ("Cargo is the Rust package manager.", False),
    ]
    assert a.metrics["coverage@10"] == 1.0
    assert a.metrics["wcoverage@10"] == pytest.approx(3.5 / 4)
    assert b.metrics["coverage@10"] == pytest.approx(2 / 3)
    assert b.metrics["wcoverage@10"] == pytest.approx(2.5 / 4)
    assert {"alpha_ndcg@10", "err_ia@10", "credibility@10"} <= set(a.metrics)
    assert a.credibility is not None
    assert [c.grade for c in a.credibility] == [1, 0, 2]  # as the scripted judge grades urls
    assert a.metrics["credibility@10"] == pytest.approx(3 / 6)
    written = read_nuggets(out / NUGGETS_FILE)
    assert list(written) == ["q1", "q2"]
    assert written["q1"].nuggets == a.coverage.nuggets
    assert written["q1"].source == "judge" and written["q1"].model == "judge-test"

    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    engines = summary["coverage"]["engines"]
    assert engines["a"]["unique_coverage"] == pytest.approx((1 / 3 + 0.0) / 2)
    assert engines["b"]["unique_coverage"] == pytest.approx(0.0)
    assert summary["engines"]["b"]["metrics"]["coverage@10"]["mean"] is not None
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "## Coverage (nuggets)" in report and "## Source credibility" in report
    assert "| q1 | n3 | Bananas are yellow. | vital | ✓ |  |" in report
    assert "| a | q1 | https://fruit.example.com/ | source https://fruit.example.com/ |" in report


def test_a_second_night_pays_nothing_and_gets_the_same_numbers(
    aspect_server: ScriptedServer, tmp_path: Path
) -> None:
    config = setup(tmp_path, aspect_server)
    assert main(["run", str(config), "--out", str(tmp_path / "a")]) == 0
    paid = len(aspect_server.requests)
    assert main(["run", str(config), "--out", str(tmp_path / "b")]) == 0
    assert len(aspect_server.requests) == paid
    first, second = by_unit(tmp_path / "a"), by_unit(tmp_path / "b")
    assert {k: v.metrics for k, v in first.items()} == {k: v.metrics for k, v in second.items()}
    assert (tmp_path / "a" / NUGGETS_FILE).read_bytes() == (
        tmp_path / "b" / NUGGETS_FILE
    ).read_bytes()


def test_a_given_nugget_file_is_used_as_given(
    aspect_server: ScriptedServer, tmp_path: Path
) -> None:
    given = tmp_path / "human.jsonl"
    sets = [
        {
            "query_id": "q1",
            "query": "what is rust?",
            "source": "human",
            "nuggets": [
                {"id": "gc", "text": "Rust has no garbage collector.", "vital": True},
                {"id": "2015", "text": "Rust was first released in 2015.", "vital": False},
            ],
        },
        {
            "query_id": "q2",
            "query": "what is tea?",
            "source": "human",
            "nuggets": [{"id": "plant", "text": "Tea comes from Camellia sinensis."}],
        },
    ]
    given.write_text("".join(json.dumps(s) + "\n" for s in sets), encoding="utf-8")
    config = setup(tmp_path, aspect_server, {"nuggets": {"enabled": True, "path": str(given)}})
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == 0
    assert kinds(aspect_server)["nuggets"] == 0
    assert read_nuggets(out / NUGGETS_FILE) == read_nuggets(given)
    units = by_unit(out)
    supports = {s.passage_id: s.nuggets for s in units[("q1", "b")].coverage.supports}
    assert supports == {"p1": ("gc",), "p4": ("2015",)}
    assert units[("q2", "a")].metrics["coverage@10"] == 0.0
    assert units[("q2", "b")].metrics["coverage@10"] == 1.0


def test_a_bad_nugget_file_stops_the_run_before_any_call(
    aspect_server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    given = tmp_path / "human.jsonl"
    given.write_text('{"query_id": "q1", "query": "x", "nuggets": [{"id": "a"}]}\n', "utf-8")
    config = setup(tmp_path, aspect_server, {"nuggets": {"enabled": True, "path": str(given)}})
    assert main(["run", str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{given}:1: field 'nuggets.0.text'" in err
    assert len(err.splitlines()) == 1
    assert aspect_server.requests == []


def test_a_coverage_metric_without_nuggets_on_is_a_config_error(
    aspect_server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = setup(tmp_path, aspect_server, {"nuggets": {"enabled": False}})
    with config.open("a", encoding="utf-8") as fh:
        fh.write('[metrics]\nnames = ["ndcg", "coverage@5"]\n')
    assert main(["run", str(config), "--out", str(tmp_path / "out")]) == 2
    assert "'coverage@5' needs [nuggets] enabled = true" in capsys.readouterr().err
    assert aspect_server.requests == []


def _garbled_for(marker: str, inner: Responder) -> Responder:
    """``inner``, except assignment requests showing ``marker`` get an unreadable answer."""

    def respond(request: Recorded) -> Item:
        if kind_of(request) == "support" and any(marker in t for _, t in fenced(request)):
            return "every passage supports every nugget, trust me"
        return inner(request)

    return respond


def test_an_unparsed_assignment_is_undefined_coverage_never_zero(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    server = make_server(responder=_garbled_for("Bananas", aspect_responder()))
    config = setup(tmp_path, server)
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == 0
    assert kinds(server)["support"] == EXPECTED["support"] + 1  # re-asked once, then given up
    units = by_unit(out)
    bad = units[("q1", "a")]
    assert bad.coverage is not None
    assert {s.status for s in bad.coverage.supports} == {"unparsed"}
    for name in ("coverage@10", "wcoverage@10", "alpha_ndcg@10", "err_ia@10"):
        assert bad.metrics[name] is None, name
    assert units[("q1", "b")].metrics["coverage@10"] == pytest.approx(2 / 3)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    q1 = next(q for q in summary["coverage"]["queries"] if q["query_id"] == "q1")
    assert q1["undefined"] == ["a"]
    assert "| q1 | n1 | Rust is a systems language. | vital | ? | ✓ |" in (
        out / "report.md"
    ).read_text(encoding="utf-8")


def _fails_first_support(inner: Responder) -> Responder:
    lock, failed = threading.Lock(), []

    def respond(request: Recorded) -> Item:
        with lock:
            if kind_of(request) == "support" and not failed:
                failed.append(request)
                return SERVER_ERROR
        return inner(request)

    return respond


def test_a_failed_assignment_is_asked_again_on_resume_and_nothing_else_is(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    server = make_server(responder=_fails_first_support(aspect_responder()))
    config = setup(tmp_path, server, {"run": {"max_attempts": 1}})
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == 3  # incomplete: a provider error
    errors = [
        k for k, jq in by_unit(out).items() if {s.status for s in jq.coverage.supports} == {"error"}
    ]
    assert len(errors) == 1
    assert main(["run", str(config), "--out", str(out)]) == 0
    after = kinds(server)
    assert after == {**EXPECTED, "support": EXPECTED["support"] + 1}
    assert all(s.status == "ok" for jq in by_unit(out).values() for s in jq.coverage.supports)


def test_dry_run_counts_the_aspect_calls_a_run_makes(
    aspect_server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = setup(tmp_path, aspect_server)
    total = sum(EXPECTED.values())
    assert main(["run", str(config), "--out", str(tmp_path / "a"), "--dry-run"]) == 0
    assert f"{total} calls (0 already cached)" in capsys.readouterr().out
    assert aspect_server.requests == []
    assert main(["run", str(config), "--out", str(tmp_path / "a")]) == 0
    assert len(aspect_server.requests) == total
    # With the nuggets' answers cached, even assignment prompts are known exactly.
    assert main(["run", str(config), "--out", str(tmp_path / "b"), "--dry-run"]) == 0
    assert f"{total} calls ({total} already cached)" in capsys.readouterr().out


def test_compare_gives_cis_and_paired_tests_on_coverage(
    aspect_server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = setup(tmp_path, aspect_server)
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == 0
    capsys.readouterr()
    table = tmp_path / "cmp.json"
    assert main(["compare", str(out), "--json", str(table)]) == 0
    printed = capsys.readouterr().out
    assert "coverage@10" in printed
    cmp = json.loads(table.read_text(encoding="utf-8"))
    diff = next(d for d in cmp["diffs"] if d["metric"] == "coverage@10")
    # Paired over q1 and q2: a covers every vital nugget of both, b two of q1's three.
    assert (diff["engine"], diff["baseline"], diff["n"]) == ("b", "a", 2)
    assert diff["diff"] == pytest.approx(((2 / 3 - 1) + (1 - 1)) / 2)
    assert (diff["wins"], diff["ties"], diff["losses"]) == (0, 1, 1)
    assert diff["ci_low"] is not None and diff["p_value"] is not None


def test_a_stale_given_set_is_refused_before_any_call(
    aspect_server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    given = tmp_path / "old.jsonl"
    stale = {"query_id": "q1", "query": "what is go?", "nuggets": [{"id": "a", "text": "b"}]}
    given.write_text(json.dumps(stale) + "\n", encoding="utf-8")
    config = setup(tmp_path, aspect_server, {"nuggets": {"enabled": True, "path": str(given)}})
    assert main(["run", str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{given}: field 'query': query 'q1': the set is for 'what is go?'" in err
    # `judge validate` reads the file as the run would, and finds the same.
    assert main(["validate", str(config)]) == 2
    assert "the set is for 'what is go?'" in capsys.readouterr().err
    # A line that is not a nugget set: named by file and line, before any call, too.
    given.write_text('{"query_id": "q1", "nuggets": 3}\n', encoding="utf-8")
    assert main(["validate", str(config)]) == 2
    assert f"{given}:1" in capsys.readouterr().err
    assert aspect_server.requests == []


def test_the_python_api_judges_coverage_and_credibility_per_query(
    aspect_server: ScriptedServer, fake_key: str
) -> None:
    passages = [
        {"id": "a", "text": "Tea is a drink. Tea contains caffeine.", "url": "https://t.gov/"},
        {"id": "b", "text": "Green tea is not oxidised."},
    ]
    with Judge(
        "local",
        "m",
        base_url=aspect_server.openai_base_url,
        nuggets=True,
        credibility=True,
        metrics=["ndcg"],
    ) as judge:
        tea = judge.judge("what is tea?", passages)
        rust = judge.judge("what is rust?", [{"id": "c", "text": "Rust is fast."}])
    assert tea.coverage is not None and rust.coverage is not None
    # Bare query texts are all query "q": each still gets its own nugget set.
    assert [n.text for n in rust.coverage.nuggets] == ["Rust is fast."]
    assert tea.metrics["coverage@10"] == 1.0
    assert set(tea.metrics) == {
        "ndcg",
        "coverage@10",
        "wcoverage@10",
        "alpha_ndcg@10",
        "err_ia@10",
        "credibility@10",
    }
    assert tea.metrics["credibility@10"] == pytest.approx(3 / 4)
    assert kinds(aspect_server) == {"nuggets": 2, "support": 2, "credibility": 3, "relevance": 3}
    assert tea.usage.prompt_tokens > sum(v.usage.prompt_tokens for v in tea.verdicts)


def test_turning_nuggets_on_in_a_finished_run_directory_is_refused(
    aspect_server: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its finished units have no coverage: mixing them with new ones would be two judges."""
    config = setup(tmp_path, aspect_server, {"nuggets": {"enabled": False}})
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == 0
    paid = len(aspect_server.requests)
    config = setup(tmp_path, aspect_server)
    assert main(["run", str(config), "--out", str(out)]) == 2
    assert "aspects.nuggets.enabled unset -> true" in capsys.readouterr().err
    assert len(aspect_server.requests) == paid
    assert main(["run", str(config), "--out", str(out), "--fresh"]) == 0
    assert all(jq.coverage is not None for jq in by_unit(out).values())


def test_judge_many_pools_every_engine_s_passages_into_one_nugget_set_per_query(
    aspect_server: ScriptedServer, fake_key: str
) -> None:
    """The Python batch call writes nugget sets as `judge run` does: once per query id, from
    both engines' passages, before any unit is judged."""
    with Judge("local", "m", base_url=aspect_server.openai_base_url, nuggets=True) as judge:
        judged = judge.judge_many(ROWS, progress=False)
    assert kinds(aspect_server)["nuggets"] == 2
    creation = [r for r in aspect_server.requests if kind_of(r) == "nuggets"]
    q1 = next(r for r in creation if "what is rust?" in r.prompt)
    shown = {text for _, text in fenced(q1)}
    # p3 only engine a returned, p4 only engine b: both are in the one pooled request.
    assert "Cargo is the Rust package manager." in shown
    assert "Rust was first released in 2015." in shown
    by_engine = {(jq.query.query_id, jq.query.engine): jq for jq in judged}
    a, b = by_engine["q1", "a"].coverage, by_engine["q1", "b"].coverage
    assert a is not None and b is not None and a.nuggets == b.nuggets
