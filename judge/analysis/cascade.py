"""What a judge cascade saved, and how its labels agree with human ones (summary.json).

A cascade (judging/cascade.py) labels the passages outside its band with the reranker, so
those cost no LLM call. Counted over every verdict of the results (each repeat counts):

- passages labelled by the LLM judge and by the reranker;
- LLM calls: first-round calls the LLM verdicts took (pointwise one per passage; listwise one
  per query-repeat with a passage in the band), and the calls saved: pointwise one per passage
  the reranker labelled, listwise one per query-repeat it labelled entirely (a shorter list
  still costs one call, only fewer tokens);
- the cost saved, estimated as the reranker's passages times the mean list-price cost of an
  LLM-judged passage (None without a [prices] entry or without any LLM-judged passage);
- with human labels, relevance kappa of the cascade's labels against them, overall and for
  each source's passages. A ``max_error`` band was set from the same labels, so its kappa is
  in-sample (optimistic).
"""

from __future__ import annotations

from collections.abc import Sequence

from judge.analysis.agreement import human_agreement
from judge.config import RunConfig
from judge.judging.relevance import window_size
from judge.schema import JudgedQuery, Record, Usage

__all__ = ["CascadeSummary", "cascade_summary"]


class CascadeSummary(Record):
    llm_passages: int
    reranker_passages: int
    llm_calls: int
    calls_saved: int
    cost_saved_usd: float | None
    # Relevance kappa against human labels (None: no labelled passage, or undefined).
    n_labelled: int
    kappa: float | None
    kappa_llm: float | None
    kappa_reranker: float | None

    def line(self) -> str:
        """One line for the console at the end of a run."""
        total = self.llm_passages + self.reranker_passages
        cost = f", ~${self.cost_saved_usd:.4f} saved" if self.cost_saved_usd is not None else ""
        kappa = f"; kappa vs human labels {self.kappa:.3f}" if self.kappa is not None else ""
        return (
            f"cascade: {self.llm_passages} of {total} passages went to the LLM judge "
            f"({self.llm_calls} LLM calls, {self.calls_saved} saved{cost}){kappa}"
        )


def _labelled_by_reranker(jq: JudgedQuery) -> int:
    """Verdicts the reranker gave a label (a failed reranker call labels nothing)."""
    return sum(v.source == "reranker" and v.status == "ok" for v in jq.verdicts)


def _only(results: Sequence[JudgedQuery], source: str) -> list[JudgedQuery]:
    return [
        jq.model_copy(update={"verdicts": tuple(v for v in jq.verdicts if v.source == source)})
        for jq in results
    ]


def cascade_summary(results: Sequence[JudgedQuery], config: RunConfig) -> CascadeSummary | None:
    """The cascade's savings and agreement; None when the run had no cascade. ``results``
    carry human labels on the judge's scale (report.queries.labels_on_scale)."""
    if config.judge.cascade is None:
        return None
    llm = sum(v.source == "judge" for jq in results for v in jq.verdicts)
    reranker = sum(_labelled_by_reranker(jq) for jq in results)
    if config.judge.mode == "listwise":  # a request a window of the passages asked
        size = window_size(config.judge)
        asked = [sum(v.source == "judge" for v in jq.verdicts) for jq in results]
        whole = [sum(v.source != "empty" for v in jq.verdicts) for jq in results]
        calls = sum(-(-n // size) for n in asked)
        saved = sum(-(-n // size) for n in whole) - calls
    else:
        calls, saved = llm, reranker
    usage = sum((v.usage for jq in results for v in jq.verdicts if v.source == "judge"), Usage())
    price = config.price()
    per_passage = price.cost(usage) / llm if price is not None and llm else None
    scale = config.scale()
    every = human_agreement(results, scale)
    by_llm, by_reranker = (human_agreement(_only(results, s), scale) for s in ("judge", "reranker"))
    return CascadeSummary(
        llm_passages=llm,
        reranker_passages=reranker,
        llm_calls=calls,
        calls_saved=saved,
        cost_saved_usd=per_passage * reranker if per_passage is not None else None,
        n_labelled=every.per_judgement.n if every else 0,
        kappa=every.per_judgement.relevance_kappa if every else None,
        kappa_llm=by_llm.per_judgement.relevance_kappa if by_llm else None,
        kappa_reranker=by_reranker.per_judgement.relevance_kappa if by_reranker else None,
    )
