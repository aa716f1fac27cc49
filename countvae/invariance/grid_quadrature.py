"""Exact ``log p(x)`` on a product grid laid along the model's own latent axes, refined until it stops changing.

The eigenvector-oriented Gauss-Hermite grid of :mod:`countvae.invariance.quadrature` turns with the latent space, so
a model and its rotated copy are integrated on rotated grids and agree by algebra. Here the grid is a tensor product of
equispaced nodes along the coordinate axes of whichever model is integrated, so the two are integrated on different
node sets, and agreement to the convergence tolerance is a numerical finding about ``p(x)``. A non-orthogonal
reparameterization integrated the same way must differ by far more than that tolerance.

Per cell, for ``log mu = offset + z W^T`` and ``z ~ N(0, I)`` (``L <= 3``):

1. the mode ``m`` and negative Hessian ``H`` of the log joint ``f`` (Newton; ``f`` is concave for Poisson and NB with
   a log link);
2. an axis-aligned box centred at ``m`` with half-width ``r sd_i`` along axis ``i``, ``sd_i = sqrt((H^-1)_ii)`` the
   Laplace marginal sd (``r`` starts at :data:`HALF_WIDTH_SD`); the box is widened by half while the largest ``f`` on
   its boundary is within :data:`TAIL_NATS` of the largest ``f`` inside, so that, ``f`` being concave, the mass
   outside is negligible;
3. the trapezoid rule with ``n`` equispaced nodes per axis, ``n = 17, 33, 65, ...`` (each grid contains the previous
   one), until ``log p(x)`` changes by less than ``tolerance`` between two successive grids or ``max_nodes`` is reached.
   For an analytic integrand negligible at the box's edges the trapezoid error falls faster than any power of the
   spacing, so the last change bounds the coarser grid's error, and the finer value (reported) is more accurate.

A cell that reaches ``max_nodes`` unconverged is reported with ``converged`` False and the change at its last doubling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from countvae._checks import check_int, check_number
from countvae.errors import InvalidArgumentError
from countvae.invariance.quadrature import linear_model_pieces, newton_mode
from countvae.model import CountVAE

#: Initial half-width of the box, in Laplace marginal standard deviations (a Gaussian's density there is e^-50).
HALF_WIDTH_SD = 10.0

#: The box is widened until ``f`` on its boundary is this many nats below its largest value inside.
TAIL_NATS = 40.0

#: Nodes per axis of the first grid (each doubling goes from ``n`` to ``2n - 1``).
FIRST_NODES = 17

#: Largest number of (node x cell x gene) elements evaluated at once.
ELEMENTS_PER_CHUNK = 2**22

#: Widenings of the box at most (each by half).
MAX_WIDENINGS = 8


@dataclass(frozen=True)
class GridQuadrature:
    """Per-cell result of :func:`countvae.invariance.grid_log_marginal` and :func:`countvae.invariance.grid_quadrature`.

    Attributes
    ----------
    log_marginal
        ``log p(x)`` per cell (nats), from the finest grid evaluated.
    nodes_per_axis
        Nodes per axis of that grid, per cell.
    change
        ``|log p(x)|`` change between that grid and the one before it, per cell.
    converged
        Whether the change is below ``tolerance``.
    half_width_sd
        Half-width of the final box in Laplace marginal standard deviations, per cell.
    tolerance
        The convergence tolerance (nats).
    max_nodes
        The node budget per axis.

    """

    log_marginal: np.ndarray
    nodes_per_axis: np.ndarray
    change: np.ndarray
    converged: np.ndarray
    half_width_sd: np.ndarray
    tolerance: float
    max_nodes: int

    @property
    def budget_hit(self) -> bool:
        """Whether some cell reached ``max_nodes`` without converging."""
        return not bool(self.converged.all())

    @property
    def max_change(self) -> float:
        """The largest change at the last doubling over cells (a bound on the achieved accuracy when converged)."""
        return float(self.change.max()) if len(self.change) else 0.0

    def describe(self) -> str:
        """One line: nodes used, achieved change, and whether the budget was hit."""
        if not len(self.change):
            return "axis-aligned trapezoid grid: no cells"
        nodes = sorted({int(n) for n in self.nodes_per_axis})
        text = (
            f"axis-aligned trapezoid grid, {'/'.join(map(str, nodes))} nodes per axis, "
            f"largest change at the last doubling {self.max_change:.1e} nats (tolerance {self.tolerance:.0e})"
        )
        if self.budget_hit:
            text += (
                f"; NODE BUDGET HIT: {int((~self.converged).sum())} of {len(self.converged)} cells not converged "
                f"at {self.max_nodes} nodes per axis"
            )
        return text

    @staticmethod
    def concatenate(parts: list[GridQuadrature], positions: list[np.ndarray]) -> GridQuadrature:
        """Rows of several results placed at ``positions`` (a permutation of ``0..n-1`` when concatenated)."""
        order = np.concatenate(positions) if positions else np.empty(0, dtype=int)
        fields = {}
        for name in ("log_marginal", "nodes_per_axis", "change", "converged", "half_width_sd"):
            values = np.concatenate([getattr(p, name) for p in parts]) if parts else np.empty(0)
            out = np.empty_like(values)
            out[order] = values
            fields[name] = out
        tolerance = parts[0].tolerance if parts else 0.0
        max_nodes = parts[0].max_nodes if parts else 0
        return GridQuadrature(**fields, tolerance=tolerance, max_nodes=max_nodes)


class _LogJoint:
    """``log p(x | z) + log N(z; 0, I)`` for ``z`` (k, cells, L), shape (k, cells), with per-cell constants hoisted.

    The same terms as :func:`countvae.invariance.quadrature.log_likelihood_terms` (tested against it), rearranged so
    only one transcendental per gene and node remains: ``x . eta`` is linear in ``z``.
    """

    def __init__(self, x, offset, weight, theta):
        self.offset, self.weight, self.theta = offset, weight, theta
        self.linear = x @ weight  # (cells, L)
        const = (x * offset).sum(-1) - torch.lgamma(x + 1.0).sum(-1)
        if theta is not None:
            const = const + (torch.lgamma(x + theta) - torch.lgamma(theta) + theta * torch.log(theta)).sum(-1)
            self.log_theta, self.total = torch.log(theta), theta + x
        self.const = const - 0.5 * weight.shape[1] * math.log(2 * math.pi)

    def without_rates(self, z: torch.Tensor, cells: slice) -> torch.Tensor:
        """Poisson only: every term but ``- sum_g exp(eta_g)``, for ``z`` (c, K, L) of ``cells``; shape (c, K)."""
        return self.const[cells].unsqueeze(-1) + (z * self.linear[cells].unsqueeze(1)).sum(-1) - 0.5 * (z**2).sum(-1)

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        eta = self.offset + z @ self.weight.T
        if self.theta is None:
            per_gene = torch.exp(eta).sum(-1)
        else:
            per_gene = (self.total * torch.logaddexp(self.log_theta, eta)).sum(-1)
        return self.const + (z * self.linear).sum(-1) - per_gene - 0.5 * (z**2).sum(-1)


def poisson_rate_sums(
    offset: torch.Tensor, weight: torch.Tensor, center: torch.Tensor, half: torch.Tensor, t: torch.Tensor
) -> torch.Tensor:
    """``sum_g exp(offset_cg + W_g . z)`` at every node of each cell's product grid, shape (cells, n^L).

    The nodes are ``z = center_c + half_c * (t_j1, ..., t_jL)`` in ``meshgrid(..., indexing="ij")`` order. The sum is
    separable in the axes, ``exp(offset_g + W_g . center) prod_i exp(W_gi half_i t_ji)``, so the last axis is a batched
    matrix product instead of one exponential per gene and node.
    """
    L = weight.shape[1]
    base = torch.exp(offset + center @ weight.T)  # (cells, G)
    factors = [torch.exp(weight[:, i].view(1, -1, 1) * half[:, i].view(-1, 1, 1) * t) for i in range(L)]
    partial = base.unsqueeze(-1)  # (cells, G, n^i)
    for factor in factors[:-1]:
        partial = (partial.unsqueeze(-1) * factor.unsqueeze(-2)).flatten(-2)
    return torch.bmm(partial.transpose(1, 2), factors[-1]).flatten(1)


def _trapezoid(x, offset, weight, theta, center, half, n):
    """Trapezoid ``log p(x)`` on the box ``center +- half`` with ``n`` nodes per axis, and the boundary gap.

    Returns the log integral per cell and ``max f inside - max f on the boundary`` per cell.
    """
    L = weight.shape[1]
    t = torch.linspace(-1.0, 1.0, n, dtype=x.dtype)
    log_w1 = torch.zeros(n, dtype=x.dtype)
    log_w1[0] = log_w1[-1] = math.log(0.5)
    unit = torch.stack(torch.meshgrid(*([t] * L), indexing="ij"), -1).reshape(-1, L)  # (K, L)
    log_w = torch.stack(torch.meshgrid(*([log_w1] * L), indexing="ij"), -1).reshape(-1, L).sum(-1)
    on_boundary = (unit.abs() == 1.0).any(-1)
    log_joint = _LogJoint(x, offset, weight, theta)
    if theta is None:  # Poisson: the rate sums by matrix products, a chunk of cells at a time
        per = max(1, ELEMENTS_PER_CHUNK // max(len(unit), x.shape[1] * n ** (L - 1)))
        f = []
        for s in range(0, x.shape[0], per):
            cells = slice(s, s + per)
            z = center[cells].unsqueeze(1) + unit.unsqueeze(0) * half[cells].unsqueeze(1)  # (c, K, L)
            rates = poisson_rate_sums(offset[cells], weight, center[cells], half[cells], t)
            f.append(log_joint.without_rates(z, cells) - rates)
        f = torch.cat(f).T  # (K, cells)
        total = torch.logsumexp(f + log_w.unsqueeze(-1), dim=0)
        inside, boundary = f.max(0).values, f[on_boundary].max(0).values
    else:
        per = max(1, ELEMENTS_PER_CHUNK // max(1, x.shape[0] * x.shape[1]))
        totals, insides, boundaries = [], [], []
        for s in range(0, len(unit), per):
            u, lw, edge = unit[s : s + per], log_w[s : s + per], on_boundary[s : s + per]
            z = center.unsqueeze(0) + u.unsqueeze(1) * half.unsqueeze(0)  # (k, cells, L)
            f = log_joint(z)
            totals.append(torch.logsumexp(f + lw.unsqueeze(-1), dim=0))
            insides.append(f.max(0).values)
            if edge.any():
                boundaries.append(f[edge].max(0).values)
        total = torch.logsumexp(torch.stack(totals), dim=0)
        inside, boundary = torch.stack(insides).max(0).values, torch.stack(boundaries).max(0).values
    log_volume = torch.log(2.0 * half / (n - 1)).sum(-1)  # node spacing per axis, multiplied
    return total + log_volume, inside - boundary


def grid_log_marginal(
    x: torch.Tensor,
    offset: torch.Tensor,
    weight: torch.Tensor,
    theta: torch.Tensor | None = None,
    tolerance: float = 1e-8,
    max_nodes: int = 257,
) -> GridQuadrature:
    """``log p(x)`` per cell for ``log mu = offset + z W^T``, ``z ~ N(0, I)``, on an axis-aligned grid.

    Parameters
    ----------
    x
        Counts, (cells, genes), float64.
    offset
        ``log l + b + c_batch`` per cell and gene, (cells, genes).
    weight
        ``W``, (genes, L) with ``1 <= L <= 3``.
    theta
        NB inverse dispersion broadcastable to (cells, genes); ``None`` for Poisson.
    tolerance
        Stop doubling a cell's nodes when ``log p(x)`` changes by less than this (nats).
    max_nodes
        Node budget per axis (``17, 33, 65, 129, 257, ...``; the last grid has at most this many).

    Returns
    -------
    GridQuadrature

    """
    L = weight.shape[1]
    if not 1 <= L <= 3:
        raise InvalidArgumentError(f"The axis-aligned quadrature needs 1 <= n_latent <= 3; got {L}.")
    check_number("tolerance", tolerance, 0.0, low_open=True)
    check_int("max_nodes", max_nodes, FIRST_NODES)
    n_cells = x.shape[0]
    theta = None if theta is None else torch.broadcast_to(theta, x.shape)
    mode, precision = newton_mode(x, offset, weight, theta)
    sd = torch.sqrt(torch.diagonal(torch.linalg.inv(precision), dim1=-2, dim2=-1))
    width = torch.full((n_cells,), HALF_WIDTH_SD, dtype=x.dtype)
    value = torch.full((n_cells,), math.nan, dtype=x.dtype)
    previous = torch.full((n_cells,), math.nan, dtype=x.dtype)
    change = torch.full((n_cells,), math.inf, dtype=x.dtype)
    nodes = torch.zeros(n_cells, dtype=torch.long)
    next_nodes = torch.full((n_cells,), FIRST_NODES, dtype=torch.long)
    widenings = torch.zeros(n_cells, dtype=torch.long)
    active = torch.ones(n_cells, dtype=torch.bool)
    while active.any():
        n = int(next_nodes[active].min())
        idx = torch.nonzero(active & (next_nodes == n)).squeeze(1)
        th = None if theta is None else theta[idx]
        v, gap = _trapezoid(x[idx], offset[idx], weight, th, mode[idx], width[idx].unsqueeze(-1) * sd[idx], n)
        narrow = (gap < TAIL_NATS) & (widenings[idx] < MAX_WIDENINGS)
        grow = idx[narrow]  # the box cuts off mass: widen it and start these cells' doubling again
        width[grow] *= 1.5
        widenings[grow] += 1
        previous[grow] = math.nan
        next_nodes[grow] = FIRST_NODES
        keep, v = idx[~narrow], v[~narrow]
        value[keep], nodes[keep] = v, n
        compared = torch.isfinite(previous[keep])
        change[keep[compared]] = (v[compared] - previous[keep[compared]]).abs()
        previous[keep] = v
        finished = (change[keep] < tolerance) | (2 * n - 1 > max_nodes)
        active[keep[finished]] = False
        next_nodes[keep[~finished]] = 2 * n - 1
    return GridQuadrature(
        log_marginal=value.numpy(),
        nodes_per_axis=nodes.numpy(),
        change=change.numpy(),
        converged=(change < tolerance).numpy(),
        half_width_sd=width.numpy(),
        tolerance=float(tolerance),
        max_nodes=int(max_nodes),
    )


def grid_quadrature(
    model: CountVAE, adata=None, indices=None, tolerance: float = 1e-8, max_nodes: int = 257
) -> GridQuadrature:
    """Exact ``log p(x)`` per cell of a linear Poisson/NB ``CountVAE`` on a grid along its own latent axes.

    Parameters
    ----------
    model
        A trained :class:`countvae.CountVAE` with ``decoder="linear"``, ``likelihood`` ``"poisson"`` or ``"nb"``, prior
        ``"normal"`` or ``"diagonal"`` and ``n_latent <= 3`` (see
        :func:`countvae.invariance.quadrature.linear_model_pieces`); a reparameterized one is integrated along its
        new axes.
    adata, indices
        Cells to evaluate (default: the model's AnnData, all cells).
    tolerance
        Stop doubling a cell's nodes when ``log p(x)`` changes by less than this (nats).
    max_nodes
        Node budget per axis.

    Returns
    -------
    GridQuadrature
        Per cell, in the order of ``indices``; ``describe()`` says it in one line.

    Raises
    ------
    InvalidArgumentError
        If the model does not qualify, or for a bad ``tolerance`` or ``max_nodes``.

    """
    parts, positions = [], []
    for pos, x, offset, W, theta in linear_model_pieces(model, adata, indices):
        parts.append(grid_log_marginal(x, offset, W, theta, tolerance, max_nodes))
        positions.append(pos)
    return GridQuadrature.concatenate(parts, positions)
