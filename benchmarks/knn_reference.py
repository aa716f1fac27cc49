"""k-NN graphs that only the benchmarks use: the exact 0/1 graph with Leiden on it, and the analyst's graph.

``knn_adjacency`` and ``leiden_labels`` are the plain exact k-NN graph and its
Leiden clusters, the reference ``bench_leiden_graph.py`` compares scanpy's graph
(what the report clusters) against. ``analyst_graph_k`` and ``knn_sets_among``
let ``calibration_regimes_summary.py`` compare the report's k-NN overlap with
that of the graph an analyst builds on all of their cells.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from sklearn.neighbors import NearestNeighbors, kneighbors_graph

from countvae.diagnostics.analyses.downstream import _require
from countvae.errors import InvalidArgumentError


def knn_adjacency(latent: np.ndarray, n_neighbors: int = 15) -> sp.csr_matrix:
    """Symmetric 0/1 adjacency of the exact ``n_neighbors``-nearest-neighbour graph (Euclidean).

    Cells ``i`` and ``j`` are joined when either is among the other's nearest
    neighbours. Exact search makes the graph a deterministic function of the
    latent, so the only randomness left in clustering it is the clustering seed.
    This is not the graph scanpy builds (:func:`scanpy_graph` weights the edges by
    UMAP's fuzzy connectivities and searches approximately for large data); the
    report clusters scanpy's graph, and this one is the reference of
    ``benchmarks/bench_leiden_graph.py``.
    """
    latent = np.asarray(latent, dtype=np.float64)
    if latent.ndim != 2 or n_neighbors >= latent.shape[0]:
        raise InvalidArgumentError(
            f"A {n_neighbors}-NN graph needs a (cells, dims) array with more than {n_neighbors} cells, "
            f"got shape {latent.shape}."
        )
    graph = kneighbors_graph(latent, n_neighbors, mode="connectivity", include_self=False)
    return graph.maximum(graph.T).tocsr()


def leiden_labels(adjacency: sp.spmatrix, resolution: float = 1.0, seed: int = 0, n_iterations: int = -1) -> np.ndarray:
    """Leiden clusters (RB configuration model, modularity at ``resolution``) of an undirected graph.

    Parameters
    ----------
    adjacency
        Symmetric adjacency, e.g. from :func:`knn_adjacency`.
    resolution
        Resolution parameter; larger gives more clusters.
    seed
        Seed of Leiden's random node order and moves.
    n_iterations
        Leiden iterations; negative: until no move improves the partition.

    Returns
    -------
    numpy.ndarray
        Integer cluster label of each node.

    """
    ig = _require("igraph", "Leiden clustering")
    leidenalg = _require("leidenalg", "Leiden clustering")
    upper = sp.triu(sp.csr_matrix(adjacency), k=1).tocoo()
    graph = ig.Graph(n=adjacency.shape[0], edges=np.column_stack([upper.row, upper.col]).tolist())
    partition = leidenalg.find_partition(
        graph,
        leidenalg.RBConfigurationVertexPartition,
        resolution_parameter=float(resolution),
        seed=int(seed),
        n_iterations=int(n_iterations),
    )
    return np.asarray(partition.membership, dtype=np.int64)


def analyst_graph_k(k: int, n_cells: int, n_graph_cells: int) -> int:
    """Neighbours per cell on ``n_cells`` cells that speak about a ``k``-NN graph built on ``n_graph_cells``.

    A k-NN overlap depends on the number of cells: ``k = 15`` neighbours among
    300 cells reach as far as 15 x (1,800 / 300) = 90 would among 1,800, and
    coarse neighbourhoods agree more than fine ones (on semi-synthetic MLP fits
    the worst-pair overlap at ``k = 15`` was 0.37 on 300 cells against 0.16 on
    the analyst's 1,800; benchmarks/RESULTS.md, calibration-regimes). Keeping
    the neighbourhood's share of the cells, ``k n_cells / n_graph_cells``
    (rounded, at least 1), makes the overlap on a subset estimate that of the
    analyst's graph (0.15 at ``k = 2`` in the same fits).

    Parameters
    ----------
    k
        Neighbours per cell of the analyst's graph (the report's ``k``).
    n_cells
        Cells the overlap is computed on (e.g. the held-out cells).
    n_graph_cells
        Cells of the analyst's graph (e.g. every cell of the data set: fit and held-out).

    """
    if k < 1 or n_cells < 2 or n_graph_cells < n_cells:
        raise InvalidArgumentError(
            f"analyst_graph_k needs k >= 1, at least 2 cells and a graph of at least as many cells as are compared; "
            f"got k={k}, n_cells={n_cells}, n_graph_cells={n_graph_cells}."
        )
    return int(min(max(1, round(k * n_cells / n_graph_cells)), n_cells - 1))


def knn_sets_among(z_query: np.ndarray, z_reference: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` nearest other cells of each query cell among the query and reference cells together.

    The rows of the query cells in the k-NN graph of all the cells (indices
    into ``[z_query; z_reference]``): with the fit cells as reference, the
    held-out rows of the graph an analyst builds on all of their cells. Two
    fits' neighbour sets are comparable when both stack the same cells in the
    same order.
    """
    z_query, z_reference = np.asarray(z_query), np.asarray(z_reference)
    if z_query.ndim != 2 or z_reference.ndim != 2 or z_query.shape[1] != z_reference.shape[1]:
        raise InvalidArgumentError(
            f"Query and reference latents must be (cells, dims) of the same width; got {z_query.shape} and "
            f"{z_reference.shape}."
        )
    stacked = np.vstack([z_query, z_reference])
    if k >= len(stacked):
        raise InvalidArgumentError(f"k={k} neighbours need more than {k} cells, got {len(stacked)}.")
    idx = NearestNeighbors(n_neighbors=k + 1).fit(stacked).kneighbors(z_query, return_distance=False)
    is_other = idx != np.arange(len(z_query))[:, None]
    order = np.argsort(~is_other, axis=1, kind="stable")
    return np.take_along_axis(idx, order, axis=1)[:, :k]
