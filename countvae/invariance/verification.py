"""Measure, on held-out cells, that a fitted model's ``p(x)`` is unchanged by the symmetries of its prior.

For every latent map ``A`` the model is reparameterized (``z' = A z``, decoder
weight on ``z`` times ``A^{-1}``, guide pushed forward) and compared with the
original by the checks of :mod:`countvae.invariance.checks`: common random
numbers and pointwise densities (algebra: they catch a wrong rewrite), and the
evidence that ``p(x)`` itself is unchanged: independent estimates of the two
models judged against their reported standard errors, the transformed model
estimated from a proposal built from its own log joint, exact quadrature on
grids along each model's own axes (linear Poisson/NB decoders, up to 3 latent
dimensions), and controls that must change ``p(x)`` beyond the estimators'
error. The evidence is checked too: an estimator with too many unreliable cells
(k-hat, ESS), or one that disagrees with quadrature, makes the result
"not verified". The maps and the
prior controls are in :mod:`countvae.invariance.controls`; what the checks read
(each estimate computed once) in :mod:`countvae.invariance.evaluation`.
:func:`verify` only puts these together.
"""

from __future__ import annotations

import logging
from typing import Literal

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from countvae.errors import InvalidArgumentError
from countvae.invariance import transforms as T
from countvae.invariance.checks import FITTED_MAP_CHECKS, MAP_CHECKS, MODEL_CHECKS, Measurement
from countvae.invariance.controls import (
    control_transforms,
    default_transforms,
    loadings_preserve,
    model_preserves,
    prior_control_variants,
    prior_preserves,
)
from countvae.invariance.evaluation import FITTED, EvaluatedModel, EvaluationCells, MapComparison, VerifySettings
from countvae.invariance.loadings_checks import LOADINGS_MAP_CHECKS
from countvae.invariance.outputs import OUTPUT_ROWS
from countvae.invariance.quadrature import quadrature_unsupported_reason
from countvae.invariance.reparameterize import check_trained_model, reparameterize
from countvae.invariance.result import CHECK_COLUMNS, InvarianceReport
from countvae.model import CountVAE, copy_model
from countvae.module.importance import MAX_UNRELIABLE_SHARE, MIN_ESS
from countvae.module.marginal import MarginalSettings

logger = logging.getLogger(__name__)

#: A map within this of orthogonality (max |A^T A - I|) is treated as orthogonal and replaced by its polar factor.
ORTHOGONAL_ATOL = 1e-6
ORTHOGONAL_ROUNDING = 1e-14


def _resolve_transforms(transforms, n_latent: int, seed: int, controls: bool) -> dict[str, np.ndarray]:
    if transforms is None:
        maps = default_transforms(n_latent, seed)
    elif isinstance(transforms, dict):
        maps = {str(k): v for k, v in transforms.items()}
    elif isinstance(transforms, list | tuple):
        maps = {f"A{i}": v for i, v in enumerate(transforms)}
    else:
        maps = {"A0": transforms}
    resolved = {}
    for name, A in maps.items():
        M = T.as_matrix(A, f"transform {name!r}", n_latent)
        if np.linalg.cond(M) > 1e8:
            raise InvalidArgumentError(f"transform {name!r} is singular or nearly so; latent maps must be invertible.")
        if ORTHOGONAL_ROUNDING < T.orthogonality_error(M) <= ORTHOGONAL_ATOL:
            M = T.nearest_orthogonal(M)  # as reparameterize() does, so the map is classified as orthogonal
        resolved[name] = M
    if controls:
        resolved.update(control_transforms(n_latent))
    if not resolved:
        raise InvalidArgumentError("No transforms to check.")
    return resolved


def _applied_map(original: CountVAE, transformed: CountVAE) -> np.ndarray:
    """The map from the original's latents to the transformed model's, as applied (after any polar correction)."""
    A = transformed.module.latent_map.detach().cpu().double().numpy()
    if original.module.latent_map is not None:
        A = A @ np.linalg.inv(original.module.latent_map.detach().cpu().double().numpy())
    return A


def _comparison(variant: str, name: str, original: EvaluatedModel, A: np.ndarray) -> MapComparison:
    kind = T.classify(A)
    transformed = reparameterize(original.model, A, check=kind != "linear")
    return MapComparison(
        variant=variant,
        name=name,
        kind=kind,
        invariant=prior_preserves(original.model.module.prior, A),
        original=original,
        transformed=EvaluatedModel(transformed, original.cells, original.use_quadrature),
        A=_applied_map(original.model, transformed),
        loadings_invariant=loadings_preserve(original.model.module.loadings_prior, A),
    )


def _rows(variant: str, transform: str, kind: str, expected: str, measurements: list[Measurement]) -> list[dict]:
    return [
        {
            "variant": variant,
            "transform": transform,
            "kind": kind,
            "p_x_expected": expected,
            "check": m.check,
            "value": float(m.value),
            "threshold": None if m.threshold is None else float(m.threshold),
            "expect": m.expect,
            "ok": m.ok,
        }
        for m in measurements
    ]


def _per_cell(c: MapComparison) -> pd.DataFrame:
    seed = c.settings.seed
    guide0, guide1 = c.original.guide_lpd(seed), c.transformed.guide_lpd(seed)
    frame = pd.DataFrame(
        {
            "lpd": guide0["lpd"].to_numpy(),
            "lpd_crn": guide1["lpd"].to_numpy(),
            "estimate": c.original.lpd(seed)["lpd"].to_numpy(),
            "mc_se": c.original.lpd(seed)["mc_se"].to_numpy(),
        }
    )
    indep = c.transformed.lpd(seed + 1)
    frame["estimate_indep"], frame["mc_se_indep"] = indep["lpd"].to_numpy(), indep["mc_se"].to_numpy()
    if c.variant == FITTED and c.invariant:
        own = c.transformed.lpd(seed + 2, "prior")
        frame["estimate_own"], frame["mc_se_own"] = own["lpd"].to_numpy(), own["mc_se"].to_numpy()
    if c.original.quadrature is not None and c.transformed.quadrature is not None:
        frame["quadrature"] = c.original.quadrature.log_marginal
        frame["quadrature_transformed"] = c.transformed.quadrature.log_marginal
    return frame


def verify(
    model: CountVAE,
    adata,
    transforms=None,
    *,
    indices: np.ndarray | None = None,
    n_samples: int = 500,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    controls: bool = True,
    prior_controls: bool = True,
    quadrature: bool | Literal["auto"] = "auto",
    quadrature_tolerance: float = 1e-8,
    quadrature_max_nodes: int = 257,
    n_pointwise: int = 8,
    n_elbo_samples: int = 64,
    elbo_cells: int = 200,
    elbo_refit_steps: int = 200,
    k_neighbors: int = 15,
    z_threshold: float = 5.0,
    change_threshold: float = 4.0,
    max_unreliable_fraction: float = MAX_UNRELIABLE_SHARE,
    min_ess: float = MIN_ESS,
    max_estimator_error: float = 0.05,
    estimator_settings: MarginalSettings | None = None,
    progress_bar: bool = False,
) -> InvarianceReport:
    """Verify numerically on held-out cells that ``p(x)`` is unchanged by the maps that preserve the prior.

    The result is "verified numerically" when every check agrees with the theory
    and the estimator's own diagnostics allow its numbers to be used; "not
    verified" (with the reasons) when the estimator is unreliable on too many
    cells, disagrees with exact quadrature, or the quadrature did not converge;
    "failed" when a check disagrees with the theory on reliable numbers. The
    checks and what each can and cannot catch are listed in
    :mod:`countvae.invariance.checks`.

    Parameters
    ----------
    model
        A trained :class:`countvae.CountVAE` (not modified; evaluated as a copy in ``dtype``).
    adata
        Cells to evaluate, ideally cells the model was not trained on, with the model's genes.
    transforms
        Latent maps ``A`` (``z' = A z``): a dict name -> matrix, a list of matrices,
        or one matrix. Orthogonal maps are checked for exact invariance, other
        invertible maps as controls. Default: :func:`default_transforms`.
    indices
        Positions of a subset of ``adata``'s cells.
    n_samples
        Importance draws per cell: of the guide proposal for the common-random-number
        check, and the final draws of the package's estimator
        (:func:`countvae.module.marginal.estimate_log_marginal`) for the other checks.
    seed
        Seed of everything random: default maps, the common base noise and the
        original model's estimate (``seed``), the transformed model's independent
        estimate (``seed + 1``), its estimate from its own proposal (``seed + 2``),
        pointwise and ELBO draws.
    dtype
        Precision of the evaluation; ``torch.float64`` makes the common-random-number
        difference a rounding error (at most 1e-9 nats); with ``torch.float32`` it
        is reported against a tolerance of 1e-4 + 2e-5 |log p(x)|.
    controls
        Add the non-orthogonal controls of :func:`control_transforms`.
    prior_controls
        Also evaluate the same networks with the priors the model does not have
        (``"laplace"``; ``"diagonal"`` with scales 0.5..2) under a rotation (must
        change ``p(x)``) and a map of that prior's own group (must not). Needs
        ``n_latent >= 2``.
    quadrature
        Compare exact ``log p(x)`` by quadrature on axis-aligned grids
        (:func:`countvae.invariance.grid_quadrature`): ``"auto"``
        when the model qualifies (linear decoder, Poisson or NB, ``n_latent <= 3``),
        ``True`` to require it, ``False`` to skip it.
    quadrature_tolerance
        Nodes per axis are doubled until ``log p(x)`` changes by less than this (nats).
    quadrature_max_nodes
        Node budget per axis; a cell that reaches it unconverged makes the result "not verified".
    n_pointwise
        Posterior draws per cell for the pointwise comparison.
    n_elbo_samples
        Draws per cell for the ELBO with the projected mean-field guide.
    elbo_cells
        Cells (a seeded random subset) used for the ELBO comparisons.
    elbo_refit_steps
        Adam steps of the per-cell refit of the best mean-field guide in each
        model's coordinates (:func:`countvae.invariance.elbo_geometry.refit_mean_field_elbo`);
        0 skips the refit.
    k_neighbors
        Neighbours in the latent k-NN graph.
    z_threshold
        Largest ``|z|`` of the mean difference of two independent estimates, in
        units of its reported standard error, accepted as equal for a map that
        preserves the prior.
    change_threshold
        A control counts as detected when the standardized chi-square of the per-cell
        changes of ``log p(x)`` in their reported standard errors,
        ``(sum (d_i / s_i)^2 - n) / sqrt(2 n)`` (about 0 without a change), exceeds this.
    max_unreliable_fraction
        Largest share of cells whose estimate may be unreliable (k-hat above 0.7 or
        ESS below ``min_ess``), or outside 3 (against quadrature) or 4 (between two
        estimates) reported standard errors.
    min_ess
        Smallest effective sample size of a reliable estimate.
    max_estimator_error
        Largest mean absolute error of the estimator against exact quadrature (nats per cell).
    estimator_settings
        Settings of the package's estimator (default: its default for the model,
        :func:`countvae.model.inference.default_marginal_settings`, with ``n_samples``
        final draws); for studying the checks with a weaker estimator.
    progress_bar
        Show a progress bar over the comparisons.

    Returns
    -------
    InvarianceReport
        ``.passed``, ``.to_frame()``, ``.to_dict()``, ``.summary()``, ``.outputs``.

    Raises
    ------
    NotTrainedError
        If the model is not trained.
    InvalidDataError, SetupError
        If ``adata``'s genes or registration do not match the model.
    InvalidArgumentError
        For a transform of the wrong shape or a singular one, or bad settings.

    """
    check_trained_model(model)
    s = VerifySettings(
        n_samples=n_samples,
        seed=seed,
        dtype=dtype,
        controls=controls,
        prior_controls=prior_controls,
        quadrature=quadrature,
        quadrature_tolerance=quadrature_tolerance,
        quadrature_max_nodes=quadrature_max_nodes,
        n_pointwise=n_pointwise,
        n_elbo_samples=n_elbo_samples,
        elbo_cells=elbo_cells,
        elbo_refit_steps=elbo_refit_steps,
        k_neighbors=k_neighbors,
        z_threshold=z_threshold,
        change_threshold=change_threshold,
        max_unreliable_fraction=max_unreliable_fraction,
        min_ess=min_ess,
        max_estimator_error=max_estimator_error,
        estimator_settings=estimator_settings,
    )
    n_cells = getattr(adata, "n_obs", 0) if indices is None else len(np.asarray(indices).ravel())
    if indices is not None and len(np.unique(np.asarray(indices))) != n_cells:
        raise InvalidArgumentError("indices must not repeat a cell.")
    if n_cells < 2 and hasattr(adata, "n_obs"):
        raise InvalidArgumentError(f"verify needs at least 2 cells, got {n_cells}.")
    base = copy_model(model, dtype)
    base.module.eval()
    cells = EvaluationCells(base.cells(adata, indices), s)
    L = base.n_latent
    maps = _resolve_transforms(transforms, L, seed, controls)
    reason = quadrature_unsupported_reason(base)
    if quadrature is True and reason is not None:
        raise InvalidArgumentError(f"quadrature=True, but {reason}")
    use_quadrature = quadrature is not False and reason is None

    plans: dict[str, tuple[CountVAE, dict[str, np.ndarray]]] = {FITTED: (base, maps)}
    if prior_controls and L >= 2:
        plans.update(prior_control_variants(base, seed))
    elif prior_controls:
        logger.info("n_latent=1: every orthogonal map is a sign flip, so the prior controls are skipped.")

    rows: list[dict] = []
    per_cell: dict[str, pd.DataFrame] = {}
    fitted = EvaluatedModel(base, cells, use_quadrature)
    bar = tqdm(total=sum(len(p) for _, p in plans.values()), desc="invariance", unit="map", disable=not progress_bar)
    for label, (variant, plan) in plans.items():
        original = fitted if label == FITTED else EvaluatedModel(variant, cells, use_quadrature)
        rows += _rows(label, "(none)", "-", "-", [m for check in MODEL_CHECKS for m in check(original)])
        for name, A in plan.items():
            c = _comparison(label, name, original, A)
            checks = MAP_CHECKS + LOADINGS_MAP_CHECKS + (FITTED_MAP_CHECKS if label == FITTED else ())
            measured = [m for check in checks for m in check(c)]
            kept = c.invariant and c.loadings_invariant is not False
            rows += _rows(label, name, c.kind, "invariant" if kept else "changes", measured)
            per_cell[f"{label} / {name}"] = _per_cell(c)
            bar.update(1)
    bar.close()

    checks_frame = pd.DataFrame(rows, columns=CHECK_COLUMNS).astype({"ok": object})
    settings = {
        "model": repr(model),
        "n_cells": int(len(cells.indices)),
        "n_samples": int(n_samples),
        "seed": int(seed),
        "dtype": s.dtype_name,
        "n_latent": int(L),
        "prior": model.settings.prior,
        "quadrature": bool(use_quadrature),
        "quadrature_note": reason or (fitted.quadrature.describe() if fitted.quadrature is not None else "skipped"),
        "quadrature_tolerance": float(quadrature_tolerance),
        "quadrature_max_nodes": int(quadrature_max_nodes),
        "estimator": repr(s.estimator_for(base.module)),
        "z_threshold": float(z_threshold),
        "change_threshold": float(change_threshold),
        "max_unreliable_fraction": float(max_unreliable_fraction),
        "min_ess": float(min_ess),
        "max_estimator_error": float(max_estimator_error),
        "tolerances": s.tolerances,
        "expected_invariant": {name: bool(model_preserves(base.module, A)) for name, A in maps.items()},
        "loadings_prior": "none" if base.module.loadings_prior is None else base.module.loadings_prior.kind,
        "symmetry": base.module.symmetry,
    }
    return InvarianceReport(
        checks=checks_frame,
        transforms={name: np.asarray(A) for name, A in maps.items()},
        variants={
            label: {
                "prior": v.module.prior.kind,
                "loadings_prior": "none" if v.module.loadings_prior is None else v.module.loadings_prior.kind,
                "symmetry": v.module.symmetry,
            }
            for label, (v, _) in plans.items()
        },
        per_cell=per_cell,
        outputs=outputs_table(checks_frame, list(maps)),
        latent=fitted.outputs.latent,
        settings=settings,
    )


def outputs_table(checks: pd.DataFrame, maps: list[str]) -> pd.DataFrame:
    """Output-by-map table of changes for the fitted model, with the maps under which each output is invariant.

    Read from the rows of :func:`countvae.invariance.checks.output_changes` and
    :func:`countvae.invariance.checks.common_random_numbers`.
    """
    fitted = checks[checks["variant"] == FITTED]
    values = {(t, c): v for t, c, v in zip(fitted["transform"], fitted["check"], fitted["value"], strict=True)}
    records = {}
    for label, check, invariant_under in OUTPUT_ROWS:
        row = {name: values.get((name, check), np.nan) for name in maps}
        if all(np.isnan(v) for v in row.values()):
            continue
        records[label] = {"invariant under": invariant_under, **row}
    return pd.DataFrame.from_dict(records, orient="index")
