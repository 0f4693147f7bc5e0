"""Shared fixtures: loopback protocol servers and an environment without real API keys."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from judge.providers.embedded.weights import model_path
from tests.servers import ScriptedServer

# The embedded model as the README's setup fetched it, resolved before any test moves HOME;
# tests see it through a link in their own cache directory and never write beside it.
REAL_MODELS = model_path().parent

# Variables that could point a test at a real, paid endpoint.
PROVIDER_ENV = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "DASHSCOPE_API_KEY",
    "DASHSCOPE_HTTP_BASE_URL",
    "CO_API_KEY",
)
FAKE_KEY = "sk-test-SECRET123"


@pytest.fixture(autouse=True)
def _own_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """HOME and XDG_CACHE_HOME point into a temporary directory: no test reads or writes the
    user's cache, history or config. The fetched model is linked in, read-only by use."""
    home = tmp_path_factory.mktemp("home")
    cache = home / ".cache"
    (cache / "judge").mkdir(parents=True)
    if REAL_MODELS.is_dir():
        os.symlink(REAL_MODELS, cache / "judge" / "models")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.delenv("JUDGE_CACHE_DIR", raising=False)


@pytest.fixture(autouse=True)
def _no_provider_env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts without provider keys or base URLs, except tests marked ``live``."""
    if request.node.get_closest_marker("live") is None:
        for name in PROVIDER_ENV:
            monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake_key(monkeypatch: pytest.MonkeyPatch) -> str:
    """``sk-test-SECRET123`` in OPENAI_API_KEY, DASHSCOPE_API_KEY and CO_API_KEY."""
    for name in ("OPENAI_API_KEY", "DASHSCOPE_API_KEY", "CO_API_KEY"):
        monkeypatch.setenv(name, FAKE_KEY)
    return FAKE_KEY


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """A started ScriptedServer with default settings (hashed yes/no judge, no faults)."""
    with ScriptedServer() as started:
        yield started


@pytest.fixture
def make_server() -> Iterator[Callable[..., ScriptedServer]]:
    """``make_server(**ScriptedServer kwargs)`` -> a started server, stopped after the test."""
    started: list[ScriptedServer] = []

    def make(**kwargs: Any) -> ScriptedServer:
        instance = ScriptedServer(**kwargs).start()
        started.append(instance)
        return instance

    yield make
    for instance in started:
        instance.stop()


def skip_or_fail(problem: str | None) -> None:
    """Skip a test whose package or fetched model is missing (``problem`` says which, and how
    to get it); in CI, whose setup installs and fetches them, fail instead: a skip there would
    hide a broken install."""
    if problem and os.environ.get("CI"):
        pytest.fail(f"CI must run the embedded tests: {problem}")
    if problem:
        pytest.skip(problem)
