"""The posterior predictive section: zero fraction and coefficient of variation, observed against predicted."""

from __future__ import annotations

import pandas as pd

from countvae import plotting
from countvae.diagnostics.analyses.ppc import PPCStatistics, observed_statistics, ppc_agreement, ppc_table
from countvae.diagnostics.reporting.collect import Collected
from countvae.diagnostics.reporting.report_content import ReportContent
from countvae.diagnostics.reporting.sections.base import Block, Section, SectionResult, Shared, Table
from countvae.diagnostics.reporting.settings import ReportSettings


class PPCSection(Section):
    """Posterior predictive checks per seed, per pair of seeds, and per gene."""

    name = "ppc"
    title = "7. Posterior predictive checks"
    markdown_title = "Posterior predictive checks"
    needs = frozenset({"ppc", "ppc_halves"})
    figures = {
        "ppc": (
            "Posterior predictive check: zero fraction per gene",
            ("ppc_genes",),
            "Observed against predicted fraction of zero counts per gene, one colour per seed. Points on the "
            "diagonal: the model reproduces the sparsity of the data.",
        ),
    }

    def compute(self, c: Collected, shared: Shared, s: ReportSettings) -> SectionResult:
        """The checks per seed, their agreement per pair (for the invariants table), and per gene."""
        observed = observed_statistics(c.ppc_counts)
        predicted = c.per_fit("ppc")
        pairs = ppc_agreement(observed, c.per_fit("ppc_halves"), predicted)
        return SectionResult(
            tables={
                "ppc": ppc_table(observed, predicted),
                "ppc_pairs": pairs,
                "ppc_genes": ppc_genes(c, observed, predicted),
            },
            values={"pairs": pairs, "predicted": predicted},
        )

    def layout(self, rep: ReportContent) -> list[Block]:
        """The zero fractions per gene, then the table per seed."""
        genes = rep.tables["ppc_genes"]
        return [self.figure("ppc", lambda: plotting.zero_fraction(genes)), Table(rep.ppc)]


def ppc_genes(c: Collected, observed: PPCStatistics, predicted: dict[str, PPCStatistics]) -> pd.DataFrame:
    """Observed and predicted zero fraction and CV per gene and fit, on the compared genes."""
    return pd.concat(
        [
            pd.DataFrame(
                {
                    "fit": name,
                    "gene": [str(g) for g in c.var_names],
                    "observed_zero_fraction": observed.zero_fraction,
                    "predicted_zero_fraction": stats.zero_fraction,
                    "observed_cv": observed.cv_gene,
                    "predicted_cv": stats.cv_gene,
                }
            ).iloc[c.subsets.genes]
            for name, stats in predicted.items()
        ],
        ignore_index=True,
    )
