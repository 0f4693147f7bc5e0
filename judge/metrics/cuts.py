"""Grades from a graded judge's expected grade and cut points (``[metrics] grade_cuts``).

With logprobs, a graded judge's verdict carries its expected grade over the scale's labels
(judging/verdicts.py), ``E[g] = sum_l P(l) * grade_l``. Cut points ``c_1 < ... < c_G`` on it,
one between each two of the scale's ``G + 1`` grades ``g_0 < g_1 < ... < g_G``, give the grade

    grade = g_j,  j = #{i : c_i <= E[g]}

so ``E[g] < c_1`` is the lowest grade and ``E[g] >= c_G`` the highest (on the built-in graded
scale, 0..3, the grade is the number of cuts at or below E[g]). The midpoints
``c_j = (g_{j-1} + g_j) / 2`` round E[g] to the nearest grade; ``judge calibrate`` chooses the
cuts that agree best with human grades (judge.analysis.calibration).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from judge.metrics.ranked import IntArray
from judge.schema import Scale

__all__ = ["cut_grade", "cut_index", "midpoint_cuts", "scale_grades"]


def scale_grades(scale: Scale) -> tuple[int, ...]:
    """The scale's grades, lowest first: ``g_0 < ... < g_G``."""
    return tuple(sorted(label.grade for label in scale.labels))


def midpoint_cuts(grades: Sequence[int]) -> tuple[float, ...]:
    """``c_j = (g_{j-1} + g_j) / 2``: the cuts that round E[g] to the nearest grade."""
    return tuple((a + b) / 2 for a, b in itertools.pairwise(grades))


def cut_index(expected: ArrayLike, cuts: Sequence[float]) -> IntArray:
    """``j = #{i : c_i <= E[g]}`` per expected grade: the position of its grade, 0 = lowest."""
    return np.searchsorted(np.asarray(cuts, dtype=np.float64), expected, side="right")


def cut_grade(expected: float, cuts: Sequence[float], scale: Scale) -> int:
    """The grade ``g_j`` of one expected grade (see the module docstring)."""
    return scale_grades(scale)[int(cut_index(np.array([expected]), cuts)[0])]
