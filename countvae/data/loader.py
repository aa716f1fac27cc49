"""Minibatches of dense count rows from in-memory or on-disk (backed) AnnData.

Two ways of visiting the cells in random order (``CountSource.iterate``):

* per-cell shuffling (the default for in-memory data): one uniform random permutation of the cells per epoch, as
  scvi-tools' data loader;
* block shuffling (the default for backed data, ``shuffle_block_cells=B``): the sorted cells are cut into blocks of
  ``B`` consecutive cells, the blocks are put in random order, consecutive groups of ``buffer_blocks`` blocks form a
  buffer, and the cells of each buffer are permuted. Each buffer is read as a few contiguous row slices, so an epoch
  reads every row once with large sequential reads, and at most two buffers of sparse rows are in memory at a time.
  Every minibatch mixes cells of ``buffer_blocks`` random places in the file.

Either way the epoch's cell order is cut into consecutive minibatches of ``batch_size`` cells (the last one shorter;
each minibatch's rows sorted by position), so for the same order the minibatches, and therefore training, are
identical for in-memory and backed data.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from countvae._checks import check_int
from countvae.errors import InvalidDataError

logger = logging.getLogger(__name__)

#: Default number of consecutive cells per shuffled block when reading backed data.
DEFAULT_BLOCK_CELLS = 1024
#: Default number of blocks mixed in one shuffling buffer.
DEFAULT_BUFFER_BLOCKS = 8
#: Rows skipped between two wanted rows before a backed read is split into two slices.
_MAX_GAP_ROWS = 64


@dataclass
class Minibatch:
    """Rows of the count matrix with their covariates.

    Attributes
    ----------
    indices
        Positions of the rows in the registered AnnData (sorted ascending).
    counts
        Dense counts, shape (len(indices), n_genes): float32 when the stored matrix is float32 (exact for counts
        below 2**24), float64 otherwise.
    batch
        Integer batch code of each row.
    nonzero
        Row-major flat positions (``row * n_genes + gene``) of the non-zero entries of ``counts``, increasing, when
        the rows came from a sparse matrix (saves the likelihood a search over the dense block); else ``None``.
    nonzero_rows, nonzero_genes
        The row and the gene of each of those entries (the same order), or ``None``.
    nonzero_per_row
        The number of those entries in each row, or ``None``.

    """

    indices: np.ndarray
    counts: np.ndarray
    batch: np.ndarray
    nonzero: np.ndarray | None = None
    nonzero_rows: np.ndarray | None = None
    nonzero_genes: np.ndarray | None = None
    nonzero_per_row: np.ndarray | None = None


def refuse_backed_csc(matrix) -> None:
    """Refuse a backed matrix stored as CSC: every cell (row) read from it reads the whole file."""
    backed = not (sp.issparse(matrix) or isinstance(matrix, np.ndarray))
    if backed and getattr(matrix, "format", "csr") == "csc":
        raise InvalidDataError(
            "The backed count matrix is stored as CSC; reading cells (rows) from it reads the whole file. "
            "Load it into memory (adata = adata.to_memory()), or rewrite the file as CSR once: a = "
            "anndata.read_h5ad(path); a.X = a.X.tocsr(); a.write_h5ad(new_path); then read new_path backed."
        )


def _runs(sorted_rows: np.ndarray, max_gap: int) -> list[tuple[int, int]]:
    """Split sorted row positions into ``[first, last]`` runs whose gaps are at most ``max_gap`` rows."""
    if len(sorted_rows) == 0:
        return []
    breaks = np.flatnonzero(np.diff(sorted_rows) > max_gap + 1)
    firsts = np.concatenate([[0], breaks + 1])
    lasts = np.concatenate([breaks, [len(sorted_rows) - 1]])
    return [(int(sorted_rows[a]), int(sorted_rows[b])) for a, b in zip(firsts, lasts, strict=True)]


class CountSource:
    """Row access to a registered count matrix.

    In-memory CSC and COO matrices are converted to CSR once (row access on CSC is slow), doubling that matrix's memory
    while the source lives (logged). Backed matrices (``anndata.read_h5ad(..., backed="r")``) are never read whole:
    contiguous slices (``matrix[start:stop]``) covering the wanted rows are read, and only those rows kept.

    Parameters
    ----------
    matrix
        Cells x genes counts: numpy array, scipy sparse or a backed anndata dataset (sparse CSR or dense).
    batch
        Integer batch code of every cell.

    Raises
    ------
    InvalidDataError
        If a backed matrix is stored as CSC (every row read would read the whole file).

    """

    def __init__(self, matrix, batch: np.ndarray):
        if sp.issparse(matrix) and matrix.format != "csr":
            logger.info("Converting the %s count matrix to CSR for row access.", matrix.format)
            matrix = matrix.tocsr()
        self.is_backed = not (sp.issparse(matrix) or isinstance(matrix, np.ndarray))
        refuse_backed_csc(matrix)
        self.matrix = matrix
        self.batch = np.asarray(batch, dtype=np.int64)
        float32 = np.dtype(getattr(matrix, "dtype", np.float64)) == np.float32
        self.counts_dtype = np.dtype(np.float32) if float32 else np.dtype(np.float64)  # see Minibatch.counts
        if len(self.batch) != matrix.shape[0]:
            raise ValueError("batch codes and count matrix differ in their number of cells")

    @property
    def n_obs(self) -> int:
        """Number of cells."""
        return int(self.matrix.shape[0])

    @property
    def n_vars(self) -> int:
        """Number of genes."""
        return int(self.matrix.shape[1])

    # ----- reading rows --------------------------------------------------------------------
    def read_rows(self, sorted_rows: np.ndarray):
        """The given rows (sorted, unique) as a CSR matrix or a dense array, in that order."""
        if not self.is_backed:
            return self.matrix[sorted_rows]
        parts = []
        for first, last in _runs(sorted_rows, _MAX_GAP_ROWS):
            block = self.matrix[first : last + 1]
            wanted = sorted_rows[(sorted_rows >= first) & (sorted_rows <= last)] - first
            parts.append(block if len(wanted) == last - first + 1 else block[wanted])
        if not parts:
            return self.matrix[0:0]
        if sp.issparse(parts[0]):
            return sp.vstack(parts, format="csr") if len(parts) > 1 else parts[0].tocsr()
        return np.concatenate(parts, axis=0)

    def _minibatch(self, indices: np.ndarray, block) -> Minibatch:
        """Densify ``block`` (rows of ``indices`` in order) into a :class:`Minibatch`."""
        if sp.issparse(block):
            block = block.tocsr()
            counts = block.toarray().astype(self.counts_dtype, copy=False)
            if not block.has_canonical_format:
                block.sum_duplicates()
            rows = np.repeat(np.arange(block.shape[0], dtype=np.int64), np.diff(block.indptr))
            genes = block.indices.astype(np.int64)
            per_row = np.diff(block.indptr).astype(np.int64)
            stored = block.data != 0  # explicitly stored zeros are not non-zero counts
            if not stored.all():
                rows, genes = rows[stored], genes[stored]
                per_row = np.bincount(rows, minlength=block.shape[0]).astype(np.int64)
            return Minibatch(
                indices=indices,
                counts=counts,
                batch=self.batch[indices],
                nonzero=rows * block.shape[1] + genes,
                nonzero_rows=rows,
                nonzero_genes=genes,
                nonzero_per_row=per_row,
            )
        counts = np.asarray(block).astype(self.counts_dtype, copy=False)
        return Minibatch(indices=indices, counts=counts, batch=self.batch[indices])

    def rows(self, indices: np.ndarray) -> Minibatch:
        """Dense counts of the given rows (sorted first; duplicates are not allowed)."""
        indices = np.sort(np.asarray(indices, dtype=np.int64))
        return self._minibatch(indices, self.read_rows(indices))

    # ----- visiting cells ------------------------------------------------------------------
    def iterate(
        self,
        indices: np.ndarray,
        batch_size: int,
        shuffle: bool = False,
        rng: np.random.Generator | None = None,
        drop_last_singleton: bool = True,
        shuffle_block_cells: int | None = None,
        buffer_blocks: int = DEFAULT_BUFFER_BLOCKS,
    ) -> Iterator[Minibatch]:
        """Yield minibatches covering ``indices``: the epoch's order (as given, or shuffled) cut as the module says.

        Parameters
        ----------
        indices
            Cells to visit.
        batch_size
            Rows per minibatch.
        shuffle
            Visit cells in a random order drawn from ``rng``.
        rng
            Source of the shuffling order (required when ``shuffle``).
        drop_last_singleton
            Merge a final one-cell minibatch into the previous one: batch normalisation cannot train on a single cell.
        shuffle_block_cells
            With ``shuffle``: ``None`` for per-cell shuffling (default for in-memory data; backed data then uses
            ``DEFAULT_BLOCK_CELLS``), or the block size ``B`` of block shuffling (see the module docstring). ``1``
            with a buffer covering all cells is a per-cell shuffle drawn differently.
        buffer_blocks
            Blocks per shuffling buffer (block shuffling only).

        """
        indices = np.asarray(indices, dtype=np.int64)
        if shuffle and rng is None:
            raise ValueError("shuffle=True needs an rng")
        if shuffle and shuffle_block_cells is None and self.is_backed:
            shuffle_block_cells = DEFAULT_BLOCK_CELLS
        if shuffle and shuffle_block_cells is not None:
            check_int("shuffle_block_cells", shuffle_block_cells, 1)
            check_int("buffer_blocks", buffer_blocks, 1)
            order, segments = block_shuffle_order(np.sort(indices), shuffle_block_cells, buffer_blocks, rng)
        else:
            order = indices[rng.permutation(len(indices))] if shuffle else indices
            segments = None
        bounds = _batch_bounds(len(order), batch_size, drop_last_singleton)
        if not self.is_backed or segments is None:  # in memory, or no shuffling buffer: each minibatch on its own
            for start, stop in bounds:
                yield self.rows(order[start:stop])
            return
        yield from self._iterate_buffers(order, bounds, segments)

    def _iterate_buffers(self, order, bounds, segments) -> Iterator[Minibatch]:
        """Backed data: read each buffer (segment of ``order``) once, as sorted runs of rows."""
        cache: dict[int, tuple[np.ndarray, object]] = {}  # segment number -> (sorted rows, their data)
        seg_starts = np.array([s for s, _ in segments], dtype=np.int64)
        for start, stop in bounds:
            first_seg = int(np.searchsorted(seg_starts, start, side="right") - 1)
            last_seg = int(np.searchsorted(seg_starts, stop - 1, side="right") - 1)
            for k in [k for k in cache if k < first_seg]:
                del cache[k]  # at most two buffers are held at once
            wanted = np.sort(order[start:stop])
            pieces, positions = [], []
            for k in range(first_seg, last_seg + 1):
                if k not in cache:
                    rows = np.sort(order[segments[k][0] : segments[k][1]])
                    cache[k] = (rows, self.read_rows(rows))
                rows, data = cache[k]
                here = np.flatnonzero(np.isin(wanted, rows))
                pieces.append(data[np.searchsorted(rows, wanted[here])])
                positions.append(here)
            if len(pieces) == 1:
                block = pieces[0]
            else:  # a minibatch that straddles two buffers: put its rows back in sorted order
                block = sp.vstack(pieces, format="csr") if sp.issparse(pieces[0]) else np.concatenate(pieces)
                block = block[np.argsort(np.concatenate(positions))]
            yield self._minibatch(wanted, block)


def _batch_bounds(n: int, batch_size: int, drop_last_singleton: bool) -> list[tuple[int, int]]:
    starts = list(range(0, n, batch_size))
    if drop_last_singleton and len(starts) > 1 and n - starts[-1] == 1:
        starts.pop()
    return [(s, starts[i + 1] if i + 1 < len(starts) else n) for i, s in enumerate(starts)]


def block_shuffle_order(
    sorted_indices: np.ndarray, block_cells: int, buffer_blocks: int, rng: np.random.Generator
) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The block-shuffled visiting order of ``sorted_indices`` (see the module docstring).

    Returns
    -------
    order, segments
        The cell order, and each buffer's ``(start, stop)`` positions in ``order`` (the cells read from disk together).

    """
    n = len(sorted_indices)
    n_blocks = -(-n // block_cells)
    block_order = rng.permutation(n_blocks)
    pieces, segments, pos = [], [], 0
    for first in range(0, n_blocks, buffer_blocks):
        chosen = block_order[first : first + buffer_blocks]
        cells = np.concatenate([sorted_indices[b * block_cells : (b + 1) * block_cells] for b in chosen])
        pieces.append(cells[rng.permutation(len(cells))])
        segments.append((pos, pos + len(cells)))
        pos += len(cells)
    order = np.concatenate(pieces) if pieces else sorted_indices[:0]
    return order, segments
