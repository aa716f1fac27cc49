"""``compare_restrictions``: what each restriction buys in identified coordinates and costs in held-out fit.

It runs the restrictions section of the multi-seed report on fits of the unrestricted model and each restricted one:

1. every model (the unrestricted one, then each restricted one) is fitted by :func:`countvae.diagnostics.fit_seeds` with
   the same seeds, training cells and held-out cells (with ``out_dir``, each in its own resumable folder;
   :func:`~countvae.diagnostics.fitting.restrictions.fit_restrictions`); ICA re-reads the unrestricted fits;
2. each fit is read once on the held-out cells (the collect step,
   :func:`~countvae.diagnostics.reporting.restriction_readout.collect_restrictions`);
3. the section's pure computation, :func:`~countvae.diagnostics.reporting.sections.restrictions.restriction_analysis`,
   makes the tables and states the verdicts in sentences (the definitions are in
   :mod:`countvae.diagnostics.analyses.restrictions`).

``report(fits, held, restrictions=RestrictionRequest(fitted))`` runs steps 2 and 3 inside the multi-seed report.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd

from countvae._checks import check_bool, check_choice, check_int, check_number
from countvae._provenance import package_versions
from countvae._settings import documents_settings, setting, takes_settings
from countvae.data.gene_sets import GenePrograms, as_gene_programs, check_gene_programs
from countvae.data.registry import get_registry
from countvae.diagnostics.analyses.heldout_data import data_checksum
from countvae.diagnostics.analyses.markers import marker_matrix, marker_names
from countvae.diagnostics.analyses.restrictions import DEFAULT_MARGIN, IDENTIFIED_AGREEMENT
from countvae.diagnostics.fitting.fit_seeds import check_seeds
from countvae.diagnostics.fitting.parallelism import AUTO
from countvae.diagnostics.fitting.restrictions import (
    MODEL_SETTINGS,
    UNRESTRICTED,
    Restriction,
    fit_restrictions,
    parse_restrictions,
    restriction_programs,
)
from countvae.diagnostics.reporting.collect import default_markers_with_labels, marker_list
from countvae.diagnostics.reporting.restriction_readout import (
    DEFAULT_LPD_SAMPLES,
    RestrictionRequest,
    collect_restrictions,
)
from countvae.diagnostics.reporting.restriction_report import RestrictionReport
from countvae.diagnostics.reporting.sections.restrictions import restriction_analysis
from countvae.errors import InvalidArgumentError
from countvae.model.settings import ModelSettings

logger = logging.getLogger(__name__)

#: The settings passed on to :func:`fit_restrictions` as they are.
_FIT_OPTIONS = ("split_half", "heldout_fraction", "split_seed", "n_jobs", "out_dir", "overwrite", "progress_bar")


# ----- the comparison ------------------------------------------------------------------------------------
def _checked_before_fitting(
    adata: ad.AnnData, opts: RestrictionComparisonSettings, kwargs_by_model: dict[str, dict[str, Any]], var_names: Any
) -> list[str] | None:
    """Refuse before any fit what would stop the comparison after the fits; the markers asked for, as a list.

    Each model's settings (a restricted model's were first checked when its fits began, after the unrestricted
    model's), the markers and the analyses' seed.
    """
    for kwargs in kwargs_by_model.values():
        ModelSettings(**kwargs)
    check_int("seed", opts.seed, 0)
    if opts.markers is None:
        return None
    markers = [str(m) for m in marker_list(opts.markers)]
    if adata.isbacked:  # genes by name only: their values would read every cell's counts from the file
        obs_markers = [m for m in marker_names(markers, adata.obs, var_names) if m not in var_names]
        if obs_markers:
            marker_matrix(adata, obs_markers, var_names)
    else:
        marker_matrix(adata, markers, var_names)
    return markers


def _resolve_programs(
    restrictions: list[Restriction], gene_programs: Any, var_names: pd.Index, unknown_genes: str
) -> GenePrograms | None:
    chosen = [r for r in restrictions if r.name == "programs"]
    if not chosen:
        if gene_programs is not None:
            raise InvalidArgumentError("gene_programs were given, but 'programs' is not among the restrictions.")
        if unknown_genes != "error":  # it would otherwise be recorded in the settings as if it had done something
            raise InvalidArgumentError(
                f"unknown_genes={unknown_genes!r} applies to the genes of the 'programs' restriction, which is not "
                "among the restrictions; leave unknown_genes out, or add 'programs'."
            )
        return None
    given = None if gene_programs is None else as_gene_programs(gene_programs)
    return check_gene_programs(restriction_programs(chosen[0], given), var_names, unknown_genes)


@documents_settings()
@dataclasses.dataclass(frozen=True)
class RestrictionComparisonSettings:
    """The settings of :func:`compare_restrictions`, each declared once here with its description.

    Attributes
    ----------
    {settings}

    """

    gene_programs: dict[str, list[str]] | str | None = setting(
        None,
        """``{name: [genes]}`` or a GMT path for the ``"programs"`` restriction; ``n_latent`` is then the number of
        programs for every model.""",
    )
    unknown_genes: str = setting(
        "error", '``"error"`` (default) or ``"drop"``: what to do with program genes the data lack.'
    )
    model_kwargs: dict[str, Any] | None = setting(
        None,
        """Settings shared by every model (default ``decoder="linear"``: the horseshoe and gene programs restrict the
        linear decoder's loadings).""",
    )
    train_kwargs: dict[str, Any] | None = setting(None, "Arguments of ``train`` shared by every fit (not ``seed``).")
    heldout_fraction: float = setting(0.1, "Fraction of held-out cells shared by every model (see :func:`fit_seeds`).")
    split_seed: int = setting(0, "Seed of the held-out split (see :func:`fit_seeds`).")
    markers: list[str] | None = setting(
        None,
        """Genes or ``obs`` columns for the marker agreement; default: the 8 most variable genes and the registered
        labels.""",
    )
    split_half: bool = setting(
        True,
        """Fit each model again on two disjoint halves of the training cells (one from each of the first two seeds).
        Without it no restriction is credited with identifying the axes (verdict at most ``undetermined``).""",
    )
    check_symmetry: bool = setting(True, "Run :func:`countvae.invariance.verify` on each model's first fit.")
    margin: float = setting(DEFAULT_MARGIN, "Equivalence margin of the predictive cost, nats per cell.")
    n_lpd_samples: int = setting(DEFAULT_LPD_SAMPLES, "Importance samples per held-out cell.")
    seed: int = setting(0, "Seed of the analyses (cell halves, ICA, importance sampling).")
    n_jobs: int | str = setting(AUTO, 'As in :func:`fit_seeds` (``"auto"``: one seed per usable core).')
    out_dir: str | None = setting(
        None, "As in :func:`fit_seeds`; each model's fits are stored in ``out_dir/<model>`` and a rerun reuses them."
    )
    overwrite: bool = setting(False, "As in :func:`fit_seeds`.")
    progress_bar: bool = setting(False, "As in :func:`fit_seeds`.")


@takes_settings(RestrictionComparisonSettings)
def compare_restrictions(
    adata: ad.AnnData,
    restrictions: str | Iterable[str | Restriction] = ("laplace", "horseshoe", "ica"),
    seeds: Iterable[int] = range(3),
    *,
    settings: RestrictionComparisonSettings,
) -> RestrictionReport:
    """What each restriction buys in identified coordinates, and what it costs in held-out fit.

    Fits the unrestricted model (N(0, I) prior, free loadings) and each restricted one over the same seeds,
    training cells and held-out cells, and reports per restriction its predictive cost, what it identifies
    (with the split-half check required before a restriction is credited), the recovery of simulated truth,
    the support of gene programs and the check of each model's declared symmetry (the module docstring has
    the steps; :mod:`countvae.diagnostics.analyses.restrictions` the definitions).

    Parameters
    ----------
    adata
        Counts registered with :meth:`countvae.CountVAE.setup_anndata`.
    restrictions
        Names (``"laplace"``, ``"horseshoe"``, ``"programs"`` or ``"programs:<file.gmt>"``, ``"ica"``), as a list or
        one comma-separated string.
    seeds
        At least two seeds; every model is fitted from each.
    {settings}
    settings
        All of the above as one :class:`RestrictionComparisonSettings`; keywords given with it replace its fields.

    Returns
    -------
    RestrictionReport

    Raises
    ------
    InvalidArgumentError
        For an unknown restriction, fewer than two seeds, a ``programs`` restriction without programs, or an
        ``n_latent`` that differs from the number of programs.
    InvalidDataError
        For program genes the data lack (with ``unknown_genes="error"``) or a program with fewer than 2 genes in the
        data.

    """
    started, opts = time.perf_counter(), settings
    if not isinstance(adata, ad.AnnData):
        raise InvalidArgumentError(f"compare_restrictions expects an AnnData, got {type(adata).__name__}.")
    seeds = check_seeds(seeds)
    check_choice("unknown_genes", opts.unknown_genes, ("error", "drop"))
    chosen = parse_restrictions(restrictions)
    registry = get_registry(adata)
    var_names = pd.Index(adata.raw.var_names if registry is not None and registry.use_raw else adata.var_names)
    programs = _resolve_programs(chosen, opts.gene_programs, var_names, opts.unknown_genes)
    margin = check_number("margin", opts.margin, 0.0, low_open=True)
    check_int("n_lpd_samples", opts.n_lpd_samples, 2)
    check_bool("split_half", opts.split_half)  # "no" would run the split-half fits asked away
    check_bool("check_symmetry", opts.check_symmetry)
    base_kwargs, kwargs_by_model = _model_settings(chosen, programs, opts.model_kwargs)
    marker_names = _checked_before_fitting(adata, opts, kwargs_by_model, var_names)
    train_kwargs = {"progress_bar": False, **(opts.train_kwargs or {})}
    logger.info("Fitting %d models from %d seeds.", len(kwargs_by_model), len(seeds))
    fitted = fit_restrictions(
        adata, kwargs_by_model, seeds, train_kwargs, **{name: getattr(opts, name) for name in _FIT_OPTIONS}
    )
    timings = {"fitting": time.perf_counter() - started}
    mark = time.perf_counter()
    heldout = fitted.adata_heldout
    marker_names = marker_names if marker_names is not None else default_markers_with_labels(heldout, var_names, 8)
    request = RestrictionRequest(fitted, chosen, margin, opts.n_lpd_samples, opts.seed, opts.check_symmetry)
    markers = marker_matrix(heldout, marker_names, var_names).to_numpy(dtype=np.float64)
    arrays = collect_restrictions(request, markers, var_names)
    timings["reading fits"] = time.perf_counter() - mark
    mark = time.perf_counter()
    tables, lines = restriction_analysis(arrays, margin, opts.seed)
    timings["analyses"] = time.perf_counter() - mark
    timings["total"] = time.perf_counter() - started
    record = {
        "restrictions": [r.name for r in chosen],
        "seeds": [f.seed for f in fitted.fits[UNRESTRICTED.name]],
        "model_kwargs": {k: v for k, v in base_kwargs.items() if k != "gene_programs"},
        "train_kwargs": train_kwargs,
        "heldout_fraction": opts.heldout_fraction,
        "split_seed": opts.split_seed,
        "heldout_cells": int(heldout.n_obs),
        "markers": list(marker_names),
        "margin_nats_per_cell": margin,
        "identified_threshold": IDENTIFIED_AGREEMENT,
        "n_lpd_samples": opts.n_lpd_samples,
        "split_half": opts.split_half,
        "check_symmetry": opts.check_symmetry,
        "gene_programs": programs,
    }
    return RestrictionReport(
        headline=lines,
        tables=tables,
        settings=record,
        provenance={"versions": package_versions(), "heldout_checksum_sha256": data_checksum(heldout, var_names)},
        timings=timings,
    )


def _model_settings(
    chosen: list[Restriction], programs: GenePrograms | None, model_kwargs: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The settings every model shares, and each model's own (the unrestricted one first)."""
    owned = {"gene_programs", *(key for kwargs in MODEL_SETTINGS.values() for key in kwargs)}
    defaults = ModelSettings()  # the reference's own values (prior="normal", ...) restrict nothing
    owned = sorted(k for k in owned & set(model_kwargs or {}) if model_kwargs[k] != getattr(defaults, k))
    if owned:  # given to every model, they would make the unrestricted reference a restricted model
        raise InvalidArgumentError(
            f"model_kwargs sets {owned}, which the restrictions set for their own models (the unrestricted reference "
            "keeps the N(0, I) prior and free loadings); name the restriction in restrictions= instead."
        )
    base_kwargs = {"decoder": "linear", **(model_kwargs or {})}
    if programs is not None and base_kwargs.setdefault("n_latent", len(programs)) != len(programs):
        raise InvalidArgumentError(
            f"model_kwargs has n_latent={base_kwargs['n_latent']}, but there are {len(programs)} gene programs: "
            "every model of the comparison has one dimension per program, so leave n_latent out."
        )
    by_model = {
        r.name: {**base_kwargs, **r.model_kwargs, **({"gene_programs": programs} if r.name == "programs" else {})}
        for r in [UNRESTRICTED] + [r for r in chosen if not r.post_hoc]
    }
    return base_kwargs, by_model
