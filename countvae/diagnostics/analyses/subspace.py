"""Rotation-invariant comparisons of two fits: gene-space spans, CKA, k-NN graphs, covariance spectra.

Every quantity here is unchanged when one fit's latents are replaced by ``z Q^T`` and its decoder by ``f(Q^T z)``
for an orthogonal ``Q``: the principal angles between gene-space spans (the span of ``W`` equals that of ``W Q^T``),
linear CKA (``(ZQ)^T (ZQ) = Q^T Z^T Z Q`` has the same Frobenius norm), the k-nearest-neighbour sets (distances are
preserved) and the eigenvalues of the latent covariance: what two seeds can be compared on without aligning them.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import combinations

import numpy as np
import pandas as pd
from scipy.linalg import orth, subspace_angles
from sklearn.neighbors import NearestNeighbors
from sklearn.utils.extmath import randomized_svd

from countvae.errors import InvalidArgumentError

#: Cells whose k-NN graphs are compared at most (the k-NN search is O(n log n) per fit).
MAX_KNN_CELLS = 5_000


def principal_angles(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Principal angles (radians, smallest first) between the column spans of ``a`` and ``b``.

    Parameters
    ----------
    a, b
        Matrices with the same number of rows (e.g. genes x latent loadings).

    Returns
    -------
    numpy.ndarray
        ``min(rank a, rank b)`` angles in ``[0, pi/2]``; their cosines are the subspaces' canonical correlations.

    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[0]:
        raise InvalidArgumentError(
            f"Principal angles need two matrices with equal row counts, got {a.shape}, {b.shape}."
        )
    return np.sort(subspace_angles(a, b))


def subspace_overlap(angles: np.ndarray) -> float:
    """Mean squared cosine of the principal angles: 1 for equal spans, 0 for orthogonal ones."""
    return float(np.mean(np.cos(angles) ** 2))


def gene_contrasts(jacobians: np.ndarray) -> np.ndarray:
    """Decoder Jacobians (cells, genes, L) with each cell's mean over genes removed, per latent direction.

    A decoder that outputs each gene's share of the library (a softmax, as countvae's and scVI's do) moves every
    gene's log rate by the same amount whenever the normaliser changes: its Jacobian of the log rate holds a
    component along the all-ones gene vector whose size varies from cell to cell. That direction is the
    normalisation of the shares, not an expression programme, yet over many cells it adds one more direction to the
    stacked Jacobians (measured on the embedded demo: a sixth singular value of 0.76 of the first for 5 latent
    dimensions, so the top 5 directions of two seeds overlapped by 0.89-0.99; without it, 0.999). Removing each
    cell's gene mean keeps exactly the contrasts between genes.
    """
    jac = np.asarray(jacobians, dtype=np.float64)
    return jac - jac.mean(axis=1, keepdims=True)


def jacobian_span(jacobians: np.ndarray, rank: int, seed: int = 0) -> np.ndarray:
    """Leading gene-space directions of decoder Jacobians stacked over cells, scaled by their singular values.

    Parameters
    ----------
    jacobians
        (cells, genes, n_latent) derivatives of each gene's log rate with respect to ``z``.
    rank
        Number of directions returned (usually ``n_latent``).
    seed
        Seed of the randomized SVD.

    Returns
    -------
    numpy.ndarray
        ``U diag(s)``, (genes, rank): the top-``rank`` left singular vectors ``U`` of the stacked Jacobians, each
        scaled by its singular value ``s`` (the root of the Jacobian energy along it, over cells). Its column span
        is the gene-space span of the decoder (for a linear decoder, the span of the loadings); the scaling lets
        :func:`weighted_overlap` weigh each direction by how much the decoder uses it. For an MLP decoder the
        stacked Jacobians are not of rank ``n_latent`` (they vary over cells), so the last of the ``rank``
        directions can be poorly determined.

    """
    n_cells, n_genes, n_latent = jacobians.shape
    stacked = np.transpose(jacobians, (1, 0, 2)).reshape(n_genes, n_cells * n_latent)
    rank = min(rank, *stacked.shape)
    u, sv, _ = randomized_svd(stacked.astype(np.float64), n_components=rank, n_iter=4, random_state=seed)
    return u * sv


def weighted_overlap(a: np.ndarray, b: np.ndarray) -> float:
    """Share of each basis' squared norm that lies in the other's column span, averaged over both directions.

    With ``a = U_a diag(s_a)`` this is ``sum_i s_i^2 cos^2(u_i, span b) / sum_i s_i^2``: the fraction of one fit's
    decoder variation (in gene space) that the other fit's span contains. 1 for equal spans; unlike the mean
    ``cos^2`` of the principal angles it is not driven by weak, poorly determined directions. Invariant under
    rotations of either latent space (``a -> a Q``). The spans are orthonormal bases of rank-revealing SVDs: a basis
    with a zero (or dependent) column spans fewer directions than it has columns, and a QR factor would add an
    arbitrary one.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[0]:
        raise InvalidArgumentError(f"Overlap needs two matrices with equal row counts, got {a.shape}, {b.shape}.")
    qa, qb = orth(a), orth(b)
    share_a = np.linalg.norm(qb.T @ a) ** 2 / np.linalg.norm(a) ** 2
    share_b = np.linalg.norm(qa.T @ b) ** 2 / np.linalg.norm(b) ** 2
    return float(0.5 * (share_a + share_b))


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear centred kernel alignment (Kornblith et al., 2019) of two representations of the same cells.

    ``||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F)`` on column-centred ``X``, ``Y``: 1 when ``Y`` is a rotation (and
    scaling) of ``X``, near 0 for unrelated data.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape[0] != y.shape[0]:
        raise InvalidArgumentError(f"CKA compares the same cells; got {x.shape[0]} and {y.shape[0]} rows.")
    x, y = x - x.mean(0), y - y.mean(0)
    cross = np.linalg.norm(y.T @ x) ** 2
    denom = np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)
    return float(cross / denom) if denom > 0 else np.nan


def knn_sets(z: np.ndarray, k: int) -> np.ndarray:
    """Indices of each cell's ``k`` nearest other cells (Euclidean), (cells, k)."""
    return knn_sets_among(z, z[:0], k)


def knn_sets_among(z_query: np.ndarray, z_reference: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` nearest other cells of each query cell among the query and reference cells together.

    The query cells' rows of the k-NN graph of all the cells, as indices into ``[z_query; z_reference]``: with the
    fit cells as reference, the held-out rows of the graph an analyst builds on all of their cells. Two fits'
    neighbour sets are comparable when both stack the same cells in the same order.
    """
    z_query, z_reference = np.asarray(z_query), np.asarray(z_reference)
    if z_query.ndim != 2 or z_reference.ndim != 2 or z_query.shape[1] != z_reference.shape[1]:
        raise InvalidArgumentError(
            f"Query and reference latents must be (cells, dims) of the same width; got {z_query.shape} and "
            f"{z_reference.shape}."
        )
    stacked = np.vstack([z_query, z_reference]) if len(z_reference) else z_query
    if k >= len(stacked):
        raise InvalidArgumentError(f"k={k} neighbours need more than {k} cells, got {len(stacked)}.")
    # Brute force rather than sklearn's default tree: latent means are nearly full-rank in their 5-30 dimensions,
    # where a tree prunes little (on Kang's 10-d latents and guide draws 0.27-0.37 s a query of 8,700 cells, against
    # 0.20-0.22 s by brute force, with the same neighbours). On the report's largest graphs, every cell of a data set,
    # the tree gains little more: 5,000 queries among 100,000 cells' 10-d latent means took 1.3 s against 1.6 s.
    idx = NearestNeighbors(n_neighbors=k + 1, algorithm="brute").fit(stacked).kneighbors(z_query, return_distance=False)
    # Drop each cell itself (not always in column 0 when there are exact ties).
    is_other = idx != np.arange(len(z_query))[:, None]
    order = np.argsort(~is_other, axis=1, kind="stable")
    return np.take_along_axis(idx, order, axis=1)[:, :k]


def analyst_graph_k(k: int, n_cells: int, n_graph_cells: int) -> int:
    """Neighbours per cell on ``n_cells`` cells that speak about a ``k``-NN graph built on ``n_graph_cells``.

    A k-NN overlap depends on the number of cells: ``k = 15`` neighbours among 300 cells reach as far as
    15 x (1,800 / 300) = 90 would among 1,800, and coarse neighbourhoods agree more than fine ones (on semi-synthetic
    MLP fits the worst-pair overlap at ``k = 15`` was 0.37 on 300 cells against 0.16 on the analyst's 1,800;
    benchmarks/RESULTS.md, calibration-regimes). Keeping the neighbourhood's share of the cells,
    ``k n_cells / n_graph_cells`` (rounded, at least 1, at most ``n_cells - 1``), makes the overlap on a subset
    estimate that of the analyst's graph (0.15 at ``k = 2`` in the same fits); on more cells than the analyst's
    (e.g. an oracle pool) it scales ``k`` up. The rounding of a small ``k`` is a large error (on 100,000 cells a
    15,000-cell subset read 0.26, 0.31 and 0.38 at ``k`` = 1, 2 and 3, where the graph on all the cells overlaps
    0.28), so the report's k-NN row finds its neighbours among every cell it has and scales ``k`` only for cells it
    does not have (a report on held-out cells only, or guide draws of a subset).

    Parameters
    ----------
    k
        Neighbours per cell of the analyst's graph (the report's ``k``).
    n_cells
        Cells the graph is built on here (e.g. held-out cells and a subset of the fit cells).
    n_graph_cells
        Cells of the analyst's graph (e.g. every cell of the data set: fit and held-out).

    """
    if k < 1 or n_cells < 2 or n_graph_cells < 2:
        raise InvalidArgumentError(
            f"analyst_graph_k needs k >= 1 and at least 2 cells on both graphs; got k={k}, n_cells={n_cells}, "
            f"n_graph_cells={n_graph_cells}."
        )
    return int(min(max(1, round(k * n_cells / n_graph_cells)), n_cells - 1))


def knn_jaccard_per_cell(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-cell Jaccard overlap of two neighbour-index arrays of shape (cells, k)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.ndim != 2:
        raise InvalidArgumentError(f"Neighbour arrays must be (cells, k) of one shape; got {a.shape} and {b.shape}.")
    k = a.shape[1]
    shared = np.empty(len(a), dtype=np.int64)
    rows = max(1, 4_000_000 // max(1, k * k))  # a (rows, k, k) comparison block of at most 4 million entries
    for start in range(0, len(a), rows):
        block = slice(start, start + rows)
        # each row holds distinct indices, so the matching pairs count the shared neighbours
        shared[block] = (a[block, :, None] == b[block, None, :]).sum(axis=(1, 2))
    return shared / (2 * k - shared)


def covariance_spectrum(z: np.ndarray) -> np.ndarray:
    """Eigenvalues of the latent covariance, largest first."""
    z = np.asarray(z, dtype=np.float64)
    return np.sort(np.linalg.eigvalsh(np.cov(z, rowvar=False).reshape(z.shape[1], z.shape[1])))[::-1]


def spectrum_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Relative difference of two covariance spectra: ``||a - b|| / sqrt(||a|| ||b||)``."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise InvalidArgumentError(f"Spectra of different lengths cannot be compared: {a.shape} vs {b.shape}.")
    scale = np.sqrt(np.linalg.norm(a) * np.linalg.norm(b))
    return float(np.linalg.norm(a - b) / scale) if scale > 0 else np.nan


def subsample(n: int, max_n: int, seed: int) -> np.ndarray:
    """Sorted positions of at most ``max_n`` of ``n`` items, at random (all when ``n <= max_n``)."""
    if n <= max_n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, max_n, replace=False))


def geometry_table(
    latents: Mapping[str, np.ndarray],
    spans: Mapping[str, np.ndarray] | None = None,
    k: int = 15,
    max_knn_cells: int = MAX_KNN_CELLS,
    seed: int = 0,
) -> pd.DataFrame:
    """Rotation-invariant comparison of every pair of fits.

    Parameters
    ----------
    latents
        Fit name -> latent means on the same cells.
    spans
        Fit name -> gene-space basis (genes, rank), e.g. from :func:`jacobian_span` or linear loadings; skipped when
        ``None``.
    k
        Neighbours per cell for the k-NN overlap.
    max_knn_cells
        Cells the k-NN graphs are built on at most (a random subset, the same for all fits).
    seed
        Seed of that subset.

    Returns
    -------
    pandas.DataFrame
        One row per pair: ``fit_a``, ``fit_b``, ``cka``, ``knn_jaccard``, ``k``, ``n_knn_cells``, ``spectrum_distance``,
        and with spans ``weighted_overlap`` (see :func:`weighted_overlap`), ``subspace_overlap`` (mean cos^2 of the
        principal angles), ``max_angle_deg``, ``mean_angle_deg`` and ``angles_deg`` (all angles, smallest first).

    """
    names = list(latents)
    if len(names) < 2:
        raise InvalidArgumentError("Comparing geometry needs at least two fits.")
    n = len(next(iter(latents.values())))
    keep = subsample(n, max_knn_cells, seed)
    k_eff = min(k, len(keep) - 1)
    neighbours = {name: knn_sets(np.asarray(z)[keep], k_eff) for name, z in latents.items()}
    spectra = {name: covariance_spectrum(z) for name, z in latents.items()}
    rows = []
    for a, b in combinations(names, 2):
        row = {
            "fit_a": a,
            "fit_b": b,
            "cka": linear_cka(latents[a], latents[b]),
            "knn_jaccard": float(np.mean(knn_jaccard_per_cell(neighbours[a], neighbours[b]))),
            "k": k_eff,
            "n_knn_cells": len(keep),
            "spectrum_distance": spectrum_distance(spectra[a], spectra[b]),
        }
        if spans is not None:
            angles = np.degrees(principal_angles(spans[a], spans[b]))
            row.update(
                weighted_overlap=weighted_overlap(spans[a], spans[b]),
                subspace_overlap=subspace_overlap(np.radians(angles)),
                max_angle_deg=float(angles.max()),
                mean_angle_deg=float(angles.mean()),
                angles_deg=[float(v) for v in angles],
            )
        rows.append(row)
    return pd.DataFrame(rows)
