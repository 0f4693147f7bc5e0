"""Stage 7, analysis: numbers about numbers.

Owns reliability statistics (bootstrap CI, Krippendorff's alpha, kappa, AUC), agreement with
human labels, the judge's health, calibration against human labels, human-corrected (PPI)
metrics, stability across repeats and engine comparison (paired differences, sign-flip
tests, pooled metrics). No I/O. Imports metrics and the shared leaves.
"""
