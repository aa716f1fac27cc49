"""The checks of :func:`countvae.invariance.verify`, one small function each, and what each can catch.

A map check takes a :class:`~countvae.invariance.evaluation.MapComparison` (a model, its reparameterization by a
latent map ``A``, and whether theory says ``p(x)`` is unchanged) and returns :class:`Measurement` rows, none when it
does not apply. To replace a check, put a function with the same signature in its place in :data:`MAP_CHECKS` (or
:data:`FITTED_MAP_CHECKS`).

Checks whose agreement follows from the code's own algebra (they catch a wrong rewrite, not a wrong ``p(x)``):

1. :func:`common_random_numbers`: both models see the same base noise through the guide, so for a map that preserves
   the prior every importance weight is equal.
2. :func:`pointwise`: ``log p(x | z)`` of the original equals ``log p'(x | A z)`` of the transformed model;
   ``log p(A z)`` equals ``log p(z)`` only for maps that preserve the prior.
3. :func:`output_changes`: which model outputs change (see :mod:`countvae.invariance.outputs`).

Checks whose agreement is numerical evidence about ``p(x)`` itself (the two models are evaluated by computations that
are not images of each other):

4. :func:`independent_draws`: the package's estimator on the original (at ``seed``) and on the transformed model (at
   ``seed + 1``), judged against the reported standard errors.
5. :func:`own_proposal`: the transformed model's estimate from a proposal built from its own log joint alone (the
   prior in place of the guide, ``seed + 2``), against the original.
6. :func:`exact_quadrature`: exact ``log p(x)`` of both models on product grids along each model's own axes
   (:mod:`countvae.invariance.grid_quadrature`), to the grids' convergence tolerance.
7. :func:`control_change`: a map that does not preserve the prior must change ``log p(x)`` by more than the
   estimators' reported error; a control that does not is inconclusive (the result "not verified"), not a failure.

Checks of the evidence itself, per model (rows with transform ``"(none)"``): :func:`estimator_reliability` (k-hat
and ESS), :func:`estimator_accuracy` (the estimator against exact quadrature) and :func:`quadrature_convergence`.
When one of them fails, ``verify`` says "not verified" and why (``EVIDENCE_CHECKS`` in
:mod:`countvae.invariance.result`). :func:`elbo_geometry` reports the ELBO of mean-field guides (not
rotation-invariant: the "near" in near-identifiability).
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
from countvae.module.importance import estimate_reliability
from countvae.module.vae import log_library_size, sample_latent

Expect = Literal["equal", "differs", "at_least", "report"]


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
        ``"equal"`` (``|value|`` at most the threshold), ``"differs"`` (``value`` above it: a change's size, or
        ``control_z``, whose chi-square is negative, down to ``-sqrt(n / 2)``, when nothing changed), ``"at_least"``
        (``value`` at least the threshold) or ``"report"`` (no verdict).

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
            return bool(self.value > self.threshold)
        if self.expect == "at_least":
            return bool(self.value >= self.threshold)
        return None


MapCheck = Callable[[MapComparison], list[Measurement]]


def _equal_if(invariant: bool) -> Expect:
    return "equal" if invariant else "report"


def crn_tolerance(c: MapComparison) -> float:
    """Tolerance of a common-noise difference: absolute plus relative to the largest ``|log p(x)|``."""
    tol = c.settings.tolerances
    return tol["abs"] + tol["rel"] * float(np.abs(c.original.guide_lpd(c.settings.seed)["lpd"]).max())


# ----- 1. common random numbers --------------------------------------------------------------------
def common_random_numbers(c: MapComparison) -> list[Measurement]:
    """Largest per-cell ``|log p(x)|`` difference when both models use the same base noise (guide proposal).

    The transformed model's guide is the original's pushed forward, so its draw ``s`` is ``A`` times the original's, and
    for a map that preserves the prior every importance weight, hence the estimate, is equal up to rounding (float64:
    1e-9 nats). Catches: any error in the rewrite of the decoder, the guide or the prior density that changes a single
    weight, and a prior that is not invariant under the map (a non-isotropic prior under a rotation). Cannot catch:
    anything both models share (an error in the log joint, the importance sampler's bias or variance, a map never
    applied): it compares the code with itself, so agreement here is no evidence that ``p(x)`` is estimated correctly.
    """
    seed = c.settings.seed
    diff = np.abs(c.transformed.guide_lpd(seed)["lpd"].to_numpy() - c.original.guide_lpd(seed)["lpd"].to_numpy())
    return [Measurement("crn_max_abs_diff", diff.max(), crn_tolerance(c), _equal_if(c.invariant))]


# ----- independent estimates -------------------------------------------------------------------
def paired_statistics(base: pd.DataFrame, other: pd.DataFrame) -> dict[str, float]:
    """Two independent estimates of each cell's ``log p(x)`` compared against their reported standard errors.

    With ``d_i`` the per-cell difference (``other - base``) and ``s_i = sqrt(se_i^2 + se'_i^2)`` its reported standard
    error: the mean difference, ``z_mean = mean d / (sqrt(sum s_i^2) / n)``, the fraction of cells with
    ``|d_i| > 4 s_i``, and ``z_cells = (sum (d_i / s_i)^2 - n) / sqrt(2 n)``, the standardized chi-square of the
    per-cell differences (about N(0, 1) when nothing changed and the standard errors are right; large when cells
    change by more than their errors, whatever the signs). Cells where either estimate has no standard error
    (unreliable) are left out of the z statistics; their share is judged by :func:`estimator_reliability`.
    """
    diff = other["lpd"].to_numpy() - base["lpd"].to_numpy()
    se = np.sqrt(base["mc_se"].to_numpy() ** 2 + other["mc_se"].to_numpy() ** 2)
    usable = np.isfinite(se) & np.isfinite(diff)
    d, s = diff[usable], se[usable]
    n = len(d)
    if n == 0:
        return {
            "mean_diff": float(np.nanmean(diff)),
            "z_mean": math.inf,
            "z_cells": math.inf,
            "outside_4se": 1.0,
            "n": 0,
        }
    se_mean = math.sqrt(float((s**2).sum())) / n
    mean = float(d.mean())
    if se_mean > 0:
        z_mean = mean / se_mean
    else:
        z_mean = 0.0 if mean == 0 else math.copysign(math.inf, mean)
    outside = float(np.mean(np.abs(d) > 4 * s))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(s > 0, d / s, np.where(d == 0, 0.0, np.inf))
    z_cells = float(((z**2).sum() - n) / math.sqrt(2 * n))
    return {"mean_diff": mean, "z_mean": z_mean, "z_cells": z_cells, "outside_4se": outside, "n": n}


def pair_unreliable_fraction(base: pd.DataFrame, other: pd.DataFrame, min_ess: float) -> float:
    """Share of cells where either of two estimates is unreliable (the rule of ``estimate_reliability``)."""
    bad = estimate_reliability(base, min_ess).unreliable | estimate_reliability(other, min_ess).unreliable
    return float(bad.mean())


def _compare(prefix: str, c: MapComparison, base: pd.DataFrame, other: pd.DataFrame) -> list[Measurement]:
    s = c.settings
    stats = paired_statistics(base, other)
    expect = _equal_if(c.invariant)
    unreliable = pair_unreliable_fraction(base, other, s.min_ess)
    return [
        Measurement(f"{prefix}_unreliable_fraction", unreliable, s.max_unreliable_fraction, "equal"),
        Measurement(f"{prefix}_mean_diff", stats["mean_diff"]),
        Measurement(f"{prefix}_z_mean", stats["z_mean"], s.z_threshold, expect),
        Measurement(f"{prefix}_outside_4se_fraction", stats["outside_4se"], s.max_unreliable_fraction, expect),
    ]


def independent_draws(c: MapComparison) -> list[Measurement]:
    """The package's estimator on the original (``seed``) and the transformed model (``seed + 1``).

    The transformed model's proposal is built in its own coordinates (Newton from its guide's mean, Student-t scale
    matrices factored there and, where the posterior may have several modes, restarts from standard normal points),
    so its draws are not images of the original's and the two estimates share no random numbers. Catches: a
    transformed model whose ``p(x)`` differs from the original's by more than the reported Monte Carlo error, and
    reported standard errors too small for the actual spread (then ``*_outside_4se_fraction`` is large). Cannot
    catch: an error common to both models' log joint, or a bias shared by the estimator on both.
    """
    seed = c.settings.seed
    if not c.invariant:
        return []
    return _compare("indep", c, c.original.lpd(seed), c.transformed.lpd(seed + 1))


def own_proposal(c: MapComparison) -> list[Measurement]:
    """The transformed model's ``log p(x)`` from a proposal built from the transformed model alone.

    The estimator runs on the transformed model with the prior ``N(0, I)`` in place of the guide (whose rewrite is
    derived from the original's encoder), so the posterior modes are found by Newton from the origin (and random
    restarts where the posterior may have several modes) in the transformed coordinates, with an independent seed
    (``seed + 2``); compared with the original's estimate against the reported standard errors. Catches: a rewrite whose
    guide compensates a wrong decoder (the common-random-number check compares the two rewrites with each other), and a
    ``p(x)`` that the original's guide cannot find. Cannot catch: an error in the log joint that both models share.
    """
    if not c.invariant:
        return []
    seed = c.settings.seed
    return _compare("own", c, c.original.lpd(seed), c.transformed.lpd(seed + 2, "prior"))


# ----- controls ------------------------------------------------------------------------------------
def control_change(c: MapComparison) -> list[Measurement]:
    """For a map that does not preserve the prior: the change of ``log p(x)`` in units of its reported error.

    From the per-cell differences ``d_i`` of the package's estimator on the transformed (``seed + 1``) and the
    original model (``seed``) with reported standard errors ``s_i`` (:func:`paired_statistics`): ``control_z`` is the
    standardized chi-square ``(sum (d_i / s_i)^2 - n) / sqrt(2 n)``, about 0 when nothing changed; the control is
    detected when it exceeds ``change_threshold``. A chi-square rather than the mean, because a control can raise
    ``p(x)`` for some cells and lower it for others (an axis scaling does). The mean change in its standard errors and
    the share of cells changed by more than 4 ``s_i`` are reported. Catches: checks that cannot tell an invariant from
    a non-invariant map (a test that passes whatever the map). Cannot catch: a control whose change is smaller than
    the Monte Carlo error. The change shrinks as the posterior widens towards the prior (a briefly trained or
    overdispersed NB/ZINB model), most for a Laplace prior under a rotation (same mean and covariance: only higher
    moments differ); such a control is inconclusive, not a disagreement with the theory, and the result is then "not
    verified", with the reason (``INCONCLUSIVE_CHECKS`` in :mod:`countvae.invariance.result`).
    """
    if c.invariant:
        return []
    s = c.settings
    base, other = c.original.lpd(s.seed), c.transformed.lpd(s.seed + 1)
    stats = paired_statistics(base, other)
    unreliable = pair_unreliable_fraction(base, other, s.min_ess)
    return [
        Measurement("control_unreliable_fraction", unreliable, s.max_unreliable_fraction, "equal"),
        Measurement("control_mean_diff", stats["mean_diff"]),
        Measurement("control_z_mean", stats["z_mean"]),
        Measurement("control_z", stats["z_cells"], s.change_threshold, "differs"),
        Measurement("control_outside_4se_fraction", stats["outside_4se"]),
    ]


# ----- pointwise --------------------------------------------------------------------------------
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
    """The conditional likelihood at matched draws is unchanged; the prior density only if the map preserves it.

    Catches: a decoder rewrite that is not the exact compensation of ``A`` (for every invertible map), and a prior whose
    invariance contradicts the theory. Cannot catch: anything about the integral ``p(x)``; it is algebra at points.
    """
    tol = c.settings.tolerances
    ll_diff, prior_diff, ll_scale = pointwise_differences(c)
    return [
        Measurement("pointwise_loglik_max_abs_diff", ll_diff, tol["abs"] + tol["rel"] * ll_scale, "equal"),
        Measurement(
            "prior_max_abs_diff", prior_diff, tol["abs"] + tol["rel"] * 10.0, "equal" if c.invariant else "differs"
        ),
    ]


# ----- exact reference ------------------------------------------------------------------------------
def quadrature_agreement_tolerance(c: MapComparison) -> float:
    """What two converged axis-aligned quadratures of equal ``p(x)`` may differ by.

    Each is within its tolerance of the integral (the last doubling changed it by
    less), plus rounding relative to ``|log p(x)|``: float64 summation's, or in float32 the rounding of the model
    itself (the rotated weights ``W Q^T`` are float32 numbers, so the two models' ``p(x)`` differ by about 1e-6
    nats), held to the float32 equality tolerance of the other checks.
    """
    quad = c.original.quadrature
    scale = float(np.abs(quad.log_marginal).max()) if len(quad.log_marginal) else 0.0
    if c.settings.dtype == torch.float64:
        return 2.0 * c.settings.quadrature_tolerance + 1e-13 * scale
    tol = c.settings.tolerances
    return 2.0 * c.settings.quadrature_tolerance + tol["abs"] + tol["rel"] * scale


def exact_quadrature(c: MapComparison) -> list[Measurement]:
    """Exact ``log p(x)`` of both models on axis-aligned grids (where quadrature applies).

    Each model is integrated on a product grid along its own latent axes (:func:`countvae.invariance.grid_quadrature`),
    so a model and its rotated copy are evaluated at different nodes and agree only if their integrals do. For a map
    that preserves the prior the values must agree to the grids' accuracy (twice the convergence tolerance); a control
    must differ by more than 100 times that. Catches: any difference of ``p(x)`` above about 1e-8 nats per cell,
    without Monte Carlo error and without the guide. Cannot catch: errors in the likelihood formula that both models
    share (the quadrature reimplements the linear Poisson/NB log joint; that formula is tested against the module's
    log joint elsewhere).
    """
    quad0, quad1 = c.original.quadrature, c.transformed.quadrature
    if quad0 is None or quad1 is None:
        return []
    diff = quad1.log_marginal - quad0.log_marginal
    tolerance = quadrature_agreement_tolerance(c)
    return [
        Measurement(
            "quadrature_max_abs_diff",
            np.abs(diff).max(),
            tolerance if c.invariant else 100 * tolerance,
            "equal" if c.invariant else "differs",
        ),
        Measurement("quadrature_mean_diff", diff.mean()),
        Measurement("quadrature_transformed_change", quad1.max_change, c.settings.quadrature_tolerance, "equal"),
        Measurement("quadrature_transformed_nodes", float(quad1.nodes_per_axis.max())),
    ]


# ----- outputs ----------------------------------------------------------------------------------
def output_changes(c: MapComparison) -> list[Measurement]:
    """How much each output changes: invariant ones must not, coordinate-level ones are reported.

    Catches: a rewrite that changes decoded expression, or (orthogonal maps) latent distances, neighbour graphs or
    ``W W^T``; and a map never applied (the coordinate-level changes are then zero, which the report shows). Cannot
    catch: anything about ``p(x)``; these are the model's outputs at the posterior means.
    """
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
    """For an orthogonal map: the ELBO with the pushed-forward guide (exact), its mean-field projection, a refit.

    The pushed-forward full-covariance guide gives the same ELBO with the same noise (algebra, like the
    common-random-number check); the mean-field projection and the per-cell refit are reported, not judged: they
    show how much a mean-field guide prefers some coordinates (the "near" in near-identifiability).
    """
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


# ----- the evidence, per model ------------------------------------------------------------------------
def estimator_reliability(model: EvaluatedModel) -> list[Measurement]:
    """Whether the estimator's own diagnostics allow its numbers to be used as evidence.

    The share of cells with Pareto k-hat above 0.7 (no standard error) or ESS below ``min_ess``
    (:func:`countvae.module.importance.estimate_reliability`), for every estimate the checks use on this model and its
    maps' reparameterizations so far, must be at most ``max_unreliable_fraction``; the median ESS and largest k-hat
    are reported. Catches: a proposal that misses the posterior (too few draws, a bad guide), whose standard errors
    would otherwise make every comparison look precise. Cannot catch: a posterior mode no proposal component visits
    (the weights then look well behaved).
    """
    s = model.settings
    estimate = model.lpd(s.seed)
    share = estimate_reliability(estimate, s.min_ess).share
    return [
        Measurement("unreliable_fraction", share, s.max_unreliable_fraction, "equal"),
        Measurement("ess_median", float(np.median(estimate["ess"].to_numpy()))),
        Measurement("khat_max", float(np.nanmax(estimate["khat"].to_numpy()))),
    ]


def estimator_accuracy(model: EvaluatedModel) -> list[Measurement]:
    """The package's estimate against exact quadrature, for one model (where quadrature applies).

    The mean absolute error must be at most ``max_estimator_error`` nats per cell, and at most
    ``max_unreliable_fraction`` of the cells may lie outside 3 reported standard errors. Catches: a biased estimator
    or too small standard errors (what the k-hat diagnostic cannot see). Cannot catch: anything in models without
    quadrature (MLP decoders, more than 3 latent dimensions).
    """
    quad = model.quadrature
    if quad is None:
        return []
    s = model.settings
    lpd = model.lpd(s.seed)
    err = lpd["lpd"].to_numpy() - quad.log_marginal
    outside = ~(np.abs(err) <= 3 * lpd["mc_se"].to_numpy())  # a cell without a standard error counts as outside
    return [
        Measurement("estimator_minus_quadrature_mean", float(err.mean())),
        Measurement("estimator_mean_abs_error", float(np.abs(err).mean()), s.max_estimator_error, "equal"),
        Measurement("estimator_outside_3se_fraction", float(outside.mean()), s.max_unreliable_fraction, "equal"),
    ]


def quadrature_convergence(model: EvaluatedModel) -> list[Measurement]:
    """The axis-aligned quadrature's largest change at its last node doubling, and the nodes it used.

    Must be below the tolerance; when a cell hits the node budget the row fails
    and the report says so (raise ``quadrature_max_nodes``).
    """
    quad = model.quadrature
    if quad is None:
        return []
    return [
        Measurement("quadrature_change", quad.max_change, model.settings.quadrature_tolerance, "equal"),
        Measurement("quadrature_nodes", float(quad.nodes_per_axis.max())),
    ]


#: The checks of each model variant by itself (rows with transform ``"(none)"``).
MODEL_CHECKS: tuple[Callable[[EvaluatedModel], list[Measurement]], ...] = (
    estimator_reliability,
    estimator_accuracy,
    quadrature_convergence,
)


#: The checks made for every model variant and map, in the order of their rows.
MAP_CHECKS: tuple[MapCheck, ...] = (
    common_random_numbers,
    independent_draws,
    control_change,
    pointwise,
    exact_quadrature,
)

#: The checks made for the fitted model only (not the prior controls), after :data:`MAP_CHECKS`.
FITTED_MAP_CHECKS: tuple[MapCheck, ...] = (own_proposal, output_changes, elbo_geometry)
