"""Measure, on held-out cells, that a fitted model's ``p(x)`` is unchanged by the symmetries of its prior.

For every latent map ``A`` the model is reparameterized (``z' = A z``, decoder
weight on ``z`` times ``A^{-1}``, guide pushed forward) and compared with the
original:

1. **Common random numbers**: the importance-sampling estimator draws its base
   noise from a seeded generator in a fixed order, so both models see the same
   ``eps`` and the transformed model's draws are exactly ``A z``. For a map that
   preserves the prior every importance weight is equal, and so is the estimate
   (float64: within 1e-9 nats per cell).
2. **Independent draws**: the mean difference of the estimates over cells, in
   units of its Monte Carlo standard error, and the spread of the per-cell
   differences in units of their own standard errors.
3. **Pointwise**: ``log p(x | z)`` of the original equals ``log p'(x | A z)`` of the
   transformed model at sampled ``z`` for every invertible map (the decoder is
   compensated); the prior density ``log p(A z)`` equals ``log p(z)`` only for
   maps that preserve the prior.
4. **Outputs**: which model outputs change (see :mod:`countvae.invariance.outputs`).
5. **Controls**: non-orthogonal maps (axis scaling, shear) and models with a
   prior that is not rotation-invariant (Laplace, diagonal) under a rotation must
   change ``p(x)`` beyond Monte Carlo error, while a map in the prior's own group
   (a signed permutation for Laplace, a sign flip for a diagonal prior) must not.
   The change is measured with common noise twice (seeds ``seed`` and
   ``seed + 1``); the half-difference of the two measurements is their Monte
   Carlo error, the half-sum the change.

For linear-decoder Poisson/NB models with ``n_latent <= 3`` the exact
``log p(x)`` by adaptive Gauss-Hermite quadrature is compared as well. The ELBO
with the mean-field projection of the pushed-forward guide is reported: unlike
``p(x)`` it is not rotation-invariant.
"""

from __future__ import annotations

import logging
import math
from typing import Literal

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from countvae.data.loader import CountSource
from countvae.errors import InvalidArgumentError
from countvae.invariance import transforms as T
from countvae.invariance.elbo import cell_chunks, elbo_comparison, refit_mean_field_elbo
from countvae.invariance.outputs import (
    OUTPUT_ROWS,
    distance_subset,
    log_normalized_counts,
    model_outputs,
    output_changes,
)
from countvae.invariance.quadrature import quadrature_log_marginal, quadrature_unsupported_reason
from countvae.invariance.reparameterize import _require_model, copy_model, reparameterize
from countvae.invariance.report import InvarianceReport
from countvae.model import CountVAE, inference
from countvae.model.query import query_source
from countvae.model.training import to_tensors
from countvae.module.priors import LatentPrior
from countvae.module.vae import log_library_size, sample_latent

logger = logging.getLogger(__name__)

#: Label of the model passed to :func:`verify` among the evaluated variants.
FITTED = "fitted"

#: Scales of the diagonal-prior control (geometric from 0.5 to 2): distinct, so only sign flips preserve it.
CONTROL_SCALE_RANGE = (0.5, 2.0)

#: A map within this of orthogonality (max |A^T A - I|) is treated as orthogonal and replaced by its polar factor.
ORTHOGONAL_ATOL = 1e-6
ORTHOGONAL_ROUNDING = 1e-14


# ----- maps and priors --------------------------------------------------------------------------
def default_transforms(n_latent: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The orthogonal maps :func:`verify` applies by default, by name.

    A Haar rotation, a sign flip of random axes, a non-identity permutation, a
    signed permutation and a Haar orthogonal matrix (either determinant); for
    ``n_latent = 1`` only the sign flip exists.
    """
    seeds = np.random.default_rng(seed).integers(0, 2**31 - 1, size=5)
    maps = {}
    if n_latent >= 2:
        maps["rotation"] = T.random_rotation(n_latent, int(seeds[0]))
    maps["reflection"] = T.random_reflection(n_latent, int(seeds[1]))
    if n_latent >= 2:
        maps["permutation"] = T.random_permutation(n_latent, int(seeds[2]))
        maps["signed permutation"] = T.random_signed_permutation(n_latent, int(seeds[3]))
        maps["haar orthogonal"] = T.random_orthogonal(n_latent, int(seeds[4]))
    return maps


def control_transforms(n_latent: int) -> dict[str, np.ndarray]:
    """Non-orthogonal controls: axis scaling by 2 and 1/2 (alternating) and a unit shear (``L >= 2``)."""
    maps = {"scaling (control)": T.default_scaling(n_latent, 2.0)}
    if n_latent >= 2:
        maps["shear (control)"] = T.shear(n_latent, 1.0)
    return maps


def prior_preserves(prior: LatentPrior, A: np.ndarray, atol: float = 1e-8) -> bool:
    """Whether the law of ``A z`` equals the law of ``z`` under ``prior``.

    N(0, I): ``A A^T = I``. Laplace (independent, non-Gaussian): ``A`` is a signed
    permutation. N(0, D^2): ``A D^2 A^T = D^2`` (relative to the largest variance).
    """
    if prior.kind == "normal":
        return bool(np.abs(A @ A.T - np.eye(len(A))).max() <= atol)
    if prior.kind == "laplace":
        return T.is_signed_permutation(A, atol)
    variances = np.exp(2.0 * prior.log_scale.detach().cpu().double().numpy())
    D2 = np.diag(variances)
    return bool(np.abs(A @ D2 @ A.T - D2).max() <= atol * variances.max())


def with_prior(model: CountVAE, kind: Literal["normal", "laplace", "diagonal"], scales=None) -> CountVAE:
    """A copy of ``model`` with the same networks and another prior (a control for :func:`verify`).

    Parameters
    ----------
    model
        A trained model.
    kind
        ``"normal"``, ``"laplace"`` (unit variance) or ``"diagonal"``.
    scales
        Standard deviations of the diagonal prior; default geometric from 0.5 to 2.

    """
    if kind not in ("normal", "laplace", "diagonal"):
        raise InvalidArgumentError(f"kind must be 'normal', 'laplace' or 'diagonal', got {kind!r}.")
    new = copy_model(model)
    L = new.n_latent
    param = next(new.module.parameters())
    prior = LatentPrior(kind, L)
    if kind == "diagonal":
        s = np.geomspace(*CONTROL_SCALE_RANGE, L) if scales is None else np.asarray(scales, dtype=np.float64)
        if s.shape != (L,) or not (np.isfinite(s).all() and (s > 0).all()):
            raise InvalidArgumentError(f"scales must be {L} positive numbers, got {scales!r}.")
        with torch.no_grad():
            prior.log_scale.copy_(torch.as_tensor(np.log(s)))
    new.module.prior = prior.to(dtype=param.dtype, device=param.device)
    new._settings["prior"] = kind
    return new


# ----- measurements ------------------------------------------------------------------------------
def _tolerances(dtype: torch.dtype) -> dict[str, float]:
    """Equality tolerances: absolute plus relative to the size of the compared log densities."""
    if dtype == torch.float64:
        return {"abs": 1e-9, "rel": 0.0, "quad_abs": 1e-10, "quad_rel": 1e-13, "output": 1e-9}
    return {"abs": 1e-4, "rel": 2e-5, "quad_abs": 1e-4, "quad_rel": 2e-5, "output": 1e-4}


@torch.no_grad()
def _pointwise(
    original: CountVAE, transformed: CountVAE, A: np.ndarray, source: CountSource, idx: np.ndarray, n_draws: int, seed
) -> tuple[float, float, float]:
    """Max |log p(x|z) - log p'(x|Az)|, max |log p(z) - log p'(Az)|, and the largest |log p(x|z)|."""
    m0, m1 = original.module.eval(), transformed.module.eval()
    dtype = next(m0.parameters()).dtype
    At = torch.as_tensor(A, dtype=dtype, device=original.device)
    gen = torch.Generator().manual_seed(seed)
    worst_ll, worst_prior, scale = 0.0, 0.0, 0.0
    for _, mb in cell_chunks(source, idx):
        x, b = to_tensors(mb, dtype, original.device)
        loc, sd = m0.encode(x, b)
        eps = torch.randn((n_draws, *loc.shape), generator=gen, dtype=dtype).to(loc.device)
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


def _z_statistics(base: pd.DataFrame, other: pd.DataFrame) -> tuple[float, float, float]:
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


def _replication_ratio(first: np.ndarray, second: np.ndarray) -> float:
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


class _Rows:
    """Collects check rows and judges each against its threshold."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, variant, transform, kind, expected, check, value, threshold=None, expect="report") -> None:
        value = float(value)
        if expect == "equal":
            ok = bool(abs(value) <= threshold)
        elif expect == "differs":
            ok = bool(abs(value) > threshold)
        else:
            ok = None
        self.rows.append(
            {
                "variant": variant,
                "transform": transform,
                "kind": kind,
                "p_x_expected": expected,
                "check": check,
                "value": value,
                "threshold": None if threshold is None else float(threshold),
                "expect": expect,
                "ok": ok,
            }
        )

    def frame(self) -> pd.DataFrame:
        from countvae.invariance.report import CHECK_COLUMNS

        return pd.DataFrame(self.rows, columns=CHECK_COLUMNS).astype({"ok": object})


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


# ----- the check -------------------------------------------------------------------------------
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
    n_nodes: int = 20,
    n_pointwise: int = 8,
    n_elbo_samples: int = 64,
    elbo_cells: int = 200,
    elbo_refit_steps: int = 200,
    k_neighbors: int = 15,
    z_threshold: float = 5.0,
    change_threshold: float = 3.0,
    progress_bar: bool = False,
) -> InvarianceReport:
    """Check on held-out cells that ``p(x)`` is unchanged exactly by the maps that preserve the prior.

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
        Importance samples per cell for ``log p(x)``.
    seed
        Seed of everything random: default maps, the common base noise (``seed``),
        the independent draws (``seed + 1``), pointwise and ELBO draws.
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
        Compare exact ``log p(x)`` by quadrature: ``"auto"`` when the model
        qualifies (linear decoder, Poisson or NB, ``n_latent <= 3``), ``True`` to
        require it, ``False`` to skip it.
    n_nodes
        Gauss-Hermite nodes per latent dimension.
    n_pointwise
        Posterior draws per cell for the pointwise comparison.
    n_elbo_samples
        Draws per cell for the ELBO with the projected mean-field guide.
    elbo_cells
        Cells (a seeded random subset) used for the ELBO comparisons.
    elbo_refit_steps
        Adam steps of the per-cell refit of the best mean-field guide in each
        model's coordinates (:func:`countvae.invariance.elbo.refit_mean_field_elbo`);
        0 skips the refit.
    k_neighbors
        Neighbours in the latent k-NN graph.
    z_threshold
        Largest ``|z|`` of the mean difference (independent draws) accepted as
        equal for a map that preserves the prior.
    change_threshold
        A control counts as detected when the per-cell change of ``log p(x)``,
        measured with common noise at ``seed`` and again at ``seed + 1``, exceeds
        its Monte Carlo error by this factor (ratio of medians of the half-sum and
        the half-difference of the two measurements; about 1 when nothing changed).
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
    _require_model(model)
    for name, value, low in (
        ("n_samples", n_samples, 2),
        ("n_nodes", n_nodes, 2),
        ("n_pointwise", n_pointwise, 1),
        ("n_elbo_samples", n_elbo_samples, 2),
        ("elbo_cells", elbo_cells, 1),
        ("elbo_refit_steps", elbo_refit_steps, 0),
        ("k_neighbors", k_neighbors, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
            raise InvalidArgumentError(f"{name} must be an integer >= {low}, got {value!r}.")
    if quadrature not in (True, False, "auto"):
        raise InvalidArgumentError(f"quadrature must be True, False or 'auto', got {quadrature!r}.")
    n_cells = getattr(adata, "n_obs", 0) if indices is None else len(np.asarray(indices).ravel())
    if indices is not None and len(np.unique(np.asarray(indices))) != n_cells:
        raise InvalidArgumentError("indices must not repeat a cell.")
    if n_cells < 2 and hasattr(adata, "n_obs"):
        raise InvalidArgumentError(f"verify needs at least 2 cells, got {n_cells}.")
    base = copy_model(model, dtype)
    base.module.eval()
    source, idx = query_source(adata, base.registry, base.var_names, indices=indices, validate=True)
    L = base.n_latent
    maps = _resolve_transforms(transforms, L, seed, controls)
    reason = quadrature_unsupported_reason(base)
    if quadrature is True and reason is not None:
        raise InvalidArgumentError(f"quadrature=True, but {reason}")
    use_quadrature = quadrature is not False and reason is None
    tol = _tolerances(dtype)

    variants: dict[str, CountVAE] = {FITTED: base}
    plans: dict[str, dict[str, np.ndarray]] = {FITTED: maps}
    if prior_controls and L >= 2:
        defaults = default_transforms(L, seed)
        own_group = {"laplace": "signed permutation", "diagonal": "reflection"}
        for kind in ("laplace", "diagonal"):
            if kind != base.settings["prior"]:
                label = f"control: {kind} prior"
                variants[label] = with_prior(base, kind)
                plans[label] = {"rotation": defaults["rotation"], own_group[kind]: defaults[own_group[kind]]}
    elif prior_controls:
        logger.info("n_latent=1: every orthogonal map is a sign flip, so the prior controls are skipped.")

    rows = _Rows()
    per_cell: dict[str, pd.DataFrame] = {}
    outputs_by_map: dict[str, dict[str, float]] = {}
    expected_by_map: dict[str, bool] = {}
    n_steps = sum(len(p) for p in plans.values())
    bar = tqdm(total=n_steps, desc="invariance", unit="map", disable=not progress_bar)

    log_expression = log_normalized_counts(source, idx)
    subset = distance_subset(len(idx), seed)
    elbo_idx = idx[np.sort(np.random.default_rng(seed).permutation(len(idx))[:elbo_cells])]
    for label, variant in variants.items():
        prior = variant.module.prior
        lpd0 = inference.log_predictive_density(variant.module, source, idx, n_samples, seed)
        lpd0_replicate = inference.log_predictive_density(variant.module, source, idx, n_samples, seed + 1)
        quad0 = None
        if use_quadrature and quadrature_unsupported_reason(variant) is None:
            quad0 = quadrature_log_marginal(variant, adata, idx, n_nodes)
        if label == FITTED:
            outputs0 = model_outputs(variant, source, idx, log_expression, subset, k_neighbors)
            if elbo_refit_steps > 0:
                refit0, refit0_se = refit_mean_field_elbo(variant, source, elbo_idx, elbo_refit_steps, seed=seed)
            if quad0 is not None:
                err = lpd0["lpd"].to_numpy() - quad0
                rows.add(label, "(none)", "-", "-", "is_minus_quadrature_mean", err.mean())
                covered = np.abs(err) <= 4 * lpd0["mc_se"].to_numpy() + 0.01
                rows.add(label, "(none)", "-", "-", "is_within_4se_fraction", covered.mean())
        for name, A in plans[label].items():
            kind = T.classify(A)
            orthogonal = kind != "linear"
            invariant = prior_preserves(prior, A)
            expected = "invariant" if invariant else "changes"
            transformed = reparameterize(variant, A, check=orthogonal)
            A_used = transformed.module.latent_map.detach().cpu().double().numpy()
            if variant.module.latent_map is not None:
                A_used = A_used @ np.linalg.inv(variant.module.latent_map.detach().cpu().double().numpy())

            def add(check, value, threshold=None, expect="report", _n=name, _k=kind, _e=expected, _l=label):
                rows.add(_l, _n, _k, _e, check, value, threshold, expect)

            # 1. common random numbers
            crn = inference.log_predictive_density(transformed.module, source, idx, n_samples, seed)
            crn_diff = np.abs(crn["lpd"].to_numpy() - lpd0["lpd"].to_numpy())
            crn_tol = tol["abs"] + tol["rel"] * float(np.abs(lpd0["lpd"]).max())
            add("crn_max_abs_diff", crn_diff.max(), crn_tol, "equal" if invariant else "report")
            # 2. independent draws (the transformed model at seed + 1 against the original at seed)
            indep = inference.log_predictive_density(transformed.module, source, idx, n_samples, seed + 1)
            mean_diff, z_mean, z_spread = _z_statistics(lpd0, indep)
            add("mc_mean_diff", mean_diff)
            add("mc_z_mean", z_mean, z_threshold, "equal" if invariant else "report")
            add("mc_z_spread", z_spread)
            if not invariant:  # 5. a control: is the change larger than the Monte Carlo error of measuring it?
                ratio = _replication_ratio(
                    crn["lpd"].to_numpy() - lpd0["lpd"].to_numpy(),
                    indep["lpd"].to_numpy() - lpd0_replicate["lpd"].to_numpy(),
                )
                add("crn_change_ratio", ratio, change_threshold, "differs")
            # 3. pointwise
            ll_diff, prior_diff, ll_scale = _pointwise(variant, transformed, A_used, source, idx, n_pointwise, seed)
            point_tol = tol["abs"] + tol["rel"] * ll_scale
            add("pointwise_loglik_max_abs_diff", ll_diff, point_tol, "equal")
            add("prior_max_abs_diff", prior_diff, tol["abs"] + tol["rel"] * 10.0, "equal" if invariant else "differs")
            frame = pd.DataFrame(
                {
                    "lpd": lpd0["lpd"].to_numpy(),
                    "mc_se": lpd0["mc_se"].to_numpy(),
                    "lpd_crn": crn["lpd"].to_numpy(),
                    "lpd_indep": indep["lpd"].to_numpy(),
                    "mc_se_indep": indep["mc_se"].to_numpy(),
                }
            )
            # exact reference
            if quad0 is not None:
                quad1 = quadrature_log_marginal(transformed, adata, idx, n_nodes)
                quad_diff = quad1 - quad0
                quad_tol = tol["quad_abs"] + tol["quad_rel"] * float(np.abs(quad0).max())
                add(
                    "quadrature_max_abs_diff",
                    np.abs(quad_diff).max(),
                    quad_tol if invariant else 10 * quad_tol,
                    "equal" if invariant else "differs",
                )
                add("quadrature_mean_diff", quad_diff.mean())
                frame["quadrature"] = quad0
                frame["quadrature_transformed"] = quad1
            per_cell[f"{label} / {name}"] = frame
            if label == FITTED:
                # 4. outputs
                changes = output_changes(
                    outputs0,
                    model_outputs(transformed, source, idx, log_expression, subset, k_neighbors),
                    A_used,
                )
                changes["crn_max_abs_diff"] = float(crn_diff.max())
                outputs_by_map[name] = changes
                expected_by_map[name] = invariant
                for check in ("latent_map_max_abs_error", "normalized_expression_max_rel_diff"):
                    add(check, changes[check], tol["output"], "equal")
                for check in (
                    "pairwise_distance_max_rel_diff",
                    "knn_graph_changed_fraction",
                    "loading_gram_max_rel_diff",
                ):
                    if check in changes:
                        threshold = 1e-3 if check == "knn_graph_changed_fraction" else tol["output"]
                        add(check, changes[check], threshold, "equal" if orthogonal else "report")
                for check in ("coordinates_rel_change", "loadings_rel_change", "gene_correlation_max_abs_change"):
                    add(check, changes[check])
                # the "near" in near-identifiability: ELBO of a mean-field guide
                if orthogonal:
                    elbo = elbo_comparison(variant, transformed, A_used, source, elbo_idx, n_elbo_samples, seed)
                    add(
                        "elbo_pushforward_max_abs_diff",
                        elbo["elbo_pushforward_max_abs_diff"],
                        crn_tol,
                        "equal" if invariant else "report",
                    )
                    add("elbo_original_mean", elbo["elbo_original_mean"])
                    add("elbo_projected_mean", elbo["elbo_projected_mean"])
                    add("elbo_projected_mean_diff", elbo["elbo_projected_mean_diff"])
                    add("elbo_projected_z", elbo["elbo_projected_z"])
                    if elbo_refit_steps > 0:
                        refit, refit_se = refit_mean_field_elbo(
                            transformed, source, elbo_idx, elbo_refit_steps, seed=seed
                        )
                        diff = refit - refit0
                        add("elbo_refit_original_mean", refit0.mean())
                        add("elbo_refit_transformed_mean", refit.mean())
                        add("elbo_refit_mean_diff", diff.mean())
                        pooled = math.sqrt(float((refit_se**2 + refit0_se**2).sum())) / len(diff)
                        add("elbo_refit_z", diff.mean() / pooled if pooled > 0 else 0.0)
            bar.update(1)
    bar.close()

    outputs = _outputs_table(outputs_by_map)
    settings = {
        "model": repr(model),
        "n_cells": int(len(idx)),
        "n_samples": int(n_samples),
        "seed": int(seed),
        "dtype": {torch.float64: "float64", torch.float32: "float32"}[dtype],
        "n_latent": int(L),
        "prior": model.settings["prior"],
        "quadrature": bool(use_quadrature),
        "quadrature_note": reason or f"adaptive Gauss-Hermite, {n_nodes} nodes per dimension",
        "n_nodes": int(n_nodes),
        "z_threshold": float(z_threshold),
        "change_threshold": float(change_threshold),
        "tolerances": tol,
        "expected_invariant": expected_by_map,
    }
    return InvarianceReport(
        checks=rows.frame(),
        transforms={name: np.asarray(A) for name, A in maps.items()},
        variants={
            label: {"prior": v.module.prior.kind, "symmetry": v.module.prior.symmetry} for label, v in variants.items()
        },
        per_cell=per_cell,
        outputs=outputs,
        latent=outputs0.latent,
        settings=settings,
    )


def _outputs_table(outputs_by_map: dict[str, dict[str, float]]) -> pd.DataFrame:
    """Output-by-map table of changes, with the maps under which each output is invariant."""
    records = {}
    for label, check, invariant_under in OUTPUT_ROWS:
        values = {name: changes.get(check, np.nan) for name, changes in outputs_by_map.items()}
        if all(np.isnan(v) for v in values.values()):
            continue
        records[label] = {"invariant under": invariant_under, **values}
    return pd.DataFrame.from_dict(records, orient="index")
