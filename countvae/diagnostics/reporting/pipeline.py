"""``report(fits, adata_heldout)``: every multi-seed diagnostic on the shared held-out cells, in one object.

The report is made of sections (:mod:`.sections`), run in three steps:

1. :mod:`.collect` visits each fit once for the union of what the sections need (latent means, held-out log p(x),
   decoded means, Jacobians, posterior predictive draws, guide draws, DE calls) and keeps the arrays;
2. each section's ``compute`` works on those arrays alone (what is fitted once, such as the maps
   between fits, is shared), returning its tables, the verdict rows it decides, its headline
   sentences and records (:mod:`.verdicts` holds the decision rules, :mod:`.headline` the wording);
3. :class:`~.diagnostic_report.DiagnosticReport` holds the result; its renderers loop over the sections' layouts.

Work that grows faster than linearly in cells, or is expensive per cell, runs on a random subset of the held-out cells
(:class:`~.collect.CellSubsets`) whose size is recorded in ``DiagnosticReport.subsampling`` and stated in the report.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence

import anndata as ad
import pandas as pd
from threadpoolctl import threadpool_limits  # a dependency of scikit-learn

from countvae._settings import takes_settings
from countvae.diagnostics.fitting.fitted_model import FittedModel
from countvae.diagnostics.fitting.seed_fits import SeedFits
from countvae.diagnostics.reporting.collect import collect, resolve_inputs
from countvae.diagnostics.reporting.diagnostic_report import DiagnosticReport
from countvae.diagnostics.reporting.downstream_section import DownstreamRequest
from countvae.diagnostics.reporting.report_content import MAIN_TABLES
from countvae.diagnostics.reporting.restriction_readout import RestrictionRequest
from countvae.diagnostics.reporting.sections.base import Section, SectionResult, Shared
from countvae.diagnostics.reporting.sections.registry import compute_order, registered_sections, resolve_sections
from countvae.diagnostics.reporting.sections.restrictions import NO_REQUEST, RestrictionsSection
from countvae.diagnostics.reporting.settings import ReportSettings
from countvae.diagnostics.reporting.stopwatch import Stopwatch
from countvae.errors import InvalidArgumentError

__all__ = ["DiagnosticReport", "DownstreamRequest", "ReportSettings", "report"]


# The settings of report are the fields of ReportSettings, each written once there (countvae._settings says why this
# departs from scvi-tools' explicit keyword arguments).
@takes_settings(ReportSettings)
def report(
    fits: SeedFits | Sequence[FittedModel],
    adata_heldout: ad.AnnData | None = None,
    markers: str | Sequence[str] | None = None,
    *,
    adata_fit: ad.AnnData | None = None,
    progress_bar: bool = False,
    downstream: DownstreamRequest | None = None,
    restrictions: RestrictionRequest | None = None,
    sections: str | Section | Sequence[str | Section] | None = None,
    settings: ReportSettings,
) -> DiagnosticReport:
    """Compare fits of one model from several seeds on shared held-out cells.

    Parameters
    ----------
    fits
        A :class:`SeedFits` (from :func:`fit_seeds`) or a list of :class:`FittedModel` (e.g.
        ``[CountVAEFit(model, seed) ...]``), at least two, with distinct seeds, the same genes and the same latent
        width, trained on the same cells (else a ``CountVAEWarning``: their data differences read as seed effects).
    adata_heldout
        Cells none of the fits was trained on (default: ``fits.adata_heldout``); a ``CountVAEWarning`` counts those
        named like cells of a fit's training AnnData or of ``adata_fit``.
    markers
        Gene names or ``obs`` columns (one name, or several) for the marker analysis; default: the
        genes of largest variance, plus the registered ``labels_key`` column.
    adata_fit
        Cells every fit was trained on (default: ``fits.adata_fit``). Each seed's ICA is estimated on two disjoint
        halves of them (many cells, none held out); without them, on halves of the held-out cells. The no-latent
        baseline of the equivalence margin is also estimated on them.
    progress_bar
        Show a progress bar over the fits.
    downstream
        Add the downstream section (DE calls between two groups, Leiden clusters
        and UMAP neighbourhoods across seeds, each against a within-fit
        baseline); see :class:`~countvae.diagnostics.reporting.downstream_section.DownstreamRequest`.
    restrictions
        Add the restrictions section (what each restriction buys in identified coordinates and costs in
        held-out fit, against ``fits``: the unrestricted model's seeds); see
        :class:`~countvae.diagnostics.reporting.restriction_readout.RestrictionRequest`.
    sections
        The sections to run, by name or as :class:`~countvae.diagnostics.reporting.sections.Section` objects (default:
        every registered section, see :mod:`countvae.diagnostics.reporting.sections.registry`; one name or object is one
        section); the sections they require are added.
    {settings}
    settings
        All of the sizes and seeds above as one :class:`ReportSettings`; keywords given with it replace its fields
        (``report(fits, held, settings=s, n_lpd_samples=500)``).

    Returns
    -------
    DiagnosticReport

    Raises
    ------
    InvalidArgumentError
        For one fit, duplicated seeds, fits on different genes or of different width, a marker that is neither a
        gene nor an obs column, an unknown section, the restrictions section without ``restrictions`` (or with
        restricted fits of other seeds or cells).

    """
    stopwatch = Stopwatch()
    s = settings.replace()  # a validated copy
    chosen = _chosen_sections(sections, downstream, restrictions)
    fit_list, adata, adata_fit, fit_settings = resolve_inputs(fits, adata_heldout, adata_fit)
    needs = frozenset().union(*(section.needs for section in chosen))
    limit = threadpool_limits(limits=s.blas_threads, user_api="blas") if s.blas_threads else contextlib.nullcontext()
    with limit:
        collected = collect(
            fit_list,
            adata,
            markers,
            s,
            fit_settings,
            stopwatch,
            progress_bar=progress_bar,
            adata_fit=adata_fit,
            needs=needs,
            downstream=downstream,
            restrictions=restrictions,
        )
        shared = Shared()
        for section in compute_order(chosen):
            shared.results[section.name] = section.compute(collected, shared, s)
            stopwatch.lap(section.name)
    results = [(section, shared.results[section.name]) for section in chosen]
    _check_names(results)
    stopwatch.timings["total"] = stopwatch.total()
    return DiagnosticReport(
        headline=_headline(results),
        tables=_tables(results),
        settings={"report": s.to_dict(), "sections": [section.name for section in chosen]}
        | {"markers": collected.marker_names, "fits": collected.fit_settings}
        | {k: v for _, r in results for k, v in r.records.items()},
        subsampling={k: v for _, r in results for k, v in r.subsampling.items()},
        provenance=collected.provenance(),
        timings=stopwatch.timings,
        sections=tuple(chosen),
        **{k: v for _, r in results for k, v in r.attributes.items()},
    )


def _chosen_sections(
    sections: str | Section | Sequence[str | Section] | None,
    downstream: DownstreamRequest | None,
    restrictions: RestrictionRequest | None,
) -> tuple[Section, ...]:
    """The sections asked for (``None``: the registered ones), with the section of each request given.

    Raises
    ------
    InvalidArgumentError
        For the restrictions section without ``restrictions`` (and as :func:`resolve_sections`).

    """
    if isinstance(sections, str | Section):  # one section, not a sequence of them (nor of a name's letters)
        sections = [sections]
    elif sections is not None and not isinstance(sections, Iterable):
        raise InvalidArgumentError(f"sections must be a section name, a Section or a list of them, got {sections!r}.")
    asked = {"downstream": downstream is not None, RestrictionsSection.name: restrictions is not None}
    if sections is not None or asked[RestrictionsSection.name]:
        sections = list(sections) if sections is not None else list(registered_sections())
        names = {item if isinstance(item, str) else item.name for item in sections}
        sections += [name for name, given in asked.items() if given and name not in names]
    chosen = resolve_sections(sections)
    if not chosen:
        raise InvalidArgumentError("sections is empty; name at least one section, or pass None for every section.")
    if restrictions is None and any(section.name == RestrictionsSection.name for section in chosen):
        raise InvalidArgumentError(NO_REQUEST)
    return chosen


#: Settings records the report writes itself, which no section may name.
_REPORT_RECORDS = ("report", "sections", "markers", "fits")
#: DiagnosticReport's own fields, which no section's attribute may name.
_REPORT_FIELDS = ("headline", "tables", "settings", "subsampling", "provenance", "timings", "sections")


def _check_names(results: list[tuple[Section, SectionResult]]) -> None:
    """Refuse names the report cannot merge: one name from two sections, the report's own, a repeated column.

    The report merges the sections' tables, records, subsampling and attributes by name, so a second section's name
    would replace the first's without a word (and a record named like the report's settings would make a report.json
    its schema refuses); a table with a repeated column cannot be saved.

    Raises
    ------
    InvalidArgumentError
        Naming the sections, the kind of result and the name.

    """
    for kind, reserved in (
        ("tables", ()),
        ("records", _REPORT_RECORDS),
        ("subsampling", ()),
        ("attributes", _REPORT_FIELDS),
    ):
        owner: dict[str, str] = dict.fromkeys(reserved, "the report itself")
        for section, result in results:
            for name in getattr(result, kind):
                if name in owner:
                    raise InvalidArgumentError(
                        f"Section {section.name!r} gives {kind} {name!r}, which {owner[name]} already gives; rename "
                        "it in the section's SectionResult."
                    )
                owner[name] = f"section {section.name!r}"
    for section, result in results:
        for name, table in result.tables.items():
            if table is not None and table.columns.has_duplicates:
                repeated = sorted({str(c) for c in table.columns[table.columns.duplicated()]})
                raise InvalidArgumentError(
                    f"Section {section.name!r} gives table {name!r} with repeated columns {repeated}; give each "
                    "column its own name."
                )


def _headline(results: list[tuple[Section, SectionResult]]) -> list[str]:
    """The sections' sentences, by their headline rank (ties in report order)."""
    ranked = sorted(enumerate(results), key=lambda item: (item[1][0].headline_rank, item[0]))
    return [line for _, (_, result) in ranked for line in result.headline]


def _tables(results: list[tuple[Section, SectionResult]]) -> dict[str, pd.DataFrame]:
    """Every table by name: the main ones (:data:`MAIN_TABLES`, in the order of the sections), then the details."""
    every = {k: v for _, r in results for k, v in r.tables.items() if v is not None}
    return {k: every[k] for k in MAIN_TABLES if k in every} | {k: v for k, v in every.items() if k not in MAIN_TABLES}
