"""The marker pitfall: per-dimension correlations move with the rotation, R^2 on all dimensions does not."""

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from diagnostics_helpers import random_rotation

from countvae.diagnostics.analyses.markers import (
    default_markers,
    dimension_correlations,
    marker_correlations,
    marker_matrix,
    marker_summary,
    r_squared,
)
from countvae.errors import CountVAEWarning, InvalidArgumentError


def latents_and_marker(n=2000, d=4, seed=0):
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, d))
    marker = z[:, 0] + 0.5 * rng.standard_normal(n)  # R^2 = 1 / 1.25 in expectation
    return z, marker


def test_r_squared_invariant_under_invertible_affine_maps_and_known_value():
    z, marker = latents_and_marker()
    r2 = r_squared(z, marker)
    assert r2 == pytest.approx(0.8, abs=0.02)
    rng = np.random.default_rng(1)
    assert r_squared(z @ random_rotation(4, 2).T, marker) == pytest.approx(r2, abs=1e-10)
    assert r_squared(z @ rng.normal(size=(4, 4)) + 5.0, marker) == pytest.approx(r2, abs=1e-10)


def test_dimension_correlations_follow_the_rotation():
    z, marker = latents_and_marker()
    corr = dimension_correlations(z, marker)
    assert np.argmax(np.abs(corr)) == 0 and corr[0] == pytest.approx(np.sqrt(0.8), abs=0.02)
    q = random_rotation(4, 3)
    rotated = dimension_correlations(z @ q.T, marker)
    # The same signal, spread over other dimensions: the correlation vector rotates with z (z is ~white).
    np.testing.assert_allclose(rotated, q @ corr, atol=0.05)
    assert not np.allclose(rotated, corr, atol=0.1)


def test_summary_marker_r2_agrees_while_best_dimension_moves():
    z, marker = latents_and_marker()
    latents = {"seed 0": z, "seed 1": z @ random_rotation(4, 5).T, "seed 2": z[:, [2, 0, 3, 1]] * -1.0}
    summary = marker_summary(latents, pd.DataFrame({"M": marker})).iloc[0]
    assert summary["r2_max"] - summary["r2_min"] < 1e-10
    assert not summary["best_dim_agrees"]
    assert "seed 2: z1 (-" in summary["best_dims"]
    assert summary["same_dim_corr_range"] > 0.3
    long = marker_correlations(latents, pd.DataFrame({"M": marker}))
    assert len(long) == 3 * 4 and set(long.columns) == {"fit", "marker", "dim", "corr"}


def small_adata():
    counts = np.array([[10, 0, 5, 1], [0, 10, 5, 2], [10, 0, 5, 3], [0, 10, 5, 4], [5, 5, 5, 5]], dtype=np.float32)
    adata = ad.AnnData(sp.csr_matrix(counts))
    adata.var_names = ["A", "B", "flat", "<script>alert(1)</script>"]
    adata.obs_names = [f"c{i}" for i in range(5)]
    adata.obs["cell_type"] = pd.Categorical(["x", "y", "x", "y", None])
    adata.obs["score"] = [1.0, 2.0, np.nan, 4.0, 5.0]
    return adata


def test_marker_matrix_genes_numeric_and_categorical_columns():
    adata = small_adata()
    values = marker_matrix(adata, ["A", "score", "cell_type"], adata.var_names)
    assert list(values.columns) == ["A", "score", "cell_type=x", "cell_type=y"]
    # log1p of counts per 10,000: cell 0 has 16 counts, 10 of gene A.
    assert values.loc["c0", "A"] == pytest.approx(np.log1p(10 / 16 * 1e4))
    assert values.loc["c1", "A"] == 0.0
    np.testing.assert_array_equal(values["cell_type=x"].to_numpy()[:4], [1, 0, 1, 0])
    assert np.isnan(values.loc["c4", "cell_type=x"]) and np.isnan(values.loc["c2", "score"])


def test_markers_that_do_not_vary_on_the_cells_are_left_out_with_a_warning():
    # a constant column, a column missing on every cell and a category no cell has correlate with nothing: kept,
    # they would count as markers whose best dimension "changes between seeds"
    adata = small_adata()
    adata.obs["batch"] = 1.0
    adata.obs["missing"] = np.nan
    adata.obs["cell_type"] = adata.obs["cell_type"].cat.add_categories(["unused"])
    with pytest.warns(CountVAEWarning, match=r"\['batch', 'missing', 'cell_type=unused'\]"):
        values = marker_matrix(adata, ["A", "batch", "missing", "cell_type"], adata.var_names)
    assert list(values.columns) == ["A", "cell_type=x", "cell_type=y"]


def test_default_markers_are_the_most_variable_genes():
    adata = small_adata()
    top = default_markers(adata, adata.var_names, n=2)
    assert set(top) == {"A", "B"}
    assert "flat" not in default_markers(adata, adata.var_names, n=3)


def test_marker_not_in_data_is_a_clear_error():
    adata = small_adata()
    with pytest.raises(InvalidArgumentError, match="CD14"):
        marker_matrix(adata, ["A", "CD14"], adata.var_names)
    with pytest.raises(InvalidArgumentError, match="empty"):
        marker_matrix(adata, [], adata.var_names)
