"""The embedded reranker: all-MiniLM-L6-v2 in this process, offline, as a RerankProvider.

A bi-encoder: the query and each passage become unit vectors (:mod:`.minilm`) and a
passage's score is their cosine, clipped at 0::

    score = min(max(cos(query, passage), 0), 1)

Why this mapping, when the scores are read as P(relevant) (soft metrics, ``rerank_*``, the
0.5 cut that ``judge calibrate`` starts from): MiniLM's cosines for a query and a passage
lie in about [-0.1, 0.9], and on the TREC DL 2019 sample (gold = grade >= 2) the share of
relevant passages rises with the clipped cosine about as the score says: 12% at 0-0.1, 45%
at 0.5-0.6, 76% at 0.7-0.8, 87% at 0.8-0.9 (Brier score 0.21). The cut that agrees best with
human labels sits at a cosine of about 0.5-0.58, so the uncalibrated 0.5 is already close.
``(cos + 1) / 2`` keeps the order (same AUC, 0.736) but puts every passage at 0.45 or above
(Brier 0.30; at 0.5 it calls 98% relevant). A logistic curve fitted to that sample would
fit it better, but would also learn its 46% share of relevant passages, which comes from how
it was drawn (three passages per grade per query), not from any user's data; ``judge
calibrate`` fits the cut to a user's own labels instead. A negative cosine means
"unrelated", hence 0.

Known weakness: a bi-encoder ignores instructions injected into a passage but is fooled by
query stuffing. Irrelevant passages averaged a cosine of 0.29, 0.30 with an instruction
appended, 0.59 with the query's words stuffed in: above the best cut.

The model loads lazily on the first call (fetched and verified first unless ``fetch = false``)
and once; the forward pass runs in a worker thread so the event loop stays free, one request
at a time (two cores gain nothing from two at once). The query is encoded once per request.
Usage counts every word piece fed to the model as prompt tokens. A passage longer than
:data:`~.minilm.MAX_TOKENS` word pieces is cut: that is logged (a warning the first time, then
per request at info) and counted in :attr:`EmbeddedRerankProvider.stats`.

The forward pass uses one BLAS thread unless ``threads`` says otherwise. OpenBLAS threads
spin while they wait: on two cores, one of them busy with something else (a judge model, CI,
another run), two threads made 5-8 passages/s where one made 20-36; on two idle cores two
made 47-57 where one made 33-37. Sharing is the common case here, so 1 is the default.

Options (``[rerank] options``): ``model`` (a sentence-transformers BERT folder with mean
pooling, instead of the pinned one), ``fetch`` (default true), ``batch_size`` (default 32),
``threads`` (BLAS threads for the forward pass, default 1; 0: the BLAS library's own choice).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from judge.errors import ModelError, ProviderConfigError
from judge.providers.base import (
    ErrorTable,
    ProviderSpec,
    RerankProvider,
    RerankRequest,
    RerankResult,
    RetryDecision,
    classify_by_type,
)
from judge.providers.embedded.minilm import BATCH_SIZE, MAX_TOKENS, Encoded, MiniLM
from judge.providers.embedded.weights import (
    MINILM,
    ModelSpec,
    ensure_model,
    file_sha256,
    is_verified,
    model_path,
)
from judge.schema import Usage

__all__ = ["EmbeddedRerankProvider", "Encoder", "RerankStats", "make_embedded_rerank_provider"]

logger = logging.getLogger(__name__)

# Part of the identity: a change of the score mapping must change every cache key.
MAPPING = "cos-clip0"
_OPTIONS = frozenset({"model", "fetch", "batch_size", "threads"})
_ERRORS: ErrorTable = (
    (ModelError, RetryDecision(retry=False, kind="model")),
    # Local work, not a network hop: the same passages take as long again, so a retry
    # would spend the CPU for the same outcome.
    (TimeoutError, RetryDecision(retry=False, kind="timeout")),
)


class Encoder(Protocol):
    """What the provider needs of an encoder (:class:`~.minilm.MiniLM`, or a test's own)."""

    def encode(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = ...,
        cancel: threading.Event | None = None,
    ) -> Encoded: ...


@dataclass
class RerankStats:
    """What the reranker has done so far (mutated on the event loop only)."""

    requests: int = 0
    passages: int = 0
    truncated: int = 0  # passages cut at max_tokens word pieces
    tokens: int = 0


@dataclass(frozen=True)
class _Scored:
    cosines: np.ndarray
    tokens: int
    truncated: int
    query_truncated: bool


def _require_packages() -> None:
    needed = ("tokenizers", "safetensors", "threadpoolctl")
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelError(
            f"the embedded reranker needs {' and '.join(missing)}: pip install 'judge[embedded]'"
        )


def blas_threads(threads: int) -> contextlib.AbstractContextManager[object]:
    """BLAS at ``threads`` threads inside the block (0: one per core this process may use,
    what OpenBLAS starts with, set outright: the ``judge`` command starts it with one)."""
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

    if threads == 0:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
        threads = threads or os.cpu_count() or 1
    limits: contextlib.AbstractContextManager[object] = threadpool_limits(
        limits=threads, user_api="blas"
    )
    return limits


def _score(
    encoder: Encoder, request: RerankRequest, batch: int, threads: int, stop: threading.Event
) -> _Scored:
    """Cosines of the documents with the query (runs in a worker thread)."""
    with blas_threads(threads):
        q = encoder.encode([request.query], cancel=stop)
        d = encoder.encode(request.documents, batch_size=batch, cancel=stop)
    return _Scored(d.vectors @ q.vectors[0], q.tokens + d.tokens, d.truncated, q.truncated > 0)


def scores_from_cosines(cosines: np.ndarray, top_n: int | None) -> tuple[float, ...]:
    """``min(max(cos, 0), 1)`` per document (see the module docstring); outside the ``top_n``
    best, 0.0, as a Cohere-style reranker leaves them unscored."""
    scores = np.clip(cosines.astype(np.float64), 0.0, 1.0)
    if top_n is not None and top_n < len(scores):
        keep = np.argsort(-scores, kind="stable")[:top_n]
        kept = np.zeros_like(scores)
        kept[keep] = scores[keep]
        scores = kept
    return tuple(float(s) for s in scores)


class EmbeddedRerankProvider:
    """A RerankProvider computing all-MiniLM-L6-v2 (or another folder) in-process."""

    def __init__(
        self,
        folder: Path,
        *,
        weights_sha256: str,
        tokenizer_sha256: str,
        pinned: ModelSpec | None = None,
        fetch: bool = False,
        batch_size: int = BATCH_SIZE,
        threads: int = 1,
        name: str = "all-MiniLM-L6-v2",
        encoder: Encoder | None = None,
    ) -> None:
        """``pinned``: the spec the folder must verify against (fetched when ``fetch``), None
        for a user's own folder. ``encoder`` is an injection seam: given, nothing is loaded."""
        self._folder = folder
        self._pinned = pinned
        self._fetch = fetch
        self._batch = batch_size
        self._threads = threads
        self._name = name
        self._identity = (
            f"embedded-rerank:{weights_sha256}:{tokenizer_sha256[:16]}:{MAX_TOKENS}:{MAPPING}"
        )
        self._given = encoder
        self._loading: asyncio.Future[Encoder] | None = None
        self._busy = asyncio.Lock()
        self._stats = RerankStats()

    @property
    def identity(self) -> str:
        """``embedded-rerank:<weights sha256>:<tokenizer sha256[:16]>:<max tokens>:<mapping>``."""
        return self._identity

    @property
    def stats(self) -> RerankStats:
        return self._stats

    def _load(self) -> Encoder:
        _require_packages()
        if self._pinned is not None:
            weights = self._folder / Path(self._pinned.filename).name
            if self._fetch:
                ensure_model(spec=self._pinned, dest=weights)
            elif not is_verified(weights, self._pinned):
                raise ModelError(
                    f"the reranker model is not fetched and verified in {self._folder}: "
                    "run `judge model fetch --model rerank`"
                )
        logger.info("loading the embedded reranker from %s", self._folder)
        return MiniLM(self._folder)

    async def _encoder(self) -> Encoder:
        """The encoder, loaded once by a shared task that a cancelled caller does not stop."""
        if self._given is not None:
            return self._given
        if self._loading is None or self._loading.cancelled():  # cancelled: its loop ended
            self._loading = asyncio.ensure_future(asyncio.to_thread(self._load))
            # Retrieved here too, so a load no caller waits for any more is not reported
            # as "never retrieved"; every caller still gets the error.
            self._loading.add_done_callback(lambda f: f.cancelled() or f.exception())
        return await asyncio.shield(self._loading)

    async def rerank(self, request: RerankRequest, *, timeout: float | None) -> RerankResult:
        """Scores in [0, 1] in input order; ``timeout`` bounds the forward pass itself."""
        if not request.documents:
            return RerankResult(scores=(), model=self._name)
        encoder = await self._encoder()
        stop = threading.Event()
        try:
            async with self._busy, asyncio.timeout(timeout):
                scored = await asyncio.to_thread(
                    _score, encoder, request, self._batch, self._threads, stop
                )
        finally:
            stop.set()  # a pass whose caller left stops at its next batch
        self._record(request, scored)
        return RerankResult(
            scores=scores_from_cosines(scored.cosines, request.top_n),
            model=self._name,
            usage=Usage(prompt_tokens=scored.tokens),
        )

    def _record(self, request: RerankRequest, scored: _Scored) -> None:
        stats = self._stats
        first = stats.truncated == 0
        stats.requests += 1
        stats.passages += len(request.documents)
        stats.truncated += scored.truncated
        stats.tokens += scored.tokens
        if scored.truncated:
            logger.log(
                logging.WARNING if first else logging.INFO,
                "embedded reranker: %d of %d passages cut at %d word pieces; their scores "
                "see only the beginning",
                scored.truncated,
                len(request.documents),
                MAX_TOKENS,
            )
        if scored.query_truncated:
            logger.warning("embedded reranker: the query was cut at %d word pieces", MAX_TOKENS)

    def classify(self, exc: BaseException) -> RetryDecision:
        """Model errors and timeouts are final (see ``_ERRORS``); the rest as usual."""
        return classify_by_type(exc, _ERRORS)

    async def aclose(self) -> None:
        """Drops the model (nothing runs in the background); reports cut passages once more."""
        self._loading = None
        if self._stats.truncated:
            logger.warning(
                "embedded reranker: %d of %d passages were cut at %d word pieces",
                self._stats.truncated,
                self._stats.passages,
                MAX_TOKENS,
            )


def refuse_unknown(spec: ProviderSpec, kind: str, known: frozenset[str]) -> None:
    """One ProviderConfigError naming every option an in-process reranker ``kind`` does not
    take, and a base_url or extra_body given to it (nothing is sent anywhere)."""
    unknown = sorted(set(spec.options) - known)
    if unknown or spec.base_url or spec.extra_body:
        problems = [f"unknown option(s) {', '.join(unknown)}"] if unknown else []
        problems += ["base_url does not apply (it runs in-process)"] if spec.base_url else []
        problems += ["extra_body does not apply (nothing is sent)"] if spec.extra_body else []
        raise ProviderConfigError(
            f"{kind}: {'; '.join(problems)}; options are {', '.join(sorted(known))}"
        )


def check_options(spec: ProviderSpec) -> dict[str, Any]:
    """The options checked (ProviderConfigError naming what is wrong), defaults filled in."""
    refuse_unknown(spec, "embedded-rerank", _OPTIONS)
    checked: dict[str, Any] = {}
    for name, default, low in (("batch_size", BATCH_SIZE, 1), ("threads", 1, 0)):
        value = spec.options.get(name, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ProviderConfigError(
                f"embedded-rerank: {name} must be an integer >= {low}, not {value!r}"
            )
        checked[name] = value
    fetch = spec.options.get("fetch", True)
    if not isinstance(fetch, bool):
        raise ProviderConfigError(f"embedded-rerank: fetch must be true or false, not {fetch!r}")
    return {**checked, "fetch": fetch}


def make_embedded_rerank_provider(spec: ProviderSpec) -> RerankProvider:
    """The embedded reranker (registry entry for kind="embedded-rerank").

    Without ``options.model`` it is the pinned all-MiniLM-L6-v2, its identity taken from the
    pins; with one, that folder, its identity from the files' own sha256.
    """
    options = check_options(spec)
    override = spec.options.get("model")
    if not override:
        tokenizer = next(p for p in MINILM.companions if p.name == "tokenizer.json")
        return EmbeddedRerankProvider(
            model_path(MINILM).parent,
            weights_sha256=MINILM.sha256,
            tokenizer_sha256=tokenizer.sha256,
            pinned=MINILM,
            fetch=options["fetch"],
            batch_size=options["batch_size"],
            threads=options["threads"],
        )
    folder = Path(str(override)).expanduser()
    weights, tokenizer_file = folder / "model.safetensors", folder / "tokenizer.json"
    for needed in (weights, tokenizer_file):
        if not needed.is_file():
            raise ModelError(f"embedded reranker: {needed} not found")
    return EmbeddedRerankProvider(
        folder,
        weights_sha256=file_sha256(weights),
        tokenizer_sha256=file_sha256(tokenizer_file),
        batch_size=options["batch_size"],
        threads=options["threads"],
        name=folder.name,
    )
