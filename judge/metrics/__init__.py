"""Stage 2, metrics: pure numpy functions from grades to numbers.

Owns the label-free metrics (AP, NDCG, relevancy, rerank relevancy, ...), the label-based
ones (expected ids / texts), metric names, and applying a :class:`~judge.schema.MetricPolicy`.
No I/O. Imports only ``judge.errors`` and ``judge.schema``.
"""
