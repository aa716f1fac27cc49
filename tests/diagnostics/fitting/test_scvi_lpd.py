"""Held-out log p(x) of scvi-tools models: the log joint's plumbing, exact quadrature, and which quantity it is."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
import scvi  # noqa: E402  (the [scvi] extra is part of [dev])
import torch
from bench_modules import benchmark_module
from scipy import integrate
from torch.distributions import Normal

import countvae as cv
from countvae.diagnostics import SCVIFit
from countvae.diagnostics.analyses.lpd_comparability import lpd_quantity, require_same_quantity
from countvae.diagnostics.analyses.predictive import equivalence_table, per_fit_table
from countvae.diagnostics.fitting.fitted_model import CountVAEFit
from countvae.diagnostics.fitting.lpd_quantity import GIVEN_OBSERVED_LIBRARY, LIBRARY_INTEGRATED, with_quantity
from countvae.diagnostics.fitting.scvi_log_joint import SCVICells, float64_copy
from countvae.errors import InvalidArgumentError, UnreliableEstimateWarning
from countvae.module.importance import KHAT_THRESHOLD
from countvae.module.marginal import MarginalSettings

scvi_quadrature = benchmark_module("scvi_quadrature")  # the exact reference lives beside the benchmark that uses it
LinearSCVIJoint = scvi_quadrature.LinearSCVIJoint
adaptive_log_marginal = scvi_quadrature.adaptive_log_marginal
linear_scvi_log_marginal = scvi_quadrature.linear_scvi_log_marginal
scvi_marginal_ll = benchmark_module("scvi_marginal_ll").scvi_marginal_ll

N_TRAIN = 250


@pytest.fixture(autouse=True)
def _quiet_one_thread():
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.fixture(scope="module")
def data():
    return cv.data.simulate(n_cells=300, n_genes=40, n_latent=2, n_batches=2, seed=5)


def _train(data, cls, epochs, **kwargs):
    torch.set_num_threads(1)
    train = data[:N_TRAIN].copy()
    cls.setup_anndata(train, batch_key="batch")
    scvi.settings.seed = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = cls(train, n_hidden=16, **kwargs)
        model.train(max_epochs=epochs, accelerator="cpu", enable_progress_bar=False)
    return SCVIFit(model, seed=0)


@pytest.fixture(scope="module")
def poisson_fit(data):
    """LinearSCVI, Poisson, observed library size, 2 latent dimensions."""
    return _train(data, scvi.model.LinearSCVI, 30, n_latent=2, gene_likelihood="poisson", use_observed_lib_size=True)


@pytest.fixture(scope="module")
def nb_fit(data):
    """LinearSCVI, NB, observed library size, 2 latent dimensions."""
    return _train(data, scvi.model.LinearSCVI, 30, n_latent=2, gene_likelihood="nb", use_observed_lib_size=True)


@pytest.fixture(scope="module")
def latent_library_fit(data):
    """LinearSCVI at its defaults (NB, latent library size), 1 latent dimension: 2-d integral with the library."""
    return _train(data, scvi.model.LinearSCVI, 30, n_latent=1)


@pytest.fixture(scope="module")
def zinb_fit(data):
    """SCVI, ZINB with batch-dependent dispersion (covers the covariate and dispersion plumbing)."""
    return _train(data, scvi.model.SCVI, 5, n_latent=2, gene_likelihood="zinb", dispersion="gene-batch")


def _cells(fit, data, n=64, offset=N_TRAIN):
    prepared = fit._prepared(data[offset : offset + n].copy())
    tensors = next(iter(fit.model._make_data_loader(adata=prepared, batch_size=n, shuffle=False)))
    return SCVICells.from_tensors(float64_copy(fit.model.module), tensors), tensors


# ----- (a) the log joint against scvi-tools' own terms ------------------------------------------------
@pytest.mark.parametrize("name", ["poisson_fit", "latent_library_fit", "zinb_fit"])
def test_log_joint_is_scvis_reconstruction_and_prior_at_scvis_draws(name, data, request):
    """At the (z, l) scvi's forward pass draws, the log joint is scvi's -reconstruction_loss + log p(z) (+ log p(l)).

    scvi's forward pass runs on the same float64 copy, so the two agree to rounding. With
    a latent library the coordinate is standardised, so the joint density in ``u``
    carries the Jacobian ``log s_b``; the guide-IS log weights are then exactly those of
    scvi's ``marginal_ll`` (the Jacobian cancels).
    """
    fit = request.getfixturevalue(name)
    cells, tensors = _cells(fit, data)
    module = cells.module
    torch.manual_seed(3)
    with torch.no_grad():
        inference, _, losses = module.forward(
            {**tensors, "X": tensors["X"].double()},
            inference_kwargs={"n_samples": 5},
            get_inference_input_kwargs={"full_forward_pass": True},
        )
    z, library = inference["z"], inference["library"]
    log_lik = -losses.dict_sum(losses.reconstruction_loss)
    log_pz = Normal(0.0, 1.0).log_prob(z).sum(-1)
    scvi_log_w = log_lik + log_pz - inference["qz"].log_prob(z).sum(-1)
    if cells.library_loc is None:
        assert cells.quantity == GIVEN_OBSERVED_LIBRARY and cells.n_latent == module.n_latent
        u, expected = z, log_lik + log_pz
    else:
        assert cells.quantity == LIBRARY_INTEGRATED and cells.n_latent == module.n_latent + 1
        u = torch.cat([z, (library - cells.library_loc) / cells.library_scale], dim=-1)
        log_pl = Normal(cells.library_loc, cells.library_scale).log_prob(library).sum(-1)
        expected = log_lik + log_pz + log_pl + torch.log(cells.library_scale).squeeze(-1)
        scvi_log_w = scvi_log_w + log_pl - inference["ql"].log_prob(library).sum(-1)
    assert z.dtype == torch.float64 and expected.dtype == torch.float64
    with torch.no_grad():
        value = cells(u)
        loc, scale = cells.guide()
    np.testing.assert_allclose(value.numpy(), expected.numpy(), rtol=1e-11)
    log_w = value - Normal(loc, scale).log_prob(u).sum(-1)
    np.testing.assert_allclose(log_w.numpy(), scvi_log_w.numpy(), rtol=1e-11)
    np.testing.assert_array_equal(loc[:, : module.n_latent].numpy(), inference["qz"].loc.numpy())
    # subsets of cells, as the estimator asks for them
    rows = torch.tensor([5, 0, 17])
    np.testing.assert_allclose(cells.log_joint(u[:, rows], rows).numpy(), value[:, rows].numpy(), rtol=1e-12)
    # the float64 copy is the trained float32 model: scvi's own float32 pass agrees up to float32 rounding
    # (typically 1e-7 of the value; measured up to 2e-4 on a ZINB cell, which is why the copy is float64)
    original = fit.model.module
    z32, library32 = cells.split(u)
    with torch.no_grad():
        px = original.generative(z=z32.float(), library=library32.float(), batch_index=cells.batch, y=cells.labels)[
            "px"
        ]
        float32_log_lik = px.log_prob(tensors["X"]).sum(-1).double()
    relative = np.abs(cells.log_likelihood(u).numpy() / float32_log_lik.numpy() - 1)
    assert np.median(relative) < 2e-6 and relative.max() < 1e-3, (np.median(relative), relative.max())


@pytest.mark.parametrize("name", ["poisson_fit", "latent_library_fit"])
def test_quadrature_integrand_written_from_weights_equals_the_generative_log_joint(name, data, request):
    """Two independent routes to log p(x, u): LinearSCVI's folded weights vs scvi's own generative pass."""
    fit = request.getfixturevalue(name)
    cells, tensors = _cells(fit, data)
    joint = LinearSCVIJoint(fit.model.module, tensors["X"], tensors["batch"])
    u = torch.randn(
        4, cells.x.shape[0], cells.n_latent, generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )
    with torch.no_grad():
        a, b = joint(u), cells(u)
    # loadings: the same folding as scvi's get_loadings
    np.testing.assert_allclose(joint.loadings.numpy(), fit.loadings(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=2e-6 * float(b.abs().max()) + 1e-4)


# ----- the quadrature against closed forms -----------------------------------------------------------
def test_adaptive_quadrature_is_exact_for_a_linear_gaussian_model():
    """x = A u + e, e ~ N(0, s^2 I), u ~ N(0, I) in 2-d: p(x) = N(x; 0, A A^T + s^2 I)."""
    gen = torch.Generator().manual_seed(1)
    A = torch.randn(6, 2, generator=gen, dtype=torch.float64) * 3
    x = torch.randn(10, 6, generator=gen, dtype=torch.float64) * 4
    s = 0.5
    zero, one = torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)

    def log_joint(u):
        resid = x - u @ A.T
        return Normal(zero, s * one).log_prob(resid).sum(-1) + Normal(zero, one).log_prob(u).sum(-1)

    cov = A @ A.T + s**2 * torch.eye(6, dtype=torch.float64)
    exact = torch.distributions.MultivariateNormal(torch.zeros(6, dtype=torch.float64), cov).log_prob(x)
    got = adaptive_log_marginal(log_joint, torch.zeros(10, 2, dtype=torch.float64), n_nodes=8)
    np.testing.assert_allclose(got.numpy(), exact.numpy(), rtol=0, atol=1e-9)


def test_adaptive_quadrature_matches_scipy_on_a_skewed_poisson_integral():
    """A 1-d Poisson log-linear posterior with few counts (skewed) against scipy's adaptive quadrature."""
    a = torch.tensor([1.5, -0.7, 2.0], dtype=torch.float64)
    b = torch.tensor([0.2, 1.0, -1.0], dtype=torch.float64)
    x = torch.tensor([[0.0, 3.0, 1.0], [5.0, 0.0, 9.0]], dtype=torch.float64)

    def log_joint(u):
        eta = u * a + b
        return (
            (x * eta - torch.exp(eta) - torch.lgamma(x + 1)).sum(-1)
            - 0.5 * (u**2).sum(-1)
            - 0.5 * math.log(2 * math.pi)
        )

    got = adaptive_log_marginal(log_joint, torch.zeros(2, 1, dtype=torch.float64), n_nodes=40)
    for i in range(2):

        def density(t, i=i):
            u = torch.tensor([[t]], dtype=torch.float64).expand(2, 1)
            return math.exp(float(log_joint(u)[i]))

        value, _ = integrate.quad(density, -12, 12, epsabs=0, epsrel=1e-12, limit=400)
        assert abs(float(got[i]) - math.log(value)) < 1e-7


@pytest.mark.parametrize("name", ["poisson_fit", "latent_library_fit"])
def test_linear_scvi_quadrature_has_converged(name, data, request):
    """20 and 40 nodes per dimension agree, so the reference is exact to far below the 0.05-nat target."""
    fit = request.getfixturevalue(name)
    cells, tensors = _cells(fit, data, n=32)
    start, _ = cells.guide()
    q20 = linear_scvi_log_marginal(fit.model.module, tensors["X"], tensors["batch"], start, n_nodes=20)
    q40 = linear_scvi_log_marginal(fit.model.module, tensors["X"], tensors["batch"], start, n_nodes=40)
    assert float((q20 - q40).abs().max()) < 1e-6


def test_quadrature_refuses_what_it_does_not_cover(zinb_fit, data):
    cells, tensors = _cells(zinb_fit, data, n=8)
    with pytest.raises(InvalidArgumentError, match="poisson"):
        LinearSCVIJoint(zinb_fit.model.module, tensors["X"], tensors["batch"])
    with pytest.raises(InvalidArgumentError, match="3 dimensions"):
        adaptive_log_marginal(lambda u: -(u**2).sum(-1), torch.zeros(2, 4, dtype=torch.float64))
    with pytest.raises(InvalidArgumentError, match="shape"):
        cells(torch.zeros(3, 2, dtype=torch.float64))


# ----- (b, c) the adapter's estimate against exact quadrature, and against scvi-tools' own ---------------
def _exact(fit, held):
    """Quadrature (40 nodes per dimension, converged: see above) on the held-out cells, in order."""
    cells, tensors = _cells(fit, held, n=held.n_obs, offset=0)
    start, _ = cells.guide()
    return linear_scvi_log_marginal(fit.model.module, tensors["X"], tensors["batch"], start, n_nodes=40).numpy()


@pytest.fixture(scope="module")
def estimates(data, poisson_fit, nb_fit, latent_library_fit):
    """(fit, estimate frame, exact log p(x)) on the 50 held-out cells, for each linear model."""
    held = data[N_TRAIN:].copy()
    torch.set_num_threads(1)
    out = {}
    for name, fit in (("poisson", poisson_fit), ("nb", nb_fit), ("latent library", latent_library_fit)):
        out[name] = (fit, fit.log_predictive_density(held, n_samples=800, seed=0), _exact(fit, held), held)
    return out


@pytest.mark.parametrize("name", ["poisson", "nb", "latent library"])
def test_estimate_matches_exact_quadrature(name, estimates):
    """Known answer: within 0.05 nats/cell of quadrature and within 3 reported standard errors."""
    fit, frame, exact, held = estimates[name]
    assert list(frame.columns) == ["lpd", "mc_se", "ess", "khat", "reliable"]
    assert list(frame.index) == list(held.obs_names) and frame.attrs["quantity"] == fit.lpd_quantity
    err = frame["lpd"].to_numpy() - exact
    assert frame["reliable"].all()
    assert np.abs(err).mean() < 0.05, np.abs(err).mean()
    assert np.mean(np.abs(err) <= 3 * frame["mc_se"].to_numpy()) >= 0.95


@pytest.mark.parametrize("name", ["poisson", "latent library"])
def test_estimate_is_right_where_scvis_get_marginal_ll_is_far_off(name, estimates):
    """On these briefly trained models scvi-tools' guide-only estimate is hundreds of nats low; ours is not."""
    fit, frame, exact, held = estimates[name]
    torch.manual_seed(0)
    theirs = fit.model.get_marginal_ll(fit._prepared(held), n_mc_samples=1000, return_mean=False).numpy()
    assert np.mean(exact - theirs) > 10.0  # the guide-only estimate is a (far too) low bound here
    assert np.abs(frame["lpd"].to_numpy() - exact).mean() < 0.05
    # scvi_marginal_ll reproduces scvi's estimator and says it is unreliable (k-hat)
    own = scvi_marginal_ll(fit, held, n_samples=300, seed=0)
    assert np.mean(exact - own["lpd"].to_numpy()) > 10.0 and (~own["reliable"]).mean() > 0.5


def test_estimate_is_deterministic_and_covers_scvi(zinb_fit, data):
    held = data[N_TRAIN : N_TRAIN + 10].copy()
    a = zinb_fit.log_predictive_density(held, n_samples=50, seed=3)
    b = zinb_fit.log_predictive_density(held, n_samples=50, seed=3)
    pd.testing.assert_frame_equal(a, b)
    assert a.attrs["quantity"] == GIVEN_OBSERVED_LIBRARY and np.isfinite(a["lpd"]).all()
    with pytest.raises(InvalidArgumentError, match="n_samples"):
        zinb_fit.log_predictive_density(held, n_samples=1, seed=0)


def test_unreliable_cells_are_flagged_and_warned_about(latent_library_fit, data):
    """A deliberately poor setting (no Newton steps, no second pass, the off-target guide) is caught by k-hat."""
    held = data[N_TRAIN : N_TRAIN + 20].copy()
    bad = MarginalSettings(n_pilot=0, pilot_restarts=0, prior_restarts=0, newton_steps=0, redraw=0, escalation_draws=0)
    fit = SCVIFit(latent_library_fit.model, seed=0, lpd_settings=bad)
    with pytest.warns(UnreliableEstimateWarning, match="unreliable") as record:
        frame = fit.log_predictive_density(held, n_samples=100, seed=0)
    assert record[0].filename == __file__
    flagged = ~frame["reliable"].to_numpy()
    assert flagged.any() and np.isnan(frame["mc_se"].to_numpy()[flagged]).all()
    assert (frame["khat"].to_numpy()[flagged] > KHAT_THRESHOLD).all()


# ----- (d) the quantity, and the refusal to compare different ones ------------------------------------
def _frame(values, quantity=None):
    frame = pd.DataFrame({"lpd": values, "mc_se": 0.01}, index=[f"c{i}" for i in range(len(values))])
    return frame if quantity is None else with_quantity(frame, quantity)


def test_each_fit_states_its_quantity(poisson_fit, latent_library_fit, zinb_fit, data, trained_linear):
    held = data[N_TRAIN : N_TRAIN + 6].copy()
    assert poisson_fit.lpd_quantity == zinb_fit.lpd_quantity == GIVEN_OBSERVED_LIBRARY
    assert latent_library_fit.lpd_quantity == LIBRARY_INTEGRATED
    for fit in (poisson_fit, latent_library_fit):
        assert lpd_quantity(scvi_marginal_ll(fit, held, n_samples=4, seed=0)) == fit.lpd_quantity
    few = trained_linear.adata[:5].copy()
    countvae_frame = CountVAEFit(trained_linear, seed=0).log_predictive_density(few, n_samples=4, seed=0)
    assert lpd_quantity(countvae_frame) == GIVEN_OBSERVED_LIBRARY


def test_fits_of_different_quantities_are_not_compared():
    given = _frame([-10.0, -11.0, -12.0], GIVEN_OBSERVED_LIBRARY)
    integrated = _frame([-15.0, -16.0, -17.0], LIBRARY_INTEGRATED)
    with pytest.raises(InvalidArgumentError, match="different quantities"):
        per_fit_table({"countvae": given, "linearscvi": integrated})
    with pytest.raises(InvalidArgumentError, match="different quantities"):
        equivalence_table({"countvae": given, "linearscvi": integrated}, margin=0.5)
    assert require_same_quantity({"a": given, "b": _frame([-1.0, -2.0, -3.0], GIVEN_OBSERVED_LIBRARY)}) == (
        GIVEN_OBSERVED_LIBRARY
    )
    # a frame that does not name its quantity is compared on the caller's word
    assert require_same_quantity({"a": given, "b": _frame([-1.0, -2.0, -3.0])}) == GIVEN_OBSERVED_LIBRARY
    assert len(equivalence_table({"a": given, "b": _frame([-1.0, -2.0, -3.0])}, margin=0.5)) == 1
