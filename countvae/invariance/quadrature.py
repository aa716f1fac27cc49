"""Exact ``log p(x)`` of a linear-decoder model by adaptive Gauss-Hermite quadrature.

For the log-linear model ``log mu_g = log l + b_g + c_{batch,g} + W_g z`` with ``z ~ N(0, I_L)``, ``L <= 3``, a cell's
marginal likelihood is a smooth L-dimensional integral. A grid at the prior's scale is inaccurate because the posterior
of a cell with many genes is far narrower than the grid spacing (shared/notes/quadrature.md). Instead, per cell:

1. find the mode ``m`` of the log joint ``f(z) = log p(x | z) + log N(z; 0, I)`` by Newton's method (``f`` is
   concave for Poisson and NB with a log link);
2. take the negative Hessian there, ``H = W^T diag(c) W + I = V diag(lam) V^T``, with ``c_g`` the curvature of gene
   g's log-likelihood in its log mean;
3. integrate on the tensor grid ``z = m + V diag(lam)^(-1/2) u`` of probabilists' Gauss-Hermite nodes ``u``:
   ``p(x) = |det S| sum_k w_k exp(f(z_k) + |u_k|^2 / 2)``.

The grid is oriented by eigenvectors, so it turns with the latent space: a rotated model (``W Q^T``) has mode ``Q m``
and grid ``Q z_k``, and gives the same value to rounding. That makes it a fast guide-independent reference for the
importance-sampling estimators, but no evidence of invariance (the agreement follows from algebra); the invariance
checks use the axis-aligned grid of :mod:`countvae.invariance.grid_quadrature`, which does not turn with the model.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from countvae._checks import check_int
from countvae.errors import InvalidArgumentError
from countvae.model import CountVAE
from countvae.model.training import to_tensors


def log_likelihood_terms(x: torch.Tensor, eta: torch.Tensor, theta: torch.Tensor | None):
    """Poisson (``theta=None``) or NB log-likelihood per cell, and its gradient and curvature in ``eta`` per gene.

    ``eta`` is the log mean per cell and gene; the curvature is the negative second derivative.
    """
    mu = torch.exp(eta)
    if theta is None:
        ll = (x * eta - mu - torch.lgamma(x + 1.0)).sum(-1)
        return ll, x - mu, mu
    log_total = torch.logaddexp(torch.log(theta), eta)
    ll = (
        torch.lgamma(x + theta)
        - torch.lgamma(theta)
        - torch.lgamma(x + 1.0)
        + theta * (torch.log(theta) - log_total)
        + x * (eta - log_total)
    ).sum(-1)
    grad = theta * (x - mu) / (theta + mu)
    curvature = theta * mu * (theta + x) / (theta + mu) ** 2
    return ll, grad, curvature


def newton_mode(
    x: torch.Tensor,
    offset: torch.Tensor,
    weight: torch.Tensor,
    theta: torch.Tensor | None = None,
    max_newton: int = 100,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-cell mode of ``log p(x | z) + log N(z; 0, I)`` for ``log mu = offset + z W^T``, and the negative Hessian.

    Newton's method from ``z = 0`` with backtracking (the log joint is concave for Poisson and NB with a log link: the
    mode is unique).

    Returns
    -------
    mode, precision
        (cells, L) and (cells, L, L).

    """
    n, L = x.shape[0], weight.shape[1]
    z = x.new_zeros(n, L)
    eye = torch.eye(L, dtype=x.dtype)

    def log_joint(zz: torch.Tensor) -> torch.Tensor:
        ll, _, _ = log_likelihood_terms(x, offset + zz @ weight.T, theta)
        return ll - 0.5 * (zz**2).sum(-1)

    current = log_joint(z)
    for _ in range(max_newton):
        _, grad_eta, curv = log_likelihood_terms(x, offset + z @ weight.T, theta)
        grad = grad_eta @ weight - z
        hess = torch.einsum("ng,gi,gj->nij", curv, weight, weight) + eye
        step = torch.linalg.solve(hess, grad.unsqueeze(-1)).squeeze(-1)
        scale = torch.ones(n, 1, dtype=x.dtype)
        for _ in range(30):  # backtracking: accept the step only where it raises the log joint
            proposal = z + scale * step
            value = log_joint(proposal)
            worse = ~(value >= current - 1e-12)
            if not worse.any():
                break
            scale = torch.where(worse.unsqueeze(-1), scale / 2, scale)
        z, current = proposal, value
        if float(step.abs().max()) < 1e-11:
            break
    _, _, curv = log_likelihood_terms(x, offset + z @ weight.T, theta)
    return z, torch.einsum("ng,gi,gj->nij", curv, weight, weight) + eye


def log_marginal_linear(
    x: torch.Tensor,
    offset: torch.Tensor,
    weight: torch.Tensor,
    theta: torch.Tensor | None = None,
    n_nodes: int = 20,
    max_newton: int = 100,
) -> torch.Tensor:
    """``log p(x)`` per cell for ``log mu = offset + z W^T``, ``z ~ N(0, I)``, by adaptive quadrature.

    Parameters
    ----------
    x
        Counts, (cells, genes), float64.
    offset
        ``log l + b + c_batch`` per cell and gene, (cells, genes).
    weight
        ``W``, (genes, L) with ``L <= 3``.
    theta
        NB inverse dispersion broadcastable to (cells, genes); ``None`` for Poisson.
    n_nodes
        Gauss-Hermite nodes per dimension.
    max_newton
        Newton iterations at most.

    Returns
    -------
    torch.Tensor
        ``log p(x)`` per cell, nats.

    """
    n, L = x.shape[0], weight.shape[1]
    n_nodes = check_int("n_nodes", n_nodes, 1)
    if not 1 <= L <= 3:
        raise InvalidArgumentError(f"Quadrature needs 1 <= n_latent <= 3 (a {n_nodes}^L grid); got {L}.")
    z, hess = newton_mode(x, offset, weight, theta, max_newton)
    lam, vecs = torch.linalg.eigh(hess)
    S = vecs / torch.sqrt(lam).unsqueeze(-2)  # V diag(lam)^(-1/2), per cell
    nodes, weights = np.polynomial.hermite_e.hermegauss(n_nodes)
    grid = torch.tensor(list(itertools.product(nodes, repeat=L)), dtype=x.dtype)  # (K, L)
    log_w = torch.tensor(
        [sum(np.log(weights[list(idx)])) for idx in itertools.product(range(n_nodes), repeat=L)], dtype=x.dtype
    )
    total = []
    for chunk in torch.split(grid, max(1, 2**20 // max(1, n * x.shape[1]))):
        zk = z.unsqueeze(0) + torch.einsum("nij,kj->kni", S, chunk)  # (k, n, L)
        ll, _, _ = log_likelihood_terms(x, offset + zk @ weight.T, theta)
        total.append(ll - 0.5 * (zk**2).sum(-1) + 0.5 * (chunk**2).sum(-1, keepdim=True))
    values = torch.cat(total, dim=0) + log_w.unsqueeze(-1)
    log_det = -0.5 * torch.log(lam).sum(-1)
    return torch.logsumexp(values, dim=0) + log_det - 0.5 * L * np.log(2 * np.pi)


def quadrature_unsupported_reason(model: CountVAE) -> str | None:
    """Why :func:`quadrature_log_marginal` cannot evaluate ``model``, or ``None`` when it can."""
    s = model.settings
    if s.decoder != "linear" or s.likelihood not in ("poisson", "nb") or s.prior not in ("normal", "diagonal"):
        return (
            "Quadrature needs decoder='linear', likelihood 'poisson' or 'nb' and prior 'normal' or 'diagonal'; "
            f"got decoder={s.decoder!r}, likelihood={s.likelihood!r}, prior={s.prior!r}."
        )
    if model.n_latent > 3:
        return f"Quadrature is limited to n_latent <= 3; this model has {model.n_latent}."
    return None


def linear_model_pieces(model: CountVAE, adata=None, indices=None):
    """The cells of a linear Poisson/NB model as ``(positions, x, offset, W, theta)`` minibatches, in float64.

    ``log mu = offset + z W^T`` with ``z ~ N(0, I)``: for a diagonal prior (``z = diag(s) u``, ``u ~ N(0, I)``) the
    scales are folded into ``W``. A reparameterized model (``latent_map`` set) needs nothing more: its decoder weight
    already acts on the new coordinates. ``positions`` index the requested cells.

    Raises
    ------
    InvalidArgumentError
        If the model does not qualify (:func:`quadrature_unsupported_reason`).

    """
    reason = quadrature_unsupported_reason(model)
    if reason is not None:
        raise InvalidArgumentError(reason)
    model.require_trained()
    cells = model.cells(adata, indices)
    source, idx = cells.source, cells.indices
    module = model.module
    dec = module.decoder
    W = dec.weight.detach().cpu().double()
    if module.prior.kind == "diagonal":  # z = diag(s) u with u ~ N(0, I): fold the scales into W
        W = W * torch.exp(module.prior.log_scale.detach().cpu().double())
    order = np.argsort(idx, kind="stable")
    start = 0
    for mb in source.iterate(idx[order], 256, drop_last_singleton=False):
        x, b = to_tensors(mb, torch.float64, torch.device("cpu"))
        offset = torch.log(x.sum(-1, keepdim=True)) + dec.bias.detach().cpu().double()
        if dec.batch_offset is not None:
            c = torch.cat([torch.zeros_like(dec.batch_offset[:1]), dec.batch_offset]).detach().cpu().double()
            offset = offset + c[b]
        lt = module.likelihood.log_theta_for(b)
        theta = None if lt is None else torch.exp(lt.detach().cpu().double())
        yield order[start : start + x.shape[0]], x, offset, W, theta
        start += x.shape[0]


def quadrature_log_marginal(model: CountVAE, adata=None, indices=None, n_nodes: int = 20) -> np.ndarray:
    """Exact ``log p(x)`` per cell of a fitted linear-decoder Poisson or NB ``CountVAE``.

    Computed in float64 from the model's parameters, independently of the guide.

    Parameters
    ----------
    model
        A trained :class:`countvae.CountVAE` with ``decoder="linear"``, ``likelihood`` ``"poisson"`` or ``"nb"``,
        ``prior`` ``"normal"`` or ``"diagonal"`` and ``n_latent <= 3``; reparameterized models included (see
        :func:`countvae.invariance.quadrature.linear_model_pieces`).
    adata, indices
        Cells to evaluate (default: the model's AnnData, all cells).
    n_nodes
        Gauss-Hermite nodes per latent dimension (20 agrees with 40 to ~1e-10).

    Returns
    -------
    numpy.ndarray
        ``log p(x)`` per cell in nats, in the order of ``indices``.

    """
    positions, values = [], []
    for pos, x, offset, W, theta in linear_model_pieces(model, adata, indices):
        positions.append(pos)
        values.append(log_marginal_linear(x, offset, W, theta, n_nodes).numpy())
    out = np.empty(sum(len(p) for p in positions))
    out[np.concatenate(positions)] = np.concatenate(values)
    return out
