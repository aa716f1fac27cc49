"""The sparse-aware count distributions equal Pyro's reference distributions."""

from __future__ import annotations

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
