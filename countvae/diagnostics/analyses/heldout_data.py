"""Reading the observed counts of the held-out cells the way the fits see them.

These helpers avoid copying the whole count matrix: with 100,000 held-out cells a float64 copy of a typical sparse
matrix is several hundred megabytes. Columns are only selected (a copy) when the AnnData's genes differ from the
fits' genes or when a caller asks for a few genes.
"""

from __future__ import annotations

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp

from countvae._provenance import counts_sha256, json_sha256, names_sha256
from countvae.data.registry import Registry, get_count_matrix, get_registry, get_var_names
from countvae.errors import InvalidDataError


def observed_counts(adata: ad.AnnData, var_names: pd.Index) -> sp.csr_matrix:
    """Raw counts of ``adata`` (registered layer, ``raw`` or ``X``) for the genes ``var_names``, in that order.

    The stored dtype is kept; the matrix is not copied when its genes already are ``var_names`` in order.

    Raises
    ------
    InvalidDataError
        If some of the genes are missing.

    """
    registry = get_registry(adata) or Registry()
    matrix = get_count_matrix(adata, registry)
    positions = pd.Index(get_var_names(adata, registry)).get_indexer(var_names)
    if (positions < 0).any():
        missing = list(var_names[positions < 0][:5])
        raise InvalidDataError(
            f"The held-out AnnData lacks {int((positions < 0).sum())} of the fits' genes (e.g. {missing}); "
            "pass cells with the genes the models were trained on."
        )
    matrix = matrix.tocsr() if sp.issparse(matrix) else sp.csr_matrix(np.asarray(matrix))
    if len(positions) == matrix.shape[1] and bool((positions == np.arange(len(positions))).all()):
        return matrix
    return matrix[:, positions]


def library_sizes(adata: ad.AnnData, var_names: pd.Index) -> np.ndarray:
    """Total counts per cell over the genes ``var_names``."""
    return np.asarray(observed_counts(adata, var_names).sum(axis=1), dtype=np.float64).ravel()


def log1p_normalized(
    adata: ad.AnnData, var_names: pd.Index, genes: pd.Index | None = None, target_sum: float = 1e4
) -> sp.csr_matrix:
    """``log1p`` of counts scaled to ``target_sum`` per cell (scanpy's ``normalize_total`` + ``log1p``), sparse.

    Cell totals are over all of ``var_names`` (the fits' genes); only the columns ``genes`` (default: all) are returned.
    """
    counts = observed_counts(adata, var_names)
    totals = np.asarray(counts.sum(axis=1), dtype=np.float64).ravel()
    if genes is not None:
        counts = counts[:, var_names.get_indexer(genes)]
    scale = np.divide(target_sum, totals, out=np.zeros_like(totals), where=totals > 0)
    out = sp.csr_matrix(sp.diags(scale) @ counts.astype(np.float64))
    out.data = np.log1p(out.data)
    return out


def gene_variance(adata: ad.AnnData, var_names: pd.Index, max_cells: int = 20_000, seed: int = 0) -> np.ndarray:
    """Variance of each gene's ``log1p`` normalized expression, on at most ``max_cells`` random cells."""
    if adata.n_obs > max_cells:
        keep = np.sort(np.random.default_rng(seed).choice(adata.n_obs, max_cells, replace=False))
        adata = adata[keep]
    return column_variance(log1p_normalized(adata, var_names))


def column_variance(matrix: sp.csr_matrix) -> np.ndarray:
    """Variance of each column of a sparse matrix (population variance, as numpy's default)."""
    mean = np.asarray(matrix.mean(axis=0)).ravel()
    mean_sq = np.asarray(matrix.multiply(matrix).mean(axis=0)).ravel()
    return np.maximum(mean_sq - mean**2, 0.0)


def data_checksum(adata: ad.AnnData, var_names: pd.Index) -> str:
    """SHA-256 over the held-out counts (canonical form, see ``counts_sha256``), cell and gene names."""
    return json_sha256(
        {
            "counts_sha256": counts_sha256(observed_counts(adata, var_names)),
            "cells_sha256": names_sha256(adata.obs_names),
            "genes_sha256": names_sha256(var_names),
        }
    )
