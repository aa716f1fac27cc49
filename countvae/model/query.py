"""Checking an AnnData passed to a fitted model against the data it was trained on."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp

from countvae._warnings import warn_at_caller
from countvae.data.loader import CountSource
from countvae.data.registry import Registry, batch_codes, get_count_matrix, get_registry, get_var_names
from countvae.data.validation import iter_row_chunks, validate_counts
from countvae.errors import CountVAEWarning, InvalidArgumentError, InvalidDataError, SetupError


@dataclass(frozen=True)
class ModelCells:
    """Cells of an AnnData as a fitted model reads them (see ``CountVAE.cells``).

    Attributes
    ----------
    adata
        The AnnData the cells belong to.
    source
        Counts (in the model's gene order) and batch codes of all its cells.
    indices
        Positions of the selected cells, in the order results are returned.

    """

    adata: ad.AnnData
    source: CountSource
    indices: np.ndarray

    @property
    def obs_names(self) -> pd.Index:
        """Names of the selected cells, in order."""
        return self.adata.obs_names[self.indices]

    def __len__(self) -> int:
        return len(self.indices)


def check_genes(var_names: pd.Index, expected: pd.Index, use_raw: bool = False) -> None:
    """Raise unless ``var_names`` equals the training genes, in the same order.

    ``use_raw``: ``var_names`` are ``adata.raw``'s, which ``adata[:, genes]`` does not subset, so the advice rebuilds
    ``.raw`` instead.

    Raises
    ------
    InvalidDataError
        Naming missing and unexpected genes, or saying how to reorder.

    """
    if len(var_names) == len(expected) and bool((var_names == expected).all()):
        return
    owner, subset = "The AnnData", "`adata[:, model.var_names]`"
    if use_raw:
        owner, subset = "The AnnData's .raw", "`adata.raw = adata.raw.to_adata()[:, model.var_names]`"
    genes = f"{owner}'s" if not use_raw else owner
    if not var_names.is_unique:
        duplicated = list(var_names[var_names.duplicated()].unique()[:5])
        unique = "adata.var_names_make_unique(), then subset with `adata[:, model.var_names]`"
        if use_raw:
            unique = (
                "`raw = adata.raw.to_adata()`, `raw.var_names_make_unique()`, then "
                "`adata.raw = raw[:, model.var_names]`"
            )
        raise InvalidDataError(
            f"{genes} gene names are not unique (for example {duplicated}), so its genes cannot be "
            f"matched to the training genes; call {unique}."
        )
    missing = expected.difference(var_names)
    extra = var_names.difference(expected)
    if len(missing) == 0 and len(extra) == 0:
        reorder = subset if use_raw else "`adata = adata[:, model.var_names].copy()`"
        raise InvalidDataError(f"{owner} has the training genes in a different order; reorder with {reorder}.")
    raise InvalidDataError(
        f"{genes} genes differ from the {len(expected)} genes the model was trained on: "
        f"{len(missing)} missing (e.g. {list(missing[:5])}), {len(extra)} not in training "
        f"(e.g. {list(extra[:5])}). Subset to the training genes with {subset} "
        "when all are present; otherwise the model cannot be applied to these cells."
    )


def cells_fingerprint(obs_names: pd.Index) -> str:
    """SHA-256 of the cells' names in order: recognises the training cells without storing their names."""
    return hashlib.sha256("\n".join(map(str, obs_names)).encode()).hexdigest()


#: Stored values read at a time by :func:`counts_fingerprint`: their float64 copy takes 2 MiB.
_FINGERPRINT_BLOCK = 2**18


def counts_fingerprint(matrix) -> tuple:
    """Shape and SHA-256 of each cell's counts weighted by fixed gene weights: recognise a model's own counts.

    The weights are pseudo-random integers below 2**20 and the counts were checked to be integers, so each cell's
    weighted sum is an exact float64 integer (for cells of fewer than 2**33 counts), whatever the order of summation:
    the fingerprint is the same for the same counts in any dtype or storage (dense, CSR, CSC, explicitly stored zeros).
    A changed value changes its cell's sum, whether or not the total is kept (normalizing with size factors centred at
    1 keeps it), unless other changes in the same cell cancel it: two counts of a cell swapped do so with probability
    2**-20. Cells moved to other rows change the order of the sums.

    The values are left out for a backed matrix, which they would read whole from disk on every call (scanpy's
    functions do not change a backed file in place).
    """
    shape = tuple(matrix.shape)
    if not (sp.issparse(matrix) or isinstance(matrix, np.ndarray)):
        return shape, None
    weights = np.random.default_rng(0).integers(1, 2**20, size=shape[1]).astype(np.float64)
    return shape, hashlib.sha256(_weighted_cell_sums(matrix, weights).tobytes()).hexdigest()


def _weighted_cell_sums(matrix, weights: np.ndarray) -> np.ndarray:
    """``matrix @ weights`` in float64, a block of cells at a time.

    scipy's product of the whole matrix would copy all its stored values to float64 at once when they are not float64.
    """
    if isinstance(matrix, np.ndarray):
        rows = max(1, _FINGERPRINT_BLOCK // matrix.shape[1])
        return np.concatenate([np.asarray(block, np.float64) @ weights for _, block in iter_row_chunks(matrix, rows)])
    if matrix.dtype == np.float64:
        return matrix @ weights
    matrix = matrix.tocsr()  # the matrix itself when CSR; CountSource converts other formats too
    ptr, sums = matrix.indptr, np.zeros(matrix.shape[0])
    ends = np.searchsorted(ptr, np.arange(_FINGERPRINT_BLOCK, ptr[-1], _FINGERPRINT_BLOCK))
    bounds = np.unique(np.r_[0, ends, len(ptr) - 1])  # whole cells, about _FINGERPRINT_BLOCK stored values each
    for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
        part = slice(ptr[start], ptr[stop])
        values = (matrix.data[part].astype(np.float64), matrix.indices[part], ptr[start : stop + 1] - ptr[start])
        sums[start:stop] = sp.csr_matrix(values, shape=(stop - start, matrix.shape[1])) @ weights
    return sums


#: How to restore raw counts in the model's own AnnData, changed in place after the model was built.
OWN_COUNTS_REMEDY = (
    "These are the counts of the model's own AnnData, changed after the model was built (sc.pp.normalize_total and "
    "sc.pp.log1p change adata.X in place). Restore the raw counts and keep them in a layer before normalizing "
    "(adata.layers['counts'] = adata.X.copy()), registered with CountVAE.setup_anndata(adata, layer='counts', ...); "
    "or train a new model on raw counts"
)


def check_own_counts(matrix, built_with: tuple, what: str) -> None:
    """Check the counts of the model's own AnnData in full when they no longer match ``built_with``.

    The whole check (:func:`countvae.data.validate_counts`) runs only when the fingerprint differs, so a model reading
    its unchanged AnnData pays for one weighted sum over the stored values, not for a pass of checks.

    Raises
    ------
    InvalidDataError
        If the changed values are not raw counts, saying how to keep raw counts beside normalized values.

    Warns
    -----
    CountVAEWarning
        If they are still counts, but not those the model was built with: results describe the counts read now.

    """
    now = counts_fingerprint(matrix)
    if now == built_with:
        return
    validate_counts(matrix, what, allow_empty_genes=True, remedy=OWN_COUNTS_REMEDY)
    (n_obs, n_vars), shape = built_with[0], now[0]
    if shape == (n_obs, n_vars):
        change = f"other values in the same {n_obs} cells x {n_vars} genes"
    else:
        change = f"{n_obs} cells x {n_vars} genes then, {shape[0]} x {shape[1]} now"
    warn_at_caller(
        f"The counts in {what} of the model's AnnData changed after the model was built ({change}): results "
        "describe the counts read now, and further training continues on them. If that was not "
        "meant, restore the counts the model was built with, or register the layer that holds them "
        "(CountVAE.setup_anndata(adata, layer=...)).",
        CountVAEWarning,
    )


#: How to pass raw counts instead, for cells given to a trained model (read as the training data was registered
#: unless registered themselves): the methods that take them have no ``layer`` argument.
QUERY_RAW_COUNTS_REMEDY = (
    "Register these cells' raw counts first: CountVAE.setup_anndata(adata, layer=...) for a layer, or use_raw=True "
    "for adata.raw (cells not registered are read as the training data was)"
)


def resolve_registry(adata: ad.AnnData, trained: Registry) -> Registry:
    """The registry to read ``adata`` with: its own if set up, else the model's.

    A query AnnData may be registered separately (the usual scvi-tools habit), but with the same batch key; its batch
    categories are read in the model's category order.
    """
    own = get_registry(adata)
    if own is None:
        lacks_raw = trained.use_raw and adata.raw is None
        if lacks_raw or (trained.layer is not None and trained.layer not in adata.layers):
            raise SetupError(
                f"The model reads its counts from {trained.describe_counts()}, which this AnnData lacks; say where "
                f"its raw counts are with CountVAE.setup_anndata(adata, layer=..., batch_key={trained.batch_key!r})."
            )
        return trained
    if own.batch_key != trained.batch_key:
        raise SetupError(
            f"This AnnData was set up with batch_key={own.batch_key!r} but the model was trained with "
            f"batch_key={trained.batch_key!r}; register it with batch_key={trained.batch_key!r} as the model was "
            "(CountVAE.setup_anndata)."
        )
    return replace(own, batch_categories=trained.batch_categories)


def cell_positions(indices: object, n_obs: int) -> np.ndarray:
    """``indices`` as int64 positions of cells, checked to be integers in ``[0, n_obs)``.

    Raises
    ------
    InvalidArgumentError
        If ``indices`` is a boolean mask, empty, not a 1-d sequence of integers, or holds a position outside the cells.

    """
    arr = np.asarray(indices)
    if arr.dtype == bool:
        raise InvalidArgumentError(
            "indices is a boolean mask; pass the positions of the cells instead, e.g. indices=np.flatnonzero(mask)."
        )
    if arr.ndim != 1:
        raise InvalidArgumentError(f"indices must be a 1-d sequence of cell positions, got shape {arr.shape}.")
    if arr.size == 0:
        raise InvalidArgumentError("indices selects no cells; pass the positions of at least one cell.")
    if not np.issubdtype(arr.dtype, np.integer):
        raise InvalidArgumentError(
            f"indices must be integer positions of cells, got dtype {arr.dtype}; for cell names pass "
            "adata.obs_names.get_indexer(names)."
        )
    if arr.min() < 0 or arr.max() >= n_obs:
        raise InvalidArgumentError(f"indices must lie in [0, {n_obs}).")
    return arr.astype(np.int64)


def query_source(
    adata: ad.AnnData,
    trained: Registry,
    var_names: pd.Index,
    indices: np.ndarray | None = None,
    validate: bool = True,
    built_with: tuple | None = None,
) -> tuple[CountSource, np.ndarray]:
    """A :class:`CountSource` over ``adata`` checked against the training data.

    Parameters
    ----------
    adata
        Cells to evaluate.
    trained
        Registry of the training data.
    var_names
        Training genes in order.
    indices
        Subset of cells (positions); all cells when ``None``.
    validate
        Check the counts (what ``built_with`` does instead, for the model's own AnnData).
    built_with
        For the model's own AnnData: the :func:`counts_fingerprint` of the counts it was built with, checked in full
        only when they no longer match it (:func:`check_own_counts`).

    Returns
    -------
    source, indices
        The source and the positions of the cells to evaluate.

    """
    if not isinstance(adata, ad.AnnData):
        raise InvalidArgumentError(f"Expected an AnnData, got {type(adata).__name__}.")
    registry = resolve_registry(adata, trained)
    check_genes(get_var_names(adata, registry), var_names, registry.use_raw)
    matrix = get_count_matrix(adata, registry)
    indices = np.arange(adata.n_obs) if indices is None else cell_positions(indices, adata.n_obs)
    source = CountSource(matrix, batch_codes(adata, registry))
    if built_with is not None:
        check_own_counts(source.matrix, built_with, registry.describe_counts())  # CSR when stored as CSC or COO
    elif validate:
        # Genes without counts among the query cells are valid data for a fitted model; a subset
        # of a backed matrix is read in contiguous runs rather than by fancy indexing.
        subset = matrix if len(indices) == adata.n_obs else source.read_rows(np.unique(indices))
        validate_counts(subset, registry.describe_counts(), allow_empty_genes=True, remedy=QUERY_RAW_COUNTS_REMEDY)
    return source, indices
