"""Stage 2, metrics: pure numpy functions from grades to numbers.

Owns the label-free metrics (AP, NDCG, relevancy, rerank relevancy, ...), the label-based
ones (expected ids / texts), the source and coverage ones, the one table of what is known about
each (``metrics.facts``: name, kernel, family, direction, whether a judge feeds it), and applying
a :class:`~judge.schema.MetricPolicy`.
No I/O but reading, once, the Public Suffix List its package ships (``metrics.hosts``).
Imports only ``judge.errors``, ``judge.schema`` and ``judge.tiers``.
"""
