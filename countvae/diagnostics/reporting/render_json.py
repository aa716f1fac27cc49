"""report.json: everything in the report as JSON-ready values (NaN and infinities become ``null``).

The format (its name, version and JSON Schema) is described in :mod:`.report_format`.
"""

from __future__ import annotations

from typing import Any

from countvae._formatting import json_ready
from countvae.diagnostics.reporting.render_html import sections_of
from countvae.diagnostics.reporting.report_content import ReportContent
from countvae.diagnostics.reporting.report_format import FORMAT_NAME, FORMAT_VERSION, table_columns


def report_record(rep: ReportContent) -> dict[str, Any]:
    """The report as a JSON-ready dict: headline, every table (as records), figure captions, settings, provenance."""
    return json_ready(
        {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "headline": rep.headline,
            "tables": rep.tables,
            "table_columns": table_columns(rep.tables),
            "figures": {
                name: {"title": t, "tables": list(src), "caption": c}
                for section in sections_of(rep)
                for name, (t, src, c) in section.figures.items()
            },
            "settings": rep.settings,
            "subsampling": rep.subsampling,
            "provenance": rep.provenance,
            "timings_seconds": rep.timings,
            "downstream": rep.downstream.to_dict() if rep.downstream is not None else None,
        }
    )
