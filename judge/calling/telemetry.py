"""OpenTelemetry spans, when the process has a tracer provider: the seam and what it emits.

judge imports no OpenTelemetry module of its own accord. Spans are emitted only when the
process already imported ``opentelemetry.trace`` (an application, or ``opentelemetry-instrument``,
that set a TracerProvider did) or names one in ``OTEL_PYTHON_TRACER_PROVIDER``, and that
provider is not the API's no-op default; otherwise :func:`spans` gives :data:`NO_SPANS`,
whose context managers do nothing. ``pip install 'judge[otel]'`` brings the API and the SDK.

What is emitted (GenAI semantic conventions, experimental as of 2026; where they say nothing,
``judge.*`` attributes):

- ``judge run`` — one span for the run (model, provider, scale, units; at its end the
  requests, cache hits, tokens, cost and why it stopped), a span per (query, engine, repeat)
  unit under it (``judge query``), and under that a span per provider call;
- a provider call (``chat MODEL`` / ``rerank MODEL``, kind CLIENT): ``gen_ai.operation.name``,
  ``gen_ai.provider.name`` and the older ``gen_ai.system`` (judge's provider kind),
  ``gen_ai.request.model``, ``gen_ai.response.model``, sampling settings, ``server.address``;
  ``gen_ai.usage.input_tokens`` / ``output_tokens`` only for a paid answer (a cached one costs
  nothing and is marked ``judge.cache_hit``); ``judge.latency_s`` (seconds in flight, without
  waits for a slot or a retry's backoff: the span's own duration includes them),
  ``judge.attempts``; ``error.type`` (the failure's kind) when it failed;
- each passage's verdict as an event ``gen_ai.evaluation.result`` on its query's span, with
  ``gen_ai.evaluation.name`` ("relevance"), ``gen_ai.evaluation.score.label`` (the scale's
  label, or the status when none was read), ``gen_ai.evaluation.score.value`` (P(relevant)
  when known, else the grade), ``error.type`` for an unparsed or failed verdict, and
  ``judge.passage.id`` / ``.rank``, ``judge.verdict.status`` / ``.grade`` / ``.probability``
  / ``.source`` / ``.cached``, ``judge.reason.length``. The convention defines this as a
  log-based event parented to the evaluated operation's span; OpenTelemetry Python's events
  and logs API is still private (``opentelemetry._logs``), so judge records it as a span
  event of the same name and attributes, on the unit that was judged.

No text (queries, passages, prompts, answers, reasons) is in any span unless asked: ``[telemetry]
include_text = true`` in a run's config, or the GenAI instrumentations' own switch
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` in the environment.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import re
import sys
from collections.abc import Iterator, Sequence, Sized
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol, Self
from urllib.parse import urlsplit

from judge.calling.limits import Budget
from judge.calling.retries import CallStats
from judge.config import RunConfig
from judge.errors import ProviderError
from judge.providers.base import ChatRequest, Completion, RerankRequest, RerankResult
from judge.schema import Query, Verdict
from judge.version import __version__

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger(__name__)

__all__ = ["CAPTURE_ENV", "NO_SPANS", "CallSpan", "QuerySpan", "RunState", "Spans", "spans"]

# The GenAI instrumentations' switch for recording message content (judge honours it too).
CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
EVALUATION_EVENT = "gen_ai.evaluation.result"
# A run's [telemetry] include_text, for the spans of its units and calls (None: not in a run).
_INCLUDE_TEXT: ContextVar[bool | None] = ContextVar("judge_telemetry_text", default=None)
_URL = re.compile(r"https?://[^\s/]+")
# A tracer provider named in the environment (OpenTelemetry reads it once too): read at import,
# since spans() is asked on every provider call.
_PROVIDER_NAMED = bool(os.environ.get("OTEL_PYTHON_TRACER_PROVIDER"))


class _Call(Protocol):
    """What a provider call gave (calling/caller.py's CallResult)."""

    @property
    def answer(self) -> Completion | RerankResult: ...
    @property
    def cached(self) -> bool: ...
    @property
    def attempts(self) -> int: ...
    @property
    def latency_s(self) -> float: ...


class _Counted(Protocol):
    """A run's Caller, as its span reads it."""

    @property
    def stats(self) -> CallStats: ...
    @property
    def budget(self) -> Budget: ...


class RunState(Protocol):
    """What a run's span reads of the run (run/runner.py's batch of units): at its start the
    units, at its end why it stopped (if it did) and what its calls did."""

    @property
    def units(self) -> Sized: ...
    @property
    def stopped_by(self) -> str | None: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def caller(self) -> _Counted: ...


class _Nothing:
    """A context manager that does nothing: the spans without a tracer provider, built once
    (a provider call pays no generator for them)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None


class CallSpan(_Nothing):
    """A provider call's span; this base records nothing."""

    def answered(self, call: _Call, request: object = None) -> None:
        """The call's answer (and ``request``, a chat Prompt rendered by now, for its model)."""


class QuerySpan(_Nothing):
    """A unit's span (one query, engine and repeat); this base records nothing."""

    def judged(self, verdicts: Sequence[Verdict] | None) -> None:
        """Each verdict of the unit as a ``gen_ai.evaluation.result`` event."""


_NO_CALL, _NO_QUERY = CallSpan(), QuerySpan()


class Spans:
    """No spans: what judge emits while the process has no tracer provider."""

    @contextlib.contextmanager
    def run(self, config: RunConfig, state: RunState) -> Iterator[None]:
        """A run of ``state``'s units; its end records what ``state`` says then."""
        yield

    def query(self, query: Query, repeat: int) -> AbstractContextManager[QuerySpan]:
        return _NO_QUERY

    def call(
        self, operation: str, identity: str, request: object
    ) -> AbstractContextManager[CallSpan]:
        """A provider call: ``operation`` "chat" or "rerank", ``identity`` the provider's."""
        return _NO_CALL


NO_SPANS = Spans()
# The spans for the last tracer provider seen: (provider, spans).
_LAST: list[tuple[object, Spans]] = []
# Why the tracer provider could not be had, once it could not: then no spans, for good.
_BROKEN: list[str] = []


def spans() -> Spans:
    """The spans to emit now: OpenTelemetry's when the process set a tracer provider, else
    :data:`NO_SPANS` (and nothing imported)."""
    trace: Any = sys.modules.get("opentelemetry.trace")
    if trace is None:
        if not _PROVIDER_NAMED:
            return NO_SPANS
        try:
            trace = importlib.import_module("opentelemetry.trace")
        except ImportError:
            return NO_SPANS
    if _BROKEN:
        return NO_SPANS
    try:
        provider = trace.get_tracer_provider()
        if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
            return NO_SPANS
        if not _LAST or _LAST[0][0] is not provider:
            tracer = provider.get_tracer("judge", __version__)
            _LAST[:] = [(provider, _OtelSpans(tracer, trace))]
    except Exception as exc:  # telemetry never fails the judging it watches
        # A tracer provider that cannot be had (OTEL_PYTHON_TRACER_PROVIDER naming none that
        # is installed raised StopIteration inside every provider call): no spans, said once.
        _BROKEN.append(repr(exc))
        log.warning(
            "OpenTelemetry's tracer provider cannot be used (%r): judge emits no spans", exc
        )
        return NO_SPANS
    return _LAST[0][1]


def _broken_span(exc: BaseException) -> None:
    """Said once: OpenTelemetry failed to start or end a span (judge went on without it)."""
    if not _BROKEN_SPANS:
        _BROKEN_SPANS.append(repr(exc))
        log.warning("OpenTelemetry failed on a span (%r): judge goes on without it", exc)


_BROKEN_SPANS: list[str] = []


def _include_text() -> bool:
    said = _INCLUDE_TEXT.get()
    if said is not None:
        return said
    return os.environ.get(CAPTURE_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def _failed(span: Span, exc: BaseException) -> None:
    """``error.type`` on ``span`` (a provider failure's kind, else the exception's class) and
    an error status. The message, which may quote the request (a server's 400 echoes the
    prompt), only with text capture on: no text is in a span unless asked."""
    from opentelemetry.trace import Status, StatusCode  # a tracer provider is set: installed

    kind = exc.kind if isinstance(exc, ProviderError) else type(exc).__name__
    span.set_attribute("error.type", kind)
    said = f"{kind}: {exc}" if _include_text() else kind
    span.set_status(Status(StatusCode.ERROR, said))
    if _include_text():
        span.record_exception(exc)


class _OtelSpans(Spans):
    """Spans through an OpenTelemetry tracer."""

    def __init__(self, tracer: Tracer, trace: Any) -> None:
        self._tracer = tracer
        self._client = trace.SpanKind.CLIENT

    @contextlib.contextmanager
    def _started(self, name: str, **kwargs: Any) -> Iterator[Span | None]:
        """Span ``name``, current while the block runs; None when the SDK cannot start it (a
        span processor that raises, whose error became judge's: a RuntimeError out of every
        call). An SDK error ending it is said too, never raised: telemetry never fails the
        judging it watches."""
        try:
            # The SDK's default records an exception's message and traceback, which may quote
            # passages; _failed says what it may instead.
            manager = self._tracer.start_as_current_span(
                name, record_exception=False, set_status_on_exception=False, **kwargs
            )
            span = manager.__enter__()
        except Exception as exc:
            _broken_span(exc)
            yield None
            return
        try:
            yield span
        except BaseException as error:
            try:
                manager.__exit__(type(error), error, error.__traceback__)
            except Exception as raised:  # the block's own error, re-raised by the SDK: expected
                if raised is not error:
                    _broken_span(raised)
            raise
        try:
            manager.__exit__(None, None, None)
        except Exception as exc:
            _broken_span(exc)

    @contextlib.contextmanager
    def run(self, config: RunConfig, state: RunState) -> Iterator[None]:
        j = config.judge
        attributes: dict[str, Any] = {
            "gen_ai.request.model": j.model,
            "judge.provider": j.provider,
            "judge.scale": j.scale,
            "judge.mode": j.mode,
            "judge.repeats": config.run.repeats,
            "judge.units": len(state.units),
        }
        if config.source is not None:
            attributes["judge.config"] = config.source
        token = _INCLUDE_TEXT.set(config.telemetry.include_text or _include_text())
        try:
            with self._started("judge run", attributes=attributes) as span:
                if span is None:
                    yield
                    return
                try:
                    yield
                except BaseException as exc:
                    _failed(span, exc)
                    raise
                finally:
                    _finished(span, state)
        finally:
            _INCLUDE_TEXT.reset(token)

    @contextlib.contextmanager
    def query(self, query: Query, repeat: int) -> Iterator[QuerySpan]:
        attributes: dict[str, Any] = {
            "judge.query.id": query.query_id,
            "judge.engine": query.engine,
            "judge.repeat": repeat,
            "judge.passages": len(query.passages),
        }
        text = _include_text()
        if text:
            attributes["judge.query.text"] = query.query
        with self._started("judge query", attributes=attributes) as span:
            if span is None:
                yield _NO_QUERY
                return
            try:
                yield _OtelQuery(span, query if text else None)
            except BaseException as exc:
                _failed(span, exc)
                raise

    @contextlib.contextmanager
    def call(self, operation: str, identity: str, request: object) -> Iterator[CallSpan]:
        kind = identity.split(":", 1)[0]
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": kind,
            "gen_ai.system": kind,
        }
        if (url := _URL.search(identity)) is not None:
            where = urlsplit(url.group())
            attributes["server.address"] = where.hostname or ""
            if where.port is not None:
                attributes["server.port"] = where.port
        with self._started(operation, kind=self._client, attributes=attributes) as span:
            if span is None:
                yield _NO_CALL
                return
            call = _OtelCall(span, operation)
            call.asked(request)
            try:
                yield call
            except BaseException as exc:
                _failed(span, exc)
                raise


def _finished(span: Span, state: RunState) -> None:
    """What the run did: calls, cache hits, tokens, cost, and why it stopped if it did."""
    stats, budget = state.caller.stats, state.caller.budget
    span.set_attributes(
        {
            "judge.requests": stats.requests,
            "judge.cache_hits": stats.cache_hits,
            "judge.retries": stats.retries,
            "judge.failures": stats.failures,
            "gen_ai.usage.input_tokens": budget.usage.prompt_tokens,
            "gen_ai.usage.output_tokens": budget.usage.completion_tokens,
            "judge.cost_usd": budget.cost,
        }
    )
    if state.stopped_by is not None:
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("judge.stopped_by", state.stopped_by)
        span.set_attribute("error.type", state.stopped_by)
        span.set_status(Status(StatusCode.ERROR, f"stopped: {state.stopped_by}"))
    if state.reason is not None and _include_text():  # it may quote a provider's answer
        span.set_attribute("judge.stop_reason", state.reason)


class _OtelQuery(QuerySpan):
    def __init__(self, span: Span, query: Query | None) -> None:
        self._span = span
        # Only when text is asked for: the passages' text by id.
        self._texts = {p.id: p.text for p in query.passages} if query is not None else None

    def judged(self, verdicts: Sequence[Verdict] | None) -> None:
        if verdicts is None:
            return
        statuses = {"ok": 0, "unparsed": 0, "error": 0}
        for v in verdicts:
            statuses[v.status] = statuses.get(v.status, 0) + 1
            self._span.add_event(EVALUATION_EVENT, self._evaluation(v))
        self._span.set_attributes({f"judge.verdicts.{k}": n for k, n in statuses.items()})

    def _evaluation(self, v: Verdict) -> dict[str, Any]:
        """One verdict's event attributes (text only when asked for)."""
        event: dict[str, Any] = {
            "gen_ai.evaluation.name": "relevance",
            "gen_ai.evaluation.score.label": v.label if v.label is not None else v.status,
            "judge.passage.id": v.passage_id,
            "judge.passage.rank": v.rank,
            "judge.verdict.status": v.status,
            "judge.verdict.source": v.source,
            "judge.verdict.cached": v.cached,
            "judge.reason.length": len(v.reason or ""),
        }
        score = v.probability if v.probability is not None else v.grade
        if score is not None:
            event["gen_ai.evaluation.score.value"] = float(score)
        if v.probability is not None:
            event["judge.verdict.probability"] = v.probability
        if v.grade is not None:
            event["judge.verdict.grade"] = v.grade
        if v.signals:
            event["judge.verdict.signals"] = list(v.signals)
        if v.status != "ok":
            event["error.type"] = v.status
        if self._texts is not None:
            if v.reason:
                event["gen_ai.evaluation.explanation"] = v.reason
            event["judge.passage.text"] = self._texts.get(v.passage_id, "")
        return event


class _OtelCall(CallSpan):
    def __init__(self, span: Span, operation: str) -> None:
        self._span = span
        self._operation = operation
        self._model: str | None = None

    def asked(self, request: object) -> None:
        """The request's model and settings, once it is known (a Prompt renders on a miss)."""
        if self._model is not None:
            return
        if isinstance(request, ChatRequest | RerankRequest):
            rendered: ChatRequest | RerankRequest = request
        elif isinstance(getattr(request, "__dict__", {}).get("request"), ChatRequest):
            rendered = vars(request)["request"]  # a Prompt rendered by now (not rendered here)
        else:
            return
        self._model = rendered.model
        self._span.update_name(f"{self._operation} {rendered.model}")
        span = self._span
        span.set_attribute("gen_ai.request.model", rendered.model)
        if isinstance(rendered, ChatRequest):
            params = rendered.params
            for name, value in (
                ("gen_ai.request.temperature", params.temperature),
                ("gen_ai.request.max_tokens", params.max_tokens),
                ("gen_ai.request.seed", params.seed),
            ):
                if value is not None:
                    span.set_attribute(name, value)
            if _include_text():
                messages = [{"role": m.role, "content": m.content} for m in rendered.messages]
                span.set_attribute("gen_ai.input.messages", json.dumps(messages))
        elif _include_text():
            span.set_attribute("judge.rerank.documents", len(rendered.documents))

    def answered(self, call: _Call, request: object = None) -> None:
        self.asked(request)
        span, answer = self._span, call.answer
        span.set_attribute("judge.cache_hit", call.cached)
        span.set_attribute("judge.attempts", call.attempts)
        span.set_attribute("judge.latency_s", call.latency_s)
        if answer.model:
            span.set_attribute("gen_ai.response.model", answer.model)
            if self._model is None:
                span.update_name(f"{self._operation} {answer.model}")
        if not call.cached:
            span.set_attribute("gen_ai.usage.input_tokens", answer.usage.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", answer.usage.completion_tokens)
        if isinstance(answer, Completion):
            if answer.finish_reason:
                span.set_attribute("gen_ai.response.finish_reasons", [answer.finish_reason])
            if _include_text():
                said = [{"role": "assistant", "content": answer.text}]
                span.set_attribute("gen_ai.output.messages", json.dumps(said))
