"""Known answers for the geometry table's angles and neighbour counts, and for the Jacobian span."""

import numpy as np
import pytest

from countvae.diagnostics.analyses.subspace import (
    analyst_graph_k,
    gene_contrasts,
    geometry_table,
    jacobian_span,
    principal_angles,
)


def test_geometry_table_reports_the_known_angles():
    """Spans e1, e2 and e1, cos(t) e2 + sin(t) e3: angles 0 and t = 30 deg (max 30, mean 15, overlap (1 + 3/4) / 2)."""
    t = np.pi / 6
    a = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    b = np.array([[1.0, 0.0], [0.0, np.cos(t)], [0.0, np.sin(t)], [0.0, 0.0]])
    z = np.random.default_rng(0).normal(size=(5, 2))
    row = geometry_table({"a": z, "b": z}, spans={"a": a, "b": b}, k=15).iloc[0]
    assert row["max_angle_deg"] == pytest.approx(30.0)
    assert row["mean_angle_deg"] == pytest.approx(15.0)
    np.testing.assert_allclose(row["angles_deg"], [0.0, 30.0], atol=1e-9)
    assert row["subspace_overlap"] == pytest.approx(0.875)
    # Five cells: at most 4 other cells can be neighbours, whatever k asks.
    assert row["k"] == 4 and row["n_knn_cells"] == 5 and row["knn_jaccard"] == 1.0


def test_a_neighbourhood_is_at_least_one_cell():
    """k = 1 on 1,000 cells is 0.01 cells on 10: rounded up to the one nearest neighbour."""
    assert analyst_graph_k(1, 10, 1000) == 1


def test_gene_contrasts_remove_each_cells_mean_over_genes():
    """A Jacobian that moves every gene alike (the all-ones direction) has no contrast left; a contrast is kept."""
    jac = np.zeros((2, 3, 2))
    jac[:, :, 0] = [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]  # a different normaliser shift per cell
    jac[:, :, 1] = [[1.0, -1.0, 0.0], [2.0, 0.0, 1.0]]  # gene 0 against gene 1 (plus a shift of 1 in cell 1)
    out = gene_contrasts(jac)
    np.testing.assert_allclose(out[:, :, 0], 0.0)
    np.testing.assert_allclose(out[:, :, 1], [[1.0, -1.0, 0.0], [1.0, -1.0, 0.0]])


def test_jacobian_span_stacks_cells_as_columns():
    """Cell 0 moves gene 0 (energy 9), cell 1 gene 1 (energy 4): the span is genes 0 and 1, scaled by 3 and 2."""
    jac = np.zeros((2, 3, 1))
    jac[0, 0, 0], jac[1, 1, 0] = 3.0, 2.0
    basis = jacobian_span(jac, 2)
    np.testing.assert_allclose(np.abs(basis), [[3.0, 0.0], [0.0, 2.0], [0.0, 0.0]], atol=1e-9)
    np.testing.assert_allclose(principal_angles(basis, np.eye(3)[:, :2]), 0.0, atol=1e-7)
