"""SCVIFit against scvi-tools' own outputs, and fit_seeds with scvi-tools models."""

from __future__ import annotations

import warnings

import anndata as ad
import numpy as np
import pytest
import scipy.sparse as sp
import scvi  # noqa: E402  (the [scvi] extra is part of [dev])
import torch
from bench_modules import benchmark_module

import countvae as cv
from countvae.diagnostics import SCVIFit, fit_seeds
from countvae.errors import InvalidArgumentError, InvalidDataError, ModelFileError, NotTrainedError
from countvae.module.marginal import MarginalSettings

scvi_marginal_ll = benchmark_module("scvi_marginal_ll").scvi_marginal_ll  # scvi-tools' estimator, a test reference

MODEL = {"n_latent": 2, "n_hidden": 16}
TRAIN = {"max_epochs": 30, "accelerator": "cpu"}


@pytest.fixture(autouse=True)
def _quiet_one_thread():
    # One torch thread: on a shared 2-core machine two threads can be 15x slower (spin-waiting).
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.fixture(scope="module")
def adata():
    adata = cv.data.simulate(n_cells=300, n_genes=40, n_latent=2, n_batches=2, seed=5)
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    return adata


@pytest.fixture(scope="module")
def scvi_fits(adata, tmp_path_factory):
    torch.set_num_threads(1)
    return fit_seeds(
        adata,
        seeds=[0, 1],
        model_cls=scvi.model.SCVI,
        model_kwargs=MODEL,
        train_kwargs=TRAIN,
        out_dir=tmp_path_factory.mktemp("scvi"),
        torch_threads=1,
        progress_bar=False,
    )


@pytest.fixture(scope="module")
def linear_fits(adata):
    return fit_seeds(
        adata,
        seeds=[0, 1],
        model_cls=scvi.model.LinearSCVI,
        model_kwargs=MODEL,
        train_kwargs={**TRAIN, "max_epochs": 60},
        torch_threads=1,
        progress_bar=False,
    )


@pytest.fixture(params=["scvi", "linearscvi"])
def fits(request, scvi_fits, linear_fits):
    return scvi_fits if request.param == "scvi" else linear_fits


def _own(fit, adata):
    """The AnnData set up for the model, as scvi-tools' methods need it."""
    return fit._prepared(adata)


def test_attributes(fits):
    fit = fits[1]
    assert isinstance(fit, SCVIFit)
    assert fit.kind == ("linearscvi" if isinstance(fit.model, scvi.model.LinearSCVI) else "scvi")
    assert fit.symmetry == "orthogonal" and fit.n_latent == 2 and fit.seed == 1 and fit.name == "seed 1"
    assert list(fit.var_names) == list(fits.adata_heldout.var_names)
    assert fits.settings["model_class"] in ("scvi.model.SCVI", "scvi.model.LinearSCVI")
    assert "scvi-tools" in fits.settings["versions"]


def test_a_fit_equals_scvi_trained_directly_with_that_seed(scvi_fits):
    adata_fit = scvi_fits.adata_fit  # set up for scvi-tools by fit_seeds
    state = np.random.get_state()  # noqa: NPY002
    scvi.settings.seed = 1
    direct = scvi.model.SCVI(adata_fit, **MODEL)
    direct.train(**TRAIN, enable_progress_bar=False)
    np.random.set_state(state)  # noqa: NPY002
    held = scvi_fits.adata_heldout
    fit = scvi_fits[1]
    np.testing.assert_array_equal(fit.latent(held), direct.get_latent_representation(fit._prepared(held)))


def test_the_report_configuration_names_scvi_tools_its_decoder_and_batch(fits):
    """What picks the calibration regime: an SCVI report is matched with regimes measured on SCVI fits."""
    from countvae.diagnostics.reporting.verdict_calibration import configuration_of_fits

    decoder = "linear" if fits[0].kind == "linearscvi" else "mlp"
    assert configuration_of_fits(list(fits), 120) == {
        "model": "scvi-tools",
        "decoder": decoder,
        "n_latent": 2,
        "n_heldout_cells": 120,
        "n_genes": 40,
        "batch": True,
        # read from the module and the constructor (n_hidden given; n_layers and the rest scvi-tools' defaults)
        "likelihood": "zinb" if decoder == "mlp" else "nb",
        "prior": "normal",
        "dispersion": "gene",
        "n_hidden": 16,
        "n_layers": 1,
        "n_seeds": len(fits),
        "early_stopping": None,
        "fit_cells": True,
        "report_settings": "defaults",
        "data": "real",
    }


def test_latent_and_samples(fits):
    held = fits.adata_heldout
    fit = fits[0]
    before = list(held.obs.columns), list(held.uns)
    latent = fit.latent(held)
    np.testing.assert_array_equal(latent, fit.model.get_latent_representation(_own(fit, held)))
    assert latent.shape == (held.n_obs, 2)
    assert (list(held.obs.columns), list(held.uns)) == before, "the caller's AnnData must not be modified"
    mean, var = fit.model.get_latent_representation(_own(fit, held), return_dist=True)
    draws = fit.latent_samples(held, 4000, seed=3)
    assert draws.shape == (4000, held.n_obs, 2)
    np.testing.assert_array_equal(draws, fit.latent_samples(held, 4000, seed=3))
    # Known answer: the draws' mean and variance are those of q(z | x) (5 standard errors).
    assert np.all(np.abs(draws.mean(0) - mean) < 5 * np.sqrt(var / 4000))
    assert np.all(np.abs(draws.var(0) / var - 1) < 5 * np.sqrt(2 / 4000))


def test_reading_new_cells_logs_no_setup_transfer(fits):
    """The set-up copy is the adapter's own business: scvi-tools' "appears to be a copy" INFO line stays out of the
    analyst's output (the report asks each fit about several new AnnData objects)."""
    import logging

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Keep(level=logging.DEBUG)
    scvi_logger = logging.getLogger("scvi.model.base._base_model")
    scvi_logger.addHandler(handler)
    try:
        fit = fits[0]
        set_up = _own(fit, fits.adata_heldout)  # cells scvi-tools has registered: their copies "appear to be a copy"
        for cells in (set_up[:20].copy(), set_up[20:].copy()):
            fit.latent(cells)
            fit.latent_samples(cells, 2, seed=0)
    finally:
        scvi_logger.removeHandler(handler)
    assert not [m for m in records if "appears to be a copy" in m], records


def test_scvi_marginal_ll_is_scvis_own_estimate(fits):
    held = fits.adata_heldout
    for fit in fits:
        torch.manual_seed(7)
        expected = fit.model.get_marginal_ll(
            _own(fit, held), n_mc_samples=20, n_mc_samples_per_pass=5, return_mean=False
        )
        frame = scvi_marginal_ll(fit, held, n_samples=20, seed=7, samples_per_pass=5)
        assert frame.attrs["quantity"] == fit.lpd_quantity
        assert isinstance(expected, torch.Tensor)
        assert list(frame.columns) == ["lpd", "mc_se", "ess", "khat", "reliable"]
        assert list(frame.index) == list(held.obs_names)
        np.testing.assert_allclose(frame["lpd"].to_numpy(), expected.numpy(), rtol=1e-6)
        assert np.all(frame["lpd"] < 0) and np.all((frame["ess"] >= 1) & (frame["ess"] <= 20))


def test_mc_se_matches_the_spread_of_repeated_estimates(scvi_fits):
    """Known answer: the standard error is the standard deviation of the estimate over independent seeds."""
    held = scvi_fits.adata_heldout[:12].copy()
    fit = scvi_fits[0]
    runs = [fit.log_predictive_density(held, n_samples=200, seed=s) for s in range(16)]
    # a cell whose first pass has k-hat > 0.7 is estimated again with more draws (smaller SE): leave those out;
    # the first pass pools the pilot's draws with the 200 final ones
    first_pass_draws = 200 + MarginalSettings().n_pilot
    first_pass = np.all([r["ess"].to_numpy() < first_pass_draws for r in runs], axis=0)
    assert first_pass.sum() >= 6, first_pass.sum()
    spread = np.std([r["lpd"].to_numpy()[first_pass] for r in runs], axis=0, ddof=1)
    claimed = np.mean([r["mc_se"].to_numpy()[first_pass] for r in runs], axis=0)
    ratio = np.median(spread / claimed)
    assert 0.5 < ratio < 2.0, ratio


def test_normalized_expression_is_scvi_at_the_posterior_mean(fits, monkeypatch):
    held = fits.adata_heldout
    fit = fits[1]
    ours = fit.normalized_expression(held, library_size=1e4)
    assert ours.shape == (held.n_obs, held.n_vars)
    np.testing.assert_allclose(ours.sum(1), 1e4, rtol=1e-4)
    # scvi-tools decodes one posterior draw; with the draw replaced by the mean it must give the same numbers.
    monkeypatch.setattr(
        torch.distributions.Normal,
        "rsample",
        lambda self, sample_shape=(): self.loc.expand(torch.Size(sample_shape) + self.loc.shape),
    )
    theirs = fit.model.get_normalized_expression(_own(fit, held), library_size=1e4, return_numpy=True)
    np.testing.assert_allclose(ours, theirs, rtol=2e-5)


def test_decode_log_rate(fits):
    held = fits.adata_heldout
    fit = fits[0]
    z = np.random.default_rng(0).standard_normal((3, held.n_obs, 2))
    log_rate = fit.decode_log_rate(held, z)
    assert log_rate.shape == (3, held.n_obs, held.n_vars)
    # Known answer: px_scale is a softmax over genes, so the shares sum to one.
    np.testing.assert_allclose(np.exp(log_rate).sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(log_rate[1], fit.decode_log_rate(held, z[1]))
    with pytest.raises(InvalidArgumentError, match="shape"):
        fit.decode_log_rate(held, z[:, :5])


def test_jacobian_matches_finite_differences(fits):
    held = fits.adata_heldout
    fit = fits[1]
    jac = fit.decoder_jacobian(held)
    assert jac.shape == (held.n_obs, held.n_vars, 2)
    z0 = fit.latent(held).astype(np.float64)
    # Central differences in float64 (the module converted in place, then back), with a step far
    # smaller than the distance to most ReLU kinks.
    h = 1e-6
    module = fit.model.module
    module.double()
    try:
        if not module.use_observed_lib_size:
            # scvi-tools computes the (here unused) library prior with a float32 one-hot: keep it float32.
            module.library_log_means = module.library_log_means.float()
            module.library_log_vars = module.library_log_vars.float()
        columns = []
        for k in range(2):
            step = np.zeros_like(z0)
            step[:, k] = h
            columns.append((fit.decode_log_rate(held, z0 + step) - fit.decode_log_rate(held, z0 - step)) / (2 * h))
    finally:
        module.float()
    np.testing.assert_allclose(jac, np.stack(columns, axis=-1), atol=1e-5, rtol=1e-4)


def test_linear_loadings_and_their_jacobian(linear_fits, scvi_fits):
    held = linear_fits.adata_heldout
    fit = linear_fits[0]
    loadings = fit.loadings()
    np.testing.assert_array_equal(loadings, fit.model.get_loadings().to_numpy())
    assert loadings.shape == (held.n_vars, 2)
    # Known answer: log softmax(W z + c) has Jacobian W - sum_g p_g W_g (p: the decoded shares).
    shares = np.exp(fit.decode_log_rate(held, fit.latent(held)))
    expected = loadings[None] - np.einsum("cg,gk->ck", shares, loadings)[:, None, :]
    np.testing.assert_allclose(fit.decoder_jacobian(held), expected, atol=1e-4)
    assert scvi_fits[0].loadings() is None


def test_posterior_predictive_is_scvis_sample(fits):
    held = fits.adata_heldout
    fit = fits[0]
    state = torch.get_rng_state()
    draws = fit.posterior_predictive(held, n_samples=3, seed=4)
    assert torch.equal(torch.get_rng_state(), state)
    assert draws.shape == (held.n_obs, held.n_vars, 3)
    assert np.all(draws >= 0) and np.array_equal(draws, np.round(draws))
    torch.manual_seed(4)
    theirs = fit.model.posterior_predictive_sample(_own(fit, held), n_samples=3).todense()
    np.testing.assert_array_equal(draws, theirs)
    assert fit.posterior_predictive(held, n_samples=1, seed=4).shape == (held.n_obs, held.n_vars, 1)
    assert not np.array_equal(draws, fit.posterior_predictive(held, n_samples=3, seed=5))


def _global_states():
    import pickle
    import random

    return random.getstate(), pickle.dumps(np.random.get_state()), torch.get_rng_state().clone()  # noqa: NPY002


def test_reading_a_fit_leaves_the_global_random_states_alone(fits):
    # scvi-tools validates a view or a new AnnData by drawing cells from numpy's global generator, draws z from
    # torch's in inference even for the mean, and each DataLoader iteration draws a base seed from torch's: without
    # the adapter restoring them, every method below moves numpy's or torch's state (both, on a view).
    held = fits.adata_heldout
    fit = fits[0]
    z = np.zeros((held.n_obs // 2, fit.n_latent), dtype=np.float32)
    calls = {
        "latent": lambda a: fit.latent(a),
        "latent_samples": lambda a: fit.latent_samples(a, 2, seed=0),
        "log_predictive_density": lambda a: fit.log_predictive_density(a, 8, seed=0),
        "normalized_expression": lambda a: fit.normalized_expression(a),
        "decode_log_rate": lambda a: fit.decode_log_rate(a, z),
        "decoder_jacobian": lambda a: fit.decoder_jacobian(a),
        "posterior_predictive": lambda a: fit.posterior_predictive(a, 2, seed=0),
    }
    half = slice(0, held.n_obs // 2)
    for name, call in calls.items():
        for cells in (held[half], held[half].copy()):  # a view, and an object scvi-tools has not seen
            np.random.seed(7)  # noqa: NPY002
            torch.manual_seed(7)
            before = _global_states()
            call(cells)
            after = _global_states()
            assert before[0] == after[0] and before[1] == after[1], name
            assert torch.equal(before[2], after[2]), name


def test_resume_reuses_scvi_fits_exactly(adata, scvi_fits):
    np_state = np.random.get_state()  # noqa: NPY002
    again = fit_seeds(
        adata,
        seeds=[0, 1],
        model_cls=scvi.model.SCVI,
        model_kwargs=MODEL,
        train_kwargs=TRAIN,
        out_dir=scvi_fits.out_dir,
        torch_threads=1,
        progress_bar=False,
    )
    assert again.reused_seeds == [0, 1]
    for a, b in zip(scvi_fits, again, strict=True):
        np.testing.assert_array_equal(a.latent(scvi_fits.adata_heldout), b.latent(again.adata_heldout))
    # the whole state, position included: a few draws move the position long before the key array changes
    state = np.random.get_state()  # noqa: NPY002
    assert state[1].tolist() == np_state[1].tolist() and state[2:] == np_state[2:]


def test_tampered_scvi_fit_is_refused(adata, scvi_fits, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(scvi_fits.out_dir, copy)
    params = copy / "fits" / "seed_1" / "model" / "params.pt"
    params.write_bytes(params.read_bytes()[:-7])
    with pytest.raises(ModelFileError, match="params.pt"):
        fit_seeds(
            adata,
            seeds=[0, 1],
            model_cls=scvi.model.SCVI,
            model_kwargs=MODEL,
            train_kwargs=TRAIN,
            out_dir=copy,
            torch_threads=1,
            progress_bar=False,
        )


def test_bad_models_and_data(adata, scvi_fits):
    raw = adata.copy()
    scvi.model.SCVI.setup_anndata(raw, batch_key="batch")
    untrained = scvi.model.SCVI(raw, n_latent=2)
    with pytest.raises(NotTrainedError):
        SCVIFit(untrained, seed=0)
    ln = scvi.model.SCVI(raw, n_latent=2, latent_distribution="ln")
    ln.is_trained_ = True
    with pytest.raises(InvalidArgumentError, match="normal latent"):
        SCVIFit(ln, seed=0)
    # the check read attributes scvi-tools' VAE does not keep, and let through a model whose decoder needs a covariate
    for covariates in ({"categorical_covariate_keys": ["extra"]}, {"continuous_covariate_keys": ["extra_value"]}):
        with_covariate = adata.copy()
        with_covariate.obs["extra"] = np.where(np.arange(adata.n_obs) % 2, "x", "y")
        with_covariate.obs["extra_value"] = np.arange(adata.n_obs, dtype=float) / adata.n_obs
        scvi.model.SCVI.setup_anndata(with_covariate, batch_key="batch", **covariates)
        covariate_model = scvi.model.SCVI(with_covariate, n_latent=2)
        covariate_model.is_trained_ = True
        with pytest.raises(InvalidArgumentError, match="extra covariates"):
            SCVIFit(covariate_model, seed=0)
    with pytest.raises(InvalidDataError, match="genes"):
        scvi_fits[0].latent(scvi_fits.adata_heldout[:, :30].copy())
    # scvi-tools' message suggested extend_categories = True, which would score the cells with an untrained effect
    unseen = scvi_fits.adata_heldout.copy()
    unseen.obs["batch"] = "NEW"
    with pytest.raises(InvalidDataError, match=r"\['NEW'\] in adata.obs\['batch'\] were not seen in training") as error:
        scvi_fits[0].latent(unseen)
    assert "extend_categories" not in str(error.value)
    with pytest.raises(InvalidArgumentError, match="supports the scvi-tools classes"):
        fit_seeds(adata, seeds=[0, 1], model_cls=scvi.model.TOTALVI, progress_bar=False)
    on_raw = adata.copy()
    on_raw.raw = on_raw
    cv.CountVAE.setup_anndata(on_raw, use_raw=True, batch_key="batch")
    with pytest.raises(InvalidArgumentError, match="adata.raw"):
        fit_seeds(on_raw, seeds=[0, 1], model_cls=scvi.model.SCVI, train_kwargs={"max_epochs": 1}, progress_bar=False)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda x: np.where(np.arange(x.size).reshape(x.shape) == 3, np.nan, x), "NaN or infinite"),
        (lambda x: np.where(np.arange(x.size).reshape(x.shape) == 3, -3.0, x), "negative values"),
        (lambda x: np.log1p(x), "non-integer values"),
        (lambda x: np.where(np.arange(x.shape[0])[:, None] == 0, 0.0, x), "zero total counts"),
    ],
)
def test_cells_that_are_not_raw_counts_are_refused_as_for_countvae_fits(scvi_fits, adata, change, message):
    """NaN or negative counts failed inside torch; log-normalised counts and an empty cell gave a full report."""
    cells = adata[scvi_fits.adata_heldout.obs_names[:20]].copy()
    cells.X = sp.csr_matrix(change(cells.X.toarray()))
    with pytest.raises(InvalidDataError, match=f"{message}.*where the scvi-tools model reads them|{message}"):
        scvi_fits[0].latent(cells)


def test_fitting_leaves_scvi_tools_seed_settings_as_they_were(adata, monkeypatch):
    """scvi.settings.seed and Lightning's PL_GLOBAL_SEED were left at the last fit's seed (documented: global random
    states restored)."""
    import os

    scvi.settings.seed = 7
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    fit_seeds(
        adata,
        seeds=[0, 1],
        model_cls=scvi.model.SCVI,
        model_kwargs=MODEL,
        train_kwargs={**TRAIN, "max_epochs": 1},
        torch_threads=1,
        progress_bar=False,
    )
    assert scvi.settings.seed == 7 and os.environ["PL_GLOBAL_SEED"] == "7"
    assert (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) == cudnn


def test_the_memory_warning_does_not_advise_a_backed_file_for_scvi_tools_models(adata, tmp_path, monkeypatch, caplog):
    """scvi-tools models fit from an in-memory copy even of data opened backed: only countvae's fits stream from the
    file. Known answer: with the workers' base scaled down so that the copy of the counts dominates, and no memory
    available, an SCVI run on a backed file fits one seed at a time and says to pass a smaller n_jobs, not to open the
    data backed (which it already is). The fits themselves are not run."""
    import logging

    from countvae.diagnostics.fitting import fit_seeds as fit_seeds_module
    from countvae.diagnostics.fitting import parallelism

    class Planned(Exception):
        pass

    def stop(*args, **kwargs):
        raise Planned

    adata.write_h5ad(tmp_path / "cells.h5ad")
    backed = ad.read_h5ad(tmp_path / "cells.h5ad", backed="r")
    cv.CountVAE.setup_anndata(backed, batch_key="batch")
    monkeypatch.setattr(parallelism, "WORKER_BASE_BYTES", 16)
    monkeypatch.setattr(parallelism, "available_memory_bytes", lambda: 1)
    monkeypatch.setattr(fit_seeds_module, "run_tasks", stop)
    with caplog.at_level(logging.WARNING, logger=parallelism.__name__), pytest.raises(Planned):
        fit_seeds(backed, seeds=[0, 1], model_cls=scvi.model.SCVI, model_kwargs=MODEL, n_jobs=2, progress_bar=False)
    (message,) = [r.getMessage() for r in caplog.records if r.name == parallelism.__name__]
    assert message.startswith("Fitting 1 seed at a time instead of 2")
    assert "backed" not in message and "Pass a smaller n_jobs" in message
