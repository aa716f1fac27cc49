"""An optional importance sampler for ``log p(x)`` whose proposal is fitted to each cell, not amortized.

The default estimator (:func:`countvae.model.inference.log_predictive_density`)
uses the encoder's ``q(z | x)`` as proposal, as scvi-tools does. When a cell's
posterior is much narrower than, or offset from, what the amortized encoder
predicts (the amortization gap; common for Poisson models with many counts),
few importance weights carry all the mass and the estimate sits well below
``log p(x)``. Here each cell gets its own proposal:

1. the posterior mode ``m`` of ``log p(x | z) + log p(z)``, by damped Newton
   steps from the encoder's mean (gradients and Hessians by autograd);
2. the negative Hessian ``H`` there (eigenvalues floored so it is positive definite);
3. a multivariate Student-t proposal with ``df`` degrees of freedom, location ``m``
   and scale matrix ``H^{-1}``: heavier tails than the Laplace approximation, so
   the importance weights stay bounded where the posterior is not Gaussian.

The estimate is ``log mean_s p(x, z_s) / t(z_s)`` with the same Monte Carlo standard
error and effective sample size as the default estimator. It is slower (a Newton
solve per cell) and is not the scvi-tools-compatible default; use it as a
cross-check of held-out ``log p(x)``, e.g. against exact quadrature.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from countvae.errors import InvalidArgumentError
from countvae.invariance.elbo import cell_chunks
from countvae.model import CountVAE
from countvae.model.training import to_tensors

#: Smallest eigenvalue kept in the negative Hessian (a proposal no wider than 1000 prior sd's).
MIN_CURVATURE = 1e-6


def _log_joint(module, z: torch.Tensor, x: torch.Tensor, b: torch.Tensor, log_library: torch.Tensor):
    """``log p(x | z) + log p(z)`` for latent values of shape (..., cells, L)."""
    return module.conditional(z, log_library, b).log_prob(x) + module.prior.distribution(x.shape[0], x).log_prob(z)


def _gradient_and_hessian(module, z, x, b, log_library):
    """Per-cell gradient (cells, L) and Hessian (cells, L, L) of the log joint at ``z`` (cells, L)."""
    z = z.detach().requires_grad_(True)
    value = _log_joint(module, z, x, b, log_library)
    (grad,) = torch.autograd.grad(value.sum(), z, create_graph=True)
    rows = [torch.autograd.grad(grad[:, k].sum(), z, retain_graph=True)[0] for k in range(z.shape[1])]
    return value.detach(), grad.detach(), torch.stack(rows, dim=1).detach()


def _positive_definite(neg_hessian: torch.Tensor) -> torch.Tensor:
    lam, vecs = torch.linalg.eigh(0.5 * (neg_hessian + neg_hessian.transpose(-1, -2)))
    lam = torch.clamp(lam, min=MIN_CURVATURE)
    return (vecs * lam.unsqueeze(-2)) @ vecs.transpose(-1, -2)


def posterior_modes(model: CountVAE, x, b, max_steps: int = 50, tol: float = 1e-8):
    """Posterior mode and negative Hessian there, per cell, by damped Newton steps from the encoder's mean.

    Returns
    -------
    mode, precision
        (cells, L) and (cells, L, L), in the model's dtype.

    """
    module = model.module.eval()
    log_library = torch.log(x.sum(-1, keepdim=True))
    with torch.no_grad():
        z, _ = module.encode(x, b)
    for _ in range(max_steps):
        value, grad, hess = _gradient_and_hessian(module, z, x, b, log_library)
        precision = _positive_definite(-hess)
        step = torch.linalg.solve(precision, grad.unsqueeze(-1)).squeeze(-1)
        scale = torch.ones_like(value).unsqueeze(-1)
        with torch.no_grad():
            for _ in range(30):  # backtrack where a full step lowers the log joint
                proposal = z + scale * step
                worse = ~(_log_joint(module, proposal, x, b, log_library) >= value - 1e-10)
                if not worse.any():
                    break
                scale = torch.where(worse.unsqueeze(-1), 0.5 * scale, scale)
        z = proposal.detach()
        if float((scale * step).abs().max()) < tol:
            break
    _, _, hess = _gradient_and_hessian(module, z, x, b, log_library)
    return z, _positive_definite(-hess)


def laplace_log_predictive_density(
    model: CountVAE,
    adata=None,
    indices: np.ndarray | None = None,
    n_samples: int = 1000,
    df: float = 4.0,
    seed: int = 0,
) -> pd.DataFrame:
    """Importance-sampled ``log p(x)`` per cell with a Student-t proposal at each cell's posterior mode.

    Parameters
    ----------
    model
        A trained :class:`countvae.CountVAE` (any likelihood, decoder and prior).
    adata, indices
        Cells to evaluate (default: the model's AnnData, all cells).
    n_samples
        Importance samples per cell.
    df
        Degrees of freedom of the multivariate t proposal (``> 2``).
    seed
        Seed of the proposal draws.

    Returns
    -------
    pandas.DataFrame
        Columns ``lpd`` (nats; a log density), ``mc_se`` and ``ess``, indexed by cell name.

    """
    if isinstance(n_samples, bool) or not isinstance(n_samples, int | np.integer) or n_samples < 2:
        raise InvalidArgumentError(f"n_samples must be an integer >= 2, got {n_samples!r}.")
    if not df > 2:
        raise InvalidArgumentError(f"df must be larger than 2, got {df!r}.")
    adata, source, idx = model._source(adata, indices)
    module = model.module.eval()
    dtype = next(module.parameters()).dtype
    L = model.n_latent
    gen = torch.Generator().manual_seed(seed)
    lpd, se, ess = (np.empty(len(idx)) for _ in range(3))
    for pos, mb in cell_chunks(source, idx, size=64):
        x, b = to_tensors(mb, dtype, model.device)
        n = x.shape[0]
        mode, precision = posterior_modes(model, x, b)
        cov_chol = torch.linalg.cholesky(torch.linalg.inv(precision))
        log_det_chol = torch.log(torch.diagonal(cov_chol, dim1=-2, dim2=-1)).sum(-1)
        log_library = torch.log(x.sum(-1, keepdim=True))
        with torch.no_grad():
            normal = torch.randn((n_samples, n, L), generator=gen, dtype=dtype).to(x.device)
            chi2 = 2.0 * torch._standard_gamma(torch.full((n_samples, n, 1), df / 2.0, dtype=dtype), generator=gen)
            u = normal * torch.sqrt(df / chi2.to(x.device))  # standard multivariate t draws
            z = mode + torch.einsum("nij,snj->sni", cov_chol, u)
            log_t = (
                math.lgamma((df + L) / 2.0)
                - math.lgamma(df / 2.0)
                - 0.5 * L * math.log(df * math.pi)
                - log_det_chol
                - 0.5 * (df + L) * torch.log1p((u**2).sum(-1) / df)
            )
            log_w = _log_joint(module, z, x, b, log_library) - log_t
            total = torch.logsumexp(log_w, dim=0)
            weights = torch.exp(log_w - total)
            sum_sq = (weights**2).sum(0)
        lpd[pos] = (total - math.log(n_samples)).cpu().numpy()
        se[pos] = torch.sqrt(torch.clamp(n_samples * sum_sq - 1.0, min=0.0) / (n_samples - 1)).cpu().numpy()
        ess[pos] = (1.0 / sum_sq).cpu().numpy()
    return pd.DataFrame({"lpd": lpd, "mc_se": se, "ess": ess}, index=adata.obs_names[idx])
