"""The invariants section: one row per output, its agreement across seeds with an interval, and its verdict.

The rows are :data:`~countvae.diagnostics.analyses.invariants.QUANTITIES`; a row whose verdict follows a rule of its own
is decided by the section that owns the rule (its :attr:`SectionResult.verdict_rows`): the predictive section decides
held-out log p(x), the ICA components section the ICA row.
"""

from __future__ import annotations

import pandas as pd

from countvae import plotting
from countvae._formatting import format_value
from countvae.diagnostics.analyses.invariants import InvariantInputs, ResamplingSettings, invariants_table
from countvae.diagnostics.reporting.collect import Collected, every_fit_cell_latents, knn_graph_cells
from countvae.diagnostics.reporting.display import invariants_for_display, threshold_text
from countvae.diagnostics.reporting.headline import verdict_lines
from countvae.diagnostics.reporting.report_content import ReportContent
from countvae.diagnostics.reporting.sections.base import (
    HTML,
    MARKDOWN,
    Block,
    Box,
    Boxes,
    Paragraph,
    Section,
    SectionResult,
    Shared,
    Table,
    heldout_maps,
    level,
)
from countvae.diagnostics.reporting.settings import ReportSettings
from countvae.diagnostics.reporting.verdicts import AGREE, ALIGNED, DIFFER, NOT_MEASURED, UNDETERMINED, judge_invariants

#: The verdict columns at a glance: verdict -> (CSS class, heading, what it means for the reader).
GLANCE = {
    AGREE: ("g-agree", "Agree", "agrees across seeds as it is, with confidence: report it"),
    ALIGNED: (
        "g-aligned",
        "Agree only after alignment",
        "agrees only after rotating the seeds onto each other: never read it one dimension at a time",
    ),
    DIFFER: ("g-differ", "Differ", "differs between seeds, with confidence: report the spread, or do not report it"),
    UNDETERMINED: (
        "g-undetermined",
        "Undetermined",
        "these cells cannot tell: see the reason and what would decide it",
    ),
    NOT_MEASURED: ("g-unmeasured", "Not measured", "not available for these fits"),
}
#: The CSS class of each verdict in the table.
VERDICT_CSS = {AGREE: "v-agree", ALIGNED: "v-aligned", DIFFER: "v-differ", UNDETERMINED: "v-undetermined"}
#: Needs of the table's rows (every array the rows compare).
ROW_NEEDS = frozenset(
    {
        "latent",
        "latent_fit",
        "latent_fit_all",
        "log_rate",
        "normalized",
        "span",
        "gram",
        "loadings",
        "jacobians",
        "gram_jacobians",
        "ppc",
        "lpd",
    }
)


class InvariantsSection(Section):
    """What survives a re-run: the invariants table with its verdicts, and the headline's first sentences."""

    name = "invariants"
    title = "1. The invariants table"
    markdown_title = "Invariants"
    needs = ROW_NEEDS
    requires = ("predictive", "ppc", "ica")
    headline_rank = 10
    figures = {
        "invariants": (
            "What survives a re-run",
            ("invariants",),
            "Agreement between seeds for each quantity (worst pair of seeds; 1 is perfect agreement) with its "
            "interval over resamples of the held-out cells, coloured by verdict; grey ticks mark the thresholds. "
            "A row agrees when its whole interval meets the threshold, differs when the whole interval misses it, "
            "and is undetermined otherwise. Dashed outlines: the same after rotating each pair of seeds onto each "
            "other. A quantity that only agrees after rotation is a property of the arbitrary coordinates, not of "
            "the data.",
        ),
    }

    def compute(self, c: Collected, shared: Shared, s: ReportSettings) -> SectionResult:
        """Every row's agreement and interval, judged (rows owned by another section take its verdict)."""
        predictive, ppc, ica = (shared.results[name] for name in self.requires)
        first = next(iter(c.arrays.values()))
        numbers, pairs = invariants_table(
            InvariantInputs(
                latents=c.per_fit("latent"),
                symmetry=c.symmetry,
                lpd_pairs=predictive.tables.get("predictive_pairs"),
                ppc_pairs=ppc.values["pairs"],
                ppc_predicted=ppc.values["predicted"],
                log_rates=c.per_fit("log_rate"),
                normalized=c.per_fit("normalized"),
                spans=c.per_fit("span"),
                grams=c.per_fit("gram"),
                loadings=c.per_fit("loadings"),
                loadings_are_weights=first.loadings_are_weights,
                jacobians=c.per_fit("jacobians"),
                gram_jacobians=c.per_fit("gram_jacobians"),
                markers=c.markers,
                components=ica.values["components"].table if s.ica else None,
                ica_threshold=s.ica_threshold,
                reference_latents=every_fit_cell_latents(c),
                graph_cells=knn_graph_cells(c, s),
            ),
            k=s.k,
            max_knn_cells=s.max_knn_cells,
            max_distance_cells=s.max_distance_cells,
            seed=s.seed,
            maps=heldout_maps(c, shared, s),
            resampling=ResamplingSettings(s.alpha, s.n_bootstrap, s.seed, s.max_bootstrap_cells),
        )
        decided = {q: j for name in self.requires for q, j in shared.results[name].verdict_rows.items()}
        caps = {name: getattr(s, name) for name in set(numbers["cells_setting"]) if name}
        if s.knn_graph_cells is not None:  # the k-NN row's graph size, set rather than counted
            caps["knn_graph_cells"] = s.knn_graph_cells
        judged = judge_invariants(numbers, decided, caps)
        lines = verdict_lines(judged, predictive.values["sentence"], ica.values["sentence"], len(c.names))
        return SectionResult(tables={"invariants": judged, "invariant_pairs": pairs}, headline=lines)

    def summary_blocks(self, rep: ReportContent) -> list[Block]:
        """One box per verdict listing its quantities: the table in one look."""
        frame, boxes = rep.invariants, []
        for verdict, (css, heading, meaning) in GLANCE.items():
            quantities = tuple(frame.loc[frame["verdict"] == verdict, "quantity"])
            if quantities or verdict not in (NOT_MEASURED, UNDETERMINED):
                boxes.append(Box(css, heading, meaning, quantities))
        return [Boxes(tuple(boxes))]

    def layout(self, rep: ReportContent) -> list[Block]:
        """How to read the table, the figure, and the table."""
        return [
            Paragraph(
                "",
                markup="One row per output. <i>Invariant in theory</i>: whether the prior's symmetry (every rotation "
                "of the latent space) leaves it unchanged. <i>Agreement</i>: how closely the worst pair of seeds "
                "agrees (the metric is named; see the definitions at the end), with its interval over resamples of "
                f"the held-out cells (level {level(rep)}). <i>Verdict</i>: agree (the whole interval meets the "
                "threshold), agree after alignment (only after rotating the seeds onto each other), differ (the whole "
                "interval misses it), undetermined (the interval contains the threshold: the row says why and what "
                "would decide it).",
                formats=frozenset({HTML}),
            ),
            self.figure("invariants", lambda: plotting.invariants(rep.invariants)),
            *self.notebook_blocks(rep),
            Table(invariants_for_display(rep.invariants), formats=frozenset({MARKDOWN})),
        ]

    def notebook_blocks(self, rep: ReportContent) -> list[Block]:
        """The table with its verdicts coloured."""
        return [
            Table(
                display_table(rep.invariants),
                max_rows=None,
                numeric=tuple(c for c, numeric in DISPLAY_COLUMNS if numeric),
                css={"verdict": VERDICT_CSS},
                formats=frozenset({HTML}),
            )
        ]


def _interval(low: float, high: float) -> str:
    return "" if not (pd.notna(low) and pd.notna(high)) else f"[{format_value(low)}, {format_value(high)}]"


#: The columns of the table as report.html shows it: (heading, numeric).
DISPLAY_COLUMNS = (
    ("quantity", False),
    ("invariant in theory", False),
    ("metric", False),
    ("agreement (worst pair)", True),
    ("interval", True),
    ("mean over pairs", True),
    ("after rotation", True),
    ("threshold", True),
    ("verdict", False),
    ("why / to decide", False),
    ("report instead", False),
)


def display_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The judged table as report.html shows it: numbers formatted, intervals and thresholds as text."""
    rows = []
    for r in frame.itertuples():
        aligned = format_value(r.aligned_agreement)
        if pd.notna(r.aligned_agreement):
            aligned += " " + _interval(r.aligned_low, r.aligned_high)
        rows.append(
            (
                r.quantity,
                r.invariant_in_theory,
                r.metric,
                format_value(r.agreement),
                _interval(r.low, r.high),
                format_value(r.agreement_mean),
                aligned,
                threshold_text(r.threshold, r.comparison),
                r.verdict,
                "; to decide: ".join(t for t in (r.reason, r.remedy) if t),
                r.report_instead,
            )
        )
    return pd.DataFrame(rows, columns=[c for c, _ in DISPLAY_COLUMNS], dtype=object)
