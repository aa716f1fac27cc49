"""The held-out-batch classifier of the ICA benchmarks: an axis-aligned label is read from its axis."""

from __future__ import annotations

import numpy as np
import pytest
from bench_modules import benchmark_module
from scipy.stats import ortho_group

from countvae.errors import InvalidDataError

heldout_batch_classification = benchmark_module("heldout_classification").heldout_batch_classification


def test_heldout_batch_classification_reads_an_axis_aligned_label():
    rng = np.random.default_rng(14)
    n = 1500
    label = rng.integers(0, 3, n)
    batch = rng.integers(0, 3, n)
    features = rng.standard_normal((n, 5))
    features[:, 2] += 3.0 * label
    result = heldout_batch_classification(features, label, batch, n_repeats=2, classifier_params={"max_iter": 30})
    assert result.auroc.shape == (3, 3)
    assert result.mean_auroc > 0.95
    assert (result.importance.idxmax(axis=1) == 2).all()
    assert (result.sparsity > 0.7).all()
    rotated = heldout_batch_classification(
        features @ ortho_group.rvs(5, random_state=15).T, label, batch, n_repeats=2, classifier_params={"max_iter": 30}
    )
    assert rotated.sparsity.mean() < result.sparsity.mean()
    with pytest.raises(InvalidDataError, match="two batches"):
        heldout_batch_classification(np.eye(4), [0, 1, 0, 1], [0, 0, 0, 0])
