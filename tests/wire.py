"""What the loopback servers say: scripted answers and faults, responders, wire bodies.

:class:`Answer` and :class:`Fault` are the items a test scripts; a responder picks a chat
answer per request and a scorer scores rerank documents; the body builders render an answer
in each protocol's JSON shape (OpenAI, DashScope, Cohere, TEI), and :data:`ROUTES` maps a
request path to its protocol. :mod:`tests.servers` serves all of this over HTTP.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from judge.judging.prompts import MARK

FaultKind = Literal[
    "status",
    "hang",
    "drop",
    "cut",
    "malformed",
    "truncated",
    "wrong_shape",
    "empty",
    "web_page",
    "web_page_as_json",
    "error_200",
]


@dataclass(frozen=True)
class Tok:
    """One output token with its logprob and the alternatives (token -> logprob) to report."""

    token: str
    logprob: float
    top: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Answer:
    """A successful answer. ``tokens`` (logprobs) are made up from ``text`` when None;
    ``scores`` (one per document) answer a rerank call, else the scorer decides."""

    text: str = ""
    finish_reason: str = "stop"
    tokens: tuple[Tok, ...] | None = None
    scores: tuple[float, ...] | None = None
    usage: tuple[int, int] | None = None  # (prompt_tokens, completion_tokens)
    usage_left_out: bool = False  # no "usage" in the chat answer at all


@dataclass(frozen=True)
class Fault:
    """A failure to serve instead of an answer.

    status: HTTP ``status`` with the protocol's error body (and ``Retry-After`` if set);
    hang: wait ``seconds`` (cut short by stop()), then answer normally (counted as "hang",
    and as "ok" too if the late answer could be written); drop: close the
    socket without a response; cut: promise the full body, send half, close; malformed:
    200 with invalid JSON; truncated: 200 with half a JSON body (consistent length);
    wrong_shape: 200 with valid JSON that is not the protocol's answer;
    empty: 200 with empty content (null in OpenAI, "" in DashScope, no rerank results);
    web_page: 200 with an HTML page (text/html), as a web UI at the API's address answers;
    web_page_as_json: the same page labelled application/json (a misconfigured gateway);
    error_200: 200 with an error object (OpenAI's and Cohere's shapes) instead of an answer.
    """

    kind: FaultKind
    status: int = 500
    retry_after: str | None = None
    seconds: float = 5.0
    location: str | None = None  # a status fault's Location header (a redirect's target)


def rate_limit(retry_after: str | None = "1") -> Fault:
    return Fault("status", 429, retry_after=retry_after)


FAULTS: dict[str, Fault] = {  # by name, for --faults
    "rate_limit": rate_limit(),
    "server_error": Fault("status", 500),
    "unavailable": Fault("status", 503),
    "hang": Fault("hang"),
    "drop": Fault("drop"),
    "cut": Fault("cut"),
    "malformed": Fault("malformed"),
    "truncated": Fault("truncated"),
    "wrong_shape": Fault("wrong_shape"),
    "empty": Fault("empty"),
    "web_page": Fault("web_page"),
    "error_200": Fault("error_200"),
}
RATE_LIMIT = FAULTS["rate_limit"]
SERVER_ERROR = FAULTS["server_error"]
UNAVAILABLE = FAULTS["unavailable"]
HANG = FAULTS["hang"]
DROP = FAULTS["drop"]
CUT = FAULTS["cut"]
MALFORMED = FAULTS["malformed"]
TRUNCATED = FAULTS["truncated"]
WRONG_SHAPE = FAULTS["wrong_shape"]
EMPTY = FAULTS["empty"]
WEB_PAGE = FAULTS["web_page"]


@dataclass(frozen=True)
class Recorded:
    """One request as received: header names lower-cased, body parsed (None if not JSON)."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: Any

    @property
    def messages(self) -> list[dict[str, Any]]:
        """Chat messages, from the OpenAI or the DashScope body shape."""
        if not isinstance(self.body, dict):
            return []
        found = self.body.get("messages") or (self.body.get("input") or {}).get("messages")
        return list(found or [])

    @property
    def raw_prompt(self) -> str:
        """The last user message (where the templates put the passage), as sent."""
        users = [str(m.get("content", "")) for m in self.messages if m.get("role") == "user"]
        return users[-1] if users else ""

    @property
    def prompt(self) -> str:
        """The last user message as a model reads it: through the datamark that joins a
        passage's words (judging/prompts.py), so a test finds a passage's text as written."""
        return self.raw_prompt.replace(MARK, " ")


Item = Answer | Fault | str
Responder = Callable[[Recorded], Item]
Scorer = Callable[[str, str], float]


def verdict_json(label: str) -> str:
    return json.dumps({"verdict": label, "reason": "scripted answer"})


def probs_answer(probs: Mapping[str, float], render: Callable[[str], str] = verdict_json) -> Answer:
    """Answer with the most probable label, its token carrying ``log p`` for every label."""
    label = max(probs, key=lambda name: probs[name])
    text = render(label)
    head, _, tail = text.partition(label)
    top = {name: math.log(p) if p > 0 else -100.0 for name, p in probs.items()}
    tokens = [Tok(head, -0.001, {head: -0.001})] if head else []
    tokens.append(Tok(label, top[label], top))
    tokens += [Tok(tail, -0.001, {tail: -0.001})] if tail else []
    return Answer(text=text, tokens=tuple(tokens))


def label_responder(
    choose: Callable[[Recorded], str],
    labels: Sequence[str] = ("yes", "no"),
    render: Callable[[str], str] = verdict_json,
) -> Responder:
    """Answers ``render(choose(request))``, its label token 90% sure (the rest share 10%)."""

    def respond(request: Recorded) -> Item:
        label = choose(request)
        rest = 0.1 / max(1, len(labels) - 1)
        return probs_answer({name: 0.9 if name == label else rest for name in labels}, render)

    return respond


def hashed_responder(
    labels: Sequence[str] = ("yes", "no"), render: Callable[[str], str] = verdict_json
) -> Responder:
    """Deterministic: label = labels[sha256(prompt) mod len(labels)], in every process."""

    def choose(request: Recorded) -> str:
        return labels[int(hashlib.sha256(request.prompt.encode()).hexdigest(), 16) % len(labels)]

    return label_responder(choose, labels, render)


def keyword_responder(
    rules: Mapping[str, str], default: str = "no", render: Callable[[str], str] = verdict_json
) -> Responder:
    """The label of the first rule whose keyword occurs in the prompt (case-insensitive)."""

    def choose(request: Recorded) -> str:
        prompt = request.prompt.casefold()
        return next((lab for key, lab in rules.items() if key.casefold() in prompt), default)

    return label_responder(choose, sorted({*rules.values(), default}), render)


def random_responder(
    labels: Sequence[str] = ("yes", "no"),
    seed: int = 0,
    render: Callable[[str], str] = verdict_json,
) -> Responder:
    """A noisy judge: a uniformly random label per call (seeded, thread-safe)."""
    rng, lock = random.Random(seed), threading.Lock()

    def choose(request: Recorded) -> str:
        with lock:
            return rng.choice(list(labels))

    return label_responder(choose, labels, render)


_FENCED_ID = re.compile(r'<passage id=("(?:[^"\\]|\\.)*")>')


def listing_responder(inner: Responder | None = None) -> Responder:
    """``inner`` (default: hashed) for a pointwise prompt; a listwise prompt (one asking for
    ``"verdicts"``) gets one verdict per fenced passage id, each hashed from the id."""
    single = inner or hashed_responder()

    def respond(request: Recorded) -> Item:
        text = "\n".join(str(m.get("content", "")) for m in request.messages)
        if '"verdicts"' not in text:
            return single(request)
        ids = [json.loads(raw) for raw in _FENCED_ID.findall(text)]
        labels = ["yes" if hashlib.sha256(i.encode()).digest()[0] % 2 else "no" for i in ids]
        items = [{"id": i, "verdict": label} for i, label in zip(ids, labels, strict=True)]
        return Answer(json.dumps({"verdicts": items}))

    return respond


def overlap_scorer(query: str, document: str) -> float:
    """Share of the query's distinct words found in the document, in [0, 1]."""
    words = set(re.findall(r"\w+", query.casefold()))
    return len(words & set(re.findall(r"\w+", document.casefold()))) / len(words) if words else 0.0


def _tokens(answer: Answer) -> tuple[Tok, ...]:
    if answer.tokens is not None:
        return answer.tokens
    pieces = re.findall(r"\s*\w+|\s*[^\w\s]|\s+", answer.text)
    return tuple(Tok(p, -0.05, {p: -0.05, "<alt>": -3.5}) for p in pieces)


def _logprobs(answer: Answer, request: Recorded) -> dict[str, Any] | None:
    body = request.body if isinstance(request.body, dict) else {}
    params = body.get("parameters", body)
    if not params.get("logprobs") or not (answer.text or answer.tokens):
        return None
    n = int(params.get("top_logprobs") or 0)

    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    content = []
    for tok in _tokens(answer):
        top = sorted(tok.top.items(), key=lambda kv: -kv[1])[:n]
        content.append({**entry(tok.token, tok.logprob), "top_logprobs": [entry(*t) for t in top]})
    return {"content": content}


def _usage(answer: Answer, request: Recorded) -> tuple[int, int]:
    if answer.usage is not None:
        return answer.usage
    # A word a token, the datamark between a passage's words counted as the space it stands for.
    texts = [str(m.get("content", "")).replace(MARK, " ") for m in request.messages]
    words = sum(len(t.split()) for t in texts)
    return words, len(_tokens(answer)) if answer.text else 0


def _openai_chat(answer: Answer, request: Recorded) -> Any:
    prompt, completion = _usage(answer, request)
    message = {"role": "assistant", "content": answer.text or None}
    choice = {"index": 0, "message": message, "finish_reason": answer.finish_reason}
    choice["logprobs"] = _logprobs(answer, request)
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    body = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": 1700000000,
        "model": request.body.get("model", ""),
        "choices": [choice],
        "usage": {**usage, "total_tokens": prompt + completion},
    }
    return {k: v for k, v in body.items() if k != "usage" or not answer.usage_left_out}


def _dashscope_chat(answer: Answer, request: Recorded) -> Any:
    prompt, completion = _usage(answer, request)
    message = {"role": "assistant", "content": answer.text}
    choice: dict[str, Any] = {"finish_reason": answer.finish_reason, "message": message}
    if (logprobs := _logprobs(answer, request)) is not None:
        choice["logprobs"] = logprobs
    usage = {"input_tokens": prompt, "output_tokens": completion}
    body = {
        "output": {"choices": [choice]},
        "usage": {**usage, "total_tokens": prompt + completion},
        "request_id": str(uuid.uuid4()),
    }
    return {k: v for k, v in body.items() if k != "usage" or not answer.usage_left_out}


def _ranked(answer: Answer, top_n: Any) -> list[dict[str, Any]]:
    ranked = sorted(enumerate(answer.scores or ()), key=lambda pair: -pair[1])
    return [{"index": i, "relevance_score": s} for i, s in ranked[: int(top_n) if top_n else None]]


def _dashscope_rerank(answer: Answer, request: Recorded) -> Any:
    results = _ranked(answer, request.body.get("parameters", {}).get("top_n"))
    usage = {"total_tokens": 7 * len(request.body["input"]["documents"])}
    return {"output": {"results": results}, "usage": usage, "request_id": str(uuid.uuid4())}


def _cohere_rerank(answer: Answer, request: Recorded) -> Any:
    results = _ranked(answer, request.body.get("top_n"))
    return {"id": str(uuid.uuid4()), "results": results, "meta": {"billed_units": {"units": 1}}}


def tei_rerank(answer: Answer, request: Recorded) -> Any:
    return [{"index": r["index"], "score": r["relevance_score"]} for r in _ranked(answer, None)]


def rerank_inputs(request: Recorded) -> tuple[str, list[str]]:
    """(query, document texts) of a rerank body in any of the protocols' shapes."""
    where = request.body.get("input", request.body)
    docs = where.get("documents", where.get("texts", []))
    return str(where["query"]), [d if isinstance(d, str) else str(d.get("text", "")) for d in docs]


def openai_error(status: int) -> Any:
    """OpenAI's error body; also the answer to unknown paths."""
    return {"error": {"message": f"scripted failure {status}", "type": "scripted", "code": None}}


def _dashscope_error(status: int) -> Any:
    code = {429: "Throttling.RateQuota", 400: "InvalidParameter"}.get(status, "InternalError")
    return {"code": code, "message": f"scripted failure {status}", "request_id": "req-scripted"}


def cohere_error(status: int) -> Any:
    return {"message": f"scripted failure {status}"}


class Route(NamedTuple):
    """How one path is answered: a chat or rerank call, its body builder and error body."""

    chat: bool  # else rerank
    body: Callable[[Answer, Recorded], Any]
    error: Callable[[int], Any]


_CHAT_PATH = "/api/v1/services/aigc/text-generation/generation"
_RERANK_PATH = "/api/v1/services/rerank/text-rerank/text-rerank"
ROUTES = {
    "/v1/chat/completions": Route(True, _openai_chat, openai_error),
    _CHAT_PATH: Route(True, _dashscope_chat, _dashscope_error),
    _RERANK_PATH: Route(False, _dashscope_rerank, _dashscope_error),
    "/v1/rerank": Route(False, _cohere_rerank, cohere_error),
    "/rerank": Route(False, _cohere_rerank, cohere_error),
}
