"""The embedded judge: a local llama.cpp OpenAI-compatible server, started and stopped by us.

``EmbeddedServer`` runs llama-cpp-python's server (the optional extra ``judge[embedded]``,
through the small ``_LAUNCHER`` below) on a free 127.0.0.1 port and waits until
``GET /v1/models`` answers.
The server must never outlive us, so it is stopped on every way out:

- normal exit and exceptions: the context manager (or ``stop()``) terminates, waits, kills;
- Ctrl-C: ``asyncio.run`` cancels the task, and the context manager's exit still runs;
- interpreter exit without ``stop()``: an ``atexit`` hook stops every live server;
- the parent killed outright (SIGKILL, or SIGTERM's default action): on Linux the child asks
  the kernel for ``PR_SET_PDEATHSIG`` = SIGKILL, so it dies with the thread that spawned it
  (hence: start servers from a long-lived thread, not from a short-lived worker thread).
  Elsewhere, a SIGTERM handler that raises ``SystemExit`` is installed if none is set.

The server runs in its own session (process group), so a terminal Ctrl-C reaches only us
and we decide how the server stops. Its output goes to a nameless temporary file whose tail
is quoted when it fails to start. POSIX only (process groups, ``pread``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import ctypes.util
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any

import httpx

from judge.errors import ModelError
from judge.providers.embedded import EMBEDDED_CONTEXT

_PR_SET_PDEATHSIG = 1
_STOP_GRACE = 5.0
# Options we interpret ourselves; every other key is passed to the server as --key value.
_OURS = frozenset({"model", "startup_timeout", "fetch", "extra_buffers"})
_DEFAULTS: dict[str, Any] = {
    "n_ctx": EMBEDDED_CONTEXT,
    "logits_all": True,  # per-token top_logprobs in chat completions need it
    "use_mlock": False,  # a judge has no need to pin 0.5 GB of RAM
    "verbose": False,
}

# Runs the stock llama_cpp server with llama.cpp's "extra buffer types" switched off.
# Those are CPU-specific weight layouts (AMX, repacked quants); on AMX-capable Xeons a
# native build segfaults in ggml_backend_amx_mul_mat on the first prompt, and
# llama-cpp-python exposes no setting for use_extra_bufts, so the launcher sets it.
_LAUNCHER = """\
import sys
import llama_cpp.llama_cpp as lib
_defaults = lib.llama_model_default_params
def _params():
    params = _defaults()
    params.use_extra_bufts = False
    return params
lib.llama_model_default_params = _params
from llama_cpp.server.__main__ import main
sys.argv[0] = "llama_cpp.server"
main()
"""

_live: set[EmbeddedServer] = set()
_live_lock = threading.Lock()


def _stop_all_live() -> None:
    with _live_lock:
        servers = list(_live)
    for server in servers:
        server.stop()


atexit.register(_stop_all_live)


def _load_prctl() -> Any:
    """libc's prctl, resolved in the parent: loading a library after fork() can deadlock."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _die_with_parent(prctl: Any, parent_pid: int) -> None:
    """Runs in the child between fork and exec: ask for SIGKILL when the parent goes away."""
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # The parent may already have died before prctl took effect.
    if os.getppid() != parent_pid:
        os._exit(1)


def _raise_system_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _exit_on_sigterm() -> None:
    """Without PDEATHSIG, turn a default SIGTERM into SystemExit so cleanup runs."""
    in_main = threading.current_thread() is threading.main_thread()
    if in_main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_system_exit)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _cli_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def require_llama_cpp() -> None:
    """Raise ModelError with the install command when the optional extra is missing."""
    try:
        found = importlib.util.find_spec("llama_cpp") is not None
    except (ImportError, ValueError):  # ValueError: blocked via sys.modules["llama_cpp"] = None
        found = False
    if not found:
        raise ModelError("the embedded judge needs llama-cpp-python: pip install 'judge[embedded]'")


class EmbeddedServer:
    """One llama.cpp server subprocess serving ``model_path`` on 127.0.0.1.

    ``options`` are llama.cpp server settings (``n_ctx``, ``n_threads``, ``n_batch``, ...),
    plus ``startup_timeout`` (seconds, default 120) and ``extra_buffers`` (default false:
    see ``_LAUNCHER``). Use ``async with`` or ``start()``/``stop()``.
    """

    def __init__(self, model_path: Path, options: Mapping[str, Any] | None = None) -> None:
        opts = dict(options or {})
        self.model_path = Path(model_path)
        self.startup_timeout = float(opts.pop("startup_timeout", 120.0))
        self.extra_buffers = bool(opts.pop("extra_buffers", False))
        for key in _OURS:
            opts.pop(key, None)
        threads = os.cpu_count() or 1
        self.settings: dict[str, Any] = {
            **_DEFAULTS,
            "model_alias": self.model_path.stem,
            "n_threads": threads,
            "n_threads_batch": threads,
            **opts,
        }
        self.port = 0
        self._log: IO[bytes] | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible root, e.g. ``http://127.0.0.1:41234/v1``."""
        if self._proc is None:
            raise ModelError("the embedded server is not running")
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """The exit code if the server has died on its own, else None (running or stopped)."""
        return self._proc.poll() if self._proc is not None else None

    async def wait_exited(self, seconds: float) -> int | None:
        """The exit code if the server exits within ``seconds`` (a dying process closes its
        sockets before it can be reaped), else None."""
        deadline = time.monotonic() + seconds
        while (code := self.returncode) is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return code

    def command(self) -> list[str]:
        """The server's command line (port chosen at start)."""
        entry = ["-m", "llama_cpp.server"] if self.extra_buffers else ["-c", _LAUNCHER]
        cmd = [sys.executable, *entry, "--model", str(self.model_path)]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port)]
        for key, value in self.settings.items():
            cmd += [f"--{key}", _cli_value(value)]
        return cmd

    def _spawn(self) -> None:
        require_llama_cpp()
        if not self.model_path.is_file():
            raise ModelError(f"model file not found: {self.model_path} (run: judge model fetch)")
        if self._proc is not None:
            raise ModelError("the embedded server is already running")
        self.port = _free_port()
        # Nameless on POSIX (unlinked at once), so no log file outlives even a SIGKILL.
        # It stays open for the server's lifetime and is closed by stop(), not by a `with`.
        self._log = tempfile.TemporaryFile(prefix="judge-llama-", suffix=".log")  # noqa: SIM115
        prctl = _load_prctl() if sys.platform.startswith("linux") else None
        if prctl is None:
            _exit_on_sigterm()
        parent = os.getpid()
        try:
            self._proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=(lambda: _die_with_parent(prctl, parent)) if prctl else None,
            )
        except OSError as exc:
            self._close_log()
            raise ModelError(f"could not start the embedded server: {exc}") from exc
        with _live_lock:
            _live.add(self)

    def _deadline_check(self, deadline: float) -> None:
        """Raise ModelError if the server died or the startup timeout has passed."""
        assert self._proc is not None
        code = self._proc.poll()
        if code is not None:
            raise ModelError(f"the embedded server exited with code {code}:\n{self.log_tail()}")
        if time.monotonic() > deadline:
            raise ModelError(
                f"the embedded server did not answer within {self.startup_timeout:g} s "
                f"(option startup_timeout):\n{self.log_tail()}"
            )

    def start(self) -> None:
        """Start the server and block until it answers (sync callers)."""
        self._spawn()
        try:
            deadline = time.monotonic() + self.startup_timeout
            with httpx.Client(timeout=2.0) as client:
                while True:
                    self._deadline_check(deadline)
                    with contextlib.suppress(httpx.HTTPError):
                        if client.get(f"{self.base_url}/models").status_code == 200:
                            return
                    time.sleep(0.2)
        except BaseException:
            self.stop()
            raise

    async def astart(self) -> None:
        """Start the server and wait, without blocking the event loop, until it answers."""
        self._spawn()
        try:
            deadline = time.monotonic() + self.startup_timeout
            async with httpx.AsyncClient(timeout=2.0) as client:
                while True:
                    self._deadline_check(deadline)
                    with contextlib.suppress(httpx.HTTPError):
                        resp = await client.get(f"{self.base_url}/models")
                        if resp.status_code == 200:
                            return
                    await asyncio.sleep(0.2)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Terminate the server's process group, wait, then kill; idempotent."""
        proc, self._proc = self._proc, None
        with _live_lock:
            _live.discard(self)
        if proc is not None:
            self._signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=_STOP_GRACE)
            except subprocess.TimeoutExpired:
                self._signal_group(proc, signal.SIGKILL)
                proc.wait()
        self._close_log()

    def _close_log(self) -> None:
        log, self._log = self._log, None
        if log is not None:
            log.close()

    @staticmethod
    def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        # The server leads its own session, so its pgid is its pid.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    def log_tail(self, lines: int = 20, max_bytes: int = 16_384) -> str:
        """The last lines of the server's output (for error messages).

        Read with ``pread``: the server shares the file offset, which must not move.
        """
        if self._log is None:
            return ""
        fd = self._log.fileno()
        try:
            size = os.fstat(fd).st_size
            data = os.pread(fd, max_bytes, max(0, size - max_bytes))
        except OSError:
            return ""
        text = data.decode("utf-8", errors="replace")
        return "\n".join(text.strip().splitlines()[-lines:])

    async def __aenter__(self) -> EmbeddedServer:
        await self.astart()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
