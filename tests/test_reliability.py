"""Array statistics (alpha, kappa, AUC, bootstrap CI) pinned with hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from judge.analysis.reliability import bootstrap_ci, cohen_kappa, krippendorff_alpha, roc_auc

NAN = math.nan

# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", section C:
# 4 observers x 12 units, nominal values 1..5, missing marked NaN. Rows are observers here.
TEXTBOOK = np.array(
    [
        [1, 2, 3, 3, 2, 1, 4, 1, 2, NAN, NAN, NAN],
        [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, NAN, 3],
        [NAN, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, NAN],
        [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, NAN],
    ]
)


# --- Krippendorff's alpha ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("level", "published"), [("nominal", 0.743), ("ordinal", 0.815), ("interval", 0.849)]
)
def test_alpha_reproduces_krippendorff_2011_example(level: str, published: float) -> None:
    alpha = krippendorff_alpha(TEXTBOOK.T, level)  # type: ignore[arg-type]
    assert alpha == pytest.approx(published, abs=5e-4)


def test_alpha_nominal_textbook_exact_fraction() -> None:
    # The paper's coincidence matrix: n_c = 9, 13, 10, 5, 3 (n = 40 pairable values) and
    # 8 off-diagonal coincidences, so alpha = 1 - 39 * 8 / (40^2 - 384) = 113/152.
    assert krippendorff_alpha(TEXTBOOK.T, "nominal") == pytest.approx(113 / 152, abs=1e-12)


def test_alpha_matches_krippendorff_package_on_random_matrices() -> None:
    krippendorff = pytest.importorskip("krippendorff")
    rng = np.random.default_rng(7)
    for _ in range(40):
        units, raters = int(rng.integers(2, 30)), int(rng.integers(2, 6))
        data = rng.integers(0, int(rng.integers(2, 8)), size=(units, raters)).astype(float)
        data[rng.random(data.shape) < 0.25] = np.nan
        for level in ("nominal", "ordinal", "interval"):
            theirs = krippendorff.alpha(reliability_data=data.T, level_of_measurement=level)
            assert krippendorff_alpha(data, level) == pytest.approx(theirs, abs=1e-9)


def test_alpha_undefined_without_variation_or_pairs() -> None:
    same = np.full((5, 3), 2.0)
    assert krippendorff_alpha(same, "nominal") is None
    assert krippendorff_alpha(same, "ordinal") is None
    one_rater = np.array([[1.0], [2.0], [3.0]])
    assert krippendorff_alpha(one_rater, "interval") is None
    # Variation only in units with a single value: nothing pairable varies.
    lonely = np.array([[1.0, 1.0], [2.0, NAN], [3.0, NAN]])
    assert krippendorff_alpha(lonely, "nominal") is None


def test_alpha_is_one_for_perfect_agreement_and_rejects_bad_shape() -> None:
    agree = np.array([[0.0, 0.0, NAN], [1.0, 1.0, 1.0], [3.0, 3.0, 3.0]])
    for level in ("nominal", "ordinal", "interval"):
        assert krippendorff_alpha(agree, level) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="units x raters"):
        krippendorff_alpha(np.zeros(4), "nominal")


# --- Cohen's kappa and AUC ----------------------------------------------------------------


def test_kappa_on_2x2_table() -> None:
    # p_o = 35/50 = 0.7; p_e = 0.5*0.6 + 0.5*0.4 = 0.5; kappa = 0.2 / 0.5.
    assert cohen_kappa([[20, 5], [10, 15]]) == pytest.approx(0.4)


def test_weighted_and_unweighted_kappa_on_3x3_table() -> None:
    table = [[10, 2, 0], [3, 8, 1], [1, 2, 13]]
    # Linear: observed weighted disagreement 5/40; chance sum w r_i c_j = 728 / 40^2.
    assert cohen_kappa(table, values=[0, 1, 2]) == pytest.approx(1 - 200 / 728)
    # Unweighted: p_o = 31/40, p_e = 536/1600.
    assert cohen_kappa(table) == pytest.approx((31 / 40 - 536 / 1600) / (1 - 536 / 1600))


def test_kappa_undefined_when_both_raters_use_one_category() -> None:
    assert cohen_kappa([[5, 0], [0, 0]]) is None
    assert cohen_kappa([[0, 0], [0, 0]]) is None
    with pytest.raises(ValueError, match="square"):
        cohen_kappa([[1, 2, 3], [4, 5, 6]])


def test_auc_counts_ties_as_half() -> None:
    # positives .9 .5 .5, negatives .5 .1: wins 2 + 1.5 + 1.5 over 6 pairs.
    auc = roc_auc([0.9, 0.5, 0.5, 0.5, 0.1], [True, True, True, False, False])
    assert auc == pytest.approx(5 / 6)
    assert roc_auc([0.2, 0.4], [True, True]) is None
    assert roc_auc([0.7, 0.7], [True, False]) == pytest.approx(0.5)


def test_bootstrap_ci_edge_cases() -> None:
    assert bootstrap_ci([], n_boot=10) is None
    assert bootstrap_ci([0.25] * 7, n_boot=50, seed=1) == (0.25, 0.25)
    with pytest.raises(ValueError, match="n_boot"):
        bootstrap_ci([1.0, 2.0], n_boot=0)


def test_bootstrap_ci_spanning_several_blocks_stays_reproducible() -> None:
    # 30k values x 200 resamples = 6M cells: drawn in several blocks of at most 2M cells.
    values = np.random.default_rng(4).random(30_000)
    first = bootstrap_ci(values, n_boot=200, seed=9, normal_from=None)
    assert first == bootstrap_ci(values, n_boot=200, seed=9, normal_from=None)
    assert first is not None
    low, high = first
    standard_error = values.std(ddof=1) / math.sqrt(values.size)
    assert low < values.mean() < high
    assert high - low == pytest.approx(2 * 1.96 * standard_error, rel=0.25)


@pytest.mark.parametrize("kind", ["ap-like", "rare", "counts"])
def test_from_5000_values_the_normal_interval_equals_the_bootstrap_within_its_own_noise(
    kind: str,
) -> None:
    rng = np.random.default_rng(11)
    n = 5_000
    values = {
        "ap-like": np.clip(rng.beta(0.5, 0.7, n) + (rng.random(n) < 0.2), 0.0, 1.0),
        "rare": (rng.random(n) < 0.05).astype(float),
        "counts": rng.poisson(2.0, n).astype(float),
    }[kind]
    boots = np.array(
        [bootstrap_ci(values, n_boot=2000, seed=s, normal_from=None) for s in range(8)]
    )
    normal = bootstrap_ci(values)
    assert normal is not None and normal != tuple(boots[0])  # the normal path was taken
    spread = boots.std(axis=0, ddof=1)
    assert np.all(np.abs(np.array(normal) - boots.mean(axis=0)) <= 3 * spread + 1e-4)
    assert bootstrap_ci(values[:4_999]) == bootstrap_ci(values[:4_999], normal_from=None)


def test_one_value_has_no_confidence_interval() -> None:
    """A mean of one query is not known to any precision: no interval (it had been a
    zero-wide one, [0.5, 0.5], read as certainty)."""
    assert bootstrap_ci([0.5]) is None and bootstrap_ci([]) is None
    assert bootstrap_ci([0.5, 0.7]) is not None
