"""The calibration section: how often each of this report's rows was right in the bundled calibration suite."""

from __future__ import annotations

from countvae.diagnostics.reporting.collect import Collected
from countvae.diagnostics.reporting.report_content import ReportContent
from countvae.diagnostics.reporting.sections.base import (
    HTML,
    MARKDOWN,
    Block,
    Bullets,
    Details,
    Paragraph,
    Section,
    SectionResult,
    Shared,
    Table,
    folded_table,
)
from countvae.diagnostics.reporting.settings import ReportSettings
from countvae.diagnostics.reporting.verdict_calibration import (
    calibration_sentences,
    calibration_summary,
    calibration_table,
    load_calibration,
    nearest_regime,
    regime_sentence,
)

ORACLE = (
    "The scenario's truth assumes that seeds reach one solution. An oracle that re-fits them and compares them with "
    "the simulation's truth leaves out the replicates whose seeds reached different solutions (every row but ICA) "
    "and takes the ICA row's truth from a larger-sample estimate."
)


class CalibrationSection(Section):
    """The suite's rates for the rows of this report (bundled numbers, not these data)."""

    name = "calibration"
    title = "How often these verdicts are right"
    requires = ("invariants",)

    def compute(self, c: Collected, shared: Shared, s: ReportSettings) -> SectionResult:
        """The rates of this report's rows, and which fall short of the goal."""
        calibration = load_calibration()
        quantities = shared.results["invariants"].tables["invariants"]["quantity"].tolist()
        tables = {
            "calibration": calibration_table(calibration, quantities),
            "calibration_oracle": calibration_table(calibration, quantities, truth="oracle"),
        }
        record = {
            "measured_by": calibration_summary(calibration),
            "below_goal": calibration_sentences(calibration, quantities),
        }
        if c.configuration is not None:
            choice = nearest_regime(calibration, c.configuration)
            record["regime"] = {
                "name": choice.name,
                "calibrated": choice.calibrated,
                "differences": list(choice.differences),
                "sentence": regime_sentence(calibration, choice),
            }
            if choice.name is not None:
                tables["calibration_regime"] = calibration_table(calibration, quantities, regime=choice.name)
                record["regime"]["below_goal"] = calibration_sentences(calibration, quantities, regime=choice.name)
        return SectionResult(tables=tables, records={"calibration": record})

    def layout(self, rep: ReportContent) -> list[Block]:
        """Which rows fall short of the goal, then the rates (and those conditioned on an oracle)."""
        if "calibration" not in rep.tables:
            return []
        html, markdown = frozenset({HTML}), frozenset({MARKDOWN})
        record = rep.settings.get("calibration", {})
        short = tuple(record.get("below_goal", []))
        regime = record.get("regime") or {}
        blocks: list[Block] = [Paragraph(regime["sentence"])] if regime.get("sentence") else []
        regime_rates = rep.tables.get("calibration_regime")
        if regime_rates is not None and len(regime_rates):
            blocks += [Bullets(tuple(regime.get("below_goal", ())))] if regime.get("below_goal") else []
            blocks.append(
                folded_table(
                    f"Confident verdicts against the same fits on a large pool of cells, regime '{regime['name']}'",
                    regime_rates,
                )
            )
        blocks.append(Paragraph(record.get("measured_by", "")))
        if short:
            blocks += [
                Paragraph("Rows right in fewer than 95% of the replicates of a scenario:", formats=html),
                Bullets(short),
            ]
        else:
            blocks += [
                Paragraph(
                    "Every row of this report was right in at least 95% of the replicates of every scenario.",
                    formats=html,
                ),
                Paragraph("Every row was right in at least 95% of them.", formats=markdown),
            ]
        blocks.append(
            folded_table("Correct, undetermined and wrong verdicts per scenario and row", rep.tables["calibration"])
        )
        oracle = rep.tables.get("calibration_oracle")
        if oracle is not None and len(oracle):
            blocks.append(
                Details(
                    "The same with the truth conditioned on what an oracle shows the seeds reached",
                    (Paragraph(ORACLE), Table(oracle, max_rows=None)),
                    formats=html,
                )
            )
        return blocks
