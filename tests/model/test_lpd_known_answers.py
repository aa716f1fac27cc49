"""``log_predictive_density`` on a tiny linear Poisson model against exact quadrature, cell by cell.

Known answer: :func:`countvae.invariance.quadrature_log_marginal` (adaptive Gauss-Hermite, exact to ~1e-8 for
one latent dimension). The model is trained for a few epochs only: the estimators must be right for the
model as it is, whatever the quality of its fit.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import countvae as cv
from countvae.errors import UnreliableEstimateWarning
from countvae.invariance import quadrature_log_marginal
from countvae.model import copy_model
from countvae.model.inference import default_marginal_settings
from countvae.module.marginal import MarginalSettings


@pytest.fixture(scope="module")
def tiny_poisson():
    adata = cv.data.simulate(
        n_cells=120, n_genes=20, n_latent=1, decoder="linear", likelihood="poisson", library_size=300, seed=2
    )
    cv.CountVAE.setup_anndata(adata)
    model = cv.CountVAE(adata, n_latent=1, decoder="linear", likelihood="poisson", dtype=torch.float64, n_hidden=16)
    # a briefly trained model (3 epochs at 1e-3, no early stopping): the tolerances below were set on this fit
    model.train(max_epochs=3, early_stopping=False, progress_bar=False, seed=0)
    return model


# cells in an order that is neither sorted nor reversed: a row given to the wrong cell is off by whole nats
CELLS = np.array([57, 3, 101, 18, 44, 90, 7, 66, 29, 112, 75, 50])


def test_mixture_estimate_matches_quadrature_cell_by_cell_in_the_order_of_the_indices(tiny_poisson):
    """Each row of the default estimator is the ``log p(x)`` of the cell at that position of ``indices``: within
    0.02 nats of quadrature on average and within 3 reported standard errors (plus 1e-3) per cell."""
    exact = quadrature_log_marginal(tiny_poisson, indices=CELLS)
    est = tiny_poisson.get_log_predictive_density(indices=CELLS, seed=1)
    err = est["lpd"].to_numpy() - exact
    assert est["reliable"].all()
    assert np.abs(err).mean() < 0.02
    assert np.all(np.abs(err) <= 3 * est["mc_se"].to_numpy() + 1e-3)


def test_guide_estimate_with_many_draws_matches_quadrature_in_the_order_of_the_indices(tiny_poisson):
    """The guide estimator (weights ``p(x, z) / q(z | x)``) with 4,000 draws: ``exp(lpd)`` is unbiased for
    ``p(x)``, so where k-hat passes the error is within 4 reported standard errors (plus 0.01 nats)."""
    exact = quadrature_log_marginal(tiny_poisson, indices=CELLS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnreliableEstimateWarning)  # cells with a high k-hat are left out below
        est = tiny_poisson.get_log_predictive_density(indices=CELLS, seed=1, n_samples=4000, method="guide")
    err = est["lpd"].to_numpy() - exact
    reliable = est["reliable"].to_numpy()
    assert reliable.sum() >= 8
    assert np.all(np.abs(err[reliable]) <= 4 * est["mc_se"].to_numpy()[reliable] + 0.01)
    assert np.median(np.abs(err)) < 0.05


def test_default_settings_skip_restarts_only_for_a_log_concave_posterior(tiny_poisson):
    """Linear decoder, Poisson likelihood, normal prior: one mode, no pilot and no restarts; an MLP decoder keeps
    the measured default (restarts on)."""
    settings = default_marginal_settings(tiny_poisson.module)
    assert settings.n_pilot == 0 and settings.n_restarts == 0
    mlp = cv.CountVAE(tiny_poisson.adata, n_latent=1, decoder="mlp", likelihood="poisson", n_hidden=8)
    assert default_marginal_settings(mlp.module).n_restarts > 0
    laplace = cv.CountVAE(tiny_poisson.adata, n_latent=1, decoder="linear", likelihood="poisson", prior="laplace")
    assert default_marginal_settings(laplace.module).n_restarts > 0


def test_n_samples_sets_the_final_draws_of_the_mixture_estimator(tiny_poisson):
    """Known answer: without pilot, redraw and second pass the estimate rests on exactly ``n_samples`` weights,
    so its effective sample size is at most 7 (the settings' own 800 draws would give far more)."""
    settings = MarginalSettings(n_pilot=0, pilot_restarts=0, prior_restarts=0, redraw=0, escalation_draws=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnreliableEstimateWarning)  # 7 draws give no reliable k-hat
        est = tiny_poisson.get_log_predictive_density(indices=CELLS, seed=1, n_samples=7, settings=settings)
    assert (est["ess"] <= 7 + 1e-9).all() and (est["ess"] >= 1).all()


@pytest.mark.parametrize("likelihood", ["poisson", "nb", "zinb"])
def test_float32_model_of_deep_cells_matches_quadrature(likelihood):
    """A float32 model of cells with ~300k counts: the estimate is as accurate as for shallow cells.

    The log joint of such a cell is a sum over genes whose terms cancel to a small fraction of their size; evaluated
    in float32 its rounding error was tenths of a nat, which the log-sum-exp of the weights turned into an upward bias
    of several reported standard errors (and the Poisson constant ``-sum lgamma(x + 1)`` alone was off by ~0.1).
    The known answer is quadrature (float64) where it applies; for the zero-inflated NB, which it does not cover, the
    estimator on a float64 copy of the model with 2,000 draws (the float64 estimator is checked against quadrature
    above), within both standard errors.
    """
    adata = cv.data.simulate(
        n_cells=60, n_genes=20, n_latent=1, decoder="linear", likelihood=likelihood, library_size=300_000, seed=4
    )
    cv.CountVAE.setup_anndata(adata)
    model = cv.CountVAE(adata, n_latent=1, decoder="linear", likelihood=likelihood, n_hidden=16)
    model.train(max_epochs=3, early_stopping=False, progress_bar=False, seed=0)
    cells = np.arange(12)
    est = model.get_log_predictive_density(indices=cells, seed=1)
    se = est["mc_se"].to_numpy()
    if likelihood == "zinb":
        gold = copy_model(model, torch.float64).get_log_predictive_density(indices=cells, seed=2, n_samples=2000)
        exact, se = gold["lpd"].to_numpy(), np.hypot(se, gold["mc_se"].to_numpy())
    else:
        exact = quadrature_log_marginal(model, indices=cells)
    err = est["lpd"].to_numpy() - exact
    assert est["reliable"].all()
    assert abs(err.mean()) < 0.02
    assert np.all(np.abs(err) <= 3 * se + 1e-3)
