"""Per cell and per gene, the agreement across seeds, and the consensus latent (``DiagnosticReport.write``).

A section without a heading: its results are fields of the report kept in memory (``cells``, ``genes``,
``consensus_latent``), not in the report files. The cells are the held-out cells and, when the report has them, the fit
cells of ``CellSubsets.fit``: the cells an analyst reads, which the fits were trained on and can place less alike than
held-out cells (see the training-cells section). Both kinds are scored on the same graphs, so a fit cell's column means
what a held-out cell's does: the cross-seed agreement on the k-NN row's graph (every held-out and fit cell, the report's
``k``), the within-seed baseline on the graph of the cells it has guide draws of (the held-out cells of
``CellSubsets.knn`` and those fit cells, ``k`` scaled when that graph leaves cells out).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from countvae.diagnostics.analyses.stability_columns import (
    cell_knn_agreement,
    cell_knn_baseline,
    cell_lpd_summary,
    consensus_latent,
    gene_decoded_agreement,
)
from countvae.diagnostics.reporting.collect import (
    Collected,
    analyst_graph,
    every_fit_cell_latents,
    fit_cell_latents,
    knn_graph,
    knn_positions,
)
from countvae.diagnostics.reporting.sections.base import Section, SectionResult, Shared, heldout_maps
from countvae.diagnostics.reporting.settings import ReportSettings


class PerCellSection(Section):
    """The per-cell and per-gene columns and the consensus latent (see :func:`stability_columns`)."""

    name = "per_cell"
    needs = frozenset({"latent", "latent_fit", "latent_fit_all", "knn_draws", "knn_draws_fit", "lpd", "log_rate"})
    requires = ("batch_mixing",)

    def compute(self, c: Collected, shared: Shared, s: ReportSettings) -> SectionResult:
        """The columns (with each cell's batch mixing, when measured), the consensus on the first fit."""
        to_first = heldout_maps(c, shared, s).to_reference(c.names[0])
        consensus = consensus_latent(c.per_fit("latent"), to_first)
        within = within_seed_overlap(c, s)
        cells, genes = stability_columns(c, s, within[0] if within else None)
        cells.insert(0, "heldout", True)
        mixing = shared.results["batch_mixing"].values
        if "heldout_scores" in mixing:
            column = np.full(c.n_cells, np.nan)
            column[mixing["heldout_positions"]] = mixing["heldout_scores"]
            cells["batch_mixing"] = column
        fit_cells = fit_cell_columns(c, s, within[1] if within else None, mixing.get("fit_scores"))
        if fit_cells is not None:
            cells = pd.concat([cells, fit_cells])
            consensus = np.vstack([consensus, consensus_latent(fit_cell_latents(c), to_first)])
        attributes = {
            "cells": cells,
            "genes": genes,
            "consensus_latent": consensus,
            "cells_knn_k": analyst_graph(c, s).k,
            "cells_within_seed_k": knn_graph(c, s).k,
        }
        return SectionResult(attributes=attributes)


def within_seed_overlap(c: Collected, s: ReportSettings) -> tuple[np.ndarray, np.ndarray | None] | None:
    """Per cell of the k-NN graph, the overlap of its neighbours between two guide draws of one fit, mean over fits.

    Every cell of the graph (the held-out cells of ``CellSubsets.knn``, then the fit cells) is drawn twice, so each
    cell's value is the same measurement whichever its kind. Returns the held-out cells' values and the fit cells'
    (``None`` without fit cells), or ``None`` without the draws.
    """
    heldout = c.per_fit("knn_draws")
    if any(d is None for d in heldout.values()):
        return None
    if fit_cell_latents(c) is None:
        return cell_knn_baseline(heldout, knn_graph(c, s).k), None
    fit = c.per_fit("knn_draws_fit")
    if any(d is None for d in fit.values()):
        return None
    both = {name: np.concatenate([draws, fit[name]], axis=1) for name, draws in heldout.items()}
    values = cell_knn_baseline(both, knn_graph(c, s).k)
    n = len(knn_positions(c))
    return values[:n], values[n:]


def fit_cell_columns(
    c: Collected, s: ReportSettings, within_seed: np.ndarray | None = None, batch_scores: np.ndarray | None = None
) -> pd.DataFrame | None:
    """Per fit cell of ``CellSubsets.fit``: the k-NN columns on the held-out cells' graph (``None`` without them).

    Indexed by the fit cells' names, with ``heldout`` False, ``knn_agreement`` (each fit cell's neighbours found among
    every other fit cell and held-out cell: the graph of the k-NN row) and, when given, ``knn_agreement_within_seed``
    (:func:`within_seed_overlap`) and ``batch_mixing``. No held-out log p(x): the fits were trained on these cells.
    """
    every = every_fit_cell_latents(c)
    if every is None or c.fit_obs_names is None:
        return None
    cells = pd.DataFrame({"heldout": False}, index=c.fit_obs_names)
    rows = c.subsets.fit
    cells["knn_agreement"] = cell_knn_agreement(every, analyst_graph(c, s).k, c.per_fit("latent"), rows)
    for column, values in (("knn_agreement_within_seed", within_seed), ("batch_mixing", batch_scores)):
        if values is not None:
            cells[column] = values
    return cells


def stability_columns(
    c: Collected, s: ReportSettings, within_seed: np.ndarray | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per held-out cell and per gene, the agreement across seeds (the fit cells' rows: :func:`fit_cell_columns`).

    Returns
    -------
    cells
        Indexed by the held-out cells' names: ``knn_agreement`` (mean over pairs of fits of the cell's k-NN Jaccard in
        the latent means, on the k-NN row's graph), ``knn_agreement_within_seed`` (``within_seed``, the held-out values
        of :func:`within_seed_overlap`, when given), ``lpd_mean`` and ``lpd_sd`` (held-out log p(x) over seeds). NaN
        outside the subsets they are computed on (``CellSubsets.knn``, ``CellSubsets.lpd``).
    genes
        Indexed by gene: ``decoded_agreement`` (mean over pairs of fits of Lin's concordance of the decoded log mean
        across ``CellSubsets.expression``), NaN outside ``CellSubsets.genes``.

    """
    sub, latents = c.subsets, c.per_fit("latent")
    names = c.obs_names if c.obs_names is not None else pd.RangeIndex(c.n_cells).astype(str)
    cells = pd.DataFrame(index=pd.Index(names, name=None))
    knn = knn_positions(c)
    agreement = cell_knn_agreement(latents, analyst_graph(c, s).k, every_fit_cell_latents(c), knn)
    columns = {"knn_agreement": (knn, agreement)}
    if within_seed is not None:
        columns["knn_agreement_within_seed"] = (knn, within_seed)
    lpds = {name: frame for name, frame in c.per_fit("lpd").items() if frame is not None}
    if len(lpds) == len(latents):
        mean, sd = cell_lpd_summary({name: frame["lpd"].to_numpy() for name, frame in lpds.items()})
        columns |= {"lpd_mean": (sub.lpd, mean), "lpd_sd": (sub.lpd, sd)}
    for column, (positions, values) in columns.items():
        full = np.full(c.n_cells, np.nan)
        full[positions] = values
        cells[column] = full
    decoded = np.full(len(c.var_names), np.nan)
    decoded[sub.genes] = gene_decoded_agreement(c.per_fit("log_rate"))
    return cells, pd.DataFrame({"decoded_agreement": decoded}, index=pd.Index(c.var_names.astype(str)))
