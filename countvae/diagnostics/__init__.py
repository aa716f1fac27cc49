"""Multi-seed fits, their alignment, and the report of which quantities are stable across fits."""

from countvae.diagnostics.adapters import CountVAEFit, FittedModel
from countvae.diagnostics.report import DiagnosticReport, ReportSettings, report
from countvae.diagnostics.seedfits import SeedFits

__all__ = ["CountVAEFit", "DiagnosticReport", "FittedModel", "ReportSettings", "SeedFits", "report"]
