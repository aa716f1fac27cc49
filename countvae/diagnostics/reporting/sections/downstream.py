"""The downstream section: DE calls, Leiden clusters and UMAP neighbourhoods across seeds, against within-fit baselines.

Only when asked for (``report(..., downstream=DownstreamRequest(...))``): the DE calls are collected with the other
outputs (:func:`..downstream_section.collect_de`); the rest is computed here from the latent means.
"""

from __future__ import annotations

import pandas as pd

from countvae import plotting
from countvae._formatting import MISSING
from countvae.diagnostics.reporting.collect import Collected
from countvae.diagnostics.reporting.downstream_section import CAPTION, INTRO, SUMMARY_COLUMNS, downstream_result
from countvae.diagnostics.reporting.report_content import ReportContent
from countvae.diagnostics.reporting.sections.base import (
    Block,
    Bullets,
    Figure,
    Heading,
    Paragraph,
    Section,
    SectionResult,
    Shared,
    Table,
    folded_table,
)
from countvae.diagnostics.reporting.settings import ReportSettings


class DownstreamReportSection(Section):
    """The downstream section (``DiagnosticReport.downstream``); nothing unless it was requested."""

    name = "downstream"
    title = "Downstream results across seeds: DE, clusters, UMAP"
    needs = frozenset({"latent", "differential_expression"})

    def compute(self, c: Collected, shared: Shared, s: ReportSettings) -> SectionResult:
        """The agreements from the collected DE calls and latent means (nothing without a request)."""
        if c.downstream_request is None:
            return SectionResult()
        section = downstream_result(c.de_calls, c.per_fit("latent"), c.n_cells, c.downstream_request.settings)
        return SectionResult(attributes={"downstream": section})

    def layout(self, rep: ReportContent) -> list[Block]:
        """The reading, the figure, the summary, DE per fit, and every pair and setting folded."""
        sec = rep.downstream
        if sec is None:
            return []
        blocks: list[Block] = [Paragraph(INTRO), Bullets(tuple(sec.statements))]
        if len(sec.pairs):
            pairs = sec.pairs
            blocks.append(
                Figure(
                    "Agreement between fits and within one fit", CAPTION, lambda: plotting.downstream_agreement(pairs)
                )
            )
        if len(sec.summary):
            blocks.append(Table(sec.summary[SUMMARY_COLUMNS]))
        if len(sec.de_per_fit):
            blocks += [Heading("DE per fit"), Table(sec.de_per_fit)]
        values = [MISSING if v is None else str(v) for v in sec.settings.values()]  # None (n_baseline_fits: all fits)
        settings = pd.DataFrame({"setting": list(sec.settings), "value": values})
        return [*blocks, folded_table("Every compared pair", sec.pairs), folded_table("Settings", settings)]
