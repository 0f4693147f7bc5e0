"""OpenAI chat completions through the ``openai`` SDK: OpenAI, DashScope compatible mode, vLLM,
Ollama, llama.cpp server, LM Studio — any endpoint is only a ``base_url``.

The SDK's own retries are off (``max_retries=0``): the runner is the one retry authority,
so a complete() is exactly one HTTP request. Features an endpoint lacks are left out of the
request (``supports_json_mode`` / ``supports_logprobs`` in the spec) rather than failing it.
"""

from __future__ import annotations

from typing import Any, cast

import httpx2
import openai
from openai.types.chat import ChatCompletion

from judge.errors import ResponseError
from judge.providers.base import (
    ChatRequest,
    Completion,
    ErrorTable,
    ProviderSpec,
    RetryDecision,
    TokenLogprob,
    TopLogprob,
    classify_by_type,
    parse_retry_after,
    read_api_key,
    sampling_fields,
    status_decision,
)
from judge.schema import Usage

DEFAULT_BASE_URL = "https://api.openai.com/v1"

_ERRORS: ErrorTable = (
    # APITimeoutError subclasses APIConnectionError, so it comes first.
    (openai.APITimeoutError, RetryDecision(retry=True, kind="timeout")),
    (
        (openai.APIConnectionError, httpx2.TransportError),
        RetryDecision(retry=True, kind="connection"),
    ),
    (openai.APIResponseValidationError, RetryDecision(retry=True, kind="protocol")),
)


def _token_logprobs(content: Any) -> tuple[TokenLogprob, ...]:
    return tuple(
        TokenLogprob(
            token=item.token,
            logprob=item.logprob,
            top=tuple(
                TopLogprob(token=t.token, logprob=t.logprob) for t in item.top_logprobs or ()
            ),
        )
        for item in content
    )


def to_completion(response: ChatCompletion, model: str) -> Completion:
    """Our Completion from the SDK's object (built without validation, so checked here)."""
    try:
        choice = response.choices[0]
        logprobs = choice.logprobs
        usage = response.usage
        return Completion(
            text=choice.message.content or "",
            model=response.model or model,
            finish_reason=choice.finish_reason,
            logprobs=_token_logprobs(logprobs.content) if logprobs and logprobs.content else None,
            usage=Usage(
                prompt_tokens=(usage.prompt_tokens or 0) if usage else 0,
                completion_tokens=(usage.completion_tokens or 0) if usage else 0,
            ),
        )
    except (AttributeError, IndexError, TypeError, ValueError) as exc:
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
        self._client = openai.AsyncOpenAI(
            base_url=self._base_url,
            api_key=read_api_key(spec),
            max_retries=0,
            http_client=http_client,
        )

    @property
    def identity(self) -> str:
        """``openai:<base URL>``, plus the spec's body fingerprint when it adds fields (the
        local presets' neutral sampling, a config's ``extra_body``): they change the answer."""
        return f"openai:{self._base_url}{self._spec.body_fingerprint()}"

    def request_body(self, request: ChatRequest) -> dict[str, Any]:
        """The JSON fields besides model and messages that ``request`` sends to this endpoint."""
        return sampling_fields(request.params, self._spec)

    async def complete(self, request: ChatRequest, *, timeout: float | None) -> Completion:
        """One chat completion: one HTTP request, no retries; errors go to :meth:`classify`."""
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        body = {"model": request.model, "messages": messages, **self.request_body(request)}
        # The SDK's documented way to POST a body we built ourselves: the same request as
        # chat.completions.create, without re-walking every field through its type
        # transforms (a third of our CPU per call at high throughput).
        options: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        response = await self._client.post(
            "/chat/completions", body=body, cast_to=ChatCompletion, options=cast(Any, options)
        )
        if not isinstance(response, ChatCompletion):
            raise ResponseError(f"expected a chat completion, got {type(response).__name__}")
        return to_completion(response, request.model)

    def classify(self, exc: BaseException) -> RetryDecision:
        """Retry rate limits (honouring Retry-After), 5xx/408/409, timeouts, dropped
        connections and bodies that are not a chat completion; never other 4xx."""
        if isinstance(exc, openai.APIStatusError):
            headers = exc.response.headers
            retry_after = parse_retry_after(headers.get("retry-after"))
            millis = parse_retry_after(headers.get("retry-after-ms"))
            if retry_after is None and millis is not None:
                retry_after = millis / 1000
            return status_decision(exc.status_code, retry_after)
        return classify_by_type(exc, _ERRORS)

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.close()
