"""Loopback servers that speak our providers' wire protocols, for tests and benchmarks.

One :class:`ScriptedServer` answers every protocol at once, routed by path::

    POST /v1/chat/completions                               OpenAI chat completions
    POST /api/v1/services/aigc/text-generation/generation   DashScope native generation
    POST /api/v1/services/rerank/text-rerank/text-rerank    DashScope native rerank
    POST /v1/rerank, /rerank                                Cohere-style rerank (or TEI's bare list)
    GET  /v1/models, /health                                readiness probes

Each request gets, in this order: the next scripted item (:meth:`ScriptedServer.enqueue`),
else a random fault from ``faults`` with probability ``fault_rate``, else the ``responder``'s
answer (chat) or the ``scorer``'s scores (rerank). Every request is recorded. The scripted
items, responders and per-protocol bodies live in :mod:`tests.wire` and are re-exported here.

Run as a process for benchmarks and kill tests; it prints ``PORT <n>`` and serves until killed::

    python -m tests.servers openai --port 0 --latency 0.2 --fault-rate 0.1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import socket
import sys
import threading
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal

from tests.wire import (
    CUT,
    DROP,
    EMPTY,
    FAULTS,
    HANG,
    MALFORMED,
    RATE_LIMIT,
    ROUTES,
    SERVER_ERROR,
    TRUNCATED,
    UNAVAILABLE,
    WEB_PAGE,
    WRONG_SHAPE,
    Answer,
    Fault,
    FaultKind,
    Item,
    Recorded,
    Responder,
    Route,
    Scorer,
    Tok,
    cohere_error,
    hashed_responder,
    keyword_responder,
    label_responder,
    listing_responder,
    openai_error,
    overlap_scorer,
    probs_answer,
    random_responder,
    rate_limit,
    rerank_inputs,
    tei_rerank,
    verdict_json,
)

# Everything tests and bench/ import from here, served or not by this module itself.
__all__ = [
    "CUT",
    "DROP",
    "EMPTY",
    "FAULTS",
    "HANG",
    "MALFORMED",
    "RATE_LIMIT",
    "SERVER_ERROR",
    "TRUNCATED",
    "UNAVAILABLE",
    "WEB_PAGE",
    "WRONG_SHAPE",
    "Answer",
    "Fault",
    "FaultKind",
    "Item",
    "Recorded",
    "Responder",
    "Scorer",
    "ScriptedServer",
    "Tok",
    "hashed_responder",
    "keyword_responder",
    "label_responder",
    "listing_responder",
    "main",
    "overlap_scorer",
    "probs_answer",
    "random_responder",
    "rate_limit",
    "verdict_json",
]


# What a web UI at the API's address answers to a POST: a page, not the API's JSON.
WEB_PAGE_BODY = (
    b"<!DOCTYPE html><html><head><title>Model Chat UI</title></head>"
    b"<body><div id='app'>Loading</div></body></html>"
)


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
        self.reply(200 if known else 404, body if known else openai_error(404))

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
        content_type: str = "application/json",
    ) -> None:
        """Send a JSON response; ``length`` can promise more bytes than are sent (a cut)."""
        payload = raw or json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload) if length is None else length))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def hang_up(self) -> None:
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)


class AnswerServer:
    """A loopback server answering every POST with ``answer(request body)``: a status and a
    JSON body, for answers no protocol's script gives (an error quoting the request, an
    error object sent with 200). Its ``openai_base_url`` stands where a ScriptedServer's
    does; closed by its ``with`` block."""

    def __init__(self, answer: Callable[[bytes], tuple[int, Any]]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, body = answer(raw)
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *_args: Any) -> None:
                """Silent."""

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.openai_base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def __enter__(self) -> AnswerServer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)


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
        self._routes = dict(ROUTES)
        if rerank_shape == "tei":
            for path in ("/v1/rerank", "/rerank"):
                self._routes[path] = Route(False, tei_rerank, cohere_error)
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

    def _next(self, route: Route, request: Recorded) -> Item:
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
            handler.reply(status, (route.error if route else openai_error)(status))
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
        body = route.body(self._scored(route, request, answer), request)
        self._count("ok")  # before the answer leaves: a client may read the counts at once
        handler.reply(200, body)

    def _scored(self, route: Route, request: Recorded, answer: Answer) -> Answer:
        if route.chat or answer.scores is not None:
            return answer
        query, docs = rerank_inputs(request)
        return replace(answer, scores=tuple(self.scorer(query, d) for d in docs))

    def _fail(self, handler: _Handler, route: Route, request: Recorded, fault: Fault) -> None:
        if fault.kind == "status":
            extra = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
            if fault.location is not None:
                extra["Location"] = fault.location
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
        elif fault.kind == "error_200":
            said = "invalid api token"
            if request.path.startswith("/api/v1/"):  # DashScope's error shape
                handler.reply(200, {"code": "InvalidApiKey", "message": said, "request_id": "r"})
            else:
                handler.reply(
                    200, {"error": {"message": said, "code": "invalid_api_key"}, "message": said}
                )
        elif fault.kind == "web_page":
            handler.reply(200, None, raw=WEB_PAGE_BODY, content_type="text/html; charset=utf-8")
        elif fault.kind == "web_page_as_json":
            handler.reply(200, None, raw=WEB_PAGE_BODY, content_type="application/json")
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
    parser.add_argument(
        "--responder",
        choices=("hashed", "random", "listing"),
        default="hashed",
        help="listing: hashed, and listwise prompts get one verdict per passage id",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    faults = [FAULTS[name.strip()] for name in args.faults.split(",") if name.strip()]
    faults = [Fault("hang", seconds=args.hang_seconds) if f is HANG else f for f in faults]
    server = ScriptedServer(
        responder={
            "hashed": None,
            "random": random_responder(seed=args.seed),
            "listing": listing_responder(),
        }[args.responder],
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
