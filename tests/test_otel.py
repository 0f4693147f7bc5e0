"""OpenTelemetry spans of ``judge run`` against a loopback server, read back through the SDK's
in-memory exporter: a span per run and per unit, a span per provider call with the GenAI
attributes (tokens as the server reported them, cache hits marked), each verdict as a
``gen_ai.evaluation.result`` event; no text unless asked; nothing imported without a provider.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from judge.cli.main import main
from judge.data.datasets import read_results
from judge.data.results import RESULTS_FILE
from tests.servers import Answer, AnswerServer, Fault, Recorded, ScriptedServer, hashed_responder

ROOT = Path(__file__).resolve().parent.parent
# What the server says each answer used, so the spans' token counts can be checked.
USAGE = (120, 9)
# Two engines returning one shared passage: it is asked once and the other ask is a hit.
ROWS = [
    {
        "query_id": "q1",
        "query": "how do tides form",
        "engine": engine,
        "passages": [
            {"id": "shared", "text": "The moon's gravity pulls the oceans into two bulges."},
            {"id": f"{engine}-own", "text": f"Sea levels rise and fall ({engine} wording)."},
        ],
    }
    for engine in ("bm25", "dense")
] + [
    {
        "query_id": "q2",
        "query": "why is the sky blue",
        "engine": "bm25",
        "passages": [{"id": "sky", "text": "Shorter wavelengths scatter more off air molecules."}],
    }
]
TEXTS = [r["query"] for r in ROWS] + [p["text"] for r in ROWS for p in r["passages"]]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """An SDK tracer provider exporting to memory, as the process's own for one test (the
    API's global is put back afterwards, as OpenTelemetry's own tests do)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trace, "_TRACER_PROVIDER", provider)
        yield exporter
    provider.shutdown()


def _responder() -> Callable[[Recorded], Any]:
    inner = hashed_responder()

    def respond(request: Recorded) -> Any:
        answer = inner(request)
        return replace(answer, usage=USAGE) if isinstance(answer, Answer) else answer

    return respond


def _config(tmp_path: Path, server: ScriptedServer, extra: str = "") -> Path:
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    config = tmp_path / "run.toml"
    config.write_text(
        textwrap.dedent(
            f"""\
            [judge]
            provider = "local"
            model = "judge-test"
            [provider]
            base_url = "{server.openai_base_url}"
            [dataset]
            path = "{dataset}"
            [run]
            cache = "{tmp_path / "cache.sqlite"}"
            timeout_s = 5.0
            backoff_base_s = 0.01
            max_attempts = 2
            """
        )
        + extra,
        encoding="utf-8",
    )
    return config


def _named(found: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in found if s.name == name or s.name.startswith(name + " ")]


def _unit(span: ReadableSpan) -> tuple[str, str]:
    return (span.attributes["judge.query.id"], span.attributes["judge.engine"])


def _strings(span: ReadableSpan) -> list[str]:
    """Every string in a span's attributes and its events' attributes."""
    values: list[Any] = [*(span.attributes or {}).values()]
    for event in span.events:
        values += [*(event.attributes or {}).values()]
    out: list[str] = []
    for value in values:
        out += [str(v) for v in value] if isinstance(value, tuple | list) else [str(value)]
    return out


def test_a_run_emits_a_span_per_run_unit_and_call_without_text(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    spans: InMemorySpanExporter,
) -> None:
    server = make_server(responder=_responder())
    out = tmp_path / "out"
    assert main(["run", str(_config(tmp_path, server)), "--out", str(out)]) == 0
    found = spans.get_finished_spans()

    (run,) = _named(found, "judge run")
    units = _named(found, "judge query")
    calls = _named(found, "chat")
    assert len(units) == 3  # (q1, bm25), (q1, dense), (q2, bm25), one repeat
    assert all(u.parent is not None and u.parent.span_id == run.context.span_id for u in units)
    unit_ids = {u.context.span_id for u in units}
    assert all(c.parent is not None and c.parent.span_id in unit_ids for c in calls)

    # Five passages, four distinct: four requests paid, the shared passage's second ask a hit.
    assert len(server.requests) == 4
    assert len(calls) == 5
    paid = [c for c in calls if not c.attributes["judge.cache_hit"]]
    hits = [c for c in calls if c.attributes["judge.cache_hit"]]
    assert (len(paid), len(hits)) == (4, 1)
    for call in calls:
        a = call.attributes
        assert call.kind is SpanKind.CLIENT
        assert call.name == "chat judge-test"
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.provider.name"] == a["gen_ai.system"] == "openai"
        assert a["gen_ai.request.model"] == "judge-test"
        assert a["server.address"] == "127.0.0.1"
    for call in paid:
        assert call.attributes["gen_ai.usage.input_tokens"] == USAGE[0]
        assert call.attributes["gen_ai.usage.output_tokens"] == USAGE[1]
        assert call.attributes["judge.attempts"] == 1
        assert call.attributes["judge.latency_s"] > 0
    assert "gen_ai.usage.input_tokens" not in hits[0].attributes  # a hit cost nothing

    # The run's totals are the server's: 4 requests at USAGE each.
    assert run.attributes["judge.requests"] == 4
    assert run.attributes["judge.cache_hits"] == 1
    assert run.attributes["gen_ai.usage.input_tokens"] == 4 * USAGE[0]
    assert run.attributes["gen_ai.usage.output_tokens"] == 4 * USAGE[1]
    assert "judge.stopped_by" not in run.attributes

    # Each passage's verdict is an evaluation event on its unit, as verdicts.jsonl says.
    written = {
        (jq.query.query_id, jq.query.engine, v.passage_id): v
        for jq in read_results(out / RESULTS_FILE)
        for v in jq.verdicts
    }
    events = {
        (
            u.attributes["judge.query.id"],
            u.attributes["judge.engine"],
            e.attributes["judge.passage.id"],
        ): e
        for u in units
        for e in u.events
    }
    assert events.keys() == written.keys()
    for key, event in events.items():
        a, verdict = event.attributes, written[key]
        assert event.name == "gen_ai.evaluation.result"
        assert a["gen_ai.evaluation.name"] == "relevance"
        assert a["gen_ai.evaluation.score.label"] == verdict.label
        assert a["gen_ai.evaluation.score.value"] == pytest.approx(verdict.probability)
        assert a["judge.reason.length"] == len(verdict.reason or "") > 0
        assert a["judge.verdict.status"] == "ok"

    # No query, passage, prompt or reason text anywhere without include_text.
    said = [text for span in found for text in _strings(span)]
    assert not [t for t in TEXTS if any(t in s for s in said)]
    assert not any("scripted answer" in s for s in said)  # the reason the server gave


def test_include_text_puts_queries_passages_and_messages_in(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    spans: InMemorySpanExporter,
) -> None:
    server = make_server(responder=_responder())
    config = _config(tmp_path, server, "[telemetry]\ninclude_text = true\n")
    assert main(["run", str(config), "--out", str(tmp_path / "out")]) == 0
    found = spans.get_finished_spans()
    said = "\n".join(text for span in found for text in _strings(span))
    assert all(text in said for text in TEXTS)
    units = _named(found, "judge query")
    assert {u.attributes["judge.query.text"] for u in units} == {r["query"] for r in ROWS}
    passage = next(e for u in units for e in u.events if e.attributes["judge.passage.id"] == "sky")
    assert passage.attributes["judge.passage.text"] == ROWS[2]["passages"][0]["text"]
    assert passage.attributes["gen_ai.evaluation.explanation"] == "scripted answer"
    paid = [c for c in _named(found, "chat") if not c.attributes["judge.cache_hit"]]
    messages = json.loads(paid[0].attributes["gen_ai.input.messages"])
    assert [m["role"] for m in messages][-1] == "user"
    assert "scripted answer" in paid[0].attributes["gen_ai.output.messages"]


def test_a_refused_call_and_its_verdicts_carry_the_error(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    spans: InMemorySpanExporter,
) -> None:
    server = make_server(responder=lambda _request: Fault("status", 401))
    code = main(["run", str(_config(tmp_path, server)), "--out", str(tmp_path / "out")])
    assert code == 3  # the provider refuses every request: incomplete, resumable
    found = spans.get_finished_spans()
    calls = _named(found, "chat")
    assert calls and len(calls) <= len(server.requests) + 1
    for call in calls:
        assert call.status.status_code is StatusCode.ERROR
        assert call.attributes["error.type"] == "client"
        assert "gen_ai.usage.input_tokens" not in call.attributes
    (run,) = _named(found, "judge run")
    assert run.attributes["judge.stopped_by"] == "refused"
    events = [e for u in _named(found, "judge query") for e in u.events]
    assert events and all(e.attributes["error.type"] == "error" for e in events)
    assert all(e.attributes["gen_ai.evaluation.score.label"] == "error" for e in events)


def _python(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in a process of its own, from the repository, its output captured."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


def test_without_a_tracer_provider_nothing_is_imported_or_emitted(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """A run in a fresh process that set no tracer provider imports no OpenTelemetry module,
    though the SDK is installed."""
    server = make_server(responder=_responder())
    config = _config(tmp_path, server)
    script = textwrap.dedent(
        f"""
        import sys
        from judge.cli.main import main
        code = main(["run", {str(config)!r}, "--out", {str(tmp_path / "out")!r}])
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        print(code, loaded)
        """
    )
    done = _python("-c", script)
    assert done.stdout.strip().splitlines()[-1] == "0 []", done.stderr
    assert len(server.requests) == 4


def test_a_tracer_provider_that_cannot_be_had_costs_spans_not_the_run(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """OTEL_PYTHON_TRACER_PROVIDER naming no installed provider (a typo) raised inside every
    provider call: two tracebacks and exit 1, which CI reads as a metric regression. Now the
    run judges as without telemetry, and says once why it emits no spans."""
    server = make_server(responder=_responder())
    config = _config(tmp_path, server)
    done = _python(
        "-m",
        "judge",
        "run",
        str(config),
        "--out",
        str(tmp_path / "out"),
        env={**os.environ, "OTEL_PYTHON_TRACER_PROVIDER": "no_such_provider"},
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.count("tracer provider cannot be used") == 1, done.stderr
    assert len(server.requests) == 4


def test_a_span_processor_that_raises_costs_spans_not_the_verdicts(
    make_server: Callable[..., ScriptedServer],
) -> None:
    """An application's span processor that raises on every span made judge() and
    judge_many() raise a RuntimeError out of OpenTelemetry; the verdicts now come, and the
    failure is said once."""
    server = make_server(responder=_responder())
    script = textwrap.dedent(
        f"""
        from opentelemetry import trace
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

        class Broken(SpanProcessor):
            def on_start(self, span, parent_context=None):
                raise ValueError("broken processor")

        provider = TracerProvider()
        provider.add_span_processor(Broken())
        trace.set_tracer_provider(provider)

        import judge
        with judge.Judge(provider="local", model="m", base_url={server.openai_base_url!r}) as j:
            got = j.judge("why so wan?", ["pale gums", "dog food"])
        print([v.status for v in got.verdicts])
        """
    )
    done = _python("-c", script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "['ok', 'ok']", done.stdout
    assert done.stderr.count("OpenTelemetry failed on a span") == 1, done.stderr
    assert "Traceback" not in done.stderr


def test_the_genai_capture_switch_also_puts_text_in(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    spans: InMemorySpanExporter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT, the GenAI instrumentations' own
    switch, asks for text as [telemetry] include_text does."""
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    server = make_server(responder=_responder())
    assert main(["run", str(_config(tmp_path, server)), "--out", str(tmp_path / "out")]) == 0
    units = _named(spans.get_finished_spans(), "judge query")
    assert {u.attributes["judge.query.text"] for u in units} == {r["query"] for r in ROWS}


def test_importing_judge_imports_neither_sdk() -> None:
    """``import judge``, the CLI's parser and the two integration modules load no
    OpenTelemetry or MLflow module (both are installed here)."""
    script = (
        "import sys, judge; from judge.calling import telemetry; "
        "from judge.report import mlflow_run; from judge.cli.main import build_parser; "
        "build_parser(); telemetry.spans(); judge.log_to_mlflow; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'mlflow', 'opentelemetry'}))"
    )
    done = _python("-c", script)
    assert done.stdout.strip() == "[]", done.stderr


def test_reranker_calls_are_spans_too(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    spans: InMemorySpanExporter,
) -> None:
    server = make_server(responder=_responder())
    rerank = f'[rerank]\nprovider = "rerank"\nmodel = "rerank-test"\nbase_url = "{server.url}"\n'
    assert (
        main(["run", str(_config(tmp_path, server, rerank)), "--out", str(tmp_path / "out")]) == 0
    )
    found = spans.get_finished_spans()
    reranks = _named(found, "rerank")
    sent = [r for r in server.requests if r.path.endswith("/rerank")]
    assert sent and len([s for s in reranks if not s.attributes["judge.cache_hit"]]) == len(sent)
    unit_ids = {u.context.span_id for u in _named(found, "judge query")}
    for span in reranks:
        assert span.name == "rerank rerank-test"
        assert span.attributes["gen_ai.operation.name"] == "rerank"
        assert span.attributes["gen_ai.provider.name"] == "rerank"
        assert span.parent is not None and span.parent.span_id in unit_ids


def _quoting(raw: bytes) -> tuple[int, Any]:
    """A 400 quoting the request's messages, as a validating server (vLLM, FastAPI) may
    answer: the error text holds the passages."""
    return 400, {"error": {"message": f"invalid request: {raw.decode()}", "type": "bad"}}


def _all_text(span: ReadableSpan) -> str:
    """Every string a span carries: attributes, events' attributes, status description."""
    return " ".join([*_strings(span), span.status.description or ""])


@pytest.mark.parametrize("include_text", [False, True])
def test_an_error_that_quotes_the_request_puts_no_text_in_a_span_unless_asked(
    tmp_path: Path, spans: InMemorySpanExporter, include_text: bool
) -> None:
    """A server's 400 quoting the prompt: the SDK's defaults had put the passages in each
    failed call's exception event and status; the spans say the kind, and the error status,
    and the message only with include_text."""
    with AnswerServer(_quoting) as server:
        extra = "[telemetry]\ninclude_text = true\n" if include_text else ""
        config = _config(tmp_path, cast(ScriptedServer, server), extra)  # its URL is read
        assert main(["run", str(config), "--out", str(tmp_path / "out")]) == 3
    found = spans.get_finished_spans()
    (run,) = _named(found, "judge run")
    assert run.status.status_code is StatusCode.ERROR and run.attributes["judge.stopped_by"]
    calls = _named(found, "chat")
    assert calls and all(c.status.status_code is StatusCode.ERROR for c in calls)
    secret = "moon's gravity"  # a passage's words (ROWS)
    quoted = [s.name for s in found if secret in _all_text(s)]
    if include_text:
        assert any("exception.message" in (e.attributes or {}) for c in calls for e in c.events)
    else:
        assert not quoted, quoted
        assert all(e.name != "exception" for s in found for e in s.events)
