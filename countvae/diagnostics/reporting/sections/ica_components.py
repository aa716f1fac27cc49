"""The ICA components section: which ICA axes of the first seed reproduce across seeds (and the ICA row's verdict).

This is the worked example of docs/architecture.md ("where to add things"): what the section asks of the fits, computes,
decides, says and shows is declared in this file, and the registry lists it. The computation (``analyses.components``),
the components' verdicts (``verdicts``) and the sentence (``headline``) are older helpers it calls.
"""

from __future__ import annotations

from countvae import plotting
from countvae.diagnostics.analyses.components import empty_stability, ica_component_stability
from countvae.diagnostics.analyses.resampling import cell_bootstrap
from countvae.diagnostics.reporting.collect import Collected, fit_cell_latents
from countvae.diagnostics.reporting.headline import ica_sentence
from countvae.diagnostics.reporting.report_content import ReportContent
from countvae.diagnostics.reporting.sections.base import Block, Paragraph, Section, SectionResult, Shared, Table
from countvae.diagnostics.reporting.settings import ReportSettings
from countvae.diagnostics.reporting.verdicts import ICA_QUANTITY, ica_row_judgement, judge_components

INTRO = (
    "ICA picks the rotation that makes the coordinates most non-Gaussian. That choice is reproducible only along "
    "directions that are clearly non-Gaussian; inside a Gaussian subspace every rotation is equally good and the axes "
    "are noise. Each seed's ICA is estimated on other cells than those it is compared on; a component agrees when its "
    "worst match with another seed, corrected for the ICA's own estimation error (divided by the first seed's match "
    "with its own ICA on the other half), is at the threshold with confidence, and is undetermined when it is too "
    "close to Gaussian or does not reproduce even within one seed."
)


class ICAComponentsSection(Section):
    """Per ICA component of the first fit: its worst best-match |corr| with the other fits' ICA, and the verdict."""

    name = "ica"
    title = "ICA components: which reproduce across seeds"
    markdown_title = "ICA components across seeds"
    level = 3
    needs = frozenset({"latent", "latent_fit"})
    headline_rank = 40
    figures = {
        "ica_stability": (
            "ICA components across seeds",
            ("ica", "ica_matches"),
            "For each ICA component of the first seed (IC_0 is its most non-Gaussian), the best-match |correlation| "
            "with the ICA components of each other seed (points) and the worst of them (bar, with its interval over "
            "resamples of the held-out cells), each seed's ICA estimated on a different half of the fit cells (or of "
            "the held-out cells when the fit cells are not known). Green: agrees (whole interval at or above the "
            "dashed threshold); red: differs; purple: undetermined; hatched: too close to Gaussian to be identified. "
            "Black ticks: the same comparison within the first seed (its own ICA on the other half): high there but "
            "low across seeds means the seeds' solutions differ; low in both means too few cells to fix that axis. "
            "Open diamonds: the worst match divided by that tick (corrected for the ICA's estimation error), which "
            "the colour judges. "
            "Only components that agree can be read as axes; the others are identified as a subspace at most. A "
            "random rotation of a d-dimensional Gaussian space gives about 0.90 (d = 2) to 0.7 (d = 6) by chance.",
        ),
    }

    def compute(self, c: Collected, shared: Shared, s: ReportSettings) -> SectionResult:
        """Each seed's ICA (on halves of the fit cells when known), matched on the held-out cells, judged."""
        if not s.ica:
            stability = empty_stability()
            return SectionResult(
                tables={"ica": judge_components(stability.table, s.ica_threshold)},
                values={"components": stability, "sentence": None},
            )
        stability = ica_component_stability(
            c.per_fit("latent"),
            cell_bootstrap(c.n_cells, s.n_bootstrap, seed=s.seed + 2000, max_cells=s.max_bootstrap_cells),
            fit_cells=fit_cell_latents(c),
            alpha=s.alpha,
            seed=s.seed,
        )
        judged = judge_components(stability.table, s.ica_threshold)
        sentence = ica_sentence(judged, s.ica_threshold)
        return SectionResult(
            tables={"ica": judged, "ica_matches": stability.matches},
            verdict_rows={ICA_QUANTITY: ica_row_judgement(judged)},
            headline=[sentence] if sentence else [],
            values={"components": stability, "sentence": sentence},
        )

    def layout(self, rep: ReportContent) -> list[Block]:
        """Why only non-Gaussian axes reproduce, the figure and the table (nothing without ICA)."""
        if not len(rep.ica):
            return []
        threshold = float(rep.settings.get("report", {}).get("ica_threshold", 0.95))
        matches = rep.tables.get("ica_matches")
        return [
            Paragraph(INTRO, formats=frozenset({"html"})),
            self.figure("ica_stability", lambda: plotting.ica_stability(rep.ica, matches, threshold=threshold)),
            Table(rep.ica),
        ]
