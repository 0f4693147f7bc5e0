"""The records that cross module lines: frozen pydantic models, unknown fields rejected.

Passage -> Query (a ranked list from one engine) -> Verdict per passage -> JudgedQuery.
The Scale is the single source of truth for labels: templates render them from it and the
verdict parser accepts exactly those labels (and their aliases), case/space-normalised.

Many records held at once, in less memory: pydantic keeps on every model instance the set of
field names it was given (``__pydantic_fields_set__``): 728 bytes for a set of five names or
more, as much as the record's own values. A run holds a record per passage and per verdict, so
at 100,000 passages these sets alone were about 150 MB. Frozen records never change that set
(pydantic adds to it only on attribute assignment, which a frozen model refuses, and
``model_copy`` copies it before adding), so records whose sets are equal can share one.
:func:`share_fields_sets` makes them do so; nothing else about the records changes
(``model_fields_set``, ``exclude_unset`` dumps and copies behave as before: tests/test_memo.py).
:func:`share_verdict_fields` also gives equal usages one record, and :func:`share_row_fields`
does both for rows read back from a results file (3.4 KB a passage before, 1.3 KB after).
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from judge.aspects import Coverage, Credibility
from judge.errors import ConfigError
from judge.tiers import AuthorityTiers

VerdictStatus = Literal["ok", "unparsed", "error"]
VerdictSource = Literal["judge", "reranker", "empty"]
OmittableParam = Literal[
    "temperature",
    "top_p",
    "max_tokens",
    "seed",
    "stop",
    "logprobs",
    "top_logprobs",
    "response_format",
]
# The provider kinds, one wire protocol (adapter) each. Each has its one entry, with what it
# offers, in judge.providers.ADAPTERS (keyed by this type; a test holds the two in step). It is
# written here, in a shared leaf, because the [provider] table (sections.py) names a kind and a
# leaf imports no stage.
ProviderKind = Literal[
    "openai", "dashscope", "rerank", "embedded", "embedded-rerank", "embedded-fused"
]

# Characters stripped around a label before matching ("Yes.", "**yes**", "「是」").
_LABEL_STRIP = " \t\r\n.,;:!?。，；：！？\"'`*_()[]{}<>「」『』“”‘’"


class Record(BaseModel):
    """Base for every record: immutable, no unknown fields."""

    # defer_build: a record's validator is built when it is first used, not at import: the
    # command loads a hundred records and a run uses some of them (30 ms of its start-up).
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


_SURROGATE = re.compile("[\ud800-\udfff]")


def whole_text(text: str) -> str:
    """``text`` with each lone UTF-16 surrogate (half an emoji a JSON escape gave, say) as
    U+FFFD: such a string cannot be written as UTF-8, to a file or the cache."""
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


# Text from outside that is stored and written: lone surrogates replaced (whole_text).
WholeText = Annotated[str, AfterValidator(whole_text)]


def visible(text: str) -> bool:
    """Whether ``text`` holds a character a reader sees."""
    return any(not ch.isspace() and unicodedata.category(ch) != "Cf" for ch in text)


# Control characters (a terminal obeys ESC sequences; XML forbids most C0), bidirectional
# controls (they reorder the text after them), and what XML 1.0 cannot hold at all (U+FFFE,
# U+FFFF, a lone surrogate), as a reader may see them.
_UNSEEN = re.compile(
    r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]"
)


def _shown(found: re.Match[str]) -> str:
    code = ord(found.group(0))
    return chr(0x2400 + code) if code < 0x20 else "\u2421" if code == 0x7F else "\ufffd"


def printable(text: str) -> str:
    """``text`` with its control characters shown as symbols (ESC as ␛), so printing it can
    drive no terminal, and XML and Markdown carry it: passage text, a model's reason and an
    engine's name come from outside. Tabs and line feeds are kept (a carriage return is shown)."""
    return _UNSEEN.sub(_shown, text) if _UNSEEN.search(text) else text


class Passage(Record):
    """One retrieved passage, in the engine's ranked order."""

    id: str = Field(min_length=1)
    text: str
    title: str | None = None
    url: str | None = None
    score: float | None = None
    truncated_from: int | None = None  # the text's length before a cut to a limit
    removed: tuple[str, ...] = ()  # text aimed at the judge, taken out (judging/sanitise.py)
    aimed: tuple[str, ...] = ()  # text aimed at the judge, found and left in (sanitise = "flag")

    @property
    def blank(self) -> bool:
        """Nothing to read: no text or title but white space and invisible format characters
        (zero-width spaces, a BOM). Judged not relevant without asking (judging/verdicts.py)."""
        return not (visible(self.text) or (self.title is not None and visible(self.title)))


class Query(Record):
    """One query and what one engine returned for it, best first."""

    query_id: str = Field(min_length=1)
    query: str = Field(min_length=1)
    engine: str = "default"
    passages: tuple[Passage, ...] = ()
    expected_ids: tuple[str, ...] | None = None
    expected_texts: tuple[str, ...] | None = None
    # Human relevance grades per passage id (on the run's scale), for agreement checks.
    labels: dict[str, int] | None = None
    # Where the row came from ("file:line"), for error messages downstream.
    source: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.query_id, self.engine)


_SPACES = re.compile(r"\s+")


def normalise_label(text: str) -> str:
    """Case-fold, NFKC-normalise, collapse inner spaces and strip punctuation around a label."""
    text = unicodedata.normalize("NFKC", text).strip(_LABEL_STRIP).casefold()
    return _SPACES.sub(" ", text)


class ScaleLabel(Record):
    """One point on a scale: the label the judge writes, its grade, and what it means."""

    name: str = Field(min_length=1)
    grade: int = Field(ge=0)
    description: str = ""
    # The description in other prompt languages, e.g. {"zh": "..."}; English is ``description``.
    descriptions: dict[str, str] = Field(default_factory=dict)
    aliases: tuple[str, ...] = ()

    def describe(self, language: str) -> str:
        """The description in ``language``, falling back to the English one."""
        return self.descriptions.get(language, self.description)


# One label of a scale made by ``Scale.ordered``: its name, its description in English and in
# Chinese, and its aliases.
LabelText = tuple[str, str, str, tuple[str, ...]]


class Scale(Record):
    """An ordered set of labels; grade >= ``threshold`` counts as relevant."""

    name: str
    labels: tuple[ScaleLabel, ...] = Field(min_length=2)
    threshold: int = Field(ge=1)

    @model_validator(mode="after")
    def _check(self) -> Scale:
        grades = [label.grade for label in self.labels]
        if len(set(grades)) != len(grades):
            raise ValueError(f"scale '{self.name}': grades must be distinct, got {grades}")
        if min(grades) != 0:
            raise ValueError(f"scale '{self.name}': the lowest grade must be 0")
        if not min(grades) < self.threshold <= max(grades):
            raise ValueError(
                f"scale '{self.name}': threshold {self.threshold} must be in 1..{max(grades)}"
            )
        seen: dict[str, str] = {}
        for label in self.labels:
            for form in (label.name, *label.aliases):
                norm = normalise_label(form)
                if norm in seen and seen[norm] != label.name:
                    raise ValueError(
                        f"scale '{self.name}': '{form}' names both "
                        f"'{seen[norm]}' and '{label.name}'"
                    )
                seen[norm] = label.name
        return self

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Scale:
        """A copy, its label forms made anew (a copy with other labels has other forms)."""
        copy = super().model_copy(update=update, deep=deep)
        copy.__dict__.pop("forms", None)
        return copy

    @functools.cached_property
    def forms(self) -> tuple[tuple[str, ScaleLabel], ...]:
        """Each label's name and aliases, normalised (``normalise_label``), with the label:
        made once a scale, as every answer's label is looked up in them."""
        return tuple(
            (normalise_label(form), label)
            for label in self.labels
            for form in (label.name, *label.aliases)
        )

    @property
    def max_grade(self) -> int:
        return max(label.grade for label in self.labels)

    @property
    def is_binary(self) -> bool:
        return len(self.labels) == 2

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(label.name for label in self.labels)

    def by_grade(self, grade: int) -> ScaleLabel:
        for label in self.labels:
            if label.grade == grade:
                return label
        raise KeyError(f"scale '{self.name}' has no grade {grade}")

    def snap(self, text: str | int | bool) -> ScaleLabel | None:
        """The label ``text`` names (by name, alias or grade number), or None if off-scale."""
        if isinstance(text, bool):
            text = "yes" if text else "no"
        if isinstance(text, int):
            return next((lab for lab in self.labels if lab.grade == text), None)
        norm = normalise_label(text)
        for form, label in self.forms:
            if norm == form:
                return label
        if norm.isdigit():
            return self.snap(int(norm))
        head, paren, gloss = norm.partition("(")
        if paren and head.strip():  # a label with its gloss, as the prompt shows: "yes（是）"
            said, glossed = self.snap(head), self.snap(gloss)
            return said if glossed is None or glossed == said else None
        return None

    def relevant(self, grade: int) -> bool:
        return grade >= self.threshold

    def normalised(self, grade: int) -> float:
        return grade / self.max_grade

    @classmethod
    def named(cls, name: str) -> Scale:
        """A built-in scale by name (a config's custom scales: ``RunConfig.scale()``)."""
        if name not in BUILTIN_SCALES:
            raise ConfigError(
                f"scale '{name}' is not a built-in scale ({', '.join(sorted(BUILTIN_SCALES))}); "
                "a custom scale needs the config that defines it under [scales]"
            )
        return BUILTIN_SCALES[name]()

    @classmethod
    def ordered(cls, name: str, threshold: int, *labels: LabelText) -> Scale:
        """A scale of ``labels`` graded 0, 1, ... in the order given, each as (name, description,
        its Chinese, aliases): the built-in scales and those of the judge's other questions."""
        return cls(
            name=name,
            threshold=threshold,
            labels=tuple(
                ScaleLabel(
                    name=label,
                    grade=grade,
                    description=english,
                    descriptions={"zh": chinese},
                    aliases=aliases,
                )
                for grade, (label, english, chinese, aliases) in enumerate(labels)
            ),
        )

    @classmethod
    def binary(cls) -> Scale:
        return cls.ordered(
            "binary",
            1,
            (
                "no",
                "the passage does not help answer the query",
                "这段文本对回答查询没有帮助",
                ("not relevant", "irrelevant", "false", "否", "不", "不是", "不相关", "无关"),
            ),
            (
                "yes",
                "the passage helps answer the query",
                "这段文本有助于回答查询",
                ("relevant", "true", "是", "是的", "相关"),
            ),
        )

    @classmethod
    def graded(cls) -> Scale:
        return cls.ordered(
            "graded",
            2,
            ("unrelated", "unrelated to the query", "与查询无关", ("irrelevant", "不相关", "无关")),
            (
                "related",
                "on the query's topic but does not answer it",
                "与查询主题相关，但没有回答查询",
                ("related but does not answer", "相关但未回答"),
            ),
            (
                "partial",
                "answers the query partly or unclearly",
                "部分地或不够清楚地回答了查询",
                ("partially relevant", "partly", "部分回答"),
            ),
            (
                "answers",
                "dedicated to the query and contains the exact answer",
                "专门针对该查询，并包含确切答案",
                ("highly relevant", "perfect", "完全回答"),
            ),
        )


BUILTIN_SCALES = {"binary": Scale.binary, "graded": Scale.graded}


class Usage(Record):
    """Tokens one call (or a sum of calls) used."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
        )


class Verdict(Record):
    """The judge's answer about one passage.

    ``status`` is ``ok`` only when a label on the scale was read; ``unparsed`` keeps the raw
    text, ``error`` the provider failure. Neither ever counts as "not relevant". ``source``:
    ``reranker`` for a judge cascade's passages outside its band (judging/cascade.py).
    """

    passage_id: str
    rank: int = Field(ge=1)
    status: VerdictStatus
    label: str | None = None
    grade: int | None = None
    relevant: bool | None = None
    probability: float | None = Field(default=None, ge=0.0, le=1.0)
    # A graded judge with logprobs: E[g] = sum_l P(l) * grade_l over the scale's labels, the
    # grade ``[metrics] grade_cuts`` cut (judge.metrics.cuts). None on binary scales.
    expected_grade: float | None = Field(default=None, ge=0.0)
    reason: str | None = None
    raw: str | None = None
    error: str | None = None
    attempts: int = Field(default=1, ge=0)
    usage: Usage = Usage()
    latency_s: float = 0.0
    cached: bool = False
    # Who gave the label: the LLM judge, the reranker of a judge cascade (judging/cascade.py),
    # or nobody: an empty passage (judging/verdicts.py empty_verdict).
    source: VerdictSource = "judge"
    # What fired on the passage: "echo" (its relevance to the reranker rested on the query's
    # own words, judging/echo.py), "aimed" (it holds text aimed at the judge, left in place),
    # "sanitised" (text aimed at the judge was taken out of it; judging/sanitise.py).
    signals: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> Verdict:
        if self.status == "ok" and (self.grade is None or self.label is None):
            raise ValueError("an ok verdict needs a label and a grade")
        if self.status != "ok" and self.grade is not None:
            raise ValueError("only an ok verdict carries a grade")
        return self


class JudgedQuery(Record):
    """One query's verdicts for one repeat, and the metrics computed from them."""

    query: Query
    repeat: int = Field(ge=0)
    scale: str
    verdicts: tuple[Verdict, ...]
    # Canonical metric name -> value; None when undefined (e.g. nothing relevant for AP).
    metrics: dict[str, float | None]
    usage: Usage = Usage()
    # Per-passage scores in [0, 1] from a rerank provider, when one is configured.
    rerank_scores: dict[str, float] | None = None
    # Nugget support and source credibility, when those dimensions are on (judge/aspects.py).
    coverage: Coverage | None = None
    credibility: tuple[Credibility, ...] | None = None
    # A digest of the dataset row it was judged from (data/results.py input_digest), so a
    # rerun into the same directory judges a unit again when its row has changed since.
    input_digest: str | None = None

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.query.query_id, self.query.engine, self.repeat)


# Body fields that bound an answer's completion tokens, by the servers that read them.
_COMPLETION_LIMITS = ("max_tokens", "max_completion_tokens", "max_new_tokens", "max_output_tokens")


class SamplingParams(Record):
    """Everything besides the messages that changes the answer (all part of the cache key)."""

    temperature: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, allow_inf_nan=False)
    max_tokens: int | None = Field(default=512, ge=1)
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # "json_object", "json_schema" or None (plain text).
    response_format: Literal["json_object", "json_schema"] | None = None
    json_schema: dict[str, Any] | None = None
    stop: tuple[str, ...] | None = None
    # Provider-specific body fields (e.g. {"enable_thinking": false}); passed through verbatim.
    extra_body: dict[str, Any] = Field(default_factory=dict)
    # Request fields never to send, e.g. ["temperature", "max_tokens"] for reasoning models
    # that accept only their defaults (put "max_completion_tokens" in extra_body instead).
    omit: tuple[OmittableParam, ...] = ()

    def completion_limit(self, extra_body: Mapping[str, Any] | None = None) -> int | None:
        """The most completion tokens an answer to a request with these params can hold, as
        sent: ``max_tokens`` unless omitted, and any limit in an extra body (a provider's
        ``extra_body``, then these params'): ``max_tokens``, ``max_completion_tokens``,
        ``max_new_tokens``, ``max_output_tokens``; the largest when several are sent (the
        server may honour any). None when nothing bounds it: a budget then reserves its own
        generous bound (judge.calling.limits.UNBOUNDED_COMPLETION)."""
        said = [] if "max_tokens" in self.omit or self.max_tokens is None else [self.max_tokens]
        for body in (extra_body or {}, self.extra_body):
            said += [
                int(v)
                for key in _COMPLETION_LIMITS
                if isinstance(v := body.get(key), int | float) and not isinstance(v, bool)
            ]
        return max(said) if said else None

    @field_validator("extra_body", "json_schema")
    @classmethod
    def _finite(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        """JSON has no NaN or infinity: a request carrying one could never be sent."""
        if value is not None and (where := _not_finite(value)):
            raise ValueError(f"{where} is not a finite number: JSON cannot carry it")
        return value


def _not_finite(value: Any, path: str = "") -> str | None:
    """The path of the first NaN or infinity in ``value`` (None: there is none)."""
    if isinstance(value, float) and not math.isfinite(value):
        return path or "a value"
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list | tuple)
        else ()
    )
    for key, inner in items:
        if found := _not_finite(inner, f"{path}.{key}" if path else str(key)):
            return found
    return None


Gain = Literal["linear", "exponential"]
Unjudged = Literal["undefined", "skip"]
UndefinedAP = Literal["nan", "zero"]

DEFAULT_METRICS: tuple[str, ...] = (
    "relevancy_mean",
    "relevancy_max",
    "ap",
    "ndcg",
    "ndcg@5",
    "precision@5",
    "hit@5",
    "mrr",
    "rerank_max",
)


class MetricPolicy(Record):
    """How verdicts become metrics: the ``[metrics]`` table, passed whole to every stage.

    ``gain``: NDCG gain, linear ``rel`` or exponential ``2^rel - 1``. ``unjudged``: a query
    with an unparsed or error verdict has undefined metrics (``undefined``) or is scored on
    its judged passages only (``skip``). ``undefined_ap``: AP when nothing relevant was
    retrieved is undefined (``nan``) or 0 (``zero``). ``relevance_threshold`` and
    ``grade_cuts``: see below.
    """

    names: tuple[str, ...] = DEFAULT_METRICS
    # The metric the report's verdict sentence compares engines on; None: the first rank
    # metric among ``names`` (ndcg@10 when asked for; judge.report.compared.primary_metric).
    primary: str | None = None
    gain: Gain = "linear"
    unjudged: Unjudged = "undefined"
    undefined_ap: UndefinedAP = "nan"
    # Binary scales: relevant when P(relevant) >= this, instead of the arg-max label (which is
    # a cut at 0.5). ``judge calibrate`` chooses it from human labels. None: the label.
    relevance_threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    # Graded scales: cut points c_1 < ... < c_G on a verdict's expected grade, one between each
    # two grades; its grade is the j-th lowest, j = #{i: c_i <= E[g]} (judge.metrics.cuts), and
    # it is relevant at the scale's threshold. ``judge calibrate`` chooses them. None: the label.
    grade_cuts: tuple[float, ...] | None = None
    authority: AuthorityTiers = AuthorityTiers()  # [metrics.authority]: judge/tiers.py

    @field_validator("names")
    @classmethod
    def _each_once(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:  # every analysis keys its metrics by name: a second one is a second column
            raise ValueError(f"each metric once: {', '.join(twice)} named more than once")
        return names

    @field_validator("grade_cuts")
    @classmethod
    def _increasing(cls, cuts: tuple[float, ...] | None) -> tuple[float, ...] | None:
        steps = itertools.pairwise(cuts or ())
        if cuts is not None and (
            not all(math.isfinite(c) for c in cuts) or any(a >= b for a, b in steps)
        ):
            raise ValueError(f"must be finite and strictly increasing, got {list(cuts)}")
        return cuts

    def check_scale(self, scale: Scale, source: str | None = None) -> None:
        """ConfigError (one line naming the key) unless ``grade_cuts`` fits ``scale``: a graded
        scale (a binary one takes ``relevance_threshold``), one cut between each two grades."""
        cuts, where = self.grade_cuts, f"{source}: " if source else ""
        if cuts is None:
            return
        if scale.is_binary:
            raise ConfigError(
                f"{where}metrics.grade_cuts needs a graded scale, not the binary '{scale.name}' "
                "(a binary judge takes metrics.relevance_threshold)"
            )
        if len(cuts) != len(scale.labels) - 1:
            raise ConfigError(
                f"{where}metrics.grade_cuts: scale '{scale.name}' has {len(scale.labels)} "
                f"grades, so {len(scale.labels) - 1} cut points, not {len(cuts)}"
            )

    def unlike(self, other: MetricPolicy, metrics: Iterable[str]) -> list[str]:
        """The settings that make this policy's values of ``metrics`` differ from ``other``'s
        for the same verdicts, each as "key: ours vs theirs"."""
        bases = {name.split("@")[0] for name in metrics}
        return [
            f"{key}: {getattr(self, key)} vs {getattr(other, key)}"
            for key, moves in _VALUE_SETTINGS.items()
            if getattr(self, key) != getattr(other, key) and any(map(moves, bases))
        ]


# The [metrics] settings that change a metric's value for the same verdicts, each with the
# metric bases it moves: gain the NDCGs, undefined_ap the APs, the tiers the source
# metrics, and how verdicts become grades every metric read from verdicts (all but a few
# source ones and counts).
_FROM_VERDICTS: Callable[[str], bool] = lambda base: base not in {"near_dup", "sites"}  # noqa: E731
_VALUE_SETTINGS: dict[str, Callable[[str], bool]] = {
    "gain": lambda base: "ndcg" in base,
    "undefined_ap": lambda base: base.endswith("ap"),
    "authority": lambda base: base in {"authority", "low_quality"},
    "unjudged": _FROM_VERDICTS,
    "relevance_threshold": _FROM_VERDICTS,
    "grade_cuts": _FROM_VERDICTS,
}


# Per record class, the fields sets shared so far (a class sees a handful of distinct ones).
_SHARED: dict[type[BaseModel], list[set[str]]] = {}


def share_fields_sets(records: Iterable[BaseModel]) -> None:
    """Let each of ``records`` (frozen models) share its fields set with equal ones."""
    for record in records:
        cls = type(record)
        if not cls.model_config.get("frozen"):
            raise TypeError(f"{cls.__name__} is not frozen: its fields set may change")
        own = record.__pydantic_fields_set__
        known = _SHARED.setdefault(cls, [])
        for shared in known:
            if shared == own:
                object.__setattr__(record, "__pydantic_fields_set__", shared)
                break
        else:
            known.append(own)


# Equal usages, one record each (a run's verdicts use a few hundred distinct token counts).
_USAGES: dict[tuple[int, int], Usage] = {}
_USAGES_KEPT = 65_536  # a bound on the table, never reached by counts of one run's prompts


def share_verdict_fields(verdicts: Iterable[Verdict]) -> None:
    """:func:`share_fields_sets` for verdicts, and one record for equal usages: a run holds
    all of them, and a usage is 280 bytes, a fifth of a verdict's (usages are frozen too)."""
    verdicts = list(verdicts)
    share_fields_sets(verdicts)
    for v in verdicts:
        key = (v.usage.prompt_tokens, v.usage.completion_tokens)
        shared = _USAGES.get(key)
        if shared is None:
            if len(_USAGES) >= _USAGES_KEPT:
                _USAGES.clear()
            share_fields_sets((v.usage,))
            shared = _USAGES[key] = v.usage
        object.__setattr__(v, "usage", shared)


def share_row_fields(row: JudgedQuery) -> None:
    """What a run does for the rows it judges (:func:`share_verdict_fields`, and the query's
    and passages' fields sets), for a row read back from a results file."""
    share_fields_sets((row, row.query, *row.query.passages))
    share_verdict_fields(row.verdicts)
