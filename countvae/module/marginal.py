"""The package's one estimator of a cell's ``log p(x) = log int p(x | z) p(z) dz``, with its reliability.

How to call it (the stable interface; everything else in this file is internal)::

    from countvae.module.marginal import MarginalSettings, estimate_log_marginal

    summary = estimate_log_marginal(
        log_joint,  # (z: Tensor[S, m, L], cells: LongTensor[m]) -> Tensor[S, m]
        loc,  # Tensor[n, L]: the guide's per-cell mean
        scale,  # Tensor[n, L] (diagonal sd) or Tensor[n, L, L] (any factor A, covariance A A^T)
        generator,  # torch.Generator: the source of every random number
        MarginalSettings(),  # optional; the measured default
        neg_hessian=None,  # optional (z: Tensor[m, L], cells) -> Tensor[m, L, L]
        points_per_call=2**14,  # optional; largest S * m handed to log_joint at once
    )
    summary.lpd, summary.mc_se, summary.ess, summary.khat, summary.reliable  # numpy arrays (n,)
    summary.to_frame()  # columns lpd, mc_se, ess, khat, reliable

``log_joint(z, cells)`` returns ``log p(x_c | z) + log p(z)`` (nats, a log density: higher is better) for the cells
``c = cells[j]`` (row positions ``0..n-1`` of ``loc``) at the points ``z[:, j]``, for any subset of cells and any
leading number of points ``S``; it must be differentiable in ``z`` by torch autograd (the gradient drives Newton's
method). Its values may be in a wider floating-point type than ``z`` (float64 log joints of float32 points). For a
countvae module it is ``lambda z, c: module.log_joint(z, x[c], batch_index[c], log_library[c])``.
``neg_hessian`` optionally gives a positive semi-definite approximation of ``-d^2 log_joint / dz^2`` (e.g.
Gauss-Newton); without it the curvature is the forward-difference Jacobian of autograd gradients.

Method (chosen and measured in ``benchmarks/lpd_accuracy.py``, section lpd-accuracy of
``benchmarks/RESULTS.md``; defaults in :class:`MarginalSettings`):

1. damped Newton ascent on the log joint from the guide's mean to a posterior mode;
2. a pilot of ``n_pilot`` draws from a Student-t (``df`` 4) at that mode, scale matrix the inverse curvature, mixed
   with the guide; Newton restarts from each cell's ``pilot_restarts`` highest-weight pilot draws and
   ``prior_restarts`` standard normal points (a ReLU decoder's log joint has several local maxima, and the guide's
   mean can sit in the basin of a minor one); a restart entering the first mode's bulk (``snap_radius`` posterior
   sd) is that mode and stops;
3. ``n_draws`` draws from a defensive mixture: t's at all modes (shares by Laplace mass, with a uniform floor) with
   total weight ``1 - guide_weight``, and the guide with ``guide_weight``; each component gets a fixed number of
   draws per cell and the weights use the whole mixture density, so ``exp(lpd)`` is unbiased for ``p(x)``. The
   pilot's draws are pooled with these (``pool_pilot``): each draw is weighted by the mixture of all components in
   the proportions of all draws (multiple importance sampling, balance heuristic), so a mode the pilot missed does
   not inflate its weights;
4. the log weights go to :func:`countvae.module.importance.summarize_log_weights` (estimate, standard error, ESS,
   Pareto k-hat); cells with k-hat above :data:`~countvae.module.importance.KHAT_THRESHOLD` first get ``redraw``
   times as many fresh draws from the same mixture (a k-hat from 100 draws flags good proposals by chance), whose
   values replace theirs; those still above it are estimated again with ``escalation_draws`` draws and twice the
   pilot and restarts. A cell still above the threshold has ``reliable`` False and no standard error. Cells whose
   weights are flat count as reliable whatever their k-hat
   (:attr:`~countvae.module.importance.ImportanceSummary.reliable`), and are not estimated again.

Cost (benchmarks/RESULTS.md, lpd-package and report-diagnose): Newton's curvature and the restarts dominate when the
final draws are few (``countvae diagnose`` uses 100). A step is halved only for the rows it lowers, restarts stop at
``restart_tol`` or in the first mode's bulk (they only place components), the pilot's draws count in the estimate, and
cells flagged by a noisy k-hat are redrawn rather than refitted.

Accuracy, verified numerically: see docs/concepts/heldout-lpd.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from countvae._checks import check_bool, check_int, check_number
from countvae.errors import InvalidArgumentError
from countvae.module.importance import ImportanceSummary, summarize_log_weights

#: ``log_joint(z[S, m, L], cells[m]) -> [S, m]``: ``log p(x_c | z) + log p(z)`` for the given cells.
LogJoint = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: ``neg_hessian(z[m, L], cells[m]) -> [m, L, L]``: PSD approximation of minus the log joint's Hessian.
NegHessian = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: Smallest eigenvalue kept in a proposal's precision matrix (a proposal at most 1000 prior sd wide).
MIN_CURVATURE = 1e-6

#: Most times a Newton step is halved before a point is left where it is.
MAX_HALVINGS = 30


@dataclass(frozen=True)
class MarginalSettings:
    """Settings of :func:`estimate_log_marginal`; the defaults are the measured recommendation.

    Attributes
    ----------
    n_draws
        Draws per cell that enter the estimate (from the final mixture).
    n_pilot
        Draws per cell from the pilot mixture (the t at the first mode and the guide): they rank starting points for
        the Newton restarts (0: no restarts) and, with ``pool_pilot``, enter the estimate.
    pilot_restarts
        Newton restarts per cell from its highest-weight pilot draws.
    prior_restarts
        Newton restarts per cell from standard normal points.
    newton_steps
        Newton iterations at most from the guide's mean.
    restart_steps
        Newton iterations at most from each restart.
    newton_tol
        A point stops once its Newton decrement (predicted gain) or realised gain is below
        this many nats; a decrement of 1e-3 puts it about 0.05 posterior sd from the mode.
    restart_tol
        The same for the restarts, which may stop earlier: they only place proposal components in the basins they
        reach, and a t component a fraction of a posterior sd off its local maximum is as good a proposal (a decrement
        of 0.02 is about 0.2 sd).
    guide_weight
        Share of the guide in the pilot and final mixtures, in [0, 1); the rest goes to the modes.
    mode_floor
        Part of the modes' share spread uniformly over them, in [0, 1]; the rest follows
        their Laplace masses (a rough guide to a local maximum's share of the posterior).
    df
        Degrees of freedom of the Student-t components: a positive integer, or ``math.inf`` for Gaussians.
    snap_radius
        A restart that comes within this many posterior sd of the cell's first mode (in that mode's Laplace metric,
        ``(z - mode)^T H (z - mode) < snap_radius^2``) without rising above it stops and becomes a copy of the first
        mode (location, log joint and precision; 0: every restart runs to its own stop). A copy, not the point where it
        stopped: with ``pool_pilot`` a component centred on a pilot draw would lower that draw's weight, a bias of about
        -0.015 nats/cell in tests/module/test_marginal.py. On the stored fits of a default Kang ``countvae diagnose``,
        1.5 cut the estimator's CPU time by about a quarter at no loss of accuracy (benchmarks/RESULTS.md,
        lpd-diagnose-accuracy).
    redraw
        For cells whose k-hat exceeds the threshold, first ``redraw * n_draws`` fresh draws from the same mixture
        replace theirs (a k-hat from few draws is noisy, and most such cells pass with more; fresh draws keep the
        estimate independent of the draws that selected the cell). Only cells still above the threshold go to the
        second pass (0: straight there).
    pool_pilot
        Pool the pilot's draws with the final ones (``n_pilot + n_draws`` weights per cell), each weighted by the
        mixture of all components in the proportions of all draws (multiple importance sampling with the balance
        heuristic). Unbiased for fixed components; the final components depend on the pilot draws only through the
        restarts' starting points, which Newton's method carries to a local maximum (or which snap to the first
        mode): tests/module/test_marginal.py finds no bias over 1,000 estimates against the closed form. On the stored
        Kang fits it cut the mean absolute error against the gold standard from 0.112 to about 0.08 nats/cell at the
        report's 100 final draws.
    fixed_restart_metric
        The restarts' Newton steps use the first mode's precision as metric instead of each point's curvature, computed
        once, where a restart stops (for its component's scale): a restart only has to reach a basin, not converge
        quadratically. On the stored Kang fits this cut the estimator's CPU time by 8-20% with no loss of accuracy
        (benchmarks/RESULTS.md, lpd-diagnose-accuracy). Steps are still halved until they do not lower the log joint.
    escalation_draws
        Final draws for cells whose k-hat still exceeds the threshold, estimated again with twice ``n_pilot``,
        ``pilot_restarts``, ``prior_restarts`` and 1.5x ``restart_steps`` (0: no second pass).

    """

    n_draws: int = 800
    n_pilot: int = 200
    pilot_restarts: int = 3
    prior_restarts: int = 6
    newton_steps: int = 20
    restart_steps: int = 8
    newton_tol: float = 1e-3
    restart_tol: float = 2e-2
    guide_weight: float = 0.1
    mode_floor: float = 0.2
    df: float = 4
    snap_radius: float = 1.5
    redraw: int = 4
    escalation_draws: int = 3600
    pool_pilot: bool = True
    fixed_restart_metric: bool = True

    def __post_init__(self):
        for name, low in (
            ("n_draws", 2),
            ("n_pilot", 0),
            ("pilot_restarts", 0),
            ("prior_restarts", 0),
            ("newton_steps", 0),
            ("restart_steps", 0),
            ("redraw", 0),
            ("escalation_draws", 0),
        ):
            check_int(f"MarginalSettings.{name}", getattr(self, name), low)
        if self.escalation_draws == 1:
            raise InvalidArgumentError("MarginalSettings.escalation_draws must be 0 (no second pass) or >= 2; got 1.")
        if self.pilot_restarts > self.n_pilot:
            raise InvalidArgumentError(
                f"MarginalSettings.pilot_restarts ({self.pilot_restarts}) cannot exceed n_pilot ({self.n_pilot}): "
                "restarts start from pilot draws."
            )
        for name in ("pool_pilot", "fixed_restart_metric"):
            check_bool(f"MarginalSettings.{name}", getattr(self, name))
        check_number("MarginalSettings.snap_radius", self.snap_radius, 0.0)
        for name in ("newton_tol", "restart_tol"):
            check_number(f"MarginalSettings.{name}", getattr(self, name), 0.0, low_open=True)
        check_number("MarginalSettings.guide_weight", self.guide_weight, 0.0, 1.0, high_open=True)
        check_number("MarginalSettings.mode_floor", self.mode_floor, 0.0, 1.0)
        df = self.df
        number = isinstance(df, int | float | np.integer | np.floating) and not isinstance(df, bool | np.bool_)
        if not (number and (df == math.inf or (df >= 1 and float(df).is_integer()))):
            raise InvalidArgumentError(f"MarginalSettings.df must be a positive integer or math.inf; got {df!r}.")

    @property
    def n_restarts(self) -> int:
        """Newton restarts per cell (0 without a pilot)."""
        return self.pilot_restarts + self.prior_restarts if self.n_pilot else 0

    def escalated(self) -> MarginalSettings:
        """The settings of the second pass for unreliable cells."""
        return replace(
            self,
            n_draws=self.escalation_draws,
            n_pilot=2 * self.n_pilot,
            pilot_restarts=2 * self.pilot_restarts,
            prior_restarts=2 * self.prior_restarts,
            restart_steps=(3 * self.restart_steps) // 2,
            redraw=0,
            escalation_draws=0,
        )


# ----- evaluating the log joint -------------------------------------------------------------------
def _evaluate(log_joint: LogJoint, z: torch.Tensor, cells: torch.Tensor, points_per_call: int) -> torch.Tensor:
    """``log_joint`` at ``z`` (S, m, L) for ``cells`` (m,), in calls of at most ``points_per_call`` points."""
    n_draws, m = z.shape[0], z.shape[1]
    rows = []
    for start in range(0, m, points_per_call):
        stop = min(m, start + points_per_call)
        per = max(1, points_per_call // (stop - start))
        parts = []
        for s in range(0, n_draws, per):
            chunk = z[s : s + per, start:stop]
            value = log_joint(chunk, cells[start:stop])
            if value.shape != chunk.shape[:2]:
                raise ValueError(
                    f"log_joint returned shape {tuple(value.shape)} for z of shape {tuple(chunk.shape)}; "
                    "expected (S, m): one value per point and cell."
                )
            parts.append(value)
        rows.append(torch.cat(parts, dim=0))
    return torch.cat(rows, dim=1)


def _value_and_gradient(
    log_joint: LogJoint, z: torch.Tensor, cells: torch.Tensor, points_per_call: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log joint (S, m) and its gradient in ``z`` (S, m, L), by autograd."""
    with torch.enable_grad():
        zz = z.detach().requires_grad_(True)
        value = _evaluate(log_joint, zz, cells, points_per_call)
        (grad,) = torch.autograd.grad(value.sum(), zz)
    return value.detach(), grad.detach()


def finite_difference_neg_hessian(log_joint: LogJoint, points_per_call: int = 2**14) -> NegHessian:
    """Minus the Hessian of ``log_joint`` in ``z``, as forward differences of autograd gradients.

    One batched call on ``L + 1`` points per cell, symmetrised. The step (1e-5 in float64, 1e-2 in float32) balances
    truncation and rounding; the curvature only shapes proposals, so its error never biases the estimate.
    """

    def neg_hessian(z: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        L = z.shape[-1]
        h = 1e-5 if z.dtype == torch.float64 else 1e-2
        eye = torch.eye(L, dtype=z.dtype, device=z.device).unsqueeze(1)  # (L, 1, L)
        points = torch.cat([z.detach().unsqueeze(0), z.detach().unsqueeze(0) + h * eye], dim=0)
        _, grad = _value_and_gradient(log_joint, points, cells, points_per_call)
        hess = ((grad[1:] - grad[0]) / h).permute(1, 0, 2)  # (m, L, L): row k = d grad / d z_k
        return -0.5 * (hess + hess.transpose(-1, -2))

    return neg_hessian


def _patched_precision(neg_hess: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """A positive-definite precision from a symmetric matrix.

    Eigen-directions with curvature below :data:`MIN_CURVATURE` (a log joint not concave there, possible with an MLP
    decoder or a Laplace prior) take the fallback's (the guide's) curvature along them, floored at the same value.
    """
    sym = 0.5 * (neg_hess + neg_hess.transpose(-1, -2))
    lam, vecs = torch.linalg.eigh(sym)
    bad = lam < MIN_CURVATURE
    if bool(bad.any()):
        along = torch.einsum("nki,nkl,nli->ni", vecs, fallback, vecs)
        lam = torch.where(bad, along, lam)
    lam = torch.clamp(lam, min=MIN_CURVATURE)
    return (vecs * lam.unsqueeze(-2)) @ vecs.transpose(-1, -2)


@dataclass(frozen=True)
class _Modes:
    mode: torch.Tensor  # (m, L)
    log_joint: torch.Tensor  # (m,) at the mode
    precision: torch.Tensor  # (m, L, L), positive definite

    def take(self, rows: torch.Tensor) -> _Modes:
        return _Modes(self.mode[rows], self.log_joint[rows], self.precision[rows])

    def repeat(self, times: int) -> _Modes:
        """The rows stacked ``times`` times (as ``torch.Tensor.repeat``)."""
        return _Modes(self.mode.repeat(times, 1), self.log_joint.repeat(times), self.precision.repeat(times, 1, 1))


def _backtrack(
    log_joint: LogJoint,
    z0: torch.Tensor,
    step: torch.Tensor,
    floor: torch.Tensor,
    cells: torch.Tensor,
    points_per_call: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Halve the steps of rows whose full step fell below ``floor``; their new points, log joints and gradients.

    Each row is evaluated only until its step is accepted; a row still below ``floor`` after :data:`MAX_HALVINGS`
    halvings stays at ``z0``.
    """
    factor = torch.full_like(floor, 0.5, dtype=step.dtype)  # the log joint may be in a wider type than z
    accepted = torch.zeros_like(floor, dtype=torch.bool)
    pending = torch.arange(floor.shape[0], device=floor.device)
    for _ in range(MAX_HALVINGS - 1):
        trial = z0[pending] + factor[pending].unsqueeze(-1) * step[pending]
        ok = _evaluate(log_joint, trial.unsqueeze(0), cells[pending], points_per_call)[0] >= floor[pending]
        accepted[pending[ok]] = True
        pending = pending[~ok]
        if pending.numel() == 0:
            break
        factor[pending] = 0.5 * factor[pending]
    points = torch.where(accepted.unsqueeze(-1), z0 + factor.unsqueeze(-1) * step, z0)
    value, grad = _value_and_gradient(log_joint, points.unsqueeze(0), cells, points_per_call)
    return points, value[0], grad[0]


def _near(known: _Modes, z: torch.Tensor, value: torch.Tensor, radius: float, tol: float) -> torch.Tensor:
    """Rows (m,) of ``z`` within ``radius`` sd of ``known``'s mode in its Laplace metric, and not above it.

    ``known`` has one row per row of ``z``. A point higher than the known maximum
    (by more than ``tol``) is climbing to another maximum, however close it is.
    """
    offset = z - known.mode
    maha = torch.einsum("ni,nij,nj->n", offset, known.precision, offset)
    return (maha < radius**2) & (value <= known.log_joint + tol)


def _newton(
    log_joint: LogJoint,
    neg_hessian: NegHessian,
    start: torch.Tensor,
    cells: torch.Tensor,
    fallback: torch.Tensor,
    max_steps: int,
    tol: float,
    points_per_call: int,
    known: _Modes | None = None,
    radius: float = 0.0,
    metric: torch.Tensor | None = None,
) -> _Modes:
    """Damped Newton ascent on the log joint from ``start`` (m, L), one independent run per row.

    A step is halved where it would lower the log joint by more than its rounding error, so the log joint never
    decreases; a row stops when its Newton decrement or realised gain falls below ``tol`` (the optimum, or a kink of a
    ReLU decoder's log joint). Only moving rows are evaluated; during the halvings, only rows whose step is pending.

    With ``known`` (a mode per row, found before) and ``radius`` > 0, a row that comes within ``radius`` sd of its
    known mode (see :func:`_near`) stops and returns that mode (location, log joint, precision): it is in the bulk
    that mode's component already covers, and a component placed where it stopped would depend on its start.

    With ``metric`` (m, L, L) positive definite, every step solves against it instead of the curvature at the current
    point, and the curvature is computed once, at the end, for the rows that did not snap (their precision).
    """
    z = start.detach().clone()
    value, grad = _value_and_gradient(log_joint, z.unsqueeze(0), cells, points_per_call)
    value, grad = value[0], grad[0]
    snapped = torch.zeros(z.shape[0], dtype=torch.bool, device=z.device)
    if known is not None and radius > 0:
        snapped = _near(known, z, value, radius, tol)
    active = ~snapped
    neg_hess = torch.zeros((*z.shape, z.shape[-1]), dtype=z.dtype, device=z.device)
    first = torch.nonzero(active).squeeze(1)
    if first.numel() and metric is None:
        neg_hess[first] = neg_hessian(z[first], cells[first]).to(z.dtype)
    slack = 64 * torch.finfo(z.dtype).eps  # relative rounding of a log joint summed over genes
    for _ in range(max_steps):
        idx = torch.nonzero(active).squeeze(1)
        if idx.numel() == 0:
            break
        precision = metric[idx] if metric is not None else _patched_precision(neg_hess[idx], fallback[idx])
        step = torch.linalg.solve(precision, grad[idx].unsqueeze(-1)).squeeze(-1)
        moving = 0.5 * (grad[idx] * step).sum(-1) >= tol
        active[idx[~moving]] = False
        idx, step = idx[moving], step[moving]
        if idx.numel() == 0:
            break
        z0, v0, c0 = z[idx], value[idx], cells[idx]
        floor = v0 - slack * v0.abs()
        # The full step, with its gradient: most rows accept it, and then need no second evaluation.
        trial = z0 + step
        new_value, new_grad = _value_and_gradient(log_joint, trial.unsqueeze(0), c0, points_per_call)
        new_value, new_grad = new_value[0], new_grad[0]
        worse = torch.nonzero(~(new_value >= floor)).squeeze(1)
        if worse.numel():
            trial[worse], new_value[worse], new_grad[worse] = _backtrack(
                log_joint, z0[worse], step[worse], floor[worse], c0[worse], points_per_call
            )
        z[idx], value[idx], grad[idx] = trial, new_value, new_grad
        active[idx[~(new_value - v0 >= tol)]] = False
        if known is not None and radius > 0:
            near = _near(known.take(idx), trial, new_value, radius, tol)
            snapped[idx[near]] = True
            active[idx[near]] = False
            idx, trial, c0 = idx[~near], trial[~near], c0[~near]
        if idx.numel() and metric is None:
            neg_hess[idx] = neg_hessian(trial, c0).to(neg_hess.dtype)
    precision = torch.empty_like(neg_hess)
    kept = torch.nonzero(~snapped).squeeze(1)
    if kept.numel():
        if metric is not None:  # the curvature once, where the row stopped
            neg_hess[kept] = neg_hessian(z[kept], cells[kept]).to(neg_hess.dtype)
        precision[kept] = _patched_precision(neg_hess[kept], fallback[kept])
    if known is not None and bool(snapped.any()):
        precision[snapped] = known.precision[snapped]
        z[snapped], value[snapped] = known.mode[snapped], known.log_joint[snapped]
    return _Modes(z, value, precision)


# ----- proposals ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _LocationScale:
    """Per-cell Gaussian (``df`` inf) or multivariate Student-t with integer ``df``: ``loc + tril @ u``."""

    loc: torch.Tensor  # (n, L)
    tril: torch.Tensor  # (n, L, L), lower triangular, positive diagonal
    df: float

    def sample(self, n_draws: int, generator: torch.Generator) -> torch.Tensor:
        shape = (n_draws, *self.loc.shape)
        u = torch.randn(shape, generator=generator, dtype=self.loc.dtype, device=generator.device)
        if math.isfinite(self.df):
            k = int(self.df)
            normals = torch.randn((*shape[:2], k), generator=generator, dtype=self.loc.dtype, device=generator.device)
            u = u / torch.sqrt((normals**2).sum(-1) / k).unsqueeze(-1)
        return self.loc + torch.einsum("nij,snj->sni", self.tril, u.to(self.loc.device))

    def log_prob(self, z: torch.Tensor) -> torch.Tensor:
        L = self.loc.shape[-1]
        eye = torch.eye(L, dtype=self.loc.dtype, device=self.loc.device).expand_as(self.tril)
        inv_tril = torch.linalg.solve_triangular(self.tril, eye, upper=False)
        maha = (torch.einsum("nij,...nj->...ni", inv_tril, z - self.loc) ** 2).sum(-1)
        log_det = torch.log(torch.diagonal(self.tril, dim1=-2, dim2=-1)).sum(-1)
        if not math.isfinite(self.df):
            return -0.5 * maha - log_det - 0.5 * L * math.log(2 * math.pi)
        df = float(self.df)
        const = math.lgamma((df + L) / 2) - math.lgamma(df / 2) - 0.5 * L * math.log(df * math.pi)
        return const - log_det - 0.5 * (df + L) * torch.log1p(maha / df)

    def take(self, rows: torch.Tensor) -> _LocationScale:
        return _LocationScale(self.loc[rows], self.tril[rows], self.df)


def _at_mode(modes: _Modes, df: float) -> _LocationScale:
    """Student-t (Gaussian for ``df`` inf) at the mode with scale matrix the inverse precision."""
    cov = torch.cholesky_inverse(torch.linalg.cholesky(modes.precision))
    return _LocationScale(modes.mode, torch.linalg.cholesky(0.5 * (cov + cov.transpose(-1, -2))), df)


@dataclass(frozen=True)
class _Mixture:
    """Components with a fixed number of draws per component and cell; the density is the realised mixture."""

    components: tuple[_LocationScale, ...]
    shares: torch.Tensor  # (K, n), non-negative, columns sum to 1

    def take(self, rows: torch.Tensor) -> _Mixture:
        return _Mixture(tuple(c.take(rows) for c in self.components), self.shares[:, rows.cpu()])

    def counts(self, n_draws: int) -> torch.Tensor:
        """Draws per component and cell (K, n): ``floor(share n)``, remainders to the largest fractions."""
        raw = self.shares.double().cpu() * n_draws
        out = torch.floor(raw).long()
        short = n_draws - out.sum(0)
        rank = torch.argsort(torch.argsort(-(raw - out), dim=0, stable=True), dim=0)
        return out + (rank < short.unsqueeze(0)).long()

    def sample_with_log_prob(self, n_draws: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Draws (S, n, L), per cell in component blocks, and the mixture's log density at them (S, n)."""
        counts = self.counts(n_draws)
        ends = counts.cumsum(0)
        member = (torch.arange(n_draws).view(1, -1, 1) >= ends.unsqueeze(1)).sum(0)  # (S, n)
        z = torch.zeros((n_draws, *self.components[0].loc.shape), dtype=self.components[0].loc.dtype)
        z = z.to(self.components[0].loc.device)
        for k, component in enumerate(self.components):
            if int(counts[k].max()) == 0:
                continue
            draws = component.sample(n_draws, generator)
            z = torch.where((member == k).to(z.device).unsqueeze(-1), draws, z)
        return z, self.realised_log_prob(z, counts)

    def realised_log_prob(self, z: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Log density (S, n) at ``z`` of the components mixed in the proportions ``counts`` (K, n) per cell."""
        total = counts.sum(0, keepdim=True).to(z.dtype)
        log_share = torch.log(counts.to(z.dtype) / total).to(z.device)  # -inf for a component without draws
        terms = [log_share[k] + component.log_prob(z) for k, component in enumerate(self.components)]
        return torch.logsumexp(torch.stack(terms, dim=0), dim=0)


def _guide(loc: torch.Tensor, scale: torch.Tensor) -> _LocationScale:
    if scale.dim() == loc.dim():
        return _LocationScale(loc, torch.diag_embed(scale), math.inf)
    return _LocationScale(loc, torch.linalg.cholesky(scale @ scale.transpose(-1, -2)), math.inf)


def _precision_of(proposal: _LocationScale) -> torch.Tensor:
    eye = torch.eye(proposal.loc.shape[-1], dtype=proposal.loc.dtype, device=proposal.loc.device)
    inv_tril = torch.linalg.solve_triangular(proposal.tril, eye.expand_as(proposal.tril), upper=False)
    return inv_tril.transpose(-1, -2) @ inv_tril


def _mode_shares(modes: list[_Modes], floor: float) -> torch.Tensor:
    """Per-cell shares (K, n) of the modes: Laplace masses ``exp(f) det(H)^(-1/2)`` mixed with ``floor`` uniform."""
    log_mass = torch.stack([m.log_joint - 0.5 * torch.logdet(m.precision) for m in modes])
    return (1.0 - floor) * torch.softmax(log_mass, dim=0) + floor / len(modes)


# ----- the estimator ------------------------------------------------------------------------------
def _check_inputs(loc: torch.Tensor, scale: torch.Tensor, generator: torch.Generator) -> None:
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a seeded torch.Generator; got {type(generator).__name__}.")
    if loc.dim() != 2 or loc.shape[0] == 0 or loc.shape[1] == 0:
        raise ValueError(f"loc must have shape (cells >= 1, latent >= 1); got {tuple(loc.shape)}.")
    if scale.shape not in (loc.shape, (*loc.shape, loc.shape[1])):
        raise ValueError(
            f"scale must have shape {tuple(loc.shape)} (diagonal sd) or {(*loc.shape, loc.shape[1])} (a factor of "
            f"the covariance); got {tuple(scale.shape)}."
        )
    if not (torch.isfinite(loc).all() and torch.isfinite(scale).all()):
        raise ValueError("loc and scale must be finite; the guide's output has NaN or inf.")
    if scale.dim() == 2 and not bool((scale > 0).all()):
        raise ValueError("a diagonal scale must be positive.")


def _single_pass(
    log_joint: LogJoint,
    neg_hessian: NegHessian,
    guide: _LocationScale,
    generator: torch.Generator,
    settings: MarginalSettings,
    points_per_call: int,
) -> tuple[_Mixture, torch.Tensor]:
    """Modes, then the final mixture; the mixture and the log weights (n_draws, cells) of its draws."""
    n, L = guide.loc.shape
    cells = torch.arange(n, device=guide.loc.device)
    fallback = _precision_of(guide)
    first = _newton(
        log_joint, neg_hessian, guide.loc, cells, fallback, settings.newton_steps, settings.newton_tol, points_per_call
    )
    guide_share = torch.full((1, n), settings.guide_weight, dtype=torch.float64)
    modes = [first]
    pilot_draws = None
    if settings.n_restarts:
        pilot = _Mixture((_at_mode(first, settings.df), guide), torch.cat([1.0 - guide_share, guide_share]))
        zp, log_rp = pilot.sample_with_log_prob(settings.n_pilot, generator)
        log_jp = _evaluate(log_joint, zp, cells, points_per_call)
        pilot_draws = (zp, log_jp, pilot.counts(settings.n_pilot))
        best = torch.argsort(log_jp - log_rp, dim=0, descending=True)[: settings.pilot_restarts]  # (k, n)
        starts = [zp[best[j], cells] for j in range(best.shape[0])]
        normals = torch.randn((settings.prior_restarts, n, L), generator=generator, dtype=guide.loc.dtype)
        starts += list(normals.to(guide.loc.device))
        R = len(starts)
        found = _newton(
            log_joint,
            neg_hessian,
            torch.cat(starts, dim=0),
            cells.repeat(R),
            fallback.repeat(R, 1, 1),
            settings.restart_steps,
            settings.restart_tol,
            points_per_call,
            known=first.repeat(R),
            radius=settings.snap_radius,
            metric=first.precision.repeat(R, 1, 1) if settings.fixed_restart_metric else None,
        )
        modes += [found.take(slice(r * n, (r + 1) * n)) for r in range(R)]
    mode_shares = _mode_shares(modes, settings.mode_floor) * (1.0 - settings.guide_weight)
    components = (*(_at_mode(m, settings.df) for m in modes), guide)
    proposal = _Mixture(components, torch.cat([mode_shares.double().cpu(), guide_share]))
    if pilot_draws is None or not settings.pool_pilot:
        return proposal, _log_weights(log_joint, proposal, cells, settings.n_draws, generator, points_per_call)
    return proposal, _pooled_log_weights(
        log_joint, proposal, pilot_draws, cells, settings.n_draws, generator, points_per_call
    )


def _pooled_log_weights(
    log_joint: LogJoint,
    proposal: _Mixture,
    pilot_draws: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    cells: torch.Tensor,
    n_draws: int,
    generator: torch.Generator,
    points_per_call: int,
) -> torch.Tensor:
    """Log weights (n_pilot + n_draws, cells) of the pilot's draws and ``n_draws`` from ``proposal``, pooled.

    As ``MarginalSettings.pool_pilot`` says; the pilot's t at the first mode is the proposal's first component, its
    guide the last. ``pilot_draws`` is (draws, log joint at them, draws per pilot component (2, cells)).
    """
    zp, log_jp, pilot_counts = pilot_draws
    z, _ = proposal.sample_with_log_prob(n_draws, generator)
    log_j = _evaluate(log_joint, z, cells, points_per_call)
    counts = proposal.counts(n_draws)
    counts[0] += pilot_counts[0]
    counts[-1] += pilot_counts[1]
    z_all, log_j_all = torch.cat([zp, z], dim=0), torch.cat([log_jp, log_j], dim=0)
    return log_j_all - proposal.realised_log_prob(z_all, counts)


def _log_weights(
    log_joint: LogJoint,
    proposal: _Mixture,
    cells: torch.Tensor,
    n_draws: int,
    generator: torch.Generator,
    points_per_call: int,
) -> torch.Tensor:
    """Log importance weights (n_draws, cells) of draws from ``proposal`` (rows = ``cells``)."""
    z, log_r = proposal.sample_with_log_prob(n_draws, generator)
    return _evaluate(log_joint, z, cells, points_per_call) - log_r


def _subset(function: Callable, rows: torch.Tensor) -> Callable:
    """``function(z, cells)`` on the cells ``rows[cells]``: a log joint or curvature restricted to some cells."""

    def on_rows(z: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        return function(z, rows[cells])

    return on_rows


def estimate_log_marginal(
    log_joint: LogJoint,
    loc: torch.Tensor,
    scale: torch.Tensor,
    generator: torch.Generator,
    settings: MarginalSettings | None = None,
    *,
    neg_hessian: NegHessian | None = None,
    points_per_call: int = 2**14,
) -> ImportanceSummary:
    """Importance-sampled ``log p(x)`` per cell with its standard error, ESS, Pareto k-hat and reliability.

    Parameters
    ----------
    log_joint
        ``(z[S, m, L], cells[m]) -> [S, m]``, differentiable in ``z``; see the module docstring.
    loc, scale
        The guide ``q(z | x)`` per cell: mean (n, L) and either the diagonal sd (n, L) or a factor ``A`` (n, L, L) of
        the covariance ``A A^T`` (lower triangular or not).
    generator
        Source of every random number: the same seed gives the same numbers.
    settings
        :class:`MarginalSettings` (default: the measured recommendation).
    neg_hessian
        ``(z[m, L], cells[m]) -> [m, L, L]``, a positive semi-definite approximation of the
        log joint's negative Hessian; default :func:`finite_difference_neg_hessian`.
    points_per_call
        Most (draw, cell) points handed to ``log_joint`` at once (memory); the draws do not depend on it.

    Returns
    -------
    ImportanceSummary
        Per cell (rows of ``loc``): ``lpd`` (nats), ``mc_se`` (NaN where not reliable),
        ``ess``, ``khat`` and ``reliable`` (k-hat at most ``KHAT_THRESHOLD`` after the second pass).

    """
    settings = MarginalSettings() if settings is None else settings
    if not isinstance(settings, MarginalSettings):
        raise TypeError(f"settings must be a MarginalSettings; got {type(settings).__name__}.")
    check_int("points_per_call", points_per_call, 1)
    _check_inputs(loc, scale, generator)
    loc, scale = loc.detach(), scale.detach()
    curvature = neg_hessian if neg_hessian is not None else finite_difference_neg_hessian(log_joint, points_per_call)
    with torch.no_grad():
        guide = _guide(loc, scale)
        proposal, log_w = _single_pass(log_joint, curvature, guide, generator, settings, points_per_call)
        summary = summarize_log_weights(log_w)
        redo = np.nonzero(~summary.reliable)[0]
        if settings.redraw and redo.size:
            rows = torch.as_tensor(redo, device=loc.device)
            fresh = _log_weights(
                _subset(log_joint, rows),
                proposal.take(rows),
                torch.arange(redo.size, device=loc.device),
                settings.redraw * settings.n_draws,
                generator,
                points_per_call,
            )
            summary = summary.replace_rows(redo, summarize_log_weights(fresh))
            redo = np.nonzero(~summary.reliable)[0]
        if settings.escalation_draws and redo.size:
            rows = torch.as_tensor(redo, device=loc.device)
            _, again = _single_pass(
                _subset(log_joint, rows),
                _subset(curvature, rows),
                guide.take(rows),
                generator,
                settings.escalated(),
                points_per_call,
            )
            summary = summary.replace_rows(redo, summarize_log_weights(again))
    return summary
