"""Per held-out cell and per gene, the agreement across seeds, and the consensus latent (``DiagnosticReport.write``).

A section without a heading: its results are fields of the report kept in memory
(``cells``, ``genes``, ``consensus_latent``), not tables of the report files.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from countvae.diagnostics.analyses.invariants import KnnGraph
from countvae.diagnostics.analyses.stability_columns import (
    cell_knn_agreement,
    cell_knn_baseline,
    cell_lpd_summary,
    consensus_latent,
    gene_decoded_agreement,
)
from countvae.diagnostics.reporting.collect import Collected, fit_cell_latents, knn_graph_cells
from countvae.diagnostics.reporting.sections.base import Section, SectionResult, Shared, heldout_maps
from countvae.diagnostics.reporting.settings import ReportSettings


class PerCellSection(Section):
    """The per-cell and per-gene columns and the consensus latent (see :func:`stability_columns`)."""

    name = "per_cell"
    needs = frozenset({"latent", "latent_fit", "knn_draws", "lpd", "log_rate"})
    requires = ("batch_mixing",)

    def compute(self, c: Collected, shared: Shared, s: ReportSettings) -> SectionResult:
        """The columns (with each held-out cell's batch mixing, when measured), the consensus on the first fit."""
        consensus = consensus_latent(c.per_fit("latent"), heldout_maps(c, shared, s).to_reference(c.names[0]))
        cells, genes = stability_columns(c, s)
        mixing = shared.results["batch_mixing"].values
        if "heldout_scores" in mixing:
            column = np.full(c.n_cells, np.nan)
            column[mixing["heldout_positions"]] = mixing["heldout_scores"]
            cells["batch_mixing"] = column
        return SectionResult(attributes={"cells": cells, "genes": genes, "consensus_latent": consensus})


def stability_columns(c: Collected, s: ReportSettings) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per held-out cell and per gene, the agreement across seeds.

    Returns
    -------
    cells
        Indexed by the held-out cells' names: ``knn_agreement`` (mean over pairs of
        fits of the cell's k-NN Jaccard in the latent means), ``knn_agreement_within_seed``
        (the same between two guide draws of one fit, mean over fits), ``lpd_mean`` and
        ``lpd_sd`` (held-out log p(x) over seeds). NaN for cells outside the subsets
        they are computed on (``CellSubsets.knn``, ``CellSubsets.lpd``).
    genes
        Indexed by gene: ``decoded_agreement`` (mean over pairs of fits of Lin's
        concordance of the decoded log mean across ``CellSubsets.expression``), NaN
        outside ``CellSubsets.genes``.

    """
    sub, latents = c.subsets, c.per_fit("latent")
    names = c.obs_names if c.obs_names is not None else pd.RangeIndex(c.n_cells).astype(str)
    cells = pd.DataFrame(index=pd.Index(names, name=None))
    knn = sub.knn if sub.knn is not None else np.arange(c.n_cells)
    reference = fit_cell_latents(c)
    n_reference = len(next(iter(reference.values()))) if reference else 0
    k = KnnGraph.of(c.n_cells, len(knn), n_reference, s.k, knn_graph_cells(c, s)).k
    columns = {"knn_agreement": (knn, cell_knn_agreement({n: z[knn] for n, z in latents.items()}, k, reference))}
    draws = c.per_fit("knn_draws")
    if all(d is not None for d in draws.values()):
        columns["knn_agreement_within_seed"] = (knn, cell_knn_baseline(draws, k, reference))
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
    genes = pd.DataFrame({"decoded_agreement": decoded}, index=pd.Index(c.var_names.astype(str)))
    return cells, genes
