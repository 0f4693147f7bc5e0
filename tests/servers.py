"""Loopback servers that speak our providers' wire protocols, for tests and benchmarks.

One :class:`ScriptedServer` answers every protocol at once, routed by path::

    POST /v1/chat/completions                               OpenAI chat completions
    POST /api/v1/services/aigc/text-generation/generation   DashScope native generation
    POST /api/v1/services/rerank/text-rerank/text-rerank    DashScope native rerank
    POST /v1/rerank, /rerank                                Cohere-style rerank (or TEI's bare list)
    GET  /v1/models, /health                                readiness probes

Each request gets, in this order: the next scripted item (:meth:`ScriptedServer.enqueue`),
else a random fault from ``faults`` with probability ``fault_rate``, else the ``responder``'s
answer (chat) or the ``scorer``'s scores (rerank). Every request is recorded.

Run as a process for benchmarks and kill tests; it prints ``PORT <n>`` and serves until killed::

    python -m tests.servers openai --port 0 --latency 0.2 --fault-rate 0.1
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import random
import re
import socket
import sys
import threading
import uuid
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal, NamedTuple

FaultKind = Literal[
    "status", "hang", "drop", "cut", "malformed", "truncated", "wrong_shape", "empty"
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


@dataclass(frozen=True)
class Fault:
    """A failure to serve instead of an answer.

    status: HTTP ``status`` with the protocol's error body (and ``Retry-After`` if set);
    hang: wait ``seconds`` (cut short by stop()), then answer normally (counted as "hang",
    and as "ok" too if the late answer could be written); drop: close the
    socket without a response; cut: promise the full body, send half, close; malformed:
    200 with invalid JSON; truncated: 200 with half a JSON body (consistent length);
    wrong_shape: 200 with valid JSON that is not the protocol's answer;
    empty: 200 with empty content (null in OpenAI, "" in DashScope, no rerank results).
    """

    kind: FaultKind
    status: int = 500
    retry_after: str | None = None
    seconds: float = 5.0


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
    def prompt(self) -> str:
        """The last user message (where the templates put the passage)."""
        users = [str(m.get("content", "")) for m in self.messages if m.get("role") == "user"]
        return users[-1] if users else ""


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
    words = sum(len(str(m.get("content", "")).split()) for m in request.messages)
    return words, len(_tokens(answer)) if answer.text else 0


def _openai_chat(answer: Answer, request: Recorded) -> Any:
    prompt, completion = _usage(answer, request)
    message = {"role": "assistant", "content": answer.text or None}
    choice = {"index": 0, "message": message, "finish_reason": answer.finish_reason}
    choice["logprobs"] = _logprobs(answer, request)
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": 1700000000,
        "model": request.body.get("model", ""),
        "choices": [choice],
        "usage": {**usage, "total_tokens": prompt + completion},
    }


def _dashscope_chat(answer: Answer, request: Recorded) -> Any:
    prompt, completion = _usage(answer, request)
    message = {"role": "assistant", "content": answer.text}
    choice: dict[str, Any] = {"finish_reason": answer.finish_reason, "message": message}
    if (logprobs := _logprobs(answer, request)) is not None:
        choice["logprobs"] = logprobs
    usage = {"input_tokens": prompt, "output_tokens": completion}
    return {
        "output": {"choices": [choice]},
        "usage": {**usage, "total_tokens": prompt + completion},
        "request_id": str(uuid.uuid4()),
    }


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


def _tei_rerank(answer: Answer, request: Recorded) -> Any:
    return [{"index": r["index"], "score": r["relevance_score"]} for r in _ranked(answer, None)]


def _rerank_inputs(request: Recorded) -> tuple[str, list[str]]:
    where = request.body.get("input", request.body)
    docs = where.get("documents", where.get("texts", []))
    return str(where["query"]), [d if isinstance(d, str) else str(d.get("text", "")) for d in docs]


def _openai_error(status: int) -> Any:
    return {"error": {"message": f"scripted failure {status}", "type": "scripted", "code": None}}


def _dashscope_error(status: int) -> Any:
    code = {429: "Throttling.RateQuota", 400: "InvalidParameter"}.get(status, "InternalError")
    return {"code": code, "message": f"scripted failure {status}", "request_id": "req-scripted"}


def _cohere_error(status: int) -> Any:
    return {"message": f"scripted failure {status}"}


class _Route(NamedTuple):
    chat: bool  # else rerank
    body: Callable[[Answer, Recorded], Any]
    error: Callable[[int], Any]


_CHAT_PATH = "/api/v1/services/aigc/text-generation/generation"
_RERANK_PATH = "/api/v1/services/rerank/text-rerank/text-rerank"
_ROUTES = {
    "/v1/chat/completions": _Route(True, _openai_chat, _openai_error),
    _CHAT_PATH: _Route(True, _dashscope_chat, _dashscope_error),
    _RERANK_PATH: _Route(False, _dashscope_rerank, _dashscope_error),
    "/v1/rerank": _Route(False, _cohere_rerank, _cohere_error),
    "/rerank": _Route(False, _cohere_rerank, _cohere_error),
}


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # bursts of 64+ new connections must not overflow the backlog

    def __init__(self, address: tuple[str, int], owner: ScriptedServer) -> None:
        self.owner = owner
        self.open: set[socket.socket] = set()
        self.open_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.open_lock:
            self.open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.open_lock:
            self.open.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):  # a client hanging up is not news
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall
    server: _HTTPServer
    timeout = 60  # idle keep-alive connections of a forgotten client end eventually

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: tests and benchmarks read the recorded requests instead."""

    def do_GET(self) -> None:
        known = self.path in ("/v1/models", "/health")
        body = {"object": "list", "data": [{"id": "scripted", "object": "model"}]}
        self.reply(200 if known else 404, body if known else _openai_error(404))

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        headers = {name.lower(): value for name, value in self.headers.items()}
        self.server.owner._serve(self, Recorded("POST", self.path, headers, body))

    def reply(
        self,
        status: int,
        body: Any,
        headers: Mapping[str, str] | None = None,
        raw: bytes = b"",
        length: int | None = None,
    ) -> None:
        """Send a JSON response; ``length`` can promise more bytes than are sent (a cut)."""
        payload = raw or json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload) if length is None else length))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def hang_up(self) -> None:
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)


class ScriptedServer:
    """A threaded HTTP server on 127.0.0.1 answering from a script, a responder and faults.

    ``latency`` seconds are waited before every response. Counters: :attr:`requests` (every
    request, recorded), :attr:`outcomes` (per outcome: "ok", "empty", "status_429", "hang",
    "drop", ...), :attr:`successes` (well-formed 200 answers sent: "ok" + "empty").
    """

    def __init__(
        self,
        *,
        responder: Responder | None = None,
        scorer: Scorer = overlap_scorer,
        latency: float = 0.0,
        fault_rate: float = 0.0,
        faults: Sequence[Fault] = (RATE_LIMIT, SERVER_ERROR, DROP),
        seed: int = 0,
        rerank_shape: Literal["cohere", "tei"] = "cohere",
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.responder = responder or hashed_responder()
        self.scorer = scorer
        self.latency = latency
        self.fault_rate = fault_rate
        self.faults = tuple(faults)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._script: deque[Item] = deque()
        self._requests: list[Recorded] = []
        self._outcomes: Counter[str] = Counter()
        self._stopping = threading.Event()
        self._routes = dict(_ROUTES)
        if rerank_shape == "tei":
            for path in ("/v1/rerank", "/rerank"):
                self._routes[path] = _Route(False, _tei_rerank, _cohere_error)
        self._httpd = _HTTPServer((host, port), self)
        # A short poll interval makes stop() quick: shutdown() waits for the next poll.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def dashscope_base_url(self) -> str:
        return f"{self.url}/api/v1"

    def enqueue(self, *items: Item) -> None:
        """Script the next answers: a str (answer text), an :class:`Answer` or a :class:`Fault`."""
        with self._lock:
            self._script.extend(items)

    @property
    def requests(self) -> list[Recorded]:
        with self._lock:
            return list(self._requests)

    @property
    def outcomes(self) -> Counter[str]:
        with self._lock:
            return Counter(self._outcomes)

    @property
    def successes(self) -> int:
        with self._lock:
            return self._outcomes["ok"] + self._outcomes["empty"]

    def bodies(self, path: str | None = None) -> list[Any]:
        return [r.body for r in self.requests if path is None or r.path == path]

    def reset(self) -> None:
        """Forget recorded requests, counters and the unread script."""
        with self._lock:
            self._requests.clear()
            self._outcomes.clear()
            self._script.clear()

    def start(self) -> ScriptedServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; hanging handlers wake up and open connections are shut."""
        self._stopping.set()
        self._httpd.shutdown()
        with self._httpd.open_lock:
            sockets = list(self._httpd.open)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._httpd.server_close()
        self._thread.join()

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _next(self, route: _Route, request: Recorded) -> Item:
        with self._lock:
            self._requests.append(request)
            if self._script:
                return self._script.popleft()
            if self.faults and self.fault_rate > 0 and self._rng.random() < self.fault_rate:
                return self._rng.choice(self.faults)
        return self.responder(request) if route.chat else Answer()

    def _count(self, outcome: str) -> None:
        with self._lock:
            self._outcomes[outcome] += 1

    def _serve(self, handler: _Handler, request: Recorded) -> None:
        route = self._routes.get(request.path)
        if route is None or not isinstance(request.body, dict):
            with self._lock:
                self._requests.append(request)
            status = 404 if route is None else 400
            self._count(f"status_{status}")
            handler.reply(status, (route.error if route else _openai_error)(status))
            return
        item = self._next(route, request)
        self._stopping.wait(self.latency)
        if isinstance(item, Fault) and item.kind == "hang":
            self._count("hang")  # then answers late, like an overloaded server
            self._stopping.wait(item.seconds)
            item = self.responder(request) if route.chat else Answer()
        if isinstance(item, Fault):
            self._fail(handler, route, request, item)
            return
        answer = Answer(text=item) if isinstance(item, str) else item
        handler.reply(200, route.body(self._scored(route, request, answer), request))
        self._count("ok")

    def _scored(self, route: _Route, request: Recorded, answer: Answer) -> Answer:
        if route.chat or answer.scores is not None:
            return answer
        query, docs = _rerank_inputs(request)
        return replace(answer, scores=tuple(self.scorer(query, d) for d in docs))

    def _fail(self, handler: _Handler, route: _Route, request: Recorded, fault: Fault) -> None:
        if fault.kind == "status":
            extra = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
            self._count(f"status_{fault.status}")
            handler.reply(fault.status, route.error(fault.status), extra)
            return
        self._count(fault.kind)
        if fault.kind == "drop":
            handler.hang_up()
        elif fault.kind == "malformed":
            handler.reply(200, None, raw=b'{"output": {"choices": [,,]}, "choices": oops')
        elif fault.kind == "wrong_shape":
            handler.reply(200, {"status": "fine", "data": [1, 2, 3]})
        elif fault.kind == "empty":
            handler.reply(200, route.body(Answer(scores=()), request))
        else:  # truncated, cut: half of a real answer's body
            full = json.dumps(route.body(self._scored(route, request, Answer("cut off")), request))
            promised = len(full) if fault.kind == "cut" else None
            handler.reply(200, None, raw=full.encode()[: len(full) // 2], length=promised)
            if fault.kind == "cut":
                handler.hang_up()


def main(argv: Sequence[str] | None = None) -> None:
    """Serve until killed, after printing ``PORT <n>`` (the only line on stdout)."""
    parser = argparse.ArgumentParser(prog="python -m tests.servers")
    parser.add_argument("protocol", choices=("openai", "dashscope", "cohere", "tei"))
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--fault-rate", type=float, default=0.0)
    parser.add_argument("--faults", default="rate_limit,server_error,drop", help=",".join(FAULTS))
    parser.add_argument("--hang-seconds", type=float, default=5.0)
    parser.add_argument("--responder", choices=("hashed", "random"), default="hashed")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    faults = [FAULTS[name.strip()] for name in args.faults.split(",") if name.strip()]
    faults = [Fault("hang", seconds=args.hang_seconds) if f is HANG else f for f in faults]
    server = ScriptedServer(
        responder=random_responder(seed=args.seed) if args.responder == "random" else None,
        latency=args.latency,
        fault_rate=args.fault_rate,
        faults=faults,
        seed=args.seed,
        rerank_shape="tei" if args.protocol == "tei" else "cohere",
        port=args.port,
    )
    with server:
        print(f"PORT {server.port}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
