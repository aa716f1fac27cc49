"""Differential expression: definitions against closed forms, Monte Carlo errors against repeated runs,
calls against planted truth, and the scvi-tools-style interface."""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
from bench_modules import benchmark_module
from scipy.stats import norm

import countvae as cv
from countvae.data import CountSource
from countvae.errors import InvalidArgumentError, MonteCarloWarning, NotTrainedError
from countvae.invariance import copy_model, reparameterize
from countvae.model import differential
from countvae.model.de_statistics import (
    change_statistics,
    estimate_pseudocount,
    fdr_calls,
    jaccard,
    raw_count_properties,
)

# small n_samples_overall keeps the tests fast; the warning it triggers is tested on its own
pytestmark = pytest.mark.filterwarnings("ignore::countvae.errors.MonteCarloWarning")

SCVI_COLUMNS = [
    "proba_de",
    "proba_not_de",
    "bayes_factor",
    "scale1",
    "scale2",
    "pseudocounts",
    "delta",
    "lfc_mean",
    "lfc_median",
    "lfc_std",
    "lfc_min",
    "lfc_max",
    "raw_mean1",
    "raw_mean2",
    "non_zeros_proportion1",
    "non_zeros_proportion2",
    "raw_normalized_mean1",
    "raw_normalized_mean2",
    "is_de_fdr_0.05",
]

true_log_rate_jacobian = benchmark_module("bilipschitz").true_log_rate_jacobian  # the simulation's true log mean


# ----- the statistics, from draws with a known law -----------------------------------------------
def _normal_lfc_draws(rng, mu, sd, n):
    """Paired draws whose log2 ratio is N(mu_g, sd^2) per gene, far above any pseudocount."""
    lfc = mu + sd * rng.standard_normal((n, len(mu)))
    base = -8.0
    return (2.0 ** (base + lfc / 2)).astype(np.float32), (2.0 ** (base - lfc / 2)).astype(np.float32)


def _brute_force_calls(proba, target):
    order = sorted(range(len(proba)), key=lambda g: (-proba[g], g))
    best = 0
    for k in range(1, len(proba) + 1):
        if np.mean([1 - proba[g] for g in order[:k]]) <= target:
            best = k
    calls = np.zeros(len(proba), dtype=bool)
    calls[order[:best]] = True
    return calls


def test_fdr_calls_known_answer_and_brute_force():
    proba = np.array([0.99, 0.98, 0.5, 0.97, 0.2])
    # top 3 have mean (1 - p) = 0.02; adding 0.5 gives 0.1375
    np.testing.assert_array_equal(fdr_calls(proba, 0.05), [True, True, False, True, False])
    assert not fdr_calls(np.full(4, 0.9), 0.05).any()
    rng = np.random.default_rng(0)
    for _ in range(20):
        p = rng.beta(0.3, 0.1, 40).round(2)  # ties included
        for target in (0.01, 0.05, 0.2):
            np.testing.assert_array_equal(fdr_calls(p, target), _brute_force_calls(p, target))
    rows = rng.uniform(size=(3, 30)) ** 0.1
    np.testing.assert_array_equal(fdr_calls(rows, 0.05), np.stack([fdr_calls(r, 0.05) for r in rows]))
    with pytest.raises(InvalidArgumentError, match="fdr_target"):
        fdr_calls(proba, 1.5)


def test_jaccard_edge_cases():
    assert jaccard(np.zeros(3, bool), np.zeros(3, bool)) == 1.0
    assert jaccard([True, True, False], [True, False, True]) == pytest.approx(1 / 3)


def test_change_statistics_match_the_closed_form():
    mu = np.linspace(-1.5, 1.5, 31)
    sd, delta, n = 0.6, 0.25, 20_000
    s1, s2 = _normal_lfc_draws(np.random.default_rng(0), mu, sd, n)
    out = change_statistics(s1, s2, delta=delta, pseudocount=1e-12, fdr_target=0.05, n_bootstrap=4)
    up, down = norm.sf((delta - mu) / sd), norm.cdf((-delta - mu) / sd)
    z = (out["proba_de"] - np.maximum(up, down)) / out["proba_de_mc_se"]
    assert np.abs(z).max() < 4.5
    np.testing.assert_allclose(out["lfc_mean"], mu, atol=5 * sd / np.sqrt(n))
    np.testing.assert_allclose(out["lfc_std"], sd, rtol=0.03)
    two = change_statistics(s1, s2, delta=delta, pseudocount=1e-12, fdr_target=0.05, test_mode="two", n_bootstrap=4)
    assert np.abs((two["proba_de"] - (up + down)) / two["proba_de_mc_se"]).max() < 4.5
    p = out["proba_de"]
    np.testing.assert_allclose(out["bayes_factor"], np.log(p + 1e-8) - np.log(1 - p + 1e-8))
    np.testing.assert_array_equal(out["is_de"], fdr_calls(p, 0.05))


def test_monte_carlo_errors_match_the_spread_over_seeds():
    """Each reported standard error equals the standard deviation of the estimate over independent runs."""
    mu = np.linspace(-1.5, 1.5, 60)
    runs = []
    for r in range(25):
        s1, s2 = _normal_lfc_draws(np.random.default_rng(r), mu, 0.6, 2000)
        runs.append(change_statistics(s1, s2, delta=0.25, pseudocount=1e-12, fdr_target=0.05, n_bootstrap=40, seed=r))
    for key in ("proba_de", "bayes_factor", "lfc_mean", "lfc_median", "lfc_std", "scale1", "scale2"):
        spread = np.std([run[key] for run in runs], axis=0, ddof=1)
        reported = np.mean([run[f"{key}_mc_se"] for run in runs], axis=0)
        ratio = np.median(spread / reported)
        assert 0.85 < ratio < 1.15, (key, ratio)
    # the bootstrap prediction of the call-set agreement between two seeds
    observed = np.mean([jaccard(a["is_de"], b["is_de"]) for a, b in itertools.combinations(runs, 2)])
    predicted = np.mean([run["mc_call_jaccard"] for run in runs])
    # about 20 genes are called and several sit near the threshold, so there is something to predict
    assert 0.85 < observed < 0.99
    assert abs(predicted - observed) < 0.02


def test_definitions_match_scvi_tools_on_the_same_draws():
    """Given the same expression draws, every change-mode quantity equals scvi-tools' own functions."""
    from scvi.model.base._de_core import _fdr_de_prediction
    from scvi.model.base._differential import describe_continuous_distrib, estimate_pseudocounts_offset

    rng = np.random.default_rng(11)
    n, genes = 3000, 50
    log_scale = rng.normal(-6, 2, genes)
    s1 = np.exp(log_scale + 0.5 * rng.standard_normal((n, genes)) + rng.normal(0, 1, genes)).astype(np.float32)
    s2 = np.exp(log_scale + 0.5 * rng.standard_normal((n, genes))).astype(np.float32)
    raw1, raw2 = rng.uniform(0, 0.05, genes), rng.uniform(0, 0.05, genes)
    ours_pc = estimate_pseudocount(s1, s2, raw1, raw2)
    scvi_pc = estimate_pseudocounts_offset(s1, s2, raw1 < 0.01, raw2 < 0.01, quantile=0.9)
    assert ours_pc == pytest.approx(float(scvi_pc), rel=1e-6)
    out = change_statistics(s1, s2, delta=0.25, pseudocount=ours_pc, fdr_target=0.05, n_bootstrap=4)
    test_lfc = np.log2(s1.astype(np.float64) + ours_pc) - np.log2(s2.astype(np.float64) + ours_pc)
    scvi_proba = np.maximum(np.mean(test_lfc >= 0.25, 0), np.mean(test_lfc < -0.25, 0))
    np.testing.assert_allclose(out["proba_de"], scvi_proba, atol=2.0 / n)  # float32 logs may flip a tie
    summary_lfc = np.log2(s1.astype(np.float64) + 1e-3 * ours_pc) - np.log2(s2.astype(np.float64) + 1e-3 * ours_pc)
    for key, value in describe_continuous_distrib(summary_lfc).items():
        np.testing.assert_allclose(out[f"lfc_{key}"], value, rtol=1e-5, atol=1e-5)
    proba = pd.Series(out["proba_de"], index=[f"g{i}" for i in range(genes)])
    np.testing.assert_array_equal(out["is_de"], _fdr_de_prediction(proba, fdr=0.05).to_numpy())
    np.testing.assert_allclose(out["scale1"], s1.mean(0, dtype=np.float64), rtol=1e-12)


def test_pseudocount_estimate_known_answer():
    scales1 = np.array([[0.1, 0.01, 0.3], [0.2, 0.02, 0.1]])
    scales2 = np.array([[0.1, 0.05, 0.3], [0.2, 0.04, 0.1]])
    raw1 = np.array([1.0, 0.0, 1.0])  # gene 1 is silent in group 1: max draw 0.02
    raw2 = np.array([1.0, 1.0, 0.001])  # gene 2 is silent in group 2: max draw 0.3
    assert estimate_pseudocount(scales1, scales2, raw1, raw2) == pytest.approx(0.3 / 3)
    assert estimate_pseudocount(scales1, scales2, np.ones(3), np.ones(3)) == pytest.approx(1e-10)


def test_raw_count_properties_known_answer():
    counts1 = np.array([[0, 2, 8], [1, 0, 9]])
    counts2 = np.array([[4, 4, 2]])
    lib1, lib2 = np.array([10.0, 10.0]), np.array([10.0])
    out = raw_count_properties(counts1, counts2, lib1, lib2)
    assert list(out) == [
        "raw_mean1",
        "raw_mean2",
        "non_zeros_proportion1",
        "non_zeros_proportion2",
        "raw_normalized_mean1",
        "raw_normalized_mean2",
    ]
    np.testing.assert_allclose(out["raw_mean1"], [0.5, 1.0, 8.5])
    np.testing.assert_allclose(out["non_zeros_proportion1"], [0.5, 0.5, 1.0])
    np.testing.assert_allclose(out["raw_normalized_mean2"], [4000.0, 4000.0, 2000.0])
    sparse = raw_count_properties(sp.csr_matrix(counts1), sp.csr_matrix(counts2), lib1, lib2)
    for key, value in out.items():
        np.testing.assert_allclose(sparse[key], value)


def test_library_sizes_of_float16_counts_do_not_overflow():
    counts = np.random.default_rng(0).poisson(2000.0, (40, 50)).astype(np.float16)  # cell totals ~100,000
    source = CountSource(counts, np.zeros(40, dtype=np.int64))
    _, library = differential._library_sizes(source, np.arange(40))
    np.testing.assert_array_equal(library, counts.astype(np.float64).sum(1))


# ----- a fitted model on counts with planted differences -------------------------------------------
def _fit(adata, decoder="mlp", epochs=40, n_latent=4):
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    model = cv.CountVAE(adata, n_latent=n_latent, decoder=decoder, n_hidden=32)
    model.train(max_epochs=epochs, progress_bar=False, seed=0, batch_size=128)
    return model


@pytest.fixture(scope="module")
def planted():
    adata = cv.data.simulate(
        n_cells=600,
        n_genes=60,
        n_latent=2,
        decoder="mlp",
        loading_scale=0.5,
        n_groups=2,
        n_de_genes=8,
        de_lfc=(1.5, 3.0),
        seed=4,
    )
    return _fit(adata)


@pytest.fixture(scope="module")
def null_model():
    adata = cv.data.simulate(n_cells=600, n_genes=60, n_latent=2, decoder="mlp", loading_scale=0.5, n_groups=2, seed=5)
    return _fit(adata)


def test_calls_recover_planted_genes(planted):
    frame = planted.differential_expression(groupby="group", group1="group1", group2="group0", n_samples_overall=2000)
    truth = cv.data.planted_lfc(planted.adata, "group1", "group0").loc[frame.index]
    is_planted = truth.abs() > 0
    called = frame["is_de_fdr_0.05"]
    sensitivity = (called & is_planted).sum() / is_planted.sum()
    false_discoveries = (called & ~is_planted).sum() / max(called.sum(), 1)
    assert sensitivity >= 0.75
    assert false_discoveries <= 0.15
    # the estimated fold changes point the planted way
    assert (np.sign(frame.loc[called & is_planted, "lfc_mean"]) == np.sign(truth[called & is_planted])).all()
    assert np.corrcoef(frame["lfc_mean"][is_planted], truth[is_planted])[0, 1] > 0.9


def test_no_planted_difference_gives_no_calls(null_model):
    frame = null_model.differential_expression(groupby="group", group1="group1", n_samples_overall=2000)
    assert frame["is_de_fdr_0.05"].sum() == 0
    assert frame["proba_de"].max() < 0.9


def test_frame_has_scvi_columns_sorted_and_reproducible(planted):
    kwargs = dict(groupby="group", group1="group1", n_samples_overall=500, seed=3)
    frame = planted.differential_expression(**kwargs)
    assert list(frame.columns[: len(SCVI_COLUMNS)]) == SCVI_COLUMNS
    for column in ("comparison", "group1", "group2", "proba_de_mc_se", "lfc_mean_mc_se", "mc_call_jaccard"):
        assert column in frame.columns
    assert (frame["comparison"] == "group1 vs Rest").all() and (frame["group2"] == "Rest").all()
    assert frame["proba_de"].is_monotonic_decreasing
    assert sorted(frame.index) == sorted(planted.var_names)
    pd.testing.assert_frame_equal(frame, planted.differential_expression(**kwargs))
    other = planted.differential_expression(**{**kwargs, "seed": 4})
    assert not np.allclose(other.loc[frame.index, "proba_de"], frame["proba_de"])


def test_one_vs_all_and_masks_agree_with_groupby(planted):
    adata = planted.adata
    frame = planted.differential_expression(groupby="group", n_samples_overall=300, n_bootstrap=4)
    assert list(frame["comparison"].unique()) == ["group0 vs Rest", "group1 vs Rest"]
    assert len(frame) == 2 * adata.n_vars
    by_group = planted.differential_expression(groupby="group", group1="group1", group2="group0", n_samples_overall=300)
    mask1 = (adata.obs["group"] == "group1").to_numpy()
    by_mask = planted.differential_expression(idx1=mask1, idx2=np.flatnonzero(~mask1), n_samples_overall=300)
    pd.testing.assert_frame_equal(by_mask, by_group.drop(columns=["comparison", "group1", "group2"]))
    by_series = planted.differential_expression(  # a boolean Series indexed by obs_names in cell order
        idx1=adata.obs["group"] == "group1", idx2=np.flatnonzero(~mask1), n_samples_overall=300
    )
    pd.testing.assert_frame_equal(by_series, by_mask)
    # group2 without group1: each other group against group2, as scvi-tools (it said "group1 and group2 are both")
    against = planted.differential_expression(groupby="group", group2="group0", n_samples_overall=300)
    pd.testing.assert_frame_equal(against, by_group)


def test_orthogonal_reparameterization_leaves_the_result_unchanged(planted):
    """Decoded expression is rotation-invariant: the same draws give the same statistics."""
    model = copy_model(planted, dtype=torch.float64)
    q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((model.n_latent, model.n_latent)))
    rotated = reparameterize(model, q)
    kwargs = dict(groupby="group", group1="group1", n_samples_overall=400, n_bootstrap=4)
    a = model.differential_expression(**kwargs)
    b = rotated.differential_expression(**kwargs).loc[a.index]
    np.testing.assert_allclose(b["lfc_mean"], a["lfc_mean"], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(b["proba_de"], a["proba_de"], atol=1.0 / 400)


def test_batch_handling_known_answer():
    """With W = 0 the decoded expression is bias + batch offset, so every pair's LFC is known exactly."""
    adata = cv.data.simulate(n_cells=300, n_genes=20, n_latent=2, n_batches=2, n_groups=2, seed=6)
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    model = cv.CountVAE(adata, n_latent=2, decoder="linear")
    model.train(max_epochs=1, progress_bar=False)
    offset = np.linspace(-2.0, 2.0, adata.n_vars) * np.log(2)  # batch1 - batch0, natural log
    with torch.no_grad():
        model.module.decoder.weight.zero_()
        model.module.decoder.batch_offset.copy_(torch.as_tensor(offset[None, :], dtype=torch.float32))
    kwargs = dict(n_samples_overall=500, n_bootstrap=4, pseudocounts=1e-9)
    # batch 1 against batch 0 in the cells' own batches: the offset itself, in every pair
    own = model.differential_expression(groupby="batch", group1="batch1", group2="batch0", **kwargs)
    own = own.loc[adata.var_names]
    np.testing.assert_allclose(own["lfc_mean"], offset / np.log(2), atol=1e-4)
    assert own["lfc_std"].max() < 1e-4
    np.testing.assert_array_equal(own["proba_de"], (np.abs(offset / np.log(2)) >= 0.25).astype(float))
    # decoded in one batch per pair, the two batches' cells are identical
    same = model.differential_expression(
        groupby="batch", group1="batch1", group2="batch0", batch_correction=True, **kwargs
    )
    assert np.abs(same["lfc_mean"]).max() < 1e-4 and (same["proba_de"] == 0).all()
    # groups unrelated to batch: own batches mix the offsets into pair-level noise, one batch removes it
    mixed = model.differential_expression(groupby="group", group1="group1", **kwargs).loc[adata.var_names]
    share = (adata.obs["batch"] == "batch1").mean()  # LFC is +-offset or 0: sd = |offset| sqrt(2 p (1 - p))
    np.testing.assert_allclose(
        mixed["lfc_std"], np.abs(offset / np.log(2)) * np.sqrt(2 * share * (1 - share)), rtol=0.15
    )
    corrected = model.differential_expression(groupby="group", group1="group1", batch_correction=True, **kwargs)
    assert corrected["lfc_std"].max() < 1e-4 and (corrected["proba_de"] == 0).all()


def test_bad_input_is_named(planted):
    de = planted.differential_expression
    with pytest.raises(InvalidArgumentError, match="no cells"):
        de(groupby="group", group1="group7")
    with pytest.raises(InvalidArgumentError, match="not a column"):
        de(groupby="cluster", group1="group1")
    with pytest.raises(InvalidArgumentError, match="both"):
        de(groupby="group", group1="group1", group2="group1")
    with pytest.raises(InvalidArgumentError, match="disjoint"):
        de(idx1=[0, 1, 2], idx2=[2, 3])
    with pytest.raises(InvalidArgumentError, match="not both"):
        de(groupby="group", idx1=[0, 1])
    with pytest.raises(InvalidArgumentError, match="more than once"):  # was dropped silently
        de(idx1=[0, 1, 1, 2], n_samples_overall=10)
    # a repeated group was compared twice under one label, with other numbers; an empty list raised an IndexError
    with pytest.raises(InvalidArgumentError, match=r"group1 names \['group1'\] more than once"):
        de(groupby="group", group1=["group1", "group1"], n_samples_overall=10)
    with pytest.raises(InvalidArgumentError, match="group1 is an empty list"):
        de(groupby="group", group1=[], n_samples_overall=10)
    in_group = planted.adata.obs["group"] == "group1"
    with pytest.raises(InvalidArgumentError, match="reindex"):  # a mask in another cell order, read by position
        de(idx1=in_group.iloc[::-1], n_samples_overall=10)
    with pytest.raises(InvalidArgumentError, match="n_samples_overall"):
        de(groupby="group", group1="group1", n_samples_overall=1)
    with pytest.raises(InvalidArgumentError, match="test_mode"):
        de(groupby="group", group1="group1", n_samples_overall=10, test_mode="one")
    untrained = cv.CountVAE(planted.adata, n_latent=2)
    with pytest.raises(NotTrainedError):
        untrained.differential_expression(groupby="group", group1="group1")


@pytest.mark.parametrize(
    "setting",
    [
        {"test_mode": "one"},
        {"delta": -0.1},
        {"delta": True},
        {"fdr_target": 1.0},
        {"fdr_target": "0.05"},
        {"n_bootstrap": 1},
        {"n_bootstrap": 10.0},
    ],
)
def test_bad_test_settings_are_refused_before_any_sampling(planted, monkeypatch, setting):
    def no_sampling(*args, **kwargs):
        raise AssertionError("sampling started before the test settings were checked")

    monkeypatch.setattr(differential, "_comparison_frames", no_sampling)
    with pytest.raises(InvalidArgumentError, match=next(iter(setting))):
        planted.differential_expression(groupby="group", group1="group1", n_samples_overall=10, **setting)


def test_given_pseudocount_is_used(planted):
    frame = planted.differential_expression(groupby="group", group1="group1", n_samples_overall=200, pseudocounts=50.0)
    assert (frame["pseudocounts"] == 50.0).all()
    # expression shares are at most 1, so every fold change is within log2(51 / 50) = 0.03 of 0, below the
    # default delta of 0.25: no gene can be called
    assert frame["proba_de"].max() == 0.0


# ----- simulator with planted groups ----------------------------------------------------------------
def test_default_simulation_is_the_one_before_groups_existed():
    """Counts recorded from the simulator before n_groups/n_de_genes/de_lfc were added (commit 2078547)."""
    adata = cv.data.simulate(n_cells=50, n_genes=10, n_latent=1, seed=3)
    digest = hashlib.sha256(adata.X.toarray().astype(np.int64).tobytes())
    digest.update(adata.obs["batch"].cat.codes.to_numpy().astype(np.int64).tobytes())
    assert digest.hexdigest() == "95ad9314343f89bab97022f1984eaa5d4f0a05f0b9591d99746db43b3f0ee7d2"


def test_groups_without_effects_leave_the_simulation_unchanged():
    base = cv.data.simulate(n_cells=200, n_genes=30, n_batches=2, seed=9)
    grouped = cv.data.simulate(n_cells=200, n_genes=30, n_batches=2, seed=9, n_groups=3)
    assert (base.X != grouped.X).nnz == 0
    np.testing.assert_array_equal(base.obsm["z_true"], grouped.obsm["z_true"])
    assert "group" not in base.obs and list(grouped.obs["group"].cat.categories) == ["group0", "group1", "group2"]
    assert set(base.uns["simulation"]) == set(grouped.uns["simulation"]) - {"de_lfc", "group_names"}
    assert not np.asarray(grouped.uns["simulation"]["de_lfc"]).any()


def test_planted_effects_change_the_means_by_the_stated_fold():
    adata = cv.data.simulate(
        n_cells=300, n_genes=50, n_groups=2, n_de_genes=6, de_lfc=(1.0, 2.0), seed=2, likelihood="poisson"
    )
    truth = cv.data.planted_lfc(adata, "group1", "group0")
    assert (truth != 0).sum() == 6 and truth.abs().between(1.0, 2.0).sum() == 6
    np.testing.assert_array_equal(adata.var["de_lfc_group1"], truth)
    np.testing.assert_array_equal(cv.data.planted_lfc(adata, "group0"), -truth)
    # the true log mean carries the planted offset exactly
    log_mean, _ = true_log_rate_jacobian(adata)
    base = cv.data.simulate(n_cells=300, n_genes=50, n_groups=2, seed=2, likelihood="poisson")
    base_log_mean, _ = true_log_rate_jacobian(base)
    in_group1 = (adata.obs["group"] == "group1").to_numpy()
    difference = log_mean[in_group1] - base_log_mean[in_group1]
    np.testing.assert_allclose(difference, np.broadcast_to(np.log(2) * truth.to_numpy(), difference.shape))
    np.testing.assert_allclose(log_mean[~in_group1], base_log_mean[~in_group1])
    with pytest.raises(InvalidArgumentError, match="n_groups"):
        cv.data.simulate(n_cells=50, n_genes=20, n_de_genes=3)
    with pytest.raises(InvalidArgumentError, match="de_lfc"):
        cv.data.simulate(n_cells=50, n_genes=20, n_groups=2, n_de_genes=3, de_lfc=(2.0, 1.0))


def test_too_few_pairs_warn_with_the_predicted_agreement(planted):
    with pytest.warns(MonteCarloWarning, match="mc_call_jaccard") as record:
        frame = planted.differential_expression(groupby="group", group1="group1", n_samples_overall=20, seed=1)
    assert frame["mc_call_jaccard"].iloc[0] < 0.95
    assert "group1 vs Rest" in str(record[0].message)
    assert record[0].filename == __file__  # attributed to the caller's line, not to countvae or beyond the caller


def test_boundaries_of_the_change_test_and_the_plus_one_standard_error():
    """Known answers of the definitions (scvi-tools' convention): a pair is "up" when its LFC is at least ``delta``
    and "down" when it is below ``-delta``, so LFCs of exactly +1 and -1 (draws 2 vs 1, pseudocount 0) with
    ``delta = 1`` are up and not down; with all 10 pairs agreeing the standard error uses ``p~ = 11 / 12``; and
    the FDR rule calls a set whose expected FDR equals the target (0.25 / 2 = 0.125)."""
    one, two = np.ones((10, 2), dtype=np.float32), np.full((10, 2), 2.0, dtype=np.float32)
    s1, s2 = np.c_[two[:, 0], one[:, 1]], np.c_[one[:, 0], two[:, 1]]  # gene 0: LFC +1, gene 1: LFC -1
    out = change_statistics(s1, s2, delta=1.0, pseudocount=0.0, fdr_target=0.125, test_mode="two", n_bootstrap=4)
    np.testing.assert_array_equal(out["proba_de"], [1.0, 0.0])
    np.testing.assert_allclose(out["proba_de_mc_se"], np.sqrt((11 / 12) * (1 / 12) / 10), rtol=1e-12)
    np.testing.assert_array_equal(fdr_calls(np.array([1.0, 0.75, 0.5]), 0.125), [True, True, False])


def test_two_sided_bootstrap_replicates_add_the_two_directions():
    """Known answer: every pair of gene 0 is beyond ``delta`` (half up, half down), so ``P(up) + P(down) = 1`` in
    every resample and the gene is called in all of them; gene 1 never is."""
    n = 40
    lfc = np.c_[np.where(np.arange(n) % 2 == 0, 2.0, -2.0), np.zeros(n)]
    s1, s2 = (2.0 ** (lfc / 2)).astype(np.float32), (2.0 ** (-lfc / 2)).astype(np.float32)
    out = change_statistics(s1, s2, delta=1.0, pseudocount=0.0, fdr_target=0.05, test_mode="two", n_bootstrap=20)
    np.testing.assert_array_equal(out["is_de"], [True, False])
    np.testing.assert_array_equal(out["is_de_mc_frequency"], [1.0, 0.0])
    assert out["mc_call_jaccard"] == 1.0
