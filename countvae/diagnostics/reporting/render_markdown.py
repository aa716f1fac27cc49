"""report.md: the report's verdict and tables as Markdown (the figures are in report.html)."""

from __future__ import annotations

import pandas as pd

from countvae._formatting import markdown_table
from countvae._report_files import ALL_ROWS_NOTE
from countvae.diagnostics.reporting.display import invariants_for_display
from countvae.diagnostics.reporting.report_content import ReportContent


def _md(frame: pd.DataFrame) -> str:
    return markdown_table(frame, max_rows=60, note=ALL_ROWS_NOTE)


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
        _md(rep.predictive),
    ]
    if "predictive_pairs" in t:
        sections.append(_md(t["predictive_pairs"]))
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
        "## Cross-seed R-hat",
        _md(rep.rhat),
        "## Posterior predictive checks",
        _md(rep.ppc),
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
