"""The report's per-cell and per-gene findings in the AnnData slots a scanpy user looks in.

``obs["countvae_heldout"]``
    Whether the cell is one of the report's held-out cells (False for fit cells it measured and for cells it did not).
``obs["countvae_knn_agreement"]``
    The cell's k-NN Jaccard overlap between the latent means of two seeds, mean over pairs of seeds (1: the same
    neighbours in every fit); held-out and fit cells alike, on one graph of both.
``obs["countvae_knn_agreement_within_seed"]``
    The same between two guide draws of one fit, mean over fits: the within-seed
    baseline (how much the neighbourhood moves under the posterior's own uncertainty).
``obs["countvae_lpd_mean"]``, ``obs["countvae_lpd_sd"]``
    Held-out log p(x) in nats: mean over seeds, and standard deviation across seeds
    (held-out cells only: the fits were trained on the others).
``obs["countvae_batch_mixing"]``
    The share of the cell's neighbours from another batch over the share expected if batch
    were random, mean over seeds (reports of fits with a registered batch only).
``var["countvae_decoded_agreement"]``
    Lin's concordance of the gene's decoded log mean across held-out cells between two seeds, mean over seed pairs.
``var["countvae_de_call_frequency"]``
    Fraction of seeds that call the gene DE (reports with DE only).
``obsm["X_countvae_consensus"]``
    Consensus latent: each seed's latent means mapped onto the first seed's by orthogonal Procrustes, then averaged.
``uns["countvae_report"]``
    Summary: headline, verdict per quantity, predictive equivalence, seeds, the keys
    written and what each means, package versions, the model card (Markdown).

NaN marks a value not computed for that cell or gene: cells the report did not measure (fit cells beyond the
``max_fit_cells`` it reads, cells of other data), held-out log p(x) of the fit cells, held-out cells outside the random
subsets the report computes each quantity on (the k-NN columns on ``max_knn_cells`` cells, log p(x) on
``max_lpd_cells``; see ``DiagnosticReport.subsampling``), and genes outside the ``max_genes`` most variable genes the
decoded means are compared on. The obsm key follows scanpy's ``X_`` convention (as ``X_countvae``), so that
``sc.pp.neighbors(adata, use_rep="X_countvae_consensus")`` and ``sc.pl.embedding`` find it.

Existing keys are never replaced unless ``overwrite=True``, and nothing is written when any key is taken; with
``overwrite=True`` the columns an earlier report wrote and this one does not are removed. Everything written survives
``adata.write_h5ad`` and ``anndata.read_h5ad`` (the summary holds strings, numbers and lists of strings only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anndata as ad
import numpy as np
import pandas as pd

from countvae._checks import check_bool
from countvae._formatting import json_ready
from countvae._provenance import package_versions
from countvae.data.validation import check_unique_names
from countvae.diagnostics.analyses.stability_columns import de_call_frequency
from countvae.errors import InvalidArgumentError, InvalidDataError, OutputExistsError

if TYPE_CHECKING:
    from countvae.diagnostics.reporting.diagnostic_report import DiagnosticReport

PREFIX = "countvae_"
HELDOUT_KEY = "countvae_heldout"
CONSENSUS_KEY = "X_countvae_consensus"
UNS_KEY = "countvae_report"

#: Key -> what it holds (stored in the summary, so that a saved file explains its own columns).
KEY_NOTES = {
    HELDOUT_KEY: "whether the cell is one of the report's held-out cells (False for the fit cells and cells not "
    "measured)",
    "countvae_knn_agreement": "k-NN Jaccard overlap of the cell's neighbours between the latent means of two seeds, "
    "mean over pairs of seeds; held-out and fit cells on one graph of both (when the report had fit cells)",
    "countvae_knn_agreement_within_seed": "the same overlap between two guide draws of one fit, mean over fits "
    "(within-seed baseline)",
    "countvae_lpd_mean": "held-out log p(x) in nats, mean over seeds",
    "countvae_lpd_sd": "held-out log p(x), standard deviation across seeds",
    "countvae_batch_mixing": "share of the cell's neighbours from another batch over the share expected if batch "
    "were random (1: as if at random), mean over seeds",
    "countvae_decoded_agreement": "Lin's concordance of the gene's decoded log mean across held-out cells between "
    "two seeds, mean over pairs of seeds",
    "countvae_de_call_frequency": "fraction of seeds that call the gene DE",
    CONSENSUS_KEY: "latent means of every seed mapped onto the first seed's by orthogonal Procrustes, averaged",
}
#: The note every summary carries about NaN.
NAN_NOTE = (
    "NaN: not computed for this cell or gene (cells the report did not measure, held-out log p(x) of the fit "
    "cells, cells outside the random subset a quantity is computed on; genes outside the compared genes)."
)


def existing_report_keys(adata: ad.AnnData) -> list[str]:
    """The keys a report can write (:data:`KEY_NOTES`, the summary) that ``adata`` holds already, as ``"obs['k']"``."""
    frames = {"obs": adata.obs.columns, "var": adata.var.columns}
    taken = [f"{slot}[{key!r}]" for slot, columns in frames.items() for key in KEY_NOTES if key in columns]
    taken += [f"obsm[{CONSENSUS_KEY!r}]"] if CONSENSUS_KEY in adata.obsm else []
    return taken + ([f"uns[{UNS_KEY!r}]"] if UNS_KEY in adata.uns else [])


def h5ad_ready(value: Any) -> Any:
    """``value`` as h5ad can store it: JSON-ready, ``None`` as ``""``, mixed lists as strings, no "/" in keys.

    (h5py reads a "/" in a key as a path into nested groups, so it becomes " or ".)
    """
    value = json_ready(value)
    if value is None:
        return ""
    if isinstance(value, dict):
        return {str(k).replace("/", " or "): h5ad_ready(v) for k, v in value.items()}
    if isinstance(value, list):
        items = [h5ad_ready(v) for v in value]
        if all(isinstance(v, bool) for v in items) or all(isinstance(v, str) for v in items):
            return items
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in items):
            return items
        if all(isinstance(v, dict) for v in items):
            return {str(i): v for i, v in enumerate(items)}
        return [str(v) for v in items]
    return value


def _report_frames(rep: DiagnosticReport) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
    sections = rep.settings.get("sections")
    if sections is not None and "per_cell" not in sections:
        raise InvalidArgumentError(
            f"This report was made with sections={sections}; write() needs the 'per_cell' and 'invariants' sections. "
            "Add them to report(..., sections=[...]), or make the report with every section."
        )
    if rep.cells is None or rep.genes is None or rep.consensus_latent is None:
        raise InvalidArgumentError(
            "This report holds no per-cell results (a report read back from its files, or made by an older "
            "version); make it again with countvae.diagnostics.report(...) and call write() on that object."
        )
    genes = rep.genes.copy()
    downstream = rep.downstream
    if downstream is not None and downstream.de_calls.shape[1]:
        genes["de_call_frequency"] = de_call_frequency(downstream.de_calls).reindex(genes.index)
    return rep.cells, genes, rep.consensus_latent


def _positions(report_names: pd.Index, adata_names: pd.Index) -> np.ndarray:
    """Position of each of ``adata``'s cells among the report's cells (-1 for cells that are not in it).

    Names of ``adata`` that are none of the report's may repeat (their cells get NaN); a repeated name that is one of
    the report's is refused, since which of its cells the report measured cannot be told.
    """
    if not report_names.is_unique:
        raise InvalidDataError("The report's cells have repeated names; give the cells unique obs_names.")
    positions = report_names.get_indexer(adata_names)
    if not (positions >= 0).any():
        raise InvalidDataError(
            f"None of adata's {len(adata_names)} cells is one of the report's {len(report_names)} cells (held-out "
            f"and fit cells, by obs_names, e.g. {list(report_names[:3])}); pass the AnnData the report's cells come "
            "from."
        )
    check_unique_names(
        adata_names[positions >= 0],
        "obs",
        "write() gives each cell the report's values for its name: every cell of such a name would get one "
        "measured cell's findings",
        after=", which leaves each name to its first cell: put the cells the report measured first",
    )
    return positions


def _gene_positions(report_genes: pd.Index, adata_genes: pd.Index) -> np.ndarray:
    """Position of each of ``adata``'s genes among the report's genes (-1 for genes that are not in it).

    As for cells (:func:`_positions`), a repeated name that is one of the report's is refused.
    """
    positions = report_genes.get_indexer(adata_genes)
    if len(report_genes) and not (positions >= 0).any():
        raise InvalidDataError(
            f"None of adata's {len(adata_genes)} genes is one of the report's {len(report_genes)} genes (by "
            f"var_names: the report's e.g. {list(report_genes[:3])}, adata's {list(adata_genes[:3])}); the "
            "per-gene columns would be NaN for every gene. Pass the AnnData the fits were trained on, or set its "
            "var_names to the same identifiers (symbols or IDs) first."
        )
    check_unique_names(
        adata_genes[positions >= 0],
        "var",
        "write() gives each gene the report's values for its name: every gene of such a name would get one gene's "
        "values",
    )
    return positions


def _take(values: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Rows of ``values`` at ``positions``, NaN where a position is -1."""
    values = np.asarray(values, dtype=np.float64)
    out = np.full((len(positions), *values.shape[1:]), np.nan)
    found = positions >= 0
    out[found] = values[positions[found]]
    return out


def summary_record(rep: DiagnosticReport, written: dict[str, list[str]], n_matched: int) -> dict[str, Any]:
    """The ``uns`` summary: what the report found, what was written and what each key means."""
    invariants = rep.invariants
    fits = rep.provenance.get("fits", [])
    record = {
        "headline": list(rep.headline),
        "verdicts": {
            "quantity": invariants["quantity"].astype(str).tolist(),
            "verdict": invariants["verdict"].astype(str).tolist(),
        },
        "predictive_equivalence": rep.settings.get("predictive_equivalence", {}),
        "seeds": [int(f["seed"]) for f in fits],
        "fits": [str(f["name"]) for f in fits],
        "symmetry": str(fits[0]["symmetry"]) if fits else "",
        "heldout_cells": int(rep.cells["heldout"].sum()),
        "fit_cells": int((~rep.cells["heldout"]).sum()),
        "cells_written": int(n_matched),
        "keys": written,
        "key_notes": {key: _key_note(rep, key) for keys in written.values() for key in keys if key in KEY_NOTES},
        "nan_note": NAN_NOTE,
        "versions": package_versions("anndata"),
        "model_card": rep.model_card(),
    }
    return h5ad_ready(record)


def _key_note(rep: DiagnosticReport, key: str) -> str:
    """:data:`KEY_NOTES`' note on ``key``, with the neighbours per cell of a k-NN column (scaled on large data)."""
    k = {
        "countvae_knn_agreement": rep.cells_knn_k,
        "countvae_knn_agreement_within_seed": rep.cells_within_seed_k,
        "countvae_batch_mixing": rep.settings.get("batch_mixing", {}).get("k"),
    }.get(key)
    if k is None:
        return KEY_NOTES[key]
    k_asked = rep.settings["report"]["k"]
    scaled = "" if k == k_asked else f", the report's k={k_asked} scaled to the share of the cells the graph holds"
    return f"{KEY_NOTES[key]}; k={k} neighbours per cell{scaled}"


def _remove_earlier_keys(adata: ad.AnnData, written: dict[str, list[str]]) -> None:
    """Remove what the report being replaced wrote (its summary's ``keys``) and this one does not write.

    A column of other fits (``countvae_batch_mixing`` of fits with a batch, ``countvae_de_call_frequency`` of a report
    with DE) would otherwise stay beside a summary that does not list it, and read as this report's finding.
    """
    earlier = adata.uns.get(UNS_KEY)
    keys = earlier.get("keys") if isinstance(earlier, dict) else None
    if not isinstance(keys, dict):
        return
    stores = {"obs": adata.obs, "var": adata.var, "obsm": adata.obsm}
    for slot, names in keys.items():
        for name in map(str, [names] if isinstance(names, str) else names):
            rewritten = name in written.get(slot, [])
            if slot in stores and not rewritten and name.startswith((PREFIX, CONSENSUS_KEY)) and name in stores[slot]:
                del stores[slot][name]


def write_report(rep: DiagnosticReport, adata: ad.AnnData, overwrite: bool = False) -> dict[str, list[str]]:
    """Write the report's per-cell and per-gene columns, consensus latent and summary into ``adata`` (in place).

    See the module docstring for the keys. Cells are matched by ``obs_names``, genes
    by ``var_names``; cells and genes the report does not cover get NaN. ``adata`` may
    be the held-out cells, the fit cells or the whole data set the fits came from; the
    names it shares with the report must not repeat (two samples concatenated without
    ``index_unique`` share barcodes: ``adata.obs_names_make_unique()`` first).

    Returns
    -------
    dict
        Slot -> keys written, e.g. ``{"obs": [...], "var": [...], "obsm": ["X_countvae_consensus"],
        "uns": ["countvae_report"]}``.

    Raises
    ------
    OutputExistsError
        If a key exists and ``overwrite`` is False (nothing is written then). With ``overwrite``, the columns an
        earlier report wrote (listed in its summary) and this one does not are removed with it.
    InvalidDataError
        If none of ``adata``'s cells is one of the report's cells, or none of its genes one of the report's
        genes, or a name of ``adata`` that is one of the report's cells or genes repeats (nothing is written then).

    """
    if not isinstance(adata, ad.AnnData):
        raise InvalidArgumentError(f"adata must be an AnnData, got {type(adata).__name__}.")
    if adata.is_view:
        raise InvalidArgumentError(
            "adata is a view (a subset such as adata[cells] not copied); the report's columns written into it would "
            "go to a copy that anndata makes, not to the AnnData it was taken from. Pass an AnnData of its own: "
            "sub = adata[cells].copy() (.to_memory() for a backed file), then report.write(sub); or write into the "
            "whole AnnData (cells the report did not measure get NaN)."
        )
    check_bool("overwrite", overwrite)
    cells, genes, consensus = _report_frames(rep)
    positions = _positions(pd.Index(cells.index.astype(str)), pd.Index(adata.obs_names.astype(str)))
    gene_positions = _gene_positions(pd.Index(genes.index.astype(str)), pd.Index(adata.var_names.astype(str)))
    heldout = np.zeros(len(positions), dtype=bool)
    heldout[positions >= 0] = cells["heldout"].to_numpy(dtype=bool)[positions[positions >= 0]]
    measured = cells.drop(columns="heldout")
    obs = {HELDOUT_KEY: heldout} | {
        PREFIX + column: _take(measured[column].to_numpy(), positions) for column in measured.columns
    }
    var = {PREFIX + column: _take(genes[column].to_numpy(), gene_positions) for column in genes.columns}
    written = {"obs": list(obs), "var": list(var), "obsm": [CONSENSUS_KEY], "uns": [UNS_KEY]}
    stores = {"obs": adata.obs.columns, "var": adata.var.columns, "obsm": adata.obsm, "uns": adata.uns}
    taken = [f"{slot}[{key!r}]" for slot, keys in written.items() for key in keys if key in stores[slot]]
    if taken and not overwrite:
        raise OutputExistsError(
            f"adata already has {', '.join(taken)}; pass overwrite=True to replace them (report.write(adata, "
            "overwrite=True), or --overwrite on the command line), or write into a copy."
        )
    summary = summary_record(rep, written, int((positions >= 0).sum()))  # before anything is written: it can fail
    _remove_earlier_keys(adata, written)
    for key, values in obs.items():
        adata.obs[key] = values
    for key, values in var.items():
        adata.var[key] = values
    adata.obsm[CONSENSUS_KEY] = _take(consensus, positions).astype(np.float32)
    adata.uns[UNS_KEY] = summary
    return written
