"""The README's Python API example runs as written, against a local OpenAI-compatible server."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from tests.servers import ScriptedServer, keyword_responder

README = Path(__file__).resolve().parent.parent / "README.md"


def python_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    (example,) = [b for b in blocks if "Judge(" in b]
    return example


def test_readme_python_example_runs() -> None:
    example = python_example()
    url = re.search(r'base_url="([^"]+)"', example)
    assert url, "the example names the endpoint it talks to"
    with ScriptedServer(responder=keyword_responder({"gums": "yes"}, "no")) as srv:
        code = example.replace(url.group(1), srv.openai_base_url)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "README.md", "exec"), {})
    lines = out.getvalue().splitlines()
    # rank, status, label, probability, reason for each of the two passages, then metrics.
    assert lines[0].startswith("1 ok yes 0.9")
    assert lines[1].startswith("2 ok no 0.1")
    assert lines[2] == "1.0 1.0"
    assert float(lines[3]) > 0.5
    assert any(r.path.endswith("/chat/completions") for r in srv.requests)
