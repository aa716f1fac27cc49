"""The closing section: how each seed was trained, what was subsampled, the definitions, and how to reproduce it."""

from __future__ import annotations

from typing import Any

import pandas as pd

from countvae._formatting import MISSING
from countvae.diagnostics.analyses.invariants import METRIC_DEFINITIONS, KnnGraph
from countvae.diagnostics.reporting.collect import Collected, analyst_graph, knn_graph, knn_positions
from countvae.diagnostics.reporting.report_content import ReportContent
from countvae.diagnostics.reporting.sections.base import (
    HTML,
    MARKDOWN,
    Block,
    Bullets,
    Definitions,
    Details,
    Heading,
    KeyValues,
    Paragraph,
    Section,
    SectionResult,
    Shared,
    Table,
)
from countvae.diagnostics.reporting.settings import ReportSettings

#: Definitions of the other sections' numbers, shown after the rows' metrics (:data:`METRIC_DEFINITIONS`).
OTHER_DEFINITIONS = {
    "alignment error": "mean Euclidean distance per held-out cell between mapped and target latent means, over the "
    "target's diameter (largest pairwise distance) or RMS pairwise distance, averaged over both directions.",
    "ICA efficiency": f"(e_permutation - e_ICA) / (e_permutation - e_orthogonal); none ({MISSING}) for a pair "
    "whose best rotation is no closer than its best signed permutation on the scoring cells: there is no positive "
    "gap to measure ICA against (compare e_ICA with both maps' errors there).",
    "best-match |corr|": "for one ICA component of the first seed, the largest |correlation| with a component of "
    "another seed's ICA after matching all components one to one (Hungarian); a component agrees when the interval "
    "of its worst match over the other seeds lies at or above the threshold (0.95 by default).",
    "R-hat": "rank-normalised split R-hat (Vehtari et al. 2021, arviz) with seeds as chains and guide draws as draws: "
    "a description of the seed-to-seed spread, not a verdict.",
    "interval": "percentile interval of a paired bootstrap over the held-out cells (the same resampled cells for every "
    "pair of seeds); a row's interval runs from the worst of its pairs' lower bounds to the worst of their upper "
    "bounds widened to hold for all pairs together.",
    "predictively equivalent": "two one-sided tests per pair of seeds on the paired per-cell differences in held-out "
    "log p(x), against the margin, Bonferroni-corrected over pairs, on reliable estimates (Pareto k-hat <= 0.7 on at "
    "least 95% of cells).",
}
#: The ICA matching score, listed after the first four row metrics as the report always did.
MCC_DEFINITION = {"mcc": "mean correlation of ICA components after matching them by a signed permutation."}


def definitions() -> dict[str, str]:
    """Every definition the report lists, the rows' metrics first."""
    rows = list(METRIC_DEFINITIONS.items())
    return {**dict(rows[:4]), **MCC_DEFINITION, **dict(rows[4:]), **OTHER_DEFINITIONS}


class AboutSection(Section):
    """Training, subsampling, definitions, checksum, versions, settings and timings."""

    name = "about"
    title = "About this report"

    def compute(self, c: Collected, shared: Shared, s: ReportSettings) -> SectionResult:
        """The training table (fits from ``fit_seeds``) and what was subsampled."""
        return SectionResult(tables=training_table(c.fit_settings), subsampling=subsampling(c, s, shared))

    def layout(self, rep: ReportContent) -> list[Block]:
        """Training, subsampling, definitions, then the reproducibility record folded."""
        html, markdown = frozenset({HTML}), frozenset({MARKDOWN})
        training = [Heading("Training of each seed"), Table(rep.tables["training"])] if "training" in rep.tables else []
        reproducibility = {
            "held-out data checksum (SHA-256)": rep.provenance.get("heldout_checksum_sha256"),
            **{f"version of {k}": v for k, v in rep.provenance.get("versions", {}).items()},
            **{f"setting {k}": v for k, v in rep.settings.get("report", {}).items()},
            "markers": ", ".join(rep.settings.get("markers", [])),
            **_gene_selection(rep.settings.get("fits", {}).get("gene_selection")),
        }
        versions = ", ".join(f"{k} {v}" for k, v in rep.provenance.get("versions", {}).items())
        return [
            *training,
            Heading("What was subsampled"),
            Paragraph(
                "Quantities that are quadratic in cells, or expensive per cell, use random subsets:", formats=html
            ),
            KeyValues(rep.subsampling, formats=html),
            Bullets(tuple(f"{k}: {v}" for k, v in rep.subsampling.items()), formats=markdown),
            Heading("Definitions", formats=html),
            Definitions(definitions(), formats=html),
            Heading("Reproducibility"),
            Details("Data checksum, package versions and settings", (KeyValues(reproducibility),), formats=html),
            Details("Time per step (seconds)", (KeyValues(rep.timings),), formats=html),
            Bullets(
                (f"held-out data SHA-256: {rep.provenance.get('heldout_checksum_sha256')}", f"versions: {versions}"),
                formats=markdown,
            ),
        ]


def _gene_selection(record: dict | None) -> dict[str, str]:
    """The genes kept before fitting, when they were selected (``countvae.data.select_top_genes``)."""
    if not record:
        return {}
    per_batch = f", per batch of {record['batch_key']}" if record.get("batch_key") else ""
    return {
        "gene selection": f"the {record['n_top_genes']} most variable of {record['n_genes_before']} genes "
        f"({record['flavor']} on the raw counts in {record['counts']}{per_batch})",
        "genes kept": ", ".join(record["genes"]),
    }


def training_table(fit_settings: dict[str, Any]) -> dict[str, pd.DataFrame]:
    """``{"training": one row per seed}`` when the fits record how they were trained (fits from ``fit_seeds``).

    Columns: ``seed``, ``epochs_trained``, ``max_epochs``, ``stopped_early`` and
    ``kept_epoch`` (the epoch whose parameters the fit holds), as far as recorded.
    """
    records = fit_settings.get("training")
    if not records:
        return {}
    columns = ["seed", "epochs_trained", "max_epochs", "stopped_early", "kept_epoch"]
    return {"training": pd.DataFrame(records).reindex(columns=columns)}


def _on_the_subsets_graph(shared: Shared) -> list[str]:
    """What the report computed on the k-NN subsets' graph (:func:`knn_graph`), as the sections before this one did.

    Read from their results (the about section comes last), not required of them: that would add them to every run
    of this section. A report without fit cells has no placement, one without two batches no batch mixing.
    """
    results = shared.results
    done = ["the within-seed baseline"] if "per_cell" in results else []
    for name in ("batch_mixing", "placement"):
        if name in results and name in results[name].tables:
            done.append(name.replace("_", " "))
    return done


def _knn_graph_text(c: Collected, s: ReportSettings, shared: Shared) -> str:
    """Which cells the k-NN graphs hold, and their ``k`` (as the invariants table and the sections build them)."""
    n, n_query = c.n_cells, len(knn_positions(c))
    g, row = knn_graph(c, s), analyst_graph(c, s)
    n_reference = g.n_cells - n_query

    def k_text(graph: KnnGraph) -> str:
        if graph.graph_cells == graph.n_cells or graph.k == graph.k_asked:  # scaled back to the k asked by rounding
            return f"k={graph.k}"
        return f"k={graph.k} (scaled from {s.k}: the graph stands for one on {graph.graph_cells:,} cells)"

    text = f"{n_query} of {n} held-out cells"
    if row.n_cells == g.n_cells:  # every cell is on the subsets' graph: one graph for all
        if n_reference:
            text += f", their neighbours found among them and {n_reference} of {c.n_fit_cells} fit cells"
        return f"{text}; {k_text(g)}"
    if n_reference:
        text += f" and {n_reference} of {c.n_fit_cells} fit cells"
    kinds = "held-out and fit" if row.n_cells > n else "held-out"
    text = f"{text}, their neighbours found among all {row.n_cells:,} {kinds} cells; {k_text(row)}"
    done = _on_the_subsets_graph(shared)
    if not done:
        return text
    rows = done[0] if len(done) == 1 else f"{', '.join(done[:-1])} and {done[-1]}"
    return f"{text}. {rows[0].upper()}{rows[1:]}, on the graph of these {g.n_cells:,} cells alone: {k_text(g)}"


def subsampling(c: Collected, s: ReportSettings, shared: Shared) -> dict[str, Any]:
    """What was computed on a subset of cells or genes, and how large it was (stated in the report)."""
    sub, var_names, n = c.subsets, c.var_names, c.n_cells
    out = {
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
        "k-NN graphs": _knn_graph_text(c, s, shared),
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
        out["ICA component stability"] = (
            f"ICA of {c.names[0]} on one of {where}, of every other fit on the other; components matched on all "
            f"{n} held-out cells"
        )
    return out
