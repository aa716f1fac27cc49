"""The seed-groups section: which seeds reached the same solution, each group with its held-out log p(x).

When the seeds differ, an analyst needs to know which to trust: a few seeds may share one solution while others sit in a
worse local optimum. The grouping is :func:`countvae.diagnostics.analyses.seed_groups.seed_groups` (decoded-means
concordance and paired held-out log p(x) per pair of fits, complete linkage); this section shows its groups and pairs,
and puts its sentence in the verdict when the fits do not form one group.
"""

from __future__ import annotations

import numpy as np

from countvae.diagnostics.analyses.predictive import equivalence_margin
from countvae.diagnostics.analyses.seed_groups import seed_groups, seed_groups_sentence
from countvae.diagnostics.reporting.collect import Collected
from countvae.diagnostics.reporting.report_content import ReportContent
from countvae.diagnostics.reporting.sections.base import (
    HTML,
    Block,
    Bullets,
    Paragraph,
    Section,
    SectionResult,
    Shared,
    Table,
    folded_table,
)
from countvae.diagnostics.reporting.settings import ReportSettings

INTRO = (
    "Two seeds reached the same solution when their decoded means agree (concordance interval at or above the "
    "threshold, simultaneous over the pairs) and their held-out log p(x) is not shown to differ by more than the "
    "equivalence margin. Groups merge only when every pair across them reached the same solution, so each pair "
    "inside a group is evidenced directly."
)


NO_MARGIN = (
    "Seeds not grouped: the fits do not gain held-out log p(x) over the no-latent baseline, so there is no "
    "equivalence margin to judge their differences by."
)


class SeedGroupsSection(Section):
    """Groups of seeds that reached the same solution, with each group's held-out log p(x) against the best."""

    name = "seed_groups"
    title = "Which seeds reached the same solution"
    level = 3
    needs = frozenset({"log_rate", "lpd"})
    headline_rank = 25

    def compute(self, c: Collected, shared: Shared, s: ReportSettings) -> SectionResult:
        """The pair relations and groups (nothing when some fit has no held-out log p(x))."""
        lpds = {name: frame for name, frame in c.per_fit("lpd").items() if frame is not None}
        if len(lpds) != len(c.arrays) or len(lpds) < 2:
            return SectionResult()
        margin, _ = equivalence_margin(lpds, c.baseline_lpd, s.equivalence_margin)
        if not np.isfinite(margin) or margin <= 0:
            return SectionResult(records={"seed_groups": {"sentence": NO_MARGIN, "notes": []}})
        result = seed_groups(c.per_fit("log_rate"), lpds, margin=margin, alpha=s.alpha, seed=s.seed)
        groups = result.groups.assign(fits=[", ".join(fits) for fits in result.groups["fits"]])
        sentence = seed_groups_sentence(result)
        return SectionResult(
            tables={"seed_groups": groups, "seed_group_pairs": result.pairs},
            headline=[sentence] if len(groups) > 1 else [],
            records={"seed_groups": {"sentence": sentence, "notes": list(result.notes)}},
        )

    def layout(self, rep: ReportContent) -> list[Block]:
        """The sentence, the notes on intransitive evidence, the groups and (folded) every pair."""
        record = rep.settings.get("seed_groups", {})
        if "seed_groups" not in rep.tables:
            return [Paragraph(record["sentence"])] if record.get("sentence") else []
        blocks: list[Block] = [Paragraph(INTRO, formats=frozenset({HTML})), Paragraph(record.get("sentence", ""))]
        if record.get("notes"):
            blocks.append(Bullets(tuple(record["notes"])))
        blocks.append(Table(rep.tables["seed_groups"]))
        pairs = rep.tables.get("seed_group_pairs")
        if pairs is not None:
            blocks.append(folded_table("The evidence per pair of seeds", pairs))
        return blocks
