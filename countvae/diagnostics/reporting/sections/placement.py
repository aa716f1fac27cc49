"""The placement section: whether the cells the fits never saw land among the cells they were trained on.

A fit embeds its training cells and new cells with the same encoder, but has fitted only the former; where it overfits,
it places cells it never saw apart from its training cells: in the k-NN graph on the held-out and fit cells, held-out
cells then find other held-out cells as neighbours more often than chance. The score is
:func:`countvae.metrics.batch_mixing` with "held-out" and "fit" as the two batches, over the held-out cells' rows of the
graph on the held-out cells of ``CellSubsets.knn`` and the fit cells of ``CellSubsets.fit`` (``k`` scaled to the share
of the analyst's graph that these cells are): 1 when unseen cells land among the training cells as if at random, lower
when they stay apart. It matters twice: an analyst who embeds new cells with the model (or reads the
report's held-out rows) needs the new cells placed like the old.

On pbmc_3tech it fell with the amount of training, in the order of the held-out fit: 0.93 to 0.97 with train()'s early
stopping, 0.88 to 0.92 with the same rule at 1e-3, 0.81 to 0.83 after scvi-tools' 400 epochs at 1e-3
(benchmarks/RESULTS.md, section heldout-placement), whose held-out log p(x) was 24-26 and 17-18 nats per cell below the
first two's (section stopping-vs-full). An embedding that treats every cell alike (the simulation's true sources, a PCA
fitted on all cells) scores 1 up to sampling. No verdict is drawn; the interval covers the sampling of held-out cells
(widened, as batch mixing's, for cells whose neighbourhoods overlap: 91-97% coverage of the known answer of random
relabellings at nominal 90%, 65-84% without; section heldout-placement).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from countvae.diagnostics.analyses.subspace import knn_sets_among
from countvae.diagnostics.reporting.collect import Collected, fit_cell_latents, knn_graph, knn_positions
from countvae.diagnostics.reporting.report_content import ReportContent
from countvae.diagnostics.reporting.sections.base import HTML, Block, Paragraph, Section, SectionResult, Shared, Table
from countvae.diagnostics.reporting.sections.batch_mixing import mean_with_interval
from countvae.diagnostics.reporting.settings import ReportSettings
from countvae.metrics import batch_mixing

HELD_OUT, FIT = "held-out", "fit"

INTRO = (
    "Placement is the share of a held-out cell's nearest neighbours that are fit cells, divided by the share "
    "expected if the two kinds of cell were placed at random: 1 means cells the fits never saw land among their "
    "training cells, lower that they stay apart, as an overfitted fit places them. In our benchmarks it fell with "
    "the amount of training, in the order of the held-out fit (pbmc_3tech: 0.93 to 0.97 with train()'s early "
    "stopping, 0.81 to 0.83 after 400 epochs at 1e-3, whose held-out log p(x) was 24-26 nats per cell lower; "
    "benchmarks/RESULTS.md, sections heldout-placement and stopping-vs-full)."
)


def placement_table(
    latents: dict[str, np.ndarray], fit_latents: dict[str, np.ndarray], seeds: dict[str, int], k: int, s: ReportSettings
) -> pd.DataFrame:
    """Per fit: the held-out cells' placement among the fit cells with its interval, and the shares behind it."""
    n_held, n_fit = len(next(iter(latents.values()))), len(next(iter(fit_latents.values())))
    kinds = np.repeat([HELD_OUT, FIT], [n_held, n_fit])
    expected = (n_held - 1) / (n_held + n_fit - 1)
    rows = []
    for name, z in latents.items():
        neighbours = knn_sets_among(z, fit_latents[name], k)
        scores = batch_mixing(neighbours, kinds)
        value, low, high = mean_with_interval(scores, np.ones(n_held), neighbours, s)
        rows.append(
            {"fit": name, "seed": seeds.get(name), "placement": value, "low": low, "high": high}
            | {"heldout_neighbours": float((neighbours < n_held).mean()), "expected_share": expected}
        )
    return pd.DataFrame(rows)


def placement_sentences(table: pd.DataFrame) -> tuple[str, str]:
    """The section's reading (with the interval's median half-width) and its line in the verdict."""
    values = table["placement"]
    seeds = f" (seeds {values.min():.2f} to {values.max():.2f})" if len(values) > 1 else ""
    half_width = float(((table["high"] - table["low"]) / 2).median())
    spread = f"seeds {values.min():.2f} to {values.max():.2f}, each " if len(values) > 1 else ""
    sentence = (
        f"Cells the fits never saw land among their training cells at {values.mean():.2f} of random placement "
        f"({spread}within about {half_width:.2f} from the sampling of held-out cells): held-out cells make "
        f"{table['heldout_neighbours'].mean():.1%} of the neighbours of held-out cells, where "
        f"{table['expected_share'].iloc[0]:.1%} would be random."
    )
    line = f"Placement of unseen cells among the training cells (1 = as if at random): {values.mean():.2f}{seeds}."
    return sentence, line


class PlacementSection(Section):
    """Whether the held-out cells land among the fit cells in each fit's latent space (needs the fit cells)."""

    name = "placement"
    title = "Do cells the fits never saw land among their training cells?"
    needs = frozenset({"latent", "latent_fit"})
    headline_rank = 66

    def compute(self, c: Collected, shared: Shared, s: ReportSettings) -> SectionResult:
        """Per fit, the placement of the held-out cells of the k-NN subset (nothing without the fit cells)."""
        fit_latents = fit_cell_latents(c)
        if fit_latents is None:
            return SectionResult()
        knn, graph = knn_positions(c), knn_graph(c, s)
        latents = {name: z[knn] for name, z in c.per_fit("latent").items()}
        table = placement_table(latents, fit_latents, {f["name"]: f["seed"] for f in c.fits}, graph.k, s)
        sentence, line = placement_sentences(table)
        record = {"sentence": sentence, "k": graph.k, "heldout_cells": len(knn), "fit_cells": graph.n_cells - len(knn)}
        return SectionResult(tables={"placement": table}, headline=[line], records={"placement": record})

    def layout(self, rep: ReportContent) -> list[Block]:
        """The reading and the table per fit."""
        if "placement" not in rep.tables:
            return []
        record = rep.settings.get("placement", {})
        k_asked = rep.settings.get("report", {}).get("k", record["k"])
        scaled = f" (the report's k={k_asked} scaled to the share of the cells these are)"
        scaled = "" if record["k"] == k_asked else scaled
        cells = (
            f"Held-out cells: {record['heldout_cells']}; fit cells: {record['fit_cells']}; k = {record['k']} "
            f"neighbours{scaled}."
        )
        return [
            Paragraph(INTRO, formats=frozenset({HTML})),
            Paragraph(record["sentence"]),
            Table(rep.tables["placement"]),
            Paragraph(cells),
        ]
