"""Step 1 of the report: check the inputs, then visit each fit once for every array the analyses need.

The one place the fits are asked for anything: latent means (on the held-out cells, on a subset of the fit cells, for
ICA, and on every fit cell when that subset leaves some out, for the k-NN graph), held-out log p(x), decoded means,
normalized expression, decoder Jacobians (as contrasts between genes, see
:func:`countvae.diagnostics.analyses.subspace.gene_contrasts`; reduced to their gene-space span, Gram matrix and a small
gene-space basis for the intervals, see :mod:`countvae.diagnostics.analyses.reduced_jacobians`), loadings, posterior
predictive draws (reduced to their statistics, see :mod:`countvae.diagnostics.analyses.ppc`; the draws themselves are
not kept) and guide draws for the cross-seed spread (with a second, independent set of draws of the first fit as its
baseline), and two guide draws per fit on the k-NN cells (the within-seed baseline of each cell's neighbourhood
agreement). From the data alone: the observed counts the no-latent baseline of the equivalence margin needs
(:mod:`countvae.diagnostics.analyses.baseline`) and, for simulated data, the true sources. With a restrictions request,
the restricted fits are read too (:func:`~countvae.diagnostics.reporting.restriction_readout.collect_restrictions`). The
analyses then work on :class:`Collected` alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp
from tqdm.auto import tqdm

from countvae._provenance import package_versions
from countvae._warnings import warn_at_caller
from countvae.data.backed import cells_in_memory
from countvae.data.registry import get_registry
from countvae.diagnostics.analyses.baseline import baseline_log_likelihood, fit_baseline, normalized_counts_pca
from countvae.diagnostics.analyses.heldout_data import data_checksum, gene_variance, observed_counts
from countvae.diagnostics.analyses.invariants import KnnGraph
from countvae.diagnostics.analyses.markers import default_markers, marker_matrix
from countvae.diagnostics.analyses.ppc import PPCStatistics, predictive_statistics, split_half_statistics
from countvae.diagnostics.analyses.reduced_jacobians import ReducedJacobians, reduce_jacobians
from countvae.diagnostics.analyses.subspace import gene_contrasts, jacobian_span, subsample
from countvae.diagnostics.fitting.fitted_model import CountVAEFit, FittedModel
from countvae.diagnostics.fitting.seed_fits import SeedFits
from countvae.diagnostics.reporting.downstream_section import DECalls, DownstreamRequest, collect_de
from countvae.diagnostics.reporting.heldout_lpd import heldout_lpd
from countvae.diagnostics.reporting.restriction_readout import (
    RestrictionArrays,
    RestrictionRequest,
    collect_restrictions,
)
from countvae.diagnostics.reporting.settings import ReportSettings
from countvae.diagnostics.reporting.stopwatch import Stopwatch
from countvae.diagnostics.reporting.verdict_calibration import changed_report_settings, configuration_of_fits
from countvae.errors import CountVAEWarning, InvalidArgumentError, InvalidDataError
from countvae.model import ModelSettings

logger = logging.getLogger(__name__)

#: Held-out cells the report needs at least (its intervals resample them).
MIN_HELDOUT_CELLS = 8


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
        _check_same_model(f, first)
    symmetries = {f.symmetry for f in fits}
    if len(symmetries) != 1:
        raise InvalidArgumentError(f"The fits have different priors (symmetry groups {sorted(symmetries)}).")
    _warn_if_trained_on_other_cells(fits)


def _check_same_model(fit: FittedModel, first: FittedModel) -> None:
    """Refuse fits of another kind, or countvae fits of other settings: the report compares one model's seeds."""
    remedy = "report() compares fits of one model from several seeds; compare_fits compares different models."
    if fit.kind != first.kind:
        raise InvalidArgumentError(f"{fit.name!r} is a {fit.kind} fit, {first.name!r} a {first.kind} fit; {remedy}")
    if isinstance(fit, CountVAEFit) and isinstance(first, CountVAEFit):
        ours, theirs = _settings_in_use(fit.model.settings), _settings_in_use(first.model.settings)
        differ = [key for key in {**ours, **theirs} if ours.get(key) != theirs.get(key)]
        if differ:
            raise InvalidArgumentError(f"{fit.name!r} and {first.name!r} differ in {differ}; {remedy}")


def _settings_in_use(settings: ModelSettings) -> dict[str, Any]:
    """The settings as a record, less those the model does not use (a horseshoe's scale without the horseshoe)."""
    record = settings.to_dict()
    unused = {"dispersion"} if settings.likelihood == "poisson" else set()
    if settings.loadings_prior != "horseshoe":
        unused.add("horseshoe_scale")
    if settings.loadings_prior != "programs":
        unused.add("program_outside_scale")
    return {key: value for key, value in record.items() if key not in unused}


def _warn_if_trained_on_other_cells(fits: Sequence[FittedModel]) -> None:
    # A countvae model keeps its training cells' number and gene shares; other fitted-model kinds keep neither.
    summaries = {f.name: f.model.data_summary for f in fits if isinstance(f, CountVAEFit)}
    if len(summaries) < 2:
        return
    (first, reference), *others = summaries.items()
    differ = [
        name
        for name, summary in others
        if summary.n_cells != reference.n_cells
        or not np.allclose(summary.log_proportions, reference.log_proportions, rtol=0, atol=1e-9)
    ]
    if differ:
        warn_at_caller(
            f"{differ} were trained on other cells than {first!r} (another number of cells or other gene totals): "
            "their differences then mix the seed with the data, and the report reads them all as seed effects. "
            "Fit every seed on the same cells (countvae.diagnostics.fit_seeds does).",
            CountVAEWarning,
        )


def resolve_inputs(
    fits: SeedFits | Sequence[FittedModel], adata_heldout: ad.AnnData | None, adata_fit: ad.AnnData | None = None
) -> tuple[list[FittedModel], ad.AnnData, ad.AnnData | None, dict[str, Any]]:
    """The fits as a list, the held-out cells, the fit cells (if known) and the fits' recorded settings."""
    fit_settings: dict[str, Any] = {}
    if isinstance(fits, SeedFits):
        fit_settings = dict(fits.settings)
        adata_heldout = fits.adata_heldout if adata_heldout is None else adata_heldout
        adata_fit = fits.adata_fit if adata_fit is None else adata_fit
        fits = fits.fits
    fits = list(fits)
    if adata_heldout is None:
        raise InvalidArgumentError(
            "adata_heldout is required with a list of fits: pass cells that none of the fits was trained on."
        )
    if not isinstance(adata_heldout, ad.AnnData):
        raise InvalidArgumentError(f"adata_heldout must be an AnnData, got {type(adata_heldout).__name__}.")
    if adata_fit is not None and not isinstance(adata_fit, ad.AnnData):
        raise InvalidArgumentError(f"adata_fit must be an AnnData or None, got {type(adata_fit).__name__}.")
    check_fits(fits)
    if adata_heldout.n_obs < MIN_HELDOUT_CELLS:
        raise InvalidDataError(
            f"The held-out data has {adata_heldout.n_obs} cells; the diagnostics need at least {MIN_HELDOUT_CELLS}."
        )
    _warn_if_heldout_cells_were_fitted(fits, adata_heldout, adata_fit)
    return fits, adata_heldout, adata_fit, fit_settings


def _warn_if_heldout_cells_were_fitted(
    fits: Sequence[FittedModel], adata_heldout: ad.AnnData, adata_fit: ad.AnnData | None
) -> None:
    """Warn when held-out cells have the names of cells a fit was trained on (its AnnData, or ``adata_fit``)."""
    trained = [adata_fit] + [getattr(getattr(f, "model", None), "adata", None) for f in fits]
    names = [a.obs_names for a in trained if isinstance(a, ad.AnnData)]
    if not names:
        return
    shared = adata_heldout.obs_names.isin(names[0].append(names[1:]) if len(names) > 1 else names[0])
    if shared.any():
        warn_at_caller(
            f"{int(shared.sum())} of the {adata_heldout.n_obs} held-out cells have the names of cells the fits were "
            "trained on: measured on them, held-out log p(x) and the other held-out quantities describe training "
            "cells, and read better than they are. Pass cells none of the fits saw (fit_seeds holds them out for "
            "you); if these are other cells that share names, give them unique names (adata.obs_names_make_unique "
            "does not look across AnnData objects).",
            CountVAEWarning,
        )


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
    fit: np.ndarray | None = None
    knn: np.ndarray | None = None


def cell_subsets(
    adata: ad.AnnData, var_names: pd.Index, s: ReportSettings, n_fit_cells: int | None = None
) -> CellSubsets:
    """The random subsets of the settings (each from its own seed, so they do not depend on each other)."""
    n = adata.n_obs
    order = np.argsort(-gene_variance(adata, var_names, seed=s.seed), kind="stable")
    return CellSubsets(
        lpd=subsample(n, s.max_lpd_cells, s.seed),
        expression=subsample(n, s.max_expression_cells, s.seed + 1),
        jacobian=subsample(n, s.max_jacobian_cells, s.seed + 2),
        ppc=subsample(n, s.max_ppc_cells, s.seed + 3),
        rhat=subsample(n, s.n_rhat_cells, s.seed + 4),
        genes=np.sort(order[: s.max_genes]),
        rhat_genes=np.sort(order[: s.n_rhat_genes]),
        fit=None if n_fit_cells is None else subsample(n_fit_cells, s.max_fit_cells, s.seed + 5),
        # the cells of the invariants table's k-NN overlap (same size and seed)
        knn=subsample(n, s.max_knn_cells, s.seed),
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
    z = np.asarray(_given(fit.latent_samples(adata_cells, n_draws, seed), fit, "latent_samples"), dtype=np.float64)
    log_rate = None
    if gene_positions is not None and len(gene_positions):
        decoded = _given(fit.decode_log_rate(adata_cells, z.astype(np.float32)), fit, "decode_log_rate")
        log_rate = np.asarray(decoded, dtype=np.float64)[..., gene_positions]
    return GuideDraws(latent=z, log_rate=log_rate)


@dataclass
class FitArrays:
    """What one fit provides, on the held-out cells and their subsets (``None``: no section of the report needs it).

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
    loadings_are_weights
        Whether ``loadings`` are a linear decoder's weights (else the mean Jacobian).
    jacobians, gram_jacobians
        The Jacobians in a small gene-space basis, on all genes and on ``CellSubsets.genes``.
    ppc, ppc_halves
        Posterior predictive statistics on ``CellSubsets.ppc`` (all draws, and the two halves of the draws).
    guide
        Guide draws on ``CellSubsets.rhat``.
    guide_repeat
        A second, independent set of guide draws of the first fit (the baseline of the cross-seed spread).
    latent_fit
        Posterior means on ``CellSubsets.fit`` of the fit cells (``None`` without them).
    latent_fit_all
        Posterior means on every fit cell, when ``CellSubsets.fit`` leaves some out (else ``None``: ``latent_fit``
        holds them all): the analyst's k-NN graph holds every cell.
    knn_draws
        Two independent guide draws on ``CellSubsets.knn``, (2, cells, n_latent), float32.
    knn_draws_fit
        The same on ``CellSubsets.fit`` of the fit cells (``None`` without them).

    """

    latent: np.ndarray
    lpd: pd.DataFrame | None = None
    log_rate: np.ndarray | None = None
    normalized: np.ndarray | None = None
    span: np.ndarray | None = None
    gram: np.ndarray | None = None
    loadings: np.ndarray | None = None
    loadings_are_weights: bool = False
    jacobians: ReducedJacobians | None = None
    gram_jacobians: ReducedJacobians | None = None
    ppc: PPCStatistics | None = None
    ppc_halves: tuple[PPCStatistics, PPCStatistics] | None = None
    guide: GuideDraws | None = None
    guide_repeat: GuideDraws | None = None
    latent_fit: np.ndarray | None = None
    latent_fit_all: np.ndarray | None = None
    knn_draws: np.ndarray | None = None
    knn_draws_fit: np.ndarray | None = None


@dataclass
class BatchReference:
    """The registered batch of the scored cells, and their embedding without a model.

    Attributes
    ----------
    key
        The registered batch column.
    heldout, fit
        Batch labels (text) of the held-out cells of ``CellSubsets.knn``, and of the fit cells of
        ``CellSubsets.fit`` (``None`` without them).
    pca_heldout, pca_fit
        The same cells' principal components of ``log1p`` counts per 10,000 (as many as the first fit's latent
        dimensions), fitted on them together (:func:`~countvae.diagnostics.analyses.baseline.normalized_counts_pca`).

    """

    key: str
    heldout: np.ndarray
    fit: np.ndarray | None
    pca_heldout: np.ndarray
    pca_fit: np.ndarray | None


def batch_reference(
    adata: ad.AnnData, adata_fit_cells: ad.AnnData | None, var_names: pd.Index, n_components: int, seed: int
) -> BatchReference | None:
    """The held-out (and given fit) cells' batches and no-model embedding; ``None`` without a registered batch."""
    heldout = _batch_labels(adata)
    if heldout is None:
        return None
    fit = None if adata_fit_cells is None else _batch_labels(adata_fit_cells)
    counts = observed_counts(adata, var_names)
    if fit is not None:
        counts = sp.vstack([counts, observed_counts(adata_fit_cells, var_names)], format="csr")
    pca = normalized_counts_pca(counts, n_components, seed)
    n = adata.n_obs
    return BatchReference(str(get_registry(adata).batch_key), heldout, fit, pca[:n], None if fit is None else pca[n:])


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
    baseline_lpd
        Per-cell held-out ``log p(x)`` on ``subsets.lpd`` under the no-latent baseline.
    baseline_source
        Which cells the baseline was estimated on.
    true_sources
        The simulation's sources on the held-out cells (``obsm["z_true"]``), or ``None``.
    n_fit_cells
        Cells the fits were trained on, when known.
    obs_names
        The held-out cells' names, in order.
    fit_obs_names
        The names of the fit cells of ``CellSubsets.fit``, in order (``None`` without fit cells).
    downstream_request, de_calls
        The downstream section's request and the fits' DE calls it asked for (``None`` without them).
    restriction_request, restriction_arrays
        The restrictions section's request and its restricted fits' read-outs (``None`` without them).
    batches
        The registered batches and no-model embedding (:class:`BatchReference`) of ``CellSubsets.knn`` and
        ``CellSubsets.fit``, when ``"batches"`` is in the needs and the held-out data have a registered batch column.
    configuration
        The fits' configuration as the calibration regimes record it (package, decoder, likelihood, prior,
        architecture, latent dimensions, held-out cells, genes, batch, seeds, training, fit cells, report settings,
        real or simulated cells), to choose the nearest calibrated regime.

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
    baseline_lpd: np.ndarray | None = None
    baseline_source: str = ""
    true_sources: np.ndarray | None = None
    n_fit_cells: int | None = None
    obs_names: pd.Index | None = None
    fit_obs_names: pd.Index | None = None
    downstream_request: DownstreamRequest | None = None
    de_calls: DECalls | None = None
    configuration: dict[str, Any] | None = None
    restriction_request: RestrictionRequest | None = None
    restriction_arrays: RestrictionArrays | None = None
    batches: BatchReference | None = None

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


def fit_cell_latents(c: Collected) -> dict[str, np.ndarray] | None:
    """Every fit's latent means on the fit cells, when the report has them (the k-NN row's reference cells)."""
    latents = c.per_fit("latent_fit")
    return None if not latents or any(z is None for z in latents.values()) else latents


def every_fit_cell_latents(c: Collected) -> dict[str, np.ndarray] | None:
    """Every fit's latent means on all of the fit cells (the k-NN row's reference cells), when the report has them."""
    every = c.per_fit("latent_fit_all")
    return every if every and all(z is not None for z in every.values()) else fit_cell_latents(c)


def knn_graph_cells(c: Collected, s: ReportSettings) -> int | None:
    """Cells of the graph the k-NN row speaks about: the setting, else every held-out and fit cell when known."""
    if s.knn_graph_cells is not None:
        return s.knn_graph_cells
    return None if fit_cell_latents(c) is None or c.n_fit_cells is None else c.n_cells + c.n_fit_cells


def knn_positions(c: Collected) -> np.ndarray:
    """Positions of the held-out cells of the k-NN graph (``CellSubsets.knn``, else every held-out cell)."""
    return c.subsets.knn if c.subsets.knn is not None else np.arange(c.n_cells)


def analyst_graph(c: Collected, s: ReportSettings) -> KnnGraph:
    """The k-NN row's graph: every held-out cell and every fit cell of :func:`every_fit_cell_latents`."""
    every = every_fit_cell_latents(c)
    n_fit = len(next(iter(every.values()))) if every else 0
    return KnnGraph.of(c.n_cells, c.n_cells, n_fit, s.k, knn_graph_cells(c, s))


def knn_graph(c: Collected, s: ReportSettings, n_fit: int | None = None) -> KnnGraph:
    """The graph of the k-NN subsets: the held-out cells of :func:`knn_positions` and ``n_fit`` fit cells.

    The graph of the within-seed baseline, the batch mixing and the placement, whose guide draws and no-model embedding
    the report has on these cells only; ``k`` is scaled when it holds fewer cells than :func:`analyst_graph` (with or
    without fit cells), so that a neighbourhood keeps its share of the cells.
    ``n_fit`` defaults to the fit cells of :func:`fit_cell_latents` (none without them).
    """
    if n_fit is None:
        reference = fit_cell_latents(c)
        n_fit = len(next(iter(reference.values()))) if reference else 0
    return KnnGraph.of(c.n_cells, len(knn_positions(c)), n_fit, s.k, analyst_graph(c, s).graph_cells)


#: Every output a fit can be asked for (the ``needs`` of the report's sections name them).
ALL_NEEDS = frozenset(
    ({f.name for f in fields(FitArrays)} - {"loadings_are_weights"})
    | {"differential_expression", "restrictions", "batches"}
)
_DECODER = frozenset({"span", "gram", "loadings", "jacobians", "gram_jacobians"})


def _collect_fit(
    fit: FittedModel,
    chain: int,
    adata: ad.AnnData,
    views: dict[str, ad.AnnData],
    sub: CellSubsets,
    ppc_counts: np.ndarray,
    s: ReportSettings,
    lpd: pd.DataFrame | None,
    needs: frozenset[str] = ALL_NEEDS,
) -> FitArrays:
    """What one fit provides of ``needs`` (see :class:`FitArrays`; the rest is ``None``), given its ``lpd`` frame."""
    latent = np.asarray(_given(fit.latent(adata), fit, "latent"), dtype=np.float64)
    out = FitArrays(latent=latent, lpd=lpd)
    if needs & {"log_rate", "normalized"}:
        z_expr = latent[sub.expression]
        log_rate = np.asarray(
            _given(fit.decode_log_rate(views["expression"], z_expr.astype(np.float32)), fit, "decode_log_rate"),
            dtype=np.float64,
        )
        expression = _given(fit.normalized_expression(views["expression"]), fit, "normalized_expression")
        normalized = np.log1p(np.asarray(expression, dtype=np.float64))
        out.log_rate, out.normalized = log_rate[:, sub.genes], normalized[:, sub.genes]
    if needs & _DECODER:
        jac = gene_contrasts(_given(fit.decoder_jacobian(views["jacobian"]), fit, "decoder_jacobian"))
        sel = jac[:, sub.genes, :]
        stacked = np.transpose(sel, (1, 0, 2)).reshape(len(sub.genes), -1)
        weights = fit.loadings()
        out.span = jacobian_span(jac, fit.n_latent, seed=s.seed)
        out.gram = stacked @ stacked.T / jac.shape[0]
        out.loadings = np.asarray(weights, dtype=np.float64) if weights is not None else jac.mean(axis=0)
        out.loadings_are_weights = weights is not None
        out.jacobians, out.gram_jacobians = reduce_jacobians(jac, seed=s.seed), reduce_jacobians(sel, seed=s.seed)
    if needs & {"ppc", "ppc_halves"}:
        predicted = _given(fit.posterior_predictive(views["ppc"], s.n_ppc_samples, s.seed), fit, "posterior_predictive")
        draws = np.asarray(predicted, dtype=np.float64)
        out.ppc, out.ppc_halves = predictive_statistics(ppc_counts, draws), split_half_statistics(ppc_counts, draws)
    if "guide" in needs:
        # Chain c draws with seed + c, so that the chains are independent even when two fits are identical.
        out.guide = guide_draws(fit, views["rhat"], s.n_rhat_draws, s.seed + chain, sub.rhat_genes)
    if "guide_repeat" in needs and chain == 0:
        # The first fit draws once more, independently (a seed no chain uses): the within-seed baseline.
        out.guide_repeat = guide_draws(fit, views["rhat"], s.n_rhat_draws, s.seed + 10_007, sub.rhat_genes)
    if "latent_fit" in needs and "fit" in views:
        out.latent_fit = np.asarray(_given(fit.latent(views["fit"]), fit, "latent"), dtype=np.float64)
    if "knn_draws_fit" in needs and "fit" in views:
        # Right after latent_fit: an scvi-tools fit sets up a copy of the last AnnData it was given, once.
        draws = _given(fit.latent_samples(views["fit"], 2, s.seed + 30_011 + chain), fit, "latent_samples")
        out.knn_draws_fit = np.asarray(draws, dtype=np.float32)
    if "latent_fit_all" in needs and "fit_all" in views:
        out.latent_fit_all = _latent_in_chunks(fit, views["fit_all"], s.max_fit_cells)
    if "knn_draws" in needs:
        # Two draws per fit on the k-NN cells, seeded apart from every other draw (and from the other fits').
        draws = _given(fit.latent_samples(views["knn"], 2, s.seed + 20_011 + chain), fit, "latent_samples")
        out.knn_draws = np.asarray(draws, dtype=np.float32)
    return out


def _latent_in_chunks(fit: FittedModel, adata: ad.AnnData, chunk: int) -> np.ndarray:
    """``fit``'s latent means on every cell of ``adata``, read ``chunk`` cells at a time (it may be a backed view)."""
    parts = [
        _given(fit.latent(cells_in_memory(adata, np.arange(start, min(start + chunk, adata.n_obs)))), fit, "latent")
        for start in range(0, adata.n_obs, chunk)
    ]
    return np.concatenate(parts).astype(np.float64)


def _given(value: Any, fit: FittedModel, method: str) -> Any:
    """``value``, or a clear error when ``fit``'s ``method`` returned ``None``.

    Only ``log_predictive_density`` and ``loadings`` may return ``None`` (the rows they feed then read "not measured");
    every other output feeds computations that have no such path.
    """
    if value is None:
        raise InvalidArgumentError(
            f"Fit {fit.name!r}: {method} returned None, but the report's sections need it; only "
            "log_predictive_density and loadings may return None (the rows they feed then read 'not measured'). "
            "Implement it, or pass sections= without the sections that need it."
        )
    return value


def default_markers_with_labels(adata: ad.AnnData, var_names: pd.Index, n: int) -> list[str]:
    """The ``n`` most variable genes, plus the registered ``labels_key`` column if there is one."""
    markers = default_markers(adata, var_names, n)
    registry = get_registry(adata)
    if registry is not None and registry.labels_key and registry.labels_key in adata.obs.columns:
        markers.append(registry.labels_key)
    return markers


def _batch_labels(adata: ad.AnnData) -> np.ndarray | None:
    """Each cell's registered batch as text, or ``None`` without a registered batch column."""
    registry = get_registry(adata)
    if registry is None or not registry.batch_key or registry.batch_key not in adata.obs.columns:
        return None
    return adata.obs[registry.batch_key].astype(str).to_numpy()


def no_latent_baseline(
    heldout: ad.AnnData, adata_fit: ad.AnnData | None, var_names: pd.Index, max_cells: int, seed: int
) -> tuple[np.ndarray, str]:
    """Per-cell held-out log p(x) under the no-latent baseline, and the cells it was estimated on."""
    source, text = (adata_fit, "the fit cells") if adata_fit is not None else (heldout, "the held-out cells")
    positions = subsample(source.n_obs, max_cells, seed)
    if source.isbacked:  # read only these cells from the file (a view of a backed file cannot be indexed again)
        source = cells_in_memory(source, positions)
    elif source.n_obs > max_cells:
        source = source[positions]
    model = fit_baseline(observed_counts(source, var_names), _batch_labels(source))
    return baseline_log_likelihood(model, observed_counts(heldout, var_names), _batch_labels(heldout)), text


def marker_list(markers: Any) -> list | None:
    """``markers`` as a list (one name as a list of it, not of its letters); ``None`` stays ``None``.

    Raises
    ------
    InvalidArgumentError
        Neither a name nor an iterable of names.

    """
    if markers is None:
        return None
    if isinstance(markers, str):
        return [markers]
    if not isinstance(markers, Iterable):
        raise InvalidArgumentError(f"markers must be a gene or obs column name, or a list of them, got {markers!r}.")
    return list(markers)


def collect(
    fits: list[FittedModel],
    adata: ad.AnnData,
    markers: Sequence[str] | None,
    s: ReportSettings,
    fit_settings: dict[str, Any],
    stopwatch: Stopwatch,
    progress_bar: bool = False,
    adata_fit: ad.AnnData | None = None,
    needs: frozenset[str] = ALL_NEEDS,
    downstream: DownstreamRequest | None = None,
    restrictions: RestrictionRequest | None = None,
) -> Collected:
    """Visit each fit once on the held-out cells ``adata`` (and ``adata_fit``'s cells; steps timed by ``stopwatch``).

    Each fit is asked only for the outputs in ``needs`` (the union of the needs of the report's sections);
    the DE of the ``downstream`` request when ``"differential_expression"`` is among them, the restricted
    fits of the ``restrictions`` request when ``"restrictions"`` is, and the cells' batches when ``"batches"`` is.
    """
    if restrictions is not None and "restrictions" in needs:
        restrictions.check(fits, adata)
    var_names = pd.Index(fits[0].var_names)
    marker_names = marker_list(markers)
    if marker_names is None:
        marker_names = default_markers_with_labels(adata, var_names, s.n_markers)
    marker_values = marker_matrix(adata, marker_names, var_names)
    sub = cell_subsets(adata, var_names, s, None if adata_fit is None else adata_fit.n_obs)
    views = {name: adata[getattr(sub, name)].copy() for name in ("lpd", "expression", "jacobian", "ppc", "rhat", "knn")}
    if adata_fit is not None and needs & {"latent_fit", "knn_draws_fit"}:
        views["fit"] = cells_in_memory(adata_fit, sub.fit)  # the fit cells may be a view of a backed file
    if adata_fit is not None and "latent_fit_all" in needs and len(sub.fit) < adata_fit.n_obs:
        views["fit_all"] = adata_fit  # read in chunks by _collect_fit
    ppc_counts = observed_counts(views["ppc"], var_names).toarray()
    checksum = data_checksum(adata, var_names)
    baseline, baseline_source = no_latent_baseline(views["lpd"], adata_fit, var_names, s.max_baseline_cells, s.seed + 6)
    truth = np.asarray(adata.obsm["z_true"], dtype=np.float64) if "z_true" in adata.obsm else None
    stopwatch.lap("prepare")
    arrays: dict[str, FitArrays] = {}
    started = time.perf_counter()
    lpds = heldout_lpd(fits, views["lpd"], s) if "lpd" in needs else [None] * len(fits)
    lpd_seconds = time.perf_counter() - started
    for chain, fit in enumerate(tqdm(fits, desc="diagnostics", unit="fit", disable=not progress_bar)):
        logger.info("Collecting the outputs of %s", fit.name)
        arrays[fit.name] = _collect_fit(fit, chain, adata, views, sub, ppc_counts, s, lpds[chain], needs)
    stopwatch.lap("per-fit outputs")
    de = None
    if downstream is not None and "differential_expression" in needs:
        de = collect_de(fits, adata, downstream)
        stopwatch.lap("DE calls (downstream section)")
    restricted = None
    if restrictions is not None and "restrictions" in needs:
        restricted = collect_restrictions(restrictions, marker_values.to_numpy(dtype=np.float64), var_names)
        stopwatch.lap("restricted fits (restrictions section)")
    batches = None
    if "batches" in needs:
        batches = batch_reference(views["knn"], views.get("fit"), var_names, int(fits[0].n_latent), s.seed + 7)
        stopwatch.lap("batches and their no-model embedding")
    # Part of "per-fit outputs", timed apart because it is usually the slowest part of collecting.
    stopwatch.timings["of which held-out log p(x)"] = round(lpd_seconds, 3)
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
        baseline_lpd=baseline,
        baseline_source=baseline_source,
        true_sources=truth,
        n_fit_cells=None if adata_fit is None else int(adata_fit.n_obs),
        obs_names=pd.Index(adata.obs_names.astype(str)),
        fit_obs_names=None if "fit" not in views else pd.Index(views["fit"].obs_names.astype(str)),
        downstream_request=downstream,
        de_calls=de,
        configuration=configuration_of_fits(
            fits,
            int(adata.n_obs),
            fit_cells=adata_fit is not None,
            report_settings=changed_report_settings(s),
            data="real" if truth is None else "simulated",
        ),
        restriction_request=restrictions if restricted is not None else None,
        restriction_arrays=restricted,
        batches=batches,
    )
