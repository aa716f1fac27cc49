"""The guide-spread section: R-hat with seeds as chains and guide draws as draws (a description, not a verdict)."""

from __future__ import annotations

import pandas as pd

from countvae import plotting
from countvae.diagnostics.analyses.rhat import add_baseline, rhat_chains, rhat_table
from countvae.diagnostics.reporting.collect import Collected
from countvae.diagnostics.reporting.report_content import ReportContent
from countvae.diagnostics.reporting.sections.base import (
    HTML,
    Block,
    Paragraph,
    Section,
    SectionResult,
    Shared,
    Table,
    heldout_maps,
)
from countvae.diagnostics.reporting.settings import ReportSettings


class GuideSpreadSection(Section):
    """Cross-seed R-hat of guide draws with its within-seed baseline (two draw sets of the first fit)."""

    name = "rhat"
    title = "6. Spread of guide draws across seeds (R-hat)"
    markdown_title = "Spread of guide draws across seeds (R-hat; not a verdict)"
    needs = frozenset({"latent", "guide", "guide_repeat"})
    figures = {
        "rhat": (
            "Spread of guide draws across seeds",
            ("rhat",),
            "R-hat with seeds as chains and draws of each seed's amortized guide as draws: not a convergence "
            "diagnostic and not a verdict. Raw coordinates are far above 1 because every seed sits in its own "
            "rotation. Diamonds: the largest value for two independent draw sets of one seed (nothing differs but "
            "the draws). A guide's posterior for one cell is narrow, so seeds that agree on every invariant still "
            "sit far above that baseline. Dashed line: 1.01.",
        ),
    }

    def compute(self, c: Collected, shared: Shared, s: ReportSettings) -> SectionResult:
        """R-hat per quantity and per parameter, the draws mapped onto the first fit."""
        rhat, per_parameter = guide_spread(c, heldout_maps(c, shared, s).to_reference(c.names[0]))
        return SectionResult(tables={"rhat": rhat, "rhat_parameters": per_parameter})

    def layout(self, rep: ReportContent) -> list[Block]:
        """What this R-hat is (and is not), the figure and the table."""
        return [
            Paragraph(
                "Not a convergence diagnostic and not part of the verdicts: seeds as chains, draws of each seed's "
                "amortized guide as draws. The baseline columns give the same statistic for two independent draw "
                "sets of one seed. A guide's posterior for one cell is narrow, so seeds that agree on every "
                "invariant can still lie several posterior widths apart.",
                formats=frozenset({HTML}),
            ),
            self.figure("rhat", lambda: plotting.rhat(rep.rhat)),
            Table(rep.rhat),
        ]


def guide_spread(c: Collected, to_first: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Cross-seed R-hat of guide draws (mapped by ``to_first`` onto the first fit) with its within-seed baseline."""
    guides = c.per_fit("guide")
    decoded = {name: g.log_rate for name, g in guides.items()}
    with_genes = all(v is not None for v in decoded.values())
    chains = rhat_chains(
        {name: g.latent for name, g in guides.items()}, decoded=decoded if with_genes else None, maps=to_first
    )
    rhat, per_parameter = rhat_table(chains)
    first = c.arrays[c.names[0]]
    if first.guide_repeat is None:
        return rhat, per_parameter
    pair = {"draws": first.guide.latent, "repeat": first.guide_repeat.latent}
    same = {"draws": first.guide.log_rate, "repeat": first.guide_repeat.log_rate}
    identity = to_first[c.names[0]]
    baseline = rhat_chains(pair, decoded=same if with_genes else None, maps={"draws": identity, "repeat": identity})
    return add_baseline(rhat, per_parameter, baseline), per_parameter
