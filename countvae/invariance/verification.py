"""Measure, on held-out cells, that a fitted model's ``p(x)`` is unchanged by the symmetries of its prior.

For every latent map ``A`` the model is reparameterized (``z' = A z``, decoder weight on ``z`` times ``A^{-1}``, guide
pushed forward) and compared with the original by the checks of :mod:`countvae.invariance.checks`, which lists them and
what each can catch. The maps and the prior controls are in :mod:`countvae.invariance.controls`; what the checks read
(each estimate computed once) in :mod:`countvae.invariance.evaluation`. :func:`verify` only puts these together.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from countvae._checks import check_bool
from countvae._settings import takes_settings
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

if TYPE_CHECKING:
    import anndata as ad

logger = logging.getLogger(__name__)

#: A map within this of orthogonality (max |A^T A - I|) is treated as orthogonal and replaced by its polar factor.
ORTHOGONAL_ATOL = 1e-6
ORTHOGONAL_ROUNDING = 1e-14

#: The models :func:`verify` compares, by label, each with the latent maps to apply to it, by name.
_Plans = dict[str, tuple[CountVAE, dict[str, np.ndarray]]]


def _resolve_transforms(transforms: object, n_latent: int, seed: int, controls: bool) -> dict[str, np.ndarray]:
    """The latent maps to check, by name, as invertible matrices (nearly orthogonal ones made exactly so).

    ``transforms``: ``None`` (the default maps), a dict by name, a list, or one map; ``controls`` adds the control maps.
    """
    if transforms is None:
        maps = default_transforms(n_latent, seed)
    elif isinstance(transforms, dict):
        maps = {str(k): v for k, v in transforms.items()}
        if len(maps) != len(transforms):  # e.g. 1 and "1": one map would silently replace the other
            raise InvalidArgumentError(f"transform names must differ as text, got {list(transforms)}.")
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
    for name, M in (control_transforms(n_latent) if controls else {}).items():
        if name in resolved and not np.allclose(resolved[name], M, rtol=0.0, atol=1e-12):
            raise InvalidArgumentError(
                f"transform {name!r} has the name of a built-in control, which is another map; rename it, or pass "
                "controls=False."
            )
        resolved[name] = M
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
    """``original`` against its reparameterization by ``A``, on the same cells."""
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
    """Rows of the checks table (``CHECK_COLUMNS``), one per measurement."""
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
    """Per-cell log p(x) of a comparison: same-noise, independent and (where exact) quadrature values."""
    seed = c.settings.seed
    frame = pd.DataFrame(
        {
            "lpd": c.original.guide_lpd(seed)["lpd"].to_numpy(),
            "lpd_crn": c.transformed.guide_lpd(seed)["lpd"].to_numpy(),
        }
    )
    estimates = {"": c.original.lpd(seed), "_indep": c.transformed.lpd(seed + 1)}
    if c.variant == FITTED and c.invariant:
        estimates["_own"] = c.transformed.lpd(seed + 2, "prior")
    for suffix, estimate in estimates.items():
        frame[f"estimate{suffix}"], frame[f"mc_se{suffix}"] = estimate["lpd"].to_numpy(), estimate["mc_se"].to_numpy()
    if c.original.quadrature is not None and c.transformed.quadrature is not None:
        frame["quadrature"] = c.original.quadrature.log_marginal
        frame["quadrature_transformed"] = c.transformed.quadrature.log_marginal
    return frame


def _check_cell_count(adata: ad.AnnData | None, indices: np.ndarray | None) -> None:
    """Check that ``indices`` are positions (not a mask) naming no cell twice, and that 2 or more cells are used."""
    if indices is not None and np.asarray(indices).dtype == bool:
        raise InvalidArgumentError(
            "indices must be integer positions of cells, got a boolean mask; pass np.flatnonzero(mask)."
        )
    n_cells = getattr(adata, "n_obs", 0) if indices is None else len(np.asarray(indices).ravel())
    if indices is not None and len(np.unique(np.asarray(indices))) != n_cells:
        raise InvalidArgumentError("indices must not repeat a cell.")
    if n_cells < 2 and hasattr(adata, "n_obs"):
        raise InvalidArgumentError(f"verify needs at least 2 cells, got {n_cells}.")


def _quadrature_use(base: CountVAE, s: VerifySettings) -> tuple[bool, str | None]:
    """Whether the checks use exact quadrature, and why it cannot be used (``None`` when it can).

    Raises :class:`InvalidArgumentError` when ``quadrature=True`` asks for it where it cannot be used.
    """
    reason = quadrature_unsupported_reason(base)
    if s.quadrature is True and reason is not None:
        raise InvalidArgumentError(f"quadrature=True, but {reason}")
    return s.quadrature is not False and reason is None, reason


def _plans(base: CountVAE, maps: dict[str, np.ndarray], s: VerifySettings) -> _Plans:
    """The models to compare, by label, each with the maps to apply to it."""
    plans: _Plans = {FITTED: (base, maps)}
    if s.prior_controls and base.n_latent >= 2:
        plans.update(prior_control_variants(base, s.seed))
    elif s.prior_controls:
        logger.info("n_latent=1: every orthogonal map is a sign flip, so the prior controls are skipped.")
    return plans


def _measure_plans(
    plans: _Plans, fitted: EvaluatedModel, progress_bar: bool
) -> tuple[list[dict], dict[str, pd.DataFrame]]:
    """Run the model checks on every planned model and the map checks on each of its maps.

    Returns the rows of the checks table and the per-cell estimates, by ``"label / map"``.
    """
    rows: list[dict] = []
    per_cell: dict[str, pd.DataFrame] = {}
    bar = tqdm(total=sum(len(p) for _, p in plans.values()), desc="invariance", unit="map", disable=not progress_bar)
    for label, (variant, plan) in plans.items():
        original = fitted if label == FITTED else EvaluatedModel(variant, fitted.cells, fitted.use_quadrature)
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
    return rows, per_cell


def _settings_record(
    model: CountVAE, fitted: EvaluatedModel, maps: dict[str, np.ndarray], reason: str | None, s: VerifySettings
) -> dict:
    """The settings of a run of :func:`verify`, as recorded in its report."""
    base = fitted.model
    return {
        "model": repr(model),
        "n_cells": int(len(fitted.cells.indices)),
        "n_samples": int(s.n_samples),
        "seed": int(s.seed),
        "dtype": s.dtype_name,
        "n_latent": int(base.n_latent),
        "prior": model.settings.prior,
        "quadrature": bool(fitted.use_quadrature),
        "quadrature_note": reason or (fitted.quadrature.describe() if fitted.quadrature is not None else "skipped"),
        "quadrature_tolerance": float(s.quadrature_tolerance),
        "quadrature_max_nodes": int(s.quadrature_max_nodes),
        "estimator": repr(s.estimator_for(base.module)),
        "z_threshold": float(s.z_threshold),
        "change_threshold": float(s.change_threshold),
        "max_unreliable_fraction": float(s.max_unreliable_fraction),
        "min_ess": float(s.min_ess),
        "max_estimator_error": float(s.max_estimator_error),
        "tolerances": s.tolerances,
        "expected_invariant": {name: bool(model_preserves(base.module, A)) for name, A in maps.items()},
        "loadings_prior": "none" if base.module.loadings_prior is None else base.module.loadings_prior.kind,
        "symmetry": base.module.symmetry,
    }


def _variant_summaries(plans: _Plans) -> dict[str, dict[str, str]]:
    """The prior, loadings prior and symmetry of each planned model, by label."""
    return {
        label: {
            "prior": v.module.prior.kind,
            "loadings_prior": "none" if v.module.loadings_prior is None else v.module.loadings_prior.kind,
            "symmetry": v.module.symmetry,
        }
        for label, (v, _) in plans.items()
    }


# The settings of verify are the fields of VerifySettings, each written once there (countvae._settings says why this
# departs from scvi-tools' explicit keyword arguments).
@takes_settings(VerifySettings)
def verify(
    model: CountVAE,
    adata,
    transforms=None,
    *,
    indices: np.ndarray | None = None,
    progress_bar: bool = False,
    settings: VerifySettings,
) -> InvarianceReport:
    """Verify numerically on held-out cells that ``p(x)`` is unchanged by the maps that preserve the prior.

    The result is "verified numerically" when every check agrees with the theory and the estimator's own diagnostics
    allow its numbers to be used; "not verified" (with the reasons) when the estimator is unreliable on too many cells,
    disagrees with exact quadrature, the quadrature did not converge, or a control's change of ``p(x)`` is too small
    for the estimates to resolve (an inconclusive control, e.g. on a briefly trained NB model whose posterior is near
    the prior); "failed" when a check disagrees with the theory on reliable numbers.
    :mod:`countvae.invariance.checks` lists the checks and what each can and cannot catch.

    Parameters
    ----------
    model
        A trained :class:`countvae.CountVAE` (not modified; evaluated as a copy in ``dtype``).
    adata
        Cells to evaluate, ideally cells the model was not trained on, with the model's genes.
    transforms
        Latent maps ``A`` (``z' = A z``): a dict name -> matrix, a list of matrices, or one matrix. Orthogonal maps are
        checked for exact invariance, other invertible maps as controls. Default: :func:`default_transforms`.
    indices
        Positions of a subset of ``adata``'s cells.
    progress_bar
        Show a progress bar over the comparisons.
    {settings}
    settings
        All of the settings above as one :class:`countvae.invariance.VerifySettings`; keywords given with it
        replace its fields.

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
    check_bool("progress_bar", progress_bar)
    s = settings
    _check_cell_count(adata, indices)
    base = copy_model(model, s.dtype)
    base.module.eval()
    cells = EvaluationCells(base.cells(adata, indices), s)
    maps = _resolve_transforms(transforms, base.n_latent, s.seed, s.controls)
    use_quadrature, reason = _quadrature_use(base, s)
    plans = _plans(base, maps, s)
    fitted = EvaluatedModel(base, cells, use_quadrature)
    rows, per_cell = _measure_plans(plans, fitted, progress_bar)
    checks_frame = pd.DataFrame(rows, columns=CHECK_COLUMNS).astype({"ok": object})
    return InvarianceReport(
        checks=checks_frame,
        transforms={name: np.asarray(A) for name, A in maps.items()},
        variants=_variant_summaries(plans),
        per_cell=per_cell,
        outputs=outputs_table(checks_frame, list(maps)),
        latent=fitted.outputs.latent,
        settings=_settings_record(model, fitted, maps, reason, s),
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
