"""Highly variable genes on raw counts (Seurat v3's variance-stabilising selection), and keeping only them.

The procedure is the ``seurat_v3`` flavour of scanpy's ``highly_variable_genes`` (Stuart et al. 2019, Cell
177:1888, "Feature selection"), which scvi-tools' tutorials use to choose genes before training:

1. per gene, the mean and the variance (``ddof=1``) of the raw counts;
2. a loess fit (span 0.3, degree 2) of log10 variance on log10 mean, over the genes of non-zero variance; its
   fitted value is the expected variance ``sigma^2`` of a gene of that mean;
3. each count is clipped at ``mean + sigma * sqrt(n_cells)``; the variance of the standardised clipped counts
   ``(x - mean) / sigma`` is the gene's normalised variance;
4. genes are ranked by normalised variance. With batches, steps 1-3 run in each batch, a gene's rank is its median
   rank over the batches where it is among the top ``n_top_genes``, and ties are broken by the number of such batches.

It uses scanpy's loess (scikit-misc's), so it chooses the same genes (checked against scanpy on real data in the
tests). It is written here so that the command line does not depend on scanpy and its dependencies for one function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp
from skmisc.loess import loess

from countvae._checks import check_int, check_number
from countvae.data.registry import batch_codes, get_count_matrix, get_registry, get_var_names, setup_anndata
from countvae.data.validation import checked_count_totals
from countvae.errors import InvalidArgumentError, InvalidDataError, SetupError

#: The selection procedure, under scanpy's name for it.
FLAVOR = "seurat_v3"
#: Where :func:`countvae.data.select_top_genes` records the selection on the AnnData it returns.
UNS_KEY = "countvae_gene_selection"
#: Span of the loess of log variance on log mean (Seurat's and scanpy's default).
LOESS_SPAN = 0.3
#: The recorded selection's entries other than ``genes``, in order, with the type each is read back as.
_RECORD_SCALARS = {"flavor": str, "n_top_genes": int, "n_genes_before": int, "counts": str, "batch_key": str}


def _mean_var(counts: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per-gene mean and unbiased (``ddof=1``) variance, in float64.

    Sparse counts are summed row after row (as scanpy's kernel does on one thread): the loess below is sensitive to
    the last digits of its inputs.
    """
    n, n_genes = counts.shape
    if sp.issparse(counts):
        csr = sp.csr_matrix(counts)
        values = np.asarray(csr.data, dtype=np.float64)
        mean = np.bincount(csr.indices, weights=values, minlength=n_genes) / n
        mean_sq = np.bincount(csr.indices, weights=values * values, minlength=n_genes) / n
    else:
        dense = np.asarray(counts)
        mean = dense.mean(axis=0, dtype=np.float64)
        mean_sq = np.square(dense, dtype=np.float64).mean(axis=0)  # squares of small integer or float16 types overflow
    return mean, (mean_sq - mean**2) * (n / (n - 1))


def _clipped_sums(counts: Any, clip: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-gene sum and sum of squares of the counts clipped from above at ``clip`` (zeros are never clipped)."""
    n_genes = counts.shape[1]
    if sp.issparse(counts):
        coo = counts.tocoo()
        values = np.minimum(np.asarray(coo.data, dtype=np.float64), clip[coo.col])
        return (
            np.bincount(coo.col, weights=values, minlength=n_genes),
            np.bincount(coo.col, weights=np.square(values), minlength=n_genes),
        )
    values = np.minimum(np.asarray(counts, dtype=np.float64), clip[None, :])
    return values.sum(axis=0), np.square(values).sum(axis=0)


def normalized_variance(counts: Any, span: float = LOESS_SPAN) -> np.ndarray:
    """Seurat v3's normalised variance of each gene (steps 1-3 of the module docstring).

    Parameters
    ----------
    counts
        Cells x genes raw counts (numpy array or scipy sparse matrix), at least 2 cells.
    span
        Loess span.

    Returns
    -------
    numpy.ndarray
        One value per gene; zero-variance genes (constant, all-zero included) skip the loess and get 0, as in scanpy.

    """
    n_cells = counts.shape[0]
    mean, var = _mean_var(counts)
    varies = var > 0
    log_expected_var = np.zeros(counts.shape[1], dtype=np.float64)
    fit = loess(np.log10(mean[varies]), np.log10(var[varies]), span=span, degree=2)
    fit.fit()
    log_expected_var[varies] = fit.outputs.fitted_values
    sigma = np.sqrt(10**log_expected_var)
    total, total_sq = _clipped_sums(counts, sigma * np.sqrt(n_cells) + mean)
    return (n_cells * np.square(mean) + total_sq - 2 * total * mean) / ((n_cells - 1) * np.square(sigma))


def highly_variable_genes(
    counts: Any, n_top_genes: int, batches: np.ndarray | None = None, span: float = LOESS_SPAN
) -> pd.DataFrame:
    """Rank genes by Seurat v3's normalised variance of raw counts and mark the ``n_top_genes`` most variable.

    Parameters
    ----------
    counts
        Cells x genes raw counts (numpy array or scipy sparse matrix).
    n_top_genes
        Number of genes to mark.
    batches
        Batch of each cell (any labels), or ``None`` for one batch.
    span
        Loess span, in (0, 1].

    Returns
    -------
    pandas.DataFrame
        One row per gene, in input order: ``variances_norm`` (mean over batches), ``highly_variable_rank``
        (median rank among batches where the gene is in the top ``n_top_genes``, 0 = most variable; NaN elsewhere),
        ``highly_variable_nbatches`` and ``highly_variable``; the same columns and values as scanpy's
        ``highly_variable_genes(flavor="seurat_v3")``.

    Raises
    ------
    InvalidArgumentError
        If ``n_top_genes`` is not between 1 and the number of genes, or ``span`` is not in (0, 1].
    InvalidDataError
        If the counts are not raw counts (NaN, infinite, negative or non-integer values), a batch has fewer than 2
        cells, or there are too few varying genes for the loess fit.

    """
    # NaN or infinite values crashed the loess (a segfault), negative ones ended in a message about too few cells
    checked_count_totals(counts, "counts", remedy="Pass the raw counts")
    n_cells, n_genes = counts.shape
    span = check_number("span", span, 0.0, 1.0, low_open=True)
    check_int("n_top_genes", n_top_genes)
    if not 1 <= n_top_genes <= n_genes:
        raise InvalidArgumentError(
            f"n_top_genes must be between 1 and the number of genes ({n_genes}), got {n_top_genes}."
        )
    labels = np.zeros(n_cells, dtype=np.int64) if batches is None else np.asarray(batches)
    if len(labels) != n_cells:
        raise InvalidArgumentError(f"batches has {len(labels)} entries for {n_cells} cells.")
    if sp.issparse(counts):
        counts = sp.csr_matrix(counts)
    per_batch = []
    for batch in np.unique(labels):
        rows = np.flatnonzero(labels == batch)
        where = "" if batches is None else f" in batch {str(batch)!r}"
        if len(rows) < 2:
            raise InvalidDataError(f"Highly variable genes need at least 2 cells{where}, found {len(rows)}.")
        try:
            per_batch.append(normalized_variance(counts[rows], span))
        except ValueError as exc:  # scikit-misc's loess refuses too few points for its span
            raise InvalidDataError(
                f"The mean-variance loess{where} failed ({exc}); too few cells or varying genes for "
                "gene selection. Select genes without a batch key or keep all genes."
            ) from None
    norm_var = np.vstack(per_batch)
    # Double argsort gives ranks (0 = most variable), exactly as scanpy computes them, ties included.
    ranks = np.argsort(np.argsort(-norm_var, axis=1), axis=1).astype(np.float32)
    n_batches_top = np.sum(ranks < n_top_genes, axis=0)
    ranks[ranks >= n_top_genes] = np.nan
    median_rank = np.ma.median(np.ma.masked_invalid(ranks), axis=0).filled(np.nan)
    table = pd.DataFrame(
        {
            "variances_norm": norm_var.mean(axis=0),
            "highly_variable_rank": median_rank,
            "highly_variable_nbatches": n_batches_top,
        }
    )
    order = table.sort_values(
        ["highly_variable_rank", "highly_variable_nbatches"], ascending=[True, False], na_position="last"
    ).index
    table["highly_variable"] = False
    table.loc[order[:n_top_genes], "highly_variable"] = True
    return table


def select_top_genes(adata: ad.AnnData, n_top_genes: int, min_genes: int = 1) -> ad.AnnData:
    """Keep the ``n_top_genes`` most variable genes of a registered AnnData, chosen on its raw counts.

    Genes are chosen by :func:`countvae.data.highly_variable_genes`, within each batch when a batch key is
    registered (as scvi-tools' tutorials do). The result is registered with the same layer, batch and labels keys
    (counts from ``adata.raw`` become its ``X``) and records the selection in ``uns["countvae_gene_selection"]``
    (see :func:`countvae.data.get_gene_selection`).

    Parameters
    ----------
    adata
        Registered with :func:`countvae.data.setup_anndata`; not modified.
    n_top_genes
        Genes to keep, at least ``min_genes`` and at most the number of genes.
    min_genes
        The fewest genes that can work (e.g. the model's latent dimensions).

    Returns
    -------
    anndata.AnnData
        A copy with the chosen genes, in their original order.

    Raises
    ------
    SetupError
        If ``adata`` is not registered.
    InvalidArgumentError
        If ``n_top_genes`` is below ``min_genes`` or above the number of genes.
    InvalidDataError
        If a cell has no counts in the chosen genes (it cannot be modelled) or a batch is too small for the selection.

    """
    registry = get_registry(adata)
    if registry is None:
        raise SetupError("Register the AnnData with countvae.data.setup_anndata before selecting genes.")
    var_names = get_var_names(adata, registry)
    n_genes = len(var_names)
    check_int("n_top_genes", n_top_genes)
    min_genes = check_int("min_genes", min_genes, 1)
    if n_top_genes > n_genes:
        raise InvalidArgumentError(
            f"n_top_genes={n_top_genes} is more than the {n_genes} genes of the data; choose fewer, or keep all genes."
        )
    if n_top_genes < min_genes:
        raise InvalidArgumentError(
            f"n_top_genes={n_top_genes} is fewer than {min_genes} (the latent dimensions); "
            "a model cannot have more latent dimensions than genes. Keep more genes."
        )
    counts = get_count_matrix(adata, registry)
    if not (sp.issparse(counts) or isinstance(counts, np.ndarray)):
        raise InvalidDataError(
            "Gene selection needs the counts in memory; read the file without backed mode, or keep every gene "
            "(n_top_genes='all', --n-top-genes all)."
        )
    # the batches' names, not their codes, so that an error names the batch as the analyst knows it
    batches = (
        None if registry.batch_key is None else np.asarray(registry.batch_categories)[batch_codes(adata, registry)]
    )
    keep = highly_variable_genes(counts, int(n_top_genes), batches)["highly_variable"].to_numpy()
    n_empty = int(np.count_nonzero(np.asarray(counts[:, keep].sum(axis=1)).ravel() == 0))
    if n_empty:
        raise InvalidDataError(
            f"{n_empty} of {adata.n_obs} cells have no counts in the {n_top_genes} most variable genes; "
            "keep more genes, or remove cells with few counts before fitting."
        )
    source = adata.raw.to_adata() if registry.use_raw else adata
    subset = source[:, np.flatnonzero(keep)].copy()
    setup_anndata(
        subset,
        layer=None if registry.use_raw else registry.layer,
        batch_key=registry.batch_key,
        labels_key=registry.labels_key,
    )
    subset.uns[UNS_KEY] = {
        "flavor": FLAVOR,
        "n_top_genes": int(n_top_genes),
        "n_genes_before": int(n_genes),
        "counts": registry.describe_counts(),
        "batch_key": registry.batch_key or "",
        "genes": [str(g) for g in var_names[keep]],
    }
    return subset


def get_gene_selection(adata: ad.AnnData) -> dict[str, Any] | None:
    """The selection :func:`countvae.data.select_top_genes` recorded on ``adata`` (JSON-ready), or ``None``.

    Keys: ``flavor``, ``n_top_genes``, ``n_genes_before``, ``counts`` (the matrix the genes were chosen on),
    ``batch_key`` (``""``: none) and ``genes``.
    """
    record = adata.uns.get(UNS_KEY)
    if record is None:
        return None
    scalars = {key: kind(record[key]) for key, kind in _RECORD_SCALARS.items()}
    return {**scalars, "genes": [str(g) for g in record["genes"]]}


#: Value of ``n_top_genes`` (and of ``--n-top-genes``) that keeps every gene.
ALL_GENES = "all"


@dataclass(frozen=True)
class GeneChoice:
    """The data to fit after :func:`choose_genes`, and how it was chosen.

    ``adata`` is the data to fit (the input itself when every gene is kept), ``n_genes_before`` the input's genes,
    ``selected`` whether genes were dropped and ``explicit`` whether the number was asked for rather than a default.
    """

    adata: ad.AnnData
    n_genes_before: int
    selected: bool
    explicit: bool

    def record(self) -> dict[str, Any] | None:
        """The selection as recorded on the data (with the chosen genes), or ``None`` when all genes are kept."""
        return get_gene_selection(self.adata) if self.selected else None


def choose_genes(adata: ad.AnnData, requested: int | str | None, default: int | None, n_latent: int) -> GeneChoice:
    """Keep the ``requested`` most variable genes of registered data (:func:`select_top_genes`), or all of them.

    ``requested`` is ``None`` (the ``default``, which applies only when the data has more genes; ``None`` there
    keeps every gene), ``"all"`` (``ALL_GENES``) or a number; an explicit number larger than the number of genes or
    smaller than ``n_latent`` is an error.
    """
    registry = get_registry(adata)
    if registry is None:
        raise SetupError(
            "This AnnData is not set up; call countvae.CountVAE.setup_anndata(adata, layer=..., batch_key=...) "
            "first (the command line does it from --layer and --batch-key)."
        )
    n_genes = len(get_var_names(adata, registry))
    if requested == ALL_GENES or (requested is None and (default is None or n_genes <= default)):
        return GeneChoice(adata, n_genes, selected=False, explicit=requested is not None)
    if requested is not None and (isinstance(requested, str) or not isinstance(requested, int | np.integer)):
        # int() truncated 12.9 to 12 and read "12" as 12; other strings raised int()'s own error
        raise InvalidArgumentError(
            f"n_top_genes must be a positive integer or {ALL_GENES!r} (every gene), got {requested!r}."
        )
    n_top = check_int("n_top_genes", default if requested is None else requested, 1)
    return GeneChoice(
        select_top_genes(adata, n_top, min_genes=n_latent), n_genes, selected=True, explicit=requested is not None
    )
