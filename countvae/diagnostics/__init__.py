"""Multi-seed fits, their alignment, and the report of which quantities are stable across fits.

Three rooms, imports pointing down only: ``reporting/`` (the report as a pipeline) uses ``analyses/`` (functions over
arrays), which use ``fitting/`` (seeds, backends, storage, the fits' common interface). ``diagnosis.py``, above the
three, is ``diagnose(adata)``: gene selection, ``fit_seeds`` and ``report`` in one call, what ``countvae diagnose``
runs.
"""

from countvae.diagnostics.diagnosis import (
    DIAGNOSE_N_LATENT,
    DIAGNOSE_N_TOP_GENES,
    DiagnosePlan,
    DiagnoseSettings,
    diagnose,
    plan_diagnose,
)
from countvae.diagnostics.fitting.default_training import DIAGNOSE_STOPPING
from countvae.diagnostics.fitting.fit_seeds import FitSeedsSettings, fit_seeds, heldout_split, load_seed_fits
from countvae.diagnostics.fitting.fitted_model import CountVAEFit, FittedModel
from countvae.diagnostics.fitting.parallelism import Parallelism, plan_parallelism
from countvae.diagnostics.fitting.progress import ProgressEvent, ProgressKind
from countvae.diagnostics.fitting.scvi_fit import SCVIFit
from countvae.diagnostics.fitting.seed_fits import SeedFits
from countvae.diagnostics.reporting.compare_models import compare_fits, compare_models
from countvae.diagnostics.reporting.compare_restrictions import RestrictionComparisonSettings, compare_restrictions
from countvae.diagnostics.reporting.downstream_section import DownstreamRequest, DownstreamSettings
from countvae.diagnostics.reporting.load_report import load_report
from countvae.diagnostics.reporting.model_comparison_report import ModelComparison
from countvae.diagnostics.reporting.pipeline import DiagnosticReport, ReportSettings, report
from countvae.diagnostics.reporting.restriction_report import RestrictionReport

__all__ = [
    "DIAGNOSE_N_LATENT",
    "DIAGNOSE_N_TOP_GENES",
    "DIAGNOSE_STOPPING",
    "CountVAEFit",
    "DiagnosePlan",
    "DiagnoseSettings",
    "DiagnosticReport",
    "DownstreamRequest",
    "DownstreamSettings",
    "FitSeedsSettings",
    "FittedModel",
    "ModelComparison",
    "Parallelism",
    "ProgressEvent",
    "ProgressKind",
    "ReportSettings",
    "RestrictionComparisonSettings",
    "RestrictionReport",
    "SCVIFit",
    "SeedFits",
    "compare_fits",
    "compare_models",
    "compare_restrictions",
    "diagnose",
    "fit_seeds",
    "heldout_split",
    "load_report",
    "load_seed_fits",
    "plan_diagnose",
    "plan_parallelism",
    "report",
]
