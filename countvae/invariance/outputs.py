"""Which model outputs a latent map changes: the invariant and the coordinate-level quantities.

Under ``z' = A z`` with the decoder compensated, decoded expression is unchanged for any invertible ``A``; latent
distances, neighbour graphs and the loading Gram matrix ``W W^T`` for orthogonal ``A``; latent coordinates,
per-dimension loadings and per-dimension gene correlations change. Each quantity is computed for one model, and
:func:`output_changes` compares two.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.spatial.distance import pdist
from sklearn.neighbors import NearestNeighbors

from countvae.data.loader import CountSource
from countvae.model import CountVAE, inference
from countvae.model.training import to_tensors

#: Largest number of cells used for pairwise distances and neighbour graphs (a fixed random subset beyond).
MAX_CELLS_FOR_DISTANCES = 2000

#: Output rows of the comparison table: label, check name, and the maps that leave it unchanged.
OUTPUT_ROWS: list[tuple[str, str, str]] = [
    ("log p(x) (same noise)", "crn_max_abs_diff", "maps that preserve the prior"),
    ("posterior means Z' = Z A^T", "latent_map_max_abs_error", "any invertible map (construction)"),
    ("decoded expression", "normalized_expression_max_rel_diff", "any invertible map"),
    ("latent pairwise distances", "pairwise_distance_max_rel_diff", "orthogonal maps"),
    ("latent k-NN graph", "knn_graph_changed_fraction", "orthogonal maps"),
    ("loading Gram W W^T", "loading_gram_max_rel_diff", "orthogonal maps"),
    ("latent coordinates", "coordinates_rel_change", "none (coordinate-level)"),
    ("per-dimension loadings", "loadings_rel_change", "none (coordinate-level)"),
    ("per-dimension gene correlations", "gene_correlation_max_abs_change", "none (coordinate-level)"),
]


@dataclass
class ModelOutputs:
    """The outputs of one model on a set of cells.

    Attributes
    ----------
    latent
        Posterior means, (cells, L).
    expression
        Decoded expected counts at library size 1e4 from the posterior mean, (cells, genes).
    loadings
        Linear decoder: ``W`` (genes, L); MLP: the decoder Jacobian of the log rate averaged over the cells (genes, L).
    gram
        ``W W^T`` for a linear decoder, else ``None``.
    gene_correlations
        Pearson correlation of each latent dimension with each gene's log
        normalized counts, (genes, L); NaN for genes constant on these cells.
    distances
        Condensed pairwise Euclidean distances of the latent means (subset of cells).
    neighbours
        Each (subset) cell's ``k`` nearest neighbours in latent space, (cells, k).

    """

    latent: np.ndarray
    expression: np.ndarray
    loadings: np.ndarray
    gram: np.ndarray | None
    gene_correlations: np.ndarray
    distances: np.ndarray
    neighbours: np.ndarray


def distance_subset(n_cells: int, seed: int) -> np.ndarray:
    """Positions of the cells used for distances and neighbour graphs."""
    if n_cells <= MAX_CELLS_FOR_DISTANCES:
        return np.arange(n_cells)
    return np.sort(np.random.default_rng(seed).choice(n_cells, MAX_CELLS_FOR_DISTANCES, replace=False))


def log_normalized_counts(source: CountSource, indices: np.ndarray) -> np.ndarray:
    """``log1p(1e4 x / total)`` of the observed counts, (cells, genes), in the order of ``indices``."""
    order = np.argsort(indices)
    rows = source.rows(indices[order]).counts
    values = np.log1p(1e4 * rows / rows.sum(1, keepdims=True))
    out = np.empty_like(values)
    out[order] = values
    return out


def gene_correlations(latent: np.ndarray, log_expression: np.ndarray) -> np.ndarray:
    """Pearson correlation of every latent dimension with every gene, (genes, L); NaN for constant columns."""
    z = latent - latent.mean(0)
    e = log_expression - log_expression.mean(0)
    z_norm = np.sqrt((z**2).sum(0))
    e_norm = np.sqrt((e**2).sum(0))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (e.T @ z) / np.outer(e_norm, z_norm)


@torch.no_grad()
def _mean_jacobian(model: CountVAE, source: CountSource, indices: np.ndarray, latent: np.ndarray) -> np.ndarray:
    module = model.module.eval()
    dtype = next(module.parameters()).dtype
    order = np.argsort(indices)
    _, b = to_tensors(source.rows(indices[order]), dtype, model.device)
    z = torch.as_tensor(latent[order], dtype=dtype, device=model.device)
    columns = []
    for k in range(z.shape[-1]):
        tangent = torch.zeros_like(z)
        tangent[:, k] = 1.0
        _, column = torch.func.jvp(lambda zz: module.decode(zz, b).log_rate, (z,), (tangent,))
        columns.append(column.mean(0))
    return torch.stack(columns, dim=-1).cpu().numpy()


def model_outputs(
    model: CountVAE,
    source: CountSource,
    indices: np.ndarray,
    log_expression: np.ndarray,
    subset: np.ndarray,
    k_neighbors: int,
) -> ModelOutputs:
    """Compute :class:`ModelOutputs` for ``model`` on the given cells."""
    module = model.module
    latent = inference.latent_representation(module, source, indices)
    expression = inference.normalized_expression(module, source, indices, library_size=1e4)
    if model.settings.decoder == "linear":
        W = module.decoder.weight.detach().cpu().double().numpy()
        gram = W @ W.T
    else:
        W = _mean_jacobian(model, source, indices, latent)
        gram = None
    z_sub = latent[subset]
    k = min(k_neighbors, len(subset) - 1)
    if k >= 1:
        nn = NearestNeighbors(n_neighbors=k + 1, algorithm="brute").fit(z_sub)
        neighbours = nn.kneighbors(z_sub, return_distance=False)[:, 1:]
    else:
        neighbours = np.zeros((len(subset), 0), dtype=np.int64)
    return ModelOutputs(
        latent=latent,
        expression=expression,
        loadings=W,
        gram=gram,
        gene_correlations=gene_correlations(latent, log_expression),
        distances=pdist(z_sub),
        neighbours=neighbours,
    )


def _knn_changed_fraction(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape[1] == 0:
        return 0.0
    overlaps = [len(set(r).intersection(s)) / len(set(r).union(s)) for r, s in zip(a, b, strict=True)]
    return float(1.0 - np.mean(overlaps))


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    scale = np.linalg.norm(a)
    return float(np.linalg.norm(b - a) / scale) if scale > 0 else float(np.linalg.norm(b - a))


def output_changes(original: ModelOutputs, transformed: ModelOutputs, A: np.ndarray) -> dict[str, float]:
    """How much each output of ``transformed`` differs from ``original``, by check name (see ``OUTPUT_ROWS``)."""
    expr_scale = np.maximum(np.abs(original.expression), np.finfo(np.float64).tiny)
    dist_scale = original.distances.max() if original.distances.size else 1.0
    changes = {
        "latent_map_max_abs_error": float(np.abs(transformed.latent - original.latent @ A.T).max()),
        "normalized_expression_max_rel_diff": float(
            (np.abs(transformed.expression - original.expression) / expr_scale).max()
        ),
        "pairwise_distance_max_rel_diff": float(
            np.abs(transformed.distances - original.distances).max() / dist_scale if original.distances.size else 0.0
        ),
        "knn_graph_changed_fraction": _knn_changed_fraction(original.neighbours, transformed.neighbours),
        "coordinates_rel_change": _rel(original.latent, transformed.latent),
        "loadings_rel_change": _rel(original.loadings, transformed.loadings),
        "gene_correlation_max_abs_change": float(
            np.nanmax(np.abs(transformed.gene_correlations - original.gene_correlations))
            if np.isfinite(original.gene_correlations).any()
            else np.nan
        ),
    }
    if original.gram is not None and transformed.gram is not None:
        changes["loading_gram_max_rel_diff"] = float(
            np.abs(transformed.gram - original.gram).max() / max(np.abs(original.gram).max(), 1e-300)
        )
    return changes
