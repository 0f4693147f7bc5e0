"""Stage 4, calling: the one layer that calls providers.

Owns the :class:`~judge.calling.caller.Caller` (cache lookup, in-flight dedupe, retries with
one authority, timeouts), the limits it enforces (concurrency, rate, budget) and the SQLite
answer cache. Imports ``judge.providers.base`` and the shared leaves (errors, schema, config).
"""
