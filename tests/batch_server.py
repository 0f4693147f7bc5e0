"""A loopback server speaking OpenAI's Files and Batches endpoints, for tests and benchmarks.

:class:`BatchServer` is a :class:`tests.servers.ScriptedServer` (so ``/v1/chat/completions``
still answers in real time, from the same responder) that also serves::

    POST /v1/files                      upload (multipart, purpose "batch")
    GET  /v1/files/{id}/content         an input, output or error file
    DELETE /v1/files/{id}               a file, gone
    POST /v1/batches                    create a batch over an uploaded file
    GET  /v1/batches                    list batches (newest first)
    GET  /v1/batches/{id}               a batch's status; each GET moves it on (below)
    POST /v1/batches/{id}/cancel        cancel: the next GET finds it cancelled

A batch is "in_progress" for its first ``polls_in_progress`` status checks; at the next one it
runs every line: ``batch_responder`` (default: the server's responder) answers each line's
body as the chat endpoint would, and the answers go to the output file. Injected faults:
``fail_when`` (lines it picks are answered with an HTTP 500 line in the error file),
``lose_create_answers`` (that many creates make the batch but answer 500), ``hold_create``
(a create waits, before or after making its batch, until :meth:`release`: time for a test to
kill the client), ``fail_retrieves`` (that many status checks answer 503), ``refuse_deletes``
(every file delete answers 403), ``repeat_lines`` (the output file
repeats that many of its lines, as a faulty provider might), ``foreign_lines`` (that many
more lines, copies of its first under custom ids never sent), ``garble_lines`` (that many
of its answered lines, billed, hold a body that is no chat completion), ``list_lag`` (a
batch made shows in that many list calls only after them, as a busy provider's list may lag its
create), ``expire_after``
(only that many lines run; the batch ends "expired" and the rest go to the error file as
``batch_expired``), ``fail_batch`` (the batch ends "failed" with that validation error and no
files), ``cancel`` (the lines it answered before the cancel: ``answer_before_cancel``; the rest
are in no file). Every HTTP request is recorded (:attr:`requests`), each Batch API call counted
by name in :attr:`calls`, and every batch line run (billed) in :attr:`executed`.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Callable
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any, Literal

from tests.servers import Answer, Fault, Recorded, Responder, ScriptedServer
from tests.servers import _Handler as ScriptedHandler
from tests.wire import ROUTES, openai_error

_CHAT = ROUTES["/v1/chat/completions"]
_BATCH = re.compile(r"^/v1/batches/([^/]+)(/cancel)?$")
_CONTENT = re.compile(r"^/v1/files/([^/]+)/content$")
_FILE = re.compile(r"^/v1/files/([^/]+)$")


class _Handler(ScriptedHandler):
    def do_GET(self) -> None:
        owner = self.server.owner
        assert isinstance(owner, BatchServer)
        if not owner.serve_batch_api(self, "GET", b""):
            super().do_GET()

    def do_DELETE(self) -> None:
        owner = self.server.owner
        assert isinstance(owner, BatchServer)
        if not owner.serve_batch_api(self, "DELETE", b""):
            self.reply(404, openai_error(404))

    def do_POST(self) -> None:
        owner = self.server.owner
        assert isinstance(owner, BatchServer)
        if self.path == "/v1/files" or self.path.startswith("/v1/batches"):
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            owner.serve_batch_api(self, "POST", raw)
            return
        super().do_POST()


class BatchServer(ScriptedServer):
    """A ScriptedServer that also runs batches (see the module docstring)."""

    def __init__(
        self,
        *,
        polls_in_progress: int = 0,
        batch_responder: Responder | None = None,
        fail_when: Callable[[Recorded], bool] | None = None,
        lose_create_answers: int = 0,
        expire_after: int | None = None,
        fail_batch: str | None = None,
        answer_before_cancel: int = 0,
        hold_create: Literal["before", "after"] | None = None,
        fail_retrieves: int = 0,
        refuse_deletes: bool = False,
        repeat_lines: int = 0,
        foreign_lines: int = 0,
        garble_lines: int = 0,
        list_lag: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._httpd.RequestHandlerClass = _Handler
        self.polls_in_progress = polls_in_progress
        self.batch_responder = batch_responder
        self.fail_when = fail_when
        self.lose_create_answers = lose_create_answers
        self.expire_after = expire_after
        self.fail_batch = fail_batch
        self.answer_before_cancel = answer_before_cancel
        self.hold_create = hold_create
        self.fail_retrieves = fail_retrieves
        self.refuse_deletes = refuse_deletes
        self.repeat_lines = repeat_lines
        self.foreign_lines = foreign_lines
        self.garble_lines = garble_lines
        self.list_lag = list_lag
        self._release = threading.Event()
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self.calls: Counter[str] = Counter()
        self.executed: list[str] = []
        self._batch_lock = threading.Lock()

    # ---- routing ----------------------------------------------------------------------

    def serve_batch_api(self, handler: ScriptedHandler, method: str, raw: bytes) -> bool:
        """Answer a Files or Batches request; False when the path is neither."""
        path = handler.path.split("?")[0]
        headers = {k.lower(): v for k, v in handler.headers.items()}
        routes: list[tuple[bool, str, Callable[[], tuple[int, Any]]]] = [
            (
                method == "POST" and path == "/v1/files",
                "upload",
                lambda: self._upload(headers, raw),
            ),
            (method == "POST" and path == "/v1/batches", "create", lambda: self._create(raw)),
            (method == "GET" and path == "/v1/batches", "list", lambda: self._list(handler.path)),
        ]
        if (batch := _BATCH.match(path)) is not None:
            batch_id, cancel = batch.group(1), batch.group(2) is not None
            wanted = method == ("POST" if cancel else "GET")
            serve = functools.partial(self._batch, batch_id, cancel)
            routes.append((wanted, "cancel" if cancel else "retrieve", serve))
        if (content := _CONTENT.match(path)) is not None:
            serve = functools.partial(self._content, content.group(1))
            routes.append((method == "GET", "content", serve))
        if (file := _FILE.match(path)) is not None:
            serve = functools.partial(self._delete, file.group(1))
            routes.append((method == "DELETE", "delete", serve))
        for matches, name, serve in routes:
            if matches:
                with self._lock:
                    self._requests.append(Recorded(method, path, headers, None))
                held = name == "create" and self.hold_create is not None
                if held and self.hold_create == "before":
                    self._held()  # the client gives up (is killed) before anything is made
                    handler.reply(500, openai_error(500))
                    return True
                with self._batch_lock:
                    self.calls[name] += 1
                    status, body = serve()
                if held:
                    self._held()  # made, but the client is killed before it hears so
                if isinstance(body, bytes):
                    handler.reply(status, None, raw=body)
                else:
                    handler.reply(status, body)
                return True
        return False

    def _held(self) -> None:
        """Keep a create request waiting until :meth:`release` (or the server stops)."""
        while not self._release.wait(0.02) and not self._stopping.is_set():
            pass

    def release(self) -> None:
        """Let held creates go on, and hold no more."""
        self.hold_create = None
        self._release.set()

    # ---- files ------------------------------------------------------------------------

    def _upload(self, headers: dict[str, str], raw: bytes) -> tuple[int, Any]:
        head = f"Content-Type: {headers.get('content-type', '')}\r\n\r\n".encode()
        message = BytesParser(policy=HTTP).parsebytes(head + raw)
        fields: dict[str, tuple[str | None, bytes]] = {}
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            payload = part.get_payload(decode=True)
            fields[str(name)] = (
                part.get_filename(),
                payload if isinstance(payload, bytes) else b"",
            )
        if "file" not in fields or fields.get("purpose", (None, b""))[1] != b"batch":
            return 400, openai_error(400)
        filename, data = fields["file"]
        file_id = self._store(data)
        return 200, {
            "id": file_id,
            "object": "file",
            "bytes": len(data),
            "created_at": int(time.time()),
            "filename": filename or "upload.jsonl",
            "purpose": "batch",
            "status": "processed",
        }

    def _store(self, data: bytes) -> str:
        file_id = f"file-{uuid.uuid4().hex[:16]}"
        self.files[file_id] = data
        return file_id

    def _delete(self, file_id: str) -> tuple[int, Any]:
        if self.refuse_deletes:
            return 403, openai_error(403)
        if self.files.pop(file_id, None) is None:
            return 404, openai_error(404)
        return 200, {"id": file_id, "object": "file", "deleted": True}

    def _content(self, file_id: str) -> tuple[int, Any]:
        if file_id not in self.files:
            return 404, openai_error(404)
        return 200, self.files[file_id]

    # ---- batches ----------------------------------------------------------------------

    def _create(self, raw: bytes) -> tuple[int, Any]:
        body = json.loads(raw)
        if body.get("input_file_id") not in self.files or body.get("completion_window") != "24h":
            return 400, openai_error(400)
        batch_id = f"batch_{uuid.uuid4().hex[:16]}"
        lines = [json.loads(x) for x in self.files[body["input_file_id"]].splitlines() if x]
        self.batches[batch_id] = {
            "view": {
                "id": batch_id,
                "object": "batch",
                "endpoint": body["endpoint"],
                "errors": None,
                "input_file_id": body["input_file_id"],
                "completion_window": "24h",
                "status": "validating",
                "output_file_id": None,
                "error_file_id": None,
                "created_at": int(time.time() * 1000) + len(self.batches),
                "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
                "metadata": body.get("metadata"),
            },
            "lines": lines,
            "polls": 0,
            "cancel": False,
            "hidden_lists": self.list_lag,  # list calls that do not show it yet
        }
        if self.lose_create_answers > 0:  # made, but the client never learns its id
            self.lose_create_answers -= 1
            return 500, openai_error(500)
        return 200, self.batches[batch_id]["view"]

    def _list(self, target: str) -> tuple[int, Any]:
        """A page of batches, newest first: ``limit`` of them (20 by default, 100 at most)
        after the one ``after`` names, as OpenAI pages them."""
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query)
        limit = min(int(query.get("limit", ["20"])[0]), 100)
        listed = [b for b in self.batches.values() if b.get("hidden_lists", 0) <= 0]
        for batch in self.batches.values():
            batch["hidden_lists"] = batch.get("hidden_lists", 0) - 1
        views = sorted(
            (b["view"] for b in listed),
            key=lambda v: -int(v["created_at"]),
        )
        if after := query.get("after", [None])[0]:
            ids = [v["id"] for v in views]
            views = views[ids.index(after) + 1 :] if after in ids else []
        page = views[:limit]
        more = len(views) > limit
        first, last = (page[0]["id"], page[-1]["id"]) if page else (None, None)
        return 200, {
            "object": "list",
            "data": page,
            "has_more": more,
            "first_id": first,
            "last_id": last,
        }

    def _batch(self, batch_id: str, cancel: bool) -> tuple[int, Any]:
        batch = self.batches.get(batch_id)
        if batch is None:
            return 404, openai_error(404)
        if not cancel and self.fail_retrieves > 0:  # the provider unreachable for a while
            self.fail_retrieves -= 1
            return 503, openai_error(503)
        view = batch["view"]
        if view["status"] in ("completed", "failed", "expired", "cancelled"):
            return 200, view
        if cancel:
            batch["cancel"] = True
            view["status"] = "cancelling"
            return 200, view
        batch["polls"] += 1
        if batch["cancel"]:
            self._run(batch, self.answer_before_cancel, "cancelled")
        elif self.fail_batch is not None:
            view["status"] = "failed"
            view["errors"] = {
                "object": "list",
                "data": [{"code": "invalid", "message": self.fail_batch, "line": 1}],
            }
        elif batch["polls"] <= self.polls_in_progress:
            total = view["request_counts"]["total"]
            view["status"] = "in_progress"
            done = total * batch["polls"] // (self.polls_in_progress + 1)
            view["request_counts"] = {"total": total, "completed": done, "failed": 0}
        elif self.expire_after is not None:
            self._run(batch, self.expire_after, "expired")
        else:
            self._run(batch, len(batch["lines"]), "completed")
        return 200, view

    def _run(self, batch: dict[str, Any], n: int, status: str) -> None:
        """Answer the first ``n`` lines; the rest of an expired batch go to the error file."""
        output, errors = [], []
        for i, line in enumerate(batch["lines"]):
            if i >= n:
                if status == "expired":
                    errors.append(_error_line(line, None, "batch_expired", "the window expired"))
                continue
            request = Recorded("POST", line["url"], {}, line["body"])
            item = self._answer(request)
            if isinstance(item, Fault) or (self.fail_when is not None and self.fail_when(request)):
                errors.append(_error_line(line, 500, "server_error", "scripted failure 500"))
                continue
            self.executed.append(line["custom_id"])  # answered: billed
            body = _CHAT.body(item, request)
            if len(self.executed) <= self.garble_lines:  # billed, and unreadable
                body = {"id": "garbled", "object": "chat.completion", "usage": body.get("usage")}
            output.append(_output_line(line, 200, body))
        output += [{**copy, "id": f"batch_req_{uuid.uuid4().hex[:8]}"} for copy in output][
            : self.repeat_lines
        ]
        output += [
            {**output[0], "id": f"batch_req_{n}", "custom_id": f"never-sent-{n}"}
            for n in range(self.foreign_lines if output else 0)
        ]
        view = batch["view"]
        view["status"] = status
        view["output_file_id"] = self._store(_jsonl(output)) if output else None
        view["error_file_id"] = self._store(_jsonl(errors)) if errors else None
        failed = sum(1 for e in errors if e["response"] is not None)
        view["request_counts"] = {
            "total": len(batch["lines"]),
            "completed": len(output),
            "failed": failed,
        }

    def _answer(self, request: Recorded) -> Answer | Fault:
        respond = self.batch_responder or self.responder
        item = respond(request)
        return Answer(text=item) if isinstance(item, str) else item


def _output_line(line: dict[str, Any], status: int, body: Any) -> dict[str, Any]:
    response = {"status_code": status, "request_id": f"req_{uuid.uuid4().hex[:8]}", "body": body}
    return {
        "id": f"batch_req_{uuid.uuid4().hex[:8]}",
        "custom_id": line["custom_id"],
        "response": response,
        "error": None,
    }


def _error_line(
    line: dict[str, Any], status: int | None, code: str, message: str
) -> dict[str, Any]:
    if status is None:
        return {
            "id": f"batch_req_{uuid.uuid4().hex[:8]}",
            "custom_id": line["custom_id"],
            "response": None,
            "error": {"code": code, "message": message},
        }
    body = {"error": {"message": message, "type": code, "code": None}}
    return _output_line(line, status, body)


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)
