"""Stage 6, run: many queries x repeats, resumable.

Owns the batch runner behind ``judge run`` (workers, stop conditions), resume bookkeeping
(fingerprint, finished units, lock, partial-line repair), the results writer, progress lines
and the dry-run estimate. Imports judging, calling, providers, data and the shared leaves.
"""
