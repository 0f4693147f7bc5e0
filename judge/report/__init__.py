"""Stage 8, report: what a finished run tells people.

Owns the :class:`~judge.report.summary.Summary` behind ``summary.json`` and its threshold
checks, run history, report.md / report.html with their charts, the page ``judge compare
--html`` writes, and :func:`finish_run`, the nightly chain summary -> history -> report ->
qrels. Imports analysis, run, metrics, data and the shared leaves.
"""
