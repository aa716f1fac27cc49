"""B(z) under the Fisher metric: closed forms, the k-NN cross-check, and fitted models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bench_modules import benchmark_module
from scipy.stats import ortho_group

import countvae as cv

bilipschitz = benchmark_module("bilipschitz")
bilipschitz_constant = bilipschitz.bilipschitz_constant
fisher_singular_values = bilipschitz.fisher_singular_values
fisher_weights = bilipschitz.fisher_weights
knn_stretch = bilipschitz.knn_stretch
model_bilipschitz = bilipschitz.model_bilipschitz
variance_stabilized = bilipschitz.variance_stabilized


def test_poisson_linear_decoder_closed_form():
    rng = np.random.default_rng(0)
    W = rng.normal(size=(30, 3))
    mean = np.full((5, 30), 4.0)
    sv = fisher_singular_values(np.broadcast_to(W, (5, 30, 3)), mean)
    expected = 2.0 * np.linalg.svd(W, compute_uv=False)  # G = 4 W^T W
    np.testing.assert_allclose(sv, np.broadcast_to(expected, (5, 3)), rtol=1e-10)
    np.testing.assert_allclose(bilipschitz_constant(sv), np.sqrt(expected[0] / expected[-1]), rtol=1e-10)
    np.testing.assert_allclose(
        bilipschitz_constant(sv, scale_free=False), max(expected[0], 1 / expected[-1]), rtol=1e-10
    )


def test_rank_deficient_decoder_has_infinite_constant():
    sv = np.array([[2.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    np.testing.assert_array_equal(bilipschitz_constant(sv), [np.inf, np.inf, 1.0])
    np.testing.assert_array_equal(bilipschitz_constant(sv, scale_free=False), [np.inf, np.inf, 1.0])


def test_nb_weight_is_the_fisher_information_of_the_log_mean():
    # For NB(mean mu, inverse dispersion theta) the Fisher information of eta = log mu is mu^2 / Var.
    mu, theta = np.array([0.5, 3.0, 40.0]), np.array([2.0, 10.0, 0.7])
    expected = mu**2 / (mu + mu**2 / theta)
    np.testing.assert_allclose(fisher_weights(mu, theta), expected, rtol=1e-12)
    # and by simulation: the variance of the score d log p / d eta
    rng = np.random.default_rng(1)
    for m, t, e in zip(mu, theta, expected, strict=True):
        x = rng.negative_binomial(t, t / (t + m), size=400_000)
        score = x - (x + t) * m / (m + t)  # d/deta log NB(x; e^eta, t)
        assert score.var() == pytest.approx(e, rel=0.02)


def test_variance_stabilizing_map_has_unit_variance_slope():
    mu, theta = np.array([0.3, 5.0, 200.0]), np.array([1.5, 8.0, 20.0])
    h = 1e-6
    for th, var in ((None, mu), (theta, mu + mu**2 / theta)):
        slope = (variance_stabilized(mu + h, th) - variance_stabilized(mu - h, th)) / (2 * h)
        np.testing.assert_allclose(slope, 1 / np.sqrt(var), rtol=1e-6)


def test_rotating_the_latents_does_not_change_singular_values():
    rng = np.random.default_rng(2)
    jac = rng.normal(size=(10, 20, 3))
    mean = rng.exponential(size=(10, 20)) * 5
    q = ortho_group.rvs(3, random_state=3)
    np.testing.assert_allclose(
        fisher_singular_values(jac @ q.T, mean, np.full(20, 3.0)), fisher_singular_values(jac, mean, np.full(20, 3.0))
    )


def test_knn_stretch_recovers_a_linear_maps_constant():
    rng = np.random.default_rng(4)
    a = np.array([[3.0, 1.0], [0.0, 1.0], [0.5, -0.5]])
    z = rng.standard_normal((4000, 2))
    sv = np.linalg.svd(a, compute_uv=False)
    exact = np.sqrt(sv[0] / sv[-1])
    knn = knn_stretch(z, z @ a.T, n_neighbors=30)
    assert np.all(knn["b_knn"] <= exact + 1e-9)  # neighbours only probe some directions
    assert np.median(knn["b_knn"]) == pytest.approx(exact, rel=0.03)
    np.testing.assert_allclose(knn["ratio_max"].max(), sv[0], rtol=0.01)


def test_true_decoder_jacobian_matches_finite_differences():
    adata = cv.data.simulate(n_cells=200, n_genes=40, n_latent=3, decoder="mlp", leaky_slope=0.3, seed=5)
    log_mean, jac = bilipschitz.true_log_rate_jacobian(adata)
    z = adata.obsm["z_true"]
    h = 1e-6
    for k in range(3):
        step = np.zeros(3)
        step[k] = h
        plus, _ = bilipschitz.true_log_rate_jacobian(adata, z + step)
        minus, _ = bilipschitz.true_log_rate_jacobian(adata, z - step)
        np.testing.assert_allclose((plus - minus) / (2 * h), jac[:, :, k], atol=1e-6)
    # the log mean is the simulator's: mean counts agree with exp(log_mean) on average
    counts = np.asarray(adata.X.todense())
    ratio = counts.sum(0) / np.exp(log_mean).sum(0)
    assert np.median(np.abs(ratio - 1)) < 0.05


def test_linear_simulation_jacobian_is_the_loading_matrix():
    adata = cv.data.simulate(n_cells=50, n_genes=20, n_latent=2, decoder="linear", seed=6)
    _, jac = bilipschitz.true_log_rate_jacobian(adata)
    np.testing.assert_array_equal(jac[7], adata.uns["simulation"]["W"])


def test_model_bilipschitz_of_a_linear_poisson_model():
    adata = cv.data.simulate(n_cells=400, n_genes=40, n_latent=2, likelihood="poisson", decoder="linear", seed=7)
    cv.CountVAE.setup_anndata(adata)
    model = cv.CountVAE(adata, n_latent=2, likelihood="poisson", decoder="linear", n_hidden=16)
    model.train(max_epochs=5, progress_bar=False, seed=0)
    table = model_bilipschitz(model, adata, library_size=1000.0)
    assert list(table.columns) == ["sigma_min", "sigma_max", "b", "b_unscaled", "b_knn"]
    # closed form: G = W^T diag(mu) W with mu = 1000 exp(b + W z) at the posterior mean
    W = model.get_loadings().to_numpy().astype(np.float64)
    z = model.get_latent_representation()
    bias = model.module.decoder.bias.detach().numpy().astype(np.float64)
    mu = 1000.0 * np.exp(bias + z @ W.T)
    G = np.einsum("gl,ng,gk->nlk", W, mu, W)
    eig = np.sqrt(np.linalg.eigvalsh(G))
    np.testing.assert_allclose(table["sigma_max"], eig[:, -1], rtol=1e-4)
    np.testing.assert_allclose(table["b"], np.sqrt(eig[:, -1] / eig[:, 0]), rtol=1e-4)
    assert np.all(table["b"] >= 1.0) and np.all(table["b_knn"] >= 1.0)


def test_model_bilipschitz_nb_weights_use_the_fitted_dispersion(trained_mlp):
    from countvae.diagnostics.fitting.fitted_model import CountVAEFit

    adata = trained_mlp.adata
    table = model_bilipschitz(trained_mlp, adata, library_size=500.0)
    fit = CountVAEFit(trained_mlp, seed=0)
    z = fit.latent(adata)
    mu = 500.0 * np.exp(fit.decode_log_rate(adata, z))
    theta = torch.exp(trained_mlp.module.likelihood.log_theta[0]).detach().numpy()
    jac = fit.decoder_jacobian(adata)
    nb = fisher_singular_values(jac, mu, theta)
    np.testing.assert_allclose(table["sigma_max"], nb[:, 0], rtol=1e-5)
    poisson = fisher_singular_values(jac, mu)
    assert np.all(poisson[:, 0] > nb[:, 0])  # NB overdispersion shrinks the metric
