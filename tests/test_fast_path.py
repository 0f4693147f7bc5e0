"""The lean HTTP client against the openai SDK, the reference: the same loopback servers, the
same requests on the wire, the same answers, error kinds, verdicts, usage and cost.

The OpenAI-compatible provider sends chat completions through judge's own HTTP/1.1 client
(judge/providers/lean_http.py) unless ``[provider] options = {client = "sdk"}``. Every test here
runs both and compares; the framing tests talk to a raw socket server that answers in the ways
real servers do and ScriptedServer does not (chunks, gzip, closing after an answer).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from judge.config import load_config
from judge.data.results import read_results
from judge.errors import ProviderConfigError
from judge.judging.judge import Judge
from judge.providers import make_chat_provider, resolve_spec
from judge.providers.base import Completion, RetryDecision, never_sent
from judge.providers.lean_http import LeanClient
from judge.run.queries import load_queries
from judge.run.runner import RunOutcome, run_async
from tests.provider_harness import CHAT, FULL_PARAMS, OPENAI_PATH, chat_spec, complete, run
from tests.servers import ScriptedServer, hashed_responder
from tests.test_providers_faults import FAULT_CASES

CLIENTS = ("lean", "sdk")
SAMPLE = Path(__file__).resolve().parent.parent / "datasets" / "sample.jsonl"


def provider_for(server: ScriptedServer, client: str, **fields: Any) -> Any:
    return make_chat_provider(chat_spec(server, options={"client": client}, **fields))


def test_the_lean_client_is_the_default_and_the_sdk_a_choice(server: ScriptedServer) -> None:
    assert make_chat_provider(chat_spec(server)).client == "lean"  # type: ignore[attr-defined]
    assert provider_for(server, "sdk").client == "sdk"
    with pytest.raises(ProviderConfigError, match="client = 'httpx': use one of lean, sdk"):
        provider_for(server, "httpx")


def test_a_proxy_variable_sends_through_the_sdk(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # the SDK's httpx honours it
    assert make_chat_provider(chat_spec(server)).client == "sdk"  # type: ignore[attr-defined]


def test_a_base_url_with_a_query_sends_through_the_sdk(server: ScriptedServer) -> None:
    url = f"{server.openai_base_url}?api-version=2024-06-01"  # joined by the SDK's own rules
    provider = make_chat_provider(resolve_spec("local", {"base_url": url}))
    assert provider.client == "sdk"  # type: ignore[attr-defined]


def test_both_clients_send_the_same_request_and_read_the_same_answer(
    server: ScriptedServer, fake_key: str
) -> None:
    request = CHAT.model_copy(update={"params": FULL_PARAMS})
    answers = {}
    for client in CLIENTS:
        spec = {"api_key_env": "OPENAI_API_KEY", "extra_body": {"enable_thinking": False}}
        answers[client] = complete(provider_for(server, client, **spec), request, request)
    lean, sdk = answers["lean"], answers["sdk"]
    assert lean == sdk and lean[0].logprobs  # the logprobs too, token by token
    assert len(server.requests) == 4
    first, _, third, _ = server.requests
    assert first.path == third.path == OPENAI_PATH
    assert first.body == third.body  # the same JSON ...
    assert first.headers["content-length"] == third.headers["content-length"]  # ... bytes
    for name in ("authorization", "content-type", "accept", "accept-encoding"):
        assert first.headers[name] == third.headers[name], name
    assert first.headers["authorization"] == f"Bearer {fake_key}"


async def _failure(provider: Any) -> BaseException:
    """What one call raised (the provider closed after it)."""
    try:
        await provider.complete(CHAT, timeout=1.0)
    except Exception as exc:
        return exc
    finally:
        await provider.aclose()
    raise AssertionError("the fault was not raised")


@pytest.mark.parametrize(("item", "expected"), FAULT_CASES)
def test_every_fault_is_classified_alike_by_both_clients(
    make_server: Callable[..., ScriptedServer], item: Any, expected: RetryDecision
) -> None:
    seen = {}
    for client in CLIENTS:
        server = make_server()
        server.enqueue(item)
        provider = provider_for(server, client)
        exc = run(_failure(provider))
        seen[client] = (provider.classify(exc), never_sent(exc))
        assert len(server.requests) == 1, client  # exactly one request, no retry underneath
    assert seen["lean"] == seen["sdk"] == (expected, False)


def test_a_refused_connection_was_never_sent_by_either_client() -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, not listening: every connection refused
    url = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
    try:
        for client in CLIENTS:
            spec = resolve_spec("local", {"base_url": url, "options": {"client": client}})
            provider = make_chat_provider(spec)
            with pytest.raises(Exception) as caught:
                complete(provider, CHAT)
            decision = provider.classify(caught.value)
            assert decision == RetryDecision(retry=True, kind="connection"), client
            assert never_sent(caught.value), client
    finally:
        closed.close()


def _run_dir(server: ScriptedServer, tmp_path: Path, client: str) -> tuple[Path, RunOutcome]:
    config = load_config(
        None,
        {
            "judge.provider": "local",
            "judge.model": "judge-test",
            "provider.base_url": server.openai_base_url,
            "provider.options": {"client": client},
            "dataset.path": str(SAMPLE),
            "run.cache": str(tmp_path / f"{client}.sqlite"),
            "run.concurrency": 4,
            'prices."judge-test"': {"prompt": 2.5, "completion": 10.0},
        },
    )
    out = tmp_path / client
    outcome = asyncio.run(run_async(config, load_queries(config), out))
    assert outcome.status == "complete", outcome
    assert outcome.cost_usd > 0 and outcome.prompt_tokens > 0
    return out, outcome


def test_a_run_gives_identical_verdicts_usage_and_cost_through_either_client(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    server = make_server(responder=hashed_responder())
    runs = {client: _run_dir(server, tmp_path, client) for client in CLIENTS}
    lines = {}
    for client, (out, _) in runs.items():
        results = read_results(out / "verdicts.jsonl")
        timeless = [
            jq.model_copy(
                update={
                    "verdicts": tuple(v.model_copy(update={"latency_s": 0}) for v in jq.verdicts)
                }
            )
            for jq in results
        ]
        lines[client] = sorted(jq.model_dump_json() for jq in timeless)
    assert lines["lean"] == lines["sdk"] and lines["lean"]
    (_, lean), (_, sdk) = runs["lean"], runs["sdk"]
    for field in ("requests", "prompt_tokens", "completion_tokens", "cost_usd", "retries"):
        assert getattr(lean, field) == getattr(sdk, field), field


def test_a_lean_run_never_imports_the_sdk(server: ScriptedServer, tmp_path: Path) -> None:
    script = f"""
import asyncio, sys
from judge.providers import make_chat_provider, resolve_spec
from tests.provider_harness import CHAT, complete
provider = make_chat_provider(resolve_spec("local", {{"base_url": "{server.openai_base_url}"}}))
assert complete(provider, CHAT)[0].text
print(sorted(m for m in ("openai", "httpx2") if m in sys.modules))
"""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert len(server.requests) == 1


# --- framing: what real servers do that ScriptedServer does not ----------------------------


class RawServer:
    """Answers each request on a connection with the next canned bytes; counts connections.
    ``close_after``: hang up after each answer (a server that keeps nothing alive)."""

    def __init__(
        self, answers: list[bytes], close_after: bool = False, tls: ssl.SSLContext | None = None
    ) -> None:
        self.answers = list(answers)
        self.tls = tls
        self.close_after = close_after
        self.connections = 0
        self.heads: list[bytes] = []
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen()
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self._sock.getsockname()[1]}/v1"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            if self.tls is not None:
                try:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                except OSError:  # a client that does not trust the certificate hangs up
                    conn.close()
                    continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while self.answers:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, data = data.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                while len(data) < length:
                    data += conn.recv(65536)
                data = data[length:]
                self.heads.append(head)
                conn.sendall(self.answers.pop(0))
                if self.close_after:
                    return

    def close(self) -> None:
        self._sock.close()


@pytest.fixture
def raw() -> Iterator[Callable[..., RawServer]]:
    made: list[RawServer] = []

    def make(
        answers: list[bytes], close_after: bool = False, tls: ssl.SSLContext | None = None
    ) -> RawServer:
        made.append(RawServer(answers, close_after, tls))
        return made[-1]

    yield make
    for server in made:
        server.close()


BODY = json.dumps(
    {
        "model": "m",
        "choices": [{"message": {"content": '{"verdict": "yes"}'}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3},
    }
).encode()


def _posts(url: str, count: int, wait: float = 0.0) -> list[Completion]:
    provider = make_chat_provider(resolve_spec("local", {"base_url": url}))

    async def go() -> list[Completion]:
        got = []
        try:
            for _ in range(count):
                got.append(await provider.complete(CHAT, timeout=5))
                await asyncio.sleep(wait)
        finally:
            await provider.aclose()
        return got

    return run(go())


def test_chunked_and_gzipped_answers_are_read_whole(raw: Callable[..., RawServer]) -> None:
    packed = gzip.compress(BODY)
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(packed[i : i + 50]), packed[i : i + 50])
        for i in range(0, len(packed), 50)
    )
    chunked = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    )
    interim = b"HTTP/1.1 100 Continue\r\n\r\n"
    plain = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
    server = raw([chunked, interim + plain])
    first, second = _posts(server.url, 2)
    assert first == second
    assert first.text == '{"verdict": "yes"}' and first.usage.prompt_tokens == 7
    assert server.connections == 1  # kept alive between the two
    assert server.heads[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")


def test_an_answer_that_decodes_past_the_limit_is_refused_not_inflated(
    raw: Callable[..., RawServer],
) -> None:
    """A small gzip body that would decode to gigabytes is refused at MAX_DECODED, naming why,
    instead of being inflated whole (2 MB of gzip took 6.4 GB)."""
    from judge.providers.lean_http import MAX_DECODED

    bomb = gzip.compress(b" " * (MAX_DECODED + 2**20) + BODY)
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(bomb), bomb)
    )
    failure = _lean_failure(raw, answer)
    assert failure is not None and f"decodes to more than {MAX_DECODED // 2**20} MiB" in str(
        failure
    )


def _lean_failure(raw: Callable[..., RawServer], answer: bytes) -> BaseException | None:
    """What one chat completion through the lean client raises when ``answer`` comes back."""
    server = raw([answer])
    provider = make_chat_provider(resolve_spec("local", {"base_url": server.url}))

    async def go() -> BaseException | None:
        try:
            await provider.complete(CHAT, timeout=10)
        except Exception as exc:
            return exc
        finally:
            await provider.aclose()
        return None

    return run(go())


def test_an_answer_longer_than_any_is_refused_as_it_comes(raw: Callable[..., RawServer]) -> None:
    """A server sending a 50 MB "reason" had it kept: 2.2 GB of memory for four passages and
    a results file, a report and a cache of hundreds of MB. A body past MAX_DECODED is
    refused from its Content-Length, before it is read."""
    from judge.providers.lean_http import MAX_DECODED

    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (MAX_DECODED + 1, BODY)
    )
    failure = _lean_failure(raw, answer)
    assert failure is not None and f"passes {MAX_DECODED // 2**20} MiB" in str(failure)
    # Final: asked again, the answer would be generated and paid again (it had been, six times).
    provider = make_chat_provider(resolve_spec("local", {"base_url": "http://127.0.0.1:9/v1"}))
    assert isinstance(failure, Exception) and not provider.classify(failure).retry
    # Through a judge: one request, an error verdict, its worst case counted as spent.
    server = raw([answer] * 6)
    with Judge(provider="local", model="m", base_url=server.url) as judge:
        (verdict,) = judge.judge("q", ["p"]).verdicts
        assert verdict.status == "error" and "passes" in (verdict.error or "")
        assert len(server.heads) == 1 and judge.caller.stats.worst_counted == 1


def _answer(status: str, body: bytes) -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    return head.encode() + b"\r\n\r\n" + body


@pytest.mark.parametrize("client", ["lean", "sdk"])
def test_an_account_out_of_credit_and_an_error_in_a_200_are_final_in_the_servers_words(
    raw: Callable[..., RawServer], client: str
) -> None:
    """A 429 whose code says the account has no credit left is final (no wait cures it: it
    was retried as a rate limit), and an error object answered with 200 is the server's own
    message, final (it was 'malformed chat completion: choices', retried six times)."""
    quota = (
        b'{"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}}'
    )
    server = raw([_answer("429 Too Many Requests", quota), _answer("200 OK", quota)])
    provider = make_chat_provider(
        resolve_spec("local", {"base_url": server.url, "options": {"client": client}})
    )

    async def go() -> list[BaseException]:
        failures = []
        try:
            for _ in range(2):
                try:
                    await provider.complete(CHAT, timeout=5)
                except Exception as exc:
                    failures.append(exc)
        finally:
            await provider.aclose()
        return failures

    rate, in_200 = run(go())
    assert "You exceeded your current quota" in str(rate)
    assert provider.classify(rate) == RetryDecision(retry=False, kind="client")
    assert f"an error in a 200 answer from {server.url}/chat/completions: You exceeded" in str(
        in_200
    )
    assert provider.classify(in_200) == RetryDecision(retry=False, kind="client")


def test_a_connection_the_server_closes_is_not_reused(raw: Callable[..., RawServer]) -> None:
    keep_alive = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
    until_close = b"HTTP/1.0 200 OK\r\n\r\n" + BODY
    server = raw([keep_alive, until_close, keep_alive], close_after=True)
    answers = _posts(server.url, 3, wait=0.05)
    assert [a.text for a in answers] == ['{"verdict": "yes"}'] * 3  # no request failed
    assert server.connections == 3


def test_a_pool_of_connections_serves_concurrent_posts(server: ScriptedServer) -> None:
    async def go() -> list[int]:
        client = LeanClient(server.openai_base_url, {"Content-Type": "application/json"})
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]})
        try:
            answers = await asyncio.gather(
                *(client.post("/chat/completions", body.encode(), timeout=5) for _ in range(20))
            )
        finally:
            await client.aclose()
        return [a.status for a in answers]

    assert run(go()) == [200] * 20
    assert len(server.requests) == 20


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_https_is_trusted_as_the_sdk_trusts_it(
    raw: Callable[..., RawServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    made = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
    made += ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)]
    subprocess.run(["openssl", *made], check=True, capture_output=True)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    plain = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
    untrusted = raw([plain], tls=tls)
    for client in CLIENTS:  # a certificate nobody vouches for: refused by both, not sent
        spec = resolve_spec("local", {"base_url": untrusted.url, "options": {"client": client}})
        provider = make_chat_provider(spec)
        with pytest.raises(Exception) as caught:
            complete(provider, CHAT)
        assert provider.classify(caught.value).kind == "connection", client
        assert never_sent(caught.value), client
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # now trusted, by both
    answers = {}
    for client in CLIENTS:
        server = raw([plain], tls=tls)
        spec = resolve_spec("local", {"base_url": server.url, "options": {"client": client}})
        answers[client] = complete(make_chat_provider(spec), CHAT)
    assert answers["lean"] == answers["sdk"] and answers["lean"][0].usage.prompt_tokens == 7
