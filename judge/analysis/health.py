"""The judge's health: does it tell passages apart at all? (DESIGN rule 10.)

A judge that gives one label to nearly every passage makes every metric meaningless: all
engines score the same, near the best or the worst, whatever they returned. So do
probabilities of relevance that barely move. :func:`judge_health` measures, per engine and
over all engines, over the ``ok`` verdicts of every repeat (``unparsed`` and ``error`` are
not labels and are left out):

- the label distribution: count and share of each label of the scale, and the share of the
  most common one;
- the spread of ``Verdict.probability`` (P(relevant), from logprobs) where present: how many
  verdicts carry one, mean, standard deviation (ddof=0), 10th / 90th percentiles, distinct
  values after rounding to 0.01, and ``peak_share``, the largest share of them that fits in
  one window ``FLAT_WIDTH`` wide.

The rule, applied to the verdicts of all engines together:

- **one label dominates**: with at least ``MIN_VERDICTS`` (20) ok verdicts, one label takes
  ``DOMINANT_SHARE`` (95%) or more of them. Below 20 there are too few to tell: a note says
  so, and the judge is not called degenerate.
- **probabilities too flat to rank**: with at least 20 verdicts carrying a probability, their
  standard deviation is below ``FLAT_STD`` (0.05: nearly all of them within about +-0.1 of
  their mean, a spread no larger than the noise between repeats), or ``DOMINANT_SHARE`` of
  them lie within ``FLAT_WIDTH`` (0.05) of each other (ties with a few outliers). The second
  test is the label rule applied to probabilities; a 10th-90th percentile range would be
  stricter than the label rule (a judge saying "yes" at 0.99 to 92% of passages and "no" to
  the rest would be flagged by probabilities but not by labels), so the percentiles are
  reported, not tested. Both constants are absolute on [0, 1].

Either makes :attr:`JudgeHealth.degenerate` true, with one plain-English reason each in
``problems``. An engine that alone meets the rule while the pooled verdicts do not gets a
note (that engine's metrics are saturated; the judge may simply be right about it), not a
degenerate judge. Pure functions; no I/O.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from judge.schema import JudgedQuery, Record, Scale, Verdict

__all__ = [
    "DOMINANT_SHARE",
    "FLAT_STD",
    "FLAT_WIDTH",
    "MIN_VERDICTS",
    "HealthStats",
    "JudgeHealth",
    "LabelCount",
    "ProbabilitySpread",
    "judge_health",
    "spread",
]

log = logging.getLogger(__name__)

MIN_VERDICTS = 20
DOMINANT_SHARE = 0.95
FLAT_STD = 0.05
FLAT_WIDTH = 0.05


class LabelCount(Record):
    """One label of the scale: how many ok verdicts gave it, and their share."""

    label: str
    grade: int
    count: int
    share: float


class ProbabilitySpread(Record):
    """P(relevant) over the ok verdicts that carry one (all None when ``n`` is 0)."""

    n: int
    mean: float | None = None
    std: float | None = None
    p10: float | None = None
    p90: float | None = None
    distinct: int = 0
    peak_share: float | None = None


class HealthStats(Record):
    """One engine's (or all engines') label distribution and probability spread."""

    ok: int
    labels: tuple[LabelCount, ...]
    top_label: str | None
    top_share: float | None
    probability: ProbabilitySpread
    degenerate: bool
    problems: tuple[str, ...]
    notes: tuple[str, ...]


class JudgeHealth(Record):
    """Whether the judge tells passages apart (the rule: this module's docstring).

    ``degenerate`` means the metrics are not informative, for the reasons in ``problems``
    (over all engines); ``notes`` hold what is worth saying but is no failure (too few
    verdicts to tell, one engine saturated). ``known`` is False for summaries written before
    health was recorded.
    """

    known: bool
    degenerate: bool
    problems: tuple[str, ...]
    notes: tuple[str, ...]
    overall: HealthStats
    engines: dict[str, HealthStats]

    @classmethod
    def unknown(cls) -> JudgeHealth:
        """The health of a summary that did not record one."""
        note = "not recorded: this summary was written before judge health was measured"
        return cls(
            known=False,
            degenerate=False,
            problems=(),
            notes=(note,),
            overall=HealthStats(
                ok=0,
                labels=(),
                top_label=None,
                top_share=None,
                probability=ProbabilitySpread(n=0),
                degenerate=False,
                problems=(),
                notes=(),
            ),
            engines={},
        )


# Judges measured too weak to be informative, whatever their labels look like on a run: the
# health check marks them unreliable with this reason (figures: README, bench_quality.py).
KNOWN_WEAK: dict[str, str] = {
    "embedded": (
        "The embedded 0.5B LLM judge cannot tell relevant from irrelevant passages: on human-"
        "labelled TREC DL passages its P(relevant) ranked them barely above chance (AUC about "
        "0.6, kappa near 0 even at a calibrated cut), short of the AUC 0.65 and kappa 0.25 a "
        "useful judge needs. Use it to try the tool; for numbers, use a capable model "
        "(provider openai, dashscope or local) or the embedded reranker's rerank_* metrics."
    ),
    # A cascade run whose labels came mostly from the embedded reranker (verdict source).
    "embedded-cascade": (
        "Most labels here come from the embedded reranker of the judge cascade, the rest from "
        "the embedded 0.5B LLM. On human-labelled TREC DL passages the cascade ranks them "
        "usefully (AUC about 0.68, kappa about 0.31 at a calibrated cut), but only in English "
        "and on a sample of 80 pairs. A passage the reranker likes only for the query's own "
        "words goes to the LLM (the echo check), but the reranker's scores (rerank_*) can "
        "still be raised by echoing the query. "
        "Use it to try the tool; for numbers you publish, use a capable model (provider "
        "openai, dashscope or local)."
    ),
}


def _advice(scale: Scale) -> str:
    graded = ', or use a graded scale (judge.scale = "graded")' if scale.is_binary else ""
    return (
        "Try another judge model, calibrate it against a few human labels "
        f"(`judge calibrate`){graded}."
    )


def spread(probabilities: Iterable[float]) -> ProbabilitySpread:
    """Mean, std, 10th/90th percentiles, distinct values (0.01) and peak share of ``p``."""
    p = np.sort(np.asarray(list(probabilities), dtype=np.float64))
    if p.size == 0:
        return ProbabilitySpread(n=0)
    p10, p90 = np.percentile(p, [10, 90])
    # Largest share of the values inside one closed window FLAT_WIDTH wide (starting at a value).
    ends = np.searchsorted(p, p + FLAT_WIDTH + 1e-12, side="right")
    peak = int((ends - np.arange(p.size)).max())
    return ProbabilitySpread(
        n=int(p.size),
        mean=float(p.mean()),
        std=float(p.std()),
        p10=float(p10),
        p90=float(p90),
        distinct=int(np.unique(np.round(p, 2)).size),
        peak_share=peak / p.size,
    )


def _label_counts(verdicts: Sequence[Verdict], scale: Scale) -> tuple[LabelCount, ...]:
    """Every label of the scale in grade order (zeros included), then any off-scale label."""
    by_grade: Counter[int] = Counter(v.grade for v in verdicts if v.grade is not None)
    n = len(verdicts)
    out = [
        LabelCount(label=lab.name, grade=lab.grade, count=by_grade[lab.grade], share=0.0)
        for lab in sorted(scale.labels, key=lambda lab: lab.grade)
    ]
    known = {lab.grade for lab in scale.labels}
    for grade in sorted(set(by_grade) - known):
        out.append(LabelCount(label=str(grade), grade=grade, count=by_grade[grade], share=0.0))
    return tuple(c.model_copy(update={"share": c.count / n if n else 0.0}) for c in out)


def _label_finding(labels: Sequence[LabelCount], ok: int) -> str | None:
    top = max(labels, key=lambda c: c.count) if labels else None
    if top is None or ok < MIN_VERDICTS or top.share < DOMINANT_SHARE:
        return None
    return (
        f"gave '{top.label}' to {top.count} of {ok} ok verdicts ({top.share:.1%}; "
        f"{DOMINANT_SHARE:.0%} or more is degenerate)"
    )


def _flat_finding(p: ProbabilitySpread) -> str | None:
    if p.n < MIN_VERDICTS or p.std is None or p.peak_share is None:
        return None
    if p.std < FLAT_STD:
        how = f"standard deviation {p.std:.3f}, under {FLAT_STD}"
    elif p.peak_share >= DOMINANT_SHARE:
        how = f"{p.peak_share:.1%} of them within {FLAT_WIDTH} of each other"
    else:
        return None
    return f"gave probabilities of relevance too flat to rank passages ({p.n} verdicts, {how})"


def _stats(verdicts: Sequence[Verdict], scale: Scale, engine: str | None) -> HealthStats:
    """The health of one engine's ok verdicts (``engine`` None: all engines'). Each problem
    says what the judge did and that the metrics are not informative; over all engines it
    also says what to do."""
    labels = _label_counts(verdicts, scale)
    top = max(labels, key=lambda c: c.count) if verdicts else None
    probability = spread(v.probability for v in verdicts if v.probability is not None)
    found = [f for f in (_label_finding(labels, len(verdicts)), _flat_finding(probability)) if f]
    if engine is None:
        who = "The judge"
        problems = [f"{who} {f}: the metrics are not informative. {_advice(scale)}" for f in found]
    else:
        who = f"On engine '{engine}' the judge"
        problems = [f"{who} {f}: this engine's metrics are not informative." for f in found]
    notes = []
    if len(verdicts) < MIN_VERDICTS:
        notes.append(
            f"{who} gave only {len(verdicts)} ok verdicts: too few to tell whether it favours "
            f"one label (at least {MIN_VERDICTS} are needed)."
        )
    if 0 < probability.n < MIN_VERDICTS:
        notes.append(
            f"{who} gave only {probability.n} probabilities of relevance: too few to tell "
            f"whether they are too flat to rank (at least {MIN_VERDICTS} are needed)."
        )
    return HealthStats(
        ok=len(verdicts),
        labels=labels,
        top_label=top.label if top else None,
        top_share=top.share if top else None,
        probability=probability,
        degenerate=bool(problems),
        problems=tuple(problems),
        notes=tuple(notes),
    )


def _ok(results: Iterable[JudgedQuery]) -> list[Verdict]:
    return [v for jq in results for v in jq.verdicts if v.status == "ok"]


def judge_health(
    results: Sequence[JudgedQuery], scale: Scale, provider: str | None = None
) -> JudgeHealth:
    """The judge's health over ``results`` (every repeat), per engine and over all engines;
    a ``provider`` in :data:`KNOWN_WEAK` is unreliable whatever its verdicts look like."""
    overall = _stats(ok := _ok(results), scale, None)
    engines = {
        engine: _stats(_ok(jq for jq in results if jq.query.engine == engine), scale, engine)
        for engine in sorted({jq.query.engine for jq in results})
    }
    notes = list(overall.notes)
    if not overall.degenerate:
        # One engine saturated: the judge may be right about it; worth saying, not failing.
        notes += [
            f"{problem[:-1]} (over all engines the judge is not degenerate)."
            for stats in engines.values()
            for problem in stats.problems
        ]
    if provider == "embedded" and sum(v.source == "reranker" for v in ok) * 2 > len(ok):
        provider = "embedded-cascade"
    weak = (KNOWN_WEAK[provider],) if provider in KNOWN_WEAK else ()
    if not ok:  # nothing answered: nothing to tell the judge's health by
        return JudgeHealth(
            known=False,
            degenerate=False,
            problems=(),
            notes=("unknown: no verdict was answered (every one unparsed or an error)",),
            overall=overall,
            engines=engines,
        )
    if overall.degenerate or weak:
        log.debug("unreliable judge: %s", " ".join(weak + overall.problems))
    return JudgeHealth(
        known=True,
        degenerate=overall.degenerate or bool(weak),
        problems=weak + overall.problems,
        notes=tuple(notes),
        overall=overall,
        engines=engines,
    )
