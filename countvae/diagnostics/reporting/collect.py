"""Step 1 of the report: check the inputs, then visit each fit once for every array the analyses need.

Everything a fitted model is asked for happens here, in one pass over the fits:
latent means, held-out log p(x), decoded means, normalized expression, decoder
Jacobians (reduced to their gene-space span and Gram matrix), loadings,
posterior predictive draws (reduced to their statistics, see
:mod:`countvae.diagnostics.analyses.ppc`; the draws themselves are not kept) and
guide draws for the cross-seed R-hat. The analyses then work on
:class:`Collected` alone.

Work that grows faster than linearly in cells, or that is expensive per cell,
runs on a random subset of the held-out cells (:class:`CellSubsets`), whose size
the report states.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from countvae._provenance import package_versions
from countvae.data.registry import get_registry
from countvae.diagnostics.analyses.heldout_data import data_checksum, gene_variance, observed_counts
from countvae.diagnostics.analyses.markers import default_markers, marker_matrix
from countvae.diagnostics.analyses.ppc import PPCStatistics, predictive_statistics, split_half_statistics
from countvae.diagnostics.analyses.subspace import jacobian_span, subsample
from countvae.diagnostics.fitting.fitted_model import FittedModel
from countvae.diagnostics.fitting.seed_fits import SeedFits
from countvae.diagnostics.reporting.settings import ReportSettings
from countvae.diagnostics.reporting.stopwatch import Stopwatch
from countvae.errors import InvalidArgumentError, InvalidDataError

logger = logging.getLogger(__name__)


# ----- inputs -----------------------------------------------------------------------------------------
def check_fits(fits: Sequence[FittedModel]) -> None:
    """Refuse fewer than two fits, non-fits, repeated seeds or names, and fits of different genes, widths or priors."""
    if len(fits) < 2:
        raise InvalidArgumentError(
            f"Multi-seed diagnostics need at least two fits, got {len(fits)}; fit more seeds (e.g. seeds=range(5))."
        )
    for f in fits:
        if not isinstance(f, FittedModel):
            raise InvalidArgumentError(
                f"Each fit must be a FittedModel (e.g. CountVAEFit(model, seed)), got {type(f).__name__}."
            )
    seeds = [f.seed for f in fits]
    duplicated = sorted({s for s in seeds if seeds.count(s) > 1})
    if duplicated:
        raise InvalidArgumentError(
            f"Seeds {duplicated} appear more than once; fits from the same seed are copies, not independent runs."
        )
    names = [f.name for f in fits]
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"Fit names must be unique, got {names}.")
    first = fits[0]
    for f in fits[1:]:
        if len(f.var_names) != len(first.var_names) or not bool((f.var_names == first.var_names).all()):
            raise InvalidArgumentError(
                f"{f.name!r} was fitted on other genes than {first.name!r} ({len(f.var_names)} vs "
                f"{len(first.var_names)} genes, or another order); compare fits of the same data only."
            )
        if f.n_latent != first.n_latent:
            raise InvalidArgumentError(
                f"{f.name!r} has n_latent={f.n_latent} but {first.name!r} has {first.n_latent}; "
                "compare fits of the same model only."
            )
    symmetries = {f.symmetry for f in fits}
    if len(symmetries) != 1:
        raise InvalidArgumentError(f"The fits have different priors (symmetry groups {sorted(symmetries)}).")


def resolve_inputs(
    fits: SeedFits | Sequence[FittedModel], adata_heldout: ad.AnnData | None
) -> tuple[list[FittedModel], ad.AnnData, dict[str, Any]]:
    """The fits as a list, the held-out cells, and the fits' recorded settings (from a :class:`SeedFits`)."""
    fit_settings: dict[str, Any] = {}
    if isinstance(fits, SeedFits):
        fit_settings = dict(fits.settings)
        if adata_heldout is None:
            adata_heldout = fits.adata_heldout
        fits = list(fits.fits)
    else:
        fits = list(fits)
    if adata_heldout is None:
        raise InvalidArgumentError(
            "adata_heldout is required with a list of fits: pass cells that none of the fits was trained on."
        )
    if not isinstance(adata_heldout, ad.AnnData):
        raise InvalidArgumentError(f"adata_heldout must be an AnnData, got {type(adata_heldout).__name__}.")
    check_fits(fits)
    if adata_heldout.n_obs < 8:
        raise InvalidDataError(f"The held-out data has {adata_heldout.n_obs} cells; the diagnostics need at least 8.")
    return fits, adata_heldout, fit_settings


# ----- what is collected ------------------------------------------------------------------------------
@dataclass
class CellSubsets:
    """Positions of the held-out cells (and genes) each kind of output is computed on."""

    lpd: np.ndarray
    expression: np.ndarray
    jacobian: np.ndarray
    ppc: np.ndarray
    rhat: np.ndarray
    genes: np.ndarray
    rhat_genes: np.ndarray


def cell_subsets(adata: ad.AnnData, var_names: pd.Index, s: ReportSettings) -> CellSubsets:
    """The random subsets of the settings (each from its own seed, so they do not depend on each other)."""
    n = adata.n_obs
    variance = gene_variance(adata, var_names, seed=s.seed)
    genes = np.sort(np.argsort(-variance, kind="stable")[: min(s.max_genes, len(var_names))])
    top = np.argsort(-variance, kind="stable")[: s.n_rhat_genes]
    return CellSubsets(
        lpd=subsample(n, s.max_lpd_cells, s.seed),
        expression=subsample(n, s.max_expression_cells, s.seed + 1),
        jacobian=subsample(n, s.max_jacobian_cells, s.seed + 2),
        ppc=subsample(n, s.max_ppc_cells, s.seed + 3),
        rhat=subsample(n, s.n_rhat_cells, s.seed + 4),
        genes=genes,
        rhat_genes=np.sort(top),
    )


@dataclass
class GuideDraws:
    """Draws from one fit's guide on a few cells, for the cross-seed R-hat.

    Attributes
    ----------
    latent
        (draws, cells, n_latent).
    log_rate
        Decoded log means at those draws for the tracked genes, (draws, cells, genes); ``None`` without genes.

    """

    latent: np.ndarray
    log_rate: np.ndarray | None


def guide_draws(
    fit: FittedModel, adata_cells: ad.AnnData, n_draws: int, seed: int, gene_positions: np.ndarray | None = None
) -> GuideDraws:
    """Draw from ``fit``'s guide on ``adata_cells`` and decode the draws for the genes at ``gene_positions``."""
    if adata_cells.n_obs < 2:
        raise InvalidArgumentError("Cross-seed R-hat needs at least 2 cells.")
    if n_draws < 4:
        raise InvalidArgumentError(f"Cross-seed R-hat needs at least 4 draws per seed, got {n_draws}.")
    z = np.asarray(fit.latent_samples(adata_cells, n_draws, seed), dtype=np.float64)
    log_rate = None
    if gene_positions is not None and len(gene_positions):
        decoded = np.asarray(fit.decode_log_rate(adata_cells, z.astype(np.float32)), dtype=np.float64)
        log_rate = decoded[..., gene_positions]
    return GuideDraws(latent=z, log_rate=log_rate)


@dataclass
class FitArrays:
    """What one fit provides, on the held-out cells and their subsets.

    Attributes
    ----------
    latent
        Posterior means, (cells, n_latent), on all held-out cells.
    lpd
        Per-cell held-out log p(x) with its Monte Carlo error, on ``CellSubsets.lpd``; ``None`` if not available.
    log_rate, normalized
        Decoded log means at the posterior means and ``log1p`` normalized
        expression, (cells, genes) on ``CellSubsets.expression`` x ``CellSubsets.genes``.
    span
        Gene-space span of the decoder Jacobians on ``CellSubsets.jacobian``, (genes, n_latent).
    gram
        Mean Jacobian Gram matrix on ``CellSubsets.genes``, (genes, genes).
    loadings
        Linear decoder weights, or the mean Jacobian, (genes, n_latent).
    ppc, ppc_halves
        Posterior predictive statistics on ``CellSubsets.ppc`` (all draws, and the two halves of the draws).
    guide
        Guide draws on ``CellSubsets.rhat``.

    """

    latent: np.ndarray
    lpd: pd.DataFrame | None
    log_rate: np.ndarray
    normalized: np.ndarray
    span: np.ndarray
    gram: np.ndarray
    loadings: np.ndarray
    ppc: PPCStatistics
    ppc_halves: tuple[PPCStatistics, PPCStatistics]
    guide: GuideDraws


@dataclass
class Collected:
    """Everything the analyses work on: the held-out data's arrays and each fit's.

    Attributes
    ----------
    fits
        Per fit, in order: ``name``, ``seed``, ``kind``, ``symmetry``, ``n_latent``.
    var_names
        The fits' genes.
    n_cells
        Held-out cells.
    subsets
        Which cells (and genes) each output covers.
    marker_names
        The markers asked for (genes or obs columns).
    markers
        Their values per held-out cell (an obs column may give several indicator columns).
    ppc_counts
        Observed counts on ``subsets.ppc``, dense (cells, genes).
    arrays
        Fit name -> :class:`FitArrays`.
    fit_settings
        The fits' recorded settings (from a ``SeedFits``), else empty.
    heldout_checksum
        SHA-256 of the held-out counts, cells and genes.

    """

    fits: list[dict[str, Any]]
    var_names: pd.Index
    n_cells: int
    subsets: CellSubsets
    marker_names: list[str]
    markers: pd.DataFrame
    ppc_counts: np.ndarray
    arrays: dict[str, FitArrays]
    fit_settings: dict[str, Any]
    heldout_checksum: str

    @property
    def names(self) -> list[str]:
        """Fit names, in order."""
        return [f["name"] for f in self.fits]

    @property
    def symmetry(self) -> str:
        """The fits' symmetry group."""
        return self.fits[0]["symmetry"]

    def per_fit(self, attribute: str) -> dict[str, Any]:
        """One attribute of :class:`FitArrays` for every fit, by name."""
        return {name: getattr(arrays, attribute) for name, arrays in self.arrays.items()}

    def provenance(self) -> dict[str, Any]:
        """Package versions, the held-out data checksum and sizes, and the fits."""
        return {
            "versions": package_versions("arviz", "matplotlib"),
            "heldout_checksum_sha256": self.heldout_checksum,
            "heldout_cells": int(self.n_cells),
            "genes": int(len(self.var_names)),
            "fits": [dict(f) for f in self.fits],
        }


def _collect_fit(
    fit: FittedModel,
    chain: int,
    adata: ad.AnnData,
    views: dict[str, ad.AnnData],
    sub: CellSubsets,
    ppc_counts: np.ndarray,
    s: ReportSettings,
) -> FitArrays:
    latent = np.asarray(fit.latent(adata), dtype=np.float64)
    lpd = fit.log_predictive_density(views["lpd"], s.n_lpd_samples, s.seed)
    z_expr = latent[sub.expression]
    log_rate = np.asarray(fit.decode_log_rate(views["expression"], z_expr.astype(np.float32)), dtype=np.float64)
    normalized = np.log1p(np.asarray(fit.normalized_expression(views["expression"]), dtype=np.float64))
    jac = np.asarray(fit.decoder_jacobian(views["jacobian"]), dtype=np.float64)
    span = jacobian_span(jac, fit.n_latent, seed=s.seed)
    sel = jac[:, sub.genes, :]
    stacked = np.transpose(sel, (1, 0, 2)).reshape(len(sub.genes), -1)
    gram = stacked @ stacked.T / jac.shape[0]
    weights = fit.loadings()
    loadings = np.asarray(weights, dtype=np.float64) if weights is not None else jac.mean(axis=0)
    draws = np.asarray(fit.posterior_predictive(views["ppc"], s.n_ppc_samples, s.seed), dtype=np.float64)
    # Chain c draws with seed + c, so that the chains are independent even when two fits are identical.
    guide = guide_draws(fit, views["rhat"], s.n_rhat_draws, s.seed + chain, sub.rhat_genes)
    return FitArrays(
        latent=latent,
        lpd=lpd,
        log_rate=log_rate[:, sub.genes],
        normalized=normalized[:, sub.genes],
        span=span,
        gram=gram,
        loadings=loadings,
        ppc=predictive_statistics(ppc_counts, draws),
        ppc_halves=split_half_statistics(ppc_counts, draws),
        guide=guide,
    )


def default_markers_with_labels(adata: ad.AnnData, var_names: pd.Index, n: int) -> list[str]:
    """The ``n`` most variable genes, plus the registered ``labels_key`` column if there is one."""
    markers = default_markers(adata, var_names, n)
    registry = get_registry(adata)
    if registry is not None and registry.labels_key and registry.labels_key in adata.obs.columns:
        markers.append(registry.labels_key)
    return markers


def collect(
    fits: list[FittedModel],
    adata: ad.AnnData,
    markers: Sequence[str] | None,
    s: ReportSettings,
    fit_settings: dict[str, Any],
    stopwatch: Stopwatch,
    progress_bar: bool = False,
) -> Collected:
    """Visit each fit once on the held-out cells ``adata`` (steps timed by ``stopwatch``)."""
    var_names = pd.Index(fits[0].var_names)
    marker_names = list(markers) if markers is not None else default_markers_with_labels(adata, var_names, s.n_markers)
    marker_values = marker_matrix(adata, marker_names, var_names)
    sub = cell_subsets(adata, var_names, s)
    views = {
        "lpd": adata[sub.lpd].copy(),
        "expression": adata[sub.expression].copy(),
        "jacobian": adata[sub.jacobian].copy(),
        "ppc": adata[sub.ppc].copy(),
        "rhat": adata[sub.rhat].copy(),
    }
    ppc_counts = observed_counts(views["ppc"], var_names).toarray()
    checksum = data_checksum(adata, var_names)
    stopwatch.lap("prepare")
    arrays: dict[str, FitArrays] = {}
    for chain, fit in enumerate(tqdm(fits, desc="diagnostics", unit="fit", disable=not progress_bar)):
        logger.info("Collecting the outputs of %s", fit.name)
        arrays[fit.name] = _collect_fit(fit, chain, adata, views, sub, ppc_counts, s)
    stopwatch.lap("per-fit outputs")
    return Collected(
        fits=[
            {"name": f.name, "seed": int(f.seed), "kind": f.kind, "symmetry": f.symmetry, "n_latent": int(f.n_latent)}
            for f in fits
        ],
        var_names=var_names,
        n_cells=int(adata.n_obs),
        subsets=sub,
        marker_names=[str(m) for m in marker_names],
        markers=marker_values,
        ppc_counts=ppc_counts,
        arrays=arrays,
        fit_settings=fit_settings,
        heldout_checksum=checksum,
    )
