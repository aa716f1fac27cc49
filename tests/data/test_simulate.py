"""The simulator is the tests' ground truth: its counts must follow the model its docstring states."""

from __future__ import annotations

import numpy as np
import pytest

import countvae as cv
from countvae.data.simulate import draw_sources, source_labels
from countvae.errors import InvalidArgumentError


@pytest.mark.parametrize("kind", ["normal", "laplace", "uniform", "discrete"])
def test_sources_have_mean_0_variance_1_and_their_stated_shape(kind):
    """Known moments: mean 0 and variance 1 for every kind; excess kurtosis 0 (normal), 3 (Laplace), -1.2
    (uniform on +-sqrt(3)), -1.5 (three equally likely levels -sqrt(1.5), 0, sqrt(1.5))."""
    n = 200_000
    z = draw_sources(kind, n, 2, np.random.default_rng(0))
    assert z.shape == (n, 2)
    np.testing.assert_allclose(z.mean(0), 0.0, atol=5 / np.sqrt(n))
    np.testing.assert_allclose(z.var(0), 1.0, atol=0.02)
    excess = {"normal": 0.0, "laplace": 3.0, "uniform": -1.2, "discrete": -1.5}[kind]
    np.testing.assert_allclose((z**4).mean(0) / z.var(0) ** 2 - 3, excess, atol=0.1 + 0.1 * abs(excess))
    if kind == "uniform":
        assert np.abs(z).max() <= np.sqrt(3.0)
    if kind == "discrete":
        np.testing.assert_allclose(np.unique(z), [-np.sqrt(1.5), 0.0, np.sqrt(1.5)])


def _mean_from_truth(adata):
    """``l_n exp(b_g + W_g z_n + c_{s_n g})``, rebuilt from the stored truth (linear decoder)."""
    p = adata.uns["simulation"]
    batch = adata.obs["batch"].cat.codes.to_numpy()
    eta = p["b"] + adata.obsm["z_true"] @ p["W"].T + p["batch_offset"][batch]
    return adata.obs["size_factor"].to_numpy()[:, None] * np.exp(eta)


@pytest.mark.parametrize("likelihood", ["poisson", "nb"])
def test_counts_have_the_stored_means_and_dispersions(likelihood):
    """Each gene's total count is within 5 standard errors of the sum of its stored means (Poisson variance mu,
    NB mu + mu^2 / theta_g); for NB the median over genes of the moment estimate of 1 / theta_g agrees with
    the stored theta."""
    adata = cv.data.simulate(n_cells=3000, n_genes=40, n_latent=2, likelihood=likelihood, n_batches=3, seed=5)
    p = adata.uns["simulation"]
    np.testing.assert_allclose(np.exp(p["b"]).sum(), 1.0, rtol=1e-12)
    assert p["batch_offset"].shape == (3, 40) and set(adata.obs["batch"]) == {"batch0", "batch1", "batch2"}
    mu = _mean_from_truth(adata)
    x = adata.X.toarray().astype(np.float64)
    theta = p["theta"] if likelihood == "nb" else np.inf
    variance = mu + mu**2 / theta
    z = (x.sum(0) - mu.sum(0)) / np.sqrt(variance.sum(0))
    assert np.abs(z).max() < 5, z
    if likelihood == "nb":
        ratio = np.sum((x - mu) ** 2 - x, axis=0) / np.sum(mu**2, axis=0) * theta  # expectation 1 for each gene
        assert abs(np.median(ratio) - 1) < 0.1, ratio
        np.testing.assert_allclose(np.median(theta), 10.0, rtol=0.3)


def test_library_sizes_and_one_batch():
    """Size factors are log-normal around ``library_size`` with log sd ``library_log_sd``; the observed library
    totals the stored means; one batch has no offsets."""
    adata = cv.data.simulate(n_cells=4000, n_genes=50, n_latent=2, likelihood="poisson", library_size=500.0, seed=2)
    log_l = np.log(adata.obs["size_factor"].to_numpy())
    assert abs(np.median(log_l) - np.log(500.0)) < 0.03 and abs(log_l.std() - 0.3) < 0.02
    assert not np.any(adata.uns["simulation"]["batch_offset"])
    observed = np.asarray(adata.X.sum(1)).ravel()
    expected = _mean_from_truth(adata).sum(1)
    assert abs(np.log(observed.sum() / expected.sum())) < 0.01


def test_loading_scale_is_the_sd_of_each_genes_latent_effect():
    """With standard normal sources, W_g z has variance sum_k W_gk^2, whose average is ``loading_scale**2``."""
    adata = cv.data.simulate(
        n_cells=100, n_genes=4000, n_latent=4, loading_scale=1.5, likelihood="poisson", library_size=1e4, seed=3
    )
    W = adata.uns["simulation"]["W"]
    np.testing.assert_allclose(np.mean(np.sum(W**2, axis=1)), 1.5**2, rtol=0.03)


def test_zinb_dropout_zeroes_the_stated_share():
    """With a huge library every NB count is positive, so the share of zeros is the dropout probability."""
    adata = cv.data.simulate(
        n_cells=2000, n_genes=20, n_latent=2, likelihood="zinb", dropout=0.25, library_size=1e5, seed=1
    )
    zeros = 1 - adata.X.getnnz() / np.prod(adata.shape)
    assert abs(zeros - 0.25) < 5 * np.sqrt(0.25 * 0.75 / 40_000)
    assert adata.uns["simulation"]["dropout"] == 0.25


def test_source_labels_are_equally_populated_bins_or_levels():
    """Quantile bins of a continuous source hold n / n_bins cells each, ordered like the source; a discrete
    source keeps its levels 0, 1, 2 in order."""
    z = np.column_stack([np.arange(1000.0)[::-1], np.repeat([-1.0, 0.0, 1.0], [300, 300, 400])])
    labels = source_labels(z, 10)
    np.testing.assert_array_equal(np.bincount(labels[:, 0]), [100] * 10)
    np.testing.assert_array_equal(labels[:, 0], 9 - np.arange(1000) // 100)
    np.testing.assert_array_equal(labels[:, 1], np.repeat([0, 1, 2], [300, 300, 400]))


def test_observed_library_against_the_size_factor_as_the_docstring_says():
    # the MLP's shares sum to 1; the linear decoder's exp(b + W z) do not away from z = 0 (median 1.4 l_n)
    ratios = {}
    for decoder in ("mlp", "linear"):
        adata = cv.data.simulate(n_cells=2000, n_genes=200, decoder=decoder, seed=1)
        ratios[decoder] = np.median(np.asarray(adata.X.sum(1)).ravel() / adata.obs["size_factor"].to_numpy())
    assert abs(ratios["mlp"] - 1.0) < 0.05 and 1.3 < ratios["linear"] < 1.5


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"theta": -1.0}, "theta must be a positive number"),
        ({"theta": 0.0}, "theta must be a positive number"),
        ({"likelihood": "zinb", "dropout": 1.5}, r"dropout must be a number in \[0, 1\)"),
        ({"seed": -1}, "seed"),
        ({"library_size": 0.0}, "library_size"),
        ({"library_log_sd": -0.1}, "library_log_sd"),
        ({"batch_effect": float("nan")}, "batch_effect"),
        ({"loading_scale": 30.0}, r"A simulated gene mean reaches .* lower loading_scale \(30.0\)"),
    ],
)
def test_scales_outside_their_range_are_refused_by_name(setting, message):
    # numpy's samplers refused them with "shape < 0" or "lam value too large", or an empty cell was blamed
    with pytest.raises(InvalidArgumentError, match=message):
        cv.data.simulate(n_cells=50, n_genes=20, n_latent=2, **setting)
    # a scale the likelihood does not use is not checked: Poisson counts ignore theta and dropout, NB dropout
    cv.data.simulate(n_cells=50, n_genes=20, n_latent=2, likelihood="poisson", theta=0.0, dropout=1.0)
    cv.data.simulate(n_cells=50, n_genes=20, n_latent=2, likelihood="nb", dropout=1.0)


def test_a_count_above_what_float32_holds_exactly_is_refused_with_the_settings_to_lower():
    """Laplace sources with sparse, rescaled loadings drew a count of 1.7e9, stored rounded to a multiple of 128 in
    float32 and then refused by setup_anndata as data that were not raw counts; refused here, naming the settings."""
    kwargs = {"n_cells": 500, "n_genes": 120, "n_latent": 3, "sources": "laplace", "seed": 3, "loading_sparsity": 0.7}
    with pytest.raises(InvalidArgumentError, match=r"drew a count of \d+, above 2\*\*24 .* Lower library_size"):
        cv.data.simulate(**kwargs)
    adata = cv.data.simulate(**kwargs, loading_scale=0.5)  # the remedy works: every count exact, and accepted
    assert adata.X.max() <= 2**24
    cv.CountVAE.setup_anndata(adata)


def test_large_counts_drop_leaves_out_only_the_cells_that_drew_one():
    """The calibration benchmarks dropped such cells after simulating, which the refusal above made impossible
    (their documented commands crashed); ``large_counts="drop"`` does it with every other cell as drawn."""
    kwargs = {"n_cells": 500, "n_genes": 120, "n_latent": 3, "sources": "laplace", "seed": 3, "loading_sparsity": 0.7}
    with pytest.raises(InvalidArgumentError, match="large_counts"):
        cv.data.simulate(**kwargs, large_counts="keep")
    dropped = cv.data.simulate(**kwargs, large_counts="drop")
    n_dropped = dropped.uns["simulation"]["n_dropped_cells"]
    assert n_dropped >= 1 and dropped.n_obs == 500 - n_dropped and dropped.X.max() <= 2**24
    cv.CountVAE.setup_anndata(dropped)
    # the cells kept are the full draw's, with their own sources (the first draw of the seed's stream)
    kept = np.array([int(name.removeprefix("cell")) for name in dropped.obs_names])
    z_all = cv.data.draw_sources("laplace", 500, 3, np.random.default_rng(3))
    np.testing.assert_allclose(dropped.obsm["z_true"], z_all[kept])
    assert len(kept) == len(set(kept)) == 500 - n_dropped
    small = cv.data.simulate(n_cells=50, n_genes=20, n_latent=2, large_counts="drop")
    assert small.uns["simulation"]["n_dropped_cells"] == 0 and small.n_obs == 50


def test_cells_that_come_out_empty_are_redrawn_from_the_same_model() -> None:
    """Poisson, library size 0.8 over 20 genes: about a third of the cells first come out empty and are redrawn.

    A cell's library is then Poisson(lambda) conditioned on being positive, lambda the sum of its stored means: mean
    lambda / (1 - exp(-lambda)), variance (lambda + lambda^2) / (1 - exp(-lambda)) minus the mean squared. The mean
    library over 4,000 cells must lie within 4 standard errors (about 0.016 each) of the mean of these expectations;
    it is 0.5 se off on this draw, while redrawing from doubled means puts it 14 se above. Catches empty cells redrawn
    from another model; it cannot see a change to which cells are redrawn that keeps the conditional law.
    """
    adata = cv.data.simulate(n_cells=4000, n_genes=20, n_latent=2, likelihood="poisson", library_size=0.8, seed=0)
    lam = _mean_from_truth(adata).sum(1)
    nonempty = 1.0 - np.exp(-lam)
    mean = lam / nonempty
    se = np.sqrt(np.sum((lam + lam**2) / nonempty - mean**2)) / len(lam)
    observed = np.asarray(adata.X.sum(1)).ravel()
    assert np.mean(np.exp(-lam)) > 0.3  # many cells start empty, so the redraw shapes the libraries
    assert abs(observed.mean() - mean.mean()) < 4 * se, (observed.mean(), mean.mean(), se)
