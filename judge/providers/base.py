"""What every provider speaks: requests, completions, and error classification.

Providers make exactly one call per ``complete``/``rerank`` and never retry: the runner is
the one retry authority (DESIGN rule 2). A provider only *classifies* what went wrong via
``classify(exc) -> RetryDecision``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import socket
from collections.abc import Iterable, Iterator, Sequence
from contextvars import ContextVar
from datetime import UTC
from typing import Annotated, Any, Literal, Protocol, runtime_checkable
from urllib.parse import urlsplit

from pydantic import BeforeValidator, Field, field_validator
from pydantic_core import from_json

from judge.errors import NotTheApiError, ProviderConfigError, ProviderError, ResponseError
from judge.schema import ProviderKind, Record, SamplingParams, Usage, WholeText

Role = Literal["system", "user", "assistant"]


class Message(Record):
    role: Role
    content: str


class ChatRequest(Record):
    model: str
    messages: tuple[Message, ...]
    params: SamplingParams = SamplingParams()


# The log-probability of a token the server says cannot come (-infinity, as a server that
# constrains its output to a grammar reports the tokens it forbids), kept finite so that the
# answer is stored and read back like any other (JSON has no infinity).
NO_LOGPROB = -1e9


def _finite_logprob(value: object) -> object:
    if isinstance(value, float) and math.isinf(value) and value < 0:
        return NO_LOGPROB
    return value


def _known(value: object) -> bool:
    """Whether a logprob as a server gave it is a number (not NaN, null, +infinity)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and (math.isfinite(value) or value < 0)
    )


def _logprobs_known(tokens: Any) -> Any:
    """A completion's logprobs, or None when a server gave one that is not a number (NaN,
    null, +infinity): the probability is then unknown, not 0 (a "yes" whose token had no
    logprob had read P(relevant) 0.0), and nothing unreadable is stored."""
    if tokens is None:
        return None
    for token in tokens:
        item = token.model_dump() if isinstance(token, TokenLogprob) else token
        if not isinstance(item, dict):
            return tokens  # left to the model's own validation
        values = [item.get("logprob"), *(t.get("logprob") for t in item.get("top") or ())]
        if not all(map(_known, values)):
            return None
    return tokens


Logprob = Annotated[float, BeforeValidator(_finite_logprob)]


class TopLogprob(Record):
    token: WholeText
    logprob: Logprob


class TokenLogprob(Record):
    token: WholeText
    logprob: Logprob
    top: tuple[TopLogprob, ...] = ()


class Completion(Record):
    """One answer from a chat provider (what the cache stores). ``usage_known``: False when
    the answer's token counts were not counts (negative, fractional, text): the Caller then
    counts the request's worst case, which the budget reserved, as its usage."""

    text: WholeText
    model: str = ""
    finish_reason: str | None = None
    logprobs: Annotated[tuple[TokenLogprob, ...] | None, BeforeValidator(_logprobs_known)] = None
    usage: Usage = Usage()
    usage_known: bool = True


class RerankRequest(Record):
    """``masked``: the documents are passages with the query's own words masked out (the echo
    check, judging/echo.py): what is left is their content. A reranker of our own may read such
    text by a signal that needs no query word to match (the embedded fused reranker scores it
    by a bi-encoder); on the wire it is not sent: a remote reranker scores the text it gets."""

    model: str
    query: str
    documents: tuple[str, ...]
    top_n: int | None = None
    masked: bool = False


class RerankResult(Record):
    """Relevance score in [0, 1] per input document, in the input order."""

    scores: tuple[float, ...]
    model: str = ""
    usage: Usage = Usage()
    usage_known: bool = True  # as Completion's


def token_count(value: Any) -> int | None:
    """A token count as an answer's ``usage`` gives it: a whole number >= 0 (12.0 and "12"
    too), 0 when absent; None for anything else (negative, fractional, text), which is not a
    count: the usage is then unknown, never a negative spend that would lift the budget."""
    if value is None:
        return 0
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float):
        return int(value) if value.is_integer() and value >= 0 else None
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def read_usage(counts: Any, *names: str) -> tuple[Usage, bool]:
    """(usage, known) from an answer's ``usage`` object: ``names`` are its prompt and
    completion counts' keys (a missing object or key counts 0); known is False when a count
    is not one (see :func:`token_count`)."""
    if not isinstance(counts, dict):
        return Usage(), counts is None
    got = [token_count(counts.get(name)) for name in names]
    if None in got:
        return Usage(), False
    prompt, *rest = got
    return Usage(prompt_tokens=prompt or 0, completion_tokens=rest[0] if rest else 0), True


def read_chat_usage(counts: Any, prompt: str, completion: str, text: str) -> tuple[Usage, bool]:
    """:func:`read_usage` for a chat answer, where no usage is not "nothing spent": a missing
    or null ``usage``, or no completion tokens for an answer with text (or none at all), is
    unknown too (the Caller counts the request's worst case, as reserved: a server that
    reports nothing had let a run pass every budget). No prompt tokens beside completion
    tokens is a count: a server may report a prompt it had cached as none (Ollama)."""
    if counts is None:
        return Usage(), False
    usage, known = read_usage(counts, prompt, completion)
    if known and usage.completion_tokens == 0 and (text or usage.prompt_tokens == 0):
        return Usage(), False
    return usage, known


def rerank_pair(index: Any, score: Any) -> tuple[int, float]:
    """A rerank result's (index, score) as the protocol gives them: a whole number (an index
    of 1.4, or true, is no index) and a number (true is no score); ValueError otherwise."""
    if isinstance(index, bool) or not isinstance(index, int | float) or index != int(index):
        raise ValueError(f"index {index!r} is not a whole number")
    if isinstance(score, bool) or not isinstance(score, int | float):
        raise ValueError(f"score {score!r} is not a number")
    return int(index), float(score)


def rerank_fields(request: RerankRequest) -> dict[str, Any]:
    """What every rerank protocol sends; ``top_n`` at most (by default) the documents' count."""
    count = len(request.documents)
    return {
        "model": request.model,
        "query": request.query,
        "documents": list(request.documents),
        "top_n": min(request.top_n or count, count),
    }


def scores_in_input_order(
    ranked: Iterable[tuple[int, float]], count: int, top_n: int
) -> tuple[float, ...]:
    """``scores[i]`` for document ``i`` from (index, score) pairs in any order (answers come
    best first). Documents left out because ``top_n < count`` was asked for score 0.0; any
    other gap, an index out of range, a repeat or a non-finite score is a ResponseError."""
    scores: dict[int, float] = {}
    for index, score in ranked:
        if not 0 <= index < count or index in scores or not math.isfinite(score):
            raise ResponseError(f"rerank answer has a bad result: index {index}, score {score}")
        scores[index] = score
    if len(scores) < min(top_n, count):
        raise ResponseError(f"rerank answer scores {len(scores)} of {count} documents")
    return tuple(scores.get(i, 0.0) for i in range(count))


class RetryDecision(Record):
    """How the runner should treat an exception from a provider call."""

    retry: bool
    # "rate_limit", "server", "timeout", "connection", "client", "protocol", "not_api", ...
    kind: str
    retry_after: float | None = None  # seconds, from a Retry-After header when present


@runtime_checkable
class ChatProvider(Protocol):
    """A chat model behind some wire protocol."""

    @property
    def identity(self) -> str:
        """What distinguishes this endpoint's answers (kind + base URL), for the cache key."""
        ...

    async def complete(self, request: ChatRequest, *, timeout: float | None) -> Completion: ...

    def classify(self, exc: BaseException) -> RetryDecision: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class RerankProvider(Protocol):
    """A reranker: one relevance score per document."""

    @property
    def identity(self) -> str: ...

    async def rerank(self, request: RerankRequest, *, timeout: float | None) -> RerankResult: ...

    def classify(self, exc: BaseException) -> RetryDecision: ...

    async def aclose(self) -> None: ...


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP date); None if absent/bad."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    from datetime import datetime
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def request_key(identity: str, request: ChatRequest | RerankRequest, repeat: int) -> str:
    """Content address of a call: everything that changes the answer, plus the repeat index.

    Timeouts, concurrency and API keys are deliberately not part of it (DESIGN rule 3).
    """
    # An unmasked rerank request is keyed as before the flag existed: its answers stay cached.
    drop = {"masked"} if isinstance(request, RerankRequest) and not request.masked else None
    payload = {
        "identity": identity,
        "request": request.model_dump(mode="json", exclude=drop),
        "repeat": repeat,
    }
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class ProviderSpec(Record):
    """A provider as configured: a preset name or kind, plus overrides from the config.

    An OpenAI-compatible endpoint is only this (kind="openai" + base_url), never new code.
    """

    kind: ProviderKind = "openai"
    base_url: str | None = None
    # Name of the environment variable holding the key; the key itself is never stored.
    api_key_env: str | None = None
    # Whether the endpoint honours response_format / logprobs (many local servers differ).
    supports_json_mode: bool = True
    supports_logprobs: bool = True
    # How a JSON schema travels: OpenAI's {"type": "json_schema", "json_schema": {...}}, or
    # {"type": "json_object", "schema": {...}}, the only form llama-cpp-python's server takes
    # (it turns the schema into a grammar; llama.cpp's llama-server reads both).
    schema_spelling: Literal["json_schema", "json_object"] = "json_schema"
    # Merged into every request's extra_body (e.g. {"enable_thinking": False}).
    extra_body: dict[str, Any] = Field(default_factory=dict)
    # For kind="embedded": extra llama.cpp server options.
    options: dict[str, Any] = Field(default_factory=dict)

    def body_fingerprint(self) -> str:
        """What this spec adds to or takes from every request body, for the provider's identity
        (and so every cache key): "" for a spec that changes nothing (a plain endpoint keeps
        the keys it always had), else "+" and a digest of ``extra_body``, the two
        ``supports_*`` switches and a non-default ``schema_spelling``. A changed ``extra_body``
        value is a changed key."""
        shaping: dict[str, Any] = {
            "extra_body": self.extra_body,
            "json_mode": self.supports_json_mode,
            "logprobs": self.supports_logprobs,
        }
        if self.schema_spelling != "json_schema":
            shaping["schema_spelling"] = self.schema_spelling
        if shaping == {"extra_body": {}, "json_mode": True, "logprobs": True}:
            return ""
        blob = json.dumps(
            shaping, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str
        )
        return "+" + hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        """An http(s) URL with a host: a typo here is a config error, not a network fault."""
        if value is None:
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"'{value}' is not an http(s) URL with a host")
        try:
            parts.port  # noqa: B018 -- raises ValueError for a port out of range or not a number
        except ValueError:
            raise ValueError(f"'{value}' has an invalid port") from None
        return value


class ProviderStatusError(ProviderError):
    """The provider answered with an HTTP error status (the message is the provider's)."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        retry_after: float | None = None,
        request_id: str | None = None,
        code: str | None = None,
        url: str | None = None,
    ) -> None:
        self.status = status
        self.retry_after = retry_after
        self.request_id = request_id
        self.code = code  # the error body's own code, where it gives one
        self.url = url  # where the request went, where the adapter knows it
        suffix = f" (request_id {request_id})" if request_id else ""
        # Its kind is its status's, wherever it surfaces (a span, a hedge race's loser).
        kind = status_decision(status, retry_after, code).kind
        super().__init__(f"HTTP {status}: {message}{suffix}", kind=kind)


# Error codes that no wait cures, whatever their status (OpenAI's 429 for an account out of
# credit): final, not retried as a rate limit.
FINAL_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached"})
# Error codes by which a provider's content inspection refuses a request (DashScope's, in
# either API; Azure OpenAI's and OpenAI's filters): the passage gets no verdict, as an answer
# that does not parse gives none, and asking again would be refused again.
CONTENT_CODES = frozenset(
    {"DataInspectionFailed", "data_inspection_failed", "content_filter", "content_policy_violation"}
)


def status_decision(
    status: int, retry_after: float | None = None, code: str | None = None
) -> RetryDecision:
    """429 -> rate_limit; 408, 409 and 5xx -> server; any other status, or an error code no
    wait cures (:data:`FINAL_CODES`) -> client (final)."""
    if code in FINAL_CODES:
        return RetryDecision(retry=False, kind="client")
    if code in CONTENT_CODES and status < 500:
        return RetryDecision(retry=False, kind="content")
    if status == 429:
        return RetryDecision(retry=True, kind="rate_limit", retry_after=retry_after)
    if status in (408, 409) or status >= 500:
        return RetryDecision(retry=True, kind="server", retry_after=retry_after)
    return RetryDecision(retry=False, kind="client")


ErrorTable = Sequence[tuple[type[BaseException] | tuple[type[BaseException], ...], RetryDecision]]

_COMMON: ErrorTable = (
    (ProviderConfigError, RetryDecision(retry=False, kind="config")),
    # Not the API at all (a web page where the API should be): the same for every request.
    (NotTheApiError, RetryDecision(retry=False, kind="not_api")),
    (TimeoutError, RetryDecision(retry=True, kind="timeout")),
    (ConnectionError, RetryDecision(retry=True, kind="connection")),
    ((ResponseError, json.JSONDecodeError), RetryDecision(retry=True, kind="protocol")),
)


_TITLE = re.compile(rb"<title[^>]*>([^<]{1,120})", re.IGNORECASE)


def read_json_answer(raw: bytes, where: str, what: str, hint: str = "") -> Any:
    """``raw`` read as JSON. A body that is not JSON at all (it does not start as JSON does:
    an HTML page, plain text) raises :class:`NotTheApiError`, named by ``where``, then
    ``hint``; one cut short or otherwise broken raises :class:`ResponseError` (retried: a
    dropped connection can do that). ``what``: what the answer should have been."""
    try:
        return from_json(raw)  # pydantic's JSON parser: half json.loads' CPU on logprobs
    except ValueError as exc:
        if b"\\ud" in raw.lower():  # a lone surrogate escape (half an emoji), which JSON
            with contextlib.suppress(ValueError):  # allows and pydantic's parser refuses
                return json.loads(raw)
        head = raw.lstrip()[:1]
        if raw.lstrip().startswith((b"data:", b"event:")):  # an event stream, not asked for
            raise NotTheApiError(
                f"{where} answered with a stream of server-sent events, which judge does not "
                f"ask for, not {what}: the server (or a proxy before it) streams every answer"
            ) from None
        if head and head not in b'{["' and not head.isdigit() and head not in b"-tfn":
            hint = hint or "does base_url point at the API?"
            raise NotTheApiError(f"{where} answered {_not_json(raw)}, not {what}: {hint}") from None
        raise ResponseError(f"malformed {what.removeprefix('a ')} from {where}: {exc}") from exc


def _not_json(raw: bytes) -> str:
    """What a body that is not JSON looks like, in a few words."""
    if raw.lstrip()[:1] == b"<":
        title = _TITLE.search(raw[:65536])
        named = f" ({title.group(1).decode('utf-8', 'replace').strip()!r})" if title else ""
        return f"with an HTML page{named}"
    text = " ".join(raw[:80].decode("utf-8", "replace").split())
    return f"with text that is not JSON ({text!r})"


def redirect_message(status: int, location: str | None) -> str:
    """What a redirect answer says: judge does not follow one (a POST redirected is a base URL
    that is not the API's own address), so it names where to point instead."""
    where = f"redirected to {location}" if location else "a redirect with no Location"
    return (
        f"{where}: set base_url to the API's own address (a POST is not followed through a "
        f"{status} redirect)"
    )


def classify_by_type(exc: BaseException, table: ErrorTable = ()) -> RetryDecision:
    """An HTTP status decides via :func:`status_decision`; otherwise the first matching
    entry of ``table``, then of the common table (timeouts, dropped connections, bodies
    that are not the protocol's JSON); anything else is "unexpected" and final."""
    if isinstance(exc, ProviderStatusError):
        return status_decision(exc.status, exc.retry_after, exc.code)
    for types, decision in (*table, *_COMMON):
        if isinstance(exc, types):
            return decision
    return RetryDecision(retry=False, kind="unexpected")


# Errors raised before a connection existed, by (module prefix, class name): httpx's and
# httpcore's (openai is built on httpx2), aiohttp's (DashScope), judge's lean HTTP client's
# (providers/lean_http.py). Named, not imported, so checking one needs no SDK.
_UNSENT = frozenset(
    {
        ("judge", "ConnectError"),
        ("judge", "ConnectTimeout"),
        ("httpx", "ConnectError"),
        ("httpx", "ConnectTimeout"),
        ("httpx", "PoolTimeout"),
        ("httpcore", "ConnectError"),
        ("httpcore", "ConnectTimeout"),
        ("httpcore", "PoolTimeout"),
        ("aiohttp", "ClientConnectorError"),
        ("aiohttp", "ConnectionTimeoutError"),
    }
)


def never_sent(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps: the SDKs re-raise transport errors as their own)
    says no connection was made, so the request never reached the server and cannot have
    been billed: refused, timed out connecting, or no pooled connection came free. A timeout
    or a drop after connecting is not: the server may have the request."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionRefusedError | socket.gaierror):
            return True  # refused, or a host name that does not resolve
        # By class and every base: aiohttp's DNS and TLS failures subclass its connector's.
        if any(
            cls.__module__.startswith(module) and cls.__name__ == name  # httpx2 as httpx
            for cls in type(current).__mro__
            for module, name in _UNSENT
        ):
            return True
        current = current.__cause__ or current.__context__
    return False


_PLANNING: ContextVar[bool] = ContextVar("judge_planning", default=False)


@contextlib.contextmanager
def planning_only() -> Iterator[None]:
    """Build providers that will never be called (``--dry-run``, ``judge render``).

    Inside, a missing API key is not an error: the provider gets a placeholder it never sends,
    so a user can estimate cost or inspect prompts before handing over a key. A provider's
    identity (and so every cache key) does not depend on the key.
    """
    token = _PLANNING.set(True)
    try:
        yield
    finally:
        _PLANNING.reset(token)


def read_api_key(spec: ProviderSpec, placeholder: str = "not-needed") -> str:
    """The key from ``spec.api_key_env``; ``placeholder`` when the endpoint needs none.

    Raises ProviderConfigError naming the variable (never a value) when it is unset or empty,
    except under :func:`planning_only`.
    """
    if spec.api_key_env is None:
        return placeholder
    raw = os.environ.get(spec.api_key_env)
    key = (raw or "").strip()
    if not key and _PLANNING.get():
        return "planning-only-never-sent"
    if not key:
        said = "is not set" if raw is None else "is empty"
        raise ProviderConfigError(
            f"environment variable {spec.api_key_env} {said}; the {spec.kind} provider "
            f"at {spec.base_url or 'its default URL'} needs an API key from it"
        )
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in key):
        # A header value with a line break in it is another header (never sent so).
        raise ProviderConfigError(
            f"environment variable {spec.api_key_env} holds white space or a control "
            "character inside the key (a line break, say): no API key does; set it to the key"
        )
    return key


def sampling_fields(params: SamplingParams, spec: ProviderSpec) -> dict[str, Any]:
    """The request fields both chat protocols share (OpenAI body, DashScope parameters).

    Fields left unset are not sent; logprobs and response_format only where the endpoint
    supports them; ``params.omit`` removes fields; extra_body (spec, then request) goes last.
    """
    fields: dict[str, Any] = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_tokens": params.max_tokens,
        "seed": params.seed,
        "stop": list(params.stop) if params.stop else None,
    }
    if spec.supports_logprobs and params.logprobs:
        fields["logprobs"] = True
        fields["top_logprobs"] = params.top_logprobs
    if spec.supports_json_mode:
        fields["response_format"] = response_format(params, spec.schema_spelling)
    sent = {k: v for k, v in fields.items() if v is not None and k not in params.omit}
    return {**sent, **spec.extra_body, **params.extra_body}


def response_format(
    params: SamplingParams, spelling: Literal["json_schema", "json_object"] = "json_schema"
) -> dict[str, Any] | None:
    """The ``response_format`` request field for ``params`` (None: plain text), as both the
    OpenAI and the DashScope protocols spell it, or (``spelling="json_object"``) as
    llama-cpp-python's server takes a schema.

    ``json_schema`` takes a bare JSON schema or OpenAI's ``{"name", "schema"}`` wrapper;
    without a schema it degrades to ``json_object``.
    """
    if params.response_format == "json_schema" and params.json_schema is not None:
        schema = params.json_schema
        named = {"name", "schema"} <= schema.keys()
        if spelling == "json_object":
            return {"type": "json_object", "schema": schema["schema"] if named else schema}
        return {
            "type": "json_schema",
            "json_schema": schema if named else {"name": "verdict", "schema": schema},
        }
    if params.response_format is not None:
        return {"type": "json_object"}
    return None
