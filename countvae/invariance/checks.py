"""The checks of :func:`countvae.invariance.verify`, one small function each.

A map check takes a :class:`~countvae.invariance.evaluation.MapComparison` (a
model, its reparameterization by a latent map ``A``, and whether theory says
``p(x)`` is unchanged) and returns :class:`Measurement` rows; a check that does
not apply to the comparison returns no rows. A measurement with
``expect="equal"`` passes when its value is at most the threshold, one with
``expect="differs"`` when it is above it, and ``expect="report"`` carries no
verdict. To replace a check, write a function with the same signature and put
it in :data:`MAP_CHECKS` (or :data:`FITTED_MAP_CHECKS`) in its place.

1. :func:`common_random_numbers`: both models see the same base noise, so for a
   map that preserves the prior every importance weight is equal, and so is the
   estimate (float64: within 1e-9 nats per cell).
2. :func:`independent_draws`: the mean difference over cells in units of its
   standard error, and the spread of per-cell differences in units of their own
   standard errors.
3. :func:`pointwise`: ``log p(x | z)`` of the original equals ``log p'(x | A z)`` of
   the transformed model at sampled ``z`` for every invertible map (the decoder is
   compensated); ``log p(A z)`` equals ``log p(z)`` only for maps that preserve the prior.
4. :func:`output_changes`: which model outputs change (see :mod:`countvae.invariance.outputs`).
5. :func:`control_change`: a map that does not preserve the prior must change
   ``p(x)`` beyond Monte Carlo error, measured with common noise at two seeds.

:func:`exact_quadrature` compares exact ``log p(x)`` where quadrature applies,
:func:`elbo_geometry` reports the ELBO of mean-field guides (not
rotation-invariant: the "near" in near-identifiability), and
:func:`estimator_accuracy` compares the importance-sampling estimate with
quadrature for one model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
import torch

from countvae.invariance.elbo_geometry import cell_chunks, elbo_comparison
from countvae.invariance.evaluation import EvaluatedModel, MapComparison
from countvae.invariance.outputs import output_changes as compare_outputs
from countvae.model.training import to_tensors
from countvae.module.vae import log_library_size, sample_latent

Expect = Literal["equal", "differs", "report"]


@dataclass(frozen=True)
class Measurement:
    """One measured number, with what theory expects of it.

    Attributes
    ----------
    check
        Name of the measurement (see :data:`countvae.invariance.result.CHECK_DESCRIPTIONS`).
    value
        The number.
    threshold
        The threshold it is judged against, or ``None``.
    expect
        ``"equal"`` (at most the threshold), ``"differs"`` (above it) or ``"report"`` (no verdict).

    """

    check: str
    value: float
    threshold: float | None = None
    expect: Expect = "report"

    @property
    def ok(self) -> bool | None:
        """Whether the value agrees with the expectation (``None`` for ``"report"``)."""
        if self.expect == "equal":
            return bool(abs(self.value) <= self.threshold)
        if self.expect == "differs":
            return bool(abs(self.value) > self.threshold)
        return None


MapCheck = Callable[[MapComparison], list[Measurement]]


def _equal_if(invariant: bool) -> Expect:
    return "equal" if invariant else "report"


def crn_tolerance(c: MapComparison) -> float:
    """Tolerance of a common-noise difference: absolute plus relative to the largest ``|log p(x)|``."""
    tol = c.settings.tolerances
    return tol["abs"] + tol["rel"] * float(np.abs(c.original.lpd(c.settings.seed)["lpd"]).max())


# ----- 1. common random numbers --------------------------------------------------------------------
def common_random_numbers(c: MapComparison) -> list[Measurement]:
    """Largest per-cell ``|log p(x)|`` difference when both models use the same base noise."""
    seed = c.settings.seed
    diff = np.abs(c.transformed.lpd(seed)["lpd"].to_numpy() - c.original.lpd(seed)["lpd"].to_numpy())
    return [Measurement("crn_max_abs_diff", diff.max(), crn_tolerance(c), _equal_if(c.invariant))]


# ----- 2. independent draws ------------------------------------------------------------------------
def z_statistics(base: pd.DataFrame, other: pd.DataFrame) -> tuple[float, float, float]:
    """Mean difference, its z-score, and the robust spread of per-cell z-scores (about 1 if equal).

    The two estimates of each cell use independent noise, so when the models are
    equal the per-cell differences are Monte Carlo noise with mean zero; the
    standard error of their mean is taken from their spread across cells (a
    paired comparison), which stays valid when the importance sampler's own
    per-cell standard error is too small (few effective samples). The spread is
    ``median_i |d_i| / sqrt(se_i^2 + se'_i^2) / 0.674``: about 1 when the models
    are equal, large when most cells change by more than their MC error.
    """
    diff = other["lpd"].to_numpy() - base["lpd"].to_numpy()
    n = len(diff)
    se_mean = float(diff.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0
    if se_mean > 0:
        z_mean = float(diff.mean() / se_mean)
    else:
        z_mean = 0.0 if diff.mean() == 0 else math.copysign(math.inf, diff.mean())
    var = base["mc_se"].to_numpy() ** 2 + other["mc_se"].to_numpy() ** 2
    per_cell = np.abs(diff) / np.sqrt(np.maximum(var, 1e-300))
    return float(diff.mean()), z_mean, float(np.median(per_cell) / 0.6744897501960817)


def independent_draws(c: MapComparison) -> list[Measurement]:
    """The transformed model at ``seed + 1`` against the original at ``seed``: mean difference and z-scores."""
    seed = c.settings.seed
    mean_diff, z_mean, z_spread = z_statistics(c.original.lpd(seed), c.transformed.lpd(seed + 1))
    return [
        Measurement("mc_mean_diff", mean_diff),
        Measurement("mc_z_mean", z_mean, c.settings.z_threshold, _equal_if(c.invariant)),
        Measurement("mc_z_spread", z_spread),
    ]


# ----- 5. controls ---------------------------------------------------------------------------------
def replication_ratio(first: np.ndarray, second: np.ndarray) -> float:
    """``median |(d1 + d2) / 2| / median |(d1 - d2) / 2|`` of two independent common-noise differences.

    Each ``d`` estimates the per-cell change of ``log p(x)`` with its own base
    noise. Their half-sum is the change, their half-difference is Monte Carlo
    error alone; for independent, identically distributed symmetric errors the
    two have the same distribution when nothing changed, so the ratio is about 1,
    and it grows with the change measured in units of its Monte Carlo error.
    """
    noise = float(np.median(np.abs(first - second) / 2.0))
    signal = float(np.median(np.abs(first + second) / 2.0))
    if noise == 0.0:
        return math.inf if signal > 0 else 0.0
    return signal / noise


def control_change(c: MapComparison) -> list[Measurement]:
    """For a map that does not preserve the prior: the change of ``log p(x)`` in units of its MC error."""
    if c.invariant:
        return []
    seed = c.settings.seed
    lpd0, lpd1 = c.original, c.transformed
    ratio = replication_ratio(
        lpd1.lpd(seed)["lpd"].to_numpy() - lpd0.lpd(seed)["lpd"].to_numpy(),
        lpd1.lpd(seed + 1)["lpd"].to_numpy() - lpd0.lpd(seed + 1)["lpd"].to_numpy(),
    )
    return [Measurement("crn_change_ratio", ratio, c.settings.change_threshold, "differs")]


# ----- 3. pointwise --------------------------------------------------------------------------------
@torch.no_grad()
def pointwise_differences(c: MapComparison) -> tuple[float, float, float]:
    """Max |log p(x|z) - log p'(x|Az)|, max |log p(z) - log p'(Az)| at posterior draws, and the largest |log p(x|z)|."""
    original, transformed = c.original.model, c.transformed.model
    m0, m1 = original.module.eval(), transformed.module.eval()
    dtype = next(m0.parameters()).dtype
    At = torch.as_tensor(c.A, dtype=dtype, device=original.device)
    gen = torch.Generator().manual_seed(c.settings.seed)
    worst_ll, worst_prior, scale = 0.0, 0.0, 0.0
    for _, mb in cell_chunks(c.original.cells.source, c.original.cells.indices):
        x, b = to_tensors(mb, dtype, original.device)
        loc, sd = m0.encode(x, b)
        eps = torch.randn((c.settings.n_pointwise, *loc.shape), generator=gen, dtype=dtype).to(loc.device)
        z = sample_latent(loc, sd, eps)
        z_t = z @ At.T
        log_library = log_library_size(x)
        ll0 = m0.conditional(z, log_library, b).log_prob(x)
        ll1 = m1.conditional(z_t, log_library, b).log_prob(x)
        lp0 = m0.prior.distribution(x.shape[0], x).log_prob(z)
        lp1 = m1.prior.distribution(x.shape[0], x).log_prob(z_t)
        worst_ll = max(worst_ll, float((ll0 - ll1).abs().max()))
        worst_prior = max(worst_prior, float((lp0 - lp1).abs().max()))
        scale = max(scale, float(ll0.abs().max()))
    return worst_ll, worst_prior, scale


def pointwise(c: MapComparison) -> list[Measurement]:
    """The conditional likelihood at matched draws is unchanged; the prior density only if the map preserves it."""
    tol = c.settings.tolerances
    ll_diff, prior_diff, ll_scale = pointwise_differences(c)
    return [
        Measurement("pointwise_loglik_max_abs_diff", ll_diff, tol["abs"] + tol["rel"] * ll_scale, "equal"),
        Measurement(
            "prior_max_abs_diff", prior_diff, tol["abs"] + tol["rel"] * 10.0, "equal" if c.invariant else "differs"
        ),
    ]


# ----- exact reference ------------------------------------------------------------------------------
def exact_quadrature(c: MapComparison) -> list[Measurement]:
    """Exact ``log p(x)`` of both models by quadrature (where it applies): equal, or different for a control."""
    quad0 = c.original.quadrature
    if quad0 is None:
        return []
    tol = c.settings.tolerances
    quad_diff = c.transformed.quadrature - quad0
    quad_tol = tol["quad_abs"] + tol["quad_rel"] * float(np.abs(quad0).max())
    return [
        Measurement(
            "quadrature_max_abs_diff",
            np.abs(quad_diff).max(),
            quad_tol if c.invariant else 10 * quad_tol,
            "equal" if c.invariant else "differs",
        ),
        Measurement("quadrature_mean_diff", quad_diff.mean()),
    ]


# ----- 4. outputs ----------------------------------------------------------------------------------
def output_changes(c: MapComparison) -> list[Measurement]:
    """How much each output changes: invariant ones must not, coordinate-level ones are reported."""
    changes = compare_outputs(c.original.outputs, c.transformed.outputs, c.A)
    tol = c.settings.tolerances["output"]
    rows = [
        Measurement(check, changes[check], tol, "equal")
        for check in ("latent_map_max_abs_error", "normalized_expression_max_rel_diff")
    ]
    for check in ("pairwise_distance_max_rel_diff", "knn_graph_changed_fraction", "loading_gram_max_rel_diff"):
        if check in changes:
            threshold = 1e-3 if check == "knn_graph_changed_fraction" else tol
            rows.append(Measurement(check, changes[check], threshold, "equal" if c.orthogonal else "report"))
    for check in ("coordinates_rel_change", "loadings_rel_change", "gene_correlation_max_abs_change"):
        rows.append(Measurement(check, changes[check]))
    return rows


# ----- ELBO geometry --------------------------------------------------------------------------------
def elbo_geometry(c: MapComparison) -> list[Measurement]:
    """For an orthogonal map: the ELBO with the pushed-forward guide (exact), its mean-field projection, a refit."""
    if not c.orthogonal:
        return []
    s = c.settings
    cells = c.original.cells
    elbo = elbo_comparison(
        c.original.model, c.transformed.model, c.A, cells.source, cells.elbo_indices, s.n_elbo_samples, s.seed
    )
    rows = [
        Measurement(
            "elbo_pushforward_max_abs_diff",
            elbo["elbo_pushforward_max_abs_diff"],
            crn_tolerance(c),
            _equal_if(c.invariant),
        )
    ]
    rows += [
        Measurement(name, elbo[name])
        for name in ("elbo_original_mean", "elbo_projected_mean", "elbo_projected_mean_diff", "elbo_projected_z")
    ]
    if s.elbo_refit_steps > 0:
        refit0, refit0_se = c.original.refit_elbo
        refit, refit_se = c.transformed.refit_elbo
        diff = refit - refit0
        pooled = math.sqrt(float((refit_se**2 + refit0_se**2).sum())) / len(diff)
        rows += [
            Measurement("elbo_refit_original_mean", refit0.mean()),
            Measurement("elbo_refit_transformed_mean", refit.mean()),
            Measurement("elbo_refit_mean_diff", diff.mean()),
            Measurement("elbo_refit_z", diff.mean() / pooled if pooled > 0 else 0.0),
        ]
    return rows


# ----- one model ----------------------------------------------------------------------------------
def estimator_accuracy(model: EvaluatedModel) -> list[Measurement]:
    """The package's ``log p(x)`` estimator against exact quadrature, for one model (where quadrature applies)."""
    quad = model.quadrature
    if quad is None:
        return []
    lpd = model.lpd(model.settings.seed, method="mixture")
    err = lpd["lpd"].to_numpy() - quad
    covered = np.abs(err) <= 4 * lpd["mc_se"].to_numpy() + 0.01
    return [Measurement("is_minus_quadrature_mean", err.mean()), Measurement("is_within_4se_fraction", covered.mean())]


#: The checks made for every model variant and map, in the order of their rows.
MAP_CHECKS: tuple[MapCheck, ...] = (
    common_random_numbers,
    independent_draws,
    control_change,
    pointwise,
    exact_quadrature,
)

#: The checks made for the fitted model only (not the prior controls), after :data:`MAP_CHECKS`.
FITTED_MAP_CHECKS: tuple[MapCheck, ...] = (output_changes, elbo_geometry)
