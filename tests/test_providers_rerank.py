"""Rerank providers (DashScope, Cohere-style, TEI) against a loopback server."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from judge.errors import ResponseError
from judge.providers import make_rerank_provider, resolve_spec
from judge.providers.base import RerankResult, rerank_pair, scores_in_input_order
from judge.providers.rerank import _pairs, rerank_endpoint
from tests.provider_harness import PROTOCOLS, RERANK, call_once, rerank, run
from tests.servers import ScriptedServer


@pytest.mark.parametrize("protocol", ["dashscope-rerank", "cohere"])
def test_rerank_scores_come_back_in_input_order(
    server: ScriptedServer, fake_key: str, protocol: str
) -> None:
    result, exc, _ = run(call_once(PROTOCOLS[protocol], server))
    assert exc is None and isinstance(result, RerankResult)
    assert result.scores == (0.0, 1.0, 0.5)  # word overlap with "black cat"


def test_cohere_request_body(server: ScriptedServer, fake_key: str) -> None:
    run(call_once(PROTOCOLS["cohere"], server))
    (sent,) = server.requests
    assert sent.headers["authorization"] == f"Bearer {fake_key}"
    assert sent.body == {
        "model": "rerank-model",
        "query": "black cat",
        "documents": ["a dog", "black cat sleeps", "a cat"],
        "top_n": 3,
    }


def test_dashscope_rerank_request_body(server: ScriptedServer, fake_key: str) -> None:
    run(call_once(PROTOCOLS["dashscope-rerank"], server))
    assert server.bodies() == [
        {
            "model": "rerank-model",
            "input": {"query": "black cat", "documents": ["a dog", "black cat sleeps", "a cat"]},
            "parameters": {"return_documents": False, "top_n": 3},
        }
    ]


def test_tei_bare_list_answer_is_read(make_server: Callable[..., ScriptedServer]) -> None:
    server = make_server(rerank_shape="tei")
    provider = make_rerank_provider(resolve_spec("rerank", {"base_url": server.url + "/rerank"}))
    result = rerank(provider, RERANK)
    assert server.requests[0].path == "/rerank"
    assert result.scores == (0.0, 1.0, 0.5)


def test_rerank_with_top_n_scores_the_rest_zero(server: ScriptedServer) -> None:
    provider = make_rerank_provider(resolve_spec("rerank", {"base_url": server.url}))
    result = rerank(provider, RERANK.model_copy(update={"top_n": 1}))
    assert server.bodies()[0]["top_n"] == 1
    assert result.scores == (0.0, 1.0, 0.0)


@pytest.mark.parametrize(
    ("base_url", "endpoint"),
    [
        ("https://api.cohere.com", "https://api.cohere.com/v1/rerank"),
        ("https://api.jina.ai/v1/", "https://api.jina.ai/v1/rerank"),
        ("http://tei:8080/rerank", "http://tei:8080/rerank"),
    ],
)
def test_rerank_endpoint_is_not_doubled(base_url: str, endpoint: str) -> None:
    assert rerank_endpoint(base_url) == endpoint


@pytest.mark.parametrize(
    ("pairs", "top_n"),
    [([(0, 0.5)], 2), ([(0, 0.5), (0, 0.7)], 1), ([(2, 0.5)], 1), ([(0, float("nan"))], 1)],
)
def test_incomplete_or_bad_rerank_results_are_refused(
    pairs: list[tuple[int, float]], top_n: int
) -> None:
    with pytest.raises(ResponseError):
        scores_in_input_order(pairs, 2, top_n)


@pytest.mark.parametrize(
    ("index", "score"), [(True, 0.5), (1.4, 0.5), (0.6, 0.5), (0, True), ("1", 0.5), (0, "0.5")]
)
def test_rerank_results_of_the_wrong_types_are_refused_not_made_scores(
    index: object, score: object
) -> None:
    """An index of 1.4 had been read as 1, true as 1, and a score of true as 1.0: a relevant
    verdict from an answer that said nothing."""
    with pytest.raises(ValueError):
        rerank_pair(index, score)
    with pytest.raises(ResponseError):
        _pairs({"results": [{"index": index, "relevance_score": score}]})


def test_rerank_results_of_whole_numbers_are_read() -> None:
    assert rerank_pair(2.0, 1) == (2, 1.0)
    assert _pairs([{"index": 1, "score": 0.25}]) == [(1, 0.25)]
