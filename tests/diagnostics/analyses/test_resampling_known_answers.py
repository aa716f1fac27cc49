"""Known answers for the bootstrap's draws and its NaN handling."""

import numpy as np
import pytest

from countvae.diagnostics.analyses.resampling import (
    cell_bootstrap,
    percentile_interval,
    rowwise_concordance,
    weighted_concordance,
    worst_interval,
)


def test_every_cell_is_drawn_once_per_replicate_on_average():
    """Multinomial counts over m = 10 cells: each cell's expected count is 1 (sd of the mean over 4,000 replicates
    about 0.015), the last cell included."""
    boot = cell_bootstrap(10, 4000, seed=0)
    np.testing.assert_allclose(boot.weights[1:].mean(axis=0), 1.0, atol=0.06)
    assert (boot.weights[1:] == 0).mean() == pytest.approx(0.9**10, abs=0.01)  # P(cell not drawn) = (1 - 1/m)^m


def test_the_resampled_cells_are_a_random_subset_of_all_cells():
    """250 of 1,000 cells at random: distinct, sorted, spread over all of them (mean position 499.5, sd about 16)."""
    boot = cell_bootstrap(1000, 5, seed=0, max_cells=250)
    assert len(np.unique(boot.positions)) == 250 and np.all(np.diff(boot.positions) > 0)
    assert abs(boot.positions.mean() - 499.5) < 80 and boot.positions.max() > 900


def test_rowwise_concordance_drops_entries_missing_in_either_array_and_needs_two():
    a = np.array([[1.0, 2.0, 3.0, 4.0], [1.0, np.nan, np.nan, 7.0], [1.0, 2.0, 3.0, 4.0]])
    b = np.array([[1.0, 2.0, 3.0, np.nan], [1.0, 2.0, 3.0, np.nan], [4.0, 3.0, 2.0, 1.0]])
    out = rowwise_concordance(a, b)
    assert out[0] == pytest.approx(1.0)  # three equal entries left
    assert np.isnan(out[1])  # one entry left: no concordance
    assert out[2] == pytest.approx(-1.0)  # mirrored about the common mean 2.5


def test_weighted_concordance_of_constants():
    """Equal constants agree (1, not NaN); constants that differ do not (0)."""
    w = np.ones((1, 4))
    assert weighted_concordance(w, np.full((4, 2), 3.0), np.full((4, 2), 3.0))[0] == 1.0
    assert weighted_concordance(w, np.full((4, 2), 3.0), np.full((4, 2), 5.0))[0] == 0.0


def test_intervals_leave_out_replicates_without_a_value():
    """The interval of test_resampling's linspace replicates (0.41, 0.59) is unchanged by two NaN replicates."""
    replicates = np.r_[0.5, np.linspace(0.4, 0.6, 201), np.nan, np.nan]
    iv = percentile_interval(0.5, replicates, shrink=1.0, alpha=0.05)
    assert (iv.low, iv.high) == pytest.approx((0.41, 0.59))
    # A worst pair whose replicates are partly missing takes the other pair's replicate there.
    a = np.r_[0.5, np.linspace(0.4, 0.6, 201)]
    b = np.r_[0.9, np.full(201, np.nan)]
    worst = worst_interval([0.5, 0.9], [a, b], shrink=1.0, alpha=0.05, higher_is_better=True)
    assert (worst.value, worst.low, worst.high) == pytest.approx((0.5, 0.41, 0.59))
