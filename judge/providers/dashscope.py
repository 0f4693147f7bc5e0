"""DashScope's native API through the ``dashscope`` SDK (2.0.2): Qwen chat and gte/qwen rerank.

What the SDK does that we adapt to:

- It returns HTTP errors as a response with ``status_code``, ``code``, ``message`` and
  ``request_id`` instead of raising; we raise :class:`ProviderStatusError` from them, keeping
  ``Retry-After`` from the response headers.
- Its base URL is a module global; we pass ``base_address=`` per call instead, so providers
  with different URLs coexist in one process.
- It re-sends a request once when the connection drops before the answer
  (``send_with_retry_async``). The runner is the one retry authority, so an aiohttp trace
  hook turns that second attempt into the first attempt's error: one call, one request.
- Each provider owns its aiohttp session (closed by ``aclose``) rather than the SDK's shared
  per-loop one, which nothing closes before the loop ends.
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import aiohttp
import certifi
import dashscope

from judge.errors import NotTheApiError, ResponseError
from judge.providers.base import (
    ChatRequest,
    Completion,
    ErrorTable,
    ProviderSpec,
    ProviderStatusError,
    RerankRequest,
    RerankResult,
    RetryDecision,
    TokenLogprob,
    TopLogprob,
    classify_by_type,
    parse_retry_after,
    read_api_key,
    read_chat_usage,
    read_json_answer,
    read_usage,
    rerank_fields,
    rerank_pair,
    sampling_fields,
    scores_in_input_order,
)

DEFAULT_BASE_URL = "https://dashscope.aliyuncs.com/api/v1"

_ERRORS: ErrorTable = (
    # aiohttp's timeout errors are also connection errors, so they come first.
    (asyncio.TimeoutError, RetryDecision(retry=True, kind="timeout")),
    (
        (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError),
        RetryDecision(retry=True, kind="connection"),
    ),
)


@dataclass
class _Attempt:
    sent: bool = False
    failure: BaseException | None = None
    # The answer's first bytes: the SDK drops a 200's error ``code`` and ``message``.
    body: bytearray = field(default_factory=bytearray)


_BODY_KEPT = 1 << 16


_ATTEMPT: ContextVar[_Attempt | None] = ContextVar("judge_dashscope_attempt", default=None)


async def _on_request_start(
    session: aiohttp.ClientSession, context: SimpleNamespace, params: Any
) -> None:
    attempt = _ATTEMPT.get()
    if attempt is None:
        return
    if attempt.sent:  # the SDK's hidden resend: fail it the way the first attempt failed
        raise attempt.failure or ResponseError("the dashscope SDK re-sent a request")
    attempt.sent = True


async def _on_request_exception(
    session: aiohttp.ClientSession, context: SimpleNamespace, params: Any
) -> None:
    attempt = _ATTEMPT.get()
    if attempt is not None and attempt.failure is None:
        attempt.failure = params.exception


async def _on_response_chunk(
    session: aiohttp.ClientSession, context: SimpleNamespace, params: Any
) -> None:
    attempt = _ATTEMPT.get()
    if attempt is not None and len(attempt.body) < _BODY_KEPT:
        attempt.body += params.chunk[: _BODY_KEPT - len(attempt.body)]


def _error_in(body: bytes | bytearray) -> tuple[str, str] | None:
    """(code, message) of a DashScope error object in ``body``, if it is one."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if isinstance(data, dict) and data.get("code") and not data.get("output"):
        return str(data["code"]), str(data.get("message") or "")
    return None


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=certifi.where())


def _status_error(response: Any, key: str) -> ProviderStatusError:
    """Our exception for a non-200 SDK response, with Retry-After and the request id."""
    headers = {str(k).lower(): str(v) for k, v in (response.headers or {}).items()}
    message = f"{response.code or 'error'}: {response.message or ''}".replace(key, "***")
    return ProviderStatusError(
        message,
        status=int(response.status_code),
        retry_after=parse_retry_after(headers.get("retry-after")),
        request_id=response.request_id or None,
        code=str(response.code) if response.code else None,
    )


def _text(content: Any) -> str:
    """Message content: a string, or a list of ``{"text": ...}`` parts (multimodal models)."""
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


def _logprobs(choice: Any) -> tuple[TokenLogprob, ...] | None:
    content = (choice.get("logprobs") or {}).get("content")
    if not content:
        return None
    return tuple(
        TokenLogprob(
            token=item["token"],
            logprob=item["logprob"],
            top=tuple(
                TopLogprob(token=t["token"], logprob=t["logprob"])
                for t in item.get("top_logprobs") or ()
            ),
        )
        for item in content
    )


class _DashScopeBase:
    """What chat and rerank share: key, base URL, session, the one-attempt guard, classify."""

    def __init__(self, spec: ProviderSpec) -> None:
        self._spec = spec
        self._base_url = (spec.base_url or DEFAULT_BASE_URL).rstrip("/")
        self._key = read_api_key(spec)
        self._session: aiohttp.ClientSession | None = None

    @property
    def identity(self) -> str:
        return f"dashscope:{self._base_url}{self._spec.body_fingerprint()}"

    @property
    def spec(self) -> ProviderSpec:
        """The spec every request is built from (``extra_body`` as sent to the server)."""
        return self._spec

    async def _call(self, api: Any, timeout: float | None, arguments: dict[str, Any]) -> Any:
        """One SDK call as one HTTP request; non-200 answers raised as ProviderStatusError."""
        if self._session is None or self._session.closed:
            trace = aiohttp.TraceConfig()
            trace.on_request_start.append(_on_request_start)
            trace.on_request_exception.append(_on_request_exception)
            trace.on_response_chunk_received.append(_on_response_chunk)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=_ssl_context()),
                trust_env=True,
                trace_configs=[trace],
            )
        arguments = {
            **arguments,
            "api_key": self._key,
            "base_address": self._base_url,
            "session": self._session,
        }
        if timeout is not None:
            arguments["request_timeout"] = timeout
        attempt = _Attempt()
        token = _ATTEMPT.set(attempt)
        try:
            response = await api.call(**arguments)
        except (TypeError, KeyError, AttributeError) as exc:
            # The SDK builds its response objects unchecked: a 200 without the expected
            # fields fails inside it like this. An error object in it is the server's word,
            # final (as an OpenAI-compatible server's), not a malformed answer to retry.
            if said := _error_in(attempt.body):
                code, message = said
                raise ProviderStatusError(
                    f"an error in a 200 answer: {code}: {message}".replace(self._key, "***"),
                    status=200,
                    code=code,
                ) from None
            raise ResponseError(f"malformed DashScope answer: {exc!r}") from exc
        except json.JSONDecodeError:
            # A body served as JSON that is none: a web page or an event stream is not the
            # API, named at once as the OpenAI-compatible path names it; other broken JSON (a
            # dropped connection) is malformed, retried.
            read_json_answer(bytes(attempt.body), self._base_url, "a DashScope answer")
            raise
        except aiohttp.ContentTypeError as exc:
            if not 200 <= exc.status < 300:  # an error page: the status decides
                raise ProviderStatusError(exc.message, status=exc.status) from exc
            kind = exc.headers.get("Content-Type", "not JSON") if exc.headers else "not JSON"
            raise NotTheApiError(
                f"{exc.request_info.real_url} answered {exc.status} with {kind}, not a "
                "DashScope answer: does base_url point at DashScope's API (…/api/v1)?"
            ) from None
        finally:
            _ATTEMPT.reset(token)
        if response.status_code != 200:
            raise _status_error(response, self._key)
        return response

    def classify(self, exc: BaseException) -> RetryDecision:
        """HTTP statuses as usual (429 with Retry-After); timeouts, dropped connections and
        bodies that are not DashScope JSON are retried."""
        return classify_by_type(exc, _ERRORS)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class DashScopeProvider(_DashScopeBase):
    """A ChatProvider for DashScope's native text-generation API (``result_format=message``).

    ``spec.extra_body`` and ``params.extra_body`` become SDK parameters verbatim
    (``enable_thinking``, ``top_k``, ``enable_search``, ...), overriding ours.
    """

    def parameters(self, request: ChatRequest) -> dict[str, Any]:
        """The SDK keyword arguments (request parameters) that ``request`` sends."""
        return {"result_format": "message", **sampling_fields(request.params, self._spec)}

    async def complete(self, request: ChatRequest, *, timeout: float | None) -> Completion:
        """One generation call: one HTTP request, no retries; errors go to :meth:`classify`."""
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        arguments = {**self.parameters(request), "model": request.model, "messages": messages}
        response = await self._call(dashscope.AioGeneration, timeout, arguments)
        try:
            choice = response.output.choices[0]
            # Counts that are not counts (negative, text) leave the usage unknown: the Caller
            # counts the request's worst case, never a negative spend that lifts the budget.
            text = _text(choice.message.content if choice.message else None)
            counts = response.usage
            usage, known = read_chat_usage(counts, "input_tokens", "output_tokens", text)
            return Completion(
                text=text,
                model=request.model,
                finish_reason=choice.finish_reason,
                logprobs=_logprobs(choice),
                usage=usage,
                usage_known=known,
            )
        except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
            raise ResponseError(f"malformed DashScope generation answer: {exc!r}") from exc


class DashScopeRerankProvider(_DashScopeBase):
    """A RerankProvider for DashScope's text-rerank API (gte-rerank-v2, qwen3-rerank)."""

    async def rerank(self, request: RerankRequest, *, timeout: float | None) -> RerankResult:
        """One rerank call (one HTTP request, no retries): scores in input order."""
        if not request.documents:
            return RerankResult(scores=(), model=request.model)
        fields = rerank_fields(request)
        arguments = {**self._spec.extra_body, **fields, "return_documents": False}
        response = await self._call(dashscope.AioTextReRank, timeout, arguments)
        try:
            pairs = [rerank_pair(r.index, r.relevance_score) for r in response.output.results]
            usage, known = read_usage(response.usage, "total_tokens")
        except (AttributeError, TypeError, ValueError) as exc:
            raise ResponseError(f"malformed DashScope rerank answer: {exc!r}") from exc
        return RerankResult(
            scores=scores_in_input_order(pairs, len(request.documents), fields["top_n"]),
            model=request.model,
            usage=usage,
            usage_known=known,
        )
