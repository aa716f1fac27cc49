"""The sparse-aware count distributions equal Pyro's reference distributions."""

from __future__ import annotations

import math

import pyro.distributions as pdist
import pytest
import torch

from countvae.module.distributions import (
    NegativeBinomialLogMean,
    PoissonLogMean,
    ZeroInflatedNegativeBinomialLogMean,
)


@pytest.fixture
def draws():
    g = torch.Generator().manual_seed(0)
    x = torch.poisson(torch.rand(9, 40, generator=g, dtype=torch.float64) * 4, generator=g)
    x[:, :5] = 0  # whole zero columns
    log_mean = torch.randn(3, 9, 40, generator=g, dtype=torch.float64)  # 3 draws of z per cell
    return x, log_mean, g


def test_poisson_matches_pyro(draws):
    x, lm, _ = draws
    ours = PoissonLogMean(lm).log_prob(x)
    ref = pdist.Poisson(lm.exp()).log_prob(x).sum(-1)
    assert ours.shape == (3, 9)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("per_cell_theta", [False, True])
def test_nb_matches_pyro(draws, per_cell_theta):
    x, lm, g = draws
    lt = torch.randn((9, 40) if per_cell_theta else (40,), generator=g, dtype=torch.float64)
    ours = NegativeBinomialLogMean(lm, lt).log_prob(x)
    ref = pdist.NegativeBinomial(total_count=lt.exp(), logits=lm - lt).log_prob(x).sum(-1)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-10)


def test_zinb_matches_pyro(draws):
    x, lm, g = draws
    lt = torch.randn(40, generator=g, dtype=torch.float64)
    gate = torch.randn(3, 9, 40, generator=g, dtype=torch.float64)
    ours = ZeroInflatedNegativeBinomialLogMean(lm, lt, gate).log_prob(x)
    ref = (
        pdist.ZeroInflatedNegativeBinomial(total_count=lt.exp().expand_as(lm), logits=lm - lt, gate_logits=gate)
        .log_prob(x)
        .sum(-1)
    )
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-10)


def test_gradients_match_pyro(draws):
    x, lm, g = draws
    lt = torch.randn(40, generator=g, dtype=torch.float64)
    grads = []
    for use_ours in (True, False):
        a, b = lm.clone().requires_grad_(), lt.clone().requires_grad_()
        if use_ours:
            value = NegativeBinomialLogMean(a, b).log_prob(x).sum()
        else:
            value = pdist.NegativeBinomial(total_count=b.exp(), logits=a - b).log_prob(x).sum()
        value.backward()
        grads.append((a.grad, b.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=0, atol=1e-9)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=0, atol=1e-9)


def test_sample_moments():
    torch.manual_seed(0)
    lm = torch.full((20000, 3), 1.5, dtype=torch.float64)
    lt = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)
    s = NegativeBinomialLogMean(lm, lt).sample()
    mu, theta = 1.5 and torch.exp(torch.tensor(1.5, dtype=torch.float64)), lt.exp()
    torch.testing.assert_close(s.mean(0), mu.expand(3), rtol=0.03, atol=0)
    torch.testing.assert_close(s.var(0), mu + mu**2 / theta, rtol=0.06, atol=0)
    gate = torch.full_like(lm, 0.0)  # pi = 0.5
    z = ZeroInflatedNegativeBinomialLogMean(lm, lt, gate).sample()
    torch.testing.assert_close(z.mean(0), 0.5 * mu.expand(3), rtol=0.04, atol=0)
    p = PoissonLogMean(lm).sample()
    torch.testing.assert_close(p.var(0), mu.expand(3), rtol=0.05, atol=0)


def test_the_per_gene_table_of_small_counts_gives_the_direct_terms_and_gradients():
    """Counts 1-4 read ``lgamma(x + theta) - lgamma(theta) - lgamma(x + 1)`` from a per-gene table, the rest
    (large counts, non-whole values) are evaluated directly: per cell and in the gradient with respect to theta
    the sum equals the dense direct formula, with and without the loader's attached positions. Fails if a table
    row is off by one, a large or fractional value is read from the table, the attached rows are misread, or a
    cell's sum takes another cell's entries."""
    from countvae.module.distributions import SMALL_COUNTS, _nonzero_lgamma_terms, attach_nonzero_index

    g = torch.Generator().manual_seed(4)
    x = torch.poisson(torch.rand(7, 30, generator=g, dtype=torch.float64) * 12, generator=g)
    x[0, 0], x[1, 2], x[2, 3] = 0.5, 2.5, 57.0  # fractional and large values take the direct path
    x[5] = 0.0  # a cell without counts: an empty segment of the per-cell sum
    assert ((x > 0) & (x <= SMALL_COUNTS)).sum() > 50 and (x > SMALL_COUNTS).sum() > 10
    log_theta = torch.randn(30, generator=g, dtype=torch.float64)
    results = []
    for how in ("searched", "attached", "dense"):
        lt = log_theta.clone().requires_grad_()
        theta = lt.exp()
        if how == "dense":
            th = theta.expand_as(x)
            per_entry = torch.lgamma(x + th) - torch.lgamma(th) - torch.lgamma(x + 1.0)
            per_cell = torch.where(x > 0, per_entry, torch.zeros_like(per_entry)).sum(-1)
        else:
            xx = x.clone()
            if how == "attached":
                flat = torch.nonzero(xx.reshape(-1)).squeeze(1)
                attach_nonzero_index(xx, flat, flat // 30, flat % 30)
            per_cell = _nonzero_lgamma_terms(xx, theta)
        (per_cell * torch.arange(1.0, 8.0, dtype=torch.float64)).sum().backward()
        results.append((per_cell.detach(), lt.grad))
    for ours in results[:2]:
        torch.testing.assert_close(ours[0], results[2][0], rtol=1e-12, atol=1e-10)
        torch.testing.assert_close(ours[1], results[2][1], rtol=1e-12, atol=1e-10)


@pytest.mark.parametrize("rows", [1, 3])
def test_the_summed_constant_gives_the_direct_sum_and_its_gradient(rows):
    """``count_log_constant_sum`` (the training loss's form: one histogram of (count, gene, theta row) against
    the table) equals the dense direct formula summed over cells, value and gradient with respect to every
    theta, with one theta row or one per batch (``theta_row``). Fails if a histogram bin takes the wrong
    gene, row or count, a large or fractional value is counted in the table, or a batch reads another's row."""
    from countvae.module.distributions import SMALL_COUNTS, count_log_constant_sum

    g = torch.Generator().manual_seed(5)
    x = torch.poisson(torch.rand(9, 30, generator=g, dtype=torch.float64) * 12, generator=g)
    x[0, 0], x[1, 2], x[2, 3], x[3, 4] = 0.5, 2.5, 57.0, SMALL_COUNTS + 1.0
    x[6] = 0.0
    assert ((x > 0) & (x <= SMALL_COUNTS)).sum() > 50 and (x > SMALL_COUNTS).sum() > 10
    theta_row = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2]) % rows
    log_theta = torch.randn(rows, 30, generator=g, dtype=torch.float64)
    results = []
    for how in ("summed", "dense"):
        lt = log_theta.clone().requires_grad_()
        if how == "summed":
            total = count_log_constant_sum(x, lt, theta_row if rows > 1 else None)
        else:
            th = lt.exp()[theta_row]
            per_entry = torch.lgamma(x + th) - torch.lgamma(th) - torch.lgamma(x + 1.0)
            total = torch.where(x > 0, per_entry, torch.zeros_like(per_entry)).sum()
        total.backward()
        results.append((total.detach(), lt.grad))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-12, atol=1e-10)
    poisson = count_log_constant_sum(x, None)
    torch.testing.assert_close(poisson, -torch.lgamma(x + 1.0).sum(), rtol=1e-12, atol=1e-10)


def test_nb_matches_pyro_where_the_mean_is_far_above_theta():
    """Known answer: Pyro's NB log-probability (written with exact log-sigmoids) where ``d = log mu - log theta``
    runs from 5 to 38, the range where a softplus cut off at a lower threshold (20 is torch's default) returns
    ``d`` instead of ``d + log1p(exp(-d))`` and loses ``(x + theta) exp(-d)`` nats per gene."""
    g = torch.Generator().manual_seed(9)
    log_theta = torch.full((30,), -3.0, dtype=torch.float64)  # theta = 0.05
    d = torch.linspace(5.0, 38.0, 30, dtype=torch.float64)
    log_mean = (log_theta + d).expand(2, 30)
    x = torch.poisson(torch.rand(2, 30, generator=g, dtype=torch.float64) * 500, generator=g)
    per_gene = pdist.NegativeBinomial(total_count=log_theta.exp(), logits=log_mean - log_theta).log_prob(x)
    torch.testing.assert_close(
        NegativeBinomialLogMean(log_mean, log_theta).log_prob(x), per_gene.sum(-1), rtol=1e-13, atol=1e-9
    )
    # the zero-inflated NB with pi = 1/2: log(1/2) + NB at x > 0, log(1/2 + NB(0) / 2) at x = 0
    half = math.log(0.5)
    zref = torch.where(x > 0, half + per_gene, torch.logaddexp(torch.tensor(half), half + per_gene)).sum(-1)
    zinb = ZeroInflatedNegativeBinomialLogMean(log_mean, log_theta, torch.zeros(2, 30, dtype=torch.float64))
    torch.testing.assert_close(zinb.log_prob(x), zref, rtol=1e-13, atol=1e-9)


def test_zinb_mean_and_draws_follow_the_gate_probability_not_its_complement():
    """Known answer: with ``gate_logits = log(1/4) - log(3/4)`` the zero-inflation probability is ``pi = 1/4``, so
    the expected count is ``(1 - pi) mu = 0.75 mu`` and the share of zeros is
    ``pi + (1 - pi) (theta / (theta + mu))^theta``. A symmetric gate (``pi = 1/2``) cannot tell ``sigmoid(gate)``
    from ``sigmoid(-gate)``; this one can."""
    torch.manual_seed(1)
    mu, theta = 6.0, 2.0
    lm = torch.full((40000, 2), math.log(mu), dtype=torch.float64)
    lt = torch.full((2,), math.log(theta), dtype=torch.float64)
    gate = torch.full_like(lm, math.log(1.0 / 3.0))  # logit(1/4)
    zinb = ZeroInflatedNegativeBinomialLogMean(lm, lt, gate)
    torch.testing.assert_close(zinb.mean, torch.full_like(lm, 0.75 * mu), rtol=1e-12, atol=0)
    draws = zinb.sample()
    torch.testing.assert_close(draws.mean(0), torch.full((2,), 0.75 * mu, dtype=torch.float64), rtol=0.03, atol=0)
    zero_share = 0.25 + 0.75 * (theta / (theta + mu)) ** theta
    torch.testing.assert_close(
        (draws == 0).double().mean(0), torch.full((2,), zero_share, dtype=torch.float64), rtol=0, atol=0.01
    )
