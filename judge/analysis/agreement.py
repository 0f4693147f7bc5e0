"""How well the judge agrees with human labels, per judgement and by majority vote.

Rows carry human grades in ``Query.labels``. Only ``ok`` verdicts on labelled passages are
compared; ``unparsed`` and ``error`` verdicts are counted as failed, never as "not
relevant". The majority-vote consensus over repeats lives here too because agreement is
reported for it; :mod:`judge.stability` reuses it for tie counts and consensus metrics.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Literal

import numpy as np

from judge.analysis.reliability import cohen_kappa, roc_auc
from judge.errors import InputError
from judge.schema import JudgedQuery, Record, Scale, Usage, Verdict


class AgreementStats(Record):
    """Judge vs human on labelled passages; ``confusion[h][j]`` counts human h, judge j.

    ``kappa``: unweighted Cohen's kappa on grades (on a binary scale, relevant/not).
    ``weighted_kappa``: linear weights ``|g_i - g_j| / (g_max - g_min)`` on grades.
    ``relevance_kappa``/``relevance_accuracy``: both sides cut at the scale's threshold.
    ``auc``: ROC AUC of ``Verdict.probability`` against human relevance (ties count 1/2).
    """

    n: int
    labels: tuple[str, ...]
    confusion: tuple[tuple[int, ...], ...]
    accuracy: float | None
    relevance_accuracy: float | None
    kappa: float | None
    weighted_kappa: float | None
    relevance_kappa: float | None
    n_with_probability: int
    auc: float | None


class Agreement(Record):
    """Agreement with humans, counting each repeat's verdict, and the majority vote."""

    n_failed: int
    per_judgement: AgreementStats
    majority: AgreementStats


def _majority(grades: Sequence[int]) -> tuple[int, bool]:
    """The most frequent grade and whether it tied; a tie keeps the lowest tied grade."""
    counts = Counter(grades)
    top = max(counts.values())
    tied = sorted(g for g, c in counts.items() if c == top)
    return tied[0], len(tied) > 1


def _consensus(passage_id: str, verdicts: Sequence[Verdict]) -> tuple[Verdict, bool]:
    if len(verdicts) == 1 and verdicts[0].grade is not None:
        return _single(passage_id, verdicts[0]), False
    ok = [v for v in verdicts if v.status == "ok" and v.grade is not None]
    rank = min(v.rank for v in verdicts)
    usage = sum((v.usage for v in verdicts), Usage())
    if not ok:
        unparsed = sum(v.status == "unparsed" for v in verdicts)
        status: Literal["unparsed", "error"] = "unparsed" if unparsed else "error"
        note = f"no ok verdict in {len(verdicts)} repeats ({unparsed} unparsed)"
        failed = Verdict(passage_id=passage_id, rank=rank, status=status, error=note, usage=usage)
        return failed, False
    grade, tied = _majority([v.grade for v in ok if v.grade is not None])
    pick = next(v for v in ok if v.grade == grade)
    probs = [v.probability for v in ok if v.probability is not None]
    tally = ", ".join(f"{g} x{c}" for g, c in sorted(Counter(v.grade for v in ok).items()))
    reason = f"majority of {len(ok)} ok verdicts (grade x count: {tally})"
    consensus = Verdict(
        passage_id=passage_id,
        rank=rank,
        status="ok",
        label=pick.label,
        grade=grade,
        relevant=pick.relevant,
        probability=float(np.mean(probs)) if probs else None,
        reason=reason + ("; tie, lower grade kept" if tied else ""),
        usage=usage,
    )
    return consensus, tied


def _single(passage_id: str, verdict: Verdict) -> Verdict:
    """The consensus of one ok verdict (one repeat): what the general case gives, without its
    counting, which a large single-repeat run would pay for every passage."""
    return Verdict(
        passage_id=passage_id,
        rank=verdict.rank,
        status="ok",
        label=verdict.label,
        grade=verdict.grade,
        relevant=verdict.relevant,
        probability=verdict.probability,
        reason=f"majority of 1 ok verdicts (grade x count: {verdict.grade} x1)",
        usage=verdict.usage,
    )


def consensus_votes(results: Sequence[JudgedQuery]) -> tuple[list[JudgedQuery], int]:
    """One consensus row per (query, engine) in first-seen order, and the number of ties.

    Each passage gets the most frequent grade among its ok verdicts; a tie keeps the lowest
    tied grade (on a binary scale: not relevant) and says so in ``Verdict.reason``. The
    probability is the mean of the ok verdicts' probabilities. A passage with no ok verdict
    stays ``unparsed`` (or ``error``). ``repeat`` is 0 and ``metrics`` is empty.
    """
    groups: dict[tuple[str, str], list[JudgedQuery]] = defaultdict(list)
    for row in results:
        groups[row.query.key].append(row)
    voted: list[JudgedQuery] = []
    ties = 0
    for rows in groups.values():
        per_passage: dict[str, list[Verdict]] = defaultdict(list)
        for row in sorted(rows, key=lambda r: r.repeat):
            for verdict in row.verdicts:
                per_passage[verdict.passage_id].append(verdict)
        verdicts: list[Verdict] = []
        for passage_id, seen in per_passage.items():
            consensus, tied = _consensus(passage_id, seen)
            verdicts.append(consensus)
            ties += tied
        voted.append(
            JudgedQuery(
                query=rows[0].query,
                repeat=0,
                scale=rows[0].scale,
                verdicts=tuple(sorted(verdicts, key=lambda v: v.rank)),
                metrics={},
                usage=sum((row.usage for row in rows), Usage()),
            )
        )
    return voted, ties


def _labelled(
    rows: Sequence[JudgedQuery], scale: Scale
) -> tuple[list[int], list[int], list[float], int]:
    """(human grade, judge grade, probability or NaN) for ok verdicts on labelled passages."""
    human: list[int] = []
    judged: list[int] = []
    probs: list[float] = []
    failed = 0
    grades = {label.grade for label in scale.labels}
    for row in rows:
        labels = row.query.labels or {}
        for verdict in row.verdicts:
            truth = labels.get(verdict.passage_id)
            if truth is None:
                continue
            if truth not in grades:
                raise InputError(
                    f"query '{row.query.query_id}': human grade {truth} for passage "
                    f"'{verdict.passage_id}' is not on scale '{scale.name}' "
                    "(set [dataset] label_scale to the scale the labels use)",
                    field="labels",
                )
            if verdict.status != "ok" or verdict.grade is None:
                failed += 1
                continue
            human.append(truth)
            judged.append(verdict.grade)
            probs.append(np.nan if verdict.probability is None else verdict.probability)
    return human, judged, probs, failed


def _agreement_stats(
    human: Sequence[int], judged: Sequence[int], probs: Sequence[float], scale: Scale
) -> AgreementStats:
    grades = sorted(label.grade for label in scale.labels)
    h, j = np.asarray(human, dtype=np.int64), np.asarray(judged, dtype=np.int64)
    confusion = np.zeros((len(grades), len(grades)), dtype=np.int64)
    np.add.at(confusion, (np.searchsorted(grades, h), np.searchsorted(grades, j)), 1)
    h_rel, j_rel = h >= scale.threshold, j >= scale.threshold
    relevance = np.array(
        [
            [np.sum(~h_rel & ~j_rel), np.sum(~h_rel & j_rel)],
            [np.sum(h_rel & ~j_rel), np.sum(h_rel & j_rel)],
        ]
    )
    p = np.asarray(probs, dtype=np.float64)
    has_prob = ~np.isnan(p)
    n = int(h.size)
    return AgreementStats(
        n=n,
        labels=tuple(scale.by_grade(g).name for g in grades),
        confusion=tuple(tuple(int(c) for c in line) for line in confusion),
        accuracy=float(np.mean(h == j)) if n else None,
        relevance_accuracy=float(np.mean(h_rel == j_rel)) if n else None,
        kappa=cohen_kappa(confusion),
        weighted_kappa=cohen_kappa(confusion, values=grades),
        relevance_kappa=cohen_kappa(relevance),
        n_with_probability=int(has_prob.sum()),
        auc=roc_auc(p[has_prob], h_rel[has_prob]),
    )


def human_agreement(
    results: Sequence[JudgedQuery],
    scale: Scale,
    *,
    voted: Sequence[JudgedQuery] | None = None,
) -> Agreement | None:
    """Judge vs human grades (``Query.labels``); None when no judged passage has a label.

    ``per_judgement`` counts every repeat's ok verdict as its own judgement; ``majority``
    uses one :func:`consensus_votes` verdict per passage (pass ``voted`` to reuse rows
    already voted from ``results``). Non-ok verdicts on labelled passages are left out and
    counted in ``n_failed``.
    """
    human, judged, probs, failed = _labelled(results, scale)
    if not human and not failed:
        return None
    consensus = consensus_votes(results)[0] if voted is None else voted
    m_human, m_judged, m_probs, _ = _labelled(consensus, scale)
    return Agreement(
        n_failed=failed,
        per_judgement=_agreement_stats(human, judged, probs, scale),
        majority=_agreement_stats(m_human, m_judged, m_probs, scale),
    )
