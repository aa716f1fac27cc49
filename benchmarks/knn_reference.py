"""The k-NN graph that only the benchmarks use: the exact 0/1 graph, with Leiden on it.

``knn_adjacency`` and ``leiden_labels`` are the plain exact k-NN graph and its
Leiden clusters, the reference ``bench_leiden_graph.py`` compares scanpy's graph
(what the report clusters) against.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from sklearn.neighbors import kneighbors_graph

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
