"""Stage 1, data: what users hand us and what a run leaves on disk.

Owns reading datasets (JSONL rows, parallel lists, TREC run + passage store), line-by-line
error collection (``file:line: field '...': ...``), passage truncation, and the results /
qrels files a run writes. Imports only ``judge.errors``, ``judge.schema`` and ``judge.config``.
"""
