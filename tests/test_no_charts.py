"""--no-charts leaves the charts out of report.html (and the chart code unloaded); the default
report keeps them, drawn without matplotlib (whose import alone cost a small run ~0.45 s)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.servers import ScriptedServer
from tests.test_runner import write_config, write_dataset

REPO = Path(__file__).resolve().parent.parent
PROBE = (
    "import sys; from judge.cli.main import main; code = main(sys.argv[1:]); "
    "print('judge.report.charts' in sys.modules, 'matplotlib' in sys.modules); sys.exit(code)"
)


def test_no_charts_draws_nothing_and_no_run_imports_matplotlib(
    make_server: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    server = make_server()
    dataset = write_dataset(tmp_path / "d.jsonl", n_queries=3, n_passages=2)
    config = write_config(tmp_path / "c.toml", server, tmp_path / "cache.sqlite")
    runs = {}
    for name, extra in (("plain", []), ("bare", ["--no-charts"])):
        out = tmp_path / name
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                PROBE,
                "run",
                str(config),
                str(dataset),
                "--out",
                str(out),
                *extra,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode in (0, 1), done.stderr
        runs[name] = (done.stdout.strip().splitlines()[-1], (out / "report.html").read_text())
    assert runs["plain"][0] == "True False" and "<svg" in runs["plain"][1]
    assert runs["bare"][0] == "False False" and "<svg" not in runs["bare"][1]
    assert "Metrics (mean, 95% CI)" in runs["bare"][1]
