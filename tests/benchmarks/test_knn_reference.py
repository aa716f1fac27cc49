"""benchmarks/knn_reference.py: the exact k-NN graph and its Leiden clusters; k-NN overlaps of the analyst's graph."""

from __future__ import annotations

import numpy as np
import pytest
from bench_modules import benchmark_module
from sklearn.metrics import adjusted_rand_score

from countvae.diagnostics.analyses.downstream import neighbourhood_overlap
from countvae.diagnostics.analyses.subspace import knn_jaccard_per_cell, knn_sets
from countvae.errors import InvalidArgumentError

knn_reference = benchmark_module("knn_reference")
analyst_graph_k = knn_reference.analyst_graph_k
knn_sets_among = knn_reference.knn_sets_among


def _blobs(n_per: int, centres: np.ndarray, scale: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(len(centres)), n_per)
    return centres[labels] + scale * rng.standard_normal((len(labels), centres.shape[1])), labels


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
    with pytest.raises(InvalidArgumentError, match="at least as many cells"):
        analyst_graph_k(15, 300, 200)


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


def test_knn_adjacency_known_graph():
    points = np.array([[0.0], [1.0], [3.0], [6.0], [10.0]])
    adjacency = knn_reference.knn_adjacency(points, n_neighbors=1).toarray()
    expected = np.zeros((5, 5))
    for i, j in [(0, 1), (1, 2), (2, 3), (3, 4)]:
        expected[i, j] = expected[j, i] = 1
    np.testing.assert_array_equal(adjacency, expected)
    with pytest.raises(InvalidArgumentError, match="more than"):
        knn_reference.knn_adjacency(points, n_neighbors=5)


def test_leiden_recovers_separated_blobs_for_every_seed():
    centres = np.array([[0.0, 0.0, 0.0], [12.0, 0.0, 0.0], [0.0, 12.0, 0.0]])
    z, truth = _blobs(60, centres, 1.0, seed=2)
    adjacency = knn_reference.knn_adjacency(z, 10)
    for seed in (0, 1, 2):
        labels = knn_reference.leiden_labels(adjacency, resolution=0.3, seed=seed)
        assert adjusted_rand_score(truth, labels) == 1.0
