"""OpenAI chat completions: OpenAI, DashScope compatible mode, vLLM, Ollama, llama.cpp server,
LM Studio — any endpoint is only a ``base_url``.

A chat completion goes out through a lean HTTP/1.1 client (judge/providers/lean_http.py): the
same JSON body, the same bytes on the wire as the ``openai`` SDK sends, answers and errors read
the same way, at a fraction of the SDK's CPU per call, and the SDK not even imported. The SDK
itself is used instead for ``[provider] options = {client = "sdk"}``, for an injected
``http_client``, for a base URL with a query, fragment or user in it, and whenever an
``*_PROXY`` variable is set (the SDK's httpx honours them; the lean client does not).
Either way the SDK's own retries are off: the runner is the one retry authority, so a
complete() is exactly one HTTP request. Features an endpoint lacks are left out of the
request (``supports_json_mode`` / ``supports_logprobs`` in the spec) rather than failing it.

The SDK is imported, and its client made, on its first use: importing ``openai`` takes
longer than a fully cached run of a hundred queries, which never sends one. The API key is
read when the provider is made, so a missing one still stops a run before anything else.

The Batch API (``judge run --batch``) is wire here too, through the SDK: a batch input line is
the body :meth:`OpenAICompatProvider.complete` would send; files are uploaded, batches created,
read and cancelled through the SDK, and output lines read back into Completions
(:func:`read_batch_lines`). What to batch, and when, is decided above (judge/run/batch.py).
"""

from __future__ import annotations

import json
import os
from functools import cache
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

from judge.errors import ProviderConfigError, ResponseError
from judge.providers.base import (
    ChatRequest,
    Completion,
    ErrorTable,
    ProviderSpec,
    ProviderStatusError,
    RetryDecision,
    classify_by_type,
    parse_retry_after,
    read_api_key,
    read_chat_usage,
    read_json_answer,
    redirect_message,
    sampling_fields,
    status_decision,
)
from judge.providers.lean_http import AnswerTooLarge, LeanClient, Response
from judge.schema import Record
from judge.version import __version__

if TYPE_CHECKING:
    import httpx2

DEFAULT_BASE_URL = "https://api.openai.com/v1"
CHAT_URL = "/v1/chat/completions"  # a batch line's url, and the batch's endpoint
# A batch's statuses after which it changes no more.
BATCH_DONE = frozenset({"completed", "failed", "expired", "cancelled"})


class BatchJob(Record):
    """A batch as its endpoint reports it (the SDK's Batch, reduced to what judge reads)."""

    id: str
    status: str
    input_file_id: str
    output_file_id: str | None = None
    error_file_id: str | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    errors: tuple[str, ...] = ()  # batch-level errors: why a batch failed validation

    @property
    def done(self) -> bool:
        return self.status in BATCH_DONE


class BatchLine(Record):
    """One line of a batch's output or error file: its answer, or why there is none."""

    custom_id: str
    completion: Completion | None = None
    error: str | None = None
    # A line of the output file that could not be read as an answer (a 200 whose body is no
    # chat completion): it ran, so it is billed, its usage unknown.
    billed: bool = False


def _job(batch: Any) -> BatchJob:
    counts = batch.request_counts
    errors = batch.errors.data if batch.errors is not None and batch.errors.data else []
    return BatchJob(
        id=batch.id,
        status=batch.status,
        input_file_id=batch.input_file_id,
        output_file_id=batch.output_file_id,
        error_file_id=batch.error_file_id,
        total=counts.total if counts else 0,
        completed=counts.completed if counts else 0,
        failed=counts.failed if counts else 0,
        errors=tuple(
            f"{e.message or e.code}" + (f" (line {e.line})" if e.line else "") for e in errors
        ),
    )


def read_batch_lines(content: bytes, model: str) -> list[BatchLine]:
    """Every line of a batch output or error file: a Completion for a 200 answer, else why
    there is none (a line that is not JSON or names no custom_id matches nothing: skipped)."""
    out: list[BatchLine] = []
    for raw in content.splitlines():
        try:
            data = json.loads(raw)
            custom_id = str(data["custom_id"])
            response = data.get("response") or {}
        except (AttributeError, KeyError, TypeError, ValueError):
            continue
        status = response.get("status_code") if isinstance(response, dict) else None
        if status == 200 and not data.get("error"):
            try:
                answer = _completion(response.get("body"), model)
                out.append(BatchLine(custom_id=custom_id, completion=answer))
            except ResponseError as exc:
                out.append(BatchLine(custom_id=custom_id, error=str(exc), billed=True))
            continue
        body = response.get("body") if isinstance(response, dict) else None
        error = data.get("error") or (body.get("error") if isinstance(body, dict) else None)
        what = error.get("message") or error.get("code") if isinstance(error, dict) else error
        prefix = f"HTTP {status}: " if status else ""
        out.append(BatchLine(custom_id=custom_id, error=f"{prefix}{what or 'no answer'}"))
    return out


@cache
def _errors() -> ErrorTable:
    """The SDK's exceptions and what they mean (imported with the SDK, on first use)."""
    import httpx2
    import openai

    return (
        # APITimeoutError subclasses APIConnectionError, so it comes first.
        (openai.APITimeoutError, RetryDecision(retry=True, kind="timeout")),
        (
            (openai.APIConnectionError, httpx2.TransportError),
            RetryDecision(retry=True, kind="connection"),
        ),
        (openai.APIResponseValidationError, RetryDecision(retry=True, kind="protocol")),
    )


def _tokens(content: Any) -> list[dict[str, Any]]:
    """The fields of each token's logprobs that a TokenLogprob holds (the rest, e.g.
    ``bytes``, dropped)."""
    return [
        {
            "token": item["token"],
            "logprob": item["logprob"],
            "top": [
                {"token": t["token"], "logprob": t["logprob"]}
                for t in item.get("top_logprobs") or ()
            ],
        }
        for item in content
    ]


def to_completion(raw: bytes, model: str, where: str = "the server") -> Completion:
    """Our Completion from a chat completion's JSON body, read and checked here: the SDK's
    response objects cost more than the rest of a call (most of it for the logprobs).
    ``where``: the URL it came from, named when it cannot be read."""
    data = read_json_answer(raw, where, "a chat completion", _NOT_THE_API)
    return _completion(data, model, where)


# Where a web page answers instead of the chat API, base_url is most often missing its /v1.
_NOT_THE_API = "is base_url the API's root? (for most OpenAI-compatible servers it ends in /v1)"


def _completion(data: Any, model: str, where: str = "the server") -> Completion:
    """:func:`to_completion` of a body already read as JSON (a batch output line holds one)."""
    if (
        isinstance(data, dict)
        and "choices" not in data
        and (data.get("error") or data.get("object") == "error")
    ):
        # An error object with a success status (some gateways answer so; vLLM's is
        # {"object": "error", "message": ...}): the server's own words, final as its status
        # says (a 200 is a client error here), not "malformed" and retried.
        message, code = _error_of(json.dumps({"error": data.get("error") or data}).encode())
        raise ProviderStatusError(
            f"an error in a 200 answer from {where}: {message}", status=200, code=code
        )
    if isinstance(data, dict) and data.get("choices") == []:
        raise ResponseError(f"a chat completion from {where} with no choices (nothing answered)")
    if not isinstance(data, dict):
        raise ResponseError(
            f"not a chat completion from {where}: a JSON {type(data).__name__}, not an object"
        )
    try:
        choice = data["choices"][0]
        logprobs = choice.get("logprobs") or {}
        text = choice["message"].get("content") or ""
        counts = data.get("usage")
        usage, known = read_chat_usage(counts, "prompt_tokens", "completion_tokens", text)
        return Completion.model_validate(
            {
                "text": text,
                "model": data.get("model") or model,
                "finish_reason": choice.get("finish_reason"),
                "logprobs": _tokens(logprobs["content"]) if logprobs.get("content") else None,
                "usage": usage,
                "usage_known": known,
            }
        )
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
        raise ResponseError(f"malformed chat completion from {where}: {exc}") from exc


# The variables the SDK's httpx reads a proxy from; with one set, calls go through the SDK.
_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")
CLIENTS = ("lean", "sdk")


def check_options(spec: ProviderSpec) -> str:
    """The chat client ``[provider] options`` name (``client``, an OpenAI-compatible server's
    one option); a ProviderConfigError for another option or client, before anything is
    sent (the embedded judge's spec carries its llama.cpp server's options: not checked
    here, but by its own kind)."""
    unknown = sorted(set(spec.options) - {"client"})
    if unknown:
        raise ProviderConfigError(
            f"unknown provider option(s) {', '.join(unknown)}: the one option is client "
            f"({' or '.join(CLIENTS)})"
        )
    return _client(spec)


def _client(spec: ProviderSpec) -> str:
    client = spec.options.get("client", "lean")
    if client not in CLIENTS:
        raise ProviderConfigError(
            f"provider option client = {client!r}: use one of {', '.join(CLIENTS)}"
        )
    return str(client)


def _lean_fits(base_url: str) -> bool:
    """Whether the lean client sends to ``base_url`` what the SDK would: no proxy variable set
    (the SDK's httpx honours them), and a plain URL (no query, fragment or user in it)."""
    if any(os.environ.get(n) or os.environ.get(n.upper()) for n in _PROXY_VARIABLES):
        return False
    parts = urlsplit(base_url)
    return not (parts.query or parts.fragment or parts.username)


def _lean_headers(api_key: str) -> dict[str, str]:
    """What the SDK sends on every chat request besides its telemetry (``x-stainless-*``):
    the key, JSON both ways, the encodings it accepts, and the organization and project it
    reads from the environment."""
    headers = {
        "Accept": "application/json",
        "Content-Type": "application/json",
        "Accept-Encoding": "gzip, deflate",
        "User-Agent": f"judge/{__version__}",
        "Authorization": f"Bearer {api_key}",
    }
    for header, variable in (
        ("OpenAI-Organization", "OPENAI_ORG_ID"),
        ("OpenAI-Project", "OPENAI_PROJECT_ID"),
    ):
        if value := os.environ.get(variable):
            headers[header] = value
    return headers


def _status_error(response: Response, where: str = "") -> ProviderStatusError:
    """An error status as the SDK reads it: the body's error message, Retry-After (seconds or
    an HTTP date) else retry-after-ms, and the request id; a 404 names ``where`` (the URL)."""
    headers = response.headers
    retry_after = parse_retry_after(headers.get("retry-after"))
    millis = parse_retry_after(headers.get("retry-after-ms"))
    if retry_after is None and millis is not None:
        retry_after = millis / 1000
    if response.status < 400:
        where = redirect_message(response.status, headers.get("location"))
        return ProviderStatusError(where, status=response.status)
    message, code = _error_of(response.content)
    if response.status == 404:  # a base_url's path mistyped, or a model it does not serve
        message = f"{message or 'not found'} (at {where})" if where else message
    return ProviderStatusError(
        message or "no message",
        status=response.status,
        retry_after=retry_after,
        request_id=headers.get("x-request-id"),
        code=code,
        url=where or None,
    )


def _error_of(body: bytes) -> tuple[str, str | None]:
    """An error body's message (its ``error.message``, else its text) and code."""
    message, code = body.decode("utf-8", "replace").strip()[:500], None
    try:
        error = json.loads(body).get("error")
    except (AttributeError, ValueError):
        return message, code
    if isinstance(error, dict):
        code = error.get("code") if isinstance(error.get("code"), str) else None
        error = error.get("message")
    return (str(error) if error else message), code


# How many of an organisation's latest batches are looked through for one made from a file.
FIND_BATCHES = 5_000


class OpenAICompatProvider:
    """A ChatProvider for any OpenAI-compatible ``/chat/completions`` endpoint.

    ``spec.options["client"]``: ``"lean"`` (the default) sends chat completions through
    judge's own HTTP client; ``"sdk"`` through the ``openai`` SDK (the reference: the same
    requests, answers and error kinds, more CPU per call). ``http_client`` (an
    ``httpx2.AsyncClient``, as openai 3.x is built on httpx2) is an injection seam that implies
    the SDK; a client passed in is not closed by :meth:`aclose`.
    """

    def __init__(
        self, spec: ProviderSpec, *, http_client: httpx2.AsyncClient | None = None
    ) -> None:
        self._spec = spec
        self._base_url = (spec.base_url or DEFAULT_BASE_URL).rstrip("/")
        self._chat_url = f"{self._base_url}/chat/completions"  # named in a malformed answer
        self._owns_client = http_client is None
        self._http_client = http_client
        self._api_key = read_api_key(spec)
        self._identity = f"openai:{self._base_url}{spec.body_fingerprint()}"  # once: every key
        self._sdk: Any = None  # openai.AsyncOpenAI, made on the first request
        client = _client(spec)
        lean = client == "lean" and http_client is None and _lean_fits(self._base_url)
        self._lean = LeanClient(self._base_url, _lean_headers(self._api_key)) if lean else None

    @property
    def spec(self) -> ProviderSpec:
        """The spec every request is built from (``extra_body`` as sent to the server)."""
        return self._spec

    @property
    def _client(self) -> Any:
        if self._sdk is None:
            import openai

            self._sdk = openai.AsyncOpenAI(
                base_url=self._base_url,
                api_key=self._api_key,
                max_retries=0,
                http_client=self._http_client,
            )
        return self._sdk

    @property
    def identity(self) -> str:
        """``openai:<base URL>``, plus the spec's body fingerprint when it adds fields (the
        local presets' neutral sampling, a config's ``extra_body``): they change the answer."""
        return self._identity

    @property
    def client(self) -> str:
        """Which HTTP client sends chat completions: "lean" or "sdk"."""
        return "sdk" if self._lean is None else "lean"

    def request_body(self, request: ChatRequest) -> dict[str, Any]:
        """The JSON fields besides model and messages that ``request`` sends to this endpoint."""
        return sampling_fields(request.params, self._spec)

    def body(self, request: ChatRequest) -> dict[str, Any]:
        """The whole JSON body :meth:`complete` POSTs for ``request`` (a batch line's too)."""
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        return {"model": request.model, "messages": messages, **self.request_body(request)}

    async def complete(self, request: ChatRequest, *, timeout: float | None) -> Completion:
        """One chat completion: one HTTP request, no retries; errors go to :meth:`classify`."""
        body = self.body(request)
        if self._lean is not None:
            # Serialised as the SDK serialises a body: the same bytes on the wire.
            data = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            try:
                response = await self._lean.post(
                    "/chat/completions", data.encode(), timeout=timeout
                )
            except AnswerTooLarge as exc:  # final: asked again, it would be paid again
                raise ProviderStatusError(f"{exc} ({self._chat_url})", status=200) from None
            if response.status >= 300:  # a redirect too: named, not followed (base.py)
                raise _status_error(response, self._chat_url)
            return to_completion(response.content, request.model, self._chat_url)
        # The SDK's documented way to POST a body we built ourselves: the same request as
        # chat.completions.create, without re-walking every field through its type
        # transforms, and the raw answer back (its error statuses still raised by the SDK).
        import httpx2

        options: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        response = await self._client.post(
            "/chat/completions", body=body, cast_to=httpx2.Response, options=cast(Any, options)
        )
        return to_completion(await response.aread(), request.model, self._chat_url)

    # ---- the Batch API: one HTTP request per method, no retries (the caller decides) --------

    def batch_line(self, custom_id: str, request: ChatRequest) -> bytes:
        """One line of a batch input file: ``request`` as :meth:`complete` would POST it."""
        line = {
            "custom_id": custom_id,
            "method": "POST",
            "url": CHAT_URL,
            "body": self.body(request),
        }
        return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"

    async def upload_batch_file(self, data: bytes, name: str, *, timeout: float) -> str:
        """Upload a batch input file (purpose "batch"); its file id."""
        sent = await self._client.files.create(
            file=(name, data, "application/jsonl"), purpose="batch", timeout=timeout
        )
        return str(sent.id)

    async def create_batch(
        self, input_file_id: str, metadata: dict[str, str], *, timeout: float
    ) -> BatchJob:
        """Start a batch over an uploaded file, within the 24-hour window."""
        batch = await self._client.batches.create(
            completion_window="24h",
            endpoint=CHAT_URL,
            input_file_id=input_file_id,
            metadata=metadata,
            timeout=timeout,
        )
        return _job(batch)

    async def find_batch(self, input_file_id: str, *, timeout: float) -> BatchJob | None:
        """The newest batch made from ``input_file_id`` (of the latest FIND_BATCHES, page by
        page, newest first): a create whose answer was lost may have started one, which must
        not be started twice (its first page alone had missed one a busy organisation's
        hundred later batches had pushed off it)."""
        seen = 0
        async for batch in self._client.batches.list(limit=100, timeout=timeout):
            if batch.input_file_id == input_file_id:
                return _job(batch)
            seen += 1
            if seen >= FIND_BATCHES:
                break
        return None

    async def get_batch(self, batch_id: str, *, timeout: float) -> BatchJob:
        return _job(await self._client.batches.retrieve(batch_id, timeout=timeout))

    async def cancel_batch(self, batch_id: str, *, timeout: float) -> BatchJob:
        return _job(await self._client.batches.cancel(batch_id, timeout=timeout))

    async def file_content(self, file_id: str, *, timeout: float) -> bytes:
        got = await self._client.files.content(file_id, timeout=timeout)
        return bytes(got.content)

    async def delete_file(self, file_id: str, *, timeout: float) -> None:
        await self._client.files.delete(file_id, timeout=timeout)

    def classify(self, exc: BaseException) -> RetryDecision:
        """Retry rate limits (honouring Retry-After), 5xx/408/409, timeouts, dropped
        connections and bodies that are not a chat completion; never other 4xx."""
        if self._lean is not None and self._sdk is None:  # no SDK made a request: no SDK error
            return classify_by_type(exc)
        import openai

        if isinstance(exc, openai.APIStatusError):
            headers = exc.response.headers
            retry_after = parse_retry_after(headers.get("retry-after"))
            millis = parse_retry_after(headers.get("retry-after-ms"))
            if retry_after is None and millis is not None:
                retry_after = millis / 1000
            code = exc.code if isinstance(exc.code, str) else None
            return status_decision(exc.status_code, retry_after, code)
        return classify_by_type(exc, _errors())

    async def aclose(self) -> None:
        if self._lean is not None:
            await self._lean.aclose()
        if self._owns_client and self._sdk is not None:
            await self._sdk.close()
