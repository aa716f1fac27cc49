"""Checks that a matrix holds raw counts and that names match cells and genes, with errors that say how to fix it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
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


def check_unique_names(names: pd.Index, axis: Literal["obs", "var"], reason: str, after: str = "") -> None:
    """Refuse repeated ``names`` of cells (``axis="obs"``) or genes (``"var"``) where results are written by name.

    ``reason`` says what is matched by these names (it follows "and "); ``after`` is added to the remedy
    (``adata.obs_names_make_unique()`` or ``adata.var_names_make_unique()``).

    Raises
    ------
    InvalidDataError
        Naming how many names repeat and some of them.

    """
    if names.is_unique:
        return
    repeated = names[names.duplicated()].unique()
    raise InvalidDataError(
        f"The {'cells' if axis == 'obs' else 'genes'}' names repeat ({len(repeated)} names, e.g. "
        f"{list(repeated[:3])}), and {reason}; make them unique first (adata.{axis}_names_make_unique(){after})."
    )


def iter_row_chunks(matrix, chunk_rows: int = _CHUNK_ROWS) -> Iterator[tuple[int, object]]:
    """Yield ``(start, block)`` pairs that cover ``matrix`` row-wise.

    Works on numpy arrays, scipy sparse matrices and anndata's backed datasets (which read a contiguous row slice).
    """
    n = matrix.shape[0]
    for start in range(0, n, chunk_rows):
        yield start, matrix[start : min(start + chunk_rows, n)]


def _sums(block, axis: int) -> np.ndarray:
    """Row (``axis=1``) or column (``axis=0``) sums, accumulated in float64: float16 totals overflow at 65,504."""
    return np.asarray(block.sum(axis=axis, dtype=np.float64)).ravel()


def column_totals(matrix) -> np.ndarray:
    """Total counts of each gene (column sums, float64), reading backed data chunk by chunk."""
    return count_totals(matrix).gene_totals


def count_totals(matrix) -> CountSummary:
    """Total counts of each cell and of each gene (float64), in one pass, reading backed data chunk by chunk."""
    if sp.issparse(matrix) or isinstance(matrix, np.ndarray):
        return CountSummary(cell_totals=_sums(matrix, 1), gene_totals=_sums(matrix, 0))
    summary = CountSummary(np.zeros(matrix.shape[0], dtype=np.float64), np.zeros(matrix.shape[1], dtype=np.float64))
    for start, block in iter_row_chunks(matrix):
        summary.cell_totals[start : start + block.shape[0]] = _sums(block, 1)
        summary.gene_totals[...] += _sums(block, 0)
    return summary


#: How to pass raw counts instead, where the data are being registered (``setup_anndata``'s arguments).
RAW_COUNTS_REMEDY = (
    "Pass the layer that holds the raw counts with `layer=...` (or `use_raw=True` when they are in adata.raw)"
)


def validate_counts(
    matrix, what: str = "adata.X", allow_empty_genes: bool = False, remedy: str = RAW_COUNTS_REMEDY
) -> CountSummary:
    """Check that ``matrix`` holds finite, non-negative integer counts.

    Nothing is modified or coerced. All-zero cells and genes are an error (with their number and a way to filter
    them): a cell with no counts has no library size and a gene with no counts has no information.

    Parameters
    ----------
    matrix
        Cells x genes: a numpy array, a scipy sparse matrix (CSR, CSC, COO) or a backed anndata dataset.
    what
        How to name the matrix in error messages, e.g. ``"adata.layers['counts']"``.
    allow_empty_genes
        Accept genes with no counts. Training data must not have them, but a handful of query or held-out cells
        often leaves some gene at zero, which is valid data for a fitted model.
    remedy
        How to pass raw counts instead, for the errors about values that are not raw counts (the default names
        ``setup_anndata``'s arguments, as registration is where the counts are chosen).

    Returns
    -------
    CountSummary
        Row and column totals, reused for library sizes and checks downstream.

    Raises
    ------
    InvalidDataError
        If the matrix is empty, is not numeric, holds NaN or infinite values, negative or non-integer values or
        counts above ``2**24`` (exact in float32), or has all-zero cells or genes.

    """
    scan = checked_count_totals(matrix, what, remedy)
    n_obs, n_vars = len(scan.cell_totals), len(scan.gene_totals)
    n_empty_cells = int(np.count_nonzero(scan.cell_totals == 0))
    if n_empty_cells:
        raise InvalidDataError(
            f"{n_empty_cells} of {n_obs} cells in {what} have zero total counts. Remove them "
            "before passing the data to countvae, e.g. `sc.pp.filter_cells(adata, min_counts=1)`; countvae never "
            "drops cells silently."
        )
    n_empty_genes = int(np.count_nonzero(scan.gene_totals == 0))
    if n_empty_genes and not allow_empty_genes:
        raise InvalidDataError(
            f"{n_empty_genes} of {n_vars} genes in {what} have zero total counts. Remove them "
            "before passing the data to countvae, e.g. `sc.pp.filter_genes(adata, min_counts=1)`; countvae never "
            "drops genes silently."
        )
    return CountSummary(cell_totals=scan.cell_totals, gene_totals=scan.gene_totals)


def checked_count_totals(matrix, what: str, remedy: str = RAW_COUNTS_REMEDY) -> CountSummary:
    """Totals of each cell and gene, in the one pass that checks the values as :func:`validate_counts` does."""
    n_obs, n_vars = _check_shape_and_dtype(matrix, what)
    scan = _scan_counts(matrix, n_obs, n_vars)
    _check_values(scan, what, remedy)
    return CountSummary(cell_totals=scan.cell_totals, gene_totals=scan.gene_totals)


def _check_shape_and_dtype(matrix, what: str) -> tuple[int, int]:
    """The matrix's ``(cells, genes)``, refused when it is not a non-empty 2-d numeric matrix."""
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
    return n_obs, n_vars


@dataclass
class _CountScan:
    """What one pass over the matrix found: totals, invalid values and the largest count."""

    cell_totals: np.ndarray
    gene_totals: np.ndarray
    nonfinite: int = 0
    negative: int = 0
    fraction: int = 0
    largest: float = 0.0
    example: float | None = None


def _scan_counts(matrix, n_obs: int, n_vars: int) -> _CountScan:
    """One pass over the rows in chunks (a backed matrix is never loaded whole)."""
    scan = _CountScan(np.zeros(n_obs, dtype=np.float64), np.zeros(n_vars, dtype=np.float64))
    source = matrix.tocsr() if sp.issparse(matrix) and matrix.format != "csr" else matrix
    for start, block in iter_row_chunks(source):
        values = np.asarray(block.data if sp.issparse(block) else block)  # the stored values
        if np.issubdtype(values.dtype, np.floating):
            n_nonfinite = int(values.size - np.count_nonzero(np.isfinite(values)))
            if n_nonfinite:
                scan.nonfinite += n_nonfinite
                continue
            fractional = values != np.round(values)
        else:
            fractional = np.zeros(values.shape, dtype=bool)
        negative = values < 0
        for mask in (negative, fractional):
            if scan.example is None and mask.any():
                scan.example = float(values[mask].flat[0])
        scan.negative += int(np.count_nonzero(negative))
        scan.fraction += int(np.count_nonzero(fractional))
        if values.size:
            scan.largest = max(scan.largest, float(values.max()))
        scan.cell_totals[start : start + block.shape[0]] = _sums(block, 1)
        scan.gene_totals += _sums(block, 0)
    return scan


def _check_values(scan: _CountScan, what: str, remedy: str) -> None:
    """Refuse non-finite, negative, non-integer and too large counts, saying how to pass raw counts."""
    if scan.nonfinite:
        raise InvalidDataError(
            f"{what} contains {scan.nonfinite} NaN or infinite values. Raw counts must be finite; "
            "check how the matrix was produced (missing values should be 0 counts)."
        )
    if scan.negative or scan.fraction:
        parts = [f"{scan.negative} negative values"] if scan.negative else []
        parts += [f"{scan.fraction} non-integer values"] if scan.fraction else []
        raise InvalidDataError(
            f"{what} contains {' and '.join(parts)} (for example {scan.example!r}); countvae models raw "
            f"counts. {remedy}, not normalized, log-transformed or scaled values."
        )
    if scan.largest > MAX_EXACT_COUNT:
        raise InvalidDataError(
            f"{what} holds a count of {scan.largest:.0f}, above 2**24 = {MAX_EXACT_COUNT:,}, the largest integer the "
            "models' float32 arithmetic represents exactly; a single cell's raw count of one gene is never this "
            f"large. Check how the matrix was produced. {remedy}."
        )
