"""EvaluatedModel: each estimate is cached under its own seed, and prior-started estimates keep the cells' order."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import countvae as cv
from countvae.invariance.evaluation import EvaluatedModel, EvaluationCells, VerifySettings, prior_started_lpd
from countvae.model import inference


@functools.cache
def _model():
    adata = cv.data.simulate(n_cells=60, n_genes=10, n_latent=2, likelihood="poisson", library_size=200, seed=3)
    cv.CountVAE.setup_anndata(adata)
    model = cv.CountVAE(adata, n_latent=2, likelihood="poisson", decoder="linear", n_hidden=8, dtype=torch.float64)
    model.train(max_epochs=2, batch_size=20, progress_bar=False, seed=0)
    return model, adata


def _evaluated(indices):
    model, adata = _model()
    s = VerifySettings(n_samples=20)
    return EvaluatedModel(model, EvaluationCells(model.cells(adata, indices), s), False), s


@pytest.mark.filterwarnings("ignore::countvae.errors.UnreliableEstimateWarning")  # a guide proposal on few draws
def test_estimates_at_two_seeds_are_the_estimators_at_those_seeds():
    """Known answer: lpd(seed) and guide_lpd(seed) equal direct calls of the estimator at that seed, whichever seed
    was asked first (a cache keyed without the seed would return the first seed's numbers for the second)."""
    indices = np.arange(8)
    ev, s = _evaluated(indices)
    model = ev.model
    cells = ev.cells
    for seed in (0, 1):
        direct = inference.log_predictive_density(
            model.module, cells.source, cells.indices, seed=seed, settings=s.estimator_for(model.module)
        )
        np.testing.assert_array_equal(ev.lpd(seed)["lpd"].to_numpy(), direct["lpd"].to_numpy())
        guide = inference.log_predictive_density(
            model.module, cells.source, cells.indices, s.n_samples, seed, method="guide"
        )
        np.testing.assert_array_equal(ev.guide_lpd(seed)["lpd"].to_numpy(), guide["lpd"].to_numpy())
    assert np.abs(ev.lpd(0)["lpd"].to_numpy() - ev.lpd(1)["lpd"].to_numpy()).max() > 0


def test_prior_started_estimates_follow_the_order_of_the_indices():
    """Known answer: the estimate for cells given in reverse order is the sorted cells' estimate reversed (each cell
    draws from one seeded generator in sorted order, so the numbers per cell do not depend on the order asked)."""
    model, adata = _model()
    s = VerifySettings(n_samples=20)
    cells = model.cells(adata, np.arange(6))
    settings = s.estimator_for(model.module)
    ordered = prior_started_lpd(model, cells.source, np.arange(6), settings, 0)["lpd"].to_numpy()
    reverse = prior_started_lpd(model, cells.source, np.arange(6)[::-1].copy(), settings, 0)["lpd"].to_numpy()
    np.testing.assert_array_equal(reverse, ordered[::-1])
    assert not np.allclose(ordered, ordered[::-1])
