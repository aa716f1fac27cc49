"""ICA on a fitted CountVAE, and the simulator's source labels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import countvae as cv
from countvae.errors import InvalidArgumentError
from countvae.ica import ICARotation
from countvae.invariance import (
    log_marginal_linear,
    quadrature_log_marginal,
    random_orthogonal,
    reparameterize,
    reparameterize_ica,
)
from countvae.metrics import mcc


@pytest.fixture(scope="module")
def laplace_model():
    """Counts from 3 Laplace sources through a log-softmax-linear decoder; an MLP CountVAE fitted to them."""
    torch.set_num_threads(1)  # module fixtures run before conftest's per-test thread setting
    adata = cv.data.simulate(
        n_cells=800, n_genes=80, n_latent=3, sources="laplace", decoder="mlp", leaky_slope=1.0, seed=11
    )
    cv.CountVAE.setup_anndata(adata)
    model = cv.CountVAE(adata, n_latent=3, likelihood="nb", decoder="mlp", n_hidden=32)
    model.train(max_epochs=40, lr=3e-3, progress_bar=False, seed=0)
    return model


def test_ica_axes_recover_laplace_sources_better_than_raw_axes(laplace_model):
    truth = laplace_model.adata.obsm["z_true"]
    raw = laplace_model.get_latent_representation()
    ica = ICARotation().fit(raw).transform(raw)
    assert mcc(ica, truth) > 0.9
    assert mcc(ica, truth) > mcc(raw, truth) + 0.05


def test_ica_composes_with_the_model_like_a_scikit_learn_transformer(laplace_model):
    model = laplace_model
    latents = model.get_latent_representation()
    ica = ICARotation().fit(latents)
    first = ica.transform(latents)
    # refitting with the same random_state gives the same axes
    np.testing.assert_array_equal(ICARotation().fit(latents).transform(latents), first)
    # a subset of cells gets the same coordinates as in the full set
    subset = ica.transform(model.get_latent_representation(indices=np.array([5, 2, 9])))
    np.testing.assert_allclose(subset, first[[5, 2, 9]], atol=1e-6)
    np.testing.assert_allclose(ica.mean_, latents.mean(0), atol=1e-6)
    # picard and fastica agree on these axes
    picard = ICARotation(algorithm="picard", random_state=1).fit(latents).transform(latents)
    np.testing.assert_allclose(np.abs(picard), np.abs(first), atol=0.02)


def test_the_model_class_knows_nothing_of_ica(small_adata):
    model = cv.CountVAE(small_adata, n_latent=2, decoder="linear", n_hidden=16)
    model.train(max_epochs=1, progress_bar=False)
    assert not hasattr(model, "ica")
    with pytest.raises(TypeError, match="rotation"):
        model.get_latent_representation(rotation="ica")


def test_simulated_source_labels_and_kinds():
    adata = cv.data.simulate(
        n_cells=1000,
        n_genes=30,
        n_latent=3,
        sources=["laplace", "discrete", "uniform"],
        n_source_bins=5,
        seed=12,
    )
    labels = adata.obsm["z_true_labels"]
    assert labels.shape == (1000, 3) and labels.dtype.kind == "i"
    np.testing.assert_array_equal(np.bincount(labels[:, 0]), [200] * 5)  # quantile bins
    np.testing.assert_array_equal(np.unique(labels[:, 1]), [0, 1, 2])  # the three discrete levels
    np.testing.assert_array_equal(
        labels[:, 1], np.searchsorted(np.unique(adata.obsm["z_true"][:, 1]), adata.obsm["z_true"][:, 1])
    )
    assert list(adata.uns["simulation"]["source_kinds"]) == ["laplace", "discrete", "uniform"]
    # the default keeps earlier outputs unchanged: same counts and sources for the same seed
    again = cv.data.simulate(n_cells=1000, n_genes=30, n_latent=3, sources=["laplace", "discrete", "uniform"], seed=12)
    np.testing.assert_array_equal(again.X.toarray(), adata.X.toarray())
    with pytest.raises(InvalidArgumentError, match="n_source_bins"):
        cv.data.simulate(n_cells=10, n_genes=5, n_latent=1, n_source_bins=1)


@pytest.fixture(scope="module")
def linear_poisson_model():
    """A 2-d linear-decoder Poisson model on counts from two Laplace sources (quadrature applies)."""
    torch.set_num_threads(1)
    adata = cv.data.simulate(
        n_cells=600, n_genes=40, n_latent=2, sources="laplace", likelihood="poisson", decoder="linear", seed=13
    )
    cv.CountVAE.setup_anndata(adata)
    model = cv.CountVAE(adata, n_latent=2, likelihood="poisson", decoder="linear", n_hidden=16)
    model.train(max_epochs=30, lr=3e-3, progress_bar=False, seed=0)
    return model


def test_reparameterize_ica_preserves_decoded_means_and_gives_ica_latents(laplace_model):
    model = laplace_model
    ica = ICARotation()
    new = reparameterize_ica(model, ica)  # an unfitted ICA is fitted to the training cells' latents
    z = model.get_latent_representation()
    np.testing.assert_allclose(ica.mean_, z.mean(0), atol=1e-6)
    np.testing.assert_allclose(
        new.get_latent_representation(), ica.transform(z) + ica.components_ @ ica.mean_, atol=1e-4
    )
    np.testing.assert_allclose(
        new.get_normalized_expression(return_numpy=True),
        model.get_normalized_expression(return_numpy=True),
        rtol=1e-4,
        atol=1e-6,
    )
    # the original is untouched
    np.testing.assert_array_equal(model.get_latent_representation(), z)
    # without an ICA, a default one is fitted the same way
    np.testing.assert_allclose(
        reparameterize_ica(model).get_latent_representation(), new.get_latent_representation(), atol=1e-12
    )


def test_reparameterize_ica_loadings_and_log_marginal(linear_poisson_model):
    model = linear_poisson_model
    cells = np.arange(40)
    whitened_ica = ICARotation(n_null=0).fit(model.get_latent_representation())
    new = reparameterize_ica(model, whitened_ica)
    W = model.get_loadings().to_numpy().astype(np.float64)
    # loadings per ICA component: W A^{-1} = W @ mixing_
    np.testing.assert_allclose(new.get_loadings().to_numpy(), W @ whitened_ica.mixing_, rtol=1e-4, atol=1e-6)

    before = quadrature_log_marginal(model, indices=cells)
    after = quadrature_log_marginal(new, indices=cells)
    # whitening is not orthogonal: log p(x) changes ...
    assert np.max(np.abs(after - before)) > 0.01
    # ... to the original decoder's log p(x) under the prior N(0, (A^T A)^{-1}) = N(0, Sigma)
    A = whitened_ica.components_
    chol = np.linalg.cholesky(np.linalg.inv(A.T @ A))
    x = torch.as_tensor(model.adata.X[cells].toarray(), dtype=torch.float64)
    offset = torch.log(x.sum(-1, keepdim=True)) + model.module.decoder.bias.detach().double()
    expected = log_marginal_linear(x, offset, torch.as_tensor(W @ chol)).numpy()
    np.testing.assert_allclose(after, expected, atol=1e-6)
    # an orthogonal ICA (no whitening) leaves log p(x) exactly as it was
    rotated = reparameterize_ica(model, ICARotation(whiten=False, n_null=0))
    np.testing.assert_allclose(quadrature_log_marginal(rotated, indices=cells), before, atol=1e-6)


def test_reparameterize_ica_needs_all_components(linear_poisson_model):
    with pytest.raises(InvalidArgumentError, match="n_components"):
        reparameterize_ica(linear_poisson_model, ICARotation(n_components=1, n_null=0))
    with pytest.raises(InvalidArgumentError, match="CountVAE"):
        reparameterize_ica(object())
    with pytest.raises(InvalidArgumentError, match="ICARotation"):
        reparameterize_ica(linear_poisson_model, "ica")


def test_ica_of_a_rotated_model_finds_the_same_axes(laplace_model):
    model = laplace_model
    rotated = reparameterize(model, random_orthogonal(3, seed=4))
    z_rotated = rotated.get_latent_representation()
    out = ICARotation().fit(z_rotated).transform(z_rotated)
    z = model.get_latent_representation()
    # ICA is equivariant: the rotated model's ICA axes are the original's (up to sign)
    np.testing.assert_allclose(np.abs(out), np.abs(ICARotation().fit(z).transform(z)), atol=0.02)
