"""examples/judging.ipynb runs in a real Jupyter kernel (nbclient + ipykernel: every cell inside
the kernel's running event loop, which is the case the sync API must survive) against a loopback
OpenAI-compatible server, and the README's Python section shows the same code."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from tests.servers import ScriptedServer, keyword_responder
from tests.test_readme import python_example

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "examples" / "judging.ipynb"
# The words that make a passage of the notebook's rows relevant to its query.
RELEVANT = {"gums": "yes", "renewal form": "yes", "renew online": "yes", "starch": "yes"}
# Run after the notebook's cells, in the same kernel: what a user would look at.
PROBE = """
import asyncio, json
try:
    asyncio.get_running_loop()
    running = True
except RuntimeError:
    running = False
print(json.dumps({
    "running_loop": running,
    "passages": [list(passages.shape), list(passages.columns)],
    "queries": [list(queries.shape), list(queries.columns)],
    "labels": passages["label"].tolist(),
    "ndcg": {f"{r.query_id}/{r.engine}": r.ndcg for r in queries.itertuples()},
}))
"""


def code_cells(nb: Any) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


def outputs(cell: Any, kind: str) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("name") == kind)


@pytest.fixture
def executed(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, dict[str, Any], ScriptedServer]:
    """The notebook executed against a loopback server, the probe's findings, the server."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells.insert(len(nb.cells) - 1, nbformat.v4.new_code_cell(PROBE))  # before j.close()
    # jupyter_core's own deprecation warning about its paths, not ours; the kernel reads the
    # rest of the environment (the server's URL) as a user's kernel would.
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    with ScriptedServer(responder=keyword_responder(RELEVANT, "no")) as srv:
        monkeypatch.setenv("JUDGE_BASE_URL", srv.openai_base_url)
        monkeypatch.setenv("JUDGE_MODEL", "scripted-judge")
        client = NotebookClient(
            nb,
            timeout=180,  # per cell: a busy 2-core machine, never a hang
            startup_timeout=120,
            kernel_name="python3",
            resources={"metadata": {"path": str(NOTEBOOK.parent)}},
        )
        client.execute()  # raises CellExecutionError, with the cell's traceback, on any error
    probe = next(c for c in nb.cells if c.source == PROBE)
    return nb, json.loads(outputs(probe, "stdout")), srv


def test_the_notebook_runs_in_a_kernel_against_an_openai_compatible_server(
    executed: tuple[Any, dict[str, Any], ScriptedServer],
) -> None:
    nb, found, srv = executed
    # The cells ran inside the kernel's running event loop, as every Jupyter cell does.
    assert found["running_loop"] is True
    # 3 passages judged one by one (2, then 1 for rerank_relevancy), then 6 lists of 2 at once.
    chats = [r for r in srv.requests if r.path == "/v1/chat/completions"]
    assert len(chats) == len(srv.requests) == 3 + 12
    assert {r.body["model"] for r in chats} == {"scripted-judge"}
    shape, columns = found["passages"]
    assert shape[0] == 12 and shape[1] == len(columns)
    assert {"query_id", "engine", "rank", "label", "probability", "reason", "human_grade"} <= set(
        columns
    )
    assert not [c for c in columns if c.startswith(("a1", "p1", "b1"))]  # no column per passage
    assert (
        found["labels"] == ["yes", "no", "no", "yes", "yes", "no", "no", "yes"] + ["yes", "no"] * 2
    )
    assert found["queries"][0] == [6, len(found["queries"][1])] and "ndcg" in found["queries"][1]
    dcg_at_2 = 1 / 1.5849625007211562  # the relevant passage second of two
    assert found["ndcg"] == pytest.approx(
        {
            "anaemia/bm25": 1.0,
            "anaemia/dense": dcg_at_2,
            "passport/bm25": 1.0,
            "passport/dense": dcg_at_2,
            "bread/bm25": 1.0,
            "bread/dense": 1.0,
        }
    )
    cells = [c for c in nb.cells if c.cell_type == "code"]
    first = outputs(cells[1], "stdout").splitlines()
    assert first[0].startswith("1 ok yes 0.9") and first[1].startswith("2 ok no 0.1")
    # The progress bar reached the cell that called judge_many, on stderr, and nothing else did.
    many = next(c for c in cells if "judge_many(rows)" in c.source)
    assert re.search(r"judging: 100%.*12/12.*passages 12", outputs(many, "stderr"))
    assert not [c for c in cells if c is not many and outputs(c, "stderr")]
    agreement = next(c for c in cells if "agreement" in c.source)
    assert "agreement with the human labels: 1.0" in outputs(agreement, "stdout")
    assert any("text/html" in o.get("data", {}) for o in agreement.outputs)  # the table
    chart = next(c for c in cells if ".plot." in c.source)
    assert any("image/png" in o.get("data", {}) for o in chart.outputs)


def test_the_readme_python_section_shows_the_notebooks_code() -> None:
    """Every code cell after the notebook's setup cell is in the README's example, verbatim,
    in the same order; the setup differs only in where the endpoint comes from."""
    readme = python_example()
    cells = code_cells(nbformat.read(NOTEBOOK, as_version=4))
    setup, shown = cells[0], cells[1:]
    assert "JUDGE_BASE_URL" in setup and "JUDGE_MODEL" in setup and "quickstart.toml" in setup
    where = [readme.find(cell) for cell in shown]
    assert -1 not in where, [c for c, at in zip(shown, where, strict=True) if at < 0]
    assert where == sorted(where)
    assert readme.rstrip().endswith(shown[-1])
