"""The notebook says what the CLI says: a pandas DataFrame into ``judge_many`` (with ``columns=``
and a hint for other tools' shapes), ``judge compare``'s paired table as a DataFrame, and the
counts and engine means a notebook shows for ``Judgements`` — through the real openai SDK
against loopback servers."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import judge
from judge import InputError, Judge, Judgements, Limits
from judge.analysis.compare import PairedDiff
from judge.cli.main import main
from tests.servers import Answer, Fault, Item, Recorded, ScriptedServer, keyword_responder

FAST = Limits(max_attempts=3, backoff_base_s=0.01, timeout_s=5.0)
CHAT = "/v1/chat/completions"


def make_judge(srv: ScriptedServer, **kwargs: Any) -> Judge:
    options: dict[str, Any] = {"limits": FAST, **kwargs}
    return Judge(provider="local", model="judge-model", base_url=srv.openai_base_url, **options)


@pytest.fixture
def yes_if_pale() -> Iterator[ScriptedServer]:
    with ScriptedServer(responder=keyword_responder({"pale": "yes"}, "no")) as srv:
        yield srv


def ragas_frame() -> pd.DataFrame:
    """Rows as ragas holds them: question, contexts (a list, or a numpy array as parquet gives
    it back), answer; one engine cell missing."""
    return pd.DataFrame(
        {
            "question": ["why so wan?", "what do dogs eat?"],
            "contexts": [["pale gums", "dog food"], np.array(["kibble", "pale and tired"])],
            "answer": ["anaemia", "kibble"],
            "engine": ["dense", None],
        }
    )


# --- a DataFrame in -------------------------------------------------------------------------


def test_a_ragas_dataframe_fails_with_the_columns_to_pass_then_judges_with_them(
    yes_if_pale: ScriptedServer,
) -> None:
    frame = ragas_frame()
    with make_judge(yes_if_pale) as j, pytest.raises(InputError) as caught:
        j.judge_many(frame, progress=False)
    # One line: the missing column, the columns there are, the preset that reads them.
    assert str(caught.value) == (
        "rows: no column gives the query ('query'; columns: question, contexts, answer, "
        "engine); these look like ragas-legacy rows: pass the preset, columns='ragas-legacy'"
    )
    assert yes_if_pale.requests == []

    with make_judge(yes_if_pale) as j:
        got = j.judge_many(
            frame, columns={"question": "query", "contexts": "retrieved_texts"}, progress=False
        )
    assert [(jq.query.query_id, jq.query.engine, jq.query.query) for jq in got] == [
        ("row0", "dense", "why so wan?"),
        ("row1", "default", "what do dogs eat?"),  # the missing cell: the field's default
    ]
    assert [[v.label for v in jq.verdicts] for jq in got] == [["yes", "no"], ["no", "yes"]]
    assert sum(r.path == CHAT for r in yes_if_pale.requests) == 4


def test_columns_rename_a_dataframes_ids_and_passage_fields(yes_if_pale: ScriptedServer) -> None:
    """``columns`` means what ``[dataset] columns`` means: the user's name -> ours, at the
    level (row or passage) where our field lives."""
    frame = pd.DataFrame(
        {
            "qid": [7, 8],
            "text": ["pale?", "food?"],
            "docs": [[{"doc": "a", "body": "pale skin"}], [{"doc": "b", "body": "oats"}]],
        }
    )
    columns = {"qid": "query_id", "text": "query", "docs": "passages", "doc": "id", "body": "text"}
    with make_judge(yes_if_pale) as j:
        got = j.judge_many(frame, columns=columns, progress=False)
    assert [(jq.query.query_id, [p.id for p in jq.query.passages]) for jq in got] == [
        ("7", ["a"]),
        ("8", ["b"]),
    ]
    assert [jq.verdicts[0].label for jq in got] == ["yes", "no"]


def test_phoenix_rows_get_a_hint_that_works_when_followed(yes_if_pale: ScriptedServer) -> None:
    """Phoenix keeps one retrieved document per row (input, reference): the error names the
    preset, which groups them, and the grouped frame with columns judges the same."""
    frame = pd.DataFrame(
        {
            "input": ["why so wan?", "why so wan?", "what do dogs eat?"],
            "reference": ["pale gums", "dog food", "kibble"],
            "document_position": [0, 1, 0],
        }
    )
    with make_judge(yes_if_pale) as j, pytest.raises(InputError) as caught:
        j.judge_many(frame, progress=False)
    assert str(caught.value).endswith(
        "these look like phoenix rows: pass the preset, columns='phoenix'"
    )
    with make_judge(yes_if_pale) as j:
        preset = j.judge_many(frame, columns="phoenix", progress=False)
    assert [[v.label for v in jq.verdicts] for jq in preset] == [["yes", "no"], ["no"]]
    grouped = frame.groupby("input", sort=False)["reference"].agg(list).reset_index()
    with make_judge(yes_if_pale) as j:
        got = j.judge_many(
            grouped, columns={"input": "query", "reference": "retrieved_texts"}, progress=False
        )
    assert [[v.label for v in jq.verdicts] for jq in got] == [["yes", "no"], ["no"]]


def test_no_hint_once_the_columns_are_given_or_for_rows_of_our_shape(
    yes_if_pale: ScriptedServer,
) -> None:
    frame = ragas_frame().assign(question=["why so wan?", " "])
    columns = {"question": "query", "contexts": "retrieved_texts"}
    with make_judge(yes_if_pale) as j, pytest.raises(InputError) as caught:
        j.judge_many(frame, columns=columns, progress=False)
    assert str(caught.value) == "rows[1]: field 'query': is empty"
    with make_judge(yes_if_pale) as j, pytest.raises(InputError) as caught:
        j.judge_many([{"query": "q", "passages": "not a list"}], progress=False)
    assert "hint" not in str(caught.value)
    with make_judge(yes_if_pale) as j, pytest.raises(judge.ConfigError, match="unknown field"):
        j.judge_many(frame, columns={"question": "prompt"}, progress=False)
    assert yes_if_pale.requests == []


def test_import_judge_does_not_import_pandas() -> None:
    code = "import sys, judge; judge.Judge; judge.Judgements; print('pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- compare: judge compare's paired table as a DataFrame -----------------------------------


def two_engines(path: Path, n: int = 8) -> Path:
    """``n`` queries; dense ranks the pale (relevant) passage first, bm25 last."""
    rows = []
    for q in range(n):
        texts = [f"pale fact {q}", f"dog fact {q}", f"oat fact {q}"]
        for engine, order in (("bm25", texts[::-1]), ("dense", texts)):
            passages = [{"id": f"q{q}-{t.split()[0]}", "text": t} for t in order]
            rows.append(
                {
                    "query_id": f"q{q}",
                    "query": f"question {q}",
                    "engine": engine,
                    "passages": passages,
                }
            )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_config(tmp_path: Path, server: ScriptedServer) -> Path:
    dataset = two_engines(tmp_path / "data.jsonl")
    text = f"""
[judge]
provider = "local"
model = "judge-test"
scale = "binary"

[provider]
base_url = "{server.openai_base_url}"

[dataset]
path = "{dataset}"

[metrics]
names = ["ap", "ndcg@3", "precision@1", "relevancy_mean"]

[run]
cache = "{tmp_path / "cache.sqlite"}"
timeout_s = 5.0
backoff_base_s = 0.01
"""
    path = tmp_path / "run.toml"
    path.write_text(text, encoding="utf-8")
    return path


def plain(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """A DataFrame's rows with missing values as None (as JSON has them)."""
    return [
        {k: None if v is pd.NA else v for k, v in r.items()}
        for r in frame.astype(object).to_dict(orient="records")
    ]


def test_compare_gives_the_numbers_of_judge_compare_json(
    make_server: Callable[..., ScriptedServer],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = make_server(responder=keyword_responder({"pale": "yes"}, "no"))
    config = write_config(tmp_path, server)
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == 0
    assert main(["compare", str(out), "--json", str(tmp_path / "c.json")]) == 0
    capsys.readouterr()
    data = json.loads((tmp_path / "c.json").read_text())

    run = judge.read_run(out)
    assert repr(run) == (
        "<JudgedRun: 16 judged queries, engines bm25, dense; 48 verdicts: 48 ok, 0 unparsed, "
        f"0 error, from {out}>"
    )
    assert "<br>judge health: ok</p>" in run._repr_html_()  # from the run's summary.json
    table = run.compare()
    assert list(table.columns) == [*PairedDiff.model_fields, "significant"]
    rows = plain(table)
    assert [{k: r[k] for k in PairedDiff.model_fields} for r in rows] == data["diffs"]
    # Known quality: dense finds the one relevant passage first on all 8 queries, bm25 last.
    ap = next(r for r in rows if r["metric"] == "ap")
    assert (ap["engine"], ap["baseline"], ap["n"]) == ("dense", "bm25", 8)
    assert ap["diff"] == pytest.approx(1 - 1 / 3)
    assert (ap["wins"], ap["ties"], ap["losses"], ap["significant"]) == (8, 0, 0, "better")
    assert ap["p_value"] == pytest.approx(2 / 2**8) and ap["exact"]
    # Every query ties on relevancy_mean (the same passages): no difference, not significant.
    same = next(r for r in rows if r["metric"] == "relevancy_mean")
    assert (same["diff"], same["ties"], same["significant"]) == (0.0, 8, None)

    # The other way round, and on one metric: the engine named is the baseline.
    back = plain(run.compare(baseline="dense", metrics=["ap"]))
    assert [(r["engine"], r["baseline"], r["diff"]) for r in back] == [
        ("bm25", "dense", pytest.approx(-2 / 3))
    ]
    assert back[0]["significant"] == "worse"


def test_compare_engines_takes_what_judge_many_returns(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    server = make_server(responder=keyword_responder({"pale": "yes"}, "no"))
    rows = [json.loads(line) for line in two_engines(tmp_path / "d.jsonl").read_text().splitlines()]
    with make_judge(server, scale="binary", metrics=["ap"]) as j:
        got = j.judge_many(rows, progress=False)
    table = judge.compare_engines(got, metrics=["ap"])
    assert plain(table[["metric", "engine", "baseline", "wins", "significant"]]) == [
        {"metric": "ap", "engine": "dense", "baseline": "bm25", "wins": 8, "significant": "better"}
    ]
    with pytest.raises(InputError, match="at least two engines"):
        judge.compare_engines(got[:1])


# --- what a notebook shows ------------------------------------------------------------------


def mixed(request: Recorded) -> Item:
    """yes for "pale", an answer no parser reads for "mumble" (its re-ask too: the whole
    conversation is looked at), a refusal for "forbidden"."""
    prompt = json.dumps(request.body).casefold()
    if "forbidden" in prompt:
        return Fault("status", 400)
    if "mumble" in prompt:
        return Answer(text="hard to tell")
    return keyword_responder({"pale": "yes"}, "no")(request)


def test_repr_and_html_show_the_verdict_counts_and_engine_means() -> None:
    rows = [
        {"query_id": "q1", "query": "q <1>", "engine": "bm25", "retrieved_texts": ["pale", "oat"]},
        {"query_id": "q2", "query": "q2", "engine": "bm25", "retrieved_texts": ["oat", "pale"]},
        {"query_id": "q1", "query": "q <1>", "engine": "<dense>", "retrieved_texts": ["pale"]},
        {"query_id": "q2", "query": "q2", "engine": "<dense>", "retrieved_texts": ["mumble"]},
        {"query_id": "q3", "query": "q3", "engine": "<dense>", "retrieved_texts": ["forbidden"]},
    ]
    with ScriptedServer(responder=mixed) as srv, make_judge(srv, metrics=["ap"]) as j:
        got = j.judge_many(rows, progress=False)
    text = repr(got)
    assert text == (
        "<Judgements: 5 judged queries, engines <dense>, bm25; "
        "7 verdicts: 5 ok, 1 unparsed, 1 error>"
    )
    # Per engine, per query id the mean over its repeats, then over query ids; an unparsed or
    # failed passage leaves its query's metrics undefined, so <dense> has one value, q1's.
    assert got.engine_means() == {"<dense>": {"ap": 1.0}, "bm25": {"ap": 0.75}}
    page = got._repr_html_()
    assert "Judgements: 5 judged queries" in page
    assert "7 verdicts: 5 ok, 1 unparsed, 1 error" in page
    assert "<th>engine</th><th>query ids</th><th>ap</th>" in page
    assert "<tr><td>&lt;dense&gt;</td><td>3</td><td>1.0000</td></tr>" in page
    assert "<tr><td>bm25</td><td>2</td><td>0.7500</td></tr>" in page
    assert "<dense>" not in page  # escaped everywhere
    empty = Judgements([])
    assert (
        repr(empty)
        == "<Judgements: 0 judged queries, engines -; 0 verdicts: 0 ok, 0 unparsed, 0 error>"
    )
    assert "<table" not in empty._repr_html_()


def test_compare_engines_computes_by_the_policy_of_the_judge_that_judged(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """Metrics the Judge did not store (precision@1 here) had been computed under the default
    [metrics] policy: with the Judge's relevance_threshold of 0.95, no 'yes' said 90% sure is
    relevant, and no engine is better on precision@1 (judge compare's numbers)."""
    from judge.schema import MetricPolicy

    server = make_server(responder=keyword_responder({"pale": "yes"}, "no"))
    rows = [json.loads(line) for line in two_engines(tmp_path / "d.jsonl").read_text().splitlines()]
    strict = MetricPolicy(names=("ap",), relevance_threshold=0.95)
    with make_judge(server, scale="binary", metrics=strict) as j:
        got = j.judge_many(rows, progress=False)
    table = plain(judge.compare_engines(got, metrics=["precision@1"]))
    assert [(r["wins"], r["ties"], r["significant"]) for r in table] == [(0, 8, None)]
    assert got[:4].policy == strict  # a slice keeps it
