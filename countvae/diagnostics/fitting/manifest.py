"""The record of a multi-seed run: settings, a checksum of the data, and the check that a rerun matches it.

``out_dir/manifest.json``, written once before the first fit, names what determines the fits' numbers. A rerun on
the same ``out_dir`` computes the record again and compares it field by field, so completed seeds are reused only
when they are exactly what this run would produce.
"""

from __future__ import annotations

import json
from typing import Any

import anndata as ad

from countvae._formatting import json_ready
from countvae._provenance import counts_sha256, json_sha256, names_sha256
from countvae.data.registry import Registry, batch_codes, get_count_matrix, get_var_names
from countvae.errors import InvalidArgumentError

MANIFEST_FORMAT = "countvae-seedfits"
MANIFEST_VERSION = 1

#: Training options that change what is shown, not the numbers; a rerun may change them freely.
COSMETIC_TRAIN_KWARGS = frozenset({"progress_bar", "enable_progress_bar"})
#: Genes a mismatch of the gene selection names at most on each side (the lists hold thousands).
SHOWN_GENES = 5


def to_json_value(value: Any, where: str) -> Any:
    """A JSON-ready copy of ``value`` (torch dtypes and numpy scalars become plain values).

    Raises
    ------
    InvalidArgumentError
        If ``value`` holds something JSON cannot record (the manifest must say exactly which settings made the fits).

    """
    try:
        return json_ready(value, strict=True)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"{where} holds a value that cannot be recorded in manifest.json ({exc}); use numbers, strings, "
            "booleans, lists and dicts so the run can be reproduced from its record."
        ) from None


def data_fingerprint(adata: ad.AnnData, registry: Registry) -> dict[str, Any]:
    """SHA-256 checksums of the registered counts, genes, cells and batches.

    The counts are hashed as canonical CSR (values as float64, column indices and per-row non-zero counts as int64),
    in blocks of rows, so the checksum ignores what the fits ignore: the storage format (dense, CSR, CSC), the integer
    or float type of equal values, explicitly stored zeros. Gene and cell names and each cell's batch are hashed
    separately so a mismatch can be named.

    Returns
    -------
    dict
        ``sha256`` (over all parts), ``counts_sha256``, ``genes_sha256``,
        ``cells_sha256``, ``batches_sha256``, ``n_cells``, ``n_genes``.

    """
    genes = get_var_names(adata, registry)
    parts = {
        "counts_sha256": counts_sha256(get_count_matrix(adata, registry)),
        "genes_sha256": names_sha256(genes),
        "cells_sha256": names_sha256(adata.obs_names),
        "batches_sha256": json_sha256(
            {"categories": registry.batch_categories, "codes": batch_codes(adata, registry).tolist()}
        ),
    }
    return {"sha256": json_sha256(parts), **parts, "n_cells": int(adata.n_obs), "n_genes": len(genes)}


def describe_mismatch(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Human-readable lines naming every setting that differs between two manifests' settings."""
    lines = []
    data_old, data_new = recorded.get("data", {}), current.get("data", {})
    if data_old.get("sha256") != data_new.get("sha256"):
        what = {
            "genes_sha256": "genes (var_names or their order)",
            "cells_sha256": "cells (obs_names or their order)",
            "counts_sha256": "count values",
            "batches_sha256": "batch assignments",
        }
        differing = [label for key, label in what.items() if data_old.get(key) != data_new.get(key)]
        lines.append(
            f"data: the fits were made on other data ({data_old.get('n_cells')} cells x {data_old.get('n_genes')} "
            f"genes; this AnnData has {data_new.get('n_cells')} x {data_new.get('n_genes')}); differing: "
            f"{', '.join(differing) or 'checksum'}"
        )
    for key in sorted((set(recorded) | set(current)) - {"data"}):
        old, new = recorded.get(key), current.get(key)
        if key == "gene_selection" and old != new:
            lines.append(_gene_selection_mismatch(old, new))
        elif old != new:
            lines.append(f"{key}: recorded {json.dumps(old, sort_keys=True)}, now {json.dumps(new, sort_keys=True)}")
    return lines


def _gene_selection_mismatch(old: dict[str, Any] | None, new: dict[str, Any] | None) -> str:
    """Two gene selections' difference: their settings, and how many chosen genes differ with a few of each.

    Not both lists of chosen genes, which hold thousands of names. ``None``: every gene kept (the data line names the
    difference of the genes then).
    """

    def settings(record: dict[str, Any] | None) -> str:
        shown = "all genes" if record is None else {k: v for k, v in record.items() if k != "genes"}
        return json.dumps(shown, sort_keys=True)

    line = f"gene_selection: recorded {settings(old)}, now {settings(new)}"
    if old is None or new is None:
        return line
    old_genes, new_genes = old.get("genes", []), new.get("genes", [])
    old_set, new_set = set(old_genes), set(new_genes)
    dropped, added = [g for g in old_genes if g not in new_set], [g for g in new_genes if g not in old_set]
    line += (
        f"; {len(dropped):,} of the {len(old_genes):,} genes the fits were made on are not chosen now{_some(dropped)}, "
        f"{len(added):,} of the {len(new_genes):,} chosen now were not{_some(added)}"
    )
    if old.get("n_top_genes") != new.get("n_top_genes"):
        line += f"; n_top_genes={old.get('n_top_genes')} on the same data chooses the recorded genes again"
    return line


def _some(genes: list[str]) -> str:
    """A few of ``genes`` in parentheses (at most :data:`SHOWN_GENES`), or nothing for none."""
    if not genes:
        return ""
    more = f" and {len(genes) - SHOWN_GENES:,} more" if len(genes) > SHOWN_GENES else ""
    return f" ({', '.join(genes[:SHOWN_GENES])}{more})"


def comparable(settings: dict[str, Any]) -> dict[str, Any]:
    """The part of a manifest's settings that must match for completed fits to be reused."""
    train = {k: v for k, v in settings.get("train_kwargs", {}).items() if k not in COSMETIC_TRAIN_KWARGS}
    out = {**settings, "train_kwargs": train}
    if settings.get("model_family") == "countvae" and isinstance(settings.get("registry"), dict):
        # a countvae model never reads the labels (scvi-tools models may): they are for the report only
        out["registry"] = {k: v for k, v in settings["registry"].items() if k != "labels_key"}
    return out
