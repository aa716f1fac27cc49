"""The guide importance sampler (method="guide") and the quadrature reference; the default: test_lpd_default.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import countvae as cv
from countvae.invariance import log_marginal_linear, quadrature_log_marginal


def _fit(likelihood, n_latent, library_size, seed=1):
    adata = cv.data.simulate(
        n_cells=1000,
        n_genes=30,
        n_latent=n_latent,
        decoder="linear",
        likelihood=likelihood,
        library_size=library_size,
        seed=seed,
    )
    cv.CountVAE.setup_anndata(adata)
    model = cv.CountVAE(
        adata,
        n_latent=n_latent,
        decoder="linear",
        likelihood=likelihood,
        dtype=torch.float64,
        dropout_rate=0.0,
        batch_norm=False,
        n_hidden=64,
        n_layers=2,
    )
    # every epoch of a fixed schedule (no early stopping): the known answers below were set on these fits
    model.train(max_epochs=150, lr=3e-3, early_stopping=False, progress_bar=False, seed=0)
    return model


@pytest.fixture(scope="module")
def nb_model():
    return _fit("nb", 2, 500)


@pytest.fixture(scope="module")
def poisson_model():
    return _fit("poisson", 1, 300)


def test_quadrature_matches_brute_force_grid():
    g = torch.Generator().manual_seed(0)
    G, n = 25, 4
    W = torch.randn(G, 2, generator=g, dtype=torch.float64) * 0.6
    off = torch.full((n, G), np.log(400 / G), dtype=torch.float64)
    z = torch.randn(n, 2, generator=g, dtype=torch.float64)
    for theta in (None, torch.full((G,), 4.0, dtype=torch.float64)):
        x = torch.poisson(torch.exp(off + z @ W.T), generator=g)
        exact = log_marginal_linear(x, off, W, theta, n_nodes=20)
        grid = torch.linspace(-7, 7, 701, dtype=torch.float64)
        h = grid[1] - grid[0]
        Z = torch.stack(torch.meshgrid(grid, grid, indexing="ij"), -1).reshape(-1, 2)
        from countvae.invariance.quadrature import log_likelihood_terms

        brute = []
        for i in range(n):
            ll, _, _ = log_likelihood_terms(x[i].expand(len(Z), G), off[i] + Z @ W.T, theta)
            brute.append(torch.logsumexp(ll - 0.5 * (Z**2).sum(-1), 0) - np.log(2 * np.pi) + 2 * torch.log(h))
        torch.testing.assert_close(exact, torch.stack(brute), rtol=0, atol=1e-8)


def test_quadrature_nodes_converged(nb_model):
    idx = nb_model.validation_indices[:20]
    a = quadrature_log_marginal(nb_model, indices=idx, n_nodes=20)
    b = quadrature_log_marginal(nb_model, indices=idx, n_nodes=40)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-8)


@pytest.mark.parametrize("which", ["nb_model", "poisson_model"])
def test_importance_sampling_converges_to_quadrature(which, request):
    model = request.getfixturevalue(which)
    idx = model.validation_indices[:40]
    exact = quadrature_log_marginal(model, indices=idx)
    errors, se = {}, {}
    for S in (10, 10000):
        est = model.get_log_predictive_density(indices=idx, n_samples=S, seed=3, method="guide")
        errors[S], se[S] = est.lpd.to_numpy() - exact, est.mc_se.to_numpy()
    # a lower bound in expectation: the estimate sits below the truth and the gap shrinks with S
    assert errors[10].mean() < 0
    assert np.abs(errors[10000]).mean() < 0.5 * np.abs(errors[10]).mean()
    assert abs(errors[10000].mean()) < 0.15
    assert np.median(np.abs(errors[10000])) < 0.1
    # where k-hat passes, the reported Monte Carlo error covers the true error for most cells; where it
    # fails (NaN SE) the errors are larger
    reliable = np.isfinite(se[10000])
    assert reliable.sum() >= 10
    assert np.mean(np.abs(errors[10000][reliable]) < 4 * se[10000][reliable] + 0.01) >= 0.85
    if (~reliable).any():
        assert np.abs(errors[10000][~reliable]).mean() > np.abs(errors[10000][reliable]).mean()


def test_standard_error_matches_seed_to_seed_spread(nb_model):
    idx = nb_model.validation_indices[:15]
    runs = [nb_model.get_log_predictive_density(indices=idx, n_samples=400, seed=s, method="guide") for s in range(30)]
    spread = np.std([r.lpd.to_numpy() for r in runs], axis=0, ddof=1)
    reported = np.mean([r.mc_se.to_numpy() for r in runs], axis=0)  # NaN for cells ever flagged unreliable
    assert np.isfinite(reported).sum() >= 8
    ratio = np.nanmedian(spread / reported)
    assert 0.5 < ratio < 2.0, ratio


def test_quadrature_refuses_unsupported_models(trained_mlp):
    with pytest.raises(cv.errors.InvalidArgumentError, match="decoder='linear'"):
        quadrature_log_marginal(trained_mlp)
