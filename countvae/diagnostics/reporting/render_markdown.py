"""report.md: the report's verdict and tables as Markdown (the figures are in report.html)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from countvae._formatting import markdown_table
from countvae._report_files import ALL_ROWS_NOTE
from countvae.diagnostics.reporting.display import invariants_for_display
from countvae.diagnostics.reporting.report_content import ReportContent


def _md(frame: pd.DataFrame) -> str:
    return markdown_table(frame, max_rows=60, note=ALL_ROWS_NOTE)


def _predictive_line(rep: ReportContent) -> str:
    record = rep.settings.get("predictive_equivalence", {})
    parts = [f"Decision: **{record.get('state', 'not tested')}**"]
    margin = record.get("margin_nats_per_cell")
    if margin is not None and np.isfinite(margin):
        parts.append(
            f"margin +-{record['margin_nats_per_cell']:.4g} nats per cell ({100 * record['margin_fraction']:g}% of "
            f"the {record['gain_over_no_latent_nats_per_cell']:.4g} nats per cell the latent variables add over a "
            "no-latent model)"
        )
    if record.get("reason"):
        parts.append(record["reason"])
    return "; ".join(parts) + "."


def render_markdown(rep: ReportContent) -> str:
    """The report as Markdown (tables only; the figures are in report.html)."""
    t = rep.tables
    sections = [
        "# Multi-seed diagnostics: what these fits identify",
        "## Verdict",
        "\n".join(f"- {line}" for line in rep.headline),
        "## Invariants",
        _md(invariants_for_display(rep.invariants)),
        "## Predictive equivalence",
        _predictive_line(rep),
    ]
    if "predictive_pairs" in t:
        sections.append(_md(t["predictive_pairs"]))
    sections.append(_md(rep.predictive))
    sections += ["## Alignment (mean over seed pairs)", _md(t["alignment_summary"])]
    if "ica_efficiency" in t:
        sections.append(_md(t["ica_efficiency"]))
    if len(rep.ica):
        sections += ["## ICA components across seeds", _md(rep.ica)]
    sections += [
        "## Subspaces and geometry",
        _md(rep.subspace),
        "## Markers",
        _md(rep.markers),
        "## Spread of guide draws across seeds (R-hat; not a verdict)",
        _md(rep.rhat),
        "## Posterior predictive checks",
        _md(rep.ppc),
        *([rep.downstream.markdown()] if rep.downstream is not None else []),  # the optional downstream section
    ]
    if "ground_truth" in t:
        sections += ["## Against the simulation's truth", _md(t["ground_truth"])]
    if "calibration" in t:
        record = rep.settings.get("calibration", {})
        short = record.get("below_goal", [])
        sections += [
            "## How often these verdicts are right",
            record.get("measured_by", ""),
            "\n".join(f"- {line}" for line in short) if short else "Every row was right in at least 95% of them.",
        ]
    if "training" in t:
        sections += ["## Training of each seed", _md(t["training"])]
    sections += [
        "## Subsampling",
        "\n".join(f"- {k}: {v}" for k, v in rep.subsampling.items()),
        "## Provenance",
        f"- held-out data SHA-256: {rep.provenance.get('heldout_checksum_sha256')}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in rep.provenance.get("versions", {}).items()),
    ]
    return "\n\n".join(sections) + "\n"
