"""Cohere-compatible rerank over plain HTTP: Cohere, Jina, vLLM, llama.cpp server, TEI.

::

    POST <endpoint>  {"model", "query", "documents": [...], "top_n"}
      -> {"results": [{"index", "relevance_score"}, ...]}   Cohere, Jina, vLLM, llama.cpp
      -> [{"index", "score"}, ...]                          TEI's bare list

The endpoint is ``base_url + "/v1/rerank"``; ``base_url + "/rerank"`` when the base URL already
ends in ``/v1``; the base URL itself when it already ends in ``/rerank`` (TEI serves ``/rerank``).
Answers come back best first; :func:`~judge.providers.base.scores_in_input_order` puts them back
in input order.
"""

from __future__ import annotations

from typing import Any

import httpx

from judge.errors import ProviderConfigError, ResponseError
from judge.providers.base import (
    ErrorTable,
    ProviderSpec,
    ProviderStatusError,
    RerankRequest,
    RerankResult,
    RetryDecision,
    classify_by_type,
    parse_retry_after,
    read_api_key,
    read_json_answer,
    read_usage,
    redirect_message,
    rerank_fields,
    rerank_pair,
    scores_in_input_order,
)

_ERRORS: ErrorTable = (
    (httpx.TimeoutException, RetryDecision(retry=True, kind="timeout")),
    (httpx.TransportError, RetryDecision(retry=True, kind="connection")),
    (httpx.DecodingError, RetryDecision(retry=True, kind="protocol")),
)


def rerank_endpoint(base_url: str) -> str:
    """Where to POST: see the module docstring."""
    base = base_url.rstrip("/")
    if base.endswith("/rerank"):
        return base
    return f"{base}/rerank" if base.endswith("/v1") else f"{base}/v1/rerank"


def _pairs(data: Any) -> list[tuple[int, float]]:
    """(index, score) pairs from either answer shape; ResponseError for anything else."""
    items = data.get("results") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ResponseError("rerank answer has neither a 'results' list nor a bare list")
    try:
        return [
            rerank_pair(item["index"], item.get("relevance_score", item.get("score")))
            for item in items
        ]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ResponseError(f"rerank answer has a malformed result: {exc!r}") from exc


# Where an error body says what went wrong (Cohere, OpenAI, FastAPI shapes).
_ERROR_KEYS = frozenset({"error", "message", "detail"})


def _error_message(response: httpx.Response, key: str) -> str:
    """The server's own error text (Cohere, OpenAI, FastAPI shapes), without our key."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        found = data.get("message") or data.get("detail") or error
        text = str(found.get("message", found) if isinstance(found, dict) else found)
    else:
        text = response.text[:300]
    return text.replace(key, "***") if key else text


class HTTPRerankProvider:
    """A RerankProvider for Cohere-compatible ``/rerank`` endpoints.

    ``http_client`` (an ``httpx.AsyncClient``) is an injection seam; a client passed in is
    not closed by :meth:`aclose`. ``spec.extra_body`` fields are added to every request.
    """

    def __init__(self, spec: ProviderSpec, *, http_client: httpx.AsyncClient | None = None) -> None:
        if not spec.base_url:
            raise ProviderConfigError(
                "a rerank provider needs base_url (e.g. https://api.cohere.com)"
            )
        self._spec = spec
        self._endpoint = rerank_endpoint(spec.base_url)
        self._key = read_api_key(spec, placeholder="")
        self._owns_client = http_client is None
        self._client = http_client or httpx.AsyncClient(timeout=120.0)

    @property
    def identity(self) -> str:
        return f"rerank:{self._endpoint}{self._spec.body_fingerprint()}"

    async def rerank(self, request: RerankRequest, *, timeout: float | None) -> RerankResult:
        """One rerank call (one HTTP request, no retries): scores in input order."""
        if not request.documents:
            return RerankResult(scores=(), model=request.model)
        fields = rerank_fields(request)
        body = {**fields, **self._spec.extra_body}
        headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
        response = await self._client.post(
            self._endpoint,
            json=body,
            headers=headers,
            timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
        )
        if response.status_code >= 300:  # a redirect too: named, not followed (base.py)
            redirected = response.status_code < 400
            location = response.headers.get("location")
            raise ProviderStatusError(
                redirect_message(response.status_code, location)
                if redirected
                else _error_message(response, self._key),
                status=response.status_code,
                retry_after=parse_retry_after(response.headers.get("retry-after")),
                request_id=response.headers.get("x-request-id"),
            )
        data = read_json_answer(response.content, self._endpoint, "a rerank answer")
        if isinstance(data, dict) and "results" not in data and _ERROR_KEYS & data.keys():
            # An error object with a success status: the server's own words, final.
            said = _error_message(response, self._key)
            raise ProviderStatusError(f"an error in a 200 answer: {said}", status=200)
        counts = data.get("usage") if isinstance(data, dict) else None
        key = "total_tokens" if isinstance(counts, dict) and "total_tokens" in counts else None
        usage, known = read_usage(counts, key or "prompt_tokens")
        return RerankResult(
            scores=scores_in_input_order(_pairs(data), len(request.documents), fields["top_n"]),
            model=(data.get("model") if isinstance(data, dict) else None) or request.model,
            usage=usage,
            usage_known=known,
        )

    def classify(self, exc: BaseException) -> RetryDecision:
        """HTTP statuses as usual (429 with Retry-After); timeouts, transport errors and
        bodies that are not a rerank answer are retried."""
        return classify_by_type(exc, _ERRORS)

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()
