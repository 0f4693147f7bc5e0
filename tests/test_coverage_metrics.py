"""Coverage, diversity and credibility metrics: hand-computed values, the unparsed rule, and
alpha-nDCG / ERR-IA against ndeval (TREC's reference implementation) through ir_measures."""

from __future__ import annotations

import math
import random

import ir_measures
import pytest
from ir_measures import ERR_IA, alpha_nDCG

from judge.aspects import Aspects, Coverage, Credibility, Nugget, Support
from judge.metrics.compute import metrics_for_queries, parse_metric_name
from judge.metrics.coverage import (
    alpha_ndcg_at,
    coverage_at,
    credibility_at,
    err_ia_at,
    wcoverage_at,
)
from judge.metrics.facts import METRICS
from judge.schema import Passage, Query, Scale, Verdict
from judge.sections import CREDIBILITY_METRICS, NUGGET_METRICS

NUGGETS = (
    Nugget(id="n1", text="a", vital=True),
    Nugget(id="n2", text="b", vital=True),
    Nugget(id="n3", text="c", vital=False),
    Nugget(id="n4", text="d", vital=False),
)


def aspects(*supported: tuple[str, ...] | None, nuggets: tuple[Nugget, ...] = NUGGETS) -> Aspects:
    """Passages p1.. in rank order supporting the given nugget ids (None: unparsed)."""
    supports = tuple(
        Support(passage_id=f"p{i}", status="unparsed", error="bad")
        if s is None
        else Support(passage_id=f"p{i}", status="ok", nuggets=s)
        for i, s in enumerate(supported, start=1)
    )
    return Aspects(coverage=Coverage(nuggets=nuggets, supports=supports))


def test_the_registry_is_the_config_check_list() -> None:
    # Config validation reads the base names without importing metrics: they must agree.
    coverage = {name for name, m in METRICS.items() if m.family == "coverage"}
    assert coverage == {*NUGGET_METRICS, *CREDIBILITY_METRICS}
    assert parse_metric_name("alpha_ndcg@10") == ("alpha_ndcg", 10)


def test_coverage_hand_computed() -> None:
    a = aspects(("n3",), ("n1", "n3"), (), ("n2",))
    assert coverage_at(a, 1) == 0.0  # n3 is okay, not vital
    assert coverage_at(a, 2) == 0.5
    assert coverage_at(a, 3) == 0.5
    assert coverage_at(a, 4) == 1.0
    assert coverage_at(a, None) == 1.0
    assert coverage_at(a, 10) == 1.0  # k past the list: the whole list
    # weighted: vital 1, okay 0.5, out of 3
    assert wcoverage_at(a, 1) == pytest.approx(0.5 / 3)
    assert wcoverage_at(a, 2) == pytest.approx(1.5 / 3)
    assert wcoverage_at(a, 4) == pytest.approx(2.5 / 3)


def test_an_unparsed_support_is_undefined_never_not_covered() -> None:
    a = aspects(("n1",), None, ("n2",))
    assert coverage_at(a, 1) == 0.5  # only rank 1 is read
    for metric in (coverage_at, wcoverage_at, err_ia_at):
        assert metric(a, 2) is None
        assert metric(a, None) is None
    assert alpha_ndcg_at(a, 1) is None  # its ideal reads the whole list


def test_undefined_without_a_set_or_without_vital_nuggets() -> None:
    assert coverage_at(Aspects(), 5) is None
    okay_only = (Nugget(id="n1", text="a", vital=False),)
    assert coverage_at(aspects(("n1",), nuggets=okay_only), 5) is None
    assert wcoverage_at(aspects(("n1",), nuggets=okay_only), 5) == 1.0
    assert err_ia_at(aspects((), nuggets=()), 5) is None
    assert alpha_ndcg_at(aspects((), ()), 5) is None  # nothing supported: no ideal


def test_alpha_ndcg_and_err_ia_hand_computed() -> None:
    # p1 {n1, n2}, p2 {n1}, p3 {}, p4 {n3}; alpha 0.5.
    a = aspects(("n1", "n2"), ("n1",), (), ("n3",))
    dcg = 2 + 0.5 / math.log2(3) + 1 / math.log2(5)
    ideal = 2 + 1 / math.log2(3) + 0.5 / math.log2(4)  # p1, p4, p2
    assert alpha_ndcg_at(a, 5) == pytest.approx(dcg / ideal)
    assert alpha_ndcg_at(a, 1) == 1.0
    raw = 2 + 0.5 / 2 + 1 / 4
    best = sum(0.5**i / (i + 1) for i in range(5))
    assert err_ia_at(a, 5) == pytest.approx(raw / (4 * best))


def test_credibility_hand_computed_and_undefined_on_failure() -> None:
    grades = (
        Credibility(passage_id="p1", status="ok", grade=2),
        Credibility(passage_id="p2", status="ok", grade=0),
        Credibility(passage_id="p3", status="error", error="timeout"),
    )
    a = Aspects(credibility=grades)
    assert credibility_at(a, 1) == 1.0
    assert credibility_at(a, 2) == 0.5
    assert credibility_at(a, 3) is None
    assert credibility_at(Aspects(credibility=()), 3) is None


def test_metrics_for_queries_carries_them_and_leaves_them_undefined_without() -> None:
    query = Query(query_id="q", query="x", passages=(Passage(id="p1", text="t"),))
    verdicts = [Verdict(passage_id="p1", rank=1, status="ok", label="yes", grade=1)]
    a = aspects(("n1",))
    rows = metrics_for_queries(
        ["coverage@5", "ndcg"], [(query, verdicts)] * 2, Scale.binary(), aspects=[a, None]
    )
    assert rows[0] == {"coverage@5": 0.5, "ndcg": 1.0}
    assert rows[1] == {"coverage@5": None, "ndcg": 1.0}


def _ndeval(
    supported: list[tuple[str, ...]], nugget_ids: list[str], k: int, alpha: float
) -> tuple[float | None, float]:
    """ndeval's alpha-nDCG@k (qrels: this list's supports) and ERR-IA@k (qrels: also one
    unretrieved document per unsupported nugget, so every nugget is a subtopic)."""
    run = [
        ir_measures.ScoredDoc("q", f"p{i}", float(100 - i)) for i in range(1, len(supported) + 1)
    ]
    qrels = [
        ir_measures.Qrel("q", f"p{i}", 1, nid)
        for i, s in enumerate(supported, start=1)
        for nid in s
    ]
    found = {nid for s in supported for nid in s}
    dummies = [ir_measures.Qrel("q", f"zz-{n}", 1, n) for n in nugget_ids if n not in found]
    ndcg = None
    if qrels:
        values = list(ir_measures.iter_calc([alpha_nDCG(alpha=alpha) @ k], qrels, run))
        ndcg = values[0].value if values else None
    err = list(ir_measures.iter_calc([ERR_IA @ k], qrels + dummies, run))
    return ndcg, err[0].value


CASES = [
    [("n1", "n2"), ("n1",), (), ("n3",)],
    [(), (), ("n2",)],
    [("n1",), ("n1",), ("n1",), ("n2", "n3", "n4")],
    [("n4",), ("n3",), ("n2",), ("n1",), ("n1", "n2", "n3", "n4")],
]


@pytest.mark.parametrize("supported", CASES)
@pytest.mark.parametrize("k", [2, 3, 5, 10])
def test_hand_made_cases_match_ndeval(supported: list[tuple[str, ...]], k: int) -> None:
    a = aspects(*supported)
    ndcg, err = _ndeval(supported, [n.id for n in NUGGETS], k, 0.5)
    assert alpha_ndcg_at(a, k) == pytest.approx(ndcg)
    assert err_ia_at(a, k) == pytest.approx(err)


@pytest.mark.parametrize("seed", range(40))
def test_random_cases_match_ndeval(seed: int) -> None:
    rng = random.Random(seed)
    nuggets = tuple(Nugget(id=f"n{j}", text="x", vital=rng.random() < 0.5) for j in range(6))
    ids = [n.id for n in nuggets][: rng.randint(1, 6)]
    supported = [tuple(n for n in ids if rng.random() < 0.3) for _ in range(rng.randint(1, 12))]
    k = rng.choice([2, 3, 5, 10, 20])
    alpha = 0.5 if seed % 4 else rng.choice([0.3, 0.7])
    a = aspects(*supported, nuggets=tuple(n for n in nuggets if n.id in ids))
    ndcg, err = _ndeval(supported, ids, k, alpha)
    assert alpha_ndcg_at(a, k, alpha) == pytest.approx(ndcg)
    if alpha == 0.5:  # ir_measures' ERR_IA takes ndeval's default alpha only
        assert err_ia_at(a, k) == pytest.approx(err)
