"""``report(fits, adata_heldout)``: every multi-seed diagnostic on the shared held-out cells, in one object.

The report is a pipeline of four steps, each in its own module:

1. :mod:`.collect` visits each fit once for what it must provide (latent means,
   held-out log p(x), decoded means, Jacobians, posterior predictive draws,
   guide draws) and keeps the arrays;
2. :mod:`.analyze` runs every analysis on those arrays (the maps between fits
   are fitted once per pair and shared), each agreement with its interval;
3. :mod:`.verdicts` decides the verdicts from the numbers, intervals and
   thresholds (agree, agree after alignment, differ, undetermined), and
   :mod:`.headline` states them;
4. :class:`~.diagnostic_report.DiagnosticReport` holds the result; its
   renderers only render.

Work that grows faster than linearly in cells, or that is expensive per cell,
runs on a random subset of the held-out cells whose size is recorded in
``DiagnosticReport.subsampling`` and stated in the report.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import anndata as ad
import pandas as pd
from threadpoolctl import threadpool_limits  # a dependency of scikit-learn

from countvae._settings import takes_settings
from countvae.diagnostics.fitting.fitted_model import FittedModel
from countvae.diagnostics.fitting.seed_fits import SeedFits
from countvae.diagnostics.reporting.analyze import Analyses, analyze
from countvae.diagnostics.reporting.collect import Collected, collect, resolve_inputs
from countvae.diagnostics.reporting.diagnostic_report import DiagnosticReport
from countvae.diagnostics.reporting.downstream_section import DownstreamRequest, downstream_section
from countvae.diagnostics.reporting.headline import headline, ica_sentence, predictive_sentence, truth_sentence
from countvae.diagnostics.reporting.report_content import MAIN_TABLES
from countvae.diagnostics.reporting.settings import ReportSettings
from countvae.diagnostics.reporting.stopwatch import Stopwatch
from countvae.diagnostics.reporting.verdict_calibration import (
    calibration_sentences,
    calibration_summary,
    calibration_table,
    load_calibration,
)
from countvae.diagnostics.reporting.verdicts import (
    PredictiveVerdict,
    ica_row_judgement,
    judge_components,
    judge_invariants,
    predictive_verdict,
)

__all__ = ["DiagnosticReport", "DownstreamRequest", "ReportSettings", "report"]


# The settings of report are the fields of ReportSettings, each written once there (countvae._settings says why this
# departs from scvi-tools' explicit keyword arguments).
@takes_settings(ReportSettings)
def report(
    fits: SeedFits | Sequence[FittedModel],
    adata_heldout: ad.AnnData | None = None,
    markers: Sequence[str] | None = None,
    *,
    adata_fit: ad.AnnData | None = None,
    progress_bar: bool = False,
    downstream: DownstreamRequest | None = None,
    settings: ReportSettings,
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
    adata_fit
        Cells every fit was trained on (default: ``fits.adata_fit``). Each
        seed's ICA is estimated on two disjoint halves of them (many cells, none
        held out); without them, on halves of the held-out cells. The no-latent
        baseline of the equivalence margin is also estimated on them.
    progress_bar
        Show a progress bar over the fits.
    downstream
        Add the downstream section (DE calls between two groups, Leiden clusters
        and UMAP neighbourhoods across seeds, each against a within-fit
        baseline); see :class:`~countvae.diagnostics.reporting.downstream_section.DownstreamRequest`.
    {settings}
    settings
        All of the sizes and seeds above as one :class:`ReportSettings`; keywords given with it replace its fields
        (``report(fits, held, settings=s, n_lpd_samples=500)``).

    Returns
    -------
    DiagnosticReport

    Raises
    ------
    InvalidArgumentError
        For one fit, duplicated seeds, fits on different genes or of different
        width, a marker that is neither a gene nor an obs column.

    """
    stopwatch = Stopwatch()
    s = settings.replace()  # a validated copy
    fit_list, adata, adata_fit, fit_settings = resolve_inputs(fits, adata_heldout, adata_fit)
    limit = threadpool_limits(limits=s.blas_threads, user_api="blas") if s.blas_threads else contextlib.nullcontext()
    with limit:
        collected = collect(
            fit_list, adata, markers, s, fit_settings, stopwatch, progress_bar=progress_bar, adata_fit=adata_fit
        )
        analyses = analyze(collected, s, stopwatch)
        section = None  # the optional DE/clusters/UMAP section, all of it in downstream_section.py
        if downstream is not None:
            section = downstream_section(fit_list, adata, downstream, collected.per_fit("latent"))
            stopwatch.lap("downstream section")
    components = judge_components(analyses.components.table, s.ica_threshold)
    predictive = predictive_verdict(
        analyses.predictive_pairs,
        analyses.predictive_reliability,
        analyses.margin,
        analyses.gain,
        s.equivalence_margin,
        s.alpha,
        s.n_lpd_samples,
    )
    invariants = judge_invariants(analyses.invariants, predictive, ica_row_judgement(components) if s.ica else None)
    lines = headline(
        invariants,
        predictive_sentence(predictive),
        analyses.alignment_summary.set_index("map")["error_diameter_mean"],
        analyses.ica_efficiency,
        analyses.markers,
        len(fit_list),
        ica=ica_sentence(components, s.ica_threshold),
        truth=truth_sentence(analyses.ground_truth),
    )
    # How often each row's verdict was right in the calibration suite (bundled numbers, not these data).
    calibration, quantities = load_calibration(), invariants["quantity"].tolist()
    stopwatch.timings["total"] = stopwatch.total()
    return DiagnosticReport(
        headline=lines,
        tables=_tables(invariants, components, analyses)
        | _training_table(collected.fit_settings)
        | {"calibration": calibration_table(calibration, quantities)}
        | {"calibration_oracle": calibration_table(calibration, quantities, truth="oracle")},
        settings={
            "report": s.to_dict(),
            "markers": collected.marker_names,
            "predictive_equivalence": _predictive_record(predictive),
            "predictively_equivalent": predictive.equivalent,
            "fits": collected.fit_settings,
            "calibration": {
                "measured_by": calibration_summary(calibration),
                "below_goal": calibration_sentences(calibration, quantities),
            },
        },
        subsampling=_subsampling(collected, s),
        provenance=collected.provenance(),
        timings=stopwatch.timings,
        downstream=section,
        cells=analyses.cells,
        genes=analyses.genes,
        consensus_latent=analyses.consensus,
    )


def _predictive_record(verdict: PredictiveVerdict) -> dict[str, Any]:
    """The predictive-equivalence decision as plain values (report.json, ``settings``)."""
    return {
        "state": verdict.state,
        "reason": verdict.reason,
        "remedy": verdict.remedy,
        "margin_nats_per_cell": verdict.margin,
        "gain_over_no_latent_nats_per_cell": verdict.gain,
        "margin_fraction": verdict.margin_fraction,
        "alpha": verdict.alpha,
        "pairs": dict(verdict.counts),
    }


def _tables(invariants: pd.DataFrame, components: pd.DataFrame, a: Analyses) -> dict[str, pd.DataFrame]:
    """Every table by name: the main ones (:data:`MAIN_TABLES`, in the order of the sections), then the details."""
    main = [invariants, a.alignment, a.predictive, a.subspace, a.rhat, a.markers, a.ppc, components]
    details = {
        "predictive_pairs": a.predictive_pairs,
        "predictive_compare": a.predictive_compare,
        "alignment_summary": a.alignment_summary,
        "ica_efficiency": a.ica_efficiency,
        "ica_matches": a.components.matches,
        "ground_truth": a.ground_truth if len(a.ground_truth) else None,
        "covariance_spectra": a.covariance_spectra,
        "rhat_parameters": a.rhat_parameters,
        "marker_correlations": a.marker_correlations,
        "marker_r2": a.marker_r2,
        "ppc_pairs": a.ppc_pairs,
        "ppc_genes": a.ppc_genes,
        "invariant_pairs": a.invariant_pairs,
    }
    return dict(zip(MAIN_TABLES, main, strict=True)) | {k: v for k, v in details.items() if v is not None}


def _training_table(fit_settings: dict[str, Any]) -> dict[str, pd.DataFrame]:
    """``{"training": one row per seed}`` when the fits record how they were trained (fits from ``fit_seeds``).

    Columns: ``seed``, ``epochs_trained``, ``max_epochs``, ``stopped_early`` and
    ``kept_epoch`` (the epoch whose parameters the fit holds), as far as recorded.
    """
    records = fit_settings.get("training")
    if not records:
        return {}
    columns = ["seed", "epochs_trained", "max_epochs", "stopped_early", "kept_epoch"]
    return {"training": pd.DataFrame(records).reindex(columns=columns)}


def _subsampling(c: Collected, s: ReportSettings) -> dict[str, Any]:
    """What was computed on a subset of cells or genes, and how large it was (stated in the report)."""
    sub, var_names = c.subsets, c.var_names
    n = c.n_cells
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
        "spread of guide draws (R-hat)": (
            f"{len(sub.rhat)} cells, {s.n_rhat_draws} guide draws per seed, {len(sub.rhat_genes)} genes; "
            "baseline: a second set of draws of the first fit"
        ),
        "alignment maps": "fitted on a random half of the held-out cells, scored on the other half",
        "intervals": (
            f"paired bootstrap over cells, {s.n_bootstrap} replicates, at most {s.max_bootstrap_cells} cells "
            f"resampled (m-out-of-n beyond), level {1 - 2 * s.alpha:g}"
        ),
        "no-latent baseline (equivalence margin)": (
            f"estimated on {c.baseline_source} (at most {s.max_baseline_cells} cells), evaluated on the "
            f"{len(sub.lpd)} cells of the log predictive density"
        ),
    }
    if s.ica:
        where = (
            f"two disjoint halves of {len(sub.fit)} of the {c.n_fit_cells} fit cells"
            if sub.fit is not None and c.n_fit_cells is not None
            else f"two disjoint halves of the {n} held-out cells"
        )
        subsampling["ICA component stability"] = (
            f"ICA of {c.names[0]} on one of {where}, of every other fit on the other; components matched on all "
            f"{n} held-out cells"
        )
    return subsampling
