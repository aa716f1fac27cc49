"""The training-cells section: the rows that read only latent means, measured again on cells the fits trained on.

The report measures agreement between seeds on held-out cells, which stand for new cells of the same kind. An analyst
reads the latent space of the cells the model was trained on, and the fits place those differently: an encoder trained
on a cell gives each seed's own answer for it, while cells none of them saw are placed by what the seeds share. On the
stored default fits the worst pair's concordance of latent distances was higher on held-out cells than on training cells
by 0.041 (Kang) and 0.040 (pbmc_3tech) with train()'s early stopping, and by 0.066 and 0.131 after scvi-tools' 400
epochs at 1e-3; on pbmc_3tech the held-out row was undetermined where the training cells said differ. The k-NN overlap
was within 0.015 either way (benchmarks/RESULTS.md, section training-cells). So this section computes the rows of the
invariants table that read only the latent means (latent distances, the k-NN graph, per-dimension coordinates) again on
as many fit cells as the report has held-out cells, with the same definitions, subsets, intervals and thresholds
(:func:`invariants_table`), and says where the verdict on the training cells is not the held-out one. Checked against
the same fits on all of their fit cells (the analyst's cells), over 100 subsets per schedule on the stored fits, the
intervals covered that truth in 90-100% of subsets at nominal 90% for distances and the k-NN graph and, with the
alignment refitted in every bootstrap replicate, in 83-100% for the aligned coordinates (92.2% over the nine schedules);
none of 2,700 verdicts was wrong (sections training-cells, training-cells-refitted and
training-cells-refitted-kang-full).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from countvae.diagnostics.analyses.invariants import InvariantInputs, ResamplingSettings, invariants_table
from countvae.diagnostics.analyses.subspace import subsample
from countvae.diagnostics.reporting.collect import Collected, every_fit_cell_latents, knn_graph_cells
from countvae.diagnostics.reporting.report_content import ReportContent
from countvae.diagnostics.reporting.sections.base import HTML, Block, Paragraph, Section, SectionResult, Shared, Table
from countvae.diagnostics.reporting.settings import ReportSettings
from countvae.diagnostics.reporting.verdicts import ALIGNED, judge_invariants

INTRO = (
    "The report's agreement rows are measured on held-out cells, which stand for new cells of the same kind. The "
    "latent space an analyst reads is that of the cells the model was trained on, and a fit places those "
    "differently: each seed's encoder was fitted to them, so seeds can agree less on them than on cells none of them "
    "saw. The rows below that read only the latent means are measured again on as many training cells, with the "
    "same definitions, intervals and thresholds. In our benchmarks the distances between cells agreed less on the "
    "training cells, more so the longer the fits were trained (benchmarks/RESULTS.md, section training-cells)."
)


def training_cell_rows(c: Collected, s: ReportSettings) -> tuple[pd.DataFrame, int] | None:
    """The invariants table's latent rows on fit cells, and the number of fit cells (``None`` without fit cells).

    As many fit cells as the report has held-out cells (a seeded subset of every fit cell) take the held-out cells'
    place; the other fit cells and the held-out cells are the k-NN graph's other cells, so its rows are those of the
    same graph as the k-NN row's.
    """
    fit_latents = every_fit_cell_latents(c)
    if fit_latents is None:
        return None
    n_fit = len(next(iter(fit_latents.values())))
    chosen = subsample(n_fit, min(c.n_cells, n_fit), s.seed + 9)
    others = np.setdiff1d(np.arange(n_fit), chosen)
    heldout = c.per_fit("latent")
    table, _ = invariants_table(
        InvariantInputs(
            latents={name: z[chosen] for name, z in fit_latents.items()},
            symmetry=c.symmetry,
            reference_latents={name: np.vstack([z[others], heldout[name]]) for name, z in fit_latents.items()},
            graph_cells=knn_graph_cells(c, s),
        ),
        k=s.k,
        max_knn_cells=s.max_knn_cells,
        max_distance_cells=s.max_distance_cells,
        seed=s.seed,
        resampling=ResamplingSettings(s.alpha, s.n_bootstrap, s.seed, s.max_bootstrap_cells),
    )
    # Given only latent means, invariants_table measures exactly the rows that read nothing else (the others read
    # "not measured"), so a row added to QUANTITIES that reads only the latents joins this table by itself.
    return table[table["agreement"].notna()], len(chosen)


def comparison_table(heldout: pd.DataFrame, training: pd.DataFrame) -> pd.DataFrame:
    """Per latent row: the held-out agreement (worst pair) and verdict beside the training cells' own.

    The training cells' rows are judged by the invariants table's own rule (:func:`judge_invariants`); the
    agreement shown is the one the verdict reads (after orthogonal alignment where the verdict is that).
    """
    judged = judge_invariants(training)
    rows = []
    for row in judged.itertuples(index=False):
        held = heldout.loc[heldout["quantity"] == row.quantity].iloc[0]
        aligned = row.verdict == ALIGNED or held["verdict"] == ALIGNED
        prefix = "aligned_" if aligned else ""
        rows.append(
            {
                "quantity": row.quantity,
                "aligned": aligned,
                "heldout_agreement": held[f"{prefix}agreement"],
                "heldout_verdict": held["verdict"],
                "training_agreement": getattr(row, f"{prefix}agreement"),
                "training_low": getattr(row, f"{prefix}low"),
                "training_high": getattr(row, f"{prefix}high"),
                "training_verdict": row.verdict,
                "threshold": row.threshold,
                "n_cells": row.n_cells,
            }
        )
    return pd.DataFrame(rows)


def training_sentences(table: pd.DataFrame, n_cells: int) -> tuple[str, str]:
    """The section's reading (each row on both kinds of cell) and its line in the verdict."""
    parts = [
        f"{r.quantity}{' (aligned)' if r.aligned else ''} {r.training_agreement:.2f} "
        f"[{r.training_low:.2f}, {r.training_high:.2f}] against {r.heldout_agreement:.2f} on held-out cells"
        for r in table.itertuples(index=False)
    ]
    sentence = f"On {n_cells} cells the fits were trained on, the worst pair of seeds gives: " + "; ".join(parts) + "."
    changed = table[table["training_verdict"] != table["heldout_verdict"]]
    if changed.empty:
        line = "Training cells: the same verdicts as on held-out cells for " + ", ".join(table["quantity"]) + "."
    else:
        line = "Training cells: " + "; ".join(
            f"{r.quantity} {r.training_verdict} ({r.training_agreement:.2f}), where held-out cells say "
            f"{r.heldout_verdict} ({r.heldout_agreement:.2f})"
            for r in changed.itertuples(index=False)
        )
        line += "."
    return sentence, line


class TrainingCellsSection(Section):
    """The latent rows of the invariants table on fit cells, beside their held-out values (needs the fit cells)."""

    name = "training_cells"
    title = "Do the held-out rows speak for the training cells?"
    needs = frozenset({"latent", "latent_fit", "latent_fit_all"})
    requires = ("invariants",)
    headline_rank = 67

    def compute(self, c: Collected, shared: Shared, s: ReportSettings) -> SectionResult:
        """The comparison table, its sentence and line (nothing without the fit cells)."""
        measured = training_cell_rows(c, s)
        if measured is None or measured[0].empty:
            return SectionResult()
        training, n_cells = measured
        table = comparison_table(shared.results["invariants"].tables["invariants"], training)
        sentence, line = training_sentences(table, n_cells)
        return SectionResult(
            tables={"training_cells": table},
            headline=[line],
            records={"training_cells": {"sentence": sentence, "fit_cells": n_cells}},
        )

    def layout(self, rep: ReportContent) -> list[Block]:
        """The reading and the table."""
        if "training_cells" not in rep.tables:
            return []
        return [
            Paragraph(INTRO, formats=frozenset({HTML})),
            Paragraph(rep.settings["training_cells"]["sentence"]),
            Table(rep.tables["training_cells"]),
        ]
