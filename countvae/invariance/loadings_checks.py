"""The invariance check of a model whose loadings ``W`` are a latent variable with a prior (a restriction).

What ``p(x)`` means then. With free loadings, ``W`` is a parameter and the model's density of the data is
``p(x) = prod_i int p(x_i | z, W) p(z) dz``. With a prior on ``W`` the model is ``p(W) prod_i p(x_i | z_i, W) p(z_i)``,
and a latent map ``A`` acts on ``W`` too (``W' = W A^-1``). The held-out predictive density given the posterior of
``W`` cannot see the restriction: pushing ``q(W)`` forward through the map only relabels it, so ``log p(x | W)`` is
unchanged by every map that keeps the prior on ``z``; the restriction acts through ``p(W)``. The quantity checked is
therefore the joint density of the held-out cells and the loadings,

    ``log p(x_heldout, W) = sum_i log p(x_i | W) + log p(W)``

at ``W`` = the posterior mean (the decoder's weight), with ``log p(x_i | W)`` the importance-sampled held-out log
predictive density of each cell (the estimator the other checks use) and ``log p(W)`` the prior density of
:meth:`countvae.module.CountVAEModule.log_prior_loadings` (Gaussian for gene programs; for the horseshoe the local
scales integrated out by quadrature, at the guide's medians of the global scale and the slab). It is unchanged exactly
when the map keeps both priors; a map that keeps only the prior on ``z`` (a rotation, under a N(0, I) prior) changes
it by ``log p(W A^-1) - log p(W)``.

Rows per map:

* ``loadings_log_prior_abs_diff``: ``|log p(W A^-1) - log p(W)|``, equal within rounding for maps the loadings prior
  keeps, above ten times that otherwise;
* ``joint_abs_change``: ``|change of log p(x_heldout, W)|`` with common random numbers (the held-out sum of per-cell
  changes plus the change of ``log p(W)``), equal within rounding (the per-cell tolerance of
  :func:`countvae.invariance.checks.crn_tolerance` times the number of cells) for maps the whole model keeps;
* ``joint_change_over_mc_error``, for every other map: that change measured with common noise at ``seed`` and at
  ``seed + 1``, their mean over the Monte Carlo error of the change (half their difference, at least the rounding
  tolerance), which must exceed ``change_threshold``. With a N(0, I) prior on ``z`` a rotation leaves every held-out
  ``log p(x_i | W)`` unchanged with common noise, so the change is that of ``log p(W)``, exactly replicated.
"""

from __future__ import annotations

import torch

from countvae.invariance.checks import Measurement, crn_tolerance
from countvae.invariance.evaluation import MapComparison


def joint_change(c: MapComparison, seed: int, prior_change: float) -> float:
    """Change of ``log p(x_heldout, W)``: per-cell changes (common noise at ``seed``) summed, plus ``log p(W)``'s."""
    before, after = c.original.guide_lpd(seed), c.transformed.guide_lpd(seed)  # common random numbers
    return float((after["lpd"].to_numpy() - before["lpd"].to_numpy()).sum()) + prior_change


def loadings_prior_change(c: MapComparison) -> list[Measurement]:
    """For a model with a prior on its loadings: the change of ``log p(W)`` and of ``log p(x_heldout, W)``."""
    if c.original.model.module.loadings_prior is None:
        return []
    with torch.no_grad():  # log p(W) of the original and of the transformed model, at their posterior-mean loadings
        lp0 = float(c.original.model.module.log_prior_loadings())
        lp1 = float(c.transformed.model.module.log_prior_loadings())
    tol = c.settings.tolerances
    prior_tol = tol["abs"] + max(tol["rel"], 1e-12) * abs(lp0)
    joint_tol = len(c.original.cells.indices) * crn_tolerance(c) + prior_tol
    kept = bool(c.loadings_invariant)
    whole_model_kept = kept and c.invariant
    seed = c.settings.seed
    first = joint_change(c, seed, lp1 - lp0)
    rows = [
        Measurement(
            "loadings_log_prior_abs_diff",
            abs(lp1 - lp0),
            prior_tol if kept else 10 * prior_tol,
            "equal" if kept else "differs",
        ),
        Measurement("joint_abs_change", abs(first), joint_tol, "equal" if whole_model_kept else "report"),
    ]
    if not whole_model_kept:
        second = joint_change(c, seed + 1, lp1 - lp0)
        error = max(abs(first - second) / 2.0, joint_tol)
        rows.append(
            Measurement(
                "joint_change_over_mc_error", abs(first + second) / 2.0 / error, c.settings.change_threshold, "differs"
            )
        )
    return rows


#: The checks added for models with a prior on the loadings (every variant and map).
LOADINGS_MAP_CHECKS = (loadings_prior_change,)
