"""Posterior averages of a linear model against their closed forms under the Gaussian guide."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import countvae as cv

CELLS = np.arange(20)


def _linear_model(likelihood: str) -> cv.CountVAE:
    """A briefly trained float64 linear model of 200 cells x 30 genes, one batch."""
    adata = cv.data.simulate(n_cells=200, n_genes=30, n_latent=2, decoder="linear", likelihood=likelihood, seed=5)
    cv.CountVAE.setup_anndata(adata)
    model = cv.CountVAE(adata, n_latent=2, decoder="linear", likelihood=likelihood, dtype="float64")
    return model.train(max_epochs=5, progress_bar=False, seed=0)


def _guide_moments(model: cv.CountVAE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per cell and gene: ``m = b + W mu`` and ``s^2 = sum_k W_gk^2 sigma_k^2`` of ``log_rate`` under q(z | x).

    With ``z ~ N(mu, diag(sigma^2))`` the linear decoder's ``log_rate`` is Gaussian with these moments, so
    ``E_q[exp(log_rate)] = exp(m + s^2 / 2)``. Also each cell's observed library size, (cells, 1).
    """
    module = model.module.eval()
    x = torch.tensor(model.adata.X[CELLS].toarray(), dtype=torch.float64)
    b = torch.zeros(len(CELLS), dtype=torch.long)
    with torch.no_grad():
        loc, scale = module.encode(x, b)
        weight = module.decoder.weight
        m = module.decode(loc, b).log_rate
        s2 = scale**2 @ (weight**2).T
    return m.numpy(), s2.numpy(), x.sum(1, keepdim=True).numpy()


def test_normalized_expression_with_posterior_draws_is_the_lognormal_mean():
    """``get_normalized_expression(n_samples=4000)`` against ``1e4 exp(m + s^2 / 2)``, its closed form.

    The Monte Carlo average of ``exp(Y)``, ``Y ~ N(m, s^2)``, has relative standard error ``sqrt((e^{s^2} - 1) / N)``
    exactly; every cell and gene must be within 5 of these (s^2 <= 0.11 here, so the lognormal mean of 4000 draws is
    close to normal). Catches: draws from a guide of the wrong width (twice sigma is off by ``e^{3 s^2 / 2}``, which
    the test asserts is more than 10 standard errors on some gene), or the mean decoded instead of averaged. Cannot
    catch: errors of the MLP decoder's path (this is the linear decoder) or of ``n_samples=1``.
    """
    model = _linear_model("nb")
    n = 4000
    m, s2, _ = _guide_moments(model)
    values = model.get_normalized_expression(indices=CELLS, n_samples=n, return_numpy=True)
    closed = 1e4 * np.exp(m + s2 / 2)
    rel_se = np.sqrt(np.expm1(s2) / n)
    assert np.max(np.expm1(1.5 * s2) / rel_se) > 10  # a guide twice as wide would fail
    assert np.all(np.abs(values / closed - 1) <= 5 * rel_se), np.max(np.abs(values / closed - 1) / rel_se)


@pytest.mark.parametrize("likelihood", ["poisson", "nb"])
def test_posterior_predictive_totals_per_gene_have_the_closed_form_mean(likelihood):
    """Each gene's count summed over 20 cells and 200 draws against its closed-form mean, within 5 standard errors.

    A draw is ``x ~ p(x | z)`` with ``z ~ q(z | x)``: mean ``E[mu] = l exp(m + s^2 / 2)`` (``l`` the cell's library) and
    variance ``E[mu] + E[mu^2] (1 + 1 / theta) - E[mu]^2`` with ``E[mu^2] = l^2 exp(2 m + 2 s^2)`` (Poisson: no
    ``1 / theta`` term). Draws are independent across cells and draws, so the total's mean and variance are the sums
    (expected totals of 20,000 counts and more per gene: close to normal). Catches: a bias of a gene's mean beyond 5
    standard errors (about 10% for NB, 0.2-4% for Poisson here), such as the library size applied twice or not at
    all. Cannot catch: a wrong dispersion or a guide somewhat too wide (they change the spread more than the mean),
    errors of the MLP decoder or of ZINB's gate.
    """
    model = _linear_model(likelihood)
    k = 200
    m, s2, library = _guide_moments(model)
    draws = model.posterior_predictive_sample(indices=CELLS, n_samples=k)
    assert draws.shape == (len(CELLS), 30, k)
    mean = library * np.exp(m + s2 / 2)
    inverse_theta = 0.0
    if likelihood == "nb":
        inverse_theta = np.exp(-model.module.likelihood.log_theta[0].detach().numpy())
    variance = mean + library**2 * np.exp(2 * m + 2 * s2) * (1 + inverse_theta) - mean**2
    z = (draws.sum(axis=(0, 2)) - k * mean.sum(0)) / np.sqrt(k * variance.sum(0))
    assert np.all(np.abs(z) <= 5), z
