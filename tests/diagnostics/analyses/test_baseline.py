"""The no-latent baseline behind the equivalence margin: shares, dispersions, log-likelihood against known answers."""

import numpy as np
import scipy.sparse as sp
from scipy import stats

from countvae.diagnostics.analyses.baseline import MAX_THETA, NoLatentBaseline, baseline_log_likelihood, fit_baseline


def moments_theta(x: np.ndarray, shares_per_cell: np.ndarray) -> np.ndarray:
    """The docstring's method of moments on dense arrays: sum (x - mu)^2 - mu = sum mu^2 / theta, mu = l p."""
    mu = x.sum(axis=1, keepdims=True) * shares_per_cell
    excess = ((x - mu) ** 2 - mu).sum(axis=0)
    return np.where(excess > 0, (mu**2).sum(axis=0) / np.where(excess > 0, excess, 1.0), MAX_THETA)


def test_shares_by_hand_per_batch_with_half_a_count():
    # Batch "a": gene totals (4, 0, 2) + 0.5 -> (4.5, 0.5, 2.5) / 7.5;
    # batch "b": (1, 5, 0) + 0.5 -> (1.5, 5.5, 0.5) / 7.5.
    counts = np.array([[3, 0, 2], [1, 0, 0], [1, 5, 0]])
    model = fit_baseline(sp.csr_matrix(counts), np.array(["a", "a", "b"]))
    assert model.batches == ["a", "b"]
    np.testing.assert_allclose(model.shares[0], np.array([4.5, 0.5, 2.5]) / 7.5)
    np.testing.assert_allclose(model.shares[1], np.array([1.5, 5.5, 0.5]) / 7.5)
    # Without batches one share row over all cells: (5, 5, 2) + 0.5 -> (5.5, 5.5, 2.5) / 13.5.
    np.testing.assert_allclose(fit_baseline(counts).shares, [np.array([5.5, 5.5, 2.5]) / 13.5])


def test_theta_is_the_method_of_moments_on_dense_sums():
    # The sparse-sum estimate equals the dense formula of the docstring, batch by batch.
    rng = np.random.default_rng(0)
    counts = rng.negative_binomial(2.0, 2.0 / (2.0 + rng.uniform(1, 10, size=(300, 6)))).astype(float)
    batches = np.where(np.arange(300) < 120, "x", "y")
    model = fit_baseline(sp.csr_matrix(counts), batches)
    per_cell = model.shares[np.searchsorted(model.batches, batches)]
    np.testing.assert_allclose(model.theta, np.clip(moments_theta(counts, per_cell), 1e-4, MAX_THETA), rtol=1e-9)


def test_theta_recovers_a_simulated_dispersion_and_poisson_is_not_overdispersed():
    # Simulated truth: NB with theta = 2 on genes 0-2 (libraries vary), Poisson on genes 3-5 (theta = infinity).
    # Each gene is a small share of the library, so conditioning on the observed library barely biases theta.
    rng = np.random.default_rng(1)
    n = 20000
    library = rng.uniform(5000, 15000, size=n)
    p = np.array([0.002, 0.004, 0.008, 0.002, 0.004, 0.008])
    mu = library[:, None] * p[None, :]
    nb = rng.negative_binomial(2.0, 2.0 / (2.0 + mu[:, :3]))
    pois = rng.poisson(mu[:, 3:])
    rest = rng.poisson(library * (1 - p.sum()))[:, None]  # the other genes of each cell, so libraries are as drawn
    counts = np.hstack([nb, pois, rest]).astype(float)
    theta = fit_baseline(counts).theta
    np.testing.assert_allclose(theta[:3], 2.0, rtol=0.08)
    assert np.all(theta[3:6] > 50)


def test_log_likelihood_is_the_negative_binomial_and_poisson_pmf():
    # Per cell: sum over genes of log NB(x; mean l p_bg, theta_g), with scipy's parameterisation n = theta,
    # p = theta / (theta + mu); a gene at MAX_THETA is Poisson(mu). Unknown batches use the mean share row.
    shares = np.array([[0.2, 0.3, 0.5], [0.6, 0.3, 0.1]])
    theta = np.array([1.5, 4.0, MAX_THETA])
    model = NoLatentBaseline(["a", "b"], shares, theta)
    counts = np.array([[2, 5, 3], [0, 1, 9], [4, 0, 0]])
    batches = np.array(["b", "a", "new"])
    rows = np.array([shares[1], shares[0], shares.mean(axis=0)])
    mu = counts.sum(axis=1, keepdims=True) * rows
    expected = stats.nbinom.logpmf(counts[:, :2], theta[:2], theta[:2] / (theta[:2] + mu[:, :2])).sum(axis=1)
    expected += stats.poisson.logpmf(counts[:, 2], mu[:, 2])
    np.testing.assert_allclose(baseline_log_likelihood(model, sp.csr_matrix(counts), batches), expected, rtol=1e-10)
    # Without batches every cell uses the mean share row.
    mu = counts.sum(axis=1, keepdims=True) * shares.mean(axis=0)
    expected = stats.nbinom.logpmf(counts[:, :2], theta[:2], theta[:2] / (theta[:2] + mu[:, :2])).sum(axis=1)
    expected += stats.poisson.logpmf(counts[:, 2], mu[:, 2])
    np.testing.assert_allclose(baseline_log_likelihood(model, counts), expected, rtol=1e-10)


def test_a_large_theta_below_the_cap_is_close_to_poisson():
    # NB with theta = 1e7 differs from Poisson by O(mu^2 / theta): the two branches meet.
    model = NoLatentBaseline(["all"], np.array([[0.5, 0.5]]), np.array([1e7, MAX_THETA]))
    counts = np.array([[3, 3], [10, 10]])
    ll = baseline_log_likelihood(model, counts)
    expected = stats.poisson.logpmf(counts, counts.sum(axis=1, keepdims=True) * 0.5).sum(axis=1)
    np.testing.assert_allclose(ll, expected, rtol=1e-6)


def test_normalized_counts_pca_is_the_pca_of_log1p_counts_per_10k():
    from countvae.diagnostics.analyses.baseline import normalized_counts_pca

    rng = np.random.default_rng(3)
    counts = rng.poisson(1.5, size=(120, 40)).astype(float)
    counts[:60, :8] += 15.0  # two groups of cells, so the first component separates them
    counts[5] = 0.0  # a cell without counts stays at zero before centring
    pcs = normalized_counts_pca(sp.csr_matrix(counts), 4)
    library = counts.sum(axis=1, keepdims=True)
    dense = np.log1p(np.divide(counts * 1e4, library, out=np.zeros_like(counts), where=library > 0))
    dense -= dense.mean(axis=0)
    u, s, _ = np.linalg.svd(dense, full_matrices=False)
    # components are defined up to sign
    np.testing.assert_allclose(np.abs(pcs), np.abs(u[:, :4] * s[:4]), atol=1e-8)
    with_counts = np.arange(120) != 5
    assert abs(np.corrcoef(pcs[with_counts, 0], np.repeat([1.0, 0.0], 60)[with_counts])[0, 1]) > 0.9
    assert normalized_counts_pca(counts[:3, :5], 10).shape == (3, 2)  # at most min(cells, genes) - 1
