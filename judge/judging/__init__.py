"""Stage 5, judging: one query's passages -> verdicts -> metrics.

Owns prompt templates and passage fencing, reading a completion as verdicts on a scale,
asking (pointwise / listwise, re-asks) and the :class:`~judge.judging.judge.Judge` Python API
(one query, or many with their results as tables). Imports calling, providers, metrics, data
and the shared leaves.
"""
