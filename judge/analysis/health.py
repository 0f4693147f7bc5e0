"""The judge's health: does this run show that its labels tell passages apart? (DESIGN rule 10.)

Measured from the run, never recited: :func:`judge_health` reads the ``ok`` verdicts of every
repeat (``unparsed`` and ``error`` are not labels and are left out) and says what they show, in
sentences written once here and shown as they are by the console, the report and summary.json.

**Label distribution and probability spread** (per engine and over all engines):

- the label distribution: count and share of each label of the scale, and the share of the
  most common one;
- the spread of ``Verdict.probability`` (P(relevant), from logprobs or a reranker's score)
  where present: how many verdicts carry one, mean, standard deviation (ddof=0), 10th / 90th
  percentiles, distinct values after rounding to 0.01, and ``peak_share``, the largest share of
  them that fits in one window ``FLAT_WIDTH`` wide.

Rules, applied to the verdicts of all engines together:

- **one label dominates**: with at least ``MIN_VERDICTS`` (20) ok verdicts, one label takes
  ``DOMINANT_SHARE`` (95%) or more of them. Below 20 there are too few to tell: a note says so.
- **probabilities too flat to rank**: with at least 20 verdicts carrying a probability, their
  standard deviation is below ``FLAT_STD`` (0.05), or ``DOMINANT_SHARE`` of them lie within
  ``FLAT_WIDTH`` (0.05) of each other (ties with a few outliers). The 10th-90th percentiles
  are reported, not tested (they would be stricter than the label rule).
- **disagrees with human labels**: with at least ``MIN_LABELLED`` (20) human-labelled ok
  verdicts, ``MIN_EACH`` (5) or more of them relevant and as many not, a relevance kappa under
  ``KAPPA_BAR`` (0.2), or an AUC of P(relevant) under ``AUC_BAR`` (0.6) over at least 20 that
  carry one. Agreement at or above both bars is said too, with its figures.
- **a language its model does not serve**: when the caller knows which languages the model
  that decided most labels serves (``served``, from the provider registry), and most of the
  run's distinct passages are in another (Chinese told by the fused reranker's own test,
  ``language_of``). A smaller share (``SOME_SHARE``, 5%, or more) is a note.

Any of these makes :attr:`JudgeHealth.degenerate` true ("the metrics are not informative"),
one sentence each in ``problems``. An engine that alone meets a distribution rule while the
pooled verdicts do not gets a note, not a degenerate judge.

**Said, not judged** (``findings``): which language the run judged; in a cascade (verdicts with
source ``reranker``), the share of labels each source gave, and on the band the LLM's agreement
with the reranker: the AUC of the reranker's score (``JudgedQuery.rerank_scores``) against the
LLM's label over at least ``MIN_BAND`` band passages. The LLM is mentioned only when it gave
verdicts (source ``judge`` with a paid or cached call). ``caveats`` hold what was measured
elsewhere (the embedded 0.5B LLM on the dev set), only when that judge decided labels here;
they never make a judge unreliable. Pure functions; no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
from pydantic import Field

from judge.analysis.agreement import AgreementStats, human_agreement
from judge.analysis.reliability import roc_auc
from judge.providers.embedded import language_of, other_language
from judge.schema import JudgedQuery, Record, Scale, Verdict

__all__ = [
    "AUC_BAR",
    "DOMINANT_SHARE",
    "FLAT_STD",
    "FLAT_WIDTH",
    "KAPPA_BAR",
    "MIN_BAND",
    "MIN_EACH",
    "MIN_LABELLED",
    "MIN_VERDICTS",
    "BandCheck",
    "HealthStats",
    "HumanCheck",
    "JudgeHealth",
    "LabelCount",
    "LanguageCheck",
    "ProbabilitySpread",
    "judge_health",
    "spread",
]

MIN_VERDICTS = 20
DOMINANT_SHARE = 0.95
FLAT_STD = 0.05
FLAT_WIDTH = 0.05
# Agreement with human labels: enough labelled pairs, both kinds, and the bars under which a
# judge's labels say little (the anchors: a useful small judge reaches AUC 0.65-0.75,
# kappa 0.25-0.45; a judge at chance, AUC 0.5 and kappa 0).
MIN_LABELLED = 20
MIN_EACH = 5
AUC_BAR = 0.6
KAPPA_BAR = 0.2
# The LLM on the cascade's band against the reranker's score: passages needed to say a figure.
MIN_BAND = 20
# A share of passages in a language the model does not serve worth a note (most: a problem).
SOME_SHARE = 0.05
LANGUAGES = {"en": "English", "zh": "Chinese", "other": "in neither English nor Chinese"}
# Passages the language check reads every word of (an even sample of a larger run).
OTHER_CHECKED = 2000

# Measured elsewhere: said only when the embedded LLM decided labels in the run.
EMBEDDED_LLM_CAVEAT = (
    "on human-labelled TREC DL 2019 dev passages it ranked them near chance (AUC about 0.6; "
    "bench/bench_quality.py), so read its labels as a first look, not numbers to publish"
)


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


class HumanCheck(Record):
    """The judge against the run's human labels (ok verdicts of every repeat): labelled pairs,
    how many humans call relevant, relevance kappa, and the AUC of P(relevant) over the
    ``n_with_probability`` that carry one."""

    n: int
    relevant: int
    kappa: float | None
    auc: float | None
    n_with_probability: int
    # Distinct labelled passages judged (n counts each repeat's verdict; 0: not counted).
    passages: int = 0


class BandCheck(Record):
    """The LLM's verdicts on a cascade's band against the reranker's score of the same
    passages: how many, how many the LLM called relevant, and the AUC of the score against
    the LLM's label (0.5: the LLM's labels are unrelated to the score)."""

    n: int
    relevant: int
    auc: float | None


class LanguageCheck(Record):
    """The language the run judged: ``[judge] language``, the distinct passages and how many
    were detected as Chinese, and the languages the deciding model serves (None: not known).
    ``other`` of ``checked`` passages (an even sample of at most OTHER_CHECKED; 0: written
    before the check) are in neither English nor Chinese."""

    language: str | None
    passages: int
    chinese: int
    served: tuple[str, ...] | None
    served_by: str | None = None
    other: int = 0
    checked: int = 0

    def others(self) -> int:
        """The passages in neither language, estimated over all from the sample checked."""
        scale = (self.passages - self.chinese) / self.checked if self.checked else 0.0
        return round(self.other * scale)


class JudgeHealth(Record):
    """What the run shows about its judge (the rules: this module's docstring).

    ``degenerate`` means this run's evidence says the metrics are not informative, for the
    reasons in ``problems``; ``findings`` are measured and worth saying (agreement, sources,
    language); ``caveats`` were measured elsewhere and apply to this run's judge; ``notes``
    hold what is no failure (too few to tell, one engine saturated). :meth:`said` is every
    sentence in that order. ``known`` is False for summaries written before health was
    recorded; the fields after ``engines`` are empty in summaries written before they were.
    """

    known: bool
    degenerate: bool
    problems: tuple[str, ...]
    notes: tuple[str, ...]
    overall: HealthStats
    engines: dict[str, HealthStats]
    findings: tuple[str, ...] = ()
    caveats: tuple[str, ...] = ()
    # ok verdicts by who decided them: "reranker" (a cascade's or a judge by score), "llm" (an
    # LLM verdict with a paid or cached call).
    sources: dict[str, int] = Field(default_factory=dict)
    human: HumanCheck | None = None
    band: BandCheck | None = None
    language: LanguageCheck | None = None

    def said(self) -> tuple[str, ...]:
        """Every sentence, problems first: what the console, report and summary.json say."""
        return self.problems + self.findings + self.caveats + self.notes

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
        problems = [
            f"{who} {f}: this engine's metrics cannot tell an engine that good from verdicts "
            "its passages bought (see its flagged passages)."
            for f in found
        ]
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
    """The verdicts a judge gave (an empty passage's "no" was given without asking)."""
    return [v for jq in results for v in jq.verdicts if v.status == "ok" and v.source != "empty"]


def _unanswered(results: Sequence[JudgedQuery]) -> str:
    """Why no verdict was answered: asked and unparsed or failed, blank, or none at all."""
    sources = {v.source == "empty" for jq in results for v in jq.verdicts}
    if False in sources:
        return "every passage asked was unparsed or an error"
    return "no passage had text to judge" if sources else "there was no passage"


def _asked_llm(verdict: Verdict) -> bool:
    """An LLM verdict that came from a call, paid now or earlier (a cached answer)."""
    return verdict.source == "judge" and (verdict.cached or verdict.usage.total > 0)


def _sources(ok: Sequence[Verdict]) -> dict[str, int]:
    """Ok verdicts by who decided them: the reranker, or an LLM that was asked."""
    return {
        "reranker": sum(v.source == "reranker" for v in ok),
        "llm": sum(_asked_llm(v) for v in ok),
    }


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "0%"


def _relevant(scale: Scale, grade: int | None) -> bool:
    return grade is not None and grade >= scale.threshold


def _human(results: Sequence[JudgedQuery], scale: Scale) -> HumanCheck | None:
    """The judge's ok verdicts against the human labels of their passages, if any."""
    agreement = human_agreement(results, scale)
    if agreement is None or not agreement.per_judgement.n:
        return None
    stats: AgreementStats = agreement.per_judgement
    grades = sorted(label.grade for label in scale.labels)
    relevant = sum(
        sum(row) for g, row in zip(grades, stats.confusion, strict=True) if g >= scale.threshold
    )
    passages = {
        (jq.query.query_id, jq.query.engine, v.passage_id)
        for jq in results
        if jq.query.labels
        for v in jq.verdicts
        if v.status == "ok" and v.passage_id in jq.query.labels
    }
    return HumanCheck(
        n=stats.n,
        relevant=relevant,
        kappa=stats.relevance_kappa,
        auc=stats.auc if stats.n_with_probability >= MIN_LABELLED else None,
        n_with_probability=stats.n_with_probability,
        passages=len(passages),
    )


def _human_sentences(check: HumanCheck, scale: Scale) -> tuple[list[str], list[str], list[str]]:
    """(problems, findings, notes) the human labels give: one sentence in one of them."""
    n, rel = check.n, check.relevant
    if n < MIN_LABELLED or rel < MIN_EACH or n - rel < MIN_EACH:
        return (
            [],
            [],
            [
                f"{n} judged passages carry human labels ({rel} relevant): too few to measure the "
                f"judge against them (at least {MIN_LABELLED}, {MIN_EACH} of them relevant and "
                f"{MIN_EACH} not)."
            ],
        )
    k, auc = check.kappa, check.auc
    k_low, auc_low = k is not None and k < KAPPA_BAR, auc is not None and auc < AUC_BAR
    figures = [
        f"relevance kappa {k:.2f}" + (f" (under {KAPPA_BAR})" if k_low else "")
        if k is not None
        else None,
        f"AUC of P(relevant) {auc:.2f}" + (f" (under {AUC_BAR})" if auc_low else "")
        if auc is not None
        else None,
    ]
    said = " and ".join(f for f in figures if f)
    if not said:
        return [], [], [f"On {n} human-labelled passages the judge's agreement is undefined."]
    where = f"on {n} human-labelled passages ({rel} relevant)"
    if check.passages and check.passages != n:  # repeats: each passage judged several times
        where = f"on {n} judgements of {check.passages} human-labelled passages ({rel} relevant)"
    bars = f"kappa {KAPPA_BAR}, AUC {AUC_BAR}"
    if k_low or auc_low:
        problem = (
            f"The judge disagrees with the human labels: {where}, {said}: the metrics are not "
            f"informative. {_advice(scale)}"
        )
        return [problem], [], []
    return [], [f"The judge agrees with the human labels: {where}, {said} (bars: {bars})."], []


def _band(results: Sequence[JudgedQuery], scale: Scale) -> BandCheck | None:
    """The LLM's labels on the band against the reranker's score of the same passages."""
    scores, labels = [], []
    for jq in results:
        for v in jq.verdicts:
            if v.status == "ok" and _asked_llm(v) and jq.rerank_scores:
                score = jq.rerank_scores.get(v.passage_id)
                if score is not None:
                    scores.append(score)
                    labels.append(_relevant(scale, v.grade))
    if not scores:
        return None
    auc = roc_auc(scores, labels) if len(scores) >= MIN_BAND else None
    return BandCheck(n=len(scores), relevant=sum(labels), auc=auc)


def _unclipped(results: Sequence[JudgedQuery]) -> list[str]:
    """A sentence when reranker scores fall outside [0, 1] (raw logits): what reads them as a
    probability (a cascade's P(relevant), the soft and ``rerank_*`` metrics) clips them."""
    scores = [s for jq in results if jq.rerank_scores for s in jq.rerank_scores.values()]
    outside = [s for s in scores if not 0.0 <= s <= 1.0]
    if not outside:
        return []
    return [
        f"{len(outside)} of {len(scores)} reranker scores fall outside [0, 1] (from "
        f"{min(scores):.3g} to {max(scores):.3g}): read as probabilities (P(relevant) of its "
        "labels, the soft and rerank_* metrics) they are clipped to [0, 1]. A reranker giving "
        "raw logits should be asked for normalised scores (TEI: raw_scores = false)."
    ]


def _sources_sentences(ok: int, sources: dict[str, int], band: BandCheck | None) -> list[str]:
    """Who decided the labels of a run with reranker verdicts, and the LLM on the band."""
    scorer, llm = sources["reranker"], sources["llm"]
    if not scorer:
        return []
    if not llm:
        return [f"{scorer} of {ok} labels came from the reranker's score; no LLM was asked."]
    out = [
        f"Labels: {scorer} of {ok} ({_share(scorer, ok)}) from the reranker's score, {llm} "
        f"({_share(llm, ok)}) from the LLM judge on the band."
    ]
    if band is not None and band.auc is not None:
        out.append(
            f"On the band the LLM's labels follow the reranker's score at AUC {band.auc:.2f} "
            f"over {band.n} passages ({band.relevant} called relevant; 0.5 is no relation to "
            "the score)."
        )
    elif band is not None:
        out.append(
            f"Too few band passages with a label each way ({band.n}, {band.relevant} called "
            f"relevant) to measure the LLM against the reranker's score (at least {MIN_BAND})."
        )
    return out


def _language(
    results: Sequence[JudgedQuery],
    language: str | None,
    served: tuple[str, ...] | None,
    served_by: str | None,
) -> LanguageCheck | None:
    """The run's distinct passages, how many are Chinese, and what the model serves."""
    seen: dict[tuple[str, str], str] = {}
    texts: list[str] = []
    for jq in results:
        for p in jq.query.passages:
            key = (jq.query.query_id, p.id)
            if key not in seen:
                seen[key] = language_of(jq.query.query, p.text)
                texts.append(p.text)
    if not seen:
        return None
    chinese = sum(found == "zh" for found in seen.values())
    # Neither English nor Chinese, over an even sample (the check reads every word).
    latin = [t for found, t in zip(seen.values(), texts, strict=True) if found == "en"]
    sample = latin[:: max(1, -(-len(latin) // OTHER_CHECKED))]
    return LanguageCheck(
        language=language,
        passages=len(seen),
        chinese=chinese,
        served=served,
        served_by=served_by,
        other=sum(map(other_language, sample)),
        checked=len(sample),
    )


def _names(codes: Iterable[str]) -> str:
    return " and ".join(LANGUAGES.get(c, c) for c in codes)


def _language_sentences(check: LanguageCheck, llm: int) -> tuple[list[str], list[str], list[str]]:
    """(problems, findings, notes) about the language judged and whether the model serves it."""
    n, zh, other = check.passages, check.chinese, check.others()
    counts = {"en": n - zh - other, "zh": zh, "other": other}  # a tie goes to English
    main = max(counts, key=lambda code: counts[code])
    set_to = f'; [judge] language "{check.language}"' if check.language else ""
    who = check.served_by or "the judge's model"
    serves = f"; {who} serves {_names(check.served)}" if check.served else ""
    neither = (
        f", {check.other} of {check.checked} checked in neither English nor Chinese"
        if check.other
        else ""
    )
    findings = [
        f"Language: {zh} of {n} passages detected as Chinese ({_share(zh, n)}){neither}, the "
        f"rest taken as English{set_to}{serves}."
    ]
    problems: list[str] = []
    notes: list[str] = []
    for code, count in counts.items():
        if check.served is None or code in check.served or not count:
            continue
        name = LANGUAGES[code]
        if code == main:
            problems.append(
                f"{count} of the {n} passages ({_share(count, n)}) are {name}, which {who} does "
                f"not serve (it serves {_names(check.served)}): the metrics are not informative. "
                f"Use a judge that serves {'their language' if code == 'other' else name}."
            )
        elif count >= SOME_SHARE * n:
            notes.append(
                f"{count} of the {n} passages ({_share(count, n)}) are {name}, which {who} does "
                "not serve: its labels on them are not informative."
            )
    if llm and check.language in LANGUAGES and check.language != main:
        notes.append(
            f'[judge] language is "{check.language}" but most passages are '
            f"{LANGUAGES[main]}: the LLM was asked in {LANGUAGES[check.language]}."
        )
    return problems, findings, notes


def _distribution_notes(overall: HealthStats, engines: dict[str, HealthStats]) -> list[str]:
    notes = list(overall.notes)
    if not overall.degenerate:
        # One engine saturated: the judge may be right about it; worth saying, not failing.
        notes += [
            f"{problem[:-1]} (over all engines the judge is not degenerate)."
            for stats in engines.values()
            for problem in stats.problems
        ]
    return notes


def _caveats(llm: str | None, decided: int, ok: int) -> list[str]:
    """What was measured elsewhere about the LLM judge, when it decided labels here."""
    if llm != "embedded" or not decided:
        return []
    return [
        f"The embedded 0.5B LLM decided {decided} of {ok} labels here ({_share(decided, ok)}); "
        f"{EMBEDDED_LLM_CAVEAT}."
    ]


def judge_health(
    results: Sequence[JudgedQuery],
    scale: Scale,
    *,
    llm: str | None = None,
    language: str | None = None,
    served: tuple[str, ...] | None = None,
    served_by: str | None = None,
) -> JudgeHealth:
    """What ``results`` (every repeat) show about the judge, per engine and over all engines.

    ``llm``: the provider kind of the LLM judge, if any (its dev-set caveat, if one is known,
    is said when it decided labels). ``language``: ``[judge] language``. ``served``: the
    languages the model that decided most labels serves (None: not known, nothing is said),
    named ``served_by`` in the sentences.
    """
    overall = _stats(ok := _ok(results), scale, None)
    engines = {
        engine: _stats(_ok(jq for jq in results if jq.query.engine == engine), scale, engine)
        for engine in sorted({jq.query.engine for jq in results})
    }
    if not ok:  # nothing answered: nothing to tell the judge's health by
        note = f"unknown: no verdict was answered ({_unanswered(results)})"
        return JudgeHealth(
            known=False,
            degenerate=False,
            problems=(),
            notes=(note,),
            overall=overall,
            engines=engines,
        )
    sources = _sources(ok)
    problems, notes = list(overall.problems), _distribution_notes(overall, engines)
    findings: list[str] = []
    human = _human(results, scale)
    if human is not None:
        more = _human_sentences(human, scale)
        problems, findings, notes = problems + more[0], findings + more[1], notes + more[2]
    band = _band(results, scale) if sources["reranker"] else None
    findings += _sources_sentences(len(ok), sources, band) + _unclipped(results)
    checked = _language(results, language, served, served_by)
    if checked is not None:
        more = _language_sentences(checked, sources["llm"])
        problems, findings, notes = problems + more[0], findings + more[1], notes + more[2]
    caveats = _caveats(llm, sources["llm"], len(ok))
    return JudgeHealth(
        known=True,
        degenerate=bool(problems),
        problems=tuple(problems),
        notes=tuple(notes),
        overall=overall,
        engines=engines,
        findings=tuple(findings),
        caveats=tuple(caveats),
        sources=sources,
        human=human,
        band=band,
        language=checked,
    )
