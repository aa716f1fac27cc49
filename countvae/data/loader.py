"""Minibatches of dense count rows from in-memory or on-disk (backed) AnnData."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


@dataclass
class Minibatch:
    """Rows of the count matrix with their covariates.

    Attributes
    ----------
    indices
        Positions of the rows in the registered AnnData (sorted ascending).
    counts
        Dense counts, float64, shape (len(indices), n_genes).
    batch
        Integer batch code of each row.

    """

    indices: np.ndarray
    counts: np.ndarray
    batch: np.ndarray


class CountSource:
    """Row access to a registered count matrix.

    In-memory CSC and COO matrices are converted to CSR once (row access on CSC
    is slow); this doubles memory for that matrix while the source lives, which is
    logged. Backed matrices are read from disk in sorted row order, the access
    pattern h5py serves without reading the file many times over.

    Parameters
    ----------
    matrix
        Cells x genes counts: numpy array, scipy sparse or a backed anndata dataset.
    batch
        Integer batch code of every cell.

    """

    def __init__(self, matrix, batch: np.ndarray):
        if sp.issparse(matrix) and matrix.format != "csr":
            matrix = matrix.tocsr()
        self.matrix = matrix
        self.batch = np.asarray(batch, dtype=np.int64)
        self.is_backed = not (sp.issparse(matrix) or isinstance(matrix, np.ndarray))
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

    def rows(self, indices: np.ndarray) -> Minibatch:
        """Dense counts of the given rows (sorted first; duplicates are not allowed)."""
        indices = np.sort(np.asarray(indices, dtype=np.int64))
        block = self.matrix[indices]
        counts = block.toarray() if hasattr(block, "toarray") else np.asarray(block)
        return Minibatch(indices=indices, counts=counts.astype(np.float64, copy=False), batch=self.batch[indices])

    def iterate(
        self,
        indices: np.ndarray,
        batch_size: int,
        shuffle: bool = False,
        rng: np.random.Generator | None = None,
        drop_last_singleton: bool = True,
    ) -> Iterator[Minibatch]:
        """Yield minibatches covering ``indices``.

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
            Merge a final minibatch of one cell into the previous one: batch
            normalisation cannot train on a single cell.

        """
        indices = np.asarray(indices, dtype=np.int64)
        if shuffle:
            if rng is None:
                raise ValueError("shuffle=True needs an rng")
            indices = indices[rng.permutation(len(indices))]
        starts = list(range(0, len(indices), batch_size))
        if drop_last_singleton and len(starts) > 1 and len(indices) - starts[-1] == 1:
            starts.pop()
        for i, start in enumerate(starts):
            stop = starts[i + 1] if i + 1 < len(starts) else len(indices)
            yield self.rows(indices[start:stop])
