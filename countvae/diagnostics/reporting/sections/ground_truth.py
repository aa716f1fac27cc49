"""The ground-truth section: for simulated cells, MCC and InfoM of raw and ICA coordinates against the true sources."""

from __future__ import annotations

from countvae.diagnostics.analyses.ground_truth import ground_truth_table
from countvae.diagnostics.reporting.collect import Collected
from countvae.diagnostics.reporting.headline import truth_sentence
from countvae.diagnostics.reporting.report_content import ReportContent
from countvae.diagnostics.reporting.sections.base import HTML, Block, Paragraph, Section, SectionResult, Shared, Table
from countvae.diagnostics.reporting.settings import ReportSettings


class GroundTruthSection(Section):
    """Only for simulated held-out cells (``obsm["z_true"]``); nothing otherwise."""

    name = "truth"
    title = "8. Against the simulation's truth"
    markdown_title = "Against the simulation's truth"
    needs = frozenset({"latent"})
    requires = ("ica",)
    headline_rank = 50

    def compute(self, c: Collected, shared: Shared, s: ReportSettings) -> SectionResult:
        """The table over seeds, with the ICA coordinates of the components section."""
        if c.true_sources is None:
            return SectionResult()
        sources = shared.results["ica"].values["components"].sources
        truth = ground_truth_table(c.per_fit("latent"), sources or None, c.true_sources, seed=s.seed)
        sentence = truth_sentence(truth)
        return SectionResult(
            tables={"ground_truth": truth if len(truth) else None}, headline=[sentence] * bool(sentence)
        )

    def layout(self, rep: ReportContent) -> list[Block]:
        """What MCC and InfoM measure, and the table."""
        if "ground_truth" not in rep.tables:
            return []
        return [
            Paragraph(
                "The held-out cells were simulated: their true sources are known. MCC is the mean |correlation| of "
                "the true sources with their best-matched coordinates; InfoM the modularity of Hsu et al. (2023). Raw "
                "coordinates sit in an arbitrary rotation of the sources; ICA coordinates recover non-Gaussian "
                "sources up to order and sign.",
                formats=frozenset({HTML}),
            ),
            Table(rep.tables["ground_truth"]),
        ]
