"""Exact held-out ``log p(x)`` of a small LinearSCVI by adaptive Gauss-Hermite quadrature.

The reference that the scvi-tools adapter's importance-sampling estimate is
tested and benchmarked against. It is computed from the decoder's weights,
not through ``module.generative``, so a mistake in the adapter's plumbing
does not carry over into the reference.

LinearSCVI's decoder is ``px_scale = softmax(BN(W [z; onehot(batch)] + b))``; in
eval mode the batch norm is affine, so the log share of gene ``g`` is
``y_g - logsumexp(y)`` with ``y = A z + c_batch`` (``A`` is what
``LinearSCVI.get_loadings`` returns). The softmax makes the log mean non-linear
in ``z``, so :func:`countvae.invariance.quadrature.log_marginal_linear` (a log-linear
mean) does not apply; :func:`adaptive_log_marginal` integrates any smooth
log joint of dimension up to 3:

1. per cell, the mode ``m`` of ``f(u) = log p(x, u)`` by damped Newton steps with
   the exact Hessian (autograd);
2. the negative Hessian there, ``H = V diag(lam) V^T`` (eigenvalues floored);
3. ``p(x) = |det S| sum_k w_k exp(f(m + S u_k) + |u_k|^2 / 2)`` with
   ``S = V diag(lam)^(-1/2)`` and probabilists' Gauss-Hermite nodes ``u_k``, weights ``w_k``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from countvae.errors import InvalidArgumentError

#: Smallest curvature kept in the quadrature grid's scale (a grid at most 1000 prior sd wide).
_MIN_CURVATURE = 1e-6
#: (nodes x cells x genes) elements per evaluation of the log joint.
_ELEMENTS_PER_CHUNK = 1 << 22


def _newton_mode(
    log_joint: Callable[[torch.Tensor], torch.Tensor], start: torch.Tensor, max_steps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-cell maximum of ``log_joint`` from ``start`` (cells, D), and the negative Hessian there."""

    def derivatives(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with torch.enable_grad():
            uu = u.detach().requires_grad_(True)
            value = log_joint(uu)
            (grad,) = torch.autograd.grad(value.sum(), uu, create_graph=True)
            rows = [torch.autograd.grad(grad[:, k].sum(), uu, retain_graph=True)[0] for k in range(u.shape[-1])]
        return value.detach(), grad.detach(), -torch.stack(rows, dim=1).detach()

    u = start.detach().clone()
    value, grad, neg_hess = derivatives(u)
    for _ in range(max_steps):
        lam, vecs = torch.linalg.eigh(0.5 * (neg_hess + neg_hess.transpose(-1, -2)))
        lam = torch.clamp(lam, min=_MIN_CURVATURE)
        step = torch.einsum("nij,nj->ni", vecs, torch.einsum("nji,nj->ni", vecs, grad) / lam)
        scale = torch.ones_like(value).unsqueeze(-1)
        for _ in range(40):  # halve the step where it would lower the log joint
            trial = u + scale * step
            with torch.no_grad():
                trial_value = log_joint(trial)
            worse = ~(trial_value >= value - 1e-12 * value.abs())
            if not bool(worse.any()):
                break
            scale = torch.where(worse.unsqueeze(-1), 0.5 * scale, scale)
        trial = torch.where(worse.unsqueeze(-1), u, trial)
        moved = float((trial - u).abs().max())
        u = trial
        value, grad, neg_hess = derivatives(u)
        if moved < 1e-10:
            break
    return u, neg_hess


def adaptive_log_marginal(
    log_joint: Callable[[torch.Tensor], torch.Tensor],
    start: torch.Tensor,
    n_nodes: int = 20,
    max_newton: int = 100,
) -> torch.Tensor:
    """``log of the integral of exp(log_joint(u)) du`` per cell by adaptive Gauss-Hermite quadrature.

    Parameters
    ----------
    log_joint
        ``u (..., cells, D) -> (..., cells)`` in float64, smooth, with one dominant mode per cell.
    start
        Starting points of the mode search (cells, D), ``D <= 3``, float64.
    n_nodes
        Nodes per dimension (``n_nodes^D`` evaluations per cell); compare with twice as many
        to see that the value has converged.
    max_newton
        Newton iterations at most.

    Returns
    -------
    torch.Tensor
        (cells,), nats.

    """
    n, dim = start.shape
    if dim > 3:
        raise InvalidArgumentError(f"Quadrature is limited to 3 dimensions (an n_nodes^D grid); got {dim}.")
    mode, neg_hess = _newton_mode(log_joint, start.to(torch.float64), max_newton)
    lam, vecs = torch.linalg.eigh(0.5 * (neg_hess + neg_hess.transpose(-1, -2)))
    lam = torch.clamp(lam, min=_MIN_CURVATURE)
    S = vecs / torch.sqrt(lam).unsqueeze(-2)
    nodes, weights = np.polynomial.hermite_e.hermegauss(n_nodes)
    grid = torch.tensor(list(itertools.product(nodes, repeat=dim)), dtype=torch.float64)
    log_w = torch.tensor(
        [float(np.log(weights[list(idx)]).sum()) for idx in itertools.product(range(n_nodes), repeat=dim)],
        dtype=torch.float64,
    )
    per_chunk = max(1, _ELEMENTS_PER_CHUNK // max(1, n * 1000))
    terms = []
    with torch.no_grad():
        for chunk, chunk_w in zip(torch.split(grid, per_chunk), torch.split(log_w, per_chunk), strict=True):
            points = mode.unsqueeze(0) + torch.einsum("nij,kj->kni", S, chunk)
            terms.append(log_joint(points) + 0.5 * (chunk**2).sum(-1, keepdim=True) + chunk_w.unsqueeze(-1))
    return torch.logsumexp(torch.cat(terms, dim=0), dim=0) - 0.5 * torch.log(lam).sum(-1)


class LinearSCVIJoint:
    """``log p(x, u)`` of a LinearSCVI module written from its weights (the quadrature's integrand).

    ``u`` is standardised as in :class:`~countvae.diagnostics.fitting.scvi_log_joint.SCVICells`:
    ``u = z`` with an observed library size, ``u = (z, (l - m_b) / s_b)`` with a latent one.

    Parameters
    ----------
    module
        A LinearSCVI (``LDVAE``) module with ``gene_likelihood`` ``"poisson"`` or ``"nb"``
        and ``dispersion="gene"``.
    x
        Counts (cells, genes).
    batch
        Batch codes (cells,) or (cells, 1).

    """

    def __init__(self, module: Any, x: torch.Tensor, batch: torch.Tensor) -> None:
        if module.gene_likelihood not in ("poisson", "nb") or module.dispersion != "gene":
            raise InvalidArgumentError(
                "The LinearSCVI quadrature covers gene_likelihood 'poisson' or 'nb' with dispersion='gene'; got "
                f"{module.gene_likelihood!r}, {module.dispersion!r}."
            )
        layer = module.decoder.factor_regressor.fc_layers[0]
        linear, norm = layer[0], layer[1]
        weight = linear.weight.detach().to(torch.float64)
        n_latent = int(module.n_latent)
        codes = batch.reshape(-1).long()
        shift = torch.zeros(weight.shape[0], dtype=torch.float64) if linear.bias is None else linear.bias.detach()
        shift = shift.to(torch.float64).expand(codes.shape[0], -1)
        if weight.shape[1] > n_latent:  # one-hot batch columns (scvi drops them for a single batch)
            shift = shift + weight[:, n_latent:].T[codes]
        gain = torch.ones(weight.shape[0], dtype=torch.float64)
        if norm is not None:
            gain = norm.weight.detach().double() / torch.sqrt(norm.running_var.detach().double() + norm.eps)
            shift = (shift - norm.running_mean.detach().double()) * gain + norm.bias.detach().double()
        self.loadings = gain.unsqueeze(-1) * weight[:, :n_latent]  # (genes, n_latent)
        self.offset = shift  # (cells, genes)
        self.x = x.to(torch.float64)
        self.n_z = n_latent
        self.theta = torch.exp(module.px_r.detach().double()) if module.gene_likelihood == "nb" else None
        self.library: tuple[torch.Tensor, torch.Tensor] | None = None
        if not module.use_observed_lib_size:
            means = module.library_log_means.detach().double()[0, codes]
            sds = module.library_log_vars.detach().double()[0, codes].sqrt()
            self.library = (means, sds)
        self.n_latent = n_latent + (self.library is not None)

    def __call__(self, u: torch.Tensor) -> torch.Tensor:
        """``log p(x | z, l) + log N(u; 0, I)`` per cell, (..., cells)."""
        z = u[..., : self.n_z]
        y = z @ self.loadings.T + self.offset
        log_share = y - torch.logsumexp(y, dim=-1, keepdim=True)
        if self.library is None:
            log_library = torch.log(self.x.sum(-1))
        else:
            log_library = self.library[0] + self.library[1] * u[..., -1]
        log_mu = log_share + log_library.unsqueeze(-1)
        if self.theta is None:
            ll = self.x * log_mu - torch.exp(log_mu) - torch.lgamma(self.x + 1.0)
        else:
            theta = self.theta
            log_total = torch.logaddexp(torch.log(theta), log_mu)
            ll = (
                torch.lgamma(self.x + theta)
                - torch.lgamma(theta)
                - torch.lgamma(self.x + 1.0)
                + theta * (torch.log(theta) - log_total)
                + self.x * (log_mu - log_total)
            )
        return ll.sum(-1) - 0.5 * (u**2).sum(-1) - 0.5 * u.shape[-1] * math.log(2 * math.pi)


def linear_scvi_log_marginal(
    module: Any, x: torch.Tensor, batch: torch.Tensor, start: torch.Tensor | None = None, n_nodes: int = 20
) -> torch.Tensor:
    """Exact ``log p(x)`` per cell of a LinearSCVI module with at most 3 latent dimensions (with the library).

    The quantity is the one the module defines: given the observed library size
    when ``use_observed_lib_size=True``, with the latent library integrated out
    otherwise (then ``n_latent <= 2``).

    Parameters
    ----------
    module
        The LinearSCVI module (see :class:`LinearSCVIJoint` for what is covered).
    x, batch
        Counts (cells, genes) and batch codes (cells,) or (cells, 1).
    start
        Where the mode search starts (cells, D); default the prior mean.
    n_nodes
        Gauss-Hermite nodes per dimension.

    Returns
    -------
    torch.Tensor
        (cells,), nats.

    """
    joint = LinearSCVIJoint(module, x, batch)
    if start is None:
        start = torch.zeros(x.shape[0], joint.n_latent, dtype=torch.float64)
    return adaptive_log_marginal(joint, start.to(torch.float64), n_nodes=n_nodes)
