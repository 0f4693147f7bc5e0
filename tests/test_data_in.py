"""Data in from where it lives: ``judge_many`` and ``judge run`` read a pandas DataFrame, a
Hugging Face ``datasets.Dataset`` (built in memory: nothing downloads) and a Parquet file,
with ``columns=`` renames or a preset for ragas, Phoenix and PyTerrier shapes; a table that
cannot give a query or its passages is refused in one line naming the mapping to pass, before
any request. Judged by a loopback OpenAI-compatible server through the real SDK."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import datasets
from judge import InputError, Judge, Limits, read_run
from judge.cli.main import main
from judge.data.datasets import read_queries
from tests.servers import ScriptedServer, keyword_responder
from tests.test_runner import SAMPLE, write_config

CHAT = "/v1/chat/completions"
FAST = Limits(max_attempts=3, backoff_base_s=0.01, timeout_s=5.0)


def make_judge(srv: ScriptedServer) -> Judge:
    return Judge(provider="local", model="judge-model", base_url=srv.openai_base_url, limits=FAST)


def chat_calls(srv: ScriptedServer) -> int:
    return sum(r.path == CHAT for r in srv.requests)


@pytest.fixture
def yes_if_pale() -> Iterator[ScriptedServer]:
    with ScriptedServer(responder=keyword_responder({"pale": "yes"}, "no")) as srv:
        yield srv


def ragas_records() -> dict[str, list[Any]]:
    """ragas 0.2's EvaluationDataset columns, with its answer columns judge does not read."""
    return {
        "user_input": ["why so wan?", "what do dogs eat?"],
        "retrieved_contexts": [["pale gums", "dog food"], ["kibble", "pale and tired"]],
        "reference_contexts": [["pale gums"], ["kibble"]],
        "response": ["anaemia", "kibble"],
        "reference": ["anaemia", "kibble"],
    }


def labels(got: Any) -> list[list[str | None]]:
    return [[v.label for v in jq.verdicts] for jq in got]


# --- a Hugging Face Dataset, a DataFrame and a Parquet file: the same rows, the same verdicts ---


@pytest.mark.parametrize("source", ["dataframe", "hf", "parquet", "arrow"])
def test_ragas_rows_from_any_source_with_the_preset(
    source: str, yes_if_pale: ScriptedServer, tmp_path: Path
) -> None:
    data = ragas_records()
    rows: Any
    if source == "dataframe":
        rows = pd.DataFrame(data)
    elif source == "hf":
        rows = datasets.Dataset.from_dict(data)
    elif source == "arrow":
        rows = pa.table(data)
    else:
        rows = tmp_path / "ragas.parquet"
        pq.write_table(pa.table(data), rows)
    with make_judge(yes_if_pale) as j:
        got = j.judge_many(rows, columns="ragas", progress=False)
    assert [jq.query.query for jq in got] == ["why so wan?", "what do dogs eat?"]
    assert labels(got) == [["yes", "no"], ["no", "yes"]]
    # reference_contexts are the expected passages: label-based metrics come with them.
    assert got[0].query.expected_texts == ("pale gums",)
    assert chat_calls(yes_if_pale) == 4


def test_a_missing_column_is_one_line_naming_the_mapping_before_any_request(
    yes_if_pale: ScriptedServer,
) -> None:
    frame = pd.DataFrame(ragas_records())
    with make_judge(yes_if_pale) as j, pytest.raises(InputError) as caught:
        j.judge_many(frame, progress=False)
    assert str(caught.value) == (
        "rows: no column gives the query ('query'; columns: user_input, retrieved_contexts, "
        "reference_contexts, response, reference); these look like ragas rows: pass the "
        "preset, columns='ragas'"
    )
    # A shape of no known tool: the column that looks like it is suggested.
    odd = datasets.Dataset.from_dict({"prompt": ["why so wan?"], "docs": [["pale gums"]]})
    with make_judge(yes_if_pale) as j, pytest.raises(InputError) as caught:
        j.judge_many(odd, progress=False)
    assert str(caught.value) == (
        "rows: no column gives the query ('query'; columns: prompt, docs); "
        "map one: columns={'prompt': 'query'}"
    )
    with make_judge(yes_if_pale) as j, pytest.raises(InputError) as caught:
        j.judge_many(odd, columns={"prompt": "query"}, progress=False)
    assert str(caught.value) == (
        "rows: no column gives the passages ('retrieved_texts'; columns: prompt, docs); "
        "map one: columns={'docs': 'retrieved_texts'}"
    )
    # Following the suggestion works.
    with make_judge(yes_if_pale) as j:
        got = j.judge_many(odd, columns={"prompt": "query", "docs": "retrieved_texts"})
    assert labels(got) == [["yes"]]
    assert chat_calls(yes_if_pale) == 1
    with make_judge(yes_if_pale) as j, pytest.raises(judge_config_error()):
        j.judge_many(odd, columns="langchain", progress=False)


def test_a_frame_indexed_by_its_own_id_column_with_gaps_in_integer_ids_is_read(
    yes_if_pale: ScriptedServer,
) -> None:
    """set_index("query_id", drop=False) gave pandas' "cannot insert query_id, already
    exists"; integer ids in a column with a missing value are floats (1.0), refused as "a
    number". Now the index copy is dropped and 1.0 is the id 1; the missing id is named."""
    frame = pd.DataFrame(
        {
            "query_id": ["q1", "q2"],
            "query": ["why so wan?", "why so wan?"],
            "retrieved_texts": [["pale gums"], ["dog food"]],
        }
    ).set_index("query_id", drop=False)
    with make_judge(yes_if_pale) as j:
        got = j.judge_many(frame, progress=False)
    assert [jq.query.query_id for jq in got] == ["q1", "q2"] and labels(got) == [["yes"], ["no"]]
    gappy = pd.DataFrame(
        {
            "query_id": [1, None, 3],
            "query": ["a?", "b?", "c?"],
            "retrieved_texts": [["pale"], ["pale"], ["pale"]],
        }
    )
    assert gappy["query_id"].dtype == "float64"
    with make_judge(yes_if_pale) as j, pytest.raises(InputError) as caught:
        j.judge_many(gappy, progress=False)
    assert "rows[1]: field 'query_id'" in str(caught.value)
    assert "rows[0]" not in str(caught.value) and "rows[2]" not in str(caught.value)
    with make_judge(yes_if_pale) as j:
        got = j.judge_many(gappy.dropna(), progress=False)
    assert [jq.query.query_id for jq in got] == ["1", "3"]


def test_one_passage_per_row_with_two_questions_under_one_id_is_refused(tmp_path: Path) -> None:
    """A long-format Parquet file (one passage per row) giving query q1 two question texts
    was read as one query, the second question dropped unsaid (JSONL refuses the same)."""
    table = pa.table(
        {
            "query_id": ["q1", "q1", "q2"],
            "query": ["bees?", "other question", "wasps?"],
            "text": ["a", "b", "c"],
        }
    )
    path = tmp_path / "long.parquet"
    pq.write_table(table, path)
    with pytest.raises(InputError) as caught:
        read_queries(path)
    said = str(caught.value)
    assert f"{path}:2: field 'query': " in said and "'other question' here but 'bees?'" in said
    same = pa.table({"query_id": ["q1", "q1"], "query": ["bees?", "bees?"], "text": ["a", "b"]})
    pq.write_table(same, path)
    (query,) = read_queries(path).queries
    assert [p.text for p in query.passages] == ["a", "b"]
    # Rows with an empty id are grouped by their question, their query named line<N> as a
    # JSONL line without an id is (they had all been one query, refused for two questions).
    blank = pa.table(
        {
            "query_id": [None, "", None, "q9"],
            "query": ["renew passport", "renew passport", "stale bread", "wasps?"],
            "text": ["a", "b", "c", "d"],
        }
    )
    pq.write_table(blank, path)
    got = [(q.query_id, [p.text for p in q.passages]) for q in read_queries(path).queries]
    assert got == [("line1", ["a", "b"]), ("line3", ["c"]), ("q9", ["d"])]


def judge_config_error() -> type[Exception]:
    from judge import ConfigError

    return ConfigError


def test_phoenix_one_document_per_row_is_grouped_and_ordered(yes_if_pale: ScriptedServer) -> None:
    """Phoenix's get_retrieved_documents(): one row per (span, document position), the index
    named; grouped per span, ordered by position, scores kept."""
    frame = pd.DataFrame(
        {
            "context.span_id": ["s1", "s1", "s2", "s1"],
            "document_position": [1, 0, 0, 2],
            "context.trace_id": ["t1", "t1", "t2", "t1"],
            "input": ["why so wan?", "why so wan?", "what do dogs eat?", "why so wan?"],
            "reference": ["dog food", "pale gums", "kibble", "pale and tired"],
            "document_score": [0.5, 0.9, 0.7, 0.1],
        }
    ).set_index(["context.span_id", "document_position"])
    with make_judge(yes_if_pale) as j:
        got = j.judge_many(frame, columns="phoenix", progress=False)
    assert [jq.query.query_id for jq in got] == ["s1", "s2"]
    assert [[p.text for p in jq.query.passages] for jq in got] == [
        ["pale gums", "dog food", "pale and tired"],
        ["kibble"],
    ]
    assert [p.score for p in got[0].query.passages] == [0.9, 0.5, 0.1]
    assert labels(got) == [["yes", "no", "yes"], ["no"]]
    # Plain dicts of that shape, as a list: the preset reads them as a table too.
    records = frame.reset_index().to_dict(orient="records")
    with make_judge(yes_if_pale) as j:
        again = j.judge_many(records, columns="phoenix", progress=False)
    assert labels(again) == labels(got)
    # Without the preset, dict rows get a hint naming it.
    with make_judge(yes_if_pale) as j, pytest.raises(InputError) as caught:
        j.judge_many(records, progress=False)
    assert str(caught.value).splitlines()[-1] == (
        "hint: these look like phoenix rows: pass columns='phoenix'"
    )


def test_a_pyterrier_result_frame_is_a_trec_run_with_its_topics(
    yes_if_pale: ScriptedServer,
) -> None:
    frame = pd.DataFrame(
        {
            "qid": ["q1", "q1", "q2"],
            "query": ["why so wan", "why so wan", "dog food"],
            "docno": ["d7", "d3", "d9"],
            "docid": [7, 3, 9],
            "text": ["bananas", "pale gums", "kibble"],
            "rank": [1, 0, 0],
            "score": [3.5, 7.25, 1.0],
        }
    )
    with make_judge(yes_if_pale) as j:
        got = j.judge_many(frame, columns="pyterrier", progress=False)
    assert [(jq.query.query_id, [p.id for p in jq.query.passages]) for jq in got] == [
        ("q1", ["d3", "d7"]),
        ("q2", ["d9"]),
    ]
    assert got[0].metrics["ap"] == 1.0  # the pale passage ranked first, by the rank column
    assert labels(got) == [["yes", "no"], ["no"]]


# --- judge run and judge validate over a Parquet file ---------------------------------------


def test_judge_run_reads_a_parquet_dataset_with_columns(
    yes_if_pale: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parquet = tmp_path / "eval.parquet"
    pq.write_table(
        pa.table(
            {
                "qid": ["a", "b"],
                "question": ["why so wan?", "what do dogs eat?"],
                "contexts": [["pale gums", "dog food"], ["kibble"]],
            }
        ),
        parquet,
    )
    columns = {"qid": "query_id", "question": "query", "contexts": "retrieved_texts"}
    config = write_config(
        tmp_path / "run.toml",
        yes_if_pale,
        tmp_path / "cache.sqlite",
        {
            "dataset": {"path": str(parquet), "label_scale": "binary"},
            "dataset.columns": columns,
        },
    )
    out = tmp_path / "out"
    code = main(["run", str(config), "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    got = {jq.query.query_id: [v.label for v in jq.verdicts] for jq in read_run(out)}
    assert got == {"a": ["yes", "no"], "b": ["no"]}
    assert chat_calls(yes_if_pale) == 3


def test_a_config_names_a_preset_for_its_dataset_columns(
    yes_if_pale: ScriptedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parquet = tmp_path / "eval.parquet"
    table = {"question": ["why so wan?", "what do dogs eat?"], "contexts": [["pale"], ["kibble"]]}
    pq.write_table(pa.table(table), parquet)
    dataset = {"path": str(parquet), "label_scale": "binary", "columns": "ragas-legacy"}
    config = write_config(
        tmp_path / "run.toml", yes_if_pale, tmp_path / "c.sqlite", {"dataset": dataset}
    )
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == 0, capsys.readouterr().err
    assert sorted(v.label for jq in read_run(out) for v in jq.verdicts) == ["no", "yes"]
    # An unknown preset is one line naming the presets, before any request.
    dataset["columns"] = "ragas-new"
    config = write_config(
        tmp_path / "bad.toml", yes_if_pale, tmp_path / "c.sqlite", {"dataset": dataset}
    )
    capsys.readouterr()
    assert main(["run", str(config), "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "unknown preset 'ragas-new'" in err and "Traceback" not in err
    assert chat_calls(yes_if_pale) == 2


def test_judge_validate_names_a_parquet_files_missing_column_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parquet = tmp_path / "eval.parquet"
    pq.write_table(pa.table({"question": ["q"], "contexts": [["a"]]}), parquet)
    with pytest.raises(InputError) as caught:
        read_queries(parquet)
    assert str(caught.value) == (
        f"{parquet}: no column gives the query ('query'; columns: question, contexts); "
        "these look like ragas-legacy rows: pass the preset, [dataset] columns "
        "(Python: columns=) 'ragas-legacy'"
    )
    assert [q.query for q in read_queries(parquet, columns="ragas-legacy").queries] == ["q"]
    # A bad row is named by its row number, as a JSONL file's by its line.
    pq.write_table(pa.table({"query": ["fine", " "], "retrieved_texts": [["a"], ["b"]]}), parquet)
    with pytest.raises(InputError, match=r"eval\.parquet:2: field 'query': is empty$"):
        read_queries(parquet)
    # Not Parquet at all: one line.
    parquet.write_text("not parquet")
    with pytest.raises(InputError, match=r"eval\.parquet: not a readable Parquet file: "):
        read_queries(parquet)
    code = main(["validate", str(parquet)])
    assert code == 2 and "Traceback" not in capsys.readouterr().err


def test_import_judge_imports_none_of_the_table_libraries() -> None:
    code = (
        "import sys, judge; judge.Judge; judge.Judgements; judge.read_run; "
        "import judge.data.datasets, judge.data.frames; "
        "print(sorted({'pandas', 'datasets', 'pyarrow', 'pytest'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_row_without_its_position_or_a_column_given_twice_is_refused(
    yes_if_pale: ScriptedServer,
) -> None:
    """A Phoenix row with no document_position had left its query's passages in row order,
    ranked metrics computed on it unsaid; a frame with two 'text' columns had judged one of
    them, the other lost."""
    frame = pd.DataFrame(
        {
            "context.span_id": ["s1", "s1", "s1"],
            "document_position": [2, None, 1],
            "input": ["why so wan?"] * 3,
            "reference": ["dog food", "pale gums", "pale and tired"],
        }
    )
    with make_judge(yes_if_pale) as j, pytest.raises(InputError) as caught:
        j.judge_many(frame, columns="phoenix", progress=False)
    said = str(caught.value)
    assert "rows:2: field 'document_position': missing" in said and "order" in said
    twice = pd.DataFrame([["q", "a", "b"]], columns=["query", "text", "text"])
    with make_judge(yes_if_pale) as j, pytest.raises(InputError, match="'text' given more"):
        j.judge_many(twice, progress=False)
    assert not yes_if_pale.requests


def test_arrow_sources_with_labels_and_titles_some_rows_lack_are_read(tmp_path: Path) -> None:
    """Arrow gives every row's struct every key any row has, null where it has none: the
    bundled sample's labels (each query's own passages) written to Parquet by pandas had been
    refused as 706 null grades. A map column reads back as key-value pairs: a dict too."""
    import json

    from judge.judging.rows import as_queries

    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    rows[0]["passages"][0]["title"] = "A title only the first passage has"
    path = tmp_path / "sample.parquet"
    pd.DataFrame(rows).to_parquet(path)
    want = read_queries(SAMPLE).queries
    for source in (path, pa.Table.from_pylist(rows), datasets.Dataset.from_list(rows)):
        got = read_queries(path).queries if source is path else as_queries(source)
        assert [q.labels for q in got] == [q.labels for q in want]
        titles = [[p.title for p in q.passages] for q in want]
        titles[0][0] = "A title only the first passage has"
        assert [[p.title for p in q.passages] for q in got] == titles
    mapped = pa.table(
        {
            "query": ["rust?"],
            "passages": [[{"id": "a", "text": "Rust is a language."}]],
            "labels": pa.array([[("a", 1)]], type=pa.map_(pa.string(), pa.int64())),
        }
    )
    pq.write_table(mapped, tmp_path / "mapped.parquet")
    (query,) = read_queries(tmp_path / "mapped.parquet").queries
    assert query.labels == {"a": 1}
