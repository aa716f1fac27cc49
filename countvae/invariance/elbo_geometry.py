"""The ELBO under latent maps: exactly invariant with the pushed-forward guide, not with a mean-field guide.

``p(x)`` is the same for every orthogonal reparameterization, and so is the ELBO with the guide pushed forward to
the full-covariance Gaussian ``N(A mu, A diag(sigma^2) A^T)``. A mean-field guide cannot represent that covariance:
in rotated coordinates the best one loses the posterior correlations the rotation created, so its ELBO is lower.
Training with a mean-field guide therefore prefers coordinates with uncorrelated posteriors (Rolinek et al., CVPR
2019): the "near" in near-identifiability. Two measurements:

* :func:`elbo_comparison`: the mean-field projection ``N(A mu, diag(diag(A S^2 A^T)))`` of the pushed-forward guide
  (same marginal variances), with common noise;
* :func:`refit_mean_field_elbo`: the best mean-field guide of every cell, refitted with the decoder fixed (no
  amortization), in each model's coordinates.
"""

from __future__ import annotations

import math

import numpy as np
import pyro.distributions as dist
import torch

from countvae.data.loader import CountSource
from countvae.model import CountVAE
from countvae.model.training import to_tensors
from countvae.module.vae import log_library_size, sample_latent

#: Cells evaluated together.
CELLS_PER_CHUNK = 256


def cell_chunks(source: CountSource, idx: np.ndarray, size: int = CELLS_PER_CHUNK):
    """Minibatches of the cells in sorted order, each with the positions of its rows in ``idx``."""
    order = np.argsort(idx)
    for start in range(0, len(idx), size):
        pos = order[start : start + size]
        yield pos, source.rows(idx[pos])


@torch.no_grad()
def elbo_comparison(
    original: CountVAE,
    transformed: CountVAE,
    A: np.ndarray,
    source: CountSource,
    idx: np.ndarray,
    n_draws: int,
    seed: int,
) -> dict[str, float]:
    """ELBO of the original vs the transformed model with its pushed-forward guide and its mean-field projection.

    Every ELBO is the Monte Carlo average of ``log p(x | z) + log p(z) - log q(z)`` over the same base noise, so the
    pushed-forward guide reproduces the original's draw for draw.

    Returns
    -------
    dict
        ``elbo_original_mean`` and ``elbo_projected_mean`` (mean over cells, nats), ``elbo_pushforward_max_abs_diff``
        (largest per-cell difference with the pushed-forward guide), ``elbo_projected_mean_diff`` and its z-score
        ``elbo_projected_z``.

    """
    m0, m1 = original.module.eval(), transformed.module.eval()
    dtype = next(m0.parameters()).dtype
    At = torch.as_tensor(A, dtype=dtype, device=original.device)
    gen = torch.Generator().manual_seed(seed)
    push_worst, diffs, variances, e0_all, ep_all = 0.0, [], [], [], []
    for _, mb in cell_chunks(source, idx):
        x, b = to_tensors(mb, dtype, original.device)
        log_library = log_library_size(x)

        def integrand(module, q, z, x=x, b=b, log_library=log_library):
            return module.log_joint(z, x, b, log_library) - q.log_prob(z)

        loc0, sd0 = m0.encode(x, b)
        loc1, sd1 = m1.encode(x, b)
        eps = torch.randn((n_draws, *loc0.shape), generator=gen, dtype=dtype).to(loc0.device)
        e0 = integrand(m0, m0.posterior_distribution(x, b), sample_latent(loc0, sd0, eps))
        e1 = integrand(m1, m1.posterior_distribution(x, b), sample_latent(loc1, sd1, eps))
        marginal_sd = torch.sqrt((sd1**2).sum(-1)) if sd1.dim() == 3 else sd1
        projected = dist.Normal(loc1, marginal_sd).to_event(1)
        # rotate the base noise too (A eps is again standard normal): for a signed permutation the
        # projection is the pushed-forward guide itself and gives the same draws; elsewhere draws stay paired
        ep = integrand(m1, projected, loc1 + marginal_sd * (eps @ At.T))
        push_worst = max(push_worst, float((e1.mean(0) - e0.mean(0)).abs().max()))
        d = ep - e0
        diffs.append(d.mean(0).cpu().numpy())
        variances.append((d.var(0, unbiased=True) / n_draws).cpu().numpy())
        e0_all.append(e0.mean(0).cpu().numpy())
        ep_all.append(ep.mean(0).cpu().numpy())
    diff = np.concatenate(diffs)
    se = math.sqrt(float(np.concatenate(variances).sum())) / len(diff)
    return {
        "elbo_original_mean": float(np.concatenate(e0_all).mean()),
        "elbo_projected_mean": float(np.concatenate(ep_all).mean()),
        "elbo_pushforward_max_abs_diff": push_worst,
        "elbo_projected_mean_diff": float(diff.mean()),
        "elbo_projected_z": float(diff.mean() / se) if se > 0 else 0.0,
    }


def refit_mean_field_elbo(
    model: CountVAE,
    source: CountSource,
    idx: np.ndarray,
    steps: int = 200,
    n_draws: int = 16,
    n_eval_draws: int = 256,
    lr: float = 0.05,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """The ELBO of each cell's best mean-field Gaussian guide, with the model's decoder and prior fixed.

    Per cell, ``q(z) = N(m, diag(s^2))`` starts from the model's guide (for a full-covariance guide, its mean and
    marginal variances) and maximises ``E_q[log p(x | z) + log p(z)] + H[q]`` (entropy in closed form) by Adam on a
    fixed set of ``n_draws`` base draws (a sample-average approximation: a deterministic objective), then is evaluated
    on ``n_eval_draws`` fresh draws.

    Returns
    -------
    elbo, mc_se
        Per cell, in the order of ``idx`` (nats; a log density).

    """
    module = model.module.eval()
    dtype = next(module.parameters()).dtype
    L = model.n_latent
    gen = torch.Generator().manual_seed(seed)
    elbo = np.empty(len(idx))
    se = np.empty(len(idx))
    half_log_2pie = 0.5 * L * (1.0 + math.log(2.0 * math.pi))
    for pos, mb in cell_chunks(source, idx):
        x, b = to_tensors(mb, dtype, model.device)
        n = x.shape[0]
        log_library = log_library_size(x)
        with torch.no_grad():
            loc0, scale0 = module.encode(x, b)
            sd0 = torch.sqrt((scale0**2).sum(-1)) if scale0.dim() == 3 else scale0
        loc = loc0.detach().clone().requires_grad_(True)
        log_sd = torch.log(sd0).detach().clone().requires_grad_(True)

        def per_draw(eps, loc=loc, log_sd=log_sd, x=x, b=b, log_library=log_library):
            z = loc + torch.exp(log_sd) * eps
            return module.log_joint(z, x, b, log_library) + log_sd.sum(-1) + half_log_2pie

        fit_eps = torch.randn((n_draws, n, L), generator=gen, dtype=dtype).to(x.device)
        optimizer = torch.optim.Adam([loc, log_sd], lr=lr)
        for _ in range(steps):
            loss = -per_draw(fit_eps).mean(0).sum()
            loc.grad, log_sd.grad = torch.autograd.grad(loss, [loc, log_sd])
            optimizer.step()
        with torch.no_grad():
            values = per_draw(torch.randn((n_eval_draws, n, L), generator=gen, dtype=dtype).to(x.device))
        elbo[pos] = values.mean(0).cpu().numpy()
        se[pos] = (values.std(0, unbiased=True) / math.sqrt(n_eval_draws)).cpu().numpy()
    return elbo, se
