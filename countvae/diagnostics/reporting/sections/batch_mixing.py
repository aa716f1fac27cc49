"""The batch-mixing section: how often cells have neighbours from another batch, per seed and without a model.

An analyst who registers a batch covariate reads the latent space as corrected for it, and needs to know how far it is:
the share of each cell's neighbours from another batch, over the share expected if batch were random
(:func:`countvae.metrics.batch_mixing`; 1 is random mixing, 0 none), in the k-NN graph on the held-out cells and the fit
cells the report has (up to ``max_knn_cells`` and ``max_fit_cells``; ``k`` scaled so that a
neighbourhood keeps the share of the cells it has in the analyst's graph on all of their cells). Each kind of cell is
weighted by the cells it stands for, so the mean estimates the mixing of that graph (exactly, with every cell at hand).

The fit cells count because the analyst's graph is mostly fit cells, and the fits place them differently from cells they
never saw: on pbmc_3tech the early-stopped default fits mixed their held-out cells 0.03 to 0.06 more than the graph on
all cells (benchmarks/RESULTS.md, batch-mixing-estimate), so held-out cells alone overstate it. The held-out cells' own
mixing is shown beside.

The same is measured in a PCA of the normalized counts without a model (how mixed the cells are before any correction;
an embedding that keeps less structure mixes more, so the difference is not the model's correction alone), and per
batch, so that a batch that stays apart shows. The intervals cover the sampling of cells, the neighbour sets held fixed
(:func:`mean_with_interval`). The seeds' spread is what a re-run changes. No verdict is drawn: how much mixing is right
depends on whether the batches hold the same cell types, which the report does not know.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from countvae.diagnostics.analyses.resampling import (
    cell_bootstrap,
    neighbour_inflation,
    percentile_interval,
    weighted_mean,
)
from countvae.diagnostics.analyses.subspace import knn_sets_among
from countvae.diagnostics.reporting.collect import Collected, fit_cell_latents, knn_graph, knn_positions
from countvae.diagnostics.reporting.report_content import ReportContent
from countvae.diagnostics.reporting.sections.base import (
    HTML,
    Block,
    Details,
    Paragraph,
    Section,
    SectionResult,
    Shared,
    Table,
)
from countvae.diagnostics.reporting.settings import ReportSettings
from countvae.metrics import batch_mixing

#: The row of the embedding without a model.
NO_MODEL = "PCA of normalized counts (no model)"

INTRO = (
    "Batch mixing is the share of a cell's nearest neighbours that come from another batch, divided by "
    "the share expected if batch were random: 1 means the batches are mixed as if at random, 0 that no cell has a "
    "neighbour from another batch. Mixing below 1 is expected, and wanted, where a cell type is found in some "
    "batches only. The PCA of the normalized counts, made without a model, shows how mixed the cells are before "
    "any correction; read both beside how well each keeps the biology (markers, cell types): an embedding that "
    "keeps less structure mixes more, so a model below the PCA does not necessarily correct less. The held-out "
    "cells' own mixing is shown beside: a fit that places cells it never saw apart from its training cells mixes "
    "them differently. In our benchmarks training beyond train()'s early stopping mixed batches more, at a cost in "
    "held-out fit (benchmarks/RESULTS.md, section stopping-latent-schedules)."
)


def mean_with_interval(
    scores: np.ndarray, weights: np.ndarray, neighbours: np.ndarray, s: ReportSettings
) -> tuple[float, float, float]:
    """The ``weights``-weighted mean of per-cell k-NN ``scores`` with its percentile interval over cells.

    A bootstrap over cells (``s.n_bootstrap`` replicates, at most ``s.max_bootstrap_cells`` cells resampled, level ``1 -
    2 s.alpha``) whose deviations are widened by :func:`~countvae.diagnostics.analyses.resampling.neighbour_inflation`
    for the correlation of neighbouring cells' scores (``neighbours``: each scored cell's neighbour indices). Without it
    the 90% intervals covered the mixing of the whole graph in 72-84% of random quarters of Kang's and pbmc_3tech's
    cells (per data set and schedule), with it in 89-97% (benchmarks/RESULTS.md, section batch-mixing-estimate).
    """
    value = float(np.average(scores, weights=weights))
    boot = cell_bootstrap(len(scores), s.n_bootstrap, seed=s.seed + 41, max_cells=s.max_bootstrap_cells)
    replicates = weighted_mean(boot.weights * weights[boot.positions], scores[boot.positions])
    inflation = neighbour_inflation(scores, weights, neighbours)
    interval = percentile_interval(value, replicates, boot.shrink * inflation, s.alpha)
    return interval.value, interval.low, interval.high


def embedding_mixing(
    cells: np.ndarray, pool: np.ndarray, weights: np.ndarray, k: int, s: ReportSettings
) -> tuple[np.ndarray, tuple[float, float, float]]:
    """Each cell's batch-mixing score in the ``k``-NN graph of ``cells``; their weighted mean with its interval.

    ``pool`` holds each cell's batch and ``weights`` the number of cells of the data set each stands for.
    """
    neighbours = knn_sets_among(cells, cells[:0], k)
    scores = batch_mixing(neighbours, pool)
    return scores, mean_with_interval(scores, weights, neighbours, s)


def mixing_sentences(table: pd.DataFrame, key: str, n_batches: int, n_components: int) -> tuple[str, str]:
    """The section's reading and its line in the verdict: the seeds' mixing, their range, the no-model reference."""
    fits = table[table["fit"] != NO_MODEL]["batch_mixing"]
    reference = table.loc[table["fit"] == NO_MODEL, "batch_mixing"]
    half_width = float(((table["high"] - table["low"]) / 2).median())
    sentence = (
        f"The {n_batches} batches of '{key}' mix at {fits.mean():.2f} of random mixing in the latent spaces (seeds "
        f"{fits.min():.2f} to {fits.max():.2f}, each within about {half_width:.2f} from the sampling of cells)"
    )
    line = f"Batch mixing ('{key}', 1 = as if at random): {fits.mean():.2f} in the latent spaces"
    if len(fits) > 1:
        line += f" (seeds {fits.min():.2f} to {fits.max():.2f})"
    if len(reference):
        sentence += f", against {float(reference.iloc[0]):.2f} in a {n_components}-component PCA without a model"
        line += f", {float(reference.iloc[0]):.2f} without a model"
    return sentence + ".", line + "."


class BatchMixingSection(Section):
    """Batch mixing in each seed's latent space and in a PCA without a model, on the held-out and fit cells."""

    name = "batch_mixing"
    title = "How well the batches mix"
    needs = frozenset({"latent", "latent_fit", "batches"})
    headline_rank = 65

    def compute(self, c: Collected, shared: Shared, s: ReportSettings) -> SectionResult:
        """Per embedding, the weighted mean score with its interval, and per batch (nothing without a batch)."""
        ref = c.batches
        if ref is None:
            return SectionResult()
        knn = knn_positions(c)
        fit_latents = fit_cell_latents(c) if ref.fit is not None else None
        n_fit = len(ref.fit) if fit_latents else 0
        pool = np.concatenate([ref.heldout, ref.fit]) if fit_latents else ref.heldout
        n_batches = len(np.unique(pool))
        if n_batches < 2:
            sentence = f"Batch mixing not measured: the cells hold one batch of '{ref.key}'."
            return SectionResult(records={"batch_mixing": {"sentence": sentence}})
        graph = knn_graph(c, s, n_fit)
        weights = np.ones(len(pool))
        weights[: len(knn)] = c.n_cells / len(knn)
        if fit_latents and c.n_fit_cells:
            weights[len(knn) :] = c.n_fit_cells / n_fit
        embeddings = {
            name: np.vstack([z[knn], fit_latents[name]]) if fit_latents else z[knn]
            for name, z in c.per_fit("latent").items()
        }
        embeddings[NO_MODEL] = np.vstack([ref.pca_heldout, ref.pca_fit]) if fit_latents else ref.pca_heldout
        seeds = {f["name"]: f["seed"] for f in c.fits}
        rows, per_batch, scores_by_fit = [], {}, {}
        for name, cells in embeddings.items():
            scores, (value, low, high) = embedding_mixing(cells, pool, weights, graph.k, s)
            scores_by_fit[name] = scores
            rows.append(
                {"fit": name, "seed": seeds.get(name), "batch_mixing": value, "low": low, "high": high}
                | {"heldout_cells": float(scores[: len(knn)].mean())}
            )
            frame = pd.DataFrame({"batch": pool, "score": scores * weights, "weight": weights})
            sums = frame.groupby("batch").sum()
            per_batch[name] = sums["score"] / sums["weight"]
        table = pd.DataFrame(rows)
        batches = pd.DataFrame(per_batch)
        batches.insert(0, "cells", pd.Series(pool).value_counts())
        batches = batches.rename_axis("batch").reset_index()
        n_components = ref.pca_heldout.shape[1]
        sentence, line = mixing_sentences(table, ref.key, n_batches, n_components)
        record = {
            "sentence": sentence,
            "batch_key": ref.key,
            "batches": n_batches,
            "k": graph.k,
            "k_asked": graph.k_asked,
            "graph_cells": graph.graph_cells,
            "heldout_cells": len(knn),
            "fit_cells": n_fit,
            "pca_components": n_components,
        }
        # Each scored cell's score, mean over the fits: the per-cell column of DiagnosticReport.write.
        scores = np.mean([scores_by_fit[name] for name in c.names], axis=0)
        values = {"heldout_positions": knn, "heldout_scores": scores[: len(knn)]}
        if fit_latents:
            values["fit_scores"] = scores[len(knn) :]
        return SectionResult(
            tables={"batch_mixing": table, "batch_mixing_per_batch": batches},
            headline=[line],
            records={"batch_mixing": record},
            values=values,
        )

    def layout(self, rep: ReportContent) -> list[Block]:
        """The reading, the table per embedding, and (folded) the mixing of each batch's cells."""
        record = rep.settings.get("batch_mixing", {})
        if "batch_mixing" not in rep.tables:
            return [Paragraph(record["sentence"])] if record.get("sentence") else []
        graph = (
            f"Cells scored: {record['heldout_cells']} held-out and {record['fit_cells']} fit cells, in their graph of "
            f"k = {record['k']} neighbours (the share of the cells that {record['k_asked']} neighbours are of a graph "
            f"on {record['graph_cells']} cells); each kind of cell weighted by the cells it stands for."
        )
        return [
            Paragraph(INTRO, formats=frozenset({HTML})),
            Paragraph(record["sentence"]),
            Table(rep.tables["batch_mixing"]),
            Paragraph(graph),
            Details(
                "Mixing of each batch's cells, per embedding",
                (Table(rep.tables["batch_mixing_per_batch"], max_rows=None),),
            ),
        ]
