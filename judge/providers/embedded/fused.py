"""The embedded fused reranker: calibrated signals, a cross-encoder for English, e5 for Chinese.

Each passage is scored by the logistic model of its language (:data:`FUSIONS`)::

    z_i = (x_i - mean_i) / sd_i                      x_i: a signal (a logit or a cosine)
    P(relevant) = 1 / (1 + exp(-(intercept + sum_i w_i z_i)))

- ``en`` (any passage that is not Chinese), option ``english``: by default ``"agree"``, two
  models that must agree (:class:`Agreement`: the lower of their probabilities), the logit of
  ms-marco-MiniLM-L-12-v2, a cross-encoder that reads the query and the passage together
  (:mod:`.cross`), and all-MiniLM-L6-v2's cosine; ``"cross"`` or ``"minilm"``, one of them
  alone; ``"minilm+e5"``, MiniLM's and multilingual-e5-small's cosines fused. The cross-encoder
  judges clean passages best and is the easiest to buy by echo, MiniLM the reverse; agreeing,
  they are bought less often than either (docs/JUDGING.md).
- ``zh`` (the query or the passage mostly Han characters): e5's cosine; neither MiniLM knows
  Chinese (held-out AUC 0.52 on the Chinese set below, e5's 0.88).

Where the numbers come from (bench/bench_signals.py, figures with queries held out): the
English models are fitted on the TREC DL 2019 sample (475 pairs, 43 queries; relevant =
grade >= 2), the ``zh`` model on bench/data/zh_relevance.jsonl (80 pairs, 20 queries, written
and labelled for this purpose, not from any hidden set), by L2-penalised logistic regression
(penalty 10, fixed in advance) on standardised signals. The ranking is the signal's (same
AUC); what the fit adds is the mapping to a probability. Held out by query, the
cross-encoder's AUC is 0.782 and its kappa at the 0.5 cut 0.412, against MiniLM's 0.736 and
0.371 (0.324 for the clipped cosine of :mod:`.rerank`); end to end, with the echo checks, the
agreement of the two reaches 0.746 and 0.371 (bench/bench_quality.py). The intercepts carry
those sets' shares of relevant passages (46% and 40%, set by how the pairs were drawn): ``judge
calibrate`` fits the cut to a user's own labels. A change of coefficients changes
:attr:`FusedRerankProvider.identity`, so no cached score outlives it.

Each model loads lazily, once, on first need (a Chinese-only run never loads an English one,
an English one never loads e5 unless ``english = "minilm+e5"``); scoring runs in a worker
thread, one request at a time, the models of a fusion side by side (one thread each).
Deterministic: the same request gives the same scores (a passage alone or in a batch: the
cross-encoder's exactly, the cosines up to float rounding, ~1e-6).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

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
from judge.providers.embedded import e5 as e5_module
from judge.providers.embedded import language_of
from judge.providers.embedded.cross import CrossEncoder
from judge.providers.embedded.minilm import MiniLM
from judge.providers.embedded.rerank import blas_threads, refuse_unknown
from judge.providers.embedded.weights import (
    CROSS,
    MINILM,
    MODELS,
    ModelSpec,
    ensure_model,
    is_verified,
    model_path,
)
from judge.schema import Usage

__all__ = [
    "FUSIONS",
    "FusedRerankProvider",
    "Fusion",
    "language_of",
    "make_fused_rerank_provider",
]

Floats = npt.NDArray[np.float64]

_OPTIONS = frozenset({"fetch", "threads", "language", "english"})
_LANGUAGES = ("auto", "en", "zh")
_ERRORS: ErrorTable = (
    (ModelError, RetryDecision(retry=False, kind="model")),
    (TimeoutError, RetryDecision(retry=False, kind="timeout")),
)


@dataclass(frozen=True)
class Fusion:
    """One language's logistic model over standardised signals."""

    signals: tuple[str, ...]  # "cross", "minilm", "e5"
    mean: tuple[float, ...]
    sd: tuple[float, ...]
    weights: tuple[float, ...]
    intercept: float

    def probability(self, columns: dict[str, Floats]) -> Floats:
        total = np.full(len(next(iter(columns.values()))), self.intercept)
        for name, m, s, w in zip(self.signals, self.mean, self.sd, self.weights, strict=True):
            total += w * (columns[name] - m) / s
        return np.asarray(1.0 / (1.0 + np.exp(-total)))


@dataclass(frozen=True)
class Agreement:
    """Models that must agree: a passage's probability is the lowest of theirs.

    A passage that buys one model's score by echoing the query must buy the other's too: the
    cross-encoder moves most under echo, MiniLM least (docs/JUDGING.md)."""

    parts: tuple[Fusion, ...]

    @property
    def signals(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s for part in self.parts for s in part.signals))

    def probability(self, columns: dict[str, Floats]) -> Floats:
        return np.asarray(np.minimum.reduce([part.probability(columns) for part in self.parts]))


# Fitted by bench/bench_signals.py on all pairs of each set (see the module docstring).
# English by the cross-encoder's logit (``english = "cross"``; about 50 passages/s on one
# core; held-out AUC 0.782, kappa at 0.5 0.412).
_EN_CROSS = Fusion(
    signals=("cross",),
    mean=(0.47954,),
    sd=(6.44078,),
    weights=(1.0022,),
    intercept=-0.2203,
)
# English by MiniLM's cosine (``english = "minilm"``; 26-34 passages/s on 2 cores).
_EN_MINILM = Fusion(
    signals=("minilm",),
    mean=(0.50285,),
    sd=(0.21371,),
    weights=(0.8439,),
    intercept=-0.2002,
)
FUSIONS: dict[str, Fusion | Agreement] = {
    # English (anything not Chinese) by default: the two above must agree. Echo buys it less
    # often than either alone on every form measured; clean AUC and kappa lie between the
    # two (docs/JUDGING.md).
    "en:agree": Agreement((_EN_CROSS, _EN_MINILM)),
    "en:cross": _EN_CROSS,
    "en": _EN_MINILM,
    # English by both cosines (``english = "minilm+e5"``): held-out AUC 0.739 against 0.734,
    # kappa at 0.5 0.384 against 0.371, at a third of the speed (7-10 passages/s).
    "en+e5": Fusion(
        signals=("minilm", "e5"),
        mean=(0.50285, 0.86741),
        sd=(0.21371, 0.04465),
        weights=(0.5153, 0.4454),
        intercept=-0.2109,
    ),
    # English text with the query's own words masked (the echo check: RerankRequest.masked),
    # read by MiniLM's cosine, fitted on the dev pairs masked so (AUC 0.670): how likely a
    # passage is relevant by what it says besides the query's words.
    "en:content": Fusion(
        signals=("minilm",),
        mean=(0.30855,),
        sd=(0.16431,),
        weights=(0.5908,),
        intercept=-0.1688,
    ),
    # Chinese text with the query's character pairs masked, read by e5, fitted on the Chinese
    # set masked so (AUC 0.867: masking takes little out of a Chinese passage).
    "zh:content": Fusion(
        signals=("e5",),
        mean=(0.87129,),
        sd=(0.02873,),
        weights=(0.8971,),
        intercept=-0.4961,
    ),
    "zh": Fusion(
        signals=("e5",),
        mean=(0.89504,),
        sd=(0.03168,),
        weights=(0.9301,),
        intercept=-0.5013,
    ),
}
ENGLISH = {"agree": "en:agree", "cross": "en:cross", "minilm": "en", "minilm+e5": "en+e5"}
# The fusions that read text whose query words are masked (RerankRequest.masked), per
# language, whatever the English option: the cross-encoder scores a pair by the query's words
# it finds, so with them masked every passage scores alike (P about 0.12), while MiniLM's
# cosine still tells a passage about the topic from one that is not. Each is fitted on masked
# text, so its probability means the same to the echo floor in either language and whichever
# English signal scores the rest.
CONTENT = {"en": "en:content", "zh": "zh:content"}


def fusion_digest(fusions: dict[str, Fusion | Agreement] = FUSIONS) -> str:
    """A short digest of the coefficients: part of the provider's identity."""
    text = json.dumps(
        {k: dataclasses.asdict(v) for k, v in sorted(fusions.items())}, sort_keys=True
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Cosines(Protocol):
    """One signal's scores of passages for a query, and the tokens read (a cosine, or the
    cross-encoder's logit; the injection seam for tests)."""

    def __call__(
        self, query: str, passages: Sequence[str], cancel: threading.Event
    ) -> tuple[Floats, int]: ...


def minilm_cosines(folder: Path, threads: int) -> Cosines:
    model = MiniLM(folder)

    def cosines(query: str, passages: Sequence[str], cancel: threading.Event) -> tuple[Floats, int]:
        with blas_threads(threads):
            q = model.encode([query], cancel=cancel)
            d = model.encode(passages, cancel=cancel)
        return (d.vectors @ q.vectors[0]).astype(np.float64), q.tokens + d.tokens

    return cosines


def e5_cosines(threads: int) -> Cosines:
    model = e5_module.E5(threads=threads)

    def cosines(query: str, passages: Sequence[str], cancel: threading.Event) -> tuple[Floats, int]:
        q = model.encode([query], query=True, cancel=cancel)
        d = model.encode(passages, query=False, cancel=cancel)
        return (d.vectors @ q.vectors[0]).astype(np.float64), 0

    return cosines


def cross_logits(folder: Path, threads: int) -> Cosines:
    return CrossEncoder(folder, threads=threads).logits


class FusedRerankProvider:
    """A RerankProvider scoring each passage by its language's fusion (:data:`FUSIONS`)."""

    def __init__(
        self,
        loaders: dict[str, Callable[[], Cosines]],
        *,
        identity: str,
        language: str = "auto",
        english: str = "en",
        fusions: dict[str, Fusion | Agreement] = FUSIONS,
        name: str = "embedded-fused",
    ) -> None:
        """``loaders``: per signal, a callable that loads it (called once, on first need);
        ``language``: "auto" (by :func:`language_of`), "en" or "zh" for every passage;
        ``english``: the key in ``fusions`` that scores passages that are not Chinese."""
        self._loaders = loaders
        self._loaded: dict[str, Cosines] = {}
        self._identity = identity
        self._language = language
        self._english = english
        self._fusions = fusions
        self._name = name
        self._busy = asyncio.Lock()
        self._load_lock = threading.Lock()
        # Where two or more signals of one request run side by side (requests take turns:
        # ``_busy``); started on first need, shut down by :meth:`aclose`.
        self._pool: ThreadPoolExecutor | None = None

    @property
    def identity(self) -> str:
        """``embedded-fused:<minilm sha256>:<e5 sha256>:<cross sha256>:<coefficients digest>:
        <language>:<english>``
        (sha256s cut to 16 hex digits)."""
        return self._identity

    def _signal(self, name: str) -> Cosines:
        with self._load_lock:
            if name not in self._loaded:
                self._loaded[name] = self._loaders[name]()
            return self._loaded[name]

    def _score(self, request: RerankRequest, stop: threading.Event) -> tuple[Floats, int]:
        """Each document's probability and the tokens counted (runs in a worker thread)."""
        docs = request.documents
        langs = [
            self._language if self._language != "auto" else language_of(request.query, d)
            for d in docs
        ]
        scores = np.zeros(len(docs))
        tokens = 0
        # Text with the query's words masked (the echo check) is read for its content.
        for lang in sorted(set(langs)):
            if request.masked:
                fusion = self._fusions[CONTENT[lang]]
            else:
                fusion = self._fusions[self._english if lang == "en" else lang]
            idx = [i for i, x in enumerate(langs) if x == lang]
            texts = [docs[i] for i in idx]
            columns: dict[str, Floats] = {}
            for signal, (values, used) in self._signals(fusion.signals, request.query, texts, stop):
                columns[signal] = values
                tokens += used
            scores[idx] = fusion.probability(columns)
        return scores, tokens

    def _signals(
        self, names: Sequence[str], query: str, texts: Sequence[str], stop: threading.Event
    ) -> list[tuple[str, tuple[Floats, int]]]:
        """Each signal's scores of ``texts``; two or more side by side, one thread each (the
        models run outside the GIL, in onnxruntime and numpy's BLAS: on 2 cores the default
        English pair takes about the time of the slower one)."""
        if len(names) == 1:
            return [(names[0], self._signal(names[0])(query, texts, stop))]
        if self._pool is None:
            widest = max(len(f.signals) for f in self._fusions.values())
            self._pool = ThreadPoolExecutor(max_workers=widest, thread_name_prefix="fused")
        runs = {n: self._pool.submit(self._signal(n), query, texts, stop) for n in names}
        return [(n, run.result()) for n, run in runs.items()]

    async def rerank(self, request: RerankRequest, *, timeout: float | None) -> RerankResult:
        """Probabilities in [0, 1] in input order (outside ``top_n``, 0.0)."""
        if not request.documents:
            return RerankResult(scores=(), model=self._name)
        stop = threading.Event()
        try:
            async with self._busy, asyncio.timeout(timeout):
                scores, tokens = await asyncio.to_thread(self._score, request, stop)
        finally:
            stop.set()
        if request.top_n is not None and request.top_n < len(scores):
            keep = np.argsort(-scores, kind="stable")[: request.top_n]
            kept = np.zeros_like(scores)
            kept[keep] = scores[keep]
            scores = kept
        return RerankResult(
            scores=tuple(float(s) for s in scores),
            model=self._name,
            usage=Usage(prompt_tokens=tokens),
        )

    def classify(self, exc: BaseException) -> RetryDecision:
        """Model errors and timeouts are final; the rest as usual."""
        return classify_by_type(exc, _ERRORS)

    async def aclose(self) -> None:
        """Drops the models and stops the signals' threads (no request is running: a closed
        provider is no longer asked)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._loaded.clear()


def check_options(spec: ProviderSpec) -> dict[str, Any]:
    """The options checked (ProviderConfigError naming what is wrong), defaults filled in."""
    refuse_unknown(spec, "embedded-fused", _OPTIONS)
    threads = spec.options.get("threads", 1)
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 0:
        raise ProviderConfigError(
            f"embedded-fused: threads must be an integer >= 0, not {threads!r}"
        )
    fetch = spec.options.get("fetch", True)
    if not isinstance(fetch, bool):
        raise ProviderConfigError(f"embedded-fused: fetch must be true or false, not {fetch!r}")
    language = spec.options.get("language", "auto")
    if language not in _LANGUAGES:
        raise ProviderConfigError(
            f"embedded-fused: language must be one of {', '.join(_LANGUAGES)}, not {language!r}"
        )
    english = spec.options.get("english", "agree")
    if english not in ENGLISH:
        raise ProviderConfigError(
            f"embedded-fused: english must be one of {', '.join(ENGLISH)}, not {english!r}"
        )
    return {"threads": threads, "fetch": fetch, "language": language, "english": english}


def _folder_loader(
    spec: ModelSpec, make: Callable[[Path, int], Cosines], fetch: bool, threads: int
) -> Callable[[], Cosines]:
    """Loads a fetched model folder's signal: fetched first unless ``fetch`` is off, when a
    model not fetched and verified is refused in one line naming the command that fetches it."""
    weights = model_path(spec)
    name = next(k for k, v in MODELS.items() if v is spec)

    def load() -> Cosines:
        if fetch:
            ensure_model(spec=spec, dest=weights)
        elif not is_verified(weights, spec):
            raise ModelError(
                f"the model {spec.name} is not fetched and verified in {weights.parent}: "
                f"run `judge model fetch --model {name}`"
            )
        return make(weights.parent, threads)

    return load


def make_fused_rerank_provider(spec: ProviderSpec) -> RerankProvider:
    """The fused reranker (a registry entry for kind="embedded-fused")."""
    options = check_options(spec)
    identity = (
        f"embedded-fused:{MINILM.sha256[:16]}:{e5_module.WEIGHTS_SHA256[:16]}:"
        f"{CROSS.sha256[:16]}:{fusion_digest()}:{options['language']}:{options['english']}"
    )
    fetch, threads = options["fetch"], options["threads"]
    return FusedRerankProvider(
        {
            "cross": _folder_loader(CROSS, cross_logits, fetch, threads),
            "minilm": _folder_loader(MINILM, minilm_cosines, fetch, threads),
            "e5": lambda: e5_cosines(options["threads"]),
        },
        identity=identity,
        language=options["language"],
        english=ENGLISH[options["english"]],
    )
