"""OpenAI chat completions through the ``openai`` SDK: OpenAI, DashScope compatible mode, vLLM,
Ollama, llama.cpp server, LM Studio — any endpoint is only a ``base_url``.

The SDK's own retries are off (``max_retries=0``): the runner is the one retry authority,
so a complete() is exactly one HTTP request. Features an endpoint lacks are left out of the
request (``supports_json_mode`` / ``supports_logprobs`` in the spec) rather than failing it.

The SDK is imported, and its client made, on the first request: importing ``openai`` takes
longer than a fully cached run of a hundred queries, which never sends one. The API key is
read when the provider is made, so a missing one still stops a run before anything else.
"""

from __future__ import annotations

import json
from functools import cache
from typing import TYPE_CHECKING, Any, cast

from judge.errors import ResponseError
from judge.providers.base import (
    ChatRequest,
    Completion,
    ErrorTable,
    ProviderSpec,
    RetryDecision,
    classify_by_type,
    parse_retry_after,
    read_api_key,
    sampling_fields,
    status_decision,
)

if TYPE_CHECKING:
    import httpx2

DEFAULT_BASE_URL = "https://api.openai.com/v1"


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


def to_completion(raw: bytes, model: str) -> Completion:
    """Our Completion from a chat completion's JSON body, read and checked here: the SDK's
    response objects cost more than the rest of a call (most of it for the logprobs)."""
    try:
        data = json.loads(raw)
        choice = data["choices"][0]
        logprobs = choice.get("logprobs") or {}
        usage = data.get("usage") or {}
        return Completion.model_validate(
            {
                "text": choice["message"].get("content") or "",
                "model": data.get("model") or model,
                "finish_reason": choice.get("finish_reason"),
                "logprobs": _tokens(logprobs["content"]) if logprobs.get("content") else None,
                "usage": {
                    "prompt_tokens": usage.get("prompt_tokens") or 0,
                    "completion_tokens": usage.get("completion_tokens") or 0,
                },
            }
        )
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
        raise ResponseError(f"malformed chat completion from the server: {exc}") from exc


class OpenAICompatProvider:
    """A ChatProvider for any OpenAI-compatible ``/chat/completions`` endpoint.

    ``http_client`` (an ``httpx2.AsyncClient``, as openai 3.x is built on httpx2) is an
    injection seam; a client passed in is not closed by :meth:`aclose`.
    """

    def __init__(
        self, spec: ProviderSpec, *, http_client: httpx2.AsyncClient | None = None
    ) -> None:
        self._spec = spec
        self._base_url = (spec.base_url or DEFAULT_BASE_URL).rstrip("/")
        self._owns_client = http_client is None
        self._http_client = http_client
        self._api_key = read_api_key(spec)
        self._identity = f"openai:{self._base_url}{spec.body_fingerprint()}"  # once: every key
        self._sdk: Any = None  # openai.AsyncOpenAI, made on the first request

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

    def request_body(self, request: ChatRequest) -> dict[str, Any]:
        """The JSON fields besides model and messages that ``request`` sends to this endpoint."""
        return sampling_fields(request.params, self._spec)

    async def complete(self, request: ChatRequest, *, timeout: float | None) -> Completion:
        """One chat completion: one HTTP request, no retries; errors go to :meth:`classify`."""
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        body = {"model": request.model, "messages": messages, **self.request_body(request)}
        # The SDK's documented way to POST a body we built ourselves: the same request as
        # chat.completions.create, without re-walking every field through its type
        # transforms, and the raw answer back (its error statuses still raised by the SDK).
        import httpx2

        options: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        response = await self._client.post(
            "/chat/completions", body=body, cast_to=httpx2.Response, options=cast(Any, options)
        )
        return to_completion(await response.aread(), request.model)

    def classify(self, exc: BaseException) -> RetryDecision:
        """Retry rate limits (honouring Retry-After), 5xx/408/409, timeouts, dropped
        connections and bodies that are not a chat completion; never other 4xx."""
        import openai

        if isinstance(exc, openai.APIStatusError):
            headers = exc.response.headers
            retry_after = parse_retry_after(headers.get("retry-after"))
            millis = parse_retry_after(headers.get("retry-after-ms"))
            if retry_after is None and millis is not None:
                retry_after = millis / 1000
            return status_decision(exc.status_code, retry_after)
        return classify_by_type(exc, _errors())

    async def aclose(self) -> None:
        if self._owns_client and self._sdk is not None:
            await self._sdk.close()
