"""A lean HTTP/1.1 client for one JSON endpoint: POST a body, get status, headers and bytes.

What the OpenAI-compatible provider sends instead of building the SDK's request and response
objects (judge/providers/openai_compat.py): per call, one write of a prepared header block and
the body, a response parsed as it arrives, a keep-alive connection back in the pool. The SDK's
client (httpx) costs several times more CPU per call, most of it scanning its whole pool for
expired connections at every request.

One pool per client, as the SDK's: connections kept alive up to ``max_idle``, an idle one
closed after ``keepalive_s`` (httpx's default, 5 s) or as soon as the server closes it; no cap
on connections opened (the caller's concurrency limit is the cap). HTTP/1.1 only, as the SDK
speaks it by default (TLS asks for http/1.1 by ALPN). Bodies come with a Content-Length, in
chunks, or until the server closes; gzip and deflate are decoded, as the SDK asks for them.

Failures are the SDK's, in builtin classes the provider layer already classifies:
:class:`ConnectError` and :class:`ConnectTimeout` (no connection made: the request never left),
:class:`ReadTimeout` (``TimeoutError``), :class:`RemoteProtocolError` (a drop, a cut body or
bytes that are not HTTP: ``ConnectionError``). Each carries ``request.url`` for messages.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "ConnectError",
    "ConnectTimeout",
    "LeanClient",
    "ReadTimeout",
    "RemoteProtocolError",
    "Response",
]

KEEPALIVE_S = 5.0  # httpx's keepalive_expiry
MAX_IDLE = 100  # the SDK's max_keepalive_connections


@dataclass(frozen=True)
class Sent:
    """The request a failure belongs to (``exc.request.url``, as httpx's errors have it)."""

    method: str
    url: str


class _Failure(Exception):
    def __init__(self, message: str, request: Sent) -> None:
        super().__init__(message)
        self.request = request


class ConnectError(_Failure, ConnectionError):
    """No connection could be made (refused, no such host, unreachable)."""


class ConnectTimeout(_Failure, TimeoutError):
    """No connection was made within the timeout."""


class ReadTimeout(_Failure, TimeoutError):
    """Connected and sent, but no complete answer within the timeout."""


class RemoteProtocolError(_Failure, ConnectionError):
    """The server closed the connection before a whole answer, or sent bytes that are not HTTP."""


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]  # names lower-cased; a repeated header's last value
    content: bytes


class _Incomplete(Exception):
    """More bytes are needed."""


def _chunked(data: bytes | bytearray, start: int) -> tuple[bytes, int] | None:
    """The body of a chunked message from ``start`` and where the message ends; None while
    incomplete. Raises ValueError for bytes that are not chunks."""
    body, at = bytearray(), start
    while True:
        line_end = data.find(b"\r\n", at)
        if line_end < 0:
            return None
        size = int(bytes(data[at:line_end]).split(b";", 1)[0], 16)
        at = line_end + 2
        if size == 0:
            trailer_end = data.find(b"\r\n\r\n", at - 2)
            return (bytes(body), trailer_end + 4) if trailer_end >= 0 else None
        if len(data) < at + size + 2:
            return None
        body += data[at : at + size]
        at += size + 2


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its answer parsed as bytes arrive."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._buffer = bytearray()
        self._waiter: asyncio.Future[Response] | None = None
        self._head: tuple[int, dict[str, str], int] | None = None  # status, headers, body start
        self.keep = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def send(self, data: bytes, waiter: asyncio.Future[Response]) -> None:
        assert self.transport is not None
        self._buffer.clear()
        self._head = None
        self._waiter = waiter
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            self.closed = True  # bytes nobody asked for: this connection is not reusable
            return
        self._buffer += data
        self._try_finish(eof=False)

    def eof_received(self) -> bool:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            self._try_finish(eof=True)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            self._try_finish(eof=True)
            if not waiter.done():
                reason = f": {exc}" if exc else ""
                waiter.set_exception(ConnectionResetError(f"connection lost{reason}"))

    def _try_finish(self, eof: bool) -> None:
        waiter = self._waiter
        assert waiter is not None
        try:
            response = self._parse(eof)
        except _Incomplete:
            if eof:
                waiter.set_exception(ConnectionResetError(_cut(self._head)))
            return
        except AnswerTooLarge as exc:
            self.closed = True
            waiter.set_exception(exc)
            return
        except (ValueError, IndexError, zlib.error) as exc:
            self.closed = True
            waiter.set_exception(ValueError(f"not an HTTP/1.1 answer: {exc}"))
            return
        waiter.set_result(response)

    def _parse(self, eof: bool) -> Response:
        """The whole answer in the buffer, or _Incomplete. Long because: the status line,
        headers, 1xx answers and the three ways a body ends are one small state machine."""
        data = self._buffer
        if self._head is None:
            end = data.find(b"\r\n\r\n")
            if end < 0:
                raise _Incomplete()
            lines = bytes(data[:end]).decode("latin-1").split("\r\n")
            version, status_text = lines[0].split(" ", 2)[:2]
            status = int(status_text)
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            if 100 <= status < 200:  # an interim answer: the real one follows
                del data[: end + 4]
                return self._parse(eof)
            connection = headers.get("connection", "").lower()
            self.keep = "close" not in connection and (
                version != "HTTP/1.0" or "keep-alive" in connection
            )
            self._head = (status, headers, end + 4)
        status, headers, start = self._head
        length = headers.get("content-length")
        if len(data) - start > MAX_DECODED or (length is not None and int(length) > MAX_DECODED):
            raise AnswerTooLarge(
                f"an answer whose body passes {MAX_DECODED // 2**20} MiB, more than any "
                "answer: refused, and not asked again (it would be paid again)"
            )
        if status in (204, 304):
            body = b""
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            found = _chunked(data, start)
            if found is None:
                raise _Incomplete()
            body = found[0]
        elif length is not None:
            if len(data) - start < int(length):
                raise _Incomplete()
            body = bytes(data[start : start + int(length)])
        else:  # until the server closes
            if not eof:
                raise _Incomplete()
            self.keep = False
            body = bytes(data[start:])
        encoding = headers.get("content-encoding", "").lower()
        if encoding in ("gzip", "deflate") and body:
            body = _inflate(body, 47 if encoding == "gzip" else 15)
        return Response(status, headers, body)


class AnswerTooLarge(ValueError):
    """An answer past :data:`MAX_DECODED` as sent: refused (the caller makes it final)."""


# An answer past this, as sent or decoded, is refused: no chat or rerank answer comes near it
# (a long answer with logprobs is a few MB); a server sending more (a 50 MB "reason") had
# filled memory and every output file, and a small compressed body can decode to gigabytes.
MAX_DECODED = 16 * 2**20


def _inflate(body: bytes, wbits: int) -> bytes:
    """``body`` decompressed, at most :data:`MAX_DECODED` bytes of it (ValueError past it)."""
    inflater = zlib.decompressobj(wbits)
    out = inflater.decompress(body, MAX_DECODED)
    if inflater.unconsumed_tail:
        raise ValueError(
            f"its {len(body)}-byte compressed body decodes to more than "
            f"{MAX_DECODED // 2**20} MiB, more than any answer: refused"
        )
    return out + inflater.flush()


def _cut(head: tuple[int, dict[str, str], int] | None) -> str:
    if head is None:
        return "Server disconnected without sending a response."
    return "peer closed connection without sending complete message body"


def _ssl_context() -> ssl.SSLContext:
    """Verified TLS trusting what the SDK trusts (its transport's own default context:
    SSL_CERT_FILE / SSL_CERT_DIR, else the system's roots), http/1.1 by ALPN. The
    transport is imported for an https endpoint only, once."""
    import httpcore2

    context = httpcore2.default_ssl_context()
    context.set_alpn_protocols(["http/1.1"])
    return context


class LeanClient:
    """POSTs JSON bodies to one origin over a pool of keep-alive connections."""

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str],
        *,
        keepalive_s: float = KEEPALIVE_S,
        max_idle: int = MAX_IDLE,
    ) -> None:
        parts = urlsplit(base_url)
        self._tls = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._tls else 80)
        self._prefix = parts.path.rstrip("/")
        self._origin = f"{parts.scheme}://{parts.netloc}"
        default_port = self._port == (443 if self._tls else 80)
        host = parts.netloc.rsplit("@", 1)[-1] if not default_port else self._host
        if ":" in self._host and not host.startswith("["):
            host = f"[{self._host}]"
        fields = {"Host": host, **headers, "Connection": "keep-alive"}
        self._header_block = "".join(f"{k}: {v}\r\n" for k, v in fields.items()).encode()
        self._keepalive_s = keepalive_s
        self._max_idle = max_idle
        self._idle: list[_Connection] = []
        self._ssl: ssl.SSLContext | None = None

    def url(self, path: str) -> str:
        return f"{self._origin}{self._prefix}{path}"

    async def post(
        self,
        path: str,
        body: bytes,
        *,
        timeout: float | None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """One POST of ``body`` to ``path`` (under the base URL's path): the answer, any status.

        ``timeout`` bounds connecting, and then sending and the whole answer. Raises the
        module's errors (see its docstring); an answer is read whole before it returns."""
        sent = Sent("POST", self.url(path))
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode()
        head = (
            f"POST {self._prefix}{path} HTTP/1.1\r\nContent-Length: {len(body)}\r\n".encode()
            + self._header_block
            + extra
            + b"\r\n"
        )
        loop = asyncio.get_running_loop()
        connection = self._take() or await self._connect(loop, sent, timeout)
        waiter: asyncio.Future[Response] = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, _expire, waiter)
        try:
            connection.send(head + body, waiter)
            response = await waiter
        except TimeoutError:
            connection.closed = True
            raise ReadTimeout(f"no answer within {timeout} s", sent) from None
        except ConnectionError as exc:
            connection.closed = True
            raise RemoteProtocolError(str(exc), sent) from exc
        except AnswerTooLarge:
            connection.closed = True
            raise
        except ValueError as exc:
            raise RemoteProtocolError(str(exc), sent) from exc
        except BaseException:
            connection.closed = True  # cancelled mid-answer: the connection is in no known state
            raise
        finally:
            if timer is not None:
                timer.cancel()
            self._give_back(connection)
        return response

    def _take(self) -> _Connection | None:
        """The most recently used idle connection still open and fresh; stale ones closed."""
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and now - connection.idle_since < self._keepalive_s:
                return connection
            _close(connection)
        return None

    def _give_back(self, connection: _Connection) -> None:
        if connection.closed or not connection.keep or len(self._idle) >= self._max_idle:
            _close(connection)
            return
        connection.idle_since = time.monotonic()
        self._idle.append(connection)

    async def _connect(
        self, loop: asyncio.AbstractEventLoop, sent: Sent, timeout: float | None
    ) -> _Connection:
        if self._tls and self._ssl is None:
            self._ssl = _ssl_context()
        opening = loop.create_connection(
            _Connection,
            self._host,
            self._port,
            ssl=self._ssl if self._tls else None,
            server_hostname=self._host if self._tls else None,
        )
        try:
            async with asyncio.timeout(timeout):
                _, connection = await opening
        except TimeoutError:
            raise ConnectTimeout(f"no connection within {timeout} s", sent) from None
        except OSError as exc:  # refused, no such host, unreachable, TLS refused
            raise ConnectError(str(exc) or type(exc).__name__, sent) from exc
        return connection

    async def aclose(self) -> None:
        while self._idle:
            _close(self._idle.pop())


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


def _close(connection: _Connection) -> None:
    connection.closed = True
    if connection.transport is not None:
        connection.transport.close()
