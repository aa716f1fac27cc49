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

import numpy as np
import pandas as pd
import pyro.distributions as dist
import torch

from countvae._checks import check_int, check_number
from countvae.invariance.elbo_geometry import cell_chunks
from countvae.model import CountVAE
from countvae.model.training import to_tensors
from countvae.module.importance import ImportanceSummary, summarize_log_weights
from countvae.module.vae import log_library_size

#: Smallest eigenvalue kept in the negative Hessian (a proposal no wider than 1000 prior sd's).
MIN_CURVATURE = 1e-6


def _gradient_and_hessian(module, z, x, b, log_library):
    """Per-cell gradient (cells, L) and Hessian (cells, L, L) of the log joint at ``z`` (cells, L)."""
    z = z.detach().requires_grad_(True)
    value = module.log_joint(z, x, b, log_library)
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
    log_library = log_library_size(x)
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
                worse = ~(module.log_joint(proposal, x, b, log_library) >= value - 1e-10)
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
        Columns ``lpd`` (nats; a log density), ``mc_se``, ``ess`` and ``khat``, indexed by cell name.

    """
    check_int("n_samples", n_samples, 2)
    check_number("df", df, 2.0, low_open=True)
    model.require_trained()
    cells = model.cells(adata, indices)
    source, idx = cells.source, cells.indices
    module = model.module.eval()
    dtype = next(module.parameters()).dtype
    parts, positions = [], []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for pos, mb in cell_chunks(source, idx, size=64):
            x, b = to_tensors(mb, dtype, model.device)
            mode, precision = posterior_modes(model, x, b)
            proposal = dist.MultivariateStudentT(
                torch.as_tensor(df, dtype=dtype), mode, torch.linalg.cholesky(torch.linalg.inv(precision))
            )
            with torch.no_grad():
                z = proposal.sample((n_samples,))
                parts.append(summarize_log_weights(module.log_joint(z, x, b) - proposal.log_prob(z)))
            positions.append(pos)
    summary = ImportanceSummary.concatenate(parts).take(np.argsort(np.concatenate(positions)))
    return summary.to_frame(index=cells.obs_names)
