"""The loopback protocol server run as a process, as benchmarks and kill tests run it."""

from __future__ import annotations

import subprocess
import sys

import httpx


def test_server_runs_as_a_process_and_prints_its_port() -> None:
    command = [sys.executable, "-m", "tests.servers", "openai", "--port", "0"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            word, port = process.stdout.readline().split()
            reply = httpx.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            )
        finally:
            process.kill()
    assert word == "PORT"
    assert reply.json()["choices"][0]["message"]["content"].startswith('{"verdict": ')
