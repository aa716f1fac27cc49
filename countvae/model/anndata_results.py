"""Storing a fitted model's results in the AnnData slots scanpy users look in.

=============================== ============================================== =========================
slot and default key            content                                        shape
=============================== ============================================== =========================
``obsm["X_countvae"]``          posterior means of ``z`` (the embedding for     cells x n_latent
                                ``sc.pp.neighbors(adata, use_rep="X_countvae")``)
``layers["countvae_normalized"]`` expected counts per ``library_size`` (1e4)    cells x genes
                                decoded from the posterior mean (optional)
``varm["countvae_loadings"]``   linear-decoder weights ``W`` (linear decoder    genes x n_latent
                                only)
``uns["countvae"]``             settings, registration, training summary        dict
                                (:func:`training_record`: the kept epoch and
                                its losses), package versions, the keys
                                written, and what the coordinates do and do
                                not mean
=============================== ============================================== =========================

scvi-tools leaves storing to the user (``adata.obsm["X_scVI"] = model.get_latent_representation()``); countvae writes
all slots in one call so that the keys, and the record of what produced them, are always the same.

The embedding is encoded from the model's genes, looked up by name when ``adata`` has others too (the genes before
selecting highly variable ones). The layer and the loadings follow ``adata.var_names``, so every gene of ``adata`` must
then be a gene of the model. A model reading ``adata.raw`` (``setup_anndata(use_raw=True)``) usually has more genes
than ``.X`` (scanpy keeps all genes in ``.raw`` before selecting highly variable genes); the layer and loadings then
hold its values for the genes of ``.X``, looked up by name.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import anndata as ad
import numpy as np
import pandas as pd

from countvae._checks import check_bool, check_number
from countvae._provenance import package_versions
from countvae._warnings import warn_at_caller
from countvae.data.registry import UNS_KEY as REGISTRY_KEY
from countvae.data.registry import get_registry, get_var_names
from countvae.data.validation import check_unique_names
from countvae.errors import CountVAEWarning, InvalidArgumentError, InvalidDataError, OutputExistsError
from countvae.model.query import resolve_registry

if TYPE_CHECKING:
    from countvae.model.countvae import CountVAE

#: Default keys (documented in the module docstring and docs/scanpy.md).
LATENT_KEY = "X_countvae"
LAYER_KEY = "countvae_normalized"
LOADINGS_KEY = "countvae_loadings"
UNS_KEY = "countvae"

_COORDINATES_NOTE = (
    "The latent coordinates (obsm columns, loading columns) are determined only up to a rotation of the latent "
    "space: read distances, neighbourhoods, the span of the loadings and W W^T, not single dimensions. "
    "countvae.diagnostics measures which outputs survive a re-run."
)


def _check_key(name: str, key: Any) -> str | None:
    """``key`` if it is a non-empty string, ``None`` if it is ``None`` (nothing written); else an error."""
    if key is None:
        return None
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError(f"{name} must be a non-empty string or None, got {key!r}.")
    return key


def _gene_positions(model: CountVAE, adata: ad.AnnData) -> np.ndarray | None:
    """Positions of ``adata.var_names`` among the model's genes (``None`` when they are the same, in order).

    For a model reading ``adata.raw``, the names of ``.X`` may repeat while those of ``.raw``, which the model reads
    (and ``setup_anndata`` checked), do not.
    """
    names = pd.Index(adata.var_names)
    if len(names) == len(model.var_names) and bool((names == model.var_names).all()):
        return None
    positions = model.var_names.get_indexer(names)
    if (positions < 0).any():
        missing = list(names[positions < 0][:5])
        raise InvalidDataError(
            f"{int((positions < 0).sum())} genes of adata.var_names are not genes of the model (e.g. {missing}), so "
            "a layer or varm entry cannot be filled for them. Pass layer=None and loadings_key=None to store the "
            "embedding (encoded from the model's genes) and the record only, or write every slot into a copy of the "
            "model's genes: sub = adata[:, model.var_names].copy(); model.write_results(sub)."
        )
    check_unique_names(
        names,
        "var",
        "the layer and loadings are filled by gene name: every gene of such a name would get one gene's values",
    )
    return positions


def _with_model_genes(model: CountVAE, adata: ad.AnnData) -> ad.AnnData:
    """``adata``, or its view on the model's genes in the model's order when it holds them among others.

    The encoder reads only the model's genes (their counts and their total), so the view gives the embedding that
    ``get_latent_representation(adata[:, model.var_names])`` gives. scvi-tools refuses other genes here; countvae takes
    the subset that its own refusal advises so that ``obsm`` lands in the AnnData the analyst has (the HVG subset is
    usually a copy). Genes missing or repeated, and a model reading ``adata.raw``, are left to the encoder's checks.
    """
    registry = resolve_registry(adata, model.registry)
    names = get_var_names(adata, registry)
    if registry.use_raw or not names.is_unique or not model.var_names.isin(names).all():
        return adata
    if len(names) == len(model.var_names) and bool((names == model.var_names).all()):
        return adata
    return adata[:, model.var_names]


def training_record(model: CountVAE) -> dict[str, Any]:
    """How the model's training ended, and its losses (negative ELBO per cell; lower is better), for a stored record.

    ``epochs_trained``, ``max_epochs``, ``stopped_early``, ``kept_epoch`` and ``early_stopping`` are
    ``model.training_summary``'s. ``loss_train_kept_epoch`` and ``loss_validation_kept_epoch`` are the losses at
    ``kept_epoch``, whose parameters the model holds and its results come from (with early stopping, not the last
    epoch's); ``loss_train_min`` and ``loss_validation_min`` the lowest of any epoch. What was not recorded (the facts
    of a call ended by an error, a model saved before they were kept) or not computed (a validation loss at an epoch
    without a validation pass) is left out: h5ad stores no ``None``.
    """
    history = model.history
    record: dict[str, Any] = {k: v for k, v in model.training_summary.items() if v is not None}
    record.setdefault("epochs_trained", int(history["epoch"].max()) if len(history) else 0)
    kept = history[history["epoch"] == record.get("kept_epoch", -1)]
    for column in ("loss_train", "loss_validation"):
        at_kept = kept[column].astype(float).to_numpy()
        if at_kept.size and math.isfinite(at_kept[0]):
            record[f"{column}_kept_epoch"] = float(at_kept[0])
        values = history[column].astype(float).to_numpy()
        if np.isfinite(values).any():
            record[f"{column}_min"] = float(values[np.isfinite(values)].min())
    return record


def _uns_record(model: CountVAE, written: dict[str, str], library_size: float | None) -> dict[str, Any]:
    """A record h5ad can store: no ``None`` values (an unset registry field is written as ``""``).

    Gene programs are stored as ``{"0": {"name": ..., "genes": [...]}, ...}``: h5ad reads a "/" in a key as a path, so
    a program named ``"T/NK"`` kept as a key came back nested, or was lost beside ``"T"``.
    """
    registry = {k: ("" if v is None else v) for k, v in model.registry.to_dict().items()}
    settings = model.settings.to_dict()
    if settings.get("gene_programs"):
        programs = settings["gene_programs"].items()
        settings["gene_programs"] = {str(i): {"name": n, "genes": list(g)} for i, (n, g) in enumerate(programs)}
    record = {
        "settings": settings,
        "registry": registry,
        "training": training_record(model),
        "versions": package_versions(),
        "keys": dict(written),
        "note": _COORDINATES_NOTE,
    }
    if library_size is not None:
        record["library_size"] = float(library_size)
    return record


def write_results(
    model: CountVAE,
    adata: ad.AnnData | None = None,
    *,
    latent_key: str | None = LATENT_KEY,
    layer: str | None = LAYER_KEY,
    loadings_key: str | None = LOADINGS_KEY,
    uns_key: str | None = UNS_KEY,
    library_size: float = 1e4,
    overwrite: bool = False,
) -> dict[str, str]:
    """Write the model's results into ``adata`` (in place) under scanpy-style keys.

    Parameters
    ----------
    model
        A trained :class:`countvae.CountVAE` (``self`` of :meth:`countvae.CountVAE.write_results`).
    adata
        The AnnData to write into (default: the training AnnData), registered or not. Cells are encoded from the
        model's genes; other genes rule out the layer and loadings (and, for a ``.raw`` model, other ``.raw`` genes).
    latent_key
        ``obsm`` key for the posterior means of ``z``; ``None`` skips it.
    layer
        ``layers`` key for the normalized expression at ``library_size``, a dense float32 cells x genes array (pass
        ``None`` for data too large for it).
    loadings_key
        ``varm`` key for the linear decoder's weights (an MLP decoder has none to write); ``None`` skips it.
    uns_key
        ``uns`` key for the record of settings, training summary, versions and the keys written; ``None`` skips it.
    library_size
        Library size of the normalized expression (default: counts per 10,000; scvi-tools' 1 gives proportions).
    overwrite
        Replace existing keys; otherwise an existing key is an error and nothing is written.

    Returns
    -------
    dict
        The slots written and their keys, e.g. ``{"obsm": "X_countvae", "layers": "countvae_normalized",
        "varm": "countvae_loadings", "uns": "countvae"}``.

    Raises
    ------
    OutputExistsError
        If a key exists and ``overwrite`` is False.
    InvalidArgumentError
        If ``adata`` is a view (anndata would write into a copy of it, and the results would be lost), or
        ``layer`` or ``uns_key`` names the raw counts the model reads or the registration of ``adata``.
    InvalidDataError
        If a layer or loadings are requested and ``adata`` has genes the model lacks, or gene names that repeat.

    Warns
    -----
    CountVAEWarning
        When the record at ``uns_key`` is replaced and entries it listed are left in place (a layer written before,
        skipped now with ``layer=None``): they came from the earlier call and no longer match the record.

    Examples
    --------
    >>> import countvae as cv
    >>> adata = cv.data.simulate(n_cells=300, n_genes=40, n_latent=2, seed=0)
    >>> cv.CountVAE.setup_anndata(adata)
    >>> model = cv.CountVAE(adata, n_latent=2, decoder="linear").train(max_epochs=3, progress_bar=False)
    >>> model.write_results()
    {'obsm': 'X_countvae', 'layers': 'countvae_normalized', 'varm': 'countvae_loadings', 'uns': 'countvae'}
    >>> adata.obsm["X_countvae"].shape, adata.varm["countvae_loadings"].shape
    ((300, 2), (40, 2))

    """
    model.require_trained()
    check_bool("overwrite", overwrite)
    adata, latent_key, layer, loadings_key, uns_key = _checked_arguments(
        model, adata, latent_key, layer, loadings_key, uns_key, library_size
    )
    targets = {
        "obsm": (latent_key, adata.obsm),
        "layers": (layer, adata.layers),
        "varm": (loadings_key, adata.varm),
        "uns": (uns_key, adata.uns),
    }
    taken = [f"{slot}[{key!r}]" for slot, (key, store) in targets.items() if key is not None and key in store]
    if taken and not overwrite:
        raise OutputExistsError(
            f"adata already has {', '.join(taken)}; pass overwrite=True to replace them, or choose other keys."
        )
    values = _result_values(model, adata, latent_key, layer, loadings_key, library_size)
    written = {slot: targets[slot][0] for slot in ("obsm", "layers", "varm", "uns") if targets[slot][0] is not None}
    if uns_key is not None:
        values["uns"] = _uns_record(model, written, library_size if layer is not None else None)
        left = _left_from_earlier_record(adata, uns_key, written)
    for slot, value in values.items():
        key, store = targets[slot]
        store[key] = value
    if uns_key is not None and left:
        warn_at_caller(
            f"{', '.join(left)} were written by an earlier write_results (another model, or other settings) and are "
            f"not replaced by this call, whose record adata.uns[{uns_key!r}] now replaces theirs: they no longer "
            "match it. Delete them (del adata.layers[...], ...) or write them again with this model.",
            CountVAEWarning,
        )
    return written


def _left_from_earlier_record(adata: ad.AnnData, uns_key: str, written: dict[str, str]) -> list[str]:
    """Entries that the record about to be replaced lists and this call leaves in place (``"layers['key']"``)."""
    earlier = adata.uns.get(uns_key)
    keys = earlier.get("keys") if isinstance(earlier, dict) else None
    if not isinstance(keys, dict):
        return []
    stores = {"obsm": adata.obsm, "layers": adata.layers, "varm": adata.varm}
    return [
        f"adata.{slot}[{key!r}]"
        for slot, key in keys.items()
        if slot in stores and written.get(slot) != key and key in stores[slot]
    ]


def _checked_arguments(
    model: CountVAE,
    adata: ad.AnnData | None,
    latent_key: Any,
    layer: Any,
    loadings_key: Any,
    uns_key: Any,
    library_size: float,
) -> tuple[ad.AnnData, str | None, str | None, str | None, str | None]:
    """The AnnData to write into and the keys to write, after checking the arguments."""
    if adata is None:
        adata = model.adata
        if adata is None:
            raise InvalidArgumentError("This model was loaded without data; pass the AnnData to write into.")
    if not isinstance(adata, ad.AnnData):
        raise InvalidArgumentError(f"adata must be an AnnData, got {type(adata).__name__}.")
    if adata.is_view:
        raise InvalidArgumentError(
            "adata is a view (a subset such as adata[cells] not copied); results written into it would go to a copy "
            "that anndata makes, not to the AnnData it was taken from. Pass an AnnData of its own: "
            "sub = adata[cells].copy() (.to_memory() for a backed file), then model.write_results(sub)."
        )
    latent_key = _check_key("latent_key", latent_key)
    layer = _check_key("layer", layer)
    loadings_key = _check_key("loadings_key", loadings_key)
    uns_key = _check_key("uns_key", uns_key)
    check_number("library_size", library_size, 0.0, low_open=True)
    _refuse_registered_slots(model, adata, layer, uns_key)
    if model.settings.decoder != "linear":
        loadings_key = None  # documented: an MLP decoder has no loadings to store
    return adata, latent_key, layer, loadings_key, uns_key


def _refuse_registered_slots(model: CountVAE, adata: ad.AnnData, layer: str | None, uns_key: str | None) -> None:
    """Refuse keys that would replace the counts the model reads, or the registration that says where they are."""
    read_from = get_registry(adata) or model.registry  # as the model reads adata (countvae.model.query)
    if layer is not None and layer == read_from.layer:
        raise InvalidArgumentError(
            f"layer={layer!r} is the layer of raw counts the model reads; writing the normalized expression there "
            "would replace them. Choose another key, e.g. the default layer='countvae_normalized'."
        )
    if uns_key == REGISTRY_KEY:
        raise InvalidArgumentError(
            f"uns_key={uns_key!r} is where setup_anndata keeps the registration; choose another key, e.g. the "
            "default uns_key='countvae'."
        )


def _result_values(
    model: CountVAE,
    adata: ad.AnnData,
    latent_key: str | None,
    layer: str | None,
    loadings_key: str | None,
    library_size: float,
) -> dict[str, Any]:
    """The embedding, normalized expression and loadings to write, by slot, for the keys that are not ``None``."""
    positions = _gene_positions(model, adata) if layer is not None or loadings_key is not None else None

    values: dict[str, Any] = {}
    if latent_key is not None:
        values["obsm"] = model.get_latent_representation(_with_model_genes(model, adata))
    if layer is not None:
        expression = model.get_normalized_expression(adata, library_size=library_size, return_numpy=True)
        expression = expression if positions is None else expression[:, positions]
        values["layers"] = np.ascontiguousarray(expression, dtype=np.float32)
    if loadings_key is not None:
        weights = model.get_loadings().to_numpy()
        values["varm"] = weights if positions is None else weights[positions]
    return values
