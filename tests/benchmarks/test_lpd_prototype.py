"""Checks of the prototype held-out log p(x) estimators in benchmarks/lpd_estimators.py (issue 13).

They hold each piece to an independent answer: the weight summary to a direct
computation and arviz, the proposal densities to scipy, the Gauss-Newton curvature
to autograd's exact Hessian (equal for a linear decoder), and the estimates to
exact quadrature. When the estimator moves into the package, these move with it.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.special import logsumexp

import countvae as cv
from countvae.data.registry import batch_codes
from countvae.invariance.quadrature import quadrature_log_marginal

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import lpd_estimators as est  # noqa: E402


def test_summary_matches_direct_computation_and_arviz():
    import arviz as az

    rng = np.random.default_rng(0)
    log_w = rng.normal(-50.0, 1.5, size=(400, 7))
    out = est.summarize_log_weights(torch.as_tensor(log_w))
    wn = np.exp(log_w - logsumexp(log_w, axis=0))
    w = np.exp(log_w + 50.0)
    np.testing.assert_allclose(out["lpd"], logsumexp(log_w, axis=0) - math.log(400), rtol=0, atol=1e-12)
    np.testing.assert_allclose(out["ess"], 1.0 / (wn**2).sum(0), rtol=1e-12)
    np.testing.assert_allclose(out["mc_se"], w.std(0, ddof=1) / (math.sqrt(400) * w.mean(0)), rtol=1e-10)
    np.testing.assert_allclose(out["khat"], az.psislw(log_w.T.copy())[1], rtol=1e-12)


def test_khat_separates_heavy_from_light_tailed_weights():
    rng = np.random.default_rng(1)
    light = rng.normal(0.0, 0.3, size=(1000, 20))  # log-normal weights, small sigma: all moments finite
    heavy = np.log(rng.pareto(1.0 / 0.9, size=(1000, 20)) + 1.0)  # Pareto tail with shape k = 0.9
    assert np.all(est.summarize_log_weights(light)["khat"] < 0.5)
    assert np.median(est.summarize_log_weights(heavy)["khat"]) > 0.7


def test_summary_rejects_nan_weights():
    log_w = np.zeros((10, 3))
    log_w[2, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        est.summarize_log_weights(log_w)


@pytest.mark.parametrize("df", [4.0, math.inf])
def test_location_scale_density_matches_scipy(df):
    gen = torch.Generator().manual_seed(0)
    loc = torch.tensor([[0.5, -1.0, 2.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    A = torch.tensor(
        [[[1.0, 0, 0], [0.3, 0.5, 0], [-0.2, 0.1, 2.0]], [[0.1, 0, 0], [0, 0.2, 0], [0, 0.05, 0.3]]],
        dtype=torch.float64,
    )
    prop = est.LocationScale(loc, A, df)
    z = prop.sample(50, gen)
    got = prop.log_prob(z).numpy()
    for n in range(2):
        cov = (A[n] @ A[n].T).numpy()
        if math.isfinite(df):
            want = stats.multivariate_t(loc=loc[n].numpy(), shape=cov, df=df).logpdf(z[:, n].numpy())
        else:
            want = stats.multivariate_normal(loc[n].numpy(), cov).logpdf(z[:, n].numpy())
        np.testing.assert_allclose(got[:, n], want, rtol=1e-10)


def test_student_t_draws_have_the_t_variance():
    gen = torch.Generator().manual_seed(2)
    prop = est.LocationScale(torch.zeros(1, 2, dtype=torch.float64), torch.eye(2, dtype=torch.float64)[None], 6.0)
    z = prop.sample(200_000, gen)[:, 0]
    np.testing.assert_allclose(z.var(0).numpy(), [6.0 / 4.0] * 2, rtol=0.03)  # df / (df - 2)


def test_mixture_counts_and_density_with_per_cell_shares():
    gen = torch.Generator().manual_seed(3)
    a = est.LocationScale(torch.zeros(3, 1, dtype=torch.float64), torch.ones(3, 1, 1, dtype=torch.float64))
    b = est.LocationScale(torch.full((3, 1), 4.0, dtype=torch.float64), 0.5 * torch.ones(3, 1, 1, dtype=torch.float64))
    mix = est.Mixture([a, b], [torch.tensor([0.5, 0.9, 0.0]), torch.tensor([0.5, 0.1, 1.0])])
    counts = mix.counts(101)
    assert counts.sum(0).tolist() == [101, 101, 101]
    assert counts[:, 2].tolist() == [0, 101]
    z = mix.sample(101, gen)
    assert (z[:, 2] > 1.0).float().mean() > 0.95  # cell 2 draws only from b (mean 4, sd 0.5)
    got = mix.log_prob_for(z, 101)
    share = counts.double() / 101
    want = torch.logsumexp(torch.stack([torch.log(share[0]) + a.log_prob(z), torch.log(share[1]) + b.log_prob(z)]), 0)
    torch.testing.assert_close(got, want)


@pytest.fixture(scope="module")
def deep_poisson():
    """A 2-d linear Poisson float64 model on deep counts, trained briefly: its guide is far off."""
    adata = cv.data.simulate(
        n_cells=400, n_genes=60, n_latent=2, decoder="linear", likelihood="poisson", library_size=20_000, seed=4
    )
    cv.CountVAE.setup_anndata(adata)
    model = cv.CountVAE(adata, n_latent=2, likelihood="poisson", decoder="linear", dtype=torch.float64)
    model.train(max_epochs=5, early_stopping=False, progress_bar=False, seed=0)
    idx = model.validation_indices
    x = torch.as_tensor(adata.X[idx].toarray(), dtype=torch.float64)
    b = torch.as_tensor(batch_codes(adata, model.registry)[idx], dtype=torch.long)
    return model, x, b, quadrature_log_marginal(model, indices=idx)


def test_gauss_newton_equals_exact_hessian_for_linear_decoder(deep_poisson):
    model, x, b, _ = deep_poisson
    module = model.module.eval()
    log_library = torch.log(x.sum(-1, keepdim=True))
    with torch.no_grad():
        z = module.encode(x, b)[0]
    v1, g1, h1 = est.exact_derivatives(module, z, x, b, log_library)
    v2, g2, h2 = est.gauss_newton_derivatives(module, z, x, b, log_library)
    torch.testing.assert_close(v1, v2)
    torch.testing.assert_close(g1, g2)
    torch.testing.assert_close(h1, h2, rtol=1e-7, atol=1e-6)


def test_chosen_estimator_matches_quadrature_and_guide_is_flagged(deep_poisson):
    model, x, b, exact = deep_poisson
    spec = est.EstimatorSpec(n_samples=400, guide_weight=0.1, pilot_samples=100, mode_starts=2)
    out = est.estimate_log_marginal(model.module, x, b, spec, torch.Generator().manual_seed(0))
    err = out["lpd"] - exact
    assert abs(err.mean()) < 0.02
    assert np.mean(np.abs(err) <= 3 * out["mc_se"]) >= 0.9
    assert np.all(out["khat"] < 0.7)
    guide = est.estimate_log_marginal(
        model.module, x, b, est.EstimatorSpec(kind="guide", n_samples=400), torch.Generator().manual_seed(0)
    )
    wrong = np.abs(guide["lpd"] - exact) > 1.0
    assert wrong.mean() > 0.5  # the briefly trained guide is far off on deep counts ...
    assert np.all(guide["khat"][wrong] > 0.7)  # ... and k-hat says so on every such cell


def test_ais_matches_quadrature(deep_poisson):
    model, x, b, exact = deep_poisson
    x, b, exact = x[:8], b[:8], exact[:8]
    module = model.module.eval()
    log_library = torch.log(x.sum(-1, keepdim=True))
    with torch.no_grad():
        guide = est.guide_proposal(module, x, b)
    base = est.find_mode(module, x, b, log_library, guide.loc)
    start = est.mode_proposal(base, math.inf)
    start = est.LocationScale(start.loc, 1.5 * start.scale_tril)
    gen = torch.Generator().manual_seed(1)
    out = est.ais_log_marginal(module, x, b, start, gen, n_chains=16, n_temps=100, n_leapfrog=3)
    err = out["lpd"] - exact
    assert np.all(np.abs(err) <= 4 * out["mc_se"] + 0.01), (err, out["mc_se"])
    assert abs(err.mean()) < 0.03


def test_escalation_redoes_exactly_the_flagged_cells(deep_poisson):
    model, x, b, _ = deep_poisson
    first = est.EstimatorSpec(kind="guide", n_samples=200)
    again = est.EstimatorSpec(n_samples=300, guide_weight=0.1)
    plain = est.estimate_log_marginal(model.module, x, b, first, torch.Generator().manual_seed(5))
    both = est.estimate_log_marginal(
        model.module, x, b, dataclasses.replace(first, escalate=again), torch.Generator().manual_seed(5)
    )
    flagged = plain["khat"] > est.KHAT_THRESHOLD
    assert flagged.any() and not flagged.all()
    np.testing.assert_array_equal(both["escalated"], flagged)
    np.testing.assert_array_equal(both["lpd"][~flagged], plain["lpd"][~flagged])  # same draws, untouched
    assert np.all(both["khat"][flagged] < est.KHAT_THRESHOLD)  # the redo with a good proposal is reliable
    assert np.all(both["lpd"][flagged] > plain["lpd"][flagged])  # and higher: the guide's estimate was too low


class _MirrorModule(torch.nn.Module):
    """A 1-d Poisson model whose log rates depend on |z|: two mirror-image posterior modes of equal mass.

    The encoder points at the positive one, as an amortized guide stuck in one basin would.
    """

    def __init__(self, n_genes: int = 30):
        from countvae.module.priors import LatentPrior

        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.w = torch.randn(n_genes, generator=gen, dtype=torch.float64)
        self.a = torch.log_softmax(torch.randn(n_genes, generator=gen, dtype=torch.float64), 0)
        self.prior = LatentPrior("normal", 1)
        self.likelihood = type("Poisson", (), {"kind": "poisson"})()

    def encode(self, x, batch_index):
        n = x.shape[0]
        return torch.full((n, 1), 1.5, dtype=x.dtype), torch.full((n, 1), 0.1, dtype=x.dtype)

    def decode(self, z, batch_index):
        from countvae.module.decoders import DecoderOutput

        return DecoderOutput(log_rate=self.a + self.w * z.abs())

    def conditional(self, z, log_library, batch_index):
        from countvae.module.distributions import PoissonLogMean

        return PoissonLogMean(log_library + self.decode(z, batch_index).log_rate)


def test_newton_starts_over_the_prior_find_a_mode_the_encoder_misses():
    module = _MirrorModule()
    z_true = torch.tensor([[1.2], [-0.8], [1.6]], dtype=torch.float64)
    rate = torch.exp(torch.log(torch.tensor(300.0)) + module.decode(z_true, None).log_rate)
    x = torch.poisson(rate, generator=torch.Generator().manual_seed(1))
    b = torch.zeros(3, dtype=torch.long)
    grid = torch.linspace(-8, 8, 160_001, dtype=torch.float64).view(-1, 1, 1)
    log_library = torch.log(x.sum(-1, keepdim=True))
    values = est.log_joint(module, grid.expand(-1, 3, 1), x, b, log_library)
    exact = (torch.logsumexp(values, 0) + math.log(16 / 160_000)).numpy()
    one_mode = est.estimate_log_marginal(
        module, x, b, est.EstimatorSpec(kind="mode", guide_weight=0.0, n_samples=2000), torch.Generator().manual_seed(2)
    )
    spread = est.EstimatorSpec(n_samples=2000, guide_weight=0.1, pilot_samples=200, mode_starts=2, prior_starts=6)
    found = est.estimate_log_marginal(module, x, b, spread, torch.Generator().manual_seed(2))
    np.testing.assert_allclose(found["lpd"], exact, atol=0.03)
    np.testing.assert_allclose(one_mode["lpd"], exact - math.log(2), atol=0.05)  # half the mass is missed ...
    assert np.all(one_mode["khat"] < est.KHAT_THRESHOLD)  # ... and no weight diagnostic can see it


@pytest.mark.slow
def test_accuracy_benchmark_quick_writes_its_section(tmp_path):
    bench = Path(__file__).resolve().parents[2] / "benchmarks"
    import importlib.util

    spec = importlib.util.spec_from_file_location("lpd_accuracy_under_test", bench / "lpd_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\n<!-- section: other -->\nkept\n<!-- end: other -->\n")
    module.main(["--quick", "--results", str(results), "--cache-dir", str(tmp_path / "cache")])
    text = results.read_text()
    body = text[text.index("<!-- section: lpd-accuracy -->") : text.index("<!-- end: lpd-accuracy -->")]
    assert "QUICK" in body and "### Conclusion" in body and "get_marginal_ll" in body and "kept" in text
    module.main(["--quick", "--results", str(results), "--cache-dir", str(tmp_path / "cache"), "--render-only"])
    assert results.read_text().count("<!-- section: lpd-accuracy -->") == 1
