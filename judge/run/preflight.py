"""Everything that can be checked before the first paid call, in one pass.

``judge run`` calls :func:`preflight` after reading the dataset and before building a provider
or sending anything; ``judge validate CONFIG DATASET`` calls the same function. Each problem is
one line naming file, line and field; all of them are reported together (exit 2), so a user
fixes a file once, not once per problem.

Checked: the dataset (read strictly by :mod:`judge.data.datasets`), human labels against the
scale they are on, ids the outputs must carry (TREC files split on whitespace), the provider
URLs and the price a dollar budget needs, metric names (and those the thresholds name), template
and output paths, and what a judge cascade needs (a reranker; human labels for a ``max_error``
band); with the report stage's own checks (``later``): the run history and the regression
baseline when drop thresholds are set.
"""

from __future__ import annotations

import logging
import math
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from judge.calling.cache import open_cache
from judge.calling.cache_file import NotACache, check_sqlite
from judge.calling.limits import Limits
from judge.config import RunConfig
from judge.data.nuggets import given_sets
from judge.errors import ConfigError, InputError, JudgeError, TemplateError
from judge.judging.cascade import label_problem
from judge.judging.context import (
    DEFAULT_ANSWER_TOKENS,
    MIN_PASSAGE_TOKENS,
    PROMPT_ALLOWANCE,
    context_room,
    preset_context,
    query_tokens,
)
from judge.judging.judge import Judge
from judge.judging.relevance import window_size
from judge.metrics.facts import family_of, metric_of, parse_metric_name
from judge.providers import ADAPTERS, judges_by_score, planning_only, resolve_spec
from judge.providers.base import read_api_key
from judge.schema import Query

log = logging.getLogger(__name__)

MAX_SHOWN = 20
# A later stage's checks (see :func:`preflight`): (config, queries, first night) -> problems.
Later = Callable[[RunConfig, Sequence[Query], bool, Path | None], list[str]]


def preflight(
    config: RunConfig,
    queries: Sequence[Query],
    out_dir: Path | None,
    *,
    first_night: bool,
    later: Later | None = None,
) -> None:
    """Raise one ConfigError / InputError listing every problem; return when there is none.

    ``out_dir`` None skips the writable-directory check (``judge validate`` without a run).
    ``later``: the checks of the stages after this one, which a run meets only once it is
    paid for (the run history, the regression baseline, the files it writes into the run
    directory: judge/report/checks.py
    ``report_problems``), given by the command that runs them all; their problems are listed
    with these.
    """
    problems: list[str] = []
    problems += _config_problems(config)
    if out_dir is not None:
        problems += _writable(out_dir, "the run directory (--out)")
    if later is not None:
        problems += later(config, queries, first_night, out_dir)
    problems += _cascade_problems(config, queries)
    problems += _context_problems(config, queries)
    problems += _template_problems(config, queries)
    problems += _nugget_problems(config, queries, out_dir)
    rows = _row_problems(config, queries)
    _say_disagreements(queries)
    if not problems and not rows:
        return
    lines = [*problems, *rows]
    shown = lines[:MAX_SHOWN]
    more = f"\n  ... and {len(lines) - MAX_SHOWN} more" if len(lines) > MAX_SHOWN else ""
    text = f"{len(lines)} problem(s) found before any call was made:" + "".join(
        f"\n  {line}" for line in shown
    )
    if len(lines) == 1:  # one problem, one line
        text = f"{lines[0]} (found before any call was made)"
    raise (InputError if rows and not problems else ConfigError)(text + more)


_PATH_KEYS = ("run.cache", "run.history")


def _config_problems(config: RunConfig) -> list[str]:
    where = config.source or "<config>"
    problems: list[str] = []
    specs = [("provider", config.judge.provider, config.provider.overrides())]
    if config.rerank is not None:
        specs.append(("rerank", config.rerank.provider, config.rerank.overrides()))
    for table, name, overrides in specs:
        try:
            spec = resolve_spec(name, overrides)
            ADAPTERS[spec.kind].check_options(spec)  # what building it would refuse
            read_api_key(spec)  # under planning_only: no key needed
        except JudgeError as exc:
            problems.append(f"{where}: [{table}]: {exc}")
    try:
        Limits.from_config(config)
    except ConfigError as exc:
        problems.append(str(exc))
    if config.prices and config.price() is None:
        # Not an error (no budget needs it), but the likely typo is worth a line before paying.
        log.warning(
            "%s: [prices] has no entry for the model '%s' (it has: %s); cost will be unknown",
            where,
            config.judge.model,
            ", ".join(sorted(config.prices)),
        )
    if config.judge.template_dir and not Path(config.judge.template_dir).is_dir():
        problems.append(
            f"{where}: judge.template_dir: '{config.judge.template_dir}' is not a directory"
        )
    # A path the command line gave (--cache, --set run.cache=...) is not the file's to blame.
    said = {k: "the command line" if k in config.overrides else where for k in _PATH_KEYS}
    for key, path in (("run.cache", config.cache_path()), ("run.history", config.history_path())):
        problems += [f"{said[key]}: {key}: {p}" for p in _writable(path.parent, str(path))]
        if path.is_dir():  # what the run would fail on, after paying (judge validate too)
            problems.append(f"{said[key]}: {key}: {path} is a directory, not a file")
        else:  # a file there that cannot be written fails the first answer's keeping
            problems += [f"{said[key]}: {key}: {p}" for p in _read_only(path)]
    try:  # a run would refuse it when it opens the cache; validate says so too
        check_sqlite(config.cache_path())
    except NotACache as exc:
        problems.append(f"{said['run.cache']}: run.cache: {exc}")
    if config.cache_path().resolve() == config.history_path().resolve():
        problems.append(f"{where}: run.cache and run.history are one file: give each its own")
    try:
        config.comparable_label_scale()
    except ConfigError as exc:
        problems.append(str(exc))
    for name in config.metrics.names:  # a misspelt metric is found before, not after, paying
        try:
            parse_metric_name(name)
        except ConfigError as exc:
            problems.append(f"{where}: metrics.names: {exc}")
    return problems + _threshold_problems(config)


def _threshold_problems(config: RunConfig) -> list[str]:
    """A bound or drop on a metric the run does not compute could only be "not evaluated"
    (or skipped) once the run is paid for: a misspelt or missing name is found here."""
    where, th = config.source or "<config>", config.thresholds
    computed = config.metric_names()
    problems: list[str] = []
    for key, table in (("min", th.min), ("max", th.max), ("max_drop", th.max_drop)):
        for name in table:
            try:
                parse_metric_name(name)
            except ConfigError as exc:
                problems.append(f"{where}: thresholds.{key}: {exc}")
                continue
            if name not in computed:
                problems.append(
                    f"{where}: thresholds.{key}: '{name}' is not a metric this run computes "
                    f"(add it to [metrics] names; computed: {', '.join(computed)})"
                )
            elif why := _unmeetable(name, table[name], key) or _no_probabilities(config, name):
                problems.append(f"{where}: thresholds.{key}.{name}: {table[name]} {why}")
    for name in th.min.keys() & th.max.keys():
        if th.min[name] > th.max[name]:
            problems.append(
                f"{where}: thresholds: {name} must be at least {th.min[name]} and at most "
                f"{th.max[name]}: no run can pass"
            )
    return problems


def _unmeetable(name: str, limit: float, key: str) -> str | None:
    """Why a bound on ``name`` could never be evaluated as the user meant (None: it can):
    not a number, or outside the [0, 1] the metric's values lie in (a bound of 1.5 would fail
    every run after paying for it, a max_drop below 0 every run that does not improve)."""
    if not math.isfinite(limit):
        return "is not a finite number"
    metric = metric_of(name)
    if key == "max_drop":
        if limit < 0:
            return "is below 0: a drop is how far a metric may fall, 0 or more"
        return None
    if metric is not None and metric.unit and not 0 <= limit <= 1:
        return f"is outside [0, 1], where every value of {name} lies: no run could pass"
    return None


def _no_probabilities(config: RunConfig, name: str) -> str | None:
    """Why a threshold on a metric read from P(relevant) (soft_*; rerank_* without [rerank])
    could never be evaluated: a judge asked for no logprobs has none, so the metric is
    undefined for every query and the run, paid in full, fails on it (None: it can be)."""
    family = family_of(name)
    if family not in ("soft", "rerank") or (family == "rerank" and config.rerank is not None):
        return None
    try:
        spec = resolve_spec(config.judge.provider, config.provider.overrides())
    except JudgeError:
        return None  # an unknown provider is reported with the config problems
    params = config.judge.params
    if judges_by_score(spec) or (
        params.logprobs and "logprobs" not in params.omit and spec.supports_logprobs
    ):
        return None
    return (
        f"can never be evaluated: {name} is read from the judge's P(relevant), which it gives "
        "with logprobs only (set [judge.params] logprobs = true, on a provider that returns "
        "them)" + ("" if family == "soft" else ", or a [rerank] provider's scores")
    )


def _cascade_problems(config: RunConfig, queries: Sequence[Query]) -> list[str]:
    """A cascade needs a reranker, and a max_error band enough human labels; a judge by score
    takes neither a band nor a second reranker, and has no LLM for nuggets or credibility."""
    cascade, where = config.judge.cascade, config.source or "<config>"
    try:
        by_score = judges_by_score(resolve_spec(config.judge.provider, config.provider.overrides()))
    except JudgeError:
        return []  # an unknown provider is reported with the config problems
    if by_score:  # a reranker as the judge: no LLM, so no band and no second reranker
        cut = cascade is None or (cascade.low is not None and cascade.low == cascade.high)
        return [
            f"{where}: {problem}"
            for problem, found in (
                (
                    f"judge.provider '{config.judge.provider}' is a reranker, and judges by "
                    "score itself: drop [rerank] (or name an LLM as [judge] provider to keep "
                    "the reranker beside it)",
                    config.rerank is not None,
                ),
                (
                    "judge.cascade: a judge by score (a reranker as [judge] provider) has no "
                    "LLM for a band: give the cut as low = high, or leave [judge.cascade] out "
                    "for the provider's calibrated cut",
                    not cut,
                ),
                *(
                    (
                        f"[{name}] enabled: a judge by score (a reranker as [judge] provider) "
                        f"has no LLM to judge {name} with: name an LLM as [judge] provider, or "
                        f"turn [{name}] off",
                        section.enabled,
                    )
                    for name, section in (
                        ("nuggets", config.nuggets),
                        ("credibility", config.credibility),
                    )
                ),
            )
            if found
        ]
    if cascade is None:
        return []
    if config.rerank is None:
        return [
            f"{where}: judge.cascade needs a rerank provider: add a [rerank] table (e.g. "
            'provider = "embedded-rerank", model = "all-MiniLM-L6-v2")'
        ]
    try:
        problem = label_problem(cascade, queries, config.label_scale())
    except ConfigError:
        return []  # an unknown label scale is reported with the config problems
    return [f"{where}: {problem}"] if problem else []


def _context_problems(config: RunConfig, queries: Sequence[Query]) -> list[str]:
    """A context window (``[judge] context_tokens``, or the provider's own) with no room for
    a passage beside a query and the answer: the run would cut its passages to nothing and
    judge them unseen, so it is refused here (one line per query text too long, in file
    order). An estimate from the query's own tokens and PROMPT_ALLOWANCE for the rest of the
    prompt: the run's exact check (judging/context.py) renders it."""
    try:
        spec = resolve_spec(config.judge.provider, config.provider.overrides())
    except JudgeError:
        return []  # reported with the config problems
    window = config.judge.context_tokens or preset_context(spec)
    if window is None or judges_by_score(spec):
        return []
    where, answer = config.source or "<config>", config.judge.params.max_tokens
    room = context_room(window, answer)
    if room < PROMPT_ALLOWANCE + MIN_PASSAGE_TOKENS:
        return [
            f"{where}: judge.context_tokens: a {window}-token window leaves {max(room, 0)} "
            f"after the answer's {answer or DEFAULT_ANSWER_TOKENS} (judge.params.max_tokens): "
            "no room for the prompt and a passage"
        ]
    listwise = config.judge.mode == "listwise"
    problems, seen = [], set()
    for q in queries:
        size = window_size(config.judge)  # a listwise request holds a window of them
        passages = min(len(q.passages), size) if listwise else min(len(q.passages), 1)
        if (q.query, passages) in seen or not passages:
            continue
        seen.add((q.query, passages))
        need = query_tokens(q.query)
        if need + PROMPT_ALLOWANCE + MIN_PASSAGE_TOKENS * passages > room:
            problems.append(
                f"{q.source or where}: field 'query': query '{q.query_id}' takes ~{need} "
                f"tokens, leaving its passages no room in a {window}-token context window "
                "(judge.context_tokens, less the answer's max_tokens); shorten it or widen "
                "the window"
            )
    return problems


def _template_problems(config: RunConfig, queries: Sequence[Query]) -> list[str]:
    """A template of the user's (``judge.template_dir``) rendered for every query, as the
    run would render it: one that fails on some rows' data (a field only some have, a
    passage index past a short list) was found after paying for the rows before it, with
    exit 2. (The built-in templates read only what every row has.)"""
    if not config.judge.template_dir:
        return []
    try:
        with planning_only():
            judge = Judge.from_config(config, cache=open_cache(None))
    except TemplateError as exc:  # one that does not load: its syntax, a block it lacks
        return [f"{config.source or '<config>'}: judge.template_dir: {exc}"]
    except JudgeError:
        return []  # reported with the config problems
    problems: list[str] = []
    try:
        for q in queries:
            try:
                judge.first_requests(q)
            except TemplateError as exc:
                where = q.source or f"query '{q.query_id}'"
                problems.append(f"{where}: query '{q.query_id}' ({q.engine}): {exc}")
                if len(problems) > MAX_SHOWN:
                    break
    finally:
        judge.close()
    return problems


def _say_disagreements(queries: Sequence[Query]) -> None:
    """Warn (once each, with the first case) when engines' rows disagree on what one query's
    passage is: one passage id with two texts (pooled metrics and borrowed verdicts take them
    as one passage), or two human labels (agreement is measured against either). Accepted,
    not refused: the data may be right, and the run does not depend on it."""
    texts: dict[tuple[str, str], tuple[str, str]] = {}
    labels: dict[tuple[str, str], tuple[int, str]] = {}
    said: dict[str, str] = {}
    for q in queries:
        for p in q.passages:
            was = texts.setdefault((q.query_id, p.id), (p.text, q.engine))
            if was[0] != p.text and "text" not in said:
                said["text"] = (
                    f"query '{q.query_id}': passage '{p.id}' is another text in engine "
                    f"'{q.engine}' than in '{was[1]}'; pooled metrics and borrowed verdicts "
                    "take one id as one passage"
                )
        for pid, grade in (q.labels or {}).items():
            had = labels.setdefault((q.query_id, pid), (grade, q.engine))
            if had[0] != grade and "label" not in said:
                said["label"] = (
                    f"query '{q.query_id}': passage '{pid}' is labelled {grade} in engine "
                    f"'{q.engine}'s row and {had[0]} in '{had[1]}'s; agreement with human "
                    "labels reads each row's own"
                )
    for line in said.values():
        log.warning("%s", line)


def _read_only(path: Path) -> list[str]:
    """A SQLite file at ``path``, or its -wal and -shm beside it, that this process may not
    write (a read-only mode, an immutable file): the run would pay for its first answers,
    then stop unable to keep them."""
    return [
        f"{found} is read-only: make it writable (chmod u+w), or give another path"
        for found in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm"))
        if found.is_file() and not os.access(found, os.W_OK)
    ]


def _writable(directory: Path, what: str) -> list[str]:
    """[] when a file can be written in ``directory``, or it can be created (nothing is made
    here: the nearest existing ancestor is probed instead)."""
    probe = directory
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        return [f"{directory}: {what}: {probe} is not a directory"]
    try:
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".judge-probe-"):
            pass
    except OSError as exc:
        return [f"{directory}: {what} is not writable: {exc.strerror or exc}"]
    return []


def _nugget_problems(
    config: RunConfig, queries: Sequence[Query], out_dir: Path | None
) -> list[str]:
    """The nugget sets a run with ``[nuggets]`` on starts from (the file ``path`` names, and
    the run directory's own) read as the run will read them: unreadable lines, or a set for
    another query's text, found before any call."""
    if not config.nuggets.enabled:
        return []
    try:
        given_sets(config.nuggets.path, out_dir, queries)
    except JudgeError as exc:
        return [str(exc)]
    return []


def _row_problems(config: RunConfig, queries: Sequence[Query]) -> list[str]:
    """No passage to judge at all; one query id with different texts; labels off their scale;
    ids with whitespace (qrels and TREC runs split on it)."""
    try:
        labels = config.comparable_label_scale()
    except ConfigError:
        labels = config.scale()  # reported with the config problems
    grades = {label.grade for label in labels.labels}
    allowed = ", ".join(str(g) for g in sorted(grades))
    problems: list[str] = []
    if queries and not any(q.passages for q in queries):
        source = (queries[0].source or "the dataset").rsplit(":", 1)[0]
        problems.append(
            f"{source}: field 'passages': none of its {len(queries)} queries has a passage: "
            "nothing to judge"
        )
    texts: dict[str, tuple[str, str]] = {}  # query id -> its text, normalised, and where
    engines: set[str] = set()
    for q in queries:
        where = q.source or f"query '{q.query_id}'"
        if q.engine not in engines and (why := _unfit_engine(q.engine)):
            problems.append(f"{where}: field 'engine': {_shown(q.engine)} {why}")
        engines.add(q.engine)
        said = " ".join(q.query.casefold().split())
        first = texts.setdefault(q.query_id, (said, where))
        if first[0] != said:  # engines compared on different questions, paired as one
            problems.append(
                f"{where}: field 'query': query '{q.query_id}' is {q.query!r} here but another "
                f"text at {first[1]}; one query id is one question for every engine"
            )
        if why := _unfit_id(q.query_id):
            problems.append(f"{where}: field 'query_id': {_shown(q.query_id)} contains {why}")
        for p in q.passages:
            if why := _unfit_id(p.id):
                problems.append(f"{where}: field 'passages.id': {_shown(p.id)} contains {why}")
        for pid, grade in (q.labels or {}).items():
            if grade not in grades:
                problems.append(
                    f"{where}: field 'labels.{pid}': {grade} is not a grade of the "
                    f"'{labels.name}' scale ({allowed}); set [dataset] label_scale if the "
                    "labels use another scale"
                )
    return problems


_SPACE = re.compile(r"\s")  # str.isspace's characters, found without a loop in Python
# Control characters (NUL breaks qrels.txt for trec_eval) and the bidirectional controls that
# reorder the text after them in a report (a metric's digits shown reversed).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# Characters no reader sees (a zero-width space, a word joiner, a byte-order mark, a soft
# hyphen) or XML cannot hold (U+FFFE, U+FFFF): "bm25" and "bm25" with one are two engines,
# and two passages, that every table shows alike; a JUnit file with one does not parse.
_INVISIBLE = re.compile(r"[\u00ad\u200b\u2060-\u2064\ufeff\ufffe\uffff]")
# Ids longer than this are refused: they are echoed in errors and reports whole.
MAX_ID_CHARS = 512


def _shown(text: str) -> str:
    """An id as an error shows it: its repr, a long one cut."""
    return repr(text) if len(text) <= 80 else repr(text[:60]) + "..."


def _unfit_engine(name: str) -> str | None:
    """What makes ``name`` unfit for an engine's name (None: nothing); reports, tables and the
    console carry it, and the comparisons pair engines by it. Inner spaces are fine."""
    if name != name.strip():
        return "begins or ends with white space (another engine than the one without it)"
    why = _unfit_id(name, spaces=False)
    return f"contains {why}" if why else None


def _unfit_id(text: str, *, spaces: bool = True) -> str | None:
    """What makes ``text`` unfit for an id the outputs carry (None: nothing); ``spaces``:
    white space too (qrels and TREC runs split on it)."""
    if spaces and _SPACE.search(text) is not None:
        return "whitespace"
    if found := _CONTROL.search(text):
        return f"a control character (U+{ord(found.group(0)):04X})"
    if found := _INVISIBLE.search(text):
        return f"an invisible character (U+{ord(found.group(0)):04X})"
    if len(text) > MAX_ID_CHARS:
        return f"{len(text)} characters (at most {MAX_ID_CHARS})"
    return None
