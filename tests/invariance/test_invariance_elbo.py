"""The ELBO under latent maps: exact with the pushed-forward guide, coordinate-dependent for a mean-field guide."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import countvae as cv
from countvae import invariance as inv
from countvae.invariance.elbo_geometry import elbo_comparison, refit_mean_field_elbo
from countvae.invariance.quadrature import log_likelihood_terms
from countvae.model.query import query_source

ROTATION_45 = np.array([[1.0, -1.0], [1.0, 1.0]]) / np.sqrt(2.0)


@pytest.fixture(scope="module")
def anisotropic():
    """A 2-d linear Poisson model whose posterior precision is far from isotropic, and its cells.

    A fitted model is stretched along its axes (z' = diag(3, 1/3) z, decoder compensated) so that the
    two latent directions are determined with very different precision; it is evaluated as a model in
    its own right (its prior is N(0, I) in the new coordinates).
    """
    adata = cv.data.simulate(n_cells=300, n_genes=40, n_latent=2, likelihood="poisson", library_size=400, seed=7)
    cv.CountVAE.setup_anndata(adata)
    model = cv.CountVAE(adata, n_latent=2, likelihood="poisson", decoder="linear", n_hidden=32, dtype=torch.float64)
    model.train(max_epochs=40, lr=3e-3, progress_bar=False)
    stretched = inv.reparameterize(model, np.diag([3.0, 1.0 / 3.0]), check=False)
    source, idx = query_source(adata, model.registry, model.var_names, indices=np.arange(60), validate=False)
    return stretched, source, idx


def _posterior_precision(model, source, idx):
    """Negative Hessian of the log joint at the posterior mode of each cell (Newton's method)."""
    mb = source.rows(idx)
    x = torch.as_tensor(mb.counts, dtype=torch.float64)
    dec = model.module.decoder
    W = dec.weight.detach().double()
    offset = torch.log(x.sum(-1, keepdim=True)) + dec.bias.detach().double()
    z = torch.zeros(len(idx), 2, dtype=torch.float64)
    eye = torch.eye(2, dtype=torch.float64)
    for _ in range(50):
        _, grad_eta, curv = log_likelihood_terms(x, offset + z @ W.T, None)
        hess = torch.einsum("ng,gi,gj->nij", curv, W, W) + eye
        z = z + torch.linalg.solve(hess, (grad_eta @ W - z).unsqueeze(-1)).squeeze(-1)
    _, _, curv = log_likelihood_terms(x, offset + z @ W.T, None)
    return (torch.einsum("ng,gi,gj->nij", curv, W, W) + eye).numpy()


def test_best_mean_field_elbo_loses_what_the_laplace_approximation_predicts(anisotropic):
    # For a Gaussian posterior N(m, H^-1) the best mean-field guide has variances 1/H_kk and ELBO
    # log p(x) - (sum_k log H_kk - log det H) / 2. A rotation keeps det H but changes the diagonal,
    # so the best mean-field ELBO drops by (sum_k log (Q H Q^T)_kk - sum_k log H_kk) / 2.
    model, source, idx = anisotropic
    Q = ROTATION_45
    rotated = inv.reparameterize(model, Q)
    H = _posterior_precision(model, source, idx)
    H_rot = np.einsum("ij,njk,lk->nil", Q, H, Q)
    predicted = 0.5 * (
        np.log(np.diagonal(H_rot, axis1=1, axis2=2)).sum(1) - np.log(np.diagonal(H, axis1=1, axis2=2)).sum(1)
    )
    assert predicted.mean() > 0.1  # the set-up is anisotropic enough to matter
    e0, se0 = refit_mean_field_elbo(model, source, idx, steps=300, seed=1)
    e1, se1 = refit_mean_field_elbo(rotated, source, idx, steps=300, seed=1)
    measured = e0 - e1
    assert measured.mean() == pytest.approx(predicted.mean(), rel=0.15, abs=0.02)
    # and a sign flip costs nothing: the best mean-field guide is just flipped
    flipped = inv.reparameterize(model, inv.reflection([1, -1]))
    e2, _ = refit_mean_field_elbo(flipped, source, idx, steps=300, seed=1)
    assert abs((e2 - e0).mean()) < 5 * np.sqrt((se0**2 + se1**2).sum()) / len(idx) + 0.01


def test_pushforward_guide_has_the_same_elbo_and_the_projection_does_not(anisotropic):
    model, source, idx = anisotropic
    Q = ROTATION_45
    rotated = inv.reparameterize(model, Q)
    out = elbo_comparison(model, rotated, Q, source, idx, n_draws=64, seed=0)
    assert out["elbo_pushforward_max_abs_diff"] < 1e-9
    # the projection throws away the correlation the rotation created: a lower ELBO, beyond MC error
    assert out["elbo_projected_mean_diff"] < 0 and out["elbo_projected_z"] < -5
    P = inv.permutation([1, 0])
    out = elbo_comparison(model, inv.reparameterize(model, P), P, source, idx, n_draws=64, seed=0)
    assert out["elbo_projected_mean_diff"] == pytest.approx(0.0, abs=1e-9)
