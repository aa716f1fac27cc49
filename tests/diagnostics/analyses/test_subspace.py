"""Rotation-invariant geometry: principal angles, CKA, k-NN overlap, covariance spectra."""

import numpy as np
import pytest
from diagnostics_helpers import random_rotation

from countvae.diagnostics.analyses.downstream import neighbourhood_overlap
from countvae.diagnostics.analyses.subspace import (
    analyst_graph_k,
    covariance_spectrum,
    geometry_table,
    jacobian_span,
    knn_jaccard_per_cell,
    knn_sets,
    knn_sets_among,
    linear_cka,
    principal_angles,
    spectrum_distance,
    subspace_overlap,
    weighted_overlap,
)
from countvae.errors import InvalidArgumentError


def test_principal_angles_known_value():
    t = 0.3
    a = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    b = np.array([[2.0, 0.0], [0.0, np.cos(t)], [0.0, np.sin(t)], [0.0, 0.0]])
    np.testing.assert_allclose(principal_angles(a, b), [0.0, t], atol=1e-12)
    assert subspace_overlap(principal_angles(a, b)) == pytest.approx((1 + np.cos(t) ** 2) / 2)
    c = np.array([[0.0], [0.0], [0.0], [1.0]])
    np.testing.assert_allclose(principal_angles(a, c), [np.pi / 2])


def test_principal_angles_invariant_under_rotating_the_latent_side():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(50, 4))
    q = random_rotation(4, 3)
    np.testing.assert_allclose(principal_angles(w, w @ q.T), 0.0, atol=1e-6)


def test_jacobian_span_of_a_linear_decoder_is_the_loading_span():
    rng = np.random.default_rng(1)
    w = rng.normal(size=(80, 3))
    jac = np.broadcast_to(w, (40, 80, 3)) + 0.0
    basis = jacobian_span(jac, 3)
    np.testing.assert_allclose(principal_angles(basis, w), 0.0, atol=1e-6)
    # Columns are singular vectors scaled by the singular values of the stacked Jacobians: sqrt(40) svals(W).
    np.testing.assert_allclose(
        np.linalg.norm(basis, axis=0), np.sqrt(40) * np.linalg.svd(w, compute_uv=False), rtol=1e-8
    )
    # Rotating every cell's Jacobian (J -> J Q^T) leaves the span and the weights unchanged.
    rotated = jacobian_span(jac @ random_rotation(3, 2).T, 3)
    np.testing.assert_allclose(principal_angles(basis, rotated), 0.0, atol=1e-6)
    assert weighted_overlap(basis, rotated) == pytest.approx(1.0)


def test_weighted_overlap_known_value():
    e = np.eye(4)
    a = np.column_stack([2 * e[:, 0], e[:, 1]])  # 4/5 of a's energy is along e1, which b contains
    b = np.column_stack([e[:, 0], e[:, 2]])  # half of b's energy (e1) lies in span a
    assert weighted_overlap(a, b) == pytest.approx(0.5 * (0.8 + 0.5))
    assert weighted_overlap(a, a @ random_rotation(2, 3)) == pytest.approx(1.0)
    # A zero or repeated column adds no direction to a span: orthogonal spans still do not overlap at all.
    assert weighted_overlap(np.column_stack([e[:, 0], 0 * e[:, 1]]), e[:, [1]]) == pytest.approx(0.0, abs=1e-15)
    assert weighted_overlap(np.column_stack([e[:, 0], e[:, 0]]), e[:, [1]]) == pytest.approx(0.0, abs=1e-15)


def test_linear_cka_known_values_and_invariance():
    rng = np.random.default_rng(2)
    # Two orthonormal centred columns X = [a, b], Y = [a]: ||Y^T X||^2 = 1, ||X^T X|| = sqrt2, ||Y^T Y|| = 1.
    raw = rng.normal(size=(500, 2))
    x, _ = np.linalg.qr(raw - raw.mean(0))
    assert linear_cka(x, x[:, :1]) == pytest.approx(1 / np.sqrt(2), rel=1e-9)
    z = rng.normal(size=(1000, 5))
    assert linear_cka(z, 3.0 * z @ random_rotation(5, 1).T + 7.0) == pytest.approx(1.0)
    assert linear_cka(z, rng.normal(size=(1000, 5))) < 0.05


def test_knn_jaccard_known_values():
    # Pairs far apart: each point's single nearest neighbour is its partner.
    x = np.array([[0.0], [1.0], [10.0], [11.0]])
    y = np.array([[0.0], [10.0], [1.0], [11.0]])  # partners swapped: 0-2 and 1-3
    assert neighbourhood_overlap(x, x, k=1) == 1.0
    assert neighbourhood_overlap(x, y, k=1) == 0.0
    np.testing.assert_array_equal(knn_sets(x, 1).ravel(), [1, 0, 3, 2])
    # Cells 2 and 3 swap clusters: cells 0, 1, 4, 5 keep one of two neighbours (Jaccard 1/3), 2 and 3 none.
    xs = np.array([[0.0], [1.0], [1.9], [30.0], [31.0], [31.9]])
    ys = np.array([[0.0], [1.0], [30.0], [1.9], [31.0], [31.9]])
    assert neighbourhood_overlap(xs, ys, k=2) == pytest.approx((4 / 3) / 6)


def test_knn_jaccard_rotation_invariant():
    z = np.random.default_rng(3).normal(size=(300, 4))
    assert neighbourhood_overlap(z, z @ random_rotation(4, 4).T, k=10) == pytest.approx(1.0)


def test_covariance_spectrum_known_and_invariant():
    rng = np.random.default_rng(4)
    z = rng.normal(size=(200_000, 2)) * np.array([2.0, 1.0])
    np.testing.assert_allclose(covariance_spectrum(z), [4.0, 1.0], rtol=0.02)
    rotated = covariance_spectrum(z @ random_rotation(2, 5).T)
    np.testing.assert_allclose(rotated, covariance_spectrum(z), rtol=1e-9)
    assert spectrum_distance(rotated, covariance_spectrum(z)) < 1e-9
    assert spectrum_distance(np.array([4.0, 1.0]), np.array([1.0, 1.0])) == pytest.approx(
        3.0 / np.sqrt(np.sqrt(17 * 2))
    )


def test_geometry_table_on_rotated_copies():
    rng = np.random.default_rng(5)
    z = rng.normal(size=(600, 3))
    w = rng.normal(size=(40, 3))
    q = random_rotation(3, 7)
    table = geometry_table({"a": z, "b": z @ q.T}, spans={"a": w, "b": w @ q.T}, k=10)
    row = table.iloc[0]
    assert row["cka"] == pytest.approx(1.0)
    assert row["knn_jaccard"] == pytest.approx(1.0)
    assert row["spectrum_distance"] < 1e-9
    assert row["subspace_overlap"] == pytest.approx(1.0)
    assert row["weighted_overlap"] == pytest.approx(1.0)
    assert row["max_angle_deg"] < 1e-3


def test_bad_inputs():
    with pytest.raises(InvalidArgumentError):
        principal_angles(np.ones((3, 2)), np.ones((4, 2)))
    with pytest.raises(InvalidArgumentError):
        linear_cka(np.ones((3, 2)), np.ones((4, 2)))
    with pytest.raises(InvalidArgumentError):
        knn_sets(np.ones((3, 2)), 3)
    with pytest.raises(InvalidArgumentError):
        geometry_table({"a": np.ones((3, 2))})


# ----- the analyst's graph: held-out rows among all cells, or k scaled to the cells ------------------
def _two_fits(seed: int, n: int = 1800):
    """Latents of one fit and of a second whose cells are displaced by noise (0.3 sd in 5 dimensions)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, 5))
    return z, z + 0.3 * rng.normal(size=z.shape)


def test_k_keeps_the_neighbourhoods_share_of_the_cells():
    assert analyst_graph_k(15, 300, 1800) == 2  # 2.5 rounds to even
    assert analyst_graph_k(15, 300, 4000) == 1
    assert analyst_graph_k(15, 1000, 1000) == 15
    assert analyst_graph_k(15, 10, 10) == 9  # never more than the other cells
    assert analyst_graph_k(15, 300, 200) == 22  # more cells here than in the analyst's graph: k grows
    with pytest.raises(InvalidArgumentError, match="at least 2 cells"):
        analyst_graph_k(15, 300, 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_overlap_on_a_subset_estimates_the_whole_graphs(seed):
    a, b = _two_fits(seed)
    truth = neighbourhood_overlap(a, b, 15)  # the analyst's graph: k = 15 on all 1,800 cells
    held, rest = np.arange(300), np.arange(300, 1800)
    naive = neighbourhood_overlap(a[held], b[held], 15)
    scaled = neighbourhood_overlap(a[held], b[held], analyst_graph_k(15, 300, 1800))
    rows = knn_jaccard_per_cell(knn_sets_among(a[held], a[rest], 15), knn_sets_among(b[held], b[rest], 15)).mean()
    assert naive > truth + 0.1  # k = 15 on 300 cells describes a much coarser graph
    assert abs(scaled - truth) < 0.03
    assert abs(rows - truth) < 0.015


def test_rows_among_the_reference_are_those_of_the_whole_graph():
    a, _ = _two_fits(3, n=400)
    held, rest = np.arange(100), np.arange(100, 400)
    whole = knn_sets(a, 7)[:100]
    among = knn_sets_among(a[held], a[rest], 7)
    assert np.array_equal(np.sort(whole, axis=1), np.sort(among, axis=1))
    with pytest.raises(InvalidArgumentError, match="same width"):
        knn_sets_among(a[:, :2], a[:, :3], 5)
    with pytest.raises(InvalidArgumentError, match="need more than"):
        knn_sets_among(a[:3], a[3:5], 5)
