"""A sentence-transformers BERT encoder (all-MiniLM-L6-v2) in plain numpy, for the reranker.

::

    texts -> word pieces (HF ``tokenizers``, at most ``max_tokens`` each, no padding)
          -> batches of similar length, padded to their longest item, padding masked
          -> embeddings + LayerNorm -> N x (self-attention, LayerNorm, GELU feed-forward,
             LayerNorm) -> mean over real tokens -> L2 normalise          (float32 throughout)

Why ``tokenizers`` + ``safetensors`` + numpy rather than onnxruntime: the model is shipped
as safetensors weights, not an ONNX graph, so onnxruntime would first need an export through
torch (a dependency of hundreds of MB, for one conversion); a 6-layer BERT is about eighty
lines of numpy, and its matrix products run in numpy's BLAS, which is most of the cost
anyway. Both wheels are small and execute no model code: safetensors holds only tensors,
unlike a pickle.

Why at most 256 word pieces (``MAX_TOKENS``, specials included) when positions go to 512:
256 is the model's own ``max_seq_length`` (its ``sentence_bert_config.json``), the length
sentence-transformers cuts at, so the vectors are the ones the model's published numbers
describe; it was trained on pairs cut at 128, so it has never learnt from text past 256;
and attention grows with the square of the length. Typical passages (MS MARCO: 78 word
pieces on average, at most 205 in our sample) are never cut. A cut text is counted in
:attr:`Encoded.truncated` so that the caller can say so.

Padding never leaks: a padded key gets an additive -1e9 before the softmax, so it has
weight exactly 0, and the mean counts real tokens only. Right padding keeps every real
token's position, so a text gives the same vector alone or in a batch (up to float32
rounding in the matrix products, ~1e-7). Results are deterministic for the same texts.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from judge.errors import ModelError

Array = npt.NDArray[np.float32]

MAX_TOKENS = 256
# Batches hold at most this many tokens (items x longest item): bounds memory (attention
# scores are batch x heads x n x n floats) while keeping the matrix products large.
BATCH_TOKENS = 4096
BATCH_SIZE = 32
# Share of a batch's tokens that may be padding (see plan_batches).
MAX_PADDING = 0.2
# Feed-forward rows per chunk: the 4x-wide activation stays in cache instead of RAM.
_FFN_ROWS = 256
_MASKED = np.float32(-1e9)


class Cancelled(Exception):
    """Raised inside :meth:`MiniLM.encode` when its ``cancel`` event is set."""


@dataclass(frozen=True)
class Encoded:
    """Unit vectors for some texts, in their order, and what it took to make them."""

    vectors: Array  # (texts, hidden), each row of norm 1
    tokens: int  # word pieces fed to the model, [CLS] and [SEP] included
    truncated: int  # texts cut at max_tokens


@dataclass(frozen=True)
class _Layer:
    qkv: Array  # (hidden, 3 * hidden): query, key and value projections side by side
    qkv_b: Array
    out: Array
    out_b: Array
    ln1: tuple[Array, Array]
    up: Array  # (hidden, intermediate)
    up_b: Array
    down: Array  # (intermediate, hidden)
    down_b: Array
    ln2: tuple[Array, Array]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelError(f"{path} is not a JSON object")
    return data


def _check_architecture(folder: Path) -> dict[str, Any]:
    """The BERT settings from config.json, refused unless this module computes that model."""
    config = _read_json(folder / "config.json")
    pooling = _read_json(folder / "1_Pooling" / "config.json")
    modes = {k: v for k, v in pooling.items() if k.startswith("pooling_mode_") and v}
    problems = []
    if config.get("model_type") != "bert":
        problems.append(f"model_type {config.get('model_type')!r}, not 'bert'")
    if config.get("hidden_act") != "gelu":
        problems.append(f"hidden_act {config.get('hidden_act')!r}, not 'gelu'")
    if config.get("position_embedding_type", "absolute") != "absolute":
        problems.append("position embeddings are not absolute")
    if list(modes) != ["pooling_mode_mean_tokens"]:
        problems.append(f"pooling {sorted(modes)}, not mean tokens only")
    if problems:
        raise ModelError(f"{folder} is not a model this encoder computes: {'; '.join(problems)}")
    return config


def _load_tensors(path: Path) -> dict[str, Array]:
    from safetensors.numpy import load_file

    try:
        raw = load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for a damaged file
        raise ModelError(f"cannot load {path}: {exc}") from exc
    return {k.removeprefix("bert."): v.astype(np.float32, copy=False) for k, v in raw.items()}


def _take(tensors: dict[str, Array], name: str, transpose: bool = False) -> Array:
    value = tensors.get(name)
    if value is None:
        raise ModelError(f"the model has no tensor {name!r}")
    return np.ascontiguousarray(value.T) if transpose else value


def _layer(t: dict[str, Array], i: int) -> _Layer:
    p = f"encoder.layer.{i}."
    att = p + "attention."
    parts = ("query", "key", "value")
    return _Layer(
        qkv=np.concatenate([_take(t, f"{att}self.{n}.weight", True) for n in parts], axis=1),
        qkv_b=np.concatenate([_take(t, f"{att}self.{n}.bias") for n in parts]),
        out=_take(t, att + "output.dense.weight", True),
        out_b=_take(t, att + "output.dense.bias"),
        ln1=(_take(t, att + "output.LayerNorm.weight"), _take(t, att + "output.LayerNorm.bias")),
        up=_take(t, p + "intermediate.dense.weight", True),
        up_b=_take(t, p + "intermediate.dense.bias"),
        down=_take(t, p + "output.dense.weight", True),
        down_b=_take(t, p + "output.dense.bias"),
        ln2=(_take(t, p + "output.LayerNorm.weight"), _take(t, p + "output.LayerNorm.bias")),
    )


def _layer_norm(x: Array, weights: tuple[Array, Array], eps: float) -> Array:
    centred: Array = x - x.mean(axis=-1, keepdims=True)
    var = np.mean(centred * centred, axis=-1, keepdims=True)
    centred /= np.sqrt(var + np.float32(eps))
    centred *= weights[0]
    centred += weights[1]
    return centred


def _gelu_(x: Array) -> None:
    """GELU in place, the exact (erf) form BERT's ``hidden_act = "gelu"`` means.

    numpy has no erf: Abramowitz & Stegun 7.1.26, absolute error below 1.5e-7, which is
    float32's own resolution near 1. Written as ``max(x, 0) - |x| q`` with
    ``q = (1 - erf(|x| / sqrt 2)) / 2``, which holds for either sign of x.
    """
    a = np.abs(x)
    t = a * np.float32(0.3275911 / math.sqrt(2))
    t += 1
    np.reciprocal(t, out=t)
    q = t * np.float32(0.5 * 1.061405429)
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        q += np.float32(0.5 * c)
        q *= t
    np.multiply(x, x, out=t)
    t *= np.float32(-0.5)
    np.exp(t, out=t)
    q *= t
    q *= a
    np.maximum(x, 0, out=x)
    x -= q


def plan_batches(lengths: Sequence[int], batch_tokens: int, batch_size: int) -> list[list[int]]:
    """Indices of items grouped by length into batches of at most ``batch_size`` items and
    ``batch_tokens`` tokens once padded, padding at most :data:`MAX_PADDING` of a batch.

    On a CPU every padded token costs as much as a real one, and batching gains little
    beyond that (one passage is already a matrix of tokens): a short passage is better
    computed alone than padded to a long one.
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    batches: list[list[int]] = []
    current: list[int] = []
    real = 0
    for i in order:
        longest = lengths[i]  # ascending: the newcomer is the batch's longest
        padded = (len(current) + 1) * longest
        too_big = len(current) == batch_size or padded > batch_tokens
        if current and (too_big or padded - real - longest > MAX_PADDING * padded):
            batches.append(current)
            current, real = [], 0
        current.append(i)
        real += longest
    if current:
        batches.append(current)
    return batches


class MiniLM:
    """A loaded encoder. It keeps no state between calls: :meth:`encode` may run in several
    threads at once."""

    def __init__(self, folder: Path, *, max_tokens: int = MAX_TOKENS) -> None:
        from tokenizers import Tokenizer

        config = _check_architecture(folder)
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        if not 2 <= max_tokens <= int(config.get("max_position_embeddings", 512)):
            raise ModelError(f"max_tokens {max_tokens} is outside this model's 2..positions")
        self.max_tokens = max_tokens
        try:
            self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises a bare Exception for a bad file
            raise ModelError(f"cannot load {folder / 'tokenizer.json'}: {exc}") from exc
        # tokenizer.json pads and cuts everything to 128: we pad per batch and cut at ours.
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_length=max_tokens)
        t = _load_tensors(folder / "model.safetensors")
        self._words = _take(t, "embeddings.word_embeddings.weight")
        self._positions = _take(t, "embeddings.position_embeddings.weight")[:max_tokens]
        self._type0 = _take(t, "embeddings.token_type_embeddings.weight")[0]
        self._ln0 = (_take(t, "embeddings.LayerNorm.weight"), _take(t, "embeddings.LayerNorm.bias"))
        self._layers = [_layer(t, i) for i in range(int(config["num_hidden_layers"]))]
        if self._words.shape[1] != self.hidden or self.hidden % self.heads:
            raise ModelError(f"{folder}: tensor shapes do not match config.json")

    def tokenize(self, texts: Sequence[str]) -> tuple[list[list[int]], int]:
        """Word-piece ids per text (with [CLS] ... [SEP], cut at ``max_tokens``) and how
        many texts were cut."""
        encodings = self._tokenizer.encode_batch(list(texts))
        return [e.ids for e in encodings], sum(1 for e in encodings if e.overflowing)

    def encode(
        self,
        texts: Sequence[str],
        *,
        batch_tokens: int = BATCH_TOKENS,
        batch_size: int = BATCH_SIZE,
        cancel: threading.Event | None = None,
    ) -> Encoded:
        """Unit vectors for ``texts`` in their order; similar lengths are batched together.

        ``cancel`` is checked between batches: when set, :class:`Cancelled` is raised, so a
        caller that stopped waiting does not leave the CPU busy.
        """
        ids, truncated = self.tokenize(texts)
        vectors = np.zeros((len(ids), self.hidden), dtype=np.float32)
        for batch in plan_batches([len(x) for x in ids], batch_tokens, batch_size):
            if cancel is not None and cancel.is_set():
                raise Cancelled
            vectors[batch] = self.forward([ids[i] for i in batch])
        return Encoded(vectors, tokens=sum(map(len, ids)), truncated=truncated)

    def forward(self, batch: Sequence[Sequence[int]]) -> Array:
        """Unit vectors for a batch of id sequences, padded on the right to the longest."""
        size, n = len(batch), max(map(len, batch))
        ids = np.zeros((size, n), dtype=np.int64)
        mask = np.zeros((size, n), dtype=np.float32)
        for row, seq in enumerate(batch):
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        x = self._words[ids] + self._positions[:n] + self._type0
        x = _layer_norm(x.reshape(size * n, self.hidden), self._ln0, self.eps)
        key_bias = ((1 - mask) * _MASKED)[:, None, None, :]  # (batch, 1, 1, keys)
        for layer in self._layers:
            x = self._block(layer, x, size, n, key_bias)
        hidden = x.reshape(size, n, self.hidden)
        pooled: Array = np.einsum("bnh,bn->bh", hidden, mask) / mask.sum(axis=1, keepdims=True)
        pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), np.float32(1e-12))
        return pooled

    def _block(self, layer: _Layer, x: Array, size: int, n: int, key_bias: Array) -> Array:
        """One transformer layer over ``x`` (size * n rows): attention, then feed-forward."""
        heads, width = self.heads, self.hidden // self.heads
        qkv = (x @ layer.qkv + layer.qkv_b).reshape(size, n, 3, heads, width)
        qkv = qkv.transpose(2, 0, 3, 1, 4)  # (3, batch, heads, n, width)
        q = np.ascontiguousarray(qkv[0]) * np.float32(1 / math.sqrt(width))
        scores = q @ np.ascontiguousarray(qkv[1].transpose(0, 1, 3, 2)) + key_bias
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        context = (scores @ np.ascontiguousarray(qkv[2])).transpose(0, 2, 1, 3)
        attended = context.reshape(size * n, self.hidden) @ layer.out + layer.out_b
        x = _layer_norm(attended + x, layer.ln1, self.eps)
        ffn = np.empty_like(x)
        for lo in range(0, x.shape[0], _FFN_ROWS):
            h = x[lo : lo + _FFN_ROWS] @ layer.up + layer.up_b
            _gelu_(h)
            ffn[lo : lo + _FFN_ROWS] = h @ layer.down + layer.down_b
        ffn += x
        return _layer_norm(ffn, layer.ln2, self.eps)
