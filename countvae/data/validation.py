"""Checks that a matrix holds raw counts, with errors that say how to fix it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from countvae.errors import InvalidDataError

#: Rows read at a time when a matrix is checked chunk by chunk (backed or dense data).
_CHUNK_ROWS = 4096
#: The largest count accepted: 2**24, the last integer up to which float32 (the models' precision) is exact.
MAX_EXACT_COUNT = 2**24


@dataclass(frozen=True)
class CountSummary:
    """Totals gathered while validating a count matrix.

    Attributes
    ----------
    cell_totals
        Total counts of each cell (row sums), float64.
    gene_totals
        Total counts of each gene (column sums), float64.

    """

    cell_totals: np.ndarray
    gene_totals: np.ndarray


def iter_row_chunks(matrix, chunk_rows: int = _CHUNK_ROWS) -> Iterator[tuple[int, object]]:
    """Yield ``(start, block)`` pairs that cover ``matrix`` row-wise.

    Works on numpy arrays, scipy sparse matrices and anndata's backed datasets
    (which read a contiguous row slice from disk).
    """
    n = matrix.shape[0]
    for start in range(0, n, chunk_rows):
        yield start, matrix[start : min(start + chunk_rows, n)]


def column_totals(matrix) -> np.ndarray:
    """Total counts of each gene (column sums, float64), reading backed data chunk by chunk."""
    if sp.issparse(matrix) or isinstance(matrix, np.ndarray):
        return np.asarray(matrix.sum(axis=0), dtype=np.float64).ravel()
    totals = np.zeros(matrix.shape[1], dtype=np.float64)
    for _, block in iter_row_chunks(matrix):
        totals += np.asarray(block.sum(axis=0), dtype=np.float64).ravel()
    return totals


def _values_of(block) -> np.ndarray:
    """The stored values of a block: the non-zeros of a sparse block, all of a dense one."""
    if sp.issparse(block):
        return np.asarray(block.data)
    return np.asarray(block)


def validate_counts(matrix, what: str = "adata.X", allow_empty_genes: bool = False) -> CountSummary:
    """Check that ``matrix`` holds finite, non-negative integer counts.

    Nothing is modified or coerced. Cells and genes whose counts are all zero are
    an error (with their number and a way to filter them), because a cell with no
    counts has no library size and a gene with no counts has no information.

    Parameters
    ----------
    matrix
        Cells x genes: a numpy array, a scipy sparse matrix (CSR, CSC, COO) or a
        backed anndata dataset.
    what
        How to name the matrix in error messages, e.g. ``"adata.layers['counts']"``.
    allow_empty_genes
        Accept genes with no counts. Training data must not have them, but a
        handful of query or held-out cells often leaves some gene at zero, and that
        is valid data for a fitted model.

    Returns
    -------
    CountSummary
        Row and column totals, reused for library sizes and checks downstream.

    Raises
    ------
    InvalidDataError
        If the matrix is empty, is not numeric, holds NaN or infinite values,
        negative or non-integer values or counts above ``2**24`` (exact in float32),
        or has all-zero cells or genes.

    """
    shape = getattr(matrix, "shape", None)
    if shape is None or len(shape) != 2:
        raise InvalidDataError(f"{what} must be a 2-dimensional cells x genes matrix, got {type(matrix).__name__}.")
    n_obs, n_vars = shape
    if n_obs == 0 or n_vars == 0:
        raise InvalidDataError(
            f"{what} is empty ({n_obs} cells x {n_vars} genes); a count VAE needs at least one cell and one gene."
        )
    dtype = np.dtype(getattr(matrix, "dtype", np.float64))
    if not (np.issubdtype(dtype, np.number) or dtype == np.bool_) or np.issubdtype(dtype, np.complexfloating):
        raise InvalidDataError(
            f"{what} has dtype {dtype}; raw counts must be stored as integers or floats. Convert them first "
            "(e.g. adata.X = adata.X.astype(np.int32)) or pass the layer that holds numeric counts with `layer=...`."
        )

    cell_totals = np.zeros(n_obs, dtype=np.float64)
    gene_totals = np.zeros(n_vars, dtype=np.float64)
    bad_nonfinite = bad_negative = bad_fraction = 0
    largest = 0.0
    example = None
    source = matrix.tocsr() if sp.issparse(matrix) and matrix.format != "csr" else matrix
    for start, block in iter_row_chunks(source):
        values = _values_of(block)
        if np.issubdtype(values.dtype, np.floating):
            finite = np.isfinite(values)
            n_nonfinite = int(values.size - np.count_nonzero(finite))
            if n_nonfinite:
                bad_nonfinite += n_nonfinite
                continue
            n_negative = int(np.count_nonzero(values < 0))
            n_fraction = int(np.count_nonzero(values != np.round(values)))
        else:
            n_negative = int(np.count_nonzero(values < 0))
            n_fraction = 0
        if n_negative and example is None:
            example = float(values[values < 0].flat[0])
        if n_fraction and example is None:
            example = float(values[values != np.round(values)].flat[0])
        bad_negative += n_negative
        bad_fraction += n_fraction
        if values.size:
            largest = max(largest, float(values.max()))
        stop = start + block.shape[0]
        cell_totals[start:stop] = np.asarray(block.sum(axis=1), dtype=np.float64).ravel()
        gene_totals += np.asarray(block.sum(axis=0), dtype=np.float64).ravel()

    if bad_nonfinite:
        raise InvalidDataError(
            f"{what} contains {bad_nonfinite} NaN or infinite values. Raw counts must be finite; "
            "check how the matrix was produced (missing values should be 0 counts)."
        )
    if bad_negative or bad_fraction:
        parts = []
        if bad_negative:
            parts.append(f"{bad_negative} negative values")
        if bad_fraction:
            parts.append(f"{bad_fraction} non-integer values")
        raise InvalidDataError(
            f"{what} contains {' and '.join(parts)} (for example {example!r}); countvae models raw "
            "counts. Pass the layer that holds the raw counts with `layer=...` (or `use_raw=True` when "
            "they are in adata.raw), not normalized, log-transformed or scaled values."
        )
    if largest > MAX_EXACT_COUNT:
        raise InvalidDataError(
            f"{what} holds a count of {largest:.0f}, above 2**24 = {MAX_EXACT_COUNT:,}, the largest integer the "
            "models' float32 arithmetic represents exactly; a single cell's raw count of one gene is never this "
            "large. Check how the matrix was produced and pass the raw counts (`layer=...` or `use_raw=True`)."
        )
    n_empty_cells = int(np.count_nonzero(cell_totals == 0))
    if n_empty_cells:
        raise InvalidDataError(
            f"{n_empty_cells} of {n_obs} cells in {what} have zero total counts. Remove them before setup, "
            "e.g. `sc.pp.filter_cells(adata, min_counts=1)`; countvae never drops cells silently."
        )
    n_empty_genes = int(np.count_nonzero(gene_totals == 0))
    if n_empty_genes and not allow_empty_genes:
        raise InvalidDataError(
            f"{n_empty_genes} of {n_vars} genes in {what} have zero total counts. Remove them before setup, "
            "e.g. `sc.pp.filter_genes(adata, min_counts=1)`; countvae never drops genes silently."
        )
    return CountSummary(cell_totals=cell_totals, gene_totals=gene_totals)
