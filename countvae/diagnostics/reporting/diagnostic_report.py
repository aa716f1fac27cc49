""":class:`DiagnosticReport`: the report's content with the verbs every countvae report shares.

The verbs (``summary``, ``to_frame``, ``tables``, ``to_dict``, ``to_markdown``, ``to_html``, ``save``) are shared
with :class:`countvae.invariance.InvarianceReport`; both save via :func:`countvae._report_files.write_report_folder`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anndata as ad
import pandas as pd

from countvae._report_files import check_report_folder, write_report_folder
from countvae.diagnostics.fitting.progress import REPORT_FILE_WRITTEN, Progress, ProgressEvent, notify
from countvae.diagnostics.reporting.anndata_export import write_report
from countvae.diagnostics.reporting.model_card import model_card
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
        Every table by name: first the main ones (in the order above), then the details (pairwise tables,
        per-parameter R-hat, per-gene PPC, arviz comparison, spectra, marker correlations, ...).
    settings
        Sizes, seeds, markers, the predictive-equivalence decision (``predictive_equivalence``:
        state, reason, remedy, margin) and the fits' settings.
    subsampling
        What was computed on a subset of cells or genes, and how large it was.
    provenance
        Package versions, data checksum, fits.
    timings
        Seconds per step.
    cells, genes, consensus_latent
        Per cell (the held-out cells, then the fit cells the report read, told apart by the column ``heldout``) and per
        gene, the agreement across seeds, and those cells' consensus latent (in memory only, not in the report files);
        see :meth:`write`.
    cells_knn_k
        Neighbours per cell of the column ``knn_agreement`` of ``cells``: the report's ``k``, its cells' neighbours
        found among every held-out and fit cell, as for the k-NN row (the subsampling entry "k-NN graphs").
    cells_within_seed_k
        Neighbours per cell of its within-seed baseline ``knn_agreement_within_seed``, found among the cells the
        report has guide draws of: the report's ``k`` scaled to the share of the data set they are, so fewer than
        ``k`` on large data.

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

    def write(self, adata: ad.AnnData, overwrite: bool = False) -> dict[str, list[str]]:
        """Write the per-cell and per-gene findings, the consensus latent and a summary into ``adata`` (in place).

        ``obs``: ``countvae_heldout``, ``countvae_knn_agreement`` (cross-seed k-NN overlap at ``cells_knn_k``
        neighbours, which the summary's ``key_notes`` give),
        ``countvae_knn_agreement_within_seed`` (its within-seed baseline, at ``cells_within_seed_k``),
        ``countvae_lpd_mean``, ``countvae_lpd_sd``
        (held-out log p(x) over seeds), ``countvae_batch_mixing`` (with batches); ``var``:
        ``countvae_decoded_agreement``, ``countvae_de_call_frequency`` (with DE); ``obsm["X_countvae_consensus"]``;
        ``uns["countvae_report"]``. Cells are matched by ``obs_names``, genes by ``var_names``. The held-out cells and
        the fit cells the report read (up to ``max_fit_cells``) get the k-NN columns and the consensus latent; other
        cells, held-out log p(x) of fit cells and cells outside the subset a quantity is computed on get NaN
        (:mod:`countvae.diagnostics.reporting.anndata_export`). Everything written survives ``write_h5ad`` /
        ``read_h5ad``.

        Parameters
        ----------
        adata
            The AnnData the report's cells come from (all its cells, or only the held-out or fit ones).
        overwrite
            Replace keys that exist; otherwise an existing key is an error and nothing is written.

        Returns
        -------
        dict
            Slot -> keys written.

        Raises
        ------
        OutputExistsError
            If a key exists and ``overwrite`` is False.
        InvalidDataError
            If none of ``adata``'s cells is one of the report's cells, or none of its genes one of the report's genes,
            or a name of ``adata`` that is one of the report's cells or genes repeats (make them unique first:
            ``adata.obs_names_make_unique()``, ``adata.var_names_make_unique()``).

        Examples
        --------
        >>> rep.write(adata)  # doctest: +SKIP
        >>> sc.pl.umap(adata, color="countvae_knn_agreement")  # doctest: +SKIP

        """
        return write_report(self, adata, overwrite=overwrite)

    def model_card(self) -> str:
        """A short Markdown block: what the fits identify, predictive equivalence, calibration, versions, settings.

        See :mod:`countvae.diagnostics.reporting.model_card`.
        """
        return model_card(self)

    def save(self, dir_path: str | Path, overwrite: bool = False, progress: Progress | None = None) -> Path:
        """Write ``report.html`` (self-contained), ``report.json`` and ``report.md`` into a new folder.

        The folder is built under a temporary name and renamed into place: it appears complete or not at all.

        Parameters
        ----------
        dir_path
            Destination folder.
        overwrite
            Replace an existing report folder; otherwise an existing folder is an error. The folder is replaced whole,
            so one holding anything but ``report.html``, ``report.json`` and ``report.md`` (the data, notes) is
            refused, whatever ``overwrite`` says, before the report is rendered.
        progress
            Called in this process with a :attr:`~countvae.diagnostics.ProgressKind.REPORT_FILE_WRITTEN`
            event (``name``: the file) as each file is complete in the temporary folder.

        Returns
        -------
        Path
            The folder.

        Raises
        ------
        OutputExistsError
            If the folder exists and ``overwrite`` is False, it holds files a report folder does not hold, or
            ``dir_path`` is a file or a symbolic link.

        """
        check_report_folder(dir_path, overwrite)
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
