"""Hand-computed marker correlations, R^2 and the per-marker summary on tiny designs."""

import warnings

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from countvae.diagnostics.analyses.markers import dimension_correlations, marker_matrix, marker_summary, r_squared

# z = 0, 1, 2, 3 and v = 11, 13, 12, 14: S_zz = 5, S_vv = 5, S_zv = 4 (about the means 1.5 and 12.5), so
# corr = 4 / 5 = 0.8 and the in-sample R^2 of v on [1, z] is 0.8^2 = 0.64. The marker's offset of 10 must not count.
Z = np.array([[0.0], [1.0], [2.0], [3.0]])
V = np.array([11.0, 13.0, 12.0, 14.0])


def test_correlation_and_r_squared_of_an_offset_marker_known_values():
    assert dimension_correlations(Z, V) == pytest.approx([0.8])
    assert r_squared(Z, V) == pytest.approx(0.64)
    # Cells where the marker is missing are dropped, not read as zeros.
    z_nan, v_nan = np.vstack([Z, [[100.0]]]), np.append(V, np.nan)
    assert dimension_correlations(z_nan, v_nan) == pytest.approx([0.8])
    assert r_squared(z_nan, v_nan) == pytest.approx(0.64)


def test_r_squared_needs_more_cells_than_coefficients():
    """Two cells and a line through them (intercept and slope): a perfect fit by construction, so no R^2."""
    assert np.isnan(r_squared(np.array([[0.0], [1.0]]), np.array([1.0, 3.0])))
    # Three cells, two coefficients: one residual degree of freedom; v = 1, 3, 2 on z = 0, 1, 2: corr = 0.5.
    assert r_squared(np.array([[0.0], [1.0], [2.0]]), np.array([1.0, 3.0, 2.0])) == pytest.approx(0.25)


def test_summary_known_values_for_a_sign_flipped_seed():
    """z0 = -3, -1, 1, 3 and z1 = 1, -1, -1, 1 (orthogonal, centred) and v = z0 + 2 z1 (|v| = 6).

    corr(z0, v) = 20 / (sqrt(20) 6) = sqrt(20) / 6 and corr(z1, v) = 8 / (2 * 6) = 2 / 3. A second seed with
    z -> -z has the same best dimension with the opposite sign: not the same story.
    """
    z = np.array([[-3.0, 1.0], [-1.0, -1.0], [1.0, -1.0], [3.0, 1.0]])
    v = z[:, 0] + 2.0 * z[:, 1]
    c0, c1 = np.sqrt(20.0) / 6.0, 2.0 / 3.0
    row = marker_summary({"a": z, "b": -z}, pd.DataFrame({"M": v})).iloc[0]
    assert row["r2_min"] == pytest.approx(1.0) and row["r2_max"] == pytest.approx(1.0)
    assert not row["best_dim_agrees"]
    assert row["best_dims"] == f"a: z0 (+{c0:.2f}); b: z0 (-{c0:.2f})"
    assert row["max_abs_corr_mean"] == pytest.approx(c0)
    assert row["same_dim_corr_range"] == pytest.approx(0.5 * (2 * c0 + 2 * c1))
    same = marker_summary({"a": z, "b": z.copy()}, pd.DataFrame({"M": v})).iloc[0]
    assert same["best_dim_agrees"] and same["same_dim_corr_range"] == pytest.approx(0.0)
    # 3 cells in 2 dimensions leave no residual: R^2 is not measured, without numpy's all-NaN warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        few = marker_summary({"a": z[:3], "b": -z[:3]}, pd.DataFrame({"M": v[:3]})).iloc[0]
    assert np.isnan(few["r2_min"]) and np.isnan(few["r2_max"]) and np.isnan(few["r2_mean"])


def test_boolean_obs_column_becomes_one_indicator_per_value():
    adata = ad.AnnData(sp.csr_matrix(np.ones((4, 2), dtype=np.float32)))
    adata.var_names = ["g0", "g1"]
    adata.obs_names = [f"c{i}" for i in range(4)]
    adata.obs["flag"] = [True, False, True, False]
    values = marker_matrix(adata, ["flag"], adata.var_names)
    assert list(values.columns) == ["flag=False", "flag=True"]
    np.testing.assert_array_equal(values["flag=True"].to_numpy(), [1.0, 0.0, 1.0, 0.0])


def test_summary_of_three_fits_with_unequal_best_correlations_known_values():
    """Three fits on the 4-cell design above (z0, z1 and v = z0 + 2 z1), the third with columns w and w + z1, where
    w = -1, 3, -3, 1 is centred and orthogonal to z0 and z1 (so it does not correlate with v).

    Best absolute correlations: c0 = sqrt(20) / 6 (fits a and b = -a) and, for c, corr(w + z1, v) = 8 / (6 sqrt(24)).
    Their mean is 0.588, their median c0 = 0.745: with two fits the two coincide, so only three tell them apart.
    Fit c's R^2: v projects on span(w, z1) as 2 z1, so 16 / 36. Same-dimension ranges: z0 spans c0 - (-c0), z1 spans
    2/3 - (-2/3). Catches: ``max_abs_corr_mean`` or ``r2_mean`` as any location other than the mean (the median
    gives c0 and 1), and a wrong best dimension of a fit whose best correlation is weak. Cannot catch: errors shared
    with ``dimension_correlations`` (its own known answers are above).
    """
    z = np.array([[-3.0, 1.0], [-1.0, -1.0], [1.0, -1.0], [3.0, 1.0]])
    w = np.array([-1.0, 3.0, -3.0, 1.0])
    v = z[:, 0] + 2.0 * z[:, 1]
    c0, c1, cw = np.sqrt(20.0) / 6.0, 2.0 / 3.0, 8.0 / (6.0 * np.sqrt(24.0))
    latents = {"a": z, "b": -z, "c": np.column_stack([w, w + z[:, 1]])}
    row = marker_summary(latents, pd.DataFrame({"M": v})).iloc[0]
    assert row["best_dims"] == f"a: z0 (+{c0:.2f}); b: z0 (-{c0:.2f}); c: z1 (+{cw:.2f})"
    assert not row["best_dim_agrees"]
    assert row["max_abs_corr_mean"] == pytest.approx((2 * c0 + cw) / 3, rel=1e-12)
    assert (row["r2_mean"], row["r2_min"], row["r2_max"]) == pytest.approx(((2 + 4 / 9) / 3, 4 / 9, 1.0), rel=1e-12)
    assert row["same_dim_corr_range"] == pytest.approx(0.5 * (2 * c0 + 2 * c1), rel=1e-12)
