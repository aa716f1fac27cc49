"""Registration of an AnnData: where the counts are and which obs columns are covariates.

scvi-tools registers fields through ``AnnDataManager`` and writes helper columns into ``adata.obs``. countvae keeps
one small JSON-serialisable record in ``adata.uns["_countvae"]`` instead: it needs three fields, importing scvi-tools
costs several seconds, and the record travels with the AnnData written to h5ad. The behaviour users rely on (register
once, then pass the AnnData to the model) is the same.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import anndata as ad
import numpy as np
import pandas as pd

from countvae._checks import check_bool
from countvae.data.backed import backed_view_counts
from countvae.data.loader import refuse_backed_csc
from countvae.data.validation import CountSummary, validate_counts
from countvae.errors import InvalidDataError, SetupError

UNS_KEY = "_countvae"


@dataclass
class Registry:
    """Where an AnnData keeps its counts and covariates.

    Attributes
    ----------
    layer
        Layer holding raw counts, or ``None`` for ``adata.X``.
    use_raw
        Read the counts from ``adata.raw.X`` (genes are then ``adata.raw.var_names``).
    batch_key
        Column of ``adata.obs`` with the batch of each cell, or ``None``.
    batch_categories
        Batch categories in the order of the model's one-hot encoding.
    labels_key
        Column of ``adata.obs`` with cell labels (used by diagnostics only).
    labels_categories
        Label categories, in order.

    """

    layer: str | None = None
    use_raw: bool = False
    batch_key: str | None = None
    batch_categories: list[str] = field(default_factory=list)
    labels_key: str | None = None
    labels_categories: list[str] = field(default_factory=list)

    @property
    def n_batches(self) -> int:
        """Number of batch categories (0 when no batch key is registered)."""
        return len(self.batch_categories)

    def to_dict(self) -> dict:
        """A JSON-serialisable copy."""
        return asdict(self)

    @classmethod
    def from_dict(cls, record: dict) -> Registry:
        """Rebuild a registry from :meth:`to_dict` output (or ``adata.uns`` after h5ad I/O)."""
        return cls(
            layer=_none_if_empty(record.get("layer")),
            use_raw=bool(record.get("use_raw", False)),
            batch_key=_none_if_empty(record.get("batch_key")),
            batch_categories=[str(c) for c in record.get("batch_categories", [])],
            labels_key=_none_if_empty(record.get("labels_key")),
            labels_categories=[str(c) for c in record.get("labels_categories", [])],
        )

    def describe_counts(self) -> str:
        """How to name the count matrix in messages."""
        if self.use_raw:
            return "adata.raw.X"
        return "adata.X" if self.layer is None else f"adata.layers[{self.layer!r}]"


def _none_if_empty(value):
    # h5ad cannot store None in uns; countvae writes "" for "not set".
    if value is None or (isinstance(value, str) and value == ""):
        return None
    return str(value)


def _categories_of(adata: ad.AnnData, key: str, role: str) -> list[str]:
    """Categories of an obs column, refusing missing values."""
    if key not in adata.obs.columns:
        raise SetupError(
            f"{role}_key={key!r} is not a column of adata.obs; pass one of the available columns "
            f"{list(adata.obs.columns)}, or add the column first."
        )
    column = adata.obs[key]
    n_missing = int(column.isna().sum())
    if n_missing:
        raise InvalidDataError(
            f"adata.obs[{key!r}] has {n_missing} missing values; give every cell a {role} "
            "(for example a category 'unknown') before setup."
        )
    if isinstance(column.dtype, pd.CategoricalDtype):
        present = set(column.astype(str))
        return [str(c) for c in column.cat.categories if str(c) in present]
    # As scvi-tools: the order of pandas' categorical of the column, so numbers sort as numbers (9 before 10),
    # then as text, since the registry keys categories by their text.
    return list(dict.fromkeys(str(c) for c in pd.Categorical(column).categories))


def _raw(adata: ad.AnnData) -> ad.Raw:
    """``adata.raw``, refused when it is not set."""
    if adata.raw is None:
        raise SetupError("use_raw=True but adata.raw is None; pass layer=... or set adata.raw.")
    return adata.raw


def get_count_matrix(adata: ad.AnnData, registry: Registry):
    """The registered count matrix (not copied)."""
    if registry.use_raw:
        return _raw(adata).X
    if registry.layer is None:
        if adata.isbacked and adata.is_view:
            rows = backed_view_counts(adata)  # a subset of a file larger than memory stays on disk
            if rows is not None:
                return rows
        if adata.X is None:
            raise SetupError("adata.X is None; pass the layer that holds raw counts with layer=...")
        return adata.X
    if registry.layer not in adata.layers:
        raise SetupError(
            f"layer {registry.layer!r} is not in adata.layers; pass one of the available layers "
            f"{list(adata.layers.keys())}, or layer=None for adata.X."
        )
    return adata.layers[registry.layer]


def get_var_names(adata: ad.AnnData, registry: Registry) -> pd.Index:
    """Gene names of the registered count matrix."""
    return _raw(adata).var_names if registry.use_raw else adata.var_names


def setup_anndata(
    adata: ad.AnnData,
    layer: str | None = None,
    batch_key: str | None = None,
    labels_key: str | None = None,
    *,
    use_raw: bool = False,
) -> CountSummary:
    """Register where ``adata`` keeps raw counts and covariates, after checking them.

    Parameters
    ----------
    adata
        Cells x genes AnnData with raw counts.
    layer
        Layer with raw counts; ``None`` uses ``adata.X``.
    batch_key
        Column of ``adata.obs`` with batches (no missing values). The one-hot order is a categorical column's
        order of categories, else the values sorted as pandas sorts them (numbers as numbers), as scvi-tools.
    labels_key
        Column of ``adata.obs`` with cell labels, used by diagnostics and tutorials.
    use_raw
        Read counts from ``adata.raw`` instead (scanpy's place for unprocessed data).

    Returns
    -------
    CountSummary
        Cell and gene totals computed during validation.

    Raises
    ------
    SetupError
        If a layer or key does not exist or is not a string, or ``adata`` is a view of a backed AnnData
        (register the backed AnnData before subsetting it).
    InvalidArgumentError
        If ``use_raw`` is not a bool.
    InvalidDataError
        If the counts are not finite non-negative integers, or cells/genes are all zero.

    """
    if not isinstance(adata, ad.AnnData):
        raise SetupError(f"setup_anndata expects an AnnData, got {type(adata).__name__}.")
    _check_setup_arguments(adata, layer, batch_key, labels_key, use_raw)
    registry = Registry(layer=layer, use_raw=use_raw)
    matrix = get_count_matrix(adata, registry)
    refuse_backed_csc(matrix)  # now, not after a pass over the whole file
    var_names = get_var_names(adata, registry)
    if not var_names.is_unique:
        duplicated = list(var_names[var_names.duplicated()].unique()[:5])
        raise InvalidDataError(
            f"Gene names are not unique (for example {duplicated}); call adata.var_names_make_unique() "
            "so genes can be matched between data sets."
        )
    summary = validate_counts(matrix, what=registry.describe_counts())
    if batch_key is not None:
        registry.batch_key = batch_key
        registry.batch_categories = _categories_of(adata, batch_key, "batch")
    if labels_key is not None:
        registry.labels_key = labels_key
        registry.labels_categories = _categories_of(adata, labels_key, "labels")
    adata.uns[UNS_KEY] = _to_uns(registry)
    return summary


def _check_setup_arguments(
    adata: ad.AnnData, layer: object, batch_key: object, labels_key: object, use_raw: object
) -> None:
    """Refuse keys that are not names, a ``use_raw`` that is not a bool, and a view of a backed AnnData."""
    for name, key in (("layer", layer), ("batch_key", batch_key), ("labels_key", labels_key)):
        if key is not None and not isinstance(key, str):
            raise SetupError(f"{name} must be a name (a string) or None, got {key!r}.")
    check_bool("use_raw", use_raw)
    if use_raw and layer is not None:
        raise SetupError("Pass either layer=... or use_raw=True, not both.")
    if adata.isbacked and adata.is_view:
        raise SetupError(
            "adata is a view of a backed AnnData, and anndata cannot store the registration in it. Call "
            "setup_anndata on the backed AnnData before taking the subset (its views keep the registration), or "
            "load the subset into memory with adata[cells].to_memory()."
        )


def _to_uns(registry: Registry) -> dict:
    return {k: ("" if v is None else v) for k, v in registry.to_dict().items()}


def attach_registry(adata: ad.AnnData, registry: Registry) -> None:
    """Register ``adata`` as ``registry`` says without checking its counts again.

    Only for data already checked under this registration, e.g. a file reopened in another process
    (:class:`countvae.data.file_cells.FileCells`); anything else goes through :func:`setup_anndata`.
    """
    adata.uns[UNS_KEY] = _to_uns(registry)


def get_registry(adata: ad.AnnData) -> Registry | None:
    """The registration stored on ``adata``, or ``None`` when it was never set up."""
    record = adata.uns.get(UNS_KEY)
    return None if record is None else Registry.from_dict(dict(record))


def batch_codes(adata: ad.AnnData, registry: Registry) -> np.ndarray:
    """Integer batch index of every cell under the registry's categories.

    Raises
    ------
    InvalidDataError
        If a cell has a batch category that the registry (the training data) does not know.

    """
    if registry.batch_key is None:
        return np.zeros(adata.n_obs, dtype=np.int64)
    if registry.batch_key not in adata.obs.columns:
        raise SetupError(
            f"The model was trained with batch_key {registry.batch_key!r}, which is not a column of this AnnData's obs."
        )
    column = adata.obs[registry.batch_key]
    if int(column.isna().sum()):
        raise InvalidDataError(f"adata.obs[{registry.batch_key!r}] has missing values.")
    values = column.astype(str).to_numpy()
    lookup = {c: i for i, c in enumerate(registry.batch_categories)}
    unseen = sorted(set(values) - set(lookup))
    if unseen:
        raise InvalidDataError(
            f"Batch categories {unseen[:10]} in adata.obs[{registry.batch_key!r}] were not seen in training "
            f"(known: {registry.batch_categories}). A batch effect cannot be applied to an unseen batch; "
            "map those cells to a known batch or retrain with them."
        )
    return np.fromiter((lookup[v] for v in values), dtype=np.int64, count=len(values))
