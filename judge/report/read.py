"""``judge.read_run(out_dir)``: a run directory back in Python, as the tables ``judge_many`` gives.

The results are read as every other reader of a run reads them (one row per (query, engine,
repeat), the last written winning; see :func:`judge.data.results.load_results`) into a
:class:`JudgedRun`, the :class:`~judge.judging.tables.Judgements` of a run on disk, which also
carries the run's summary.json when the run got that far (None for a run that was stopped
before it was summarised).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from judge.data.results import load_results
from judge.judging.tables import Judgements
from judge.report.summary import SUMMARY_FILE, Summary, load_summary
from judge.schema import JudgedQuery

__all__ = ["JudgedRun", "read_run"]


class JudgedRun(Judgements):
    """The judged queries of one run directory (or results file), and its summary if any."""

    def __init__(
        self, judged: Iterable[JudgedQuery], *, path: Path, summary: Summary | None
    ) -> None:
        super().__init__(judged)
        self.path = path
        self.summary = summary

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, from {self.path}>"


def read_run(out_dir: str | Path) -> JudgedRun:
    """A run directory's results (or a results JSONL's) and, for a directory, its summary.json.

    A missing directory, a directory without results or a malformed line is an InputError
    naming the file (and line); so is a summary.json that is not one.
    """
    path = Path(out_dir)
    results = load_results(path)
    summary_file = path / SUMMARY_FILE
    summary = load_summary(summary_file) if path.is_dir() and summary_file.is_file() else None
    return JudgedRun(results, path=path, summary=summary)
