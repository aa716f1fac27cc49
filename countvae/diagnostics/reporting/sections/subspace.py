"""The subspace section: rotation-invariant geometry per seed pair and the latent covariance spectra."""

from __future__ import annotations

import pandas as pd

from countvae import plotting
from countvae.diagnostics.analyses.subspace import covariance_spectrum, geometry_table
from countvae.diagnostics.reporting.collect import Collected
from countvae.diagnostics.reporting.report_content import ReportContent
from countvae.diagnostics.reporting.sections.base import Block, FigureRow, Section, SectionResult, Shared, Table
from countvae.diagnostics.reporting.settings import ReportSettings


class SubspaceSection(Section):
    """CKA, k-NN overlap, spectra distance and principal angles between the seeds."""

    name = "subspace"
    title = "4. Subspaces and geometry"
    markdown_title = "Subspaces and geometry"
    needs = frozenset({"latent", "span"})
    figures = {
        "angles": (
            "Principal angles between gene-space spans",
            ("subspace",),
            "Angles between the gene-space directions the decoders of two seeds move along (loadings for a "
            "linear decoder, Jacobians for an MLP). Small angles: the seeds span the same programmes, whatever "
            "their coordinates.",
        ),
        "spectra": (
            "Latent covariance spectra",
            ("covariance_spectra",),
            "Eigenvalues of each seed's latent covariance; a rotation leaves them unchanged.",
        ),
    }

    def compute(self, c: Collected, shared: Shared, s: ReportSettings) -> SectionResult:
        """The geometry table and every fit's covariance spectrum."""
        latents = c.per_fit("latent")
        subspace = geometry_table(latents, c.per_fit("span"), k=s.k, max_knn_cells=s.max_knn_cells, seed=s.seed)
        spectra = pd.DataFrame(
            [
                {"fit": name, "component": i, "eigenvalue": float(v)}
                for name, z in latents.items()
                for i, v in enumerate(covariance_spectrum(z))
            ]
        )
        return SectionResult(tables={"subspace": subspace, "covariance_spectra": spectra})

    def layout(self, rep: ReportContent) -> list[Block]:
        """The principal angles and spectra side by side, then the table."""
        figures = []
        if "angles_deg" in rep.subspace:
            figures.append(self.figure("angles", lambda: plotting.principal_angles(rep.subspace)))
        spectra = rep.tables["covariance_spectra"]
        figures.append(self.figure("spectra", lambda: plotting.covariance_spectra(spectra)))
        return [FigureRow(tuple(figures)), Table(rep.subspace)]
