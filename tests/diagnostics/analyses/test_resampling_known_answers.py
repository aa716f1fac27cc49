"""Known answers for the bootstrap's draws and its NaN handling."""

import numpy as np
import pytest

from countvae.diagnostics.analyses.resampling import (
    RefittedAlignment,
    cell_bootstrap,
    neighbour_inflation,
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


def _groups_of_mutual_neighbours(n_groups: int, m: int) -> np.ndarray:
    """(n_groups * m, m - 1) neighbour indices: each cell's neighbours are the other cells of its group."""
    cells = np.arange(n_groups * m).reshape(n_groups, m)
    return np.vstack([np.delete(group, i) for group in cells for i in range(m)])


@pytest.mark.parametrize("m", [2, 3, 5])
def test_cells_identical_within_groups_of_mutual_neighbours_count_as_one_cell(m):
    """m cells of one score that are each other's neighbours inform like one cell: the variance is m times larger."""
    rng = np.random.default_rng(m)
    scores = np.repeat(rng.normal(size=40), m)
    weights = np.repeat(rng.uniform(0.5, 2.0, size=40), m)
    assert neighbour_inflation(scores, weights, _groups_of_mutual_neighbours(40, m)) == pytest.approx(np.sqrt(m))


def test_independent_scores_on_a_random_graph_need_no_widening():
    """Scores drawn independently of the neighbour sets: the cross terms average out (about 1 +- 0.02 here)."""
    rng = np.random.default_rng(0)
    n, k = 20_000, 3
    neighbours = np.stack([rng.choice(n, k, replace=False) for _ in range(n)])
    inflation = neighbour_inflation(rng.normal(size=n), np.ones(n), neighbours)
    assert 1.0 <= inflation < 1.06


def test_neighbours_that_are_not_scored_link_the_cells_sharing_them_and_constant_scores_do_not_widen():
    """Neighbours that are not scored carry no score but link the cells that share them; equal scores do not widen."""
    n = 30
    beyond = np.arange(n, n + 3 * n).reshape(n, 3)
    assert neighbour_inflation(np.arange(n, dtype=float), np.ones(n), beyond) == 1.0
    # Pairs of scored cells with one unscored neighbour in common, and equal scores within each pair: sqrt(2).
    shared = np.repeat(np.arange(n, n + n // 2), 2)[:, None]
    assert neighbour_inflation(np.repeat(np.arange(n // 2, dtype=float), 2), np.ones(n), shared) == pytest.approx(
        np.sqrt(2)
    )
    assert neighbour_inflation(np.full(n, 0.7), np.ones(n), _groups_of_mutual_neighbours(10, 3)) == 1.0


def test_a_refitted_alignment_is_scipys_procrustes_on_the_cells_each_replicate_draws():
    # Independent route: repeat each cell as often as the replicate draws it, fit scipy's orthogonal_procrustes
    # on the centred copies and score the mapped cells column by column.
    from scipy.linalg import orthogonal_procrustes

    from countvae.diagnostics.analyses.invariants import per_column_concordance
    from countvae.diagnostics.analyses.markers import dimension_correlations

    rng = np.random.default_rng(0)
    a = rng.normal(size=(60, 4)) * [2.0, 1.0, 0.5, 0.3]
    b = a @ np.linalg.qr(rng.normal(size=(4, 4)))[0] + 0.5 * rng.normal(size=(60, 4)) + 3.0
    markers = np.column_stack([a[:, 0] + rng.normal(size=60), rng.normal(size=60)])
    boot = cell_bootstrap(60, 4, seed=1)
    alignment = RefittedAlignment.fit(boot.weights, a, b)
    scores, correlations = alignment.column_concordance(b), alignment.correlations(markers)
    for r, w in enumerate(boot.weights):
        cells = np.repeat(np.arange(60), w.astype(int))
        ra, rb = a[cells], b[cells]
        rotation, _ = orthogonal_procrustes(ra - ra.mean(0), rb - rb.mean(0))
        mapped = (ra - ra.mean(0)) @ rotation + rb.mean(0)
        assert scores[r] == pytest.approx(per_column_concordance(mapped, rb), abs=1e-12)
        expected = np.stack([dimension_correlations(mapped, markers[cells, k]) for k in range(2)])
        np.testing.assert_allclose(correlations[r], expected, atol=1e-12)
    # Replicates that draw other cells get other maps: the map is refitted, not held fixed.
    assert not np.allclose(alignment.rotation[1], alignment.rotation[2])


def test_a_refitted_alignment_of_exact_rotations_scores_one_in_every_replicate():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(40, 3))
    b = a @ np.linalg.qr(rng.normal(size=(3, 3)))[0] - 2.0
    boot = cell_bootstrap(40, 20, seed=0)
    np.testing.assert_allclose(RefittedAlignment.fit(boot.weights, a, b).column_concordance(b), 1.0, atol=1e-12)
