"""Cells of a view of a backed (on-disk) AnnData, read from the file when needed, never loaded whole.

``anndata.read_h5ad(path, backed="r")`` keeps the count matrix on disk, but a view of it (``adata[cells]``) reads
all its rows into memory as soon as ``.X`` is touched. :func:`backed_view_counts` gives the view's cells (and genes,
in the view's order) as a :class:`BackedRows` instead, which reads contiguous row slices of the file on demand, so a
model can train and be evaluated on a subset of a file larger than memory.
"""

from __future__ import annotations

import anndata as ad
import h5py
import numpy as np


def read_into_memory(adata: ad.AnnData) -> ad.AnnData:
    """An in-memory copy of a backed AnnData or of a view of one, its file left open.

    anndata's ``to_memory()`` closes the file of the backed AnnData it reads (anndata 0.12), so the caller's object
    could no longer read its counts; the file is reopened in the mode it had.
    """
    manager = adata.file  # a view shares its parent's
    was_open = manager.is_open
    copy = adata.to_memory()
    if was_open and not manager.is_open:
        manager.open()
    return copy


def cells_in_memory(adata: ad.AnnData, positions: np.ndarray) -> ad.AnnData:
    """The cells at ``positions`` of ``adata`` (in memory, backed, or a backed view) as an AnnData in memory.

    anndata cannot index a view of a backed AnnData again; its rows (and genes) are composed with the view's own
    (``_oidx``/``_vidx``, as :func:`backed_positions`) and read through the backed parent (``_adata_ref``), whose
    in-memory ``obs``, ``var`` and ``uns`` (the registration) the view shares. The file stays open.
    """
    if not adata.isbacked:
        return adata[positions].copy()
    if not adata.is_view:
        return read_into_memory(adata[positions])
    rows = backed_positions(adata)[positions]
    columns = backed_columns(adata)
    parent = adata._adata_ref
    return read_into_memory(parent[rows] if columns is None else parent[rows, columns])


def file_counts(adata: ad.AnnData):
    """The whole ``X`` of backed ``adata``'s file, unread: anndata's sparse dataset or an h5py dataset."""
    stored = adata.file["X"]
    return ad.io.sparse_dataset(stored) if isinstance(stored, h5py.Group) else stored


def backed_positions(adata: ad.AnnData) -> np.ndarray:
    """Row positions, in its file, of the cells of a backed AnnData (all rows unless it is a view).

    anndata has no public accessor for a view's rows in its parent; ``_oidx`` (a slice or an integer array, as
    anndata normalises it) is read instead, as ``_vidx`` (:func:`backed_columns`) and a view's parent ``_adata_ref``
    (:func:`cells_in_memory`) are: the private names of anndata this module depends on.
    """
    every_row = np.arange(int(file_counts(adata).shape[0]), dtype=np.int64)
    return every_row[adata._oidx] if adata.is_view else every_row


def backed_columns(adata: ad.AnnData) -> np.ndarray | None:
    """Column positions, in its file, of the genes of a backed view, in the view's order; ``None`` for all in order.

    Read from ``_vidx``, the column counterpart of ``_oidx`` (:func:`backed_positions`).
    """
    n_genes = int(file_counts(adata).shape[1])
    columns = np.arange(n_genes, dtype=np.int64)[adata._vidx] if adata.is_view else None
    return None if columns is None or np.array_equal(columns, np.arange(n_genes)) else columns


class BackedRows:
    """Rows ``positions`` (sorted, unique) of a backed matrix, read from disk on demand; ``columns`` keeps those genes.

    Supports what countvae's readers use: ``shape``, ``dtype``, ``format`` and row slices ``rows[start:stop]``,
    which read the file rows ``positions[start]`` to ``positions[stop - 1]`` as one contiguous slice and keep the
    wanted ones: rows left out in between cost a little extra reading but no extra seeks.
    """

    def __init__(self, matrix, positions: np.ndarray, columns: np.ndarray | None = None):
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and np.any(np.diff(positions) <= 0):
            raise ValueError("positions must be sorted and unique")
        self.matrix = matrix
        self.positions = positions
        self.columns = columns
        self.dtype = matrix.dtype
        self.format = getattr(matrix, "format", None)

    @property
    def shape(self) -> tuple[int, int]:
        """Rows in the subset x columns."""
        return (len(self.positions), int(self.matrix.shape[1]) if self.columns is None else len(self.columns))

    def __getitem__(self, key):
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("BackedRows supports row slices with step 1 only")
        start, stop, _ = key.indices(len(self.positions))
        rows = self.positions[start:stop]
        block = self.matrix[int(rows[0]) : int(rows[-1]) + 1] if stop > start else self.matrix[0:0]
        if stop > start and len(rows) != rows[-1] - rows[0] + 1:
            block = block[rows - rows[0]]
        return block if self.columns is None else block[:, self.columns]


def backed_view_counts(adata: ad.AnnData) -> BackedRows | None:
    """``X`` of a view of a backed AnnData as :class:`BackedRows` over its file (nothing is read yet).

    ``None`` when the view's cells are not in file order (then anndata reads them into memory).
    """
    positions = backed_positions(adata)
    if positions.size > 1 and np.any(np.diff(positions) <= 0):
        return None
    return BackedRows(file_counts(adata), positions, backed_columns(adata))
