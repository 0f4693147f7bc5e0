"""judge in pytest: a ``judge`` fixture, ``assert_relevant``, and one test per dataset query.

Installed with ``pip install 'judge[pytest]'``; pytest loads it by itself (the ``pytest11``
entry point ``judge``; ``-p no:judge`` turns it off)::

    import pytest
    from judge.pytest_plugin import assert_relevant, judge_cases

    def test_rust_docs_come_first(judge):
        judged = judge.judge("what is rust?", search("what is rust?"))
        assert judged.metric("precision@5") >= 0.6

    def test_top_results_are_relevant():
        assert_relevant("what is rust?", search("what is rust?"), min_ndcg=0.7)

    @pytest.mark.parametrize("case", judge_cases("queries.jsonl"))   # one test per query
    def test_each_query(case):
        assert_relevant(case.query, search(case.query), min_precision=0.5, k=5)

**Config.** ``--judge-config PATH`` (or the ini option ``judge_config``), else ``judge.toml`` in
the rootdir, else the ``[tool.judge]`` table of the rootdir's ``pyproject.toml``, holding what a
judge.toml holds (``[tool.judge.judge]`` provider and model, ``[tool.judge.run]`` budget,
``[tool.judge.prices.MODEL]``, ``[tool.judge.metrics]``...), read by judge's own config loader;
relative paths are taken from the file's folder.

**One judge per session.** The fixture and ``assert_relevant`` share one Judge, built on first
use: its cache, its limits and its budget are the session's. The cache is ``--judge-cache PATH``
(or ini ``judge_cache``), else the config's ``[run] cache``, else ``judge/cache.sqlite`` in
pytest's cache directory (``.pytest_cache``: a second session pays for nothing already asked),
else a temporary directory; never the user's cache. ``[run] max_cost`` / ``max_tokens`` cap the
whole session: a test whose question would pass the cap fails, naming the budget, instead of
spending more (answers already cached still pass). The terminal summary says what was asked,
answered from the cache and spent.

**Failures** name the metrics that fell short and list the passages the judge did not find
relevant (or could not judge), each with its label and reason. A metric that is undefined
(a verdict the judge could not give, no passages) fails, saying why, rather than comparing None.
Errors of judge itself (bad config, an unreachable provider) fail the test in one line.

Lazy: pytest loads this module in every session; it imports only pytest and ``judge``'s
light package root, and judge's stages only once a test uses the fixture, ``assert_relevant``
or ``judge_cases``. ``import judge`` never imports this module (nor pytest).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest

import judge as api  # the package root: light, its names imported on first use

__all__ = ["JudgeSession", "Judged", "assert_relevant", "judge_cases"]

_SESSION = pytest.StashKey["JudgeSession"]()
# Configs of the pytest sessions running in this process, innermost last (pytester nests them).
_CONFIGS: list[pytest.Config] = []
_TEXT = 80  # characters of a passage shown in a failure
T = TypeVar("T")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("judge", "judge: relevance assertions judged by an LLM")
    group.addoption("--judge-config", help="judge.toml to read (default: see judge's docs)")
    group.addoption("--judge-cache", help="the judge's answer cache for this session (SQLite)")
    parser.addini("judge_config", "judge.toml to read, relative to the rootdir")
    parser.addini("judge_cache", "the judge's answer cache (SQLite), relative to the rootdir")


def pytest_configure(config: pytest.Config) -> None:
    _CONFIGS.append(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(_SESSION, None)
    if session is not None:
        session.close()
        del config.stash[_SESSION]
    if config in _CONFIGS:
        _CONFIGS.remove(config)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    session = config.stash.get(_SESSION, None)
    if session is not None:
        terminalreporter.write_line(session.summary())


@pytest.fixture(scope="session", name="judge")
def judge_fixture(pytestconfig: pytest.Config) -> JudgeSession:
    """The session's judge: ``judge.judge(query, passages)``, ``judge.assert_relevant(...)``,
    ``judge.judge_many(rows)``; configured as the module docstring says."""
    return _session(pytestconfig)


def _fail(message: str) -> NoReturn:
    pytest.fail(message, pytrace=False)


def _session(config: pytest.Config | None = None) -> JudgeSession:
    if config is None:
        if not _CONFIGS:
            raise RuntimeError("judge's pytest plugin: no pytest session is running")
        config = _CONFIGS[-1]
    if _SESSION not in config.stash:
        try:
            config.stash[_SESSION] = JudgeSession.start(config)
        except api.JudgeError as exc:
            why = f"judge: {exc}"
        if _SESSION not in config.stash:
            _fail(why)
    return config.stash[_SESSION]


def _option(config: pytest.Config, name: str) -> Path | None:
    """A path given on the command line (from the current directory) or in the ini file (from
    the rootdir)."""
    given = config.getoption(f"--{name.replace('_', '-')}")
    if given:
        return Path(given)
    ini = config.getini(name)
    return config.rootpath / str(ini) if ini else None


def _pyproject_table(path: Path) -> dict[str, Any] | None:
    """``[tool.judge]`` of a pyproject.toml, None when it has none."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except (OSError, ValueError) as exc:
        raise api.ConfigError(f"{path}: cannot read: {exc}") from None
    table = data.get("tool", {}).get("judge")
    if table is not None and not isinstance(table, dict):
        raise api.ConfigError(f"{path}: [tool.judge] must be a table")
    return table


def load_session_config(config: pytest.Config) -> api.RunConfig:
    """The run config the session's judge is built from (see the module docstring)."""
    from judge.config import _relative_to  # the config loader's own path rule

    given = _option(config, "judge_config")
    if given is not None:
        return api.load_config(given)
    if (config.rootpath / "judge.toml").is_file():
        return api.load_config(config.rootpath / "judge.toml")
    pyproject = config.rootpath / "pyproject.toml"
    table = _pyproject_table(pyproject) if pyproject.is_file() else None
    if table is None:
        raise api.ConfigError(
            f"no config: add a [tool.judge] table to {pyproject}, a judge.toml to "
            f"{config.rootpath}, or pass --judge-config PATH"
        )
    where = f"{pyproject} [tool.judge]"
    _relative_to(pyproject.parent, table)
    try:
        loaded = api.load_config(None, overrides=table)
    except api.ConfigError as exc:
        raise api.ConfigError(str(exc).replace("<defaults>", where, 1)) from None
    return loaded.model_copy(update={"source": where})


class JudgeSession:
    """The Judge a pytest session shares (its cache, limits and budget), with assertions."""

    def __init__(self, inner: api.Judge, config: api.RunConfig, cache: Path) -> None:
        self.inner, self.config, self.cache_path = inner, config, cache
        self._scratch: Path | None = None

    @classmethod
    def start(cls, pytest_config: pytest.Config) -> JudgeSession:
        from judge.calling.cache import open_cache

        config = load_session_config(pytest_config)
        scratch = None
        cache = _option(pytest_config, "judge_cache")
        if cache is None and config.run.cache:
            cache = Path(config.run.cache)
        if cache is None and pytest_config.pluginmanager.has_plugin("cacheprovider"):
            assert pytest_config.cache is not None  # the cacheprovider plugin is on
            cache = pytest_config.cache.mkdir("judge") / "cache.sqlite"
        if cache is None:
            scratch = Path(tempfile.mkdtemp(prefix="judge-pytest-"))
            cache = scratch / "cache.sqlite"
        cache.parent.mkdir(parents=True, exist_ok=True)
        limits = api.Limits.from_config(config)
        inner = api.Judge.from_config(config, cache=open_cache(cache), limits=limits)
        session = cls(inner, config, cache)
        session._scratch = scratch
        return session

    def close(self) -> None:
        self.inner.close()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    def _budget(self) -> str:
        run = self.config.run
        caps = [f"max_cost ${run.max_cost:g}"] if run.max_cost else []
        caps += [f"max_tokens {run.max_tokens}"] if run.max_tokens else []
        return f"[run] {', '.join(caps)} in {self.config.source}"

    def judge(self, query: str | api.Query, passages: Sequence[Any] | None = None) -> Judged:
        """Judge ``passages`` for ``query`` (or a Query's own); a test fails, in one line, on
        the budget or an error of judge itself, or when no passage could be judged at all (an
        unreachable provider gave every verdict as an error: the test passed)."""
        judged = self._call(self.inner.judge, query, passages)
        failed = [v for v in judged.verdicts if v.status == "error"]
        if failed and len(failed) == len(judged.verdicts):
            _fail(f"judge: no passage could be judged: {failed[0].error}")
        return Judged(judged, self)

    def judge_many(self, rows: Any, **kwargs: Any) -> api.Judgements:
        """:meth:`judge.Judge.judge_many` on the session's judge (no progress bar)."""
        kwargs.setdefault("progress", False)
        return self._call(self.inner.judge_many, rows, **kwargs)

    def _call(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``method(*args, **kwargs)``, or the test failed in one line (outside the except
        block, so pytest shows no chained exception): the budget named, or judge's error."""
        try:
            return method(*args, **kwargs)
        except api.BudgetExceeded as exc:
            why = f"judge: the session's budget is spent ({self._budget()}): {exc}"
        except api.JudgeError as exc:
            why = f"judge: {exc}"
        _fail(why)

    def assert_relevant(
        self,
        query: str | api.Query,
        passages: Sequence[Any] | None = None,
        *,
        min_ndcg: float | None = None,
        min_precision: float | None = None,
        k: int | None = None,
        metrics: Mapping[str, float] | None = None,
    ) -> Judged:
        """See :func:`assert_relevant`."""
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"assert_relevant: k must be a whole number >= 1, got {k!r}")
        at = "" if k is None else f"@{k}"
        wanted = dict(metrics or {})
        if min_ndcg is not None:
            wanted[f"ndcg{at}"] = min_ndcg
        if min_precision is not None:
            wanted[f"precision{at}"] = min_precision
        for name, floor in wanted.items():  # before paying: a bar that cannot be compared
            if isinstance(floor, bool) or not isinstance(floor, int | float):
                raise TypeError(
                    f"assert_relevant: the bar for {name} must be a number, got {floor!r}"
                )
            if not 0 <= floor <= 1:  # NaN too: a NaN bar passed every test
                raise ValueError(
                    f"assert_relevant: the bar for {name} must be in [0, 1], got {floor}"
                )
        judged = self.judge(query, passages)
        if not wanted:  # no bar given: every passage in the top k must be relevant
            # ...of those there are: three relevant passages asked at k=5 are all relevant
            # (precision@5 would count two missing ones as not relevant, and fail).
            shown = len(judged.judged.verdicts)
            top = shown if k is None else min(k, shown)
            wanted[f"precision@{top}" if top else "precision"] = 1.0
        short = []
        for name, floor in wanted.items():
            value = judged.metric(name)
            if value < floor:
                short.append(f"{name} {value:.3f} < {floor:g}")
        if short:
            _fail(judged.explain("; ".join(short), k))
        return judged

    def summary(self) -> str:
        stats, budget = self.inner.caller.stats, self.inner.caller.budget
        spent = f"${budget.cost:.4f}" if self.config.price() is not None else "cost unknown"
        cap = f" of {self._budget()}" if budget.capped else ""
        return (
            f"judge: {stats.requests} requests, {stats.cache_hits} answers from the cache, "
            f"{budget.usage.total} tokens, {spent}{cap}; cache {self.cache_path}"
        )


class Judged:
    """One query judged in a test: the :class:`judge.JudgedQuery` (its fields read through)
    and :meth:`metric`, any metric by name."""

    def __init__(self, judged: api.JudgedQuery, session: JudgeSession) -> None:
        self.judged, self._session = judged, session

    def __getattr__(self, name: str) -> Any:
        return getattr(self.judged, name)

    def __repr__(self) -> str:
        ok = sum(v.status == "ok" for v in self.judged.verdicts)
        relevant = sum(bool(v.relevant) for v in self.judged.verdicts)
        return (
            f"<Judged {self.judged.query.query!r}: {relevant} of {len(self.judged.verdicts)} "
            f"relevant, {ok} judged>"
        )

    def metric(self, name: str) -> float:
        """The metric ``name`` (``"precision@5"``, ``"ndcg"``, any of judge's) for this query;
        a test fails, saying why, when it is undefined."""
        from judge.metrics.compute import metrics_for_queries

        value = self.judged.metrics.get(name)
        if value is None:
            jq, inner = self.judged, self._session.inner
            problem, values = None, {}
            try:
                (values,) = metrics_for_queries(
                    [name], [(jq.query, jq.verdicts)], inner.scale, inner.policy, [jq.rerank_scores]
                )
            except api.JudgeError as exc:  # an unknown name: the valid ones listed
                problem = f"judge: {exc}"
            if problem is not None:
                _fail(problem)
            value = values[name]
        if value is None:
            _fail(self.explain(f"{name} is undefined ({self._undefined_why()})", None))
        return float(value)

    def _undefined_why(self) -> str:
        verdicts = self.judged.verdicts
        if not verdicts:
            return "no passages"
        unjudged = sum(v.status != "ok" for v in verdicts)
        if unjudged:
            return f"the judge gave no verdict on {unjudged} of {len(verdicts)} passages"
        return "no passage was judged relevant"

    def failing(self, k: int | None = None) -> list[api.Verdict]:
        """The verdicts in the top ``k`` (all: None) that are not relevant or not judged."""
        return [
            v
            for v in self.judged.verdicts
            if (k is None or v.rank <= k) and (v.status != "ok" or not v.relevant)
        ]

    def explain(self, what: str, k: int | None) -> str:
        """A failure message: the query, ``what`` fell short, the failing passages' verdicts
        and reasons (label, or the status and why)."""
        passages = {p.id: p for p in self.judged.query.passages}
        failing = self.failing(k)
        scope = "" if k is None else f" in the top {k}"
        lines = [
            f"judge: {self.judged.query.query!r}: {what}",
            f"{len(failing)} of {len(self.judged.verdicts)} passages{scope} not relevant:",
        ]
        for v in failing:
            verdict = v.label if v.status == "ok" else v.status
            why = v.reason if v.status == "ok" else (v.error or v.raw or "")
            text = " ".join(passages[v.passage_id].text.split()) if v.passage_id in passages else ""
            text = text if len(text) <= _TEXT else text[: _TEXT - 1] + "…"
            lines.append(f"  #{v.rank} [{v.passage_id}] {verdict}: {why or '(no reason)'}")
            lines.append(f"      {text}")
        return "\n".join(lines)


def assert_relevant(
    query: str | api.Query,
    passages: Sequence[Any] | None = None,
    *,
    min_ndcg: float | None = None,
    min_precision: float | None = None,
    k: int | None = None,
    metrics: Mapping[str, float] | None = None,
) -> Judged:
    """Judge ``passages`` for ``query`` with the session's judge and fail the test unless
    ``ndcg`` (``ndcg@k``) >= ``min_ndcg``, ``precision`` (``precision@k``) >= ``min_precision``
    and every ``metrics`` name >= its value (each bar a number in [0, 1]); with none of them,
    every passage (in the top k, of those there are) must be relevant. The failure lists the
    passages the judge did not find relevant, with its reasons. Returns the :class:`Judged`
    query."""
    return _session().assert_relevant(
        query, passages, min_ndcg=min_ndcg, min_precision=min_precision, k=k, metrics=metrics
    )


def judge_cases(path: str | Path, *, columns: Mapping[str, str] | str | None = None) -> list[Any]:
    """A dataset file's queries (JSONL or Parquet, as ``judge run`` reads it; ``columns``: a
    mapping or a preset) as ``pytest.param``s with the query ids as test ids (``id-engine``
    when the file has several engines), for ``@pytest.mark.parametrize("case", ...)``: one
    test per query, so JUnit shows which failed. Each case is a :class:`judge.Query`. A
    relative path is taken from the calling test file's folder."""
    from judge.data.datasets import read_queries

    where = Path(path)
    if not where.is_absolute():
        caller = sys._getframe(1).f_globals.get("__file__")
        where = (Path(caller).parent if caller else Path.cwd()) / where
    try:
        queries = read_queries(where, columns=columns).queries
    except api.JudgeError as exc:
        queries, why = (), f"judge_cases: {exc}"
    if not queries:
        _fail(why)
    several = len({q.engine for q in queries}) > 1
    return [
        pytest.param(q, id=f"{q.query_id}-{q.engine}" if several else q.query_id) for q in queries
    ]
