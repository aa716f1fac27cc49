"""reparameterize(): an equivalent fitted model in rotated latent coordinates, for every model configuration."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import countvae as cv
from countvae import invariance as inv
from countvae.errors import InvalidArgumentError, NotTrainedError

N_CELLS = 48


@functools.cache
def tiny_model(likelihood: str, decoder: str, n_batches: int, dtype: str, n_latent: int) -> cv.CountVAE:
    """A small model trained for two epochs (cached: tests must not modify it)."""
    adata = cv.data.simulate(
        n_cells=N_CELLS, n_genes=12, n_latent=n_latent, n_batches=n_batches, likelihood="nb", library_size=300, seed=2
    )
    cv.CountVAE.setup_anndata(adata, batch_key="batch" if n_batches > 1 else None)
    model = cv.CountVAE(
        adata,
        n_latent=n_latent,
        likelihood=likelihood,
        decoder=decoder,
        n_hidden=8,
        dtype=getattr(torch, dtype),
        dispersion="gene-batch" if n_batches > 1 else "gene",
    )
    model.train(max_epochs=2, batch_size=16, progress_bar=False, seed=0)
    return model


configs = st.tuples(
    st.sampled_from(["poisson", "nb", "zinb"]),
    st.sampled_from(["linear", "mlp"]),
    st.sampled_from([1, 3]),
    st.sampled_from(["float32", "float64"]),
    st.integers(min_value=1, max_value=3),
)


def _state(model):
    return {k: v.clone() for k, v in model.module.state_dict().items()}


@settings(max_examples=40, deadline=None)
@given(config=configs, seed=st.integers(0, 10_000), kind=st.sampled_from(["haar", "rotation", "signed permutation"]))
def test_reparameterized_model_is_equivalent(config, seed, kind):
    model = tiny_model(*config)
    L = model.n_latent
    Q = {
        "haar": inv.random_orthogonal,
        "rotation": inv.random_rotation,
        "signed permutation": inv.random_signed_permutation,
    }[kind](L, seed)
    before = _state(model)
    rotated = inv.reparameterize(model, Q)
    float64 = config[3] == "float64"
    atol = 1e-12 if float64 else 2e-6
    # the original is untouched, and the copy shares nothing mutable with it
    after = _state(model)
    assert all(torch.equal(before[k], after[k]) for k in before) and model.module.latent_map is None
    assert rotated.module is not model.module and rotated.adata is model.adata
    assert rotated.module.latent_map.dtype == model.dtype
    np.testing.assert_allclose(rotated.module.latent_map.double().numpy(), Q, atol=1e-15 if float64 else 1e-7)
    # Z' = Z Q^T, for posterior means and for posterior draws from the same noise
    Z = model.get_latent_representation()
    np.testing.assert_allclose(rotated.get_latent_representation(), Z @ Q.T, atol=atol, rtol=0)
    Zs = model.get_latent_representation(give_mean=False, seed=seed)
    np.testing.assert_allclose(rotated.get_latent_representation(give_mean=False, seed=seed), Zs @ Q.T, atol=5 * atol)
    # decoded expression unchanged
    e0 = model.get_normalized_expression(return_numpy=True)
    e1 = rotated.get_normalized_expression(return_numpy=True)
    np.testing.assert_allclose(e1, e0, rtol=1e-10 if float64 else 2e-5)
    # per-cell log p(x) with common random numbers (the guide estimator's noise is shared): equal to rounding
    idx = np.arange(10)
    a = model.get_log_predictive_density(indices=idx, n_samples=16, seed=seed, method="guide").lpd.to_numpy()
    b = rotated.get_log_predictive_density(indices=idx, n_samples=16, seed=seed, method="guide").lpd.to_numpy()
    np.testing.assert_allclose(b, a, atol=1e-9 if float64 else 1e-4, rtol=0 if float64 else 2e-5)
    # only the weight on z changed, by W -> W Q^T; batch covariate weights, offsets and dispersions did not
    changed = {k for k in before if not torch.equal(before[k], rotated.module.state_dict()[k])}
    weight_name = "decoder.weight" if config[1] == "linear" else "decoder.hidden.linears.0.data.weight"
    assert changed <= {weight_name}
    W0 = before[weight_name].double().numpy()
    np.testing.assert_allclose(rotated.module.state_dict()[weight_name].double().numpy(), W0 @ Q.T, atol=atol)


@settings(max_examples=15, deadline=None)
@given(config=configs, seed=st.integers(0, 10_000))
def test_composition_and_inverse(config, seed):
    model = tiny_model(*config)
    L = model.n_latent
    Q1, Q2 = inv.random_orthogonal(L, seed), inv.random_orthogonal(L, seed + 1)
    twice = inv.reparameterize(inv.reparameterize(model, Q1), Q2)
    once = inv.reparameterize(model, Q2 @ Q1)
    tol = 1e-12 if config[3] == "float64" else 2e-6
    np.testing.assert_allclose(twice.get_latent_representation(), once.get_latent_representation(), atol=tol, rtol=0)
    back = inv.reparameterize(inv.reparameterize(model, Q1), Q1.T)
    np.testing.assert_allclose(back.get_latent_representation(), model.get_latent_representation(), atol=tol)


def test_non_orthogonal_map_with_check_false():
    model = tiny_model("nb", "linear", 3, "float64", 2)
    A = inv.shear(2, 1.0) @ inv.default_scaling(2, 2.0)
    new = inv.reparameterize(model, A, check=False)
    Z = model.get_latent_representation()
    np.testing.assert_allclose(new.get_latent_representation(), Z @ A.T, atol=1e-12)
    # decoded means are unchanged for any invertible map (the decoder is compensated by A^-1) ...
    np.testing.assert_allclose(
        new.get_normalized_expression(return_numpy=True), model.get_normalized_expression(return_numpy=True), rtol=1e-10
    )
    np.testing.assert_allclose(new.get_loadings().to_numpy(), model.get_loadings().to_numpy() @ np.linalg.inv(A))
    # ... but the prior no longer matches, so log p(x) changes far beyond rounding
    idx = np.arange(20)
    a = model.get_log_predictive_density(indices=idx, n_samples=50).lpd.to_numpy()
    b = new.get_log_predictive_density(indices=idx, n_samples=50).lpd.to_numpy()
    assert np.abs(a - b).max() > 0.1


def test_mlp_batch_columns_are_untouched():
    model = tiny_model("zinb", "mlp", 3, "float32", 2)
    layer = model.module.decoder.hidden.linears[0]
    assert layer.covariate is not None  # the batch one-hot has its own weight
    new = inv.reparameterize(model, inv.random_rotation(2, 1))
    new_layer = new.module.decoder.hidden.linears[0]
    assert torch.equal(new_layer.covariate.weight, layer.covariate.weight)
    assert torch.equal(new_layer.data.bias, layer.data.bias)


def test_prior_is_not_touched():
    model = tiny_model("nb", "linear", 1, "float64", 2)
    diag = inv.with_prior(model, "diagonal", scales=[0.5, 2.0])
    rotated = inv.reparameterize(diag, inv.random_rotation(2, 0))
    assert rotated.module.prior.kind == "diagonal"
    torch.testing.assert_close(rotated.module.prior.log_scale, diag.module.prior.log_scale, rtol=0, atol=0)


def test_quadrature_agrees_to_1e10_after_rotation():
    model = tiny_model("poisson", "linear", 3, "float64", 2)
    for seed in range(3):
        rotated = inv.reparameterize(model, inv.random_orthogonal(2, seed))
        a = inv.quadrature_log_marginal(model)
        b = inv.quadrature_log_marginal(rotated)
        np.testing.assert_allclose(b, a, atol=1e-10, rtol=0)
    sheared = inv.reparameterize(model, inv.shear(2, 1.0), check=False)
    assert np.abs(inv.quadrature_log_marginal(sheared) - a).max() > 1e-3


def test_diagonal_prior_equals_rescaled_normal_prior_under_quadrature():
    # z ~ N(0, diag(s^2)) with weight W is the model u ~ N(0, I) with weight W diag(s), i.e. the
    # normal-prior model reparameterized by diag(1/s): quadrature must give the same log p(x)
    model = tiny_model("nb", "linear", 1, "float64", 2)
    s = np.array([0.5, 1.7])
    diag = inv.with_prior(model, "diagonal", scales=s)
    rescaled = inv.reparameterize(model, np.diag(1.0 / s), check=False)
    np.testing.assert_allclose(inv.quadrature_log_marginal(diag), inv.quadrature_log_marginal(rescaled), atol=1e-10)


def test_save_load_round_trip(tmp_path):
    model = tiny_model("zinb", "mlp", 3, "float32", 3)
    rotated = inv.reparameterize(model, inv.random_orthogonal(3, 4))
    rotated.save(tmp_path / "rotated")
    loaded = cv.CountVAE.load(tmp_path / "rotated", adata=model.adata)
    torch.testing.assert_close(loaded.module.latent_map, rotated.module.latent_map, rtol=0, atol=0)
    np.testing.assert_array_equal(loaded.get_latent_representation(), rotated.get_latent_representation())
    idx = np.arange(8)
    np.testing.assert_array_equal(
        loaded.get_log_predictive_density(indices=idx, n_samples=20).to_numpy(),
        rotated.get_log_predictive_density(indices=idx, n_samples=20).to_numpy(),
    )
    # the guide of the loaded model is the full-covariance push-forward, not the mean-field one
    x = torch.tensor(model.adata.X[:4].toarray(), dtype=torch.float32)
    b = torch.zeros(4, dtype=torch.long)
    assert isinstance(loaded.module.posterior_distribution(x, b), torch.distributions.MultivariateNormal)
    # an unrotated model still loads without a latent map
    model.save(tmp_path / "plain")
    assert cv.CountVAE.load(tmp_path / "plain").module.latent_map is None


def test_continued_training_of_a_reparameterized_model():
    model = tiny_model("nb", "linear", 1, "float32", 2)
    rotated = inv.reparameterize(model, inv.random_rotation(2, 0))
    rotated.train(max_epochs=1, batch_size=16, progress_bar=False)
    assert rotated.history["epoch"].tolist() == [1, 2, 3]
    assert torch.isfinite(rotated.module.decoder.weight).all()
    assert model.history["epoch"].tolist() == [1, 2]  # the original's history is its own


def test_bad_input():
    model = tiny_model("nb", "linear", 1, "float64", 2)
    with pytest.raises(InvalidArgumentError, match=r"not orthogonal: max \|Q\^T Q - I\|"):
        inv.reparameterize(model, np.array([[1.0, 0.5], [0.0, 1.0]]))
    with pytest.raises(InvalidArgumentError, match="n_latent=2"):
        inv.reparameterize(model, np.eye(3))
    with pytest.raises(InvalidArgumentError, match="square"):
        inv.reparameterize(model, np.eye(2)[:1])
    with pytest.raises(InvalidArgumentError, match="singular"):
        inv.reparameterize(model, np.array([[1.0, 1.0], [1.0, 1.0]]), check=False)
    with pytest.raises(InvalidArgumentError, match="CountVAE"):
        inv.reparameterize("model", np.eye(2))
    untrained = cv.CountVAE(model.adata, n_latent=2)
    with pytest.raises(NotTrainedError, match="train"):
        inv.reparameterize(untrained, np.eye(2))
    with pytest.raises(InvalidArgumentError, match="atol"):  # was: a shear accepted and replaced by a rotation
        inv.reparameterize(model, np.array([[1.0, 0.5], [0.0, 1.0]]), atol=float("nan"))
    with pytest.raises(InvalidArgumentError, match="check"):
        inv.reparameterize(model, np.eye(2), check="no")
    # a tensor works as well as an array
    inv.reparameterize(model, torch.tensor(inv.random_rotation(2, 0)))


def test_nearly_orthogonal_map_is_replaced_by_its_polar_factor():
    """Known answer: a rotation perturbed by 1e-8 passes the 1e-6 check and is applied as its polar factor, an exactly
    orthogonal matrix, so A^-1 = A^T holds to rounding and decoded means equal the original's to float64 rounding
    (applying the perturbed map itself with A^T as its inverse would change them by about 1e-8)."""
    model = tiny_model("nb", "linear", 1, "float64", 2)
    Q = inv.random_orthogonal(2, 3) + 1e-8 * np.array([[1.0, -2.0], [0.5, 1.5]])
    assert inv.transforms.orthogonality_error(Q) > 1e-9
    new = inv.reparameterize(model, Q)
    A = new.module.latent_map.detach().numpy()
    np.testing.assert_allclose(A, inv.transforms.nearest_orthogonal(Q), atol=1e-15, rtol=0)
    assert inv.transforms.orthogonality_error(A) < 1e-14
    np.testing.assert_allclose(
        new.get_normalized_expression(return_numpy=True), model.get_normalized_expression(return_numpy=True), rtol=1e-12
    )


def test_loadings_guide_is_carried_to_the_new_coordinates():
    """Known answer: for the 3-cycle z' = P z (P^-1 = P^T), the loadings W' = W P^T are W's columns permuted, and so are
    the guide's scales of W: scale' = scale @ P^T exactly (the squared entries of a permutation are itself)."""
    adata = cv.data.simulate(n_cells=40, n_genes=12, n_latent=3, seed=4)
    cv.CountVAE.setup_anndata(adata)
    model = cv.CountVAE(adata, n_latent=3, decoder="linear", loadings_prior="horseshoe", dtype=torch.float64)
    model.train(max_epochs=2, batch_size=20, progress_bar=False, seed=0)
    P = np.eye(3)[[1, 2, 0]]
    new = inv.reparameterize(model, P)
    scale = model.module.loadings_prior.weight_log_scale.detach().numpy()
    assert np.abs(scale[:, 0] - scale[:, 1]).max() > 1e-6  # trained scales differ by column
    np.testing.assert_allclose(new.module.loadings_prior.weight_log_scale.detach().numpy(), scale @ P.T, atol=1e-12)
    np.testing.assert_allclose(new.get_loadings().to_numpy(), model.get_loadings().to_numpy() @ P.T, atol=1e-12)
