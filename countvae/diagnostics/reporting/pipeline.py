"""``report(fits, adata_heldout)``: every multi-seed diagnostic on the shared held-out cells, in one object.

The computation visits each fit once for what it must provide (latent means,
held-out log predictive densities, decoded means, Jacobians, posterior
predictive draws, guide draws) and then compares the fits pairwise. Work that
grows faster than linearly in cells, or that is expensive per cell, runs on a
random subset of the held-out cells whose size is recorded in
``DiagnosticReport.subsampling`` and stated in the report.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits  # a dependency of scikit-learn
from tqdm.auto import tqdm

from countvae._provenance import package_versions
from countvae.data.registry import get_registry
from countvae.diagnostics.analyses.alignment import MAP_CLASSES, alignment_errors, ica_efficiency, summarize_alignment
from countvae.diagnostics.analyses.components import empty_tables, headline_sentence, ica_component_stability
from countvae.diagnostics.analyses.heldout_data import data_checksum, gene_variance, observed_counts
from countvae.diagnostics.analyses.invariants import ROTATION, STABLE, UNSTABLE, InvariantInputs, invariants_table
from countvae.diagnostics.analyses.markers import (
    default_markers,
    marker_correlations,
    marker_matrix,
    marker_r2_table,
    marker_summary,
)
from countvae.diagnostics.analyses.ppc import (
    PPCStatistics,
    observed_statistics,
    ppc_agreement,
    ppc_table,
    predictive_statistics,
    split_half_statistics,
)
from countvae.diagnostics.analyses.predictive import compare_table, equivalence_verdict, pairwise_table, per_fit_table
from countvae.diagnostics.analyses.rhat import collect_draws, procrustes_to_reference, rhat_table
from countvae.diagnostics.analyses.subspace import covariance_spectrum, geometry_table, jacobian_span, subsample
from countvae.diagnostics.fitting.fitted_model import FittedModel
from countvae.diagnostics.fitting.seed_fits import SeedFits
from countvae.errors import InvalidArgumentError, InvalidDataError

logger = logging.getLogger(__name__)


@dataclass
class ReportSettings:
    """Sizes and seeds of the diagnostics (all recorded in the report).

    Attributes
    ----------
    n_lpd_samples
        Importance samples per cell for the held-out log predictive density.
    max_lpd_cells
        Held-out cells whose log predictive density is estimated at most.
    max_expression_cells, max_genes
        Cells and genes (largest variance of log1p-normalized counts) on which
        decoded means, normalized expression and the decoder Gram are compared.
    max_jacobian_cells
        Cells whose decoder Jacobians span the gene-space subspace.
    max_ppc_cells, n_ppc_samples
        Cells and draws of the posterior predictive checks.
    n_rhat_cells, n_rhat_draws, n_rhat_genes
        Cells, guide draws per seed, and genes of the cross-seed R-hat.
    max_distance_cells, max_knn_cells, k
        Cells whose pairwise distances and k-NN graphs (``k`` neighbours) are compared.
    n_markers
        Default markers (genes of largest variance) when none are given.
    ica
        Add the ICA map class, the ICA efficiency, the ICA coordinates row and
        the per-component stability of ICA across seeds (``DiagnosticReport.ica``).
    ica_threshold
        An ICA component reproduces across seeds when its mean best-match
        |correlation| is at least this (see :mod:`countvae.diagnostics.analyses.components`).
    seed
        Seed of every subset and Monte Carlo draw.
    blas_threads
        BLAS threads during the analysis (``None``: leave as set). The matrices
        here are small (cells x latent dims), so extra threads gain little, while
        on a busy machine spin-waiting BLAS threads made single calls up to 100x
        slower in our measurements; hence 1.

    """

    n_lpd_samples: int = 100
    max_lpd_cells: int = 500
    max_expression_cells: int = 1_000
    max_genes: int = 500
    max_jacobian_cells: int = 200
    max_ppc_cells: int = 300
    n_ppc_samples: int = 10
    n_rhat_cells: int = 20
    n_rhat_draws: int = 100
    n_rhat_genes: int = 10
    max_distance_cells: int = 1_000
    max_knn_cells: int = 5_000
    k: int = 15
    n_markers: int = 8
    ica: bool = True
    ica_threshold: float = 0.95
    seed: int = 0
    blas_threads: int | None = 1

    def validate(self) -> None:
        """Raise :class:`InvalidArgumentError` for sizes that cannot work."""
        minimum = {
            "n_lpd_samples": 2,
            "max_lpd_cells": 2,
            "max_expression_cells": 2,
            "max_genes": 1,
            "max_jacobian_cells": 1,
            "max_ppc_cells": 2,
            "n_ppc_samples": 4,
            "n_rhat_cells": 2,
            "n_rhat_draws": 4,
            "n_rhat_genes": 0,
            "max_distance_cells": 3,
            "max_knn_cells": 3,
            "k": 1,
            "n_markers": 1,
        }
        if isinstance(self.ica_threshold, bool) or not (
            isinstance(self.ica_threshold, float | int) and 0.0 < self.ica_threshold <= 1.0
        ):
            raise InvalidArgumentError(f"ica_threshold must be a number in (0, 1], got {self.ica_threshold!r}.")
        if self.blas_threads is not None and (not isinstance(self.blas_threads, int) or self.blas_threads < 1):
            raise InvalidArgumentError(f"blas_threads must be None or an integer >= 1, got {self.blas_threads!r}.")
        for name, low in minimum.items():
            value = getattr(self, name)
            if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < low:
                raise InvalidArgumentError(f"{name} must be an integer >= {low}, got {value!r}.")


@dataclass
class DiagnosticReport:
    """The multi-seed diagnostics of one model on shared held-out cells.

    Attributes
    ----------
    headline
        The verdict in plain sentences, most important first.
    invariants
        One row per quantity: invariant in theory, agreement across seeds, verdict, what to report instead.
    alignment
        Seed-pair alignment errors per map class (see :mod:`countvae.diagnostics.analyses.alignment`).
    predictive
        Held-out log predictive density per seed.
    subspace
        Rotation-invariant geometry per seed pair: CKA, k-NN overlap, covariance
        spectra distance, principal angles of the gene-space spans.
    rhat
        Cross-seed R-hat and ESS per quantity.
    markers
        Per marker: invariant R^2 across seeds against the per-dimension story.
    ppc
        Posterior predictive checks per seed.
    ica
        Per ICA component of the first fit: its best-match |correlation| with
        the other fits' ICA components (``mean_match``, ``median_match``,
        ``min_match``; ICAs estimated on disjoint halves of the held-out
        cells), excess kurtosis, negentropy, the Gaussian flag and whether it
        ``reproducible`` (see :mod:`countvae.diagnostics.analyses.components`). No rows
        when the report was made with ``ica=False``.
    tables
        Every other table (pairwise details, per-parameter R-hat, per-gene PPC,
        arviz comparison, spectra, marker correlations, ...), by name.
    settings
        Sizes, seeds and the fits' settings.
    subsampling
        What was computed on a subset of cells or genes, and how large it was.
    provenance
        Package versions, data checksum, fits.
    timings
        Seconds per step.

    """

    headline: list[str]
    invariants: pd.DataFrame
    alignment: pd.DataFrame
    predictive: pd.DataFrame
    subspace: pd.DataFrame
    rhat: pd.DataFrame
    markers: pd.DataFrame
    ppc: pd.DataFrame
    ica: pd.DataFrame = field(default_factory=lambda: empty_tables()[0])
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    subsampling: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        """The headline as plain text, one sentence per line."""
        return "\n".join(f"- {line}" for line in self.headline)

    def __repr__(self) -> str:
        fits = self.provenance.get("fits", [])
        return f"DiagnosticReport({len(fits)} fits)\n{self.summary()}"

    def _repr_html_(self) -> str:
        """The verdict and the invariants table, for notebooks (data-derived strings escaped)."""
        from countvae.diagnostics.reporting.render import summary_html

        return summary_html(self)

    def to_dict(self) -> dict[str, Any]:
        """Every table and setting as JSON-safe Python objects (NaN and infinities become ``None``)."""
        from countvae.diagnostics.reporting.render import report_to_dict

        return report_to_dict(self)

    def save(self, dir_path: str | Path, overwrite: bool = False) -> Path:
        """Write ``report.html`` (self-contained), ``report.json`` and ``report.md`` into a new folder.

        The folder is built under a temporary name and renamed into place, so
        it either appears complete or not at all.

        Parameters
        ----------
        dir_path
            Destination folder.
        overwrite
            Replace an existing folder; otherwise an existing folder is an error.

        Returns
        -------
        Path
            The folder.

        """
        from countvae.diagnostics.reporting.render import save_report

        return save_report(self, Path(dir_path), overwrite=overwrite)


# ----- input checks ---------------------------------------------------------------------------------
def _check_fits(fits: Sequence[FittedModel]) -> None:
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


def _resolve_inputs(
    fits: SeedFits | Sequence[FittedModel], adata_heldout: ad.AnnData | None
) -> tuple[list[FittedModel], ad.AnnData, dict[str, Any]]:
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
    _check_fits(fits)
    if adata_heldout.n_obs < 8:
        raise InvalidDataError(f"The held-out data has {adata_heldout.n_obs} cells; the diagnostics need at least 8.")
    return fits, adata_heldout, fit_settings


# ----- per-fit collection ------------------------------------------------------------------------------
@dataclass
class _Subsets:
    lpd: np.ndarray
    expression: np.ndarray
    jacobian: np.ndarray
    ppc: np.ndarray
    rhat: np.ndarray
    genes: np.ndarray
    rhat_genes: np.ndarray


def _subsets(adata: ad.AnnData, var_names: pd.Index, s: ReportSettings) -> _Subsets:
    n = adata.n_obs
    variance = gene_variance(adata, var_names, seed=s.seed)
    genes = np.sort(np.argsort(-variance, kind="stable")[: min(s.max_genes, len(var_names))])
    top = np.argsort(-variance, kind="stable")[: s.n_rhat_genes]
    return _Subsets(
        lpd=subsample(n, s.max_lpd_cells, s.seed),
        expression=subsample(n, s.max_expression_cells, s.seed + 1),
        jacobian=subsample(n, s.max_jacobian_cells, s.seed + 2),
        ppc=subsample(n, s.max_ppc_cells, s.seed + 3),
        rhat=subsample(n, s.n_rhat_cells, s.seed + 4),
        genes=genes,
        rhat_genes=np.sort(top),
    )


@dataclass
class _FitOutputs:
    latent: np.ndarray
    lpd: pd.DataFrame | None
    log_rate: np.ndarray
    normalized: np.ndarray
    span: np.ndarray
    gram: np.ndarray
    loadings: np.ndarray
    ppc: PPCStatistics
    ppc_halves: tuple[PPCStatistics, PPCStatistics]


def _collect(
    fit: FittedModel,
    adata: ad.AnnData,
    views: dict[str, ad.AnnData],
    sub: _Subsets,
    ppc_counts: np.ndarray,
    s: ReportSettings,
) -> _FitOutputs:
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
    return _FitOutputs(
        latent=latent,
        lpd=lpd,
        log_rate=log_rate[:, sub.genes],
        normalized=normalized[:, sub.genes],
        span=span,
        gram=gram,
        loadings=loadings,
        ppc=predictive_statistics(ppc_counts, draws),
        ppc_halves=split_half_statistics(ppc_counts, draws),
    )


# ----- the report ---------------------------------------------------------------------------------------
def report(
    fits: SeedFits | Sequence[FittedModel],
    adata_heldout: ad.AnnData | None = None,
    markers: Sequence[str] | None = None,
    *,
    settings: ReportSettings | None = None,
    progress_bar: bool = False,
    **overrides: Any,
) -> DiagnosticReport:
    """Compare fits of one model from several seeds on shared held-out cells.

    Parameters
    ----------
    fits
        A :class:`SeedFits` (from :func:`fit_seeds`) or a list of
        :class:`FittedModel` (e.g. ``[CountVAEFit(model, seed) ...]``), at least
        two, with distinct seeds, the same genes and the same latent width.
    adata_heldout
        Cells none of the fits was trained on (default: ``fits.adata_heldout``).
    markers
        Gene names or ``obs`` columns for the marker analysis; default: the
        genes of largest variance, plus the registered ``labels_key`` column.
    settings
        Sizes and seeds, see :class:`ReportSettings`.
    progress_bar
        Show a progress bar over the fits.
    **overrides
        Single fields of :class:`ReportSettings` to replace, e.g. ``n_lpd_samples=500``.

    Returns
    -------
    DiagnosticReport

    Raises
    ------
    InvalidArgumentError
        For one fit, duplicated seeds, fits on different genes or of different
        width, a marker that is neither a gene nor an obs column.

    """
    started = time.perf_counter()
    s = settings or ReportSettings()
    unknown = sorted(set(overrides) - set(ReportSettings.__dataclass_fields__))
    if unknown:
        raise InvalidArgumentError(f"Unknown report settings {unknown}; see ReportSettings.")
    s = ReportSettings(**{**s.__dict__, **overrides})
    s.validate()
    fit_list, adata, fit_settings = _resolve_inputs(fits, adata_heldout)
    limit = threadpool_limits(limits=s.blas_threads, user_api="blas") if s.blas_threads else contextlib.nullcontext()
    with limit:
        return _report(fit_list, adata, fit_settings, markers, s, progress_bar, started)


def _report(
    fit_list: list[FittedModel],
    adata: ad.AnnData,
    fit_settings: dict[str, Any],
    markers: Sequence[str] | None,
    s: ReportSettings,
    progress_bar: bool,
    started: float,
) -> DiagnosticReport:
    var_names = pd.Index(fit_list[0].var_names)
    timings: dict[str, float] = {}

    def lap(name: str, t0: float) -> float:
        now = time.perf_counter()
        timings[name] = round(now - t0, 3)
        return now

    t = time.perf_counter()
    marker_names = list(markers) if markers is not None else _default_markers(adata, var_names, s.n_markers)
    marker_values = marker_matrix(adata, marker_names, var_names)
    sub = _subsets(adata, var_names, s)
    views = {
        "lpd": adata[sub.lpd].copy(),
        "expression": adata[sub.expression].copy(),
        "jacobian": adata[sub.jacobian].copy(),
        "ppc": adata[sub.ppc].copy(),
        "rhat": adata[sub.rhat].copy(),
    }
    ppc_counts = observed_counts(views["ppc"], var_names).toarray()
    t = lap("prepare", t)

    outputs: dict[str, _FitOutputs] = {}
    for fit in tqdm(fit_list, desc="diagnostics", unit="fit", disable=not progress_bar):
        logger.info("Collecting the outputs of %s", fit.name)
        outputs[fit.name] = _collect(fit, adata, views, sub, ppc_counts, s)
    t = lap("per-fit outputs", t)

    latents = {name: o.latent for name, o in outputs.items()}
    tables: dict[str, pd.DataFrame] = {}

    lpds = {name: o.lpd for name, o in outputs.items() if o.lpd is not None}
    predictive_ok = len(lpds) == len(outputs)
    if predictive_ok:
        predictive = per_fit_table(lpds)
        pairs = pairwise_table(lpds)
        tables["predictive_pairs"] = pairs
        tables["predictive_compare"] = compare_table(lpds).reset_index()
        equivalent, predictive_sentence = equivalence_verdict(pairs)
    else:
        predictive, pairs, equivalent = pd.DataFrame(columns=["fit"]), None, None
        predictive_sentence = (
            "Held-out log p(x) is not available for these fits, so predictive equivalence is untested."
        )
    t = lap("predictive", t)

    map_classes = MAP_CLASSES if s.ica else tuple(m for m in MAP_CLASSES if m != "ica")
    alignment = alignment_errors(latents, map_classes, seed=s.seed)
    tables["alignment_summary"] = summarize_alignment(alignment)
    if s.ica:
        tables["ica_efficiency"] = ica_efficiency(alignment)
    t = lap("alignment", t)

    if s.ica:
        ica_table, tables["ica_matches"] = ica_component_stability(latents, threshold=s.ica_threshold, seed=s.seed)
    else:
        ica_table, tables["ica_matches"] = empty_tables()
    t = lap("ica components", t)

    spans = {name: o.span for name, o in outputs.items()}
    subspace = geometry_table(latents, spans, k=s.k, max_knn_cells=s.max_knn_cells, seed=s.seed)
    tables["covariance_spectra"] = pd.DataFrame(
        [
            {"fit": name, "component": i, "eigenvalue": float(v)}
            for name, z in latents.items()
            for i, v in enumerate(covariance_spectrum(z))
        ]
    )
    t = lap("subspace", t)

    maps = procrustes_to_reference(latents, fit_list[0].name)
    draws = collect_draws(
        fit_list,
        views["rhat"],
        n_draws=s.n_rhat_draws,
        gene_positions=sub.rhat_genes,
        maps={name: maps[name] for name in latents},
        seed=s.seed,
    )
    rhat, rhat_parameters = rhat_table(draws)
    tables["rhat_parameters"] = rhat_parameters
    t = lap("rhat", t)

    marker_summary_table = marker_summary(latents, marker_values)
    tables["marker_correlations"] = marker_correlations(latents, marker_values)
    tables["marker_r2"] = marker_r2_table(latents, marker_values)
    t = lap("markers", t)

    observed = observed_statistics(ppc_counts)
    predicted = {name: o.ppc for name, o in outputs.items()}
    ppc = ppc_table(observed, predicted)
    tables["ppc_pairs"] = ppc_agreement(observed, {name: o.ppc_halves for name, o in outputs.items()})
    tables["ppc_genes"] = pd.concat(
        [
            pd.DataFrame(
                {
                    "fit": name,
                    "gene": [str(g) for g in var_names],
                    "observed_zero_fraction": observed.zero_fraction,
                    "predicted_zero_fraction": stats.zero_fraction,
                    "observed_cv": observed.cv_gene,
                    "predicted_cv": stats.cv_gene,
                }
            ).iloc[sub.genes]
            for name, stats in predicted.items()
        ],
        ignore_index=True,
    )
    t = lap("ppc", t)

    invariants, invariant_pairs = invariants_table(
        InvariantInputs(
            latents=latents,
            symmetry=fit_list[0].symmetry,
            lpd_pairs=pairs,
            ppc_pairs=tables["ppc_pairs"],
            log_rates={n: o.log_rate for n, o in outputs.items()},
            normalized={n: o.normalized for n, o in outputs.items()},
            spans=spans,
            grams={n: o.gram for n, o in outputs.items()},
            loadings={n: o.loadings for n, o in outputs.items()},
            markers=marker_values,
            ica=s.ica,
        ),
        k=s.k,
        max_knn_cells=s.max_knn_cells,
        max_distance_cells=s.max_distance_cells,
        seed=s.seed,
    )
    tables["invariant_pairs"] = invariant_pairs
    t = lap("invariants", t)

    n = adata.n_obs
    subsampling = {
        "heldout_cells": n,
        "genes": len(var_names),
        "log predictive density": f"{len(sub.lpd)} of {n} cells",
        "decoded means, normalized expression, decoder Gram": (
            f"{len(sub.expression)} of {n} cells; {len(sub.genes)} of {len(var_names)} genes "
            "(largest variance of log1p-normalized counts)"
        ),
        "gene-space span (decoder Jacobians)": f"{len(sub.jacobian)} of {n} cells",
        "posterior predictive checks": f"{len(sub.ppc)} of {n} cells, {s.n_ppc_samples} draws per cell",
        "pairwise latent distances": f"{min(n, s.max_distance_cells)} of {n} cells (quadratic in cells)",
        "k-NN graphs": f"{min(n, s.max_knn_cells)} of {n} cells, k={min(s.k, min(n, s.max_knn_cells) - 1)}",
        "latent diameter": f"{min((n + 1) // 2, 10_000)} scoring cells at most (quadratic in cells)",
        "cross-seed R-hat": (
            f"{len(sub.rhat)} cells, {s.n_rhat_draws} guide draws per seed, {len(sub.rhat_genes)} genes"
        ),
        "alignment maps": "fitted on a random half of the held-out cells, scored on the other half",
    }
    if s.ica:
        subsampling["ICA component stability"] = (
            f"ICA of {fit_list[0].name} on a random half of the {n} held-out cells, of every other fit on the other "
            "half; components matched on all held-out cells"
        )
    provenance = _provenance(fit_list, adata, var_names)
    alignment_mean = tables["alignment_summary"].set_index("map")["error_diameter_mean"]
    headline = _headline(
        invariants,
        predictive_sentence,
        alignment_mean,
        tables.get("ica_efficiency"),
        marker_summary_table,
        len(fit_list),
        ica_sentence=headline_sentence(ica_table, s.ica_threshold),
    )
    timings["total"] = round(time.perf_counter() - started, 3)
    return DiagnosticReport(
        headline=headline,
        invariants=invariants,
        alignment=alignment,
        predictive=predictive,
        subspace=subspace,
        rhat=rhat,
        markers=marker_summary_table,
        ppc=ppc,
        ica=ica_table,
        tables=tables,
        settings={
            "report": dict(s.__dict__),
            "markers": [str(m) for m in marker_names],
            "predictively_equivalent": equivalent,
            "fits": fit_settings,
        },
        subsampling=subsampling,
        provenance=provenance,
        timings=timings,
    )


def _default_markers(adata: ad.AnnData, var_names: pd.Index, n: int) -> list[str]:
    markers = default_markers(adata, var_names, n)
    registry = get_registry(adata)
    if registry is not None and registry.labels_key and registry.labels_key in adata.obs.columns:
        markers.append(registry.labels_key)
    return markers


def _provenance(fits: list[FittedModel], adata: ad.AnnData, var_names: pd.Index) -> dict[str, Any]:
    return {
        "versions": package_versions("arviz", "matplotlib"),
        "heldout_checksum_sha256": data_checksum(adata, var_names),
        "heldout_cells": int(adata.n_obs),
        "genes": int(len(var_names)),
        "fits": [
            {"name": f.name, "seed": int(f.seed), "kind": f.kind, "symmetry": f.symmetry, "n_latent": int(f.n_latent)}
            for f in fits
        ],
    }


def _listing(names: list[str]) -> str:
    return ", ".join(names) if names else "none"


def _headline(
    invariants: pd.DataFrame,
    predictive_sentence: str,
    alignment_mean: pd.Series,
    efficiency: pd.DataFrame | None,
    markers: pd.DataFrame,
    n_fits: int,
    ica_sentence: str | None = None,
) -> list[str]:
    by = {v: invariants.loc[invariants["verdict"] == v, "quantity"].tolist() for v in (STABLE, ROTATION, UNSTABLE)}
    theory = dict(zip(invariants["quantity"], invariants["invariant_in_theory"], strict=True))
    seeds = "both seeds" if n_fits == 2 else f"all {n_fits} seeds"
    lines = [f"Identified here (agree across {seeds}): {_listing(by[STABLE])}."]
    if by[ROTATION]:
        lines.append(
            f"Determined only up to a rotation of the latent space (differ between seeds, agree after aligning "
            f"them): {_listing(by[ROTATION])}. Do not interpret these one dimension at a time."
        )
    unstable_invariant = [q for q in by[UNSTABLE] if theory.get(q) == "yes"]
    unstable_other = [q for q in by[UNSTABLE] if theory.get(q) != "yes"]
    if unstable_invariant:
        lines.append(
            f"Not reproducible although the model's symmetry cannot explain it: {_listing(unstable_invariant)}. "
            "The seeds reached different solutions (or did not converge); report their spread."
        )
    if unstable_other:
        lines.append(f"Not reproducible even after alignment: {_listing(unstable_other)}.")
        rows = invariants.set_index("quantity").loc[unstable_other]
        gain = rows["aligned_agreement"] - rows["agreement"]
        mostly = rows[gain >= 0.3]
        if len(mostly):
            changes = ", ".join(
                f"{q} from {r.agreement:.2f} to {r.aligned_agreement:.2f}" for q, r in mostly.iterrows()
            )
            lines.append(
                f"Rotating the seeds onto each other raises the agreement of {changes} (threshold "
                f"{mostly['threshold'].iloc[0].split()[-1]}): most of their seed-to-seed difference is the arbitrary "
                "rotation, the remainder a genuine difference between the solutions."
            )
    lines.append(predictive_sentence)
    parts = [f"{m} {alignment_mean[m]:.3f}" for m in alignment_mean.index]
    lines.append(
        "Mean seed-pair alignment error (fraction of the latent diameter; lower is better): " + ", ".join(parts) + "."
    )
    if efficiency is not None and efficiency["ica_efficiency"].notna().any():
        eff = efficiency["ica_efficiency"]
        lines.append(
            f"ICA efficiency (share of the permutation-to-rotation gap that ICA closes; 1 = all): "
            f"mean {eff.mean():.2f}, range {eff.min():.2f} to {eff.max():.2f}."
        )
    if ica_sentence:
        lines.append(ica_sentence)
    if len(markers):
        moved = int((~markers["best_dim_agrees"]).sum())
        spread = float((markers["r2_max"] - markers["r2_min"]).max())
        lines.append(
            f"Markers: for {moved} of {len(markers)} markers the best-correlated latent dimension (or its sign) "
            f"changes between seeds, while the rotation-invariant R^2 on all dimensions varies by at most "
            f"{spread:.3f} across seeds."
        )
    return lines
