"""Multi-seed fits, their alignment, and the report of which quantities are stable across fits."""

from countvae.diagnostics.fitting.fit_seeds import fit_seeds, heldout_split, load_seed_fits
from countvae.diagnostics.fitting.fitted_model import CountVAEFit, FittedModel, SCVIFit
from countvae.diagnostics.fitting.seed_fits import SeedFits
from countvae.diagnostics.reporting.pipeline import DiagnosticReport, ReportSettings, report

__all__ = [
    "CountVAEFit",
    "DiagnosticReport",
    "FittedModel",
    "ReportSettings",
    "SCVIFit",
    "SeedFits",
    "fit_seeds",
    "heldout_split",
    "load_seed_fits",
    "report",
]
