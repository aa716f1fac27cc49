"""report.json: everything in the report as JSON-ready values (NaN and infinities become ``null``)."""

from __future__ import annotations

from typing import Any

from countvae._formatting import json_ready
from countvae.diagnostics.reporting.figures import FIGURES
from countvae.diagnostics.reporting.report_content import ReportContent

#: JSON/report format version of the report files.
REPORT_FORMAT = 1


def report_record(rep: ReportContent) -> dict[str, Any]:
    """The report as a JSON-ready dict: headline, every table (as records), figure captions, settings, provenance."""
    return json_ready(
        {
            "format": REPORT_FORMAT,
            "headline": rep.headline,
            "tables": rep.tables,
            "figures": {name: {"title": t, "tables": list(src), "caption": c} for name, (t, src, c) in FIGURES.items()},
            "settings": rep.settings,
            "subsampling": rep.subsampling,
            "provenance": rep.provenance,
            "timings_seconds": rep.timings,
            "downstream": rep.downstream.to_dict() if rep.downstream is not None else None,  # issue 18
        }
    )
