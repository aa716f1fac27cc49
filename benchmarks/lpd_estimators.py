"""Prototype estimators of a cell's held-out ``log p(x)`` for countvae models (issue 13).

Everything here works on ONE minibatch of cells, as tensors, and calls the model
only through

* ``log_joint(module, z, x, batch_index, log_library)``: ``log p(x | z) + log p(z)``
  per cell for ``z`` of shape (..., cells, L) (a local stand-in until the package
  core provides it as a method of the Pyro module);
* ``module.encode(x, batch_index) -> (loc, scale)`` and ``module.decode``;
* for the Gauss-Newton curvature only: the count likelihood's kind and inverse
  dispersion (``module.likelihood``), because that curvature is written in the
  log mean ``eta`` of each gene.

Importance sampling (IS) estimates ``p(x) = E_r[p(x, z) / r(z)]`` for a proposal
``r``; the estimate ``log mean_s w_s`` with ``w_s = p(x, z_s) / r(z_s)`` is
reported with its delta-method standard error, the effective sample size and the
Pareto k-hat of the weights (PSIS, Vehtari et al. 2024, JMLR 25(72)). k-hat is what
says whether the standard error can be believed: the empirical SE of ``log mean w``
is at most 1 nat by construction, whatever the error (issue 13), while k-hat > 0.7
says that the weights' variance is effectively infinite and the estimate unreliable.

Proposals:

``guide``
    the amortized encoder ``q(z | x)`` (countvae's and scvi-tools' default);
``mode``
    a multivariate Student-t (or Gaussian, ``df = inf``) centred at the posterior
    mode found by damped Newton steps from the encoder's mean, with scale matrix
    the inverse negative Hessian (exact by autograd, or Gauss-Newton);
``mixture``
    a defensive mixture of t's at one or more modes, the guide (and optionally the
    prior), sampled with a deterministic number of draws per component and cell
    and weighted by the whole mixture density (the balance heuristic; unbiased
    for ``p(x)``). With ``pilot_samples`` > 0, more modes are searched first:
    Newton from the pilot's highest-weight draws and from N(0, I) points.

Entry point: :func:`estimate_log_marginal` ``(module, x, batch_index, spec, generator)
-> dict`` of per-cell numpy arrays ``lpd, mc_se, ess, khat`` (and diagnostics), for
one minibatch; :class:`EstimatorSpec` holds every setting, and ``spec.escalate``
re-estimates the cells whose k-hat exceeds ``spec.escalate_khat`` with another spec.
:func:`ais_log_marginal` is annealed importance sampling, used as an independent
reference in ``benchmarks/lpd_accuracy.py``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)  # arviz 0.23 announces its 1.x refactor at import
    import arviz as az

#: Largest number of (sample x cell x gene) elements evaluated at once.
ELEMENTS_PER_CHUNK = 2**22

#: k-hat above which importance-sampling estimates are unreliable (Vehtari et al. 2024, section 3).
KHAT_THRESHOLD = 0.7

#: Smallest eigenvalue kept in a proposal's precision matrix (a proposal at most 1000 prior sd wide).
MIN_CURVATURE = 1e-6


# ----- the interface the refactor provides --------------------------------------------------------
def log_joint(
    module: torch.nn.Module, z: torch.Tensor, x: torch.Tensor, batch_index: torch.Tensor, log_library: torch.Tensor
) -> torch.Tensor:
    """``log p(x | z) + log p(z)`` per cell, shape (..., cells), for ``z`` of shape (..., cells, L).

    Local stand-in for the method the Pyro module will provide (issue 12): the
    same terms as the Pyro model's trace at the sites ``z`` and ``x``.
    """
    return module.conditional(z, log_library, batch_index).log_prob(x) + module.prior.distribution(
        x.shape[0], x
    ).log_prob(z)


def summarize_log_weights(log_w: torch.Tensor | np.ndarray) -> dict[str, np.ndarray]:
    """Per-cell estimate and reliability of ``log p(x)`` from log importance weights.

    Parameters
    ----------
    log_w
        Log importance weights ``log p(x, z_s) - log r(z_s)``, shape (samples, cells).
        ``-inf`` (a zero weight) is allowed; NaN and ``+inf`` are not.

    Returns
    -------
    dict
        ``lpd``: ``log mean_s w_s`` (nats); ``mc_se``: delta-method standard error of
        ``lpd``, ``sd(w) / (sqrt(S) mean(w))``; ``ess``: ``1 / sum wn_s^2`` for
        normalised weights ``wn``; ``khat``: Pareto shape of the weights' upper tail
        (arviz's PSIS, ``inf`` when the tail is too short to fit). Each (cells,).

    """
    lw = log_w.detach().double().cpu().numpy() if isinstance(log_w, torch.Tensor) else np.asarray(log_w, float)
    if lw.ndim != 2 or lw.shape[0] < 2:
        raise ValueError(f"log_w must have shape (samples >= 2, cells); got {lw.shape}.")
    bad = np.isnan(lw) | (lw == np.inf)
    if bad.any():
        raise ValueError(
            f"{int(bad.sum())} log weights are NaN or +inf (in {int(bad.any(0).sum())} cells); "
            "the log joint or the proposal density overflowed."
        )
    n = lw.shape[0]
    top = lw.max(0)
    if not np.isfinite(top).all():
        raise ValueError(f"{int((~np.isfinite(top)).sum())} cells have all weights zero; log p(x) is not estimable.")
    scaled = np.exp(lw - top)
    total = scaled.sum(0)
    wn = scaled / total
    sum_sq = (wn**2).sum(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a cell with a constant tail gives k-hat inf
        _, khat = az.psislw(lw.T.copy(), normalize=False)
    return {
        "lpd": np.log(total) + top - math.log(n),
        "mc_se": np.sqrt(np.clip(n * sum_sq - 1.0, 0.0, None) / (n - 1)),
        "ess": 1.0 / sum_sq,
        "khat": np.asarray(khat, dtype=float),
    }


# ----- proposals ----------------------------------------------------------------------------------
@dataclass
class LocationScale:
    """A per-cell Gaussian (``df = inf``) or multivariate Student-t with integer ``df``.

    ``z = loc + scale_tril @ u`` with ``u`` standard normal, or ``u = n / sqrt(c / df)``
    with ``c ~ chi^2_df`` (a sum of ``df`` squared normals, so draws come from one
    seeded torch generator).
    """

    loc: torch.Tensor  # (cells, L)
    scale_tril: torch.Tensor  # (cells, L, L), lower triangular with positive diagonal
    df: float = math.inf

    def __post_init__(self):
        if math.isfinite(self.df) and (self.df < 1 or self.df != int(self.df)):
            raise ValueError(f"df must be a positive integer or math.inf, got {self.df!r}.")

    def sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` draws per cell, shape (n, cells, L)."""
        shape = (n, *self.loc.shape)
        u = torch.randn(shape, generator=generator, dtype=self.loc.dtype)
        if math.isfinite(self.df):
            k = int(self.df)
            chi2 = (torch.randn((n, self.loc.shape[0], k), generator=generator, dtype=self.loc.dtype) ** 2).sum(-1)
            u = u / torch.sqrt(chi2 / k).unsqueeze(-1)
        return self.loc + torch.einsum("nij,snj->sni", self.scale_tril, u.to(self.loc.device))

    def log_prob(self, z: torch.Tensor) -> torch.Tensor:
        """Log density at ``z`` (..., cells, L), shape (..., cells)."""
        L = self.loc.shape[-1]
        eye = torch.eye(L, dtype=self.loc.dtype, device=self.loc.device)
        inv_tril = torch.linalg.solve_triangular(self.scale_tril, eye.expand_as(self.scale_tril), upper=False)
        u = torch.einsum("nij,...nj->...ni", inv_tril, z - self.loc)
        log_det = torch.log(torch.diagonal(self.scale_tril, dim1=-2, dim2=-1)).sum(-1)
        maha = (u**2).sum(-1)
        if not math.isfinite(self.df):
            return -0.5 * maha - log_det - 0.5 * L * math.log(2 * math.pi)
        df = self.df
        return (
            math.lgamma((df + L) / 2)
            - math.lgamma(df / 2)
            - 0.5 * L * math.log(df * math.pi)
            - log_det
            - 0.5 * (df + L) * torch.log1p(maha / df)
        )


def guide_proposal(module: torch.nn.Module, x: torch.Tensor, batch_index: torch.Tensor) -> LocationScale:
    """The amortized guide ``q(z | x)`` (mean-field or, after a reparameterization, full covariance)."""
    loc, scale = module.encode(x, batch_index)
    if scale.dim() == loc.dim():
        return LocationScale(loc, torch.diag_embed(scale))
    return LocationScale(loc, torch.linalg.cholesky(scale @ scale.transpose(-1, -2)))


def prior_proposal(module: torch.nn.Module, x: torch.Tensor) -> LocationScale | None:
    """The prior as a proposal (Gaussian priors only; ``None`` for the Laplace prior)."""
    prior = module.prior.distribution(x.shape[0], x)
    base = prior.base_dist
    if not isinstance(base, torch.distributions.Normal):
        return None
    return LocationScale(base.loc, torch.diag_embed(base.scale))


@dataclass
class Mixture:
    """Components with deterministic draw counts per cell; the density is the count-weighted mixture.

    ``weights`` is a list with one entry per component, each a float (the same share
    for every cell) or a tensor (cells,) of per-cell shares; shares are normalised per cell.
    """

    components: list[LocationScale]
    weights: list

    def counts(self, n: int) -> torch.Tensor:
        """Draws per component and cell (K, cells): ``floor(w n)``, remainders to the largest fractions."""
        n_cells = self.components[0].loc.shape[0]
        w = torch.stack([torch.as_tensor(v, dtype=torch.float64).expand(n_cells) for v in self.weights]).cpu()
        raw = w / w.sum(0, keepdim=True) * n
        out = torch.floor(raw).long()
        short = n - out.sum(0)  # (cells,)
        rank = torch.argsort(torch.argsort(-(raw - out), dim=0, stable=True), dim=0)
        return out + (rank < short.unsqueeze(0)).long()

    def sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` draws per cell, shape (n, cells, L); per cell, component blocks in order."""
        counts = self.counts(n)
        ends = counts.cumsum(0)  # (K, cells)
        draw = torch.arange(n).unsqueeze(-1)  # (n, 1)
        member = (draw.unsqueeze(0) >= ends.unsqueeze(1)).sum(0)  # (n, cells): component of each draw
        out = None
        for k, comp in enumerate(self.components):
            if int(counts[k].max()) == 0:
                continue
            zk = comp.sample(n, generator)
            mask = (member == k).to(zk.device).unsqueeze(-1)
            out = torch.where(mask, zk, out) if out is not None else torch.where(mask, zk, torch.zeros_like(zk))
        return out

    def log_prob_for(self, z: torch.Tensor, n: int) -> torch.Tensor:
        """Log mixture density with the realised shares ``n_k / n`` as weights (balance heuristic)."""
        counts = self.counts(n).to(z.dtype).to(z.device)
        log_share = torch.log(counts / n)  # -inf where a component has no draws for a cell
        terms = [log_share[k] + comp.log_prob(z) for k, comp in enumerate(self.components)]
        return torch.logsumexp(torch.stack(terms, dim=0), dim=0)


# ----- posterior mode and curvature ---------------------------------------------------------------
@dataclass
class ModeResult:
    """Per-cell Newton result."""

    mode: torch.Tensor  # (cells, L)
    precision: torch.Tensor  # (cells, L, L), positive definite (floored / patched)
    log_joint: torch.Tensor  # (cells,) at the mode
    steps: int  # Newton iterations taken (all cells together)
    converged: torch.Tensor  # (cells,) bool: Newton decrement below tolerance
    concave: torch.Tensor  # (cells,) bool: the curvature matrix was positive definite at the mode


def _prior_neg_hessian(module, z: torch.Tensor) -> torch.Tensor:
    """``-d^2 log p(z) / dz^2`` per cell (cells, L, L) for countvae's factorised priors.

    N(0, diag(s^2)): ``diag(1 / s^2)``; Laplace: 0 away from the axes (its kink at 0
    is left to the likelihood's curvature and the eigenvalue floor).
    """
    n, L = z.shape
    if module.prior.kind == "laplace":
        return z.new_zeros(n, L, L)
    if module.prior.kind == "diagonal":
        precision = torch.exp(-2.0 * module.prior.log_scale.detach()).to(z.dtype)
    else:
        precision = z.new_ones(L)
    return torch.diag_embed(precision.expand(n, L))


def _eta_and_jacobian(module, z, batch_index, log_library) -> tuple[torch.Tensor, torch.Tensor]:
    """Log means ``eta`` (cells, genes) and ``d eta / d z`` (cells, genes, L) by forward differences.

    One batched decoder call on ``L + 1`` points per cell. Forward-mode autodiff
    (``torch.func.jvp``) gives the same matrix to rounding but took 5x as long on
    CPU (dual-number overhead in every layer). The step ``h`` balances truncation
    and rounding; the Jacobian only shapes a proposal, so its error never biases
    the estimate.
    """
    L = z.shape[-1]
    h = 1e-5 if z.dtype == torch.float64 else 1e-2
    eye = torch.eye(L, dtype=z.dtype, device=z.device).unsqueeze(1)  # (L, 1, L)
    points = torch.cat([z.detach().unsqueeze(0), z.detach().unsqueeze(0) + h * eye], dim=0)  # (L + 1, cells, L)
    with torch.no_grad():
        eta = module.decode(points, batch_index).log_rate + log_library
    return eta[0], ((eta[1:] - eta[0]) / h).permute(1, 2, 0)


def _eta_derivatives(module, x, eta, batch_index) -> tuple[torch.Tensor, torch.Tensor]:
    """``d log p(x | eta) / d eta`` and the observed curvature ``-d^2 log p / d eta^2`` per gene (>= 0)."""
    mu = torch.exp(eta)
    if module.likelihood.kind == "poisson":
        return x - mu, mu
    theta = torch.exp(module.likelihood.log_theta_for(batch_index)).to(eta.dtype)
    denom = theta + mu
    return theta * (x - mu) / denom, theta * mu * (theta + x) / denom**2


def gauss_newton_derivatives(module, z, x, batch_index, log_library):
    """Log joint, gradient and Gauss-Newton negative Hessian ``J^T diag(c) J - H_prior`` at ``z``.

    The gradient is exact (one backward pass). For Poisson and NB likelihoods with a
    log link the curvature ``c`` in ``eta`` is non-negative, so the matrix is positive
    semi-definite for any decoder; for the linear decoder (``eta`` linear in ``z``) it
    is the exact negative Hessian. The Jacobian ``J = d eta / d z`` costs L + 1
    forward decoder evaluations and no second-order autodiff.
    """
    with torch.enable_grad():
        zz = z.detach().requires_grad_(True)
        value = log_joint(module, zz, x, batch_index, log_library)
        (grad,) = torch.autograd.grad(value.sum(), zz)
    eta, jac = _eta_and_jacobian(module, z, batch_index, log_library)
    _, c_eta = _eta_derivatives(module, x, eta, batch_index)
    neg_hess = torch.einsum("ng,ngk,ngl->nkl", c_eta, jac, jac) + _prior_neg_hessian(module, z)
    return value.detach(), grad.detach(), neg_hess


def exact_derivatives(module, z, x, batch_index, log_library):
    """Log joint, gradient and exact negative Hessian at ``z`` by autograd (L double-backward passes)."""
    with torch.enable_grad():
        zz = z.detach().requires_grad_(True)
        value = log_joint(module, zz, x, batch_index, log_library)
        (grad,) = torch.autograd.grad(value.sum(), zz, create_graph=True)
        rows = [torch.autograd.grad(grad[:, k].sum(), zz, retain_graph=True)[0] for k in range(z.shape[1])]
    return value.detach(), grad.detach(), -torch.stack(rows, dim=1).detach()


def _supports_gauss_newton(module) -> bool:
    return module.likelihood.kind in ("poisson", "nb")


def _patched_precision(neg_hess: torch.Tensor, fallback: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A positive-definite precision from a symmetric matrix, and whether the matrix already was one.

    Eigen-directions with curvature below :data:`MIN_CURVATURE` (a non-concave log
    joint, possible with the MLP decoder) take the fallback precision's curvature
    along that direction (the guide's), floored at :data:`MIN_CURVATURE`.
    """
    sym = 0.5 * (neg_hess + neg_hess.transpose(-1, -2))
    lam, vecs = torch.linalg.eigh(sym)
    bad = lam < MIN_CURVATURE
    if fallback is not None and bad.any():
        along = torch.einsum("nki,nkl,nli->ni", vecs, fallback, vecs)
        lam = torch.where(bad, along, lam)
    lam = torch.clamp(lam, min=MIN_CURVATURE)
    return (vecs * lam.unsqueeze(-2)) @ vecs.transpose(-1, -2), ~bad.any(-1)


def find_mode(
    module: torch.nn.Module,
    x: torch.Tensor,
    batch_index: torch.Tensor,
    log_library: torch.Tensor,
    start: torch.Tensor,
    *,
    hessian: str = "gauss-newton",
    max_steps: int = 20,
    tol: float = 1e-3,
    fallback_precision: torch.Tensor | None = None,
) -> ModeResult:
    """Posterior mode per cell by damped Newton ascent on the log joint, with the curvature there.

    Parameters
    ----------
    start
        Starting points (cells, L), e.g. the encoder's means.
    hessian
        ``"gauss-newton"`` (Poisson/NB only; falls back to ``"exact"`` otherwise) or ``"exact"``.
    max_steps
        Newton iterations at most (0: curvature at ``start`` only).
    tol
        Stop once every cell's Newton decrement ``g^T H^{-1} g / 2`` (the predicted gain
        in nats) is below ``tol``. A proposal needs no tighter mode: a decrement of
        1e-3 nats puts the centre about 0.05 posterior sd from the mode.
    fallback_precision
        Per-cell precision (cells, L, L) used along directions of non-positive curvature.

    Each step is halved (up to 30 times) where it would lower the log joint by more
    than its rounding error, so the log joint does not decrease. A cell stops when its
    decrement is below ``tol`` or a step gained less than ``tol`` (it sits at the optimum
    or on a kink of a ReLU decoder's log joint); only moving cells are evaluated.
    """
    derivatives = (
        gauss_newton_derivatives if hessian == "gauss-newton" and _supports_gauss_newton(module) else exact_derivatives
    )
    z = start.detach().clone()
    value, grad, neg_hess = derivatives(module, z, x, batch_index, log_library)
    active = torch.ones(z.shape[0], dtype=torch.bool, device=z.device)
    slack = 64 * torch.finfo(z.dtype).eps  # relative rounding of a log joint summed over genes
    steps = 0
    while steps < max_steps:
        idx = torch.nonzero(active).squeeze(1)
        fallback = None if fallback_precision is None else fallback_precision[idx]
        precision, _ = _patched_precision(neg_hess[idx], fallback)
        step = torch.linalg.solve(precision, grad[idx].unsqueeze(-1)).squeeze(-1)
        moving = 0.5 * (grad[idx] * step).sum(-1) >= tol  # Newton decrement: the predicted gain
        active[idx[~moving]] = False
        idx, step = idx[moving], step[moving]
        if idx.numel() == 0:
            break
        steps += 1
        xs, bs, ls, z0, v0 = x[idx], batch_index[idx], log_library[idx], z[idx], value[idx]
        scale = torch.ones_like(v0).unsqueeze(-1)
        with torch.no_grad():
            for _ in range(30):
                trial = z0 + scale * step
                trial_value = log_joint(module, trial, xs, bs, ls)
                worse = ~(trial_value >= v0 - slack * v0.abs())
                if not bool(worse.any()):
                    break
                scale = torch.where(worse.unsqueeze(-1), 0.5 * scale, scale)
            else:  # cells that cannot improve along the step stay put
                trial = torch.where(worse.unsqueeze(-1), z0, trial)
        new_value, new_grad, new_hess = derivatives(module, trial, xs, bs, ls)
        z[idx], value[idx], grad[idx], neg_hess[idx] = trial.detach(), new_value, new_grad, new_hess
        # a step that gained less than tol (a kink of a ReLU decoder, or the optimum) ends the search
        active[idx[~(new_value - v0 >= tol)]] = False
    precision, concave = _patched_precision(neg_hess, fallback_precision)
    step = torch.linalg.solve(precision, grad.unsqueeze(-1)).squeeze(-1)
    converged = 0.5 * (grad * step).sum(-1) < tol
    return ModeResult(z, precision, value, steps, converged, concave)


def precision_of(proposal: LocationScale) -> torch.Tensor:
    eye = torch.eye(proposal.loc.shape[-1], dtype=proposal.loc.dtype, device=proposal.loc.device)
    inv_tril = torch.linalg.solve_triangular(proposal.scale_tril, eye.expand_as(proposal.scale_tril), upper=False)
    return inv_tril.transpose(-1, -2) @ inv_tril


def mode_proposal(result: ModeResult, df: float) -> LocationScale:
    """Student-t (Gaussian for ``df = inf``) at the mode with scale matrix the inverse precision."""
    cov = torch.cholesky_inverse(torch.linalg.cholesky(result.precision))
    return LocationScale(result.mode, torch.linalg.cholesky(0.5 * (cov + cov.transpose(-1, -2))), df)


# ----- the estimator ------------------------------------------------------------------------------
@dataclass(frozen=True)
class EstimatorSpec:
    """One estimator configuration.

    ``guide_weight`` and ``prior_weight`` are the defensive mixture's shares; the rest
    goes to the mode proposal(s) (``kind="mode"`` with both 0 is the plain t-at-mode).
    Newton runs ``newton_steps`` at most, stopping at a decrement or gain below
    ``newton_tol`` nats, with the ``hessian`` curvature. With ``pilot_samples > 0``,
    that many draws (not counted in the estimate) rank starting points: Newton (at
    most ``explore_steps``) from each cell's ``mode_starts`` highest-weight pilot draws
    and from ``prior_starts`` N(0, I) points (only where the pilot's k-hat exceeds
    ``explore_khat``); the modes share the mode weight by Laplace mass mixed with
    ``mode_floor`` uniform. ``escalate``: a spec to redo cells with k-hat above
    ``escalate_khat``. With ``refit_samples > 0`` (two-stage adaptive IS), that many of the ``n_samples``
    draws come from the mixture, a t with their importance-weighted mean and
    covariance is added with share ``refit_weight`` (taken from the mode proposal),
    and only the remaining draws, from that new mixture, enter the estimate.
    """

    kind: str = "mixture"  # "guide" | "mode" | "mixture"
    n_samples: int = 1000
    df: float = 4.0
    guide_weight: float = 0.2
    prior_weight: float = 0.0
    hessian: str = "gauss-newton"  # or "exact"
    newton_steps: int = 20
    newton_tol: float = 1e-3
    refit_samples: int = 0
    refit_weight: float = 0.6
    refit_stages: int = 1
    pilot_samples: int = 0
    mode_starts: int = 0
    mode_floor: float = 0.2
    explore_steps: int = 5
    prior_starts: int = 0
    explore_khat: float = -math.inf
    escalate: EstimatorSpec | None = None
    escalate_khat: float = KHAT_THRESHOLD
    name: str = field(default="", compare=False)

    def label(self) -> str:
        """A short description for tables."""
        if self.name:
            return self.name
        if self.kind == "guide":
            return f"guide S={self.n_samples}"
        mix = f" +{self.guide_weight:g} guide" if self.guide_weight else ""
        mix += f" +{self.prior_weight:g} prior" if self.prior_weight else ""
        df = "Gauss" if not math.isfinite(self.df) else f"t{self.df:g}"
        refit = (
            f", refit {self.refit_weight:g} after {self.refit_stages}x{self.refit_samples}"
            if self.refit_samples
            else ""
        )
        multi = f", +{self.mode_starts} modes from {self.pilot_samples} pilot" if self.pilot_samples else ""
        if self.pilot_samples and self.prior_starts:
            multi += f" +{self.prior_starts} from N(0, I)"
        if self.pilot_samples:
            multi += f" ({self.explore_steps} steps, floor {self.mode_floor:g})"
        if self.escalate is not None:
            multi += f"; k-hat>{self.escalate_khat:g} cells redone with [{self.escalate.label()}]"
        if self.pilot_samples and math.isfinite(self.explore_khat):
            multi += f" where k-hat>{self.explore_khat:g}"
        return f"{df}@mode[{self.hessian}, {self.newton_steps} steps]{mix}{refit}{multi} S={self.n_samples}"


#: The recommended default (measured in benchmarks/lpd_accuracy.py, section lpd-accuracy of RESULTS.md).
RECOMMENDED = EstimatorSpec(
    kind="mixture",
    n_samples=1000,
    df=4.0,
    guide_weight=0.1,
    hessian="gauss-newton",
    newton_steps=20,
    pilot_samples=200,
    mode_starts=3,
    prior_starts=6,
    explore_steps=8,
    escalate=EstimatorSpec(
        n_samples=4000, guide_weight=0.1, pilot_samples=400, mode_starts=6, prior_starts=12, explore_steps=12
    ),
)


def _draws_and_weights(module, proposal, x, batch_index, log_library, n_samples, generator):
    """Draws (S, cells, L) and log importance weights (S, cells), in chunks of :data:`ELEMENTS_PER_CHUNK`."""
    z = proposal.sample(n_samples, generator)
    log_r = proposal.log_prob_for(z, n_samples) if isinstance(proposal, Mixture) else proposal.log_prob(z)
    per = max(1, ELEMENTS_PER_CHUNK // max(1, x.shape[0] * x.shape[1]))
    parts = [log_joint(module, z[s : s + per], x, batch_index, log_library) for s in range(0, n_samples, per)]
    return z, torch.cat(parts, dim=0) - log_r


def _weights(module, proposal, x, batch_index, log_library, n_samples, generator) -> torch.Tensor:
    return _draws_and_weights(module, proposal, x, batch_index, log_library, n_samples, generator)[1]


def more_modes(
    module, x, batch_index, log_library, z, log_w, spec, fallback, base: ModeResult, explore: torch.Tensor, generator
) -> list[ModeResult]:
    """Newton runs started from each cell's ``spec.mode_starts`` highest-weight pilot draws and from
    ``spec.prior_starts`` standard normal points.

    With a ReLU decoder the log joint is piecewise smooth and has several local
    maxima within a few posterior sd; a pilot draw of large weight lies in mass the
    first mode's proposal under-covers, and Newton from there finds its local mode.
    The encoder's mean can also sit in the basin of a local maximum tens of nats
    below the highest one (measured on pbmc_3tech), which no draw near it reveals;
    starts spread over the prior reach other basins. Only cells with ``explore`` set
    are searched; the others repeat ``base``.
    """
    order = torch.argsort(log_w, dim=0, descending=True)[: spec.mode_starts]  # (k, cells)
    cells = torch.arange(z.shape[1], device=z.device)
    starts = [z[order[j], cells] for j in range(order.shape[0])]
    starts += list(torch.randn((spec.prior_starts, *z.shape[1:]), generator=generator, dtype=z.dtype).to(z.device))
    idx = torch.nonzero(explore).squeeze(1)
    out = []
    for start in starts:
        mode, precision, value = base.mode.clone(), base.precision.clone(), base.log_joint.clone()
        converged, concave = base.converged.clone(), base.concave.clone()
        if idx.numel():
            r = find_mode(
                module,
                x[idx],
                batch_index[idx],
                log_library[idx],
                start[idx],
                hessian=spec.hessian,
                max_steps=spec.explore_steps,
                tol=spec.newton_tol,
                fallback_precision=fallback[idx],
            )
            mode[idx], precision[idx], value[idx] = r.mode, r.precision, r.log_joint
            converged[idx], concave[idx] = r.converged, r.concave
        out.append(ModeResult(mode, precision, value, spec.explore_steps, converged, concave))
    return out


def mode_shares(results: list[ModeResult], floor: float) -> torch.Tensor:
    """Per-cell mixture shares (K, cells) of the modes: their Laplace masses, mixed with ``floor`` uniform.

    The Laplace mass ``exp(f) det(H)^(-1/2)`` of a local maximum of a rugged log joint
    is only a rough guide to its share of the posterior, so every mode keeps at least
    ``floor / K``.
    """
    log_mass = torch.stack([r.log_joint - 0.5 * torch.logdet(r.precision) for r in results])
    share = torch.softmax(log_mass, dim=0)
    return (1.0 - floor) * share + floor / len(results)


#: Fewest effective draws from which a refitted covariance is trusted (else the mode's is kept).
MIN_REFIT_ESS = 20.0


def moment_proposal(z: torch.Tensor, log_w: torch.Tensor, df: float, fallback: LocationScale) -> LocationScale:
    """A t (or Gaussian) with the importance-weighted mean and covariance of draws ``z`` (S, cells, L).

    Weights are Pareto-smoothed (arviz) so one large weight cannot collapse the fit;
    cells with fewer than :data:`MIN_REFIT_ESS` effective draws keep ``fallback``.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        smoothed, _ = az.psislw(log_w.detach().double().cpu().numpy().T.copy(), normalize=True)
    w = torch.as_tensor(np.exp(smoothed).T, dtype=z.dtype, device=z.device)  # (S, cells)
    ess = 1.0 / (w**2).sum(0)
    mean = torch.einsum("sn,snl->nl", w, z)
    centred = z - mean
    cov = torch.einsum("sn,snk,snl->nkl", w, centred, centred)
    cov = 0.5 * (cov + cov.transpose(-1, -2))
    lam, vecs = torch.linalg.eigh(cov)
    lam = torch.clamp(lam, min=MIN_CURVATURE)
    tril = torch.linalg.cholesky((vecs * lam.unsqueeze(-2)) @ vecs.transpose(-1, -2))
    keep = (ess < MIN_REFIT_ESS).unsqueeze(-1)
    return LocationScale(
        torch.where(keep, fallback.loc, mean),
        torch.where(keep.unsqueeze(-1), fallback.scale_tril, tril),
        df,
    )


@torch.no_grad()
def estimate_log_marginal(
    module: torch.nn.Module,
    x: torch.Tensor,
    batch_index: torch.Tensor,
    spec: EstimatorSpec,
    generator: torch.Generator,
    return_log_weights: bool = False,
) -> dict[str, np.ndarray]:
    """Importance-sampled ``log p(x)`` of one minibatch of cells, with its reliability.

    Parameters
    ----------
    module
        The fitted Pyro module (eval mode is set here).
    x, batch_index
        Counts (cells, genes) in the module's dtype and batch codes (cells,).
    spec
        The estimator.
    generator
        Source of every random draw (same seed, same numbers).
    return_log_weights
        Also return the (samples, cells) log weights under ``"log_w"``.

    Returns
    -------
    dict
        ``lpd``, ``mc_se``, ``ess``, ``khat`` (see :func:`summarize_log_weights`) and, for
        proposals at the mode, ``newton_steps`` and per-cell ``converged`` and ``concave``.

    """
    module.eval()
    log_library = torch.log(x.sum(-1, keepdim=True))
    guide = guide_proposal(module, x, batch_index)
    extra: dict[str, np.ndarray] = {}
    if spec.kind == "guide":
        proposal: LocationScale | Mixture = guide
    else:
        result = find_mode(
            module,
            x,
            batch_index,
            log_library,
            guide.loc,
            hessian=spec.hessian,
            max_steps=spec.newton_steps,
            tol=spec.newton_tol,
            fallback_precision=precision_of(guide),
        )
        extra = {
            "newton_steps": np.full(x.shape[0], result.steps),
            "converged": result.converged.cpu().numpy(),
            "concave": result.concave.cpu().numpy(),
        }
        at_mode = mode_proposal(result, spec.df)
        components, weights = [at_mode], [1.0 - spec.guide_weight - spec.prior_weight]
        if spec.kind == "mixture" and spec.guide_weight > 0:
            components.append(guide)
            weights.append(spec.guide_weight)
        prior = prior_proposal(module, x) if spec.kind == "mixture" and spec.prior_weight > 0 else None
        if prior is not None:
            components.append(prior)
            weights.append(spec.prior_weight)
        proposal = at_mode if len(components) == 1 else Mixture(components, weights)
        if spec.pilot_samples:
            zp, lwp = _draws_and_weights(module, proposal, x, batch_index, log_library, spec.pilot_samples, generator)
            pilot_khat = torch.as_tensor(summarize_log_weights(lwp)["khat"])
            explore = ~(pilot_khat < spec.explore_khat)  # NaN/inf k-hat: explore
            found = more_modes(
                module,
                x,
                batch_index,
                log_library,
                zp,
                lwp,
                spec,
                precision_of(guide),
                result,
                explore.to(x.device),
                generator,
            )
            extra["explored"] = explore.cpu().numpy()
            shares = mode_shares([result, *found], spec.mode_floor)
            components = [*(mode_proposal(r, spec.df) for r in [result, *found]), *components[1:]]
            weights = [shares[k] * weights[0] for k in range(len(found) + 1)] + weights[1:]
            proposal = Mixture(components, weights)
            extra["best_mode_gain"] = (
                (torch.stack([r.log_joint for r in found]).max(0).values - result.log_joint).cpu().numpy()
            )
        stages = (spec.refit_samples,) * spec.refit_stages if spec.refit_samples else ()
        for n_stage in stages:
            z1, log_w1 = _draws_and_weights(module, proposal, x, batch_index, log_library, n_stage, generator)
            refit = moment_proposal(z1, log_w1, spec.df, fallback=at_mode)
            proposal = Mixture([refit, *components], [spec.refit_weight, weights[0] - spec.refit_weight, *weights[1:]])
            extra["refit_ess"] = summarize_log_weights(log_w1)["ess"]
    spent = spec.refit_samples * spec.refit_stages + spec.pilot_samples
    n_final = spec.n_samples - (spent if spec.kind != "guide" else 0)
    log_w = _weights(module, proposal, x, batch_index, log_library, n_final, generator)
    out = {**summarize_log_weights(log_w), **extra}
    if return_log_weights:
        out["log_w"] = log_w.cpu().numpy()
    if spec.escalate is not None:
        redo = ~(out["khat"] <= spec.escalate_khat)  # NaN k-hat is redone too
        out["escalated"] = redo
        out["first_khat"] = out["khat"]
        if redo.any():
            rows = torch.as_tensor(np.nonzero(redo)[0], device=x.device)
            again = estimate_log_marginal(module, x[rows], batch_index[rows], spec.escalate, generator)
            for key in ("lpd", "mc_se", "ess", "khat"):
                out[key] = out[key].copy()
                out[key][redo] = again[key]
    return out


# ----- annealed importance sampling (an independent reference) ------------------------------------
def sigmoid_schedule(n_temps: int, sharpness: float = 4.0) -> torch.Tensor:
    """Inverse temperatures from 0 to 1 (Grosse et al. 2015's sigmoid schedule)."""
    t = torch.sigmoid(sharpness * torch.linspace(-1.0, 1.0, n_temps + 1, dtype=torch.float64))
    return (t - t[0]) / (t[-1] - t[0])


@torch.no_grad()
def ais_log_marginal(
    module: torch.nn.Module,
    x: torch.Tensor,
    batch_index: torch.Tensor,
    start: LocationScale,
    generator: torch.Generator,
    n_chains: int = 16,
    n_temps: int = 100,
    n_leapfrog: int = 5,
    step_size: float = 0.3,
    target_accept: float = 0.65,
) -> dict[str, np.ndarray]:
    """Annealed importance sampling of ``log p(x)`` from a Gaussian start with HMC transitions.

    The chains move in whitened coordinates ``u`` (``z = loc + scale_tril u``, start
    ``N(0, I)``) along the geometric path ``N(u)^(1 - b) (p(x, z(u)) |det scale|)^b``,
    one HMC step of ``n_leapfrog`` leapfrog steps per temperature; each cell's step
    size is adapted towards ``target_accept`` from the previous acceptance rate (as
    in Wu et al. 2017). ``log mean_c w_c`` over chains is unbiased for ``p(x)`` in
    the ``exp`` scale for fixed step sizes; adaptation makes this approximate.

    Returns ``lpd``, ``mc_se``, ``ess`` (over chains) and the mean acceptance rate.
    """
    module.eval()
    log_library = torch.log(x.sum(-1, keepdim=True))
    n, L = start.loc.shape
    dtype = start.loc.dtype
    log_det = torch.log(torch.diagonal(start.scale_tril, dim1=-2, dim2=-1)).sum(-1)
    betas = sigmoid_schedule(n_temps).to(dtype)

    def log_target(u):  # log p(x, z(u)) |det scale| and its gradient in u
        with torch.enable_grad():
            uu = u.detach().requires_grad_(True)
            z = start.loc + torch.einsum("nij,cnj->cni", start.scale_tril, uu)
            value = log_joint(module, z, x, batch_index, log_library) + log_det
            (grad,) = torch.autograd.grad(value.sum(), uu)
        return value.detach(), grad

    u = torch.randn((n_chains, n, L), generator=generator, dtype=dtype)
    f, gf = log_target(u)
    log_w = torch.zeros(n_chains, n, dtype=dtype)
    eps = torch.full((n,), step_size, dtype=dtype)
    accepted = []
    for k in range(1, n_temps + 1):
        log_w += (betas[k] - betas[k - 1]) * (f + 0.5 * (u**2).sum(-1) + 0.5 * L * math.log(2 * math.pi))
        beta = betas[k]

        def energy(uu, ff, beta=beta):
            return -((1 - beta) * (-0.5 * (uu**2).sum(-1)) + beta * ff)

        def grad_log_pi(uu, gg, beta=beta):
            return -(1 - beta) * uu + beta * gg

        p0 = torch.randn((n_chains, n, L), generator=generator, dtype=dtype)
        e = eps.view(1, n, 1)
        uu, ff, gg = u, f, gf
        p = p0 + 0.5 * e * grad_log_pi(uu, gg)
        for i in range(n_leapfrog):
            uu = uu + e * p
            ff, gg = log_target(uu)
            if i < n_leapfrog - 1:
                p = p + e * grad_log_pi(uu, gg)
        p = p + 0.5 * e * grad_log_pi(uu, gg)
        log_accept = energy(u, f) + 0.5 * (p0**2).sum(-1) - energy(uu, ff) - 0.5 * (p**2).sum(-1)
        log_accept = torch.nan_to_num(log_accept, nan=-math.inf)
        accept = torch.log(torch.rand((n_chains, n), generator=generator, dtype=dtype)) < log_accept
        u = torch.where(accept.unsqueeze(-1), uu, u)
        f = torch.where(accept, ff, f)
        gf = torch.where(accept.unsqueeze(-1), gg, gf)
        rate = accept.to(dtype).mean(0)
        eps = eps * torch.where(rate > target_accept, 1.02, 0.98).to(dtype)
        accepted.append(rate)
    out = summarize_log_weights(log_w)
    out["accept"] = torch.stack(accepted).mean(0).cpu().numpy()
    return out
