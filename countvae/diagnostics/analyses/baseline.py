"""A model without latent variables: the yardstick of the predictive-equivalence margin.

How much two fits may differ in held-out ``log p(x)`` before the difference matters depends on the data: a cell of 300
genes carries a few hundred nats, one of 30,000 genes tens of thousands. The equivalence margin is therefore relative to
what the latent variables explain: the mean per-cell gain of the fits' held-out ``log p(x)`` over this baseline.

The baseline is a negative binomial per gene, with no latent variable: for cell ``n`` in batch ``b`` with observed
library size ``l_n`` (its total count, the same offset the count VAEs condition on),
``x_ng ~ NB(mean l_n p_bg, theta_g)``. The shares ``p_bg`` are pooled counts over pooled library sizes per batch
(with half a count added to each gene, so no share is zero); ``theta_g`` comes from the method of moments,
``sum_n (x_ng - mu_ng)^2 - mu_ng = sum_n mu_ng^2 / theta_g`` (Poisson, ``theta = inf``, where the counts are not
overdispersed). Both are estimated on the cells the fits were trained on when they are given, else on the held-out
cells themselves (which makes the baseline slightly better, the gain smaller and so the margin stricter).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.special import gammaln
from sklearn.decomposition import PCA

from countvae.errors import InvalidDataError

#: Largest inverse dispersion kept (beyond it the NB is a Poisson to rounding).
MAX_THETA = 1e8


@dataclass(frozen=True)
class NoLatentBaseline:
    """Per-batch gene shares and per-gene inverse dispersions of the baseline.

    Attributes
    ----------
    batches
        Batch labels, in the order of the rows of ``shares``.
    shares
        (batches, genes), each row summing to 1.
    theta
        (genes,) inverse dispersion; :data:`MAX_THETA` means Poisson.

    """

    batches: list[str]
    shares: np.ndarray
    theta: np.ndarray


def fit_baseline(counts: sp.spmatrix | np.ndarray, batches: np.ndarray | None = None) -> NoLatentBaseline:
    """Estimate the baseline's shares and dispersions from (cells, genes) counts and each cell's batch."""
    x = sp.csr_matrix(counts, dtype=np.float64)
    n_cells, n_genes = x.shape
    labels = np.full(n_cells, "all") if batches is None else np.asarray(batches).astype(str)
    names = sorted({str(v) for v in labels})
    library = np.asarray(x.sum(axis=1)).ravel()
    shares = np.empty((len(names), n_genes))
    # sum_n (x - mu)^2 - mu over cells, from sparse sums: x^2 - 2 x mu + mu^2 - mu with mu = l_n p_bg.
    excess = np.asarray(x.multiply(x).sum(axis=0)).ravel()
    squares = np.zeros(n_genes)
    for k, name in enumerate(names):
        rows = labels == name
        xb, lb = x[rows], library[rows]
        totals = np.asarray(xb.sum(axis=0)).ravel() + 0.5
        shares[k] = totals / totals.sum()
        cross = np.asarray(xb.T @ lb).ravel()
        squares += shares[k] ** 2 * np.sum(lb**2)
        excess += -2.0 * shares[k] * cross + shares[k] ** 2 * np.sum(lb**2) - shares[k] * np.sum(lb)
    with np.errstate(divide="ignore", invalid="ignore"):
        theta = np.where(excess > 0, squares / excess, MAX_THETA)
    return NoLatentBaseline(names, shares, np.clip(theta, 1e-4, MAX_THETA))


def baseline_log_likelihood(
    model: NoLatentBaseline, counts: sp.spmatrix | np.ndarray, batches: np.ndarray | None = None
) -> np.ndarray:
    """Per-cell ``log p(x | library size)`` under the baseline, in nats (higher is better).

    Cells of a batch the baseline was not estimated on get the shares pooled over its batches.
    """
    dense = sp.csr_matrix(counts, dtype=np.float64).toarray()
    library = dense.sum(axis=1)
    pooled = model.shares.mean(axis=0)
    if batches is None:
        share = np.broadcast_to(pooled, dense.shape)
    else:
        position = {name: k for k, name in enumerate(model.batches)}
        share = np.stack([model.shares[position[str(v)]] if str(v) in position else pooled for v in batches])
    mu = np.maximum(library[:, None] * share, 1e-300)
    theta = model.theta[None, :]
    log_nb = (
        gammaln(dense + theta)
        - gammaln(theta)
        - gammaln(dense + 1.0)
        + theta * (np.log(theta) - np.log(theta + mu))
        + dense * (np.log(mu) - np.log(theta + mu))
    )
    log_poisson = dense * np.log(mu) - mu - gammaln(dense + 1.0)
    return np.where(theta >= MAX_THETA, log_poisson, log_nb).sum(axis=1)


def normalized_counts_pca(counts: sp.spmatrix | np.ndarray, n_components: int, seed: int = 0) -> np.ndarray:
    """The cells' principal components of ``log1p`` counts per 10,000, (cells, components), without a model.

    What an analyst embeds before any model (scanpy's ``normalize_total(target_sum=1e4)``, ``log1p``, ``pca``
    on unscaled genes): the no-model reference of the batch-mixing section. Computed on the sparse matrix
    (scikit-learn's PCA with ARPACK centres implicitly); a cell without counts stays at zero before centring.
    At most ``min(cells, genes) - 1`` components are returned (ARPACK's limit).
    """
    x = sp.csr_matrix(counts, dtype=np.float64)
    library = np.asarray(x.sum(axis=1)).ravel()
    scale = np.divide(1e4, library, out=np.zeros_like(library), where=library > 0)
    normalized = sp.diags(scale) @ x
    normalized.data = np.log1p(normalized.data)
    n = min(int(n_components), min(normalized.shape) - 1)
    if n < 1:
        raise InvalidDataError(f"A PCA needs at least 2 cells and 2 genes; got {normalized.shape}.")
    return PCA(n_components=n, svd_solver="arpack", random_state=seed).fit_transform(normalized)
