"""The predictive-equivalence section: held-out log p(x) per seed, the equivalence test, its verdict row."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from countvae import plotting
from countvae._formatting import format_value
from countvae._report_files import escape
from countvae.diagnostics.analyses.predictive import (
    compare_table,
    equivalence_margin,
    equivalence_table,
    estimator_reliability,
    per_fit_table,
)
from countvae.diagnostics.reporting.collect import Collected
from countvae.diagnostics.reporting.headline import predictive_sentence
from countvae.diagnostics.reporting.report_content import ReportContent
from countvae.diagnostics.reporting.sections.base import (
    HTML,
    MARKDOWN,
    Block,
    Details,
    FigureRow,
    Heading,
    Paragraph,
    Section,
    SectionResult,
    Shared,
    Table,
)
from countvae.diagnostics.reporting.settings import ReportSettings
from countvae.diagnostics.reporting.verdicts import LPD_QUANTITY, PredictiveVerdict, predictive_verdict

NOT_AVAILABLE = "Not available."


class PredictiveSection(Section):
    """Whether the seeds predict the held-out cells equally well (and the verdict of the log p(x) row)."""

    name = "predictive"
    title = "2. Predictive equivalence"
    markdown_title = "Predictive equivalence"
    needs = frozenset({"lpd"})
    headline_rank = 20
    figures = {
        "lpd": (
            "Held-out log predictive density per seed",
            ("predictive",),
            "Mean held-out log p(x) per cell with ±2 standard errors over cells (blue) and ±2 Monte Carlo standard "
            "errors of the importance sampler (orange). Cells differ far more than seeds, so these bars are wide.",
        ),
        "lpd_pairs": (
            "Paired difference to the best seed",
            ("predictive", "predictive_pairs"),
            "Each seed's held-out log p(x) per cell minus the best seed's, with the equivalence test's intervals "
            "(simultaneous over all pairs of seeds). Green band: the equivalence margin. An interval inside the "
            "band: equivalent; outside it: not equivalent; across its edge: undetermined.",
        ),
    }

    def compute(self, c: Collected, shared: Shared, s: ReportSettings) -> SectionResult:
        """Per-fit log p(x), the equivalence margin and test, the decision and its sentence."""
        lpds = {name: frame for name, frame in c.per_fit("lpd").items() if frame is not None}
        pairs = reliability = compare = None
        margin = gain = np.nan
        if len(lpds) == len(c.arrays):
            margin, gain = equivalence_margin(lpds, c.baseline_lpd, s.equivalence_margin)
            pairs = equivalence_table(lpds, margin, s.alpha)
            reliability = estimator_reliability(lpds, margin)
            predictive = per_fit_table(lpds).merge(reliability, on="fit")
            compare = compare_table(lpds).reset_index()
        else:
            predictive = pd.DataFrame(columns=["fit"])
        verdict = predictive_verdict(
            pairs, reliability, margin, gain, s.equivalence_margin, s.alpha, s.n_lpd_samples, s.max_lpd_cells
        )
        sentence = predictive_sentence(verdict)
        return SectionResult(
            tables={"predictive": predictive, "predictive_pairs": pairs, "predictive_compare": compare},
            verdict_rows={LPD_QUANTITY: verdict.as_row_judgement()},
            headline=[sentence],
            records={
                "predictive_equivalence": predictive_record(verdict),
                "predictively_equivalent": verdict.equivalent,
            },
            values={"sentence": sentence},
        )

    def layout(self, rep: ReportContent) -> list[Block]:
        """The decision, the paired differences, the test per pair and the per-seed table."""
        t = rep.tables
        figures = []
        if len(rep.predictive) and "lpd_per_cell" in rep.predictive:
            if "predictive_pairs" in t:
                pairs = t["predictive_pairs"]
                figures.append(self.figure("lpd_pairs", lambda: plotting.paired_lpd_differences(rep.predictive, pairs)))
            figures.append(self.figure("lpd", lambda: plotting.log_predictive_density(rep.predictive)))
        record = rep.settings.get("predictive_equivalence", {})
        html = frozenset({HTML})
        return [
            decision_paragraph(record),
            Paragraph(decision_line(record), formats=frozenset({MARKDOWN})),
            FigureRow(tuple(figures)),
            Heading("Equivalence test per pair of seeds", formats=html),
            Table(t["predictive_pairs"]) if "predictive_pairs" in t else Paragraph(NOT_AVAILABLE, formats=html),
            Heading("Per seed, with the estimator's reliability", formats=html),
            Table(rep.predictive),
            Details(
                "The arviz comparison",
                (Table(t["predictive_compare"]) if "predictive_compare" in t else Paragraph(NOT_AVAILABLE),),
                formats=html,
            ),
        ]


def predictive_record(verdict: PredictiveVerdict) -> dict[str, Any]:
    """The predictive-equivalence decision as plain values (report.json, ``settings``)."""
    return {
        "state": verdict.state,
        "reason": verdict.reason,
        "remedy": verdict.remedy,
        "margin_nats_per_cell": verdict.margin,
        "gain_over_no_latent_nats_per_cell": verdict.gain,
        "margin_fraction": verdict.margin_fraction,
        "alpha": verdict.alpha,
        "pairs": dict(verdict.counts),
    }


def decision_paragraph(record: dict[str, Any]) -> Paragraph:
    """The decision with its margin and how the test works."""
    margin = record.get("margin_nats_per_cell")
    fraction = record.get("margin_fraction")
    gain = record.get("gain_over_no_latent_nats_per_cell")
    state = record.get("state", "not tested")
    known = margin is not None and fraction is not None and gain is not None and margin == margin
    stated = (
        f"margin +-{format_value(margin)} nats per cell, {100 * fraction:g}% of the {format_value(gain)} nats per "
        "cell the latent variables add over a model without them"
        if known
        else "no margin could be stated"
    )
    how = (
        "Two one-sided tests per pair of seeds on the paired per-cell differences, with intervals simultaneous over "
        "all pairs; a pair is equivalent when its interval lies inside the margin, not equivalent when it lies "
        "outside, undetermined otherwise."
    )
    reason = record.get("reason", "")
    return Paragraph(
        f"Decision: {state} ({stated}). {how} {reason}",
        markup=f"Decision: <b>{escape(state)}</b> ({escape(stated)}). {escape(how)} {escape(reason)}",
        formats=frozenset({HTML}),
    )


def decision_line(record: dict[str, Any]) -> str:
    """The decision in one Markdown line, with its margin and reason."""
    parts = [f"Decision: **{record.get('state', 'not tested')}**"]
    margin = record.get("margin_nats_per_cell")
    if margin is not None and np.isfinite(margin):
        parts.append(
            f"margin +-{margin:.4g} nats per cell ({100 * record['margin_fraction']:g}% of the "
            f"{record['gain_over_no_latent_nats_per_cell']:.4g} nats per cell the latent variables add over a "
            "no-latent model)"
        )
    if record.get("reason"):
        parts.append(record["reason"])
    return "; ".join(parts) + "."
