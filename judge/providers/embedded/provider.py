"""The embedded judge as a ChatProvider: a local llama.cpp server we start and stop.

The server starts lazily on the first ``complete()`` (fetching and verifying the pinned model
when needed) and every call is delegated to ``OpenAICompatProvider`` pointed at it; the
server's lifecycle (no orphans, ever) lives in :mod:`judge.providers.embedded.server`. The
identity is the model's sha256 plus the spec's body fingerprint, so cache keys do not depend on
the port, which changes every run, but do follow what every request carries. The registry
(:mod:`judge.providers`) hands this provider a spec whose ``extra_body`` switches
llama-cpp-python's repetition penalty (1.1 by default) off; a spec built by hand sends what it
says.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from judge.errors import ModelError
from judge.providers.base import ChatProvider, ChatRequest, Completion, ProviderSpec, RetryDecision
from judge.providers.embedded.server import EmbeddedServer, require_llama_cpp
from judge.providers.embedded.weights import MODEL, ensure_model, file_sha256, model_path

__all__ = ["EmbeddedChatProvider", "EmbeddedServer", "make_embedded_chat_provider"]


class EmbeddedChatProvider:
    """A ChatProvider that owns an EmbeddedServer, started on first use, stopped by aclose()."""

    def __init__(self, spec: ProviderSpec, model_path: Path, sha256: str, fetch: bool) -> None:
        self._spec = spec
        self._model_path = model_path
        self._fetch = fetch
        self._identity = f"embedded:{sha256}{spec.body_fingerprint()}"
        self._lock = asyncio.Lock()
        self._server: EmbeddedServer | None = None
        self._inner: ChatProvider | None = None

    @property
    def identity(self) -> str:
        """``embedded:<model sha256>`` (+ body fingerprint): independent of the port, which
        changes every run."""
        return self._identity

    @property
    def spec(self) -> ProviderSpec:
        """The spec every request is built from (``extra_body`` as sent to the server)."""
        return self._spec

    @property
    def server(self) -> EmbeddedServer | None:
        return self._server

    async def _ensure_started(self) -> ChatProvider:
        async with self._lock:
            if self._inner is not None:
                return self._inner
            require_llama_cpp()
            if self._fetch:
                await asyncio.to_thread(ensure_model, dest=self._model_path)
            server = EmbeddedServer(self._model_path, self._spec.options)
            await server.astart()
            self._server = server
            try:
                from judge.providers.openai_compat import OpenAICompatProvider

                inner_spec = self._spec.model_copy(
                    update={"kind": "openai", "base_url": server.base_url, "api_key_env": None}
                )
                self._inner = OpenAICompatProvider(inner_spec)
            except BaseException:
                await self.aclose()
                raise
            return self._inner

    async def complete(self, request: ChatRequest, *, timeout: float | None) -> Completion:
        inner = await self._ensure_started()
        try:
            return await inner.complete(request, timeout=timeout)
        except Exception as exc:
            # A dead server would otherwise look like a retryable connection error forever.
            server = self._server
            if server is None or inner.classify(exc).kind != "connection":
                raise
            if (code := await server.wait_exited(1.0)) is not None:
                raise ModelError(
                    f"the embedded server died (exit code {code}):\n{server.log_tail()}"
                ) from exc
            raise

    def classify(self, exc: BaseException) -> RetryDecision:
        if isinstance(exc, ModelError):
            return RetryDecision(retry=False, kind="model")
        if self._inner is not None:
            return self._inner.classify(exc)
        return RetryDecision(retry=False, kind="client")

    async def aclose(self) -> None:
        inner, self._inner = self._inner, None
        server, self._server = self._server, None
        try:
            if inner is not None:
                await inner.aclose()
        finally:
            if server is not None:
                server.stop()


def make_embedded_chat_provider(spec: ProviderSpec) -> ChatProvider:
    """The embedded judge as a ChatProvider (registry entry for kind="embedded").

    Options: ``model`` (path to another GGUF; default: the pinned model, fetched and verified
    on first use unless ``fetch = false``), ``n_ctx``, ``n_threads``, ``startup_timeout`` and
    any other llama.cpp server setting.
    """
    override = spec.options.get("model")
    if override:
        path = Path(str(override)).expanduser()
        if not path.is_file():
            raise ModelError(f"embedded model file not found: {path}")
        return EmbeddedChatProvider(spec, path, file_sha256(path), fetch=False)
    fetch = bool(spec.options.get("fetch", True))
    return EmbeddedChatProvider(spec, model_path(), MODEL.sha256, fetch=fetch)
