"""The paired bootstrap behind every interval of the report: weighted scores equal the scores of resampled cells."""

from itertools import combinations

import numpy as np
import pytest
from scipy.spatial.distance import squareform

from countvae.diagnostics.analyses.invariants import (
    concordance,
    gene_centred_concordance,
    gram_cosine,
    pairwise_distances,
    per_column_concordance,
)
from countvae.diagnostics.analyses.markers import dimension_correlations
from countvae.diagnostics.analyses.reduced_jacobians import (
    energy_replicates,
    gram_cosine_replicates,
    loading_concordance_replicates,
    loading_replicates,
    overlap_replicates,
    reduce_jacobians,
    span_replicates,
)
from countvae.diagnostics.analyses.resampling import (
    Interval,
    cell_bootstrap,
    distance_concordance,
    pair_sums,
    percentile_interval,
    rowwise_concordance,
    weighted_column_concordance,
    weighted_concordance,
    weighted_correlations,
    weighted_mean,
    worst_interval,
)
from countvae.diagnostics.analyses.subspace import jacobian_span, weighted_overlap
from countvae.errors import InvalidArgumentError


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(40, 6)) + 3.0 * rng.normal(size=6)
    return a, a + 0.5 * rng.normal(size=a.shape), cell_bootstrap(40, 6, seed=1)


def resampled(boot, r):
    """Cell positions of replicate ``r`` as an explicit resample (each cell repeated by its weight)."""
    return np.repeat(np.arange(boot.weights.shape[1]), boot.weights[r].astype(int))


def test_bootstrap_weights_are_multinomial_counts_with_a_reference_row():
    boot = cell_bootstrap(30, 50, seed=0)
    assert boot.weights.shape == (51, 30) and np.all(boot.weights[0] == 1.0)
    assert np.all(boot.weights.sum(axis=1) == 30) and boot.shrink == 1.0
    assert np.array_equal(boot.weights, cell_bootstrap(30, 50, seed=0).weights)  # seeded
    capped = cell_bootstrap(1000, 5, seed=0, max_cells=250)
    assert len(capped.positions) == 250 and capped.shrink == pytest.approx(0.5)
    with pytest.raises(InvalidArgumentError):
        cell_bootstrap(1, 5)


def test_weighted_scores_equal_the_scores_of_the_resampled_cells(data):
    a, b, boot = data
    for r in range(boot.weights.shape[0]):
        cells = resampled(boot, r)
        w = boot.weights
        assert weighted_concordance(w, a, b)[r] == pytest.approx(concordance(a[cells], b[cells]), abs=1e-12)
        assert weighted_concordance(w, a, b, centre_columns=True)[r] == pytest.approx(
            gene_centred_concordance(a[cells], b[cells]), abs=1e-12
        )
        assert weighted_column_concordance(w, a, b)[r] == pytest.approx(
            per_column_concordance(a[cells], b[cells]), abs=1e-12
        )
        assert weighted_mean(w, a[:, 0])[r] == pytest.approx(a[cells, 0].mean())
        corr = weighted_correlations(w, a[:, :3], b[:, 3:])
        expected = np.stack([dimension_correlations(a[cells, :3], b[cells, 3 + j]) for j in range(3)])
        np.testing.assert_allclose(corr[r], expected, atol=1e-12)


def test_distance_concordance_counts_each_pair_of_distinct_cells(data):
    a, b, boot = data
    za, zb = a[:, :3], b[:, :3]
    da, db = squareform(pairwise_distances(za)), squareform(pairwise_distances(zb))
    values = distance_concordance(boot.weights, da, db, pair_sums(boot.weights, da), pair_sums(boot.weights, db))
    assert values[0] == pytest.approx(concordance(pairwise_distances(za), pairwise_distances(zb)))
    for r in range(1, boot.weights.shape[0]):
        cells = resampled(boot, r)
        distinct = np.array([cells[i] != cells[j] for i, j in combinations(range(len(cells)), 2)])
        expected = concordance(pairwise_distances(za[cells])[distinct], pairwise_distances(zb[cells])[distinct])
        assert values[r] == pytest.approx(expected, abs=1e-12)


def test_rowwise_concordance_drops_non_finite_entries():
    a = np.array([[1.0, 2.0, 3.0, np.nan], [1.0, 2.0, 3.0, 4.0]])
    b = np.array([[1.0, 2.0, 3.0, 9.0], [4.0, 3.0, 2.0, 1.0]])
    np.testing.assert_allclose(rowwise_concordance(a, b), [1.0, concordance(a[1], b[1])])


def test_percentile_interval_contains_the_value_and_scales_with_the_subset():
    replicates = np.r_[0.5, np.linspace(0.4, 0.6, 201)]
    iv = percentile_interval(0.5, replicates, shrink=1.0, alpha=0.05)
    assert iv.low == pytest.approx(0.41) and iv.high == pytest.approx(0.59)
    half = percentile_interval(0.5, replicates, shrink=0.5, alpha=0.05)
    assert half.low == pytest.approx(0.455) and half.high == pytest.approx(0.545)
    shifted = percentile_interval(0.9, np.r_[0.5, np.linspace(0.51, 0.6, 100)], shrink=1.0, alpha=0.05)
    assert shifted.low == 0.9  # widened to contain the value
    assert np.isnan(percentile_interval(np.nan, replicates, 1.0, 0.05).low)
    assert Interval.exact(0.3) == Interval(0.3, 0.3, 0.3)


def test_worst_interval_takes_the_worst_pair_within_each_replicate():
    good = np.r_[0.95, np.full(100, 0.95)]
    bad = np.r_[0.8, np.linspace(0.7, 0.9, 100)]
    iv = worst_interval([0.95, 0.8], [good, bad], shrink=1.0, alpha=0.05, higher_is_better=True)
    assert iv.value == 0.8 and iv.high < 0.95 and iv.low < 0.8
    lower = worst_interval([1.0, 3.0], [np.r_[1.0, np.full(50, 1.0)], np.r_[3.0, np.full(50, 3.0)]], 1.0, 0.05, False)
    assert (lower.value, lower.low, lower.high) == (3.0, 3.0, 3.0)


def test_reduced_jacobians_reproduce_the_decoder_scores_when_the_basis_holds_them():
    rng = np.random.default_rng(3)
    n_cells, n_genes, d = 25, 30, 2
    basis = np.linalg.qr(rng.normal(size=(n_genes, 3 * d)))[0]
    ja = np.einsum("gr,crl->cgl", basis, rng.normal(size=(n_cells, 3 * d, d)))
    jb = ja @ np.linalg.qr(rng.normal(size=(d, d)))[0] + np.einsum(
        "gr,crl->cgl", basis, 0.3 * rng.normal(size=(n_cells, 3 * d, d))
    )
    ra, rb = reduce_jacobians(ja), reduce_jacobians(jb)
    assert ra.kept_energy == pytest.approx(1.0) and rb.kept_energy == pytest.approx(1.0)
    ones = np.ones((1, n_cells))
    ea, eb = energy_replicates(ones, ra), energy_replicates(ones, rb)
    overlap = overlap_replicates(span_replicates(ea, d), span_replicates(eb, d), ra.basis, rb.basis)[0]
    assert overlap == pytest.approx(weighted_overlap(jacobian_span(ja, d), jacobian_span(jb, d)), abs=1e-6)
    gram_a, gram_b = (np.einsum("cgl,chl->gh", j, j) / n_cells for j in (ja, jb))
    assert gram_cosine_replicates(ea, eb, ra.basis, rb.basis)[0] == pytest.approx(gram_cosine(gram_a, gram_b))
    loadings = loading_concordance_replicates(
        loading_replicates(ones, ra), loading_replicates(ones, rb), ra.basis, rb.basis
    )[0]
    assert loadings == pytest.approx(per_column_concordance(ja.mean(0), jb.mean(0)))


def test_a_lower_is_better_worst_interval_mirrors_the_higher_is_better_one_with_low_below_high() -> None:
    """Lower is better (an error): the worst pair is the largest score, and its interval is the higher-is-better
    interval of the negated scores and replicates, negated, so ``low <= value <= high`` (0.16 to 0.23 here around
    0.2). With one pair the direction does not matter: it is that pair's percentile interval. Catches the negated
    ends left unswapped (low above high); the higher-is-better interval itself is pinned by the other tests.
    """
    rng = np.random.default_rng(0)
    values = [0.10, 0.20]
    reps = [np.r_[v, v + 0.02 * rng.standard_normal(200)] for v in values]
    lower = worst_interval(values, reps, 1.0, 0.05, higher_is_better=False)
    mirror = worst_interval([-v for v in values], [-r for r in reps], 1.0, 0.05, higher_is_better=True)
    assert (lower.value, lower.low, lower.high) == pytest.approx((-mirror.value, -mirror.high, -mirror.low))
    assert lower.value == 0.2 and lower.low < lower.value < lower.high
    one = worst_interval(values[1:], reps[1:], 1.0, 0.05, higher_is_better=False)
    expected = percentile_interval(values[1], reps[1], 1.0, 0.05)
    assert (one.value, one.low, one.high) == pytest.approx((expected.value, expected.low, expected.high), abs=1e-12)
