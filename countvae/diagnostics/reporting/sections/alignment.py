"""The alignment section: how far apart the seeds' latent spaces are under each class of maps."""

from __future__ import annotations

from countvae import plotting
from countvae.diagnostics.analyses.alignment import MAP_CLASSES, alignment_errors, ica_efficiency, summarize_alignment
from countvae.diagnostics.reporting.collect import Collected
from countvae.diagnostics.reporting.headline import alignment_lines
from countvae.diagnostics.reporting.report_content import ReportContent
from countvae.diagnostics.reporting.sections.base import HTML, Block, Details, Heading, Section, SectionResult, Shared
from countvae.diagnostics.reporting.sections.base import Table as TableBlock
from countvae.diagnostics.reporting.settings import ReportSettings


class AlignmentSection(Section):
    """Seed-pair alignment errors per map class (and, with ICA, the ICA efficiency)."""

    name = "alignment"
    title = "3. Alignment of latent spaces"
    markdown_title = "Alignment (mean over seed pairs)"
    needs = frozenset({"latent"})
    headline_rank = 30
    figures = {
        "alignment": (
            "Seed-pair alignment by map class",
            ("alignment",),
            "Mean distance per cell between one seed's latent means mapped onto another's, as a fraction of the "
            "latent diameter, for maps fitted on half of the held-out cells and scored on the other half. A large "
            "drop from 'permutation' to 'orthogonal' means the seeds differ by a rotation, not by a relabelling "
            "of dimensions.",
        ),
    }

    def compute(self, c: Collected, shared: Shared, s: ReportSettings) -> SectionResult:
        """Maps fitted on half of the held-out cells, scored on the other half, per pair and map class."""
        map_classes = MAP_CLASSES if s.ica else tuple(m for m in MAP_CLASSES if m != "ica")
        alignment = alignment_errors(c.per_fit("latent"), map_classes, seed=s.seed)
        summary = summarize_alignment(alignment)
        efficiency = ica_efficiency(alignment) if s.ica else None
        return SectionResult(
            tables={"alignment": alignment, "alignment_summary": summary, "ica_efficiency": efficiency},
            headline=alignment_lines(summary.set_index("map")["error_diameter_mean"], efficiency),
        )

    def layout(self, rep: ReportContent) -> list[Block]:
        """The figure, the mean over pairs, the ICA efficiency, and every pair folded."""
        t = rep.tables
        html = frozenset({HTML})
        blocks: list[Block] = [
            self.figure("alignment", lambda: plotting.alignment_errors(rep.alignment)),
            Heading("Mean over seed pairs", formats=html),
            TableBlock(t["alignment_summary"]),
        ]
        if "ica_efficiency" in t:
            blocks += [Heading("ICA efficiency per seed pair", formats=html), TableBlock(t["ica_efficiency"])]
        blocks.append(Details("Every seed pair and map class", (TableBlock(rep.alignment),), formats=html))
        return blocks
