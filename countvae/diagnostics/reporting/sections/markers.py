"""The marker section: per-dimension correlations (one seed's coordinates) against the invariant R^2."""

from __future__ import annotations

from countvae import plotting
from countvae.diagnostics.analyses.markers import marker_correlations, marker_r2_table, marker_summary
from countvae.diagnostics.reporting.collect import Collected
from countvae.diagnostics.reporting.headline import marker_lines
from countvae.diagnostics.reporting.report_content import ReportContent
from countvae.diagnostics.reporting.sections.base import HTML, Block, Paragraph, Section, SectionResult, Shared, Table
from countvae.diagnostics.reporting.settings import ReportSettings


class MarkersSection(Section):
    """Per marker, whether its best-correlated dimension moves between seeds, and its invariant R^2."""

    name = "markers"
    title = "5. The marker pitfall"
    markdown_title = "Markers"
    needs = frozenset({"latent"})
    headline_rank = 60
    figures = {
        "marker_heatmaps": (
            "Per-dimension marker correlations, per seed",
            ("marker_correlations",),
            "Correlation of each latent dimension (columns) with each marker (rows). The same marker lights up "
            "different dimensions with different signs in different seeds: reading a dimension as 'the CD14 axis' "
            "is a statement about one seed's coordinates.",
        ),
        "marker_r2": (
            "Rotation-invariant marker association",
            ("marker_r2",),
            "R² of each marker regressed on all latent dimensions, one point per seed. It does not depend on the "
            "coordinates, so it is what can be reported.",
        ),
    }

    def compute(self, c: Collected, shared: Shared, s: ReportSettings) -> SectionResult:
        """The summary per marker, every correlation, and the R^2 per seed."""
        latents = c.per_fit("latent")
        summary = marker_summary(latents, c.markers)
        return SectionResult(
            tables={
                "markers": summary,
                "marker_correlations": marker_correlations(latents, c.markers),
                "marker_r2": marker_r2_table(latents, c.markers),
            },
            headline=marker_lines(summary),
        )

    def layout(self, rep: ReportContent) -> list[Block]:
        """Why a dimension is not a marker axis, the two figures and the table."""
        t = rep.tables
        blocks: list[Block] = [
            Paragraph(
                "A latent dimension's correlation with a marker gene is a property of one seed's coordinates. "
                "The R² of the marker on all dimensions together is not.",
                formats=frozenset({HTML}),
            )
        ]
        if len(t.get("marker_correlations", ())):
            correlations, r2 = t["marker_correlations"], t["marker_r2"]
            blocks += [
                self.figure("marker_heatmaps", lambda: plotting.marker_correlations(correlations)),
                self.figure("marker_r2", lambda: plotting.marker_r2(r2)),
            ]
        return [*blocks, Table(rep.markers)]
