""":class:`DiagnosticReport`: the report's content with the verbs every countvae report shares.

The verbs (``summary``, ``to_frame``, ``tables``, ``to_dict``, ``to_markdown``,
``to_html``, ``save``) are the same for :class:`countvae.invariance.InvarianceReport`;
both save through :func:`countvae._report_files.write_report_folder`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from countvae._report_files import write_report_folder
from countvae.diagnostics.fitting.progress import REPORT_FILE_WRITTEN, Progress, ProgressEvent, notify
from countvae.diagnostics.reporting.render_html import render_html, summary_html
from countvae.diagnostics.reporting.render_json import report_record
from countvae.diagnostics.reporting.render_markdown import render_markdown
from countvae.diagnostics.reporting.report_content import ReportContent


class DiagnosticReport(ReportContent):
    """The multi-seed diagnostics of one model on shared held-out cells.

    Made by :func:`countvae.diagnostics.report`. The main tables are attributes
    (``invariants``, ``alignment``, ``predictive``, ``subspace``, ``rhat``,
    ``markers``, ``ppc``, ``ica``); every table, details included, is in ``tables``.

    Attributes
    ----------
    headline
        The verdict in plain sentences, most important first.
    tables
        Every table by name: first the main ones (in the order above, also
        available as attributes, e.g. ``rep.invariants``), then the details
        (pairwise tables, per-parameter R-hat, per-gene PPC, arviz comparison,
        spectra, marker correlations, ...).
    settings
        Sizes, seeds, markers, the predictive-equivalence verdict and the fits' settings.
    subsampling
        What was computed on a subset of cells or genes, and how large it was.
    provenance
        Package versions, data checksum, fits.
    timings
        Seconds per step.

    """

    def summary(self) -> str:
        """The headline as plain text, one sentence per line."""
        return "\n".join(f"- {line}" for line in self.headline)

    def to_frame(self) -> pd.DataFrame:
        """The main table, the invariants table (a copy)."""
        return self.invariants.copy()

    def to_dict(self) -> dict[str, Any]:
        """Every table and setting as JSON-safe Python objects (NaN and infinities become ``None``)."""
        return report_record(self)

    def to_markdown(self) -> str:
        """The report as Markdown (the text of report.md)."""
        return render_markdown(self)

    def to_html(self) -> str:
        """The report as one self-contained HTML page (the text of report.html)."""
        return render_html(self)

    def save(self, dir_path: str | Path, overwrite: bool = False, progress: Progress | None = None) -> Path:
        """Write ``report.html`` (self-contained), ``report.json`` and ``report.md`` into a new folder.

        The folder is built under a temporary name and renamed into place, so
        it either appears complete or not at all.

        Parameters
        ----------
        dir_path
            Destination folder.
        overwrite
            Replace an existing folder; otherwise an existing folder is an error.
        progress
            Called in this process with a :attr:`~countvae.diagnostics.ProgressKind.REPORT_FILE_WRITTEN`
            event (``name``: the file) as each file is complete in the temporary folder.

        Returns
        -------
        Path
            The folder.

        """
        return write_report_folder(
            dir_path,
            html_text=self.to_html(),
            record=self.to_dict(),
            markdown=self.to_markdown(),
            overwrite=overwrite,
            on_file_written=lambda name: notify(progress, ProgressEvent(REPORT_FILE_WRITTEN, name=name)),
        )

    def __repr__(self) -> str:
        fits = self.provenance.get("fits", [])
        return f"DiagnosticReport({len(fits)} fits)\n{self.summary()}"

    def _repr_html_(self) -> str:
        """The verdict and the invariants table, for notebooks (data-derived strings escaped)."""
        return summary_html(self)
