"""Stage 5, judging: one query's passages -> verdicts -> metrics.

Owns prompt templates and passage fencing, reading a completion as verdicts on a scale,
asking (pointwise / listwise, re-asks) and the :class:`~judge.judging.judge.Judge` Python API.
Imports calling, providers, metrics and the shared leaves.
"""
