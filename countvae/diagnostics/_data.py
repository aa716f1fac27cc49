"""Reading the observed counts of the held-out cells the way the fits see them."""

from __future__ import annotations

import hashlib

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp

from countvae.data.registry import Registry, get_count_matrix, get_registry, get_var_names
from countvae.errors import InvalidDataError


def observed_counts(adata: ad.AnnData, var_names: pd.Index) -> sp.csr_matrix:
    """Raw counts of ``adata`` (registered layer, ``raw`` or ``X``) for the genes ``var_names``, in that order.

    Raises
    ------
    InvalidDataError
        If some of the genes are missing.

    """
    registry = get_registry(adata) or Registry()
    matrix = get_count_matrix(adata, registry)
    names = pd.Index(get_var_names(adata, registry))
    positions = names.get_indexer(var_names)
    if (positions < 0).any():
        missing = list(var_names[positions < 0][:5])
        raise InvalidDataError(
            f"The held-out AnnData lacks {int((positions < 0).sum())} of the fits' genes (e.g. {missing}); "
            "pass cells with the genes the models were trained on."
        )
    matrix = sp.csr_matrix(matrix) if not sp.issparse(matrix) else matrix.tocsr()
    return matrix[:, positions].astype(np.float64)


def log1p_normalized(counts: sp.spmatrix | np.ndarray, target_sum: float = 1e4) -> sp.csr_matrix:
    """``log1p`` of counts scaled to ``target_sum`` per cell (scanpy's ``normalize_total`` + ``log1p``), sparse.

    The cell totals are taken over all columns given, so select genes *after*
    normalizing.
    """
    counts = sp.csr_matrix(counts, dtype=np.float64)
    totals = np.asarray(counts.sum(axis=1)).ravel()
    scale = np.divide(target_sum, totals, out=np.zeros_like(totals, dtype=np.float64), where=totals > 0)
    out = sp.csr_matrix(sp.diags(scale) @ counts)
    out.data = np.log1p(out.data)
    return out


def column_variance(matrix: sp.csr_matrix) -> np.ndarray:
    """Variance of each column of a sparse matrix (population variance, as numpy's default)."""
    mean = np.asarray(matrix.mean(axis=0)).ravel()
    mean_sq = np.asarray(matrix.multiply(matrix).mean(axis=0)).ravel()
    return np.maximum(mean_sq - mean**2, 0.0)


def data_checksum(adata: ad.AnnData, var_names: pd.Index) -> str:
    """SHA-256 over the held-out counts (CSR arrays), cell names and gene names."""
    counts = observed_counts(adata, var_names)
    counts.sort_indices()
    digest = hashlib.sha256()
    for array in (counts.indptr, counts.indices, counts.data):
        digest.update(np.ascontiguousarray(array).tobytes())
    for names in (adata.obs_names, var_names):
        digest.update("\x1f".join(map(str, names)).encode("utf-8"))
    return digest.hexdigest()
