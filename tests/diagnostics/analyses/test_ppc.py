"""Posterior predictive statistics against closed forms."""

import warnings

import numpy as np
import pytest

from countvae.diagnostics.analyses.ppc import (
    calibration,
    observed_statistics,
    ppc_agreement,
    ppc_table,
    predictive_statistics,
    split_half_statistics,
)
from countvae.errors import InvalidArgumentError


def poisson_data(n=3000, rates=(0.5, 2.0, 8.0), draws=30, seed=0):
    rng = np.random.default_rng(seed)
    lam = np.asarray(rates)
    observed = rng.poisson(lam, (n, len(lam)))
    predicted = rng.poisson(lam[None, :, None], (n, len(lam), draws))
    return observed, predicted, lam


def test_statistics_of_a_correct_model_match_closed_forms():
    observed, predicted, lam = poisson_data()
    stats = predictive_statistics(observed, predicted)
    # Poisson: CV over cells = 1/sqrt(lambda); zero fraction = exp(-lambda).
    np.testing.assert_allclose(stats.cv_gene, 1 / np.sqrt(lam), rtol=0.03)
    np.testing.assert_allclose(stats.zero_fraction, np.exp(-lam), atol=0.01)
    obs = observed_statistics(observed)
    np.testing.assert_allclose(obs.cv_gene, 1 / np.sqrt(lam), rtol=0.05)
    table = ppc_table(obs, {"right": stats}).iloc[0]
    assert table["cv_gene_rel_error"] < 0.05 and table["zero_fraction_abs_error"] < 0.02


def test_wrong_model_is_detected():
    observed, predicted, lam = poisson_data()
    too_high = np.random.default_rng(1).poisson(3 * lam[None, :, None], predicted.shape)
    obs = observed_statistics(observed)
    right, wrong = predictive_statistics(observed, predicted), predictive_statistics(observed, too_high)
    table = ppc_table(obs, {"right": right, "wrong": wrong}).set_index("fit")
    assert table.loc["wrong", "zero_fraction_abs_error"] > 5 * table.loc["right", "zero_fraction_abs_error"]
    assert table.loc["wrong", "calibration_error"] > 5 * table.loc["right", "calibration_error"]
    halves = {"right": split_half_statistics(observed, predicted), "wrong": split_half_statistics(observed, too_high)}
    pair = ppc_agreement(obs, halves).iloc[0]
    assert pair["cv_gene_rel_diff"] > 0.3
    assert pair["noise_ratio"] > 5


def test_equivalent_models_differ_only_by_monte_carlo_noise():
    observed, predicted, lam = poisson_data(rates=tuple(np.linspace(0.2, 20, 40)), n=500, draws=20)
    other = np.random.default_rng(7).poisson(lam[None, :, None], predicted.shape)
    halves = {"a": split_half_statistics(observed, predicted), "b": split_half_statistics(observed, other)}
    pair = ppc_agreement(observed_statistics(observed), halves).iloc[0]
    assert pair["cv_gene_noise"] > 0 and pair["zero_fraction_noise"] > 0
    assert 0.5 < pair["noise_ratio"] < 2.0


def test_calibration_of_a_continuous_correct_model_is_near_zero():
    rng = np.random.default_rng(2)
    observed = rng.normal(size=(400, 50))
    draws = rng.normal(size=(400, 50, 400))
    error, coverage = calibration(observed, draws)
    assert error < 1e-3
    assert coverage[0.95] == pytest.approx(0.95, abs=0.01)
    assert coverage[0.65] == pytest.approx(0.65, abs=0.01)


def test_calibration_known_value_for_a_degenerate_predictive():
    # Every draw equals the observation: all counts inside every interval; error = sum (1 - width)^2.
    observed = np.full((5, 3), 2.0)
    draws = np.full((5, 3, 10), 2.0)
    error, _ = calibration(observed, draws)
    widths = [0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65]
    assert error == pytest.approx(sum((1 - w) ** 2 for w in widths))


def test_bad_shapes():
    with pytest.raises(InvalidArgumentError):
        predictive_statistics(np.zeros((3, 2)), np.zeros((3, 2)))
    with pytest.raises(InvalidArgumentError):
        calibration(np.zeros((3, 2)), np.zeros((3, 2, 4)), levels=(0.1, 0.5, 0.9))


def test_a_gene_without_counts_in_any_draw_gives_nan_without_a_warning():
    rng = np.random.default_rng(0)
    draws = rng.poisson(3.0, size=(20, 4, 8)).astype(float)
    draws[:, 1, :] = 0.0  # no draw gives gene 1 a count: no coefficient of variation over cells
    counts = draws[:, :, 0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stats = predictive_statistics(counts, draws)
    assert np.isnan(stats.cv_gene[1]) and np.isfinite(np.delete(stats.cv_gene, 1)).all()
    expected = np.std(draws[:, 0, :], axis=0) / np.mean(draws[:, 0, :], axis=0)
    assert stats.cv_gene[0] == pytest.approx(expected.mean(), rel=1e-12)


def hand_stats(cv_gene, zero_fraction, cv_cell=(1.0,), coverage=None):
    """PPCStatistics with the given per-gene values (calibration error unused)."""
    from countvae.diagnostics.analyses.ppc import PPCStatistics

    return PPCStatistics(
        np.asarray(cv_gene, float), np.asarray(cv_cell, float), np.asarray(zero_fraction, float), 0.0, coverage or {}
    )


def test_ppc_table_known_values_by_hand():
    # Observed CV per gene (1, 1, 1, 0): the zero-scale gene is dropped; relative errors 0.1, 0.2, 1.0 -> median 0.2.
    # Per cell: observed (2, 4), predicted (3, 4) -> relative errors 0.5, 0 -> median 0.25.
    # Zero fraction: |(0.2, 0.5, 0.3) - (0.1, 0.2, 0.3)| -> mean 0.4 / 3 (the median would be 0.1).
    # Coverage at 95% read from the 0.95 entry.
    observed = hand_stats([1.0, 1.0, 1.0, 0.0], [0.1, 0.2, 0.3], cv_cell=[2.0, 4.0])
    predicted = hand_stats([1.1, 1.2, 2.0, 5.0], [0.2, 0.5, 0.3], cv_cell=[3.0, 4.0], coverage={0.9: 0.5, 0.95: 0.8})
    row = ppc_table(observed, {"fit": predicted}).iloc[0]
    assert row["cv_gene_rel_error"] == pytest.approx(0.2)
    assert row["cv_cell_rel_error"] == pytest.approx(0.25)
    assert row["zero_fraction_abs_error"] == pytest.approx(0.4 / 3)
    assert row["coverage_95"] == 0.8


def test_ppc_agreement_known_values_by_hand():
    # CV (observed 1): halves of a at 1.0 and 1.1, of b at 1.5 and 1.6 -> between |a1 - b1| = 0.5, within 0.1:
    # ratio 5. Zero fraction: between |0.1 - 0.11| = 0.01, within (0.02 + 0.04) / 2 = 0.03: ratio 1/3.
    # noise_ratio = the larger ratio = 5.
    observed = hand_stats([1.0, 1.0, 1.0], [0.1, 0.1, 0.1])
    halves = {
        "a": (hand_stats([1.0] * 3, [0.1] * 3), hand_stats([1.1] * 3, [0.12] * 3)),
        "b": (hand_stats([1.5] * 3, [0.11] * 3), hand_stats([1.6] * 3, [0.15] * 3)),
    }
    row = ppc_agreement(observed, halves).iloc[0]
    assert row["cv_gene_rel_diff"] == pytest.approx(0.5)
    assert row["cv_gene_noise"] == pytest.approx(0.1)
    assert row["zero_fraction_abs_diff"] == pytest.approx(0.01)
    assert row["zero_fraction_noise"] == pytest.approx(0.03)
    assert row["noise_ratio"] == pytest.approx(5.0)


def test_ppc_agreement_without_monte_carlo_noise():
    # Identical halves: no noise. Identical fits give ratio 1 (nothing to tell apart); different fits give infinity.
    observed = hand_stats([1.0, 1.0], [0.1, 0.1])
    same = hand_stats([1.0, 1.0], [0.1, 0.1])
    other = hand_stats([2.0, 2.0], [0.1, 0.1])
    row = ppc_agreement(observed, {"a": (same, same), "b": (same, same)}).iloc[0]
    assert row["noise_ratio"] == 1.0
    row = ppc_agreement(observed, {"a": (same, same), "b": (other, other)}).iloc[0]
    assert row["noise_ratio"] == np.inf


def test_statistics_concordance_known_values_by_hand():
    # Lin's concordance with population moments: a = (1, 2, 3), b = a + 1 -> 2 cov / (vx + vy + 1) = (4/3) / (7/3)
    # = 4/7. Zero fractions reversed -> cov = -var, equal means: -1. Agreement is the smaller: -1.
    # A fourth gene with a NaN in one fit only is dropped, not read as 0.
    from countvae.diagnostics.analyses.ppc import statistics_concordance

    a = hand_stats([1.0, 2.0, 3.0, np.nan], [0.1, 0.2, 0.3, 0.5])
    b = hand_stats([2.0, 3.0, 4.0, 9.0], [0.3, 0.2, 0.1, np.nan])
    out = statistics_concordance(a, b)
    assert out["cv_gene_ccc"] == pytest.approx(4 / 7)
    assert out["zero_fraction_ccc"] == pytest.approx(-1.0)
    assert out["agreement"] == pytest.approx(-1.0)
    # Resampled genes: rows of gene positions; a row of the first three genes repeats the numbers above, a row
    # (0, 0, 2, 2) gives cv a = (1, 1, 3, 3), b = a + 1: var 1, cov 1 -> 2 / (1 + 1 + 1) = 2/3.
    out = statistics_concordance(a, b, genes=np.array([[0, 1, 2, 3], [0, 0, 2, 2]]))
    np.testing.assert_allclose(out["cv_gene_ccc"], [4 / 7, 2 / 3])
    # Same fit twice: concordance 1 on both statistics.
    assert statistics_concordance(a, a)["agreement"] == pytest.approx(1.0)


def test_ppc_agreement_adds_the_concordance_of_the_full_draws():
    observed = hand_stats([1.0, 1.0, 1.0], [0.1, 0.1, 0.1])
    a = hand_stats([1.0, 2.0, 3.0], [0.1, 0.2, 0.3])
    b = hand_stats([2.0, 3.0, 4.0], [0.1, 0.2, 0.3])
    row = ppc_agreement(observed, {"a": (a, a), "b": (b, b)}, predicted={"a": a, "b": b}).iloc[0]
    assert row["cv_gene_ccc"] == pytest.approx(4 / 7)
    assert row["zero_fraction_ccc"] == pytest.approx(1.0)
    assert row["agreement"] == pytest.approx(4 / 7)
