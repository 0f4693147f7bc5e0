"""Stage 7, analysis: numbers about numbers.

Owns reliability statistics (bootstrap CI, Krippendorff's alpha, kappa, AUC), agreement with
human labels, stability across repeats and engine comparison (paired differences, sign-flip
tests, pooled metrics). No I/O. Imports metrics and the shared leaves.
"""
