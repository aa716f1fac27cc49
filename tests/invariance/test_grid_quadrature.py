"""The axis-aligned product-grid quadrature: right against independent integrals, and evidence under latent maps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import integrate, stats
from scipy.special import gammaln

from countvae import invariance as inv
from countvae.errors import InvalidArgumentError
from countvae.invariance.grid_quadrature import grid_log_marginal, grid_quadrature, poisson_rate_sums


def _toy(n_latent, n_genes=25, n_cells=4, seed=0, scale=0.6, library=400.0):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(n_genes, n_latent, generator=g, dtype=torch.float64) * scale
    offset = torch.full((n_cells, n_genes), np.log(library / n_genes), dtype=torch.float64)
    z = torch.randn(n_cells, n_latent, generator=g, dtype=torch.float64)
    x = torch.poisson(torch.exp(offset + z @ W.T), generator=g)
    return x, offset, W


def _log_lik_scipy(x, eta, theta):
    """log p(x | eta) summed over genes, written here from the pmfs (independent of the package's formulas)."""
    if theta is None:
        return (x * eta - np.exp(eta) - gammaln(x + 1)).sum(-1)
    log_p = -np.logaddexp(0.0, eta - np.log(theta))  # log(theta / (theta + mu))
    log_1mp = eta - np.logaddexp(np.log(theta), eta)  # log(mu / (theta + mu))
    return (gammaln(x + theta) - gammaln(theta) - gammaln(x + 1) + theta * log_p + x * log_1mp).sum(-1)


def test_the_reference_log_likelihood_is_scipys():
    x, eta = np.array([0.0, 3.0, 17.0]), np.array([0.5, 1.2, 2.9])
    np.testing.assert_allclose(_log_lik_scipy(x, eta, None), stats.poisson.logpmf(x, np.exp(eta)).sum())
    mu, theta = np.exp(eta), 4.0
    expected = stats.nbinom.logpmf(x, theta, theta / (theta + mu)).sum()
    np.testing.assert_allclose(_log_lik_scipy(x, eta, theta), expected)


@pytest.mark.parametrize("theta", [None, 4.0])
def test_one_latent_dimension_matches_scipy_quad(theta):
    x, offset, W = _toy(1, n_genes=30, n_cells=3)
    th = None if theta is None else torch.full((30,), theta, dtype=torch.float64)
    result = grid_log_marginal(x, offset, W, th)
    assert result.converged.all() and result.max_change < 1e-8
    for i in range(3):
        xi, oi, wi = x[i].numpy(), offset[i].numpy(), W[:, 0].numpy()

        def density(u, xi=xi, oi=oi, wi=wi, shift=result.log_marginal[i]):
            return np.exp(_log_lik_scipy(xi, oi + wi * u, theta) + stats.norm.logpdf(u) - shift)

        # adaptive Gauss-Kronrod over the prior's range (beyond |u| = 12 the prior is below e^-72),
        # told where the narrow posterior peak lies
        u = np.linspace(-12, 12, 24001)
        peak = float(u[np.argmax(_log_lik_scipy(xi[None], oi + np.outer(u, wi), theta) + stats.norm.logpdf(u))])
        ratio, err = integrate.quad(density, -12, 12, points=[peak], epsabs=1e-14, epsrel=1e-12, limit=500)
        assert err < 1e-9
        assert abs(np.log(ratio)) < 1e-8, (i, np.log(ratio))


@pytest.mark.parametrize("theta", [None, 4.0])
def test_two_latent_dimensions_match_a_dense_brute_force_grid(theta):
    x, offset, W = _toy(2, n_cells=2 if theta is None else 1)
    th = None if theta is None else torch.full((25,), theta, dtype=torch.float64)
    result = grid_log_marginal(x, offset, W, th)
    # a dense uniform grid at the prior's scale (700^2 nodes), with scipy's pmfs
    grid = np.linspace(-7, 7, 701)
    h = grid[1] - grid[0]
    Z = np.stack(np.meshgrid(grid, grid, indexing="ij"), -1).reshape(-1, 2)
    for i in range(x.shape[0]):
        f = _log_lik_scipy(x[i].numpy(), offset[i].numpy() + Z @ W.numpy().T, theta)
        f = f + stats.norm.logpdf(Z).sum(-1)
        brute = np.logaddexp.reduce(f) + 2 * np.log(h)
        assert abs(result.log_marginal[i] - brute) < 1e-8


def test_no_latent_effect_gives_the_closed_form():
    x, offset, _ = _toy(2)
    result = grid_log_marginal(x, offset, torch.zeros(25, 2, dtype=torch.float64))
    exact = stats.poisson.logpmf(x.numpy(), np.exp(offset.numpy())).sum(-1)
    np.testing.assert_allclose(result.log_marginal, exact, rtol=0, atol=1e-10)


@pytest.mark.parametrize("n_latent", [1, 2, 3])
def test_poisson_rate_sums_by_matrix_products_equal_the_direct_sum(n_latent):
    x, offset, W = _toy(n_latent, n_genes=7, n_cells=3)
    center = torch.randn(3, n_latent, dtype=torch.float64) * 0.1
    half = torch.rand(3, n_latent, dtype=torch.float64) + 0.5
    t = torch.linspace(-1, 1, 5, dtype=torch.float64)
    unit = torch.stack(torch.meshgrid(*([t] * n_latent), indexing="ij"), -1).reshape(-1, n_latent)
    z = center.unsqueeze(1) + unit.unsqueeze(0) * half.unsqueeze(1)  # (cells, K, L)
    direct = torch.exp(offset.unsqueeze(1) + z @ W.T).sum(-1)
    torch.testing.assert_close(poisson_rate_sums(offset, W, center, half, t), direct, rtol=1e-13, atol=0)


@pytest.mark.parametrize("n_latent, theta", [(2, None), (2, 5.0), (3, None)])
def test_orthogonal_reparameterization_agrees_and_a_shear_does_not(n_latent, theta):
    x, offset, W = _toy(n_latent, n_genes=30, n_cells=4, seed=n_latent)
    Q = torch.as_tensor(inv.random_orthogonal(n_latent, 3))
    A = torch.as_tensor(inv.shear(n_latent, 1.0))
    for th in [None if theta is None else torch.full((30,), theta, dtype=torch.float64)]:
        base = grid_log_marginal(x, offset, W, th)
        rotated = grid_log_marginal(x, offset, W @ Q.T, th)  # z' = Q z
        sheared = grid_log_marginal(x, offset, W @ torch.linalg.inv(A), th)  # z' = A z, not orthogonal
        assert base.converged.all() and rotated.converged.all() and sheared.converged.all()
        # the two grids are not images of each other: the boxes' half-widths along the axes differ
        assert not np.allclose(base.half_width_sd, 0) and base.nodes_per_axis.min() >= 33
        assert np.abs(rotated.log_marginal - base.log_marginal).max() < 2e-8
        assert np.abs(sheared.log_marginal - base.log_marginal).max() > 1e-2  # > 10^6 times the accuracy


def test_node_budget_hit_is_reported():
    x, offset, W = _toy(2, scale=1.5, library=3000.0)
    result = grid_log_marginal(x, offset, W, max_nodes=17)
    assert result.budget_hit and not result.converged.all()
    assert (result.nodes_per_axis == 17).all() and result.max_change > 1e-8
    assert "NODE BUDGET HIT" in result.describe() and "17 nodes per axis" in result.describe()
    fine = grid_log_marginal(x, offset, W)
    assert not fine.budget_hit and "BUDGET" not in fine.describe()


def test_model_level_agrees_with_the_eigenvector_oriented_quadrature(trained_linear):
    model = trained_linear
    idx = np.arange(0, 60, 3)
    grid = grid_quadrature(model, indices=idx)
    assert grid.converged.all()
    np.testing.assert_allclose(grid.log_marginal, inv.quadrature_log_marginal(model, indices=idx), rtol=0, atol=1e-8)


def test_bad_input(trained_mlp):
    x, offset, _ = _toy(2)
    with pytest.raises(InvalidArgumentError, match="n_latent <= 3"):
        grid_log_marginal(x, offset, torch.zeros(25, 4, dtype=torch.float64))
    with pytest.raises(InvalidArgumentError, match="tolerance"):
        grid_log_marginal(x, offset, torch.zeros(25, 2, dtype=torch.float64), tolerance=0.0)
    with pytest.raises(InvalidArgumentError, match="max_nodes"):
        grid_log_marginal(x, offset, torch.zeros(25, 2, dtype=torch.float64), max_nodes=5)
    with pytest.raises(InvalidArgumentError, match="decoder='linear'"):
        grid_quadrature(trained_mlp)


def test_eigenvector_quadrature_checks_its_nodes_and_dimension():
    x, offset, _ = _toy(2)
    exact = stats.poisson.logpmf(x.numpy(), np.exp(offset.numpy())).sum(-1)
    result = inv.log_marginal_linear(x, offset, torch.zeros(25, 2, dtype=torch.float64))
    np.testing.assert_allclose(result.numpy(), exact, rtol=0, atol=1e-10)
    for n_nodes in (0, True, 2.5):  # were a numpy error, one node, and a TypeError
        with pytest.raises(InvalidArgumentError, match="n_nodes"):
            inv.log_marginal_linear(x, offset, torch.zeros(25, 2, dtype=torch.float64), n_nodes=n_nodes)
    with pytest.raises(InvalidArgumentError, match="1 <= n_latent <= 3"):  # was a torch reduction error
        inv.log_marginal_linear(x, offset, torch.zeros(25, 0, dtype=torch.float64))


@pytest.fixture(scope="module")
def diagonal_prior_model():
    """A 1-d linear NB model with two batches and a diagonal prior, trained for two epochs; the prior's scale
    and the batch offsets are then set by hand so that folding the scale into ``W`` and adding the batch's
    offset both change ``p(x)`` by many nats."""
    import countvae as cv

    adata = cv.data.simulate(
        n_cells=80, n_genes=20, n_latent=1, decoder="linear", likelihood="nb", n_batches=2, library_size=300, seed=4
    )
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    model = cv.CountVAE(
        adata, n_latent=1, decoder="linear", likelihood="nb", prior="diagonal", dtype=torch.float64, n_hidden=16
    )
    model.train(max_epochs=2, progress_bar=False, seed=0)
    with torch.no_grad():
        model.module.prior.log_scale.fill_(np.log(2.0))
        model.module.decoder.batch_offset.copy_(torch.linspace(-0.6, 0.6, 20, dtype=torch.float64))
    return model, adata


def _brute_force_module_integral(model, adata, idx):
    """``log p(x)`` by the trapezoid rule over 40,001 points of z in [-16, 16] of the module's own log joint."""
    module = model.module.eval()
    x = torch.as_tensor(adata.X[idx].toarray() if hasattr(adata.X, "toarray") else adata.X[idx], dtype=torch.float64)
    b = torch.as_tensor(adata.obs["batch"].cat.codes.to_numpy()[idx], dtype=torch.long)
    grid = torch.linspace(-16.0, 16.0, 40001, dtype=torch.float64)
    with torch.no_grad():
        values = torch.cat([module.log_joint(z.view(-1, 1, 1).expand(-1, len(idx), 1), x, b) for z in grid.split(4000)])
    step = float(grid[1] - grid[0])
    log_w = torch.full((len(grid), 1), np.log(step), dtype=torch.float64)
    log_w[[0, -1]] = np.log(step / 2)
    return torch.logsumexp(values + log_w, dim=0).numpy()


def test_model_level_quadratures_equal_the_modules_own_integral_with_a_diagonal_prior_and_batches(
    diagonal_prior_model,
):
    """Known answer: the module's ``log_joint`` (prior scale 2, batch offsets, library size, NB theta) integrated
    by brute force over z. Both quadratures rebuild the log joint from the model's parameters
    (``linear_model_pieces``), so a prior scale folded the wrong way, a batch's offset misread or a library
    size left out shows here as a difference of many nats. Cells are asked for in a shuffled order: each result
    must be in the order of ``indices``."""
    model, adata = diagonal_prior_model
    idx = np.array([41, 5, 77, 12, 60, 33, 0, 68])
    assert len(set(adata.obs["batch"].cat.codes.to_numpy()[idx])) == 2
    exact = _brute_force_module_integral(model, adata, idx)
    np.testing.assert_allclose(inv.quadrature_log_marginal(model, indices=idx), exact, rtol=0, atol=1e-7)
    grid = grid_quadrature(model, indices=idx)
    assert grid.converged.all()
    np.testing.assert_allclose(grid.log_marginal, exact, rtol=0, atol=1e-7)


def test_the_node_budget_allows_the_grid_of_exactly_max_nodes():
    """Known answer from the rule "the last grid has at most ``max_nodes`` nodes per axis": with a budget of 33 a
    cell that has not converged at 17 nodes is evaluated on the 33-node grid (not stopped at 17), and is reported
    as not converged when ``|log p(x)|`` changed by more than the tolerance between the two grids."""
    x, offset, W = _toy(2, scale=1.5, library=3000.0)
    result = grid_log_marginal(x, offset, W, max_nodes=33)
    assert (result.nodes_per_axis == 33).all()
    # the change is the absolute difference from the 17-node grid on the same box: here the coarse grid lies above
    # the fine one, so a signed difference would pass as converged
    coarse = grid_log_marginal(x, offset, W, max_nodes=17)
    np.testing.assert_array_equal(coarse.half_width_sd, result.half_width_sd)
    np.testing.assert_allclose(result.change, np.abs(result.log_marginal - coarse.log_marginal), rtol=1e-12, atol=0)
    assert (coarse.log_marginal > result.log_marginal).any()
    assert not result.converged.any() and result.budget_hit


@pytest.mark.parametrize("theta", [None, 3.0])
def test_the_reference_gradient_and_curvature_are_the_derivatives_of_its_log_likelihood(theta):
    """Known answer: autograd's first and second derivatives of the summed log-likelihood in each gene's log mean
    ``eta`` (the Newton steps and the grids' scales of both quadratures use these closed forms)."""
    from countvae.invariance.quadrature import log_likelihood_terms

    x = torch.tensor([[0.0, 1.0, 4.0, 17.0]], dtype=torch.float64)
    eta = torch.tensor([[0.3, -1.2, 1.5, 2.0]], dtype=torch.float64, requires_grad=True)
    th = None if theta is None else torch.full((1, 4), theta, dtype=torch.float64)
    ll, grad, curvature = log_likelihood_terms(x, eta, th)
    np.testing.assert_allclose(ll.detach().numpy(), _log_lik_scipy(x.numpy(), eta.detach().numpy(), theta))
    (auto_grad,) = torch.autograd.grad(ll.sum(), eta, create_graph=True)
    torch.testing.assert_close(grad, auto_grad.detach(), rtol=1e-12, atol=1e-12)
    second = torch.stack([torch.autograd.grad(auto_grad[0, g], eta, retain_graph=True)[0][0, g] for g in range(4)])
    torch.testing.assert_close(curvature.detach()[0], -second, rtol=1e-12, atol=1e-12)
