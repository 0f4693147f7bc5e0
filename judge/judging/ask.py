"""Asking the judge one question: the context every question shares, and the one ``ask``.

Relevance verdicts (pointwise and listwise, judging/relevance.py) and every dimension's
questions (nuggets, support, credibility) go through :func:`ask`: the request through the
caller (cache, limits, retries, budget), parsed once; an answer that does not parse is re-asked
once with the validation error in one wording (:func:`judge.judging.verdicts.reask_messages`);
a provider failure after the caller's retries is returned, never raised.

:class:`AskContext` is built once per Judge from its settings: the caller, model, sampling
params, language, re-ask policy, context window and reason length every asker reads.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from judge.calling.caller import Caller, Prompt, Reader
from judge.config import JudgeSection
from judge.errors import ParseError, ProviderError
from judge.judging.jsonscan import NOTHING_SHOWN, Node, Quoted, values
from judge.judging.prompts import MARK
from judge.judging.verdicts import reask_messages
from judge.providers.base import ChatRequest, Completion
from judge.schema import SamplingParams, Usage

__all__ = [
    "AskContext",
    "Asked",
    "answer_entries",
    "answer_field",
    "answer_room",
    "answer_start",
    "ask",
    "aspect_params",
]

P = TypeVar("P")


@dataclass(frozen=True)
class AskContext:
    """What every question a judge asks shares (built once by the Judge from its settings)."""

    caller: Caller
    model: str
    params: SamplingParams  # the judge's sampling params (without a mode's answer schema)
    language: str
    reask: bool
    context_tokens: int | None
    max_reason_words: int
    mark: str = ""  # the datamark of passages in every prompt ("": fenced only)

    @classmethod
    def of(cls, caller: Caller, settings: JudgeSection, params: SamplingParams) -> AskContext:
        """The context of a judge with ``settings``, asking with ``params`` (its own, the
        mode's answer schema filled in)."""
        s = settings
        mark = MARK if s.spotlight == "datamark" else ""
        return cls(
            caller, s.model, params, s.language, s.reask, s.context_tokens, s.max_reason_words, mark
        )


@dataclass
class Asked(Generic[P]):
    """What a question came to: its ``value``, or the ``error`` (``failed``: the provider's,
    after the caller's retries; otherwise the last parse error), and what its calls took."""

    value: P | None = None
    error: str | None = None
    failed: bool = False
    usage: Usage = field(default_factory=Usage)
    cached: bool = True
    attempts: int = 0
    latency_s: float = 0.0
    raw: str | None = None  # the last answer's text
    # The answer did not parse for a cause that asking again would meet again (cut off by
    # max_tokens inside its thinking, stopped by the provider's content filter): not re-asked.
    futile: bool = False


def _failed(asked: Asked[P], exc: ProviderError) -> Asked[P]:
    """``asked`` ended by the provider's failure ``exc``; one its content inspection refused
    gets no verdict, as an answer that does not parse gives none (refused again if asked)."""
    refused = exc.kind == "content"
    asked.error = f"the provider refused it: {exc}" if refused else str(exc)
    asked.failed, asked.futile, asked.cached = not refused, refused, False
    return asked


def futile(answer: Completion, error: str) -> str | None:
    """Why asking again for an ``answer`` that did not parse (``error``) would meet the same
    end, or None: one cut off by max_tokens inside its thinking (a reasoning model's
    <think> block takes the whole limit again), or stopped by the provider's content
    filter (it reads the same passage again)."""
    if answer.finish_reason == "length" and "inside its <think> block" in error:
        return (
            "asked again, it would be cut off again: raise [judge.params] max_tokens, or turn "
            "the model's thinking off"
        )
    if answer.finish_reason == "content_filter":
        return "the provider's content filter stopped it: asked again, it would stop it again"
    return None


async def ask(
    caller: Caller,
    request: ChatRequest | Prompt,
    repeat: int,
    parse: Callable[[Completion], P] | Reader[P],
    *,
    reask: bool,
    language: str,
) -> Asked[P]:
    """``request`` through the caller, parsed; an answer that does not parse is re-asked once
    with the error when ``reask``. BudgetExceeded propagates (the run stops and resumes); a
    provider failure is returned in :class:`Asked`, never raised."""
    asked: Asked[P] = Asked()
    # An answer a re-ask obtained is named by the first request too: a redo (a resume, a
    # rerun) reads it instead of paying the first request and its re-ask again.
    reasked = _reask_alias(caller, request, repeat) if reask else None
    if reasked is not None:
        hit = _reasked(caller, reasked, parse)
        if hit is not None:
            asked.value, asked.raw, asked.usage = hit
            caller.stats.cache_hits += 1
            return asked
    current = request
    for round_ in range(2 if reask else 1):
        try:
            got = await caller.complete(current, repeat, parse)
        except ProviderError as exc:
            asked.attempts += exc.attempts
            return _failed(asked, exc)
        call = got.call
        asked.attempts += call.attempts
        asked.usage = asked.usage + call.answer.usage
        asked.latency_s += call.latency_s
        asked.cached = asked.cached and call.cached
        asked.raw = call.answer.text
        if got.value is not None:
            asked.value, asked.error = got.value, None
            if round_ == 1 and reasked is not None:  # cached by the caller: it parsed
                caller.keep(
                    functools.partial(caller.cache.add_alias, reasked, caller.key(current, repeat))
                )
            return asked
        asked.error = str(got.error)
        if (again := futile(call.answer, asked.error)) is not None:
            asked.error, asked.futile = f"{asked.error}; {again}", True
            return asked
        if round_ == 0:
            first = request.request if isinstance(request, Prompt) else request
            messages = reask_messages(
                first.messages, call.answer.text, asked.error, language=language
            )
            current = first.model_copy(update={"messages": messages})
    return asked


def _reask_alias(caller: Caller, request: ChatRequest | Prompt, repeat: int) -> str:
    """The alias naming the answer a re-ask of ``request`` obtained (for repeat ``repeat``)."""
    blob = f"reask\x00{caller.key(request, repeat)}".encode()
    return hashlib.sha256(blob).hexdigest()


def _reasked(
    caller: Caller, alias: str, parse: Callable[[Completion], P] | Reader[P]
) -> tuple[P, str, Usage] | None:
    """The value, text and usage of the re-asked answer ``alias`` names, read by ``parse``
    (from its kept reading when the parser's tag matches); None when there is none that
    reads."""
    found = caller.cache.get_stored(alias, Completion, alias=True)
    if found is None:
        return None
    answer, reading = found.value, found.reading
    try:
        if isinstance(parse, Reader):
            if reading is not None and reading.tag == parse.tag:
                value = parse.load(reading.value)
            else:
                value = parse.parse(answer)
        else:
            value = parse(answer)
    except (ParseError, ValueError):
        return None
    return value, answer.text, answer.usage


def aspect_params(params: SamplingParams, answer_tokens: int) -> SamplingParams:
    """The judge's params for an answer of about ``answer_tokens``: no logprobs (these answers
    do not use them and a local server pays for them per token), JSON mode kept as plain
    ``json_object`` (the judge's schema is the verdict's), ``max_tokens`` raised to the
    answer's need (None, no limit, stays None)."""
    limit = params.max_tokens
    return params.model_copy(
        update={
            "logprobs": False,
            "top_logprobs": None,
            "response_format": "json_object" if params.response_format else None,
            "json_schema": None,
            "max_tokens": None if limit is None else max(limit, answer_tokens),
        }
    )


def answer_room(params: SamplingParams, answer_tokens: int) -> int:
    """The tokens a request keeps free for its answer when it is fitted to the context window:
    the ``max_tokens`` it will carry (:func:`aspect_params`), else ``answer_tokens``."""
    return aspect_params(params, answer_tokens).max_tokens or answer_tokens


def answer_start(completion: Completion) -> int:
    """Where the answer proper starts (after a think block); ParseError when it is empty."""
    text = completion.text
    close = text.rfind("</think>")
    if close < 0 and "<think>" in text:
        raise ParseError("the answer ends inside its <think> block")
    start = close + len("</think>") if close >= 0 else 0
    if not text[start:].strip():
        cut = " (cut off by the token limit)" if completion.finish_reason == "length" else ""
        raise ParseError(f"the answer is empty{cut}")
    return start


def answer_field(pairs: dict[str, Node], names: Sequence[str]) -> Node | None:
    """The value of the first of ``names`` among an object's keys (trimmed, case-folded)."""
    folded = {key.strip().casefold(): node for key, node in pairs.items()}
    return next((folded[n] for n in names if n in folded), None)


def answer_entries(
    completion: Completion,
    list_keys: Sequence[str],
    shape: str,
    quoted: Quoted = NOTHING_SHOWN,
) -> list[Node]:
    """The list of entries in an answer: a bare JSON list, or one under any of ``list_keys``;
    ParseError naming the expected ``shape`` when there is none. A value ``quoted`` from what
    the judge was shown as data (a passage's own list of supports) is passed over."""
    for node in values(completion.text, answer_start(completion), "{["):
        if quoted(completion.text[node.start : node.end]):
            continue
        if isinstance(node.value, list):
            return node.value
        listed = answer_field(node.value, list_keys)
        if listed is not None and isinstance(listed.value, list):
            return listed.value
    raise ParseError(f"the answer has no JSON object {shape}")
