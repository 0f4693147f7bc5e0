"""The judge cascade (``[judge.cascade]``): the reranker labels the passages it is sure of, the
LLM judge the uncertain band between.

Every passage of a query is scored by the ``[rerank]`` provider through the Caller (cached,
budgeted, retried like any call), once per query: with repeat index 0 whatever the repeat, as a
reranker is a deterministic scorer and repeats measure the LLM. Then, per passage::

    score <  low            -> the scale's lowest label   (source "reranker")
    low <= score < high     -> the LLM judge              (source "judge")
    score >= high           -> the scale's highest label  (source "reranker"), unless its
                               score with the query's words masked is below echo_floor:
                               then the LLM judge, the verdict flagged "echo" (judging/echo.py)

Whatever its score, a passage the sanitiser flagged (``Passage.aimed``: text aimed at the judge,
left in place) goes to the LLM, which reads it whole, datamarked; the reranker scores it
without that text (:func:`scored_text`), so ``rerank_*`` is not bought by the forms the
sanitiser knows.

**Judging by score.** A reranker named as the judge itself (``[judge] provider =
"embedded-fused"``, or any kind that reranks and cannot chat) is a cascade with no LLM: the
band is empty at the cut (``low == high``; the provider kind's calibrated ``score_cut`` unless
``[judge.cascade]`` says), and what would have gone to the LLM is decided by score instead: a
flagged passage by the score of its text without the flagged part, an echo-flagged one by its
score with the query's words masked (what the passage earns without repeating the query; its
probability too), with the signal ``echo``. So echo cannot buy a score judge's "yes" either.

A reranker verdict costs no LLM call; its ``probability`` is the reranker score (clipped to
[0, 1]), so soft metrics and ``rerank_*`` work as with any rerank provider. On a graded scale
the reranker gives only the two ends: it can tell sure-relevant from sure-irrelevant, not
"partial" from "answers", so the grades between come from the LLM alone and a reranker
"relevant" counts with the top grade's gain. ``low == high`` is the reranker alone, cut there.

The band, one of (:class:`~judge.config.CascadeSection`):

- ``low`` and ``high``, as given;
- ``quantiles = [q_low, q_high]`` of every reranker score of the run: about
  ``q_high - q_low`` of the passages go to the LLM;
- ``max_error = e``, from the run's human labels: ``low`` is the highest cut with at most a
  share ``e`` of relevant passages below it, ``high`` the lowest cut (>= low) with at most ``e``
  irrelevant at or above it. So the reranker decides only where its labels were at least
  ``1 - e`` right on the labelled passages (in-sample on those passages: the summary's
  agreement with the same labels is optimistic).

The last two need every score of the run before the first LLM call: the runner scores every
query first (:meth:`Cascade.fit`); the judging that follows reads those scores from the cache,
and a resumed run computes them again from the cache, so it gets the same band for the same
queries. Quantiles per query would need no pre-pass, but they would send a fixed share of every
list to the LLM however sure the reranker is.

A reranker failure (after the Caller's retries) makes every verdict of the query ``error``, so
the unit is asked again on resume; its passages are neither labelled nor sent to the LLM
instead (that would spend what the cascade was asked to save).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Literal

import numpy as np

from judge.calling.caller import Caller
from judge.config import CascadeSection
from judge.errors import ConfigError, InputError, ProviderError
from judge.judging.echo import ECHO, RESTATED_WEIGHT, mask_query, without_restatements
from judge.judging.sanitise import strip_aimed
from judge.judging.verdicts import empty_verdict, ok_verdict
from judge.providers.base import RerankRequest
from judge.schema import Passage, Query, Record, Scale, Verdict, visible

log = logging.getLogger(__name__)

__all__ = [
    "Band",
    "Cascade",
    "echo_request",
    "fit_band",
    "label_problem",
    "rerank_request",
    "rerank_scores",
    "scored_documents",
]

# Labelled passages a max_error band needs (as judge calibrate), some relevant and some not.
MIN_LABELLED = 20
Side = Literal["below", "band", "above"]
Ask = Callable[[Query], Awaitable[list[Verdict]]]


class Band(Record):
    """Reranker scores in [low, high) go to the LLM judge; ``how`` says how it was set."""

    low: float
    high: float
    how: str

    def side(self, score: float) -> Side:
        if score < self.low:
            return "below"
        return "band" if score < self.high else "above"


def scored_text(passage: Passage, query: str) -> str:
    """What a reranker scores: the passage, without the text aimed at the judge that the
    sanitiser flagged in it (``Passage.aimed``). A reranker reads no prompt, so a datamark
    cannot help it, and query stuffing moves a bi-encoder's score; an LLM still reads the
    passage whole."""
    return strip_aimed(passage.text, query)[0] if passage.aimed else passage.text


def scored_passages(query: Query) -> list[Passage]:
    """``query``'s passages a reranker scores: those with text to read once what the
    sanitiser flagged is out of it (:func:`scored_text`). The others score 0 without asking
    (some rerank servers refuse an empty document): a blank passage is not relevant, and one
    that was all text aimed at the judge goes to the LLM."""
    return [p for p in query.passages if visible(scored_text(p, query.query))]


def scored_documents(query: Query) -> list[tuple[str, str | None]]:
    """Per passage of :func:`scored_passages`: its text as a reranker scores it
    (:func:`scored_text`), and the same without its restatements of the query
    (judging/echo.py; None: it has none)."""
    scored = [scored_text(p, query.query) for p in scored_passages(query)]
    return [(text, without_restatements(text, query.query)) for text in scored]


def read_scores(query: Query, scores: Mapping[str, float]) -> dict[str, float]:
    """``scores`` of the passages a reranker read (a blank one's 0 says nothing of the
    reranker: left out of a band fitted to the scores)."""
    return {p.id: scores[p.id] for p in scored_passages(query)}


def passage_scores(
    query: Query, documents: Sequence[tuple[str, str | None]], scores: Sequence[float]
) -> tuple[dict[str, float], set[str]]:
    """The scores of :func:`rerank_request`'s ``documents`` per passage id of ``query`` (a
    blank passage's 0), a passage that restates the query scoring ``without +
    RESTATED_WEIGHT * (with - without)``; and the ids of those that restate it."""
    read = scored_passages(query)
    extra = iter(scores[len(read) :])
    out, restated = dict.fromkeys((p.id for p in query.passages), 0.0), set()
    for p, (_, bare), score in zip(read, documents, scores[: len(read)], strict=True):
        if bare is not None:
            without = next(extra)
            score = without + RESTATED_WEIGHT * (score - without)
            restated.add(p.id)
        out[p.id] = score
    return out, restated


def rerank_request(
    model: str, query: Query, documents: Sequence[tuple[str, str | None]] | None = None
) -> RerankRequest:
    """The one rerank request that scores every passage of ``query``: each as scored, then,
    for each one that restates the query, the same without its restatements
    (:func:`rerank_scores` weighs the two). ``documents``: :func:`scored_documents`, if
    already made."""
    pairs = scored_documents(query) if documents is None else documents
    texts = (*(text for text, _ in pairs), *(bare for _, bare in pairs if bare is not None))
    return RerankRequest(model=model, query=query.query, documents=texts, top_n=len(texts))


def echo_request(model: str, query: Query, passages: Sequence[Passage]) -> RerankRequest:
    """The rerank request of the echo check: ``passages`` with the query's words masked."""
    masked = tuple(mask_query(scored_text(p, query.query), query.query) for p in passages)
    return RerankRequest(
        model=model, query=query.query, documents=masked, top_n=len(masked), masked=True
    )


async def rerank_scores(
    caller: Caller, model: str, query: Query, repeat: int
) -> tuple[dict[str, float], bool]:
    """Score per passage id, and whether the answer came from the cache. A passage that
    restates the query scores ``without + RESTATED_WEIGHT * (with - without)``."""
    scores, cached, _ = await _weighed_scores(caller, model, query, repeat)
    return scores, cached


async def _weighed_scores(
    caller: Caller, model: str, query: Query, repeat: int
) -> tuple[dict[str, float], bool, set[str]]:
    """:func:`rerank_scores`, and the ids of the passages that restate the query."""
    documents = scored_documents(query)
    if not documents:  # every passage blank: nothing to ask
        return dict.fromkeys((p.id for p in query.passages), 0.0), True, set()
    result = await caller.rerank(rerank_request(model, query, documents), repeat)
    scores, restated = passage_scores(query, documents, result.answer.scores)
    return scores, result.cached, restated


def fixed_band(section: CascadeSection) -> Band | None:
    """The band when the config gives it; None when it comes from the run's scores."""
    if section.low is None or section.high is None:
        return None
    return Band(low=section.low, high=section.high, how="low and high from the config")


def band_from_quantiles(scores: Sequence[float], quantiles: tuple[float, float]) -> Band:
    if not scores:
        raise InputError("the cascade's quantile band needs reranker scores: no passages")
    low, high = np.quantile(np.asarray(scores, dtype=np.float64), quantiles)
    how = f"quantiles {list(quantiles)} of {len(scores)} reranker scores"
    return Band(low=float(low), high=float(high), how=how)


def band_from_labels(scores: Sequence[float], relevant: Sequence[bool], max_error: float) -> Band:
    """The band outside which the reranker was wrong on at most ``max_error`` of the labelled
    passages on each side (see the module docstring)."""
    s, y = np.asarray(scores, dtype=np.float64), np.asarray(relevant, dtype=bool)
    if s.size < MIN_LABELLED or y.all() or not y.any():
        raise InputError(
            f"the cascade's max_error band needs at least {MIN_LABELLED} labelled passages, "
            f"some relevant and some not; got {s.size} ({int(y.sum())} relevant)"
        )
    order = np.argsort(s, kind="stable")
    s, y = s[order], y[order]
    # Candidate cuts: every score, and one above them all (nothing at or above it).
    cuts = np.append(np.unique(s), np.nextafter(s[-1], np.inf))
    n_below = np.searchsorted(s, cuts, side="left")
    relevant_below = np.concatenate([[0], np.cumsum(y)])[n_below]
    n_above = s.size - n_below
    irrelevant_above = n_above - (int(y.sum()) - relevant_below)
    below_ok = relevant_below <= max_error * n_below
    low = float(cuts[below_ok].max())  # the lowest cut (nothing below) always qualifies
    above_ok = (irrelevant_above <= max_error * n_above) & (cuts >= low)
    high = float(cuts[above_ok].min())  # the cut above every score always qualifies
    how = f"max_error {max_error} on {s.size} labelled passages ({int(y.sum())} relevant)"
    return Band(low=low, high=high, how=how)


def _apart(value: float, bound: float) -> tuple[str, str]:
    """``value`` and ``bound`` with digits enough to tell them apart (3 to 6): a score of
    0.49981 is not "0.500 < cut 0.500"."""
    for digits in range(3, 7):
        a, b = f"{value:.{digits}f}", f"{bound:.{digits}f}"
        if a != b or value == bound:
            return a, b
    return a, b


def _labelled(
    scored: Sequence[tuple[Query, Mapping[str, float]]], label_scale: Scale
) -> tuple[list[float], list[bool]]:
    scores: list[float] = []
    relevant: list[bool] = []
    for query, by_id in scored:
        for pid, grade in (query.labels or {}).items():
            if pid in by_id:
                scores.append(by_id[pid])
                relevant.append(label_scale.relevant(grade))
    return scores, relevant


def fit_band(
    section: CascadeSection,
    scored: Sequence[tuple[Query, Mapping[str, float]]],
    label_scale: Scale,
) -> Band:
    """The band ``section`` describes, given the run's reranker scores (query, scores by id)."""
    band = fixed_band(section)
    if band is not None:
        return band
    if section.quantiles is not None:
        every = [score for _, by_id in scored for score in by_id.values()]
        return band_from_quantiles(every, section.quantiles)
    if section.max_error is None:  # the config's validator allows no other shape
        raise ConfigError("judge.cascade: no band")
    return band_from_labels(*_labelled(scored, label_scale), section.max_error)


def label_problem(
    section: CascadeSection | None, queries: Sequence[Query], label_scale: Scale
) -> str | None:
    """Why a max_error band cannot be fitted from ``queries``' human labels, before any call."""
    if section is None or section.max_error is None:
        return None
    relevant = [
        label_scale.relevant(grade)
        for q in queries
        for pid, grade in (q.labels or {}).items()
        if any(p.id == pid for p in q.passages)
    ]
    if len(relevant) >= MIN_LABELLED and 0 < sum(relevant) < len(relevant):
        return None
    return (
        f"judge.cascade.max_error needs at least {MIN_LABELLED} human-labelled passages in the "
        f"dataset, some relevant and some not; it has {len(relevant)} ({sum(relevant)} relevant)"
    )


def reranker_verdict(
    passage: Passage,
    rank: int,
    score: float,
    band: Band,
    scale: Scale,
    *,
    cached: bool,
    masked: float | None = None,
    restated: bool = False,
) -> Verdict:
    """The verdict of a passage outside the band: the scale's highest or lowest label. A score
    judge's echo-flagged passage is labelled by ``masked``, its score with the query's words
    masked (see the module docstring). ``restated``: the passage restates the query (its
    score weighs that part at half, judging/echo.py), said in the reason."""
    decisive = score if masked is None else masked
    above = band.side(decisive) == "above"
    label = scale.by_grade(scale.max_grade if above else 0)
    said, bound = _apart(decisive, band.high if above else band.low)
    if band.low == band.high:
        edge = f">= cut {bound}" if above else f"< cut {bound}"
    else:
        edge = f">= {bound}" if above else f"< {bound}"
        edge += f" (band [{band.low:.3f}, {band.high:.3f}))"
    if masked is None:
        reason = f"reranker score {said} {edge}"
    else:  # below the echo floor: labelled by what it says besides the query's words
        why = "relevant on what it says besides them" if above else "it rested on repeating them"
        reason = f"reranker score {score:.3f}, {said} with the query's words masked {edge}: {why}"
    if restated:
        reason += "; it restates the query, which counts at half weight"
    return ok_verdict(
        scale,
        passage.id,
        rank,
        label.name,
        label.grade,
        probability=min(max(decisive, 0.0), 1.0),
        reason=reason,
        attempts=0,
        cached=cached,
        source="reranker",
        signals=(ECHO,) if masked is not None else (),
    )


def _failed(query: Query, exc: ProviderError) -> list[Verdict]:
    """Every passage's verdict when the reranker failed: an error, asked again on resume; or,
    when its content inspection refused them, unparsed, as a chat judge's refusal is (asked
    again, it would be refused again: a run that re-sent it never finished)."""
    refused = exc.kind == "content"
    said = f"reranker: the provider refused it: {exc}" if refused else f"reranker: {exc}"
    return [
        Verdict(
            passage_id=p.id,
            rank=rank,
            status="unparsed" if refused else "error",
            error=said,
            attempts=exc.attempts,
            source="reranker",
        )
        for rank, p in enumerate(query.passages, start=1)
    ]


class Cascade:
    """Routes one query's passages between the reranker and the LLM judge."""

    def __init__(self, section: CascadeSection, scale: Scale, caller: Caller, model: str) -> None:
        self.section, self.scale, self.caller, self.model = section, scale, caller, model
        self.band = fixed_band(section)

    @classmethod
    def of(
        cls, section: CascadeSection | None, scale: Scale, caller: Caller, model: str | None
    ) -> Cascade | None:
        """The cascade a judge's config asks for (None: no cascade); it needs a reranker. With
        no chat provider it judges by score: its band must be a cut (``low == high``)."""
        if section is None:
            return None
        if caller.reranker is None or model is None:
            raise ConfigError("judge.cascade needs a rerank provider ([rerank] in the config)")
        if caller.chat is None and (section.low is None or section.low != section.high):
            raise ConfigError(
                "judge.cascade: a judge by score (a reranker as [judge] provider) has no LLM for "
                "a band: give the cut as low = high, or leave [judge.cascade] out for the "
                "provider's calibrated cut"
            )
        return cls(section, scale, caller, model)

    async def fit(self, queries: Sequence[Query], label_scale: Scale) -> Band:
        """Score every passage of ``queries`` and set the band from the scores (a band the
        config gives needs none). ``queries`` must be cut to the context as they are judged."""
        fixed = fixed_band(self.section)
        if fixed is not None:
            return fixed
        todo = [q for q in queries if q.passages]
        log.info(
            "cascade: scoring %d passages with the reranker to set the band",
            sum(len(q.passages) for q in todo),
        )
        tasks = [asyncio.ensure_future(rerank_scores(self.caller, self.model, q, 0)) for q in todo]
        try:
            got = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        scored = [(q, read_scores(q, scores)) for q, (scores, _) in zip(todo, got, strict=True)]
        self.band = fit_band(self.section, scored, label_scale)
        log.info("cascade band [%.3f, %.3f): %s", self.band.low, self.band.high, self.band.how)
        return self.band

    async def verdicts(
        self, query: Query, ask: Ask
    ) -> tuple[list[Verdict], dict[str, float] | None]:
        """One verdict per passage in rank order, and the reranker's scores (None when the
        reranker failed: every verdict is then an error). ``ask`` judges a query with the
        LLM; it gets ``query`` holding only the passages in the band."""
        if self.band is None:
            raise ConfigError(
                "the cascade's band comes from the run's reranker scores (quantiles or "
                "max_error): call Judge.afit_cascade(queries) before judging"
            )
        if not query.passages:
            return [], None
        try:
            scores, cached, restated = await _weighed_scores(self.caller, self.model, query, 0)
        except ProviderError as exc:
            return _failed(query, exc), None
        ranks = {p.id: rank for rank, p in enumerate(query.passages, start=1)}
        band = self.band
        try:
            echoed = await self._echoed(query, scores)
        except ProviderError as exc:
            return _failed(query, exc), None
        # A passage holding text aimed at the judge (judging/sanitise.py flags it) is not the
        # reranker's to label: its score is of the text without it, the LLM reads it whole. A
        # judge by score has no LLM: its score (and an echoed one's masked score) decides.
        aimed = {p.id for p in query.passages if p.aimed} if self.caller.chat else set()
        to_llm = tuple(
            p
            for p in query.passages
            if not p.blank
            and (
                band.side(scores[p.id]) == "band"
                or (self.caller.chat and p.id in echoed)
                or p.id in aimed
            )
        )
        asked = await ask(query.model_copy(update={"passages": to_llm})) if to_llm else []
        out: dict[str, Verdict] = {}
        for v in asked:
            update: dict[str, object] = {"rank": ranks[v.passage_id]}
            if v.passage_id in echoed:
                update["signals"] = (*v.signals, ECHO)
            out[v.passage_id] = v.model_copy(update=update)
        for p in query.passages:
            if p.blank:  # nothing to read, whatever its score: no call, not relevant
                out[p.id] = empty_verdict(self.scale, p, ranks[p.id])
            elif p.id not in out:
                out[p.id] = reranker_verdict(
                    p,
                    ranks[p.id],
                    scores[p.id],
                    band,
                    self.scale,
                    cached=cached,
                    masked=echoed.get(p.id),
                    restated=p.id in restated,
                )
        return [out[p.id] for p in query.passages], scores

    async def _echoed(self, query: Query, scores: Mapping[str, float]) -> dict[str, float]:
        """The passages above the band whose score falls below ``echo_floor`` once the query's
        own words are masked out of them (judging/echo.py), with that masked score: one more
        rerank request, for those passages only, through the Caller."""
        floor, band = self.section.echo_floor, self.band
        assert band is not None
        above = [p for p in scored_passages(query) if band.side(scores[p.id]) == "above"]
        if not floor or not above:  # 0 or None: no echo check
            return {}
        result = await self.caller.rerank(echo_request(self.model, query, above), 0)
        return {p.id: s for p, s in zip(above, result.answer.scores, strict=True) if s < floor}
