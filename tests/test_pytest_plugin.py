"""judge's pytest plugin, run as users run it: inner pytest sessions (``pytester``) whose tests
use the ``judge`` fixture, ``assert_relevant`` and ``judge_cases``, configured by a
pyproject.toml ``[tool.judge]`` or a judge.toml, judged by a loopback OpenAI-compatible server
through the real SDK. The plugin is loaded by its ``pytest11`` entry point, as after
``pip install 'judge[pytest]'``."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

# What the inner sessions import, imported here first: pytester's in-process runs drop modules
# first imported inside them, and numpy cannot be imported twice in one process.
import judge.calling.cache
import judge.data.datasets
import judge.judging.judge
import judge.metrics.compute  # noqa: F401
from tests.servers import ScriptedServer, keyword_responder
from tests.test_budget import EACH, PRICE, Metered

pytest_plugins = ["pytester"]
CHAT = "/v1/chat/completions"


def chat_calls(srv: ScriptedServer) -> int:
    return sum(r.path == CHAT for r in srv.requests)


def pyproject(srv: ScriptedServer, extra: str = "") -> str:
    """A pyproject.toml whose [tool.judge] points the judge at ``srv``."""
    return f"""
[project]
name = "search-app"

[tool.judge.judge]
provider = "local"
model = "judge-model"
scale = "binary"

[tool.judge.provider]
base_url = "{srv.openai_base_url}"

[tool.judge.run]
timeout_s = 5.0
backoff_base_s = 0.01
max_attempts = 2
{extra}
"""


@pytest.fixture
def yes_if_pale() -> Iterator[ScriptedServer]:
    with ScriptedServer(responder=keyword_responder({"pale": "yes"}, "no")) as srv:
        yield srv


def test_the_fixture_and_assert_relevant_read_naturally_and_failures_show_verdicts(
    pytester: pytest.Pytester, yes_if_pale: ScriptedServer
) -> None:
    pytester.makefile(".toml", pyproject=pyproject(yes_if_pale))
    pytester.makepyfile(
        """
        from judge.pytest_plugin import assert_relevant

        def test_metric(judge):
            judged = judge.judge("why so wan?", ["pale gums", "dog food", "pale and tired"])
            assert judged.metric("precision@2") == 0.5
            assert judged.metric("hit@1") == 1.0

        def test_relevant_enough():
            assert_relevant("why so wan?", ["pale gums", "pale skin"], min_ndcg=0.9)

        def test_not_relevant_enough():
            assert_relevant(
                "why so wan?", ["pale gums", "dog food", "a yellow banana"], min_precision=0.5
            )
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    out = result.stdout.str()
    # The failure: what fell short, then each passage the judge did not find relevant, with
    # its label, the judge's reason and the text; no traceback into judge's code.
    failure = out[out.index("test_not_relevant_enough ___") :].splitlines()[1:7]
    assert failure == [
        "judge: 'why so wan?': precision 0.333 < 0.5",
        "2 of 3 passages not relevant:",
        "  #2 [2] no: scripted answer",
        "      dog food",
        "  #3 [3] no: scripted answer",
        "      a yellow banana",
    ]
    assert "Traceback" not in out
    # One request per distinct passage: the session's judge answers "pale gums" (3 times) and
    # "dog food" (twice) from its cache after the first time.
    assert chat_calls(yes_if_pale) == 5
    result.stdout.fnmatch_lines(["judge: 5 requests, 3 answers from the cache, *"])


def test_assert_relevant_at_k_over_fewer_passages_and_bars_that_cannot_be_compared(
    pytester: pytest.Pytester, yes_if_pale: ScriptedServer
) -> None:
    """With no bar, every passage in the top k must be relevant, of those there are (three
    relevant passages at k=5 failed: precision@5 0.600 < 1, "0 of 3 passages not
    relevant"); a bar that is not a number in [0, 1] is refused before paying (a string was a
    TypeError inside the plugin, NaN passed every test), and so is a k below 1 (0 had checked
    every passage, -1 said "unknown metric 'precision@-1'")."""
    pytester.makefile(".toml", pyproject=pyproject(yes_if_pale))
    pytester.makepyfile(
        """
        import pytest
        from judge.pytest_plugin import assert_relevant

        def test_all_relevant_fewer_than_k():
            assert_relevant("why so wan?", ["pale a", "pale b", "pale c"], k=5)

        def test_one_not_relevant_fewer_than_k():
            assert_relevant("why so wan?", ["pale a", "dog food"], k=5)

        @pytest.mark.parametrize("bar", ["0.5", float("nan"), 1.5, True])
        def test_bad_bar(bar):
            with pytest.raises((TypeError, ValueError), match="the bar for ndcg"):
                assert_relevant("why so wan?", ["pale a"], min_ndcg=bar)

        @pytest.mark.parametrize("k", [0, -1, 2.0])
        def test_bad_k(k):
            with pytest.raises(ValueError, match="k must be a whole number >= 1"):
                assert_relevant("why so wan?", ["pale a"], k=k)
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=8, failed=1)
    out = result.stdout.str()
    assert "judge: 'why so wan?': precision@2 0.500 < 1" in out
    assert chat_calls(yes_if_pale) == 4  # pale a, b, c and dog food; no bad bar paid for


def test_the_cache_is_shared_across_the_session_and_the_next_one(
    pytester: pytest.Pytester, yes_if_pale: ScriptedServer
) -> None:
    pytester.makefile(".toml", pyproject=pyproject(yes_if_pale))
    pytester.makepyfile(
        """
        PASSAGES = ["pale gums", "dog food"]

        def test_one(judge):
            assert judge.judge("why so wan?", PASSAGES).metric("precision") == 0.5

        def test_two(judge):
            assert judge.judge("why so wan?", PASSAGES).metric("precision") == 0.5
        """
    )
    pytester.runpytest().assert_outcomes(passed=2)
    assert chat_calls(yes_if_pale) == 2  # the second test was answered from the cache
    cache = pytester.path / ".pytest_cache" / "d" / "judge" / "cache.sqlite"
    assert cache.is_file()
    pytester.runpytest().assert_outcomes(passed=2)
    assert chat_calls(yes_if_pale) == 2  # and so was the whole next session
    # --judge-cache puts it elsewhere: a fresh cache, asked again.
    elsewhere = pytester.path / "own" / "answers.sqlite"
    pytester.runpytest(f"--judge-cache={elsewhere}").assert_outcomes(passed=2)
    assert chat_calls(yes_if_pale) == 4 and elsewhere.is_file()


def test_judge_cases_give_one_test_per_query_named_by_its_id_in_junit(
    pytester: pytest.Pytester, yes_if_pale: ScriptedServer
) -> None:
    pytester.makefile(".toml", pyproject=pyproject(yes_if_pale))
    rows = [
        '{"query_id": "anaemia", "query": "why so wan?", "retrieved_texts": ["pale gums"]}',
        '{"query_id": "dogs", "query": "what do dogs eat?", "retrieved_texts": ["kibble"]}',
        '{"query_id": "tired", "query": "tired?", "retrieved_texts": ["pale", "pale face"]}',
    ]
    (pytester.path / "data").mkdir()
    (pytester.path / "data" / "queries.jsonl").write_text("\n".join(rows) + "\n")
    pytester.makepyfile(
        test_queries="""
        import pytest
        from judge.pytest_plugin import assert_relevant, judge_cases

        @pytest.mark.parametrize("case", judge_cases("data/queries.jsonl"))
        def test_each_query(case):
            assert_relevant(case, min_precision=1.0)
        """
    )
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest(f"--junitxml={junit}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    cases = {
        case.get("name"): case.find("failure") is not None
        for case in ET.parse(junit).getroot().iter("testcase")
    }
    assert cases == {
        "test_each_query[anaemia]": False,
        "test_each_query[dogs]": True,
        "test_each_query[tired]": False,
    }
    assert "  #1 [1] no: scripted answer\n      kibble\n" in result.stdout.str()


def test_a_session_over_budget_fails_naming_the_budget_and_spends_no_more(
    pytester: pytest.Pytester,
) -> None:
    metered = Metered()
    with ScriptedServer(responder=metered) as srv:
        cap = 0.03  # a few calls' worst case (each answer costs EACH, $0.0013)
        budget = f'max_cost = {cap}\n\n[tool.judge.prices."judge-model"]\n'
        budget += f"prompt = {PRICE['prompt']}\ncompletion = {PRICE['completion']}\n"
        pytester.makefile(".toml", pyproject=pyproject(srv, budget))
        pytester.makepyfile(
            """
            import pytest

            @pytest.mark.parametrize("n", range(40))
            def test_many(judge, n):
                judge.judge(f"question {n}", [f"text {n}"])
            """
        )
        result = pytester.runpytest("-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    assert outcomes["passed"] >= 1 and outcomes["failed"] >= 1
    assert outcomes["passed"] + outcomes["failed"] == 40
    assert 0 < metered.billed * EACH <= cap
    assert metered.billed == outcomes["passed"]  # a failed test asked nothing
    out = result.stdout.str()
    first = out[out.index("_ test_many[") :].splitlines()[1]
    assert first.startswith("judge: the session's budget is spent ([run] max_cost $0.03 in ")
    assert "pyproject.toml [tool.judge]): cost budget reached: spent $" in first
    assert "During handling" not in out


def test_judge_toml_is_read_and_config_errors_are_one_line(
    pytester: pytest.Pytester, yes_if_pale: ScriptedServer
) -> None:
    pytester.makepyfile(
        """
        def test_uses_it(judge):
            assert judge.judge("why so wan?", ["pale gums"]).metric("precision") == 1.0
        """
    )
    # No config anywhere: the test errors, saying where a config could go.
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    assert "judge: no config: add a [tool.judge] table to " in result.stdout.str()
    # A typo in [tool.judge] is named with where it is.
    pytester.makefile(".toml", pyproject=pyproject(yes_if_pale, "concurency = 3"))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    assert "pyproject.toml [tool.judge]: run.concurency: " in result.stdout.str()
    assert "Traceback" not in result.stdout.str()
    # A judge.toml in the rootdir wins over pyproject.toml.
    toml = pyproject(yes_if_pale).replace("[tool.judge.", "[").split("[judge]", 1)[1]
    (pytester.path / "judge.toml").write_text("[judge]" + toml)
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert chat_calls(yes_if_pale) == 1


def test_an_unreachable_provider_fails_the_test_in_one_line(pytester: pytest.Pytester) -> None:
    """judge.judge() against a port nobody listens on gave every verdict as an error, and a
    test that only looked at the verdicts passed."""
    with ScriptedServer() as gone:
        text = pyproject(gone)
    pytester.makefile(".toml", pyproject=text)
    pytester.makepyfile(
        """
        def test_judged(judge):
            judged = judge.judge("why so wan?", ["pale gums"])
            assert judged is not None
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "judge: no passage could be judged: " in out and "Traceback" not in out


def test_the_plugin_is_lazy_and_import_judge_does_not_import_pytest(
    pytester: pytest.Pytester,
) -> None:
    """pytest loads the plugin in every session (its entry point); a session that does not use
    it imports none of judge's stages nor the providers' SDKs."""
    pytester.makepyfile(
        """
        import sys

        def test_plain(pytestconfig):
            assert pytestconfig.pluginmanager.has_plugin("judge")
            heavy = {"judge.judging.judge", "judge.config", "openai", "pydantic", "numpy"}
            assert not heavy & set(sys.modules)
        """
    )
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
    code = "import sys, judge; judge.Judge; judge.load_config; print('pytest' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_plugin_is_registered_by_its_entry_point() -> None:
    from importlib.metadata import entry_points

    found = {e.name: e.value for e in entry_points(group="pytest11")}
    assert found.get("judge") == "judge.pytest_plugin"
    assert 'judge = "judge.pytest_plugin"' in Path("pyproject.toml").read_text()
