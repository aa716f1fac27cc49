"""benchmarks/knn_reference.py: the exact k-NN graph and its Leiden clusters."""

from __future__ import annotations

import numpy as np
import pytest
from bench_modules import benchmark_module
from sklearn.metrics import adjusted_rand_score

from countvae.errors import InvalidArgumentError

knn_reference = benchmark_module("knn_reference")


def _blobs(n_per: int, centres: np.ndarray, scale: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(len(centres)), n_per)
    return centres[labels] + scale * rng.standard_normal((len(labels), centres.shape[1])), labels


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
