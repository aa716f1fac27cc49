"""Known answers for the invariants table's scores: the worst pair, the mean over pairs, aligned and exact rows."""

import numpy as np
import pandas as pd
import pytest
from diagnostics_helpers import random_rotation
from scipy.spatial.distance import pdist

from countvae.diagnostics.analyses.invariants import (
    InvariantInputs,
    concordance,
    gram_cosine,
    invariants_table,
    per_column_concordance,
)
from countvae.diagnostics.analyses.markers import dimension_correlations
from countvae.diagnostics.analyses.ppc import PPCStatistics


def _rows(inputs):
    table, pairs = invariants_table(inputs)
    return table.set_index("quantity"), pairs


def test_concordance_edge_cases_known_values():
    # Two equal constants agree perfectly; two different constants not at all (no covariance, a shift).
    assert concordance(np.full(5, 2.0), np.full(5, 2.0)) == 1.0
    assert concordance(np.full(5, 2.0), np.full(5, 3.0)) == 0.0
    # A cell missing in either array is dropped from both, not read as agreement or disagreement.
    assert concordance([1.0, 2.0, np.nan, 4.0], [1.0, 2.0, 3.0, 4.0]) == pytest.approx(1.0)
    assert np.isnan(concordance([1.0, np.nan], [1.0, 2.0]))


def test_per_column_concordance_is_the_mean_over_columns():
    """Column 0 equal (1), column 1 mirrored about zero (-1): mean 0; a column without values is left out."""
    x = np.array([-1.0, 0.0, 1.0])
    a = np.column_stack([x, x, [np.nan] * 3])
    b = np.column_stack([x, -x, x])
    assert per_column_concordance(a, b) == pytest.approx(0.0)


def test_gram_cosine_known_value():
    """<diag(1, 0), I> = 1 and |diag(1, 0)| |I| = sqrt 2."""
    assert gram_cosine(np.diag([1.0, 0.0]), np.eye(2)) == pytest.approx(1 / np.sqrt(2))


def test_the_ica_row_scored_once_for_all_fits_has_no_mean_over_pairs():
    """The ICA row's agreement is the worst component's corrected match: one number, no pairs to average."""
    z = np.random.default_rng(0).normal(size=(200, 2))
    components = pd.DataFrame(
        {"corrected_match": [0.58], "corrected_low": [0.50], "corrected_high": [0.66], "n_matching_cells": [200]}
    )
    table, _ = _rows(InvariantInputs(latents={"a": z, "b": z, "c": z}, components=components))
    row = table.loc["ICA coordinates"]
    assert row["agreement"] == pytest.approx(0.58) and np.isnan(row["agreement_mean"])


def test_distance_row_worst_pair_and_mean_over_pairs():
    """Fits a and b equal, c = 2 a: distances agree perfectly for (a, b) and with the CCC of (d, 2 d) otherwise.

    The reference is the CCC of the condensed distances (each pair of distinct cells once, no zero diagonal).
    """
    z = np.random.default_rng(0).normal(size=(40, 3))
    table, pairs = _rows(InvariantInputs(latents={"a": z, "b": z.copy(), "c": 2.0 * z}))
    d = pdist(z)
    x = concordance(d, 2.0 * d)
    assert x < 0.9
    row = table.loc["latent distances"]
    assert row["agreement"] == pytest.approx(x, rel=1e-12)
    assert row["agreement_mean"] == pytest.approx((1.0 + 2.0 * x) / 3.0, rel=1e-12)
    per_pair = pairs[pairs["quantity"] == "latent distances"].set_index(["fit_a", "fit_b"])["agreement"]
    assert per_pair[("a", "b")] == pytest.approx(1.0)
    assert per_pair[("a", "c")] == pytest.approx(x) and per_pair[("b", "c")] == pytest.approx(x)
    assert row["low"] <= x <= row["high"]


def test_lpd_row_takes_the_largest_difference_and_the_box_of_the_intervals():
    """Three pairs, margin 0.5 (nats per cell); all numbers in units of the margin.

    |diff|: 0.1, 0.6, 0.3 -> the row's value is 0.6. Nearest point of each interval to zero: 0 (the first
    interval straddles it), 0.1, 0.04 -> low = 0.1. Farthest: 0.8, 1.0, 0.6 -> high = 1.0.
    """
    z = np.random.default_rng(1).normal(size=(50, 2))
    lpd = pd.DataFrame(
        {
            "fit_a": ["a", "a", "b"],
            "fit_b": ["b", "c", "c"],
            "n_cells": [50, 50, 50],
            "diff_per_cell": [0.05, -0.3, 0.15],
            "ci_low": [-0.3, -0.5, 0.02],
            "ci_high": [0.4, -0.05, 0.3],
            "margin": [0.5, 0.5, 0.5],
        }
    )
    table, pairs = _rows(InvariantInputs(latents={"a": z, "b": z, "c": z}, lpd_pairs=lpd))
    row = table.loc["held-out log p(x)"]
    assert (row["agreement"], row["low"], row["high"]) == pytest.approx((0.6, 0.1, 1.0))
    per_pair = pairs[pairs["quantity"] == "held-out log p(x)"]["agreement"].to_numpy()
    np.testing.assert_allclose(per_pair, [0.1, 0.6, 0.3])


def test_sign_flipped_seed_markers_disagree_until_aligned():
    """Seed b = -a: each dimension's marker correlation changes sign (the CCC of c and -c), aligned they are equal."""
    rng = np.random.default_rng(2)
    z = rng.normal(size=(300, 2))
    markers = pd.DataFrame({"m0": z[:, 0] + 0.5 * rng.normal(size=300), "m1": z[:, 1] - z[:, 0]})
    table, _ = _rows(InvariantInputs(latents={"a": z, "b": -z}, markers=markers))
    corr = np.stack([dimension_correlations(z, markers[m].to_numpy()) for m in markers])
    row = table.loc["per-dimension marker correlations"]
    assert row["agreement"] == pytest.approx(concordance(corr, -corr), rel=1e-10)
    assert row["agreement"] < 0.0
    assert row["aligned_agreement"] == pytest.approx(1.0) and row["aligned_low"] > 0.999


def test_linear_loadings_row_is_exact_and_aligned_by_the_latent_map():
    """Latents z_b = z_a Q and loadings W_b = W_a Q (the same decoder): aligned agreement 1, no sampling error."""
    rng = np.random.default_rng(3)
    z, w, q = rng.normal(size=(200, 3)), rng.normal(size=(30, 3)), random_rotation(3, 4)
    inputs = InvariantInputs(latents={"a": z, "b": z @ q}, loadings={"a": w, "b": w @ q}, loadings_are_weights=True)
    row = _rows(inputs)[0].loc["per-dimension loadings"]
    assert row["agreement"] == pytest.approx(per_column_concordance(w, w @ q))
    assert row["low"] == row["high"] == row["agreement"]
    assert row["aligned_agreement"] == pytest.approx(1.0)
    assert row["aligned_low"] == row["aligned_high"] == row["aligned_agreement"]


def test_ppc_row_is_the_worst_pair_with_a_gene_bootstrap():
    """Fits a and b predict identical statistics (agreement 1); c's are noisy: the row is c's agreement, not 1.

    Each pair's agreement is the smaller of the CCCs over genes of the predicted CV and zero fraction.
    """
    rng = np.random.default_rng(4)
    cv, zeros = rng.uniform(0.5, 2.0, 60), rng.uniform(0.0, 0.9, 60)

    def stats(cv_gene, zero_fraction):
        return PPCStatistics(cv_gene, np.ones(10), zero_fraction, 0.0, {})

    predicted = {
        "a": stats(cv, zeros),
        "b": stats(cv.copy(), zeros.copy()),
        "c": stats(cv + 0.3 * rng.normal(size=60), zeros + 0.05 * rng.normal(size=60)),
    }
    x = min(concordance(cv, predicted["c"].cv_gene), concordance(zeros, predicted["c"].zero_fraction))
    agreement = [1.0, x, x]
    ppc_pairs = pd.DataFrame({"fit_a": ["a", "a", "b"], "fit_b": ["b", "c", "c"], "agreement": agreement})
    z = rng.normal(size=(10, 2))
    row = _rows(InvariantInputs(latents={"a": z, "b": z, "c": z}, ppc_pairs=ppc_pairs, ppc_predicted=predicted))[0].loc[
        "posterior predictive statistics"
    ]
    assert x < 0.95
    assert row["agreement"] == pytest.approx(x)
    assert row["low"] < x < row["high"] < 1.0


def test_a_pair_is_found_whichever_fit_its_table_names_first():
    """The equivalence table names the pair (b, a); the pair (a, b) of the latents reads its |diff| / margin = 0.4."""
    z = np.random.default_rng(5).normal(size=(30, 2))
    lpd = pd.DataFrame(
        {"fit_a": ["b"], "fit_b": ["a"], "n_cells": [30], "diff_per_cell": [-0.2], "margin": [0.5]}
        | {"ci_low": [-0.3], "ci_high": [-0.1]}
    )
    _, pairs = _rows(InvariantInputs(latents={"a": z, "b": z}, lpd_pairs=lpd))
    assert pairs.loc[pairs["quantity"] == "held-out log p(x)", "agreement"].tolist() == pytest.approx([0.4])
