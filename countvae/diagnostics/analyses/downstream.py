"""How much of the seed-to-seed variation of downstream results is the model's (arrays in, frames out).

Analysts publish differentially expressed genes, clusters and embeddings, not latent coordinates. Each of these
changes between two fits with different seeds for two reasons: the fits differ (the model's share), and the
downstream step is itself random (Monte Carlo draws of the DE posterior, the Leiden seed, the UMAP seed). The
functions here separate the two by comparing

* **between fits**: results of two fits with different model seeds, each with its own downstream randomness, and
* **within a fit** (the baseline): two results of *one* fit that differ only in the downstream seed (two DE sampling
  seeds; two Leiden seeds on the same k-NN graph; two UMAP seeds on the same graph).

For an agreement score ``a`` (1 = identical; Jaccard, Spearman, ARI, NMI, k-NN overlap) the disagreement is
``d = 1 - a``. With ``d_between`` and ``d_within`` the mean disagreements of the between-fit and within-fit pairs,

    model_share = (d_between - d_within) / d_between, clipped to [0, 1],

the fraction of the between-seed disagreement that the downstream randomness alone does not produce (NaN when
``d_between = 0``: nothing varies). 0 means re-running the downstream step on one fit already moves the result as
much as refitting does; 1 means the downstream step is reproducible and every change comes from the fit. It is a
difference of means over few pairs: read it with the pair counts and the per-pair table, not to two decimals.

Clusters and embeddings are computed as an analyst computes them in scanpy: the neighbour graph of
``sc.pp.neighbors(adata, use_rep=...)`` (UMAP's fuzzy connectivities), clustered by ``sc.tl.leiden`` and embedded by
``sc.tl.umap`` (:func:`scanpy_graph`, :func:`scanpy_leiden`, :func:`umap_embedding`), so the stability reported is
that of the clusters that get published: for the same latent, neighbours, resolution and seed, the labels are
scanpy's own. The plain exact k-NN graph it replaced is in ``benchmarks/knn_reference.py``.

scanpy, Leiden (``igraph``, ``leidenalg``) and UMAP (``umap-learn``) are the optional extra
``countvae[downstream]``; the k-NN, DE and label-agreement functions need only scikit-learn and scipy.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from itertools import combinations
from types import ModuleType

import anndata as ad
import numpy as np
import pandas as pd
from scipy.stats import hypergeom, spearmanr
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from countvae.diagnostics.analyses.subspace import knn_jaccard_per_cell, knn_sets
from countvae.errors import InvalidArgumentError, MissingDependencyError
from countvae.model.de_statistics import jaccard

BETWEEN = "between fits"
WITHIN = "within fit"


def _require(module: str, feature: str) -> ModuleType:
    """Import an optional dependency or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"{feature} needs the package {module!r}, which cannot be imported ({exc}); install the optional "
            "dependencies with `pip install 'countvae[downstream]'` (scanpy, igraph, leidenalg, umap-learn)."
        ) from None


# ----- agreement scores ------------------------------------------------------------------------------
def rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation of two per-gene values (e.g. LFCs); NaN if either is constant."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise InvalidArgumentError(f"Values over different genes: shapes {a.shape} and {b.shape}.")
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(spearmanr(a, b)[0])


def neighbourhood_overlap(a: np.ndarray, b: np.ndarray, k: int = 15) -> float:
    """Mean over cells of the Jaccard overlap of the cell's ``k`` nearest neighbours in ``a`` and in ``b``.

    ``a`` and ``b`` are two representations of the same cells (latent means, UMAP coordinates). 1 when every cell
    keeps its neighbours; about ``k / (2 n)`` for unrelated representations of ``n`` cells.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape[0] != b.shape[0]:
        raise InvalidArgumentError(f"Neighbourhoods compare the same cells; got {a.shape[0]} and {b.shape[0]} rows.")
    return float(np.mean(knn_jaccard_per_cell(knn_sets(a, k), knn_sets(b, k))))


def chance_jaccard(n_a: int, n_b: int, n_genes: int) -> float:
    """Expected Jaccard index of two call sets of sizes ``n_a`` and ``n_b`` drawn at random from ``n_genes`` genes.

    The agreement two DE runs would reach by chance alone, with no shared signal: the shared count ``X`` is
    hypergeometric, and ``E[X / (n_a + n_b - X)]`` is summed exactly. 1 when both sets are empty
    (:func:`~countvae.model.de_statistics.jaccard`'s convention).
    """
    if not 0 <= n_a <= n_genes or not 0 <= n_b <= n_genes:
        raise InvalidArgumentError(f"Call sets of sizes {n_a} and {n_b} do not fit in {n_genes} genes.")
    if n_a == 0 and n_b == 0:
        return 1.0
    shared = np.arange(max(0, n_a + n_b - n_genes), min(n_a, n_b) + 1)
    probability = hypergeom.pmf(shared, n_genes, n_a, n_b)
    return float(np.sum(probability * shared / (n_a + n_b - shared)))


# ----- the decomposition -----------------------------------------------------------------------------
def model_share(between: Sequence[float], within: Sequence[float]) -> dict[str, float]:
    """Split the between-fit disagreement into the downstream baseline and the model's excess.

    Parameters
    ----------
    between
        Agreement scores of pairs of fits with different model seeds.
    within
        Agreement scores of pairs of results of one fit that differ only in the downstream seed. Empty when the
        downstream step is deterministic (its disagreement is then 0).

    Returns
    -------
    dict
        ``between_mean``, ``between_min``, ``within_mean`` (NaN without pairs), ``n_between``, ``n_within``,
        ``disagreement_between``, ``disagreement_within``, ``model_excess`` (their difference) and ``model_share``
        (see the module docstring).

    """
    between = np.asarray(list(between), dtype=np.float64)
    within = np.asarray(list(within), dtype=np.float64)
    if between.size == 0:
        raise InvalidArgumentError("model_share needs at least one pair of fits (two model seeds).")
    d_between = 1.0 - float(np.nanmean(between))
    d_within = 1.0 - float(np.nanmean(within)) if within.size else 0.0
    excess = d_between - d_within
    share = float(np.clip(excess / d_between, 0.0, 1.0)) if d_between > 0 else float("nan")
    return {
        "between_mean": float(np.nanmean(between)),
        "between_min": float(np.nanmin(between)),
        "within_mean": float(np.nanmean(within)) if within.size else float("nan"),
        "n_between": int(between.size),
        "n_within": int(within.size),
        "disagreement_between": d_between,
        "disagreement_within": d_within,
        "model_excess": excess,
        "model_share": share,
    }


def summarize(pairs: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """One row per metric of a pair table (column ``kind``: between/within fits) with :func:`model_share`."""
    rows = []
    for metric in metrics:
        between = pairs.loc[pairs["kind"] == BETWEEN, metric].to_numpy()
        within = pairs.loc[pairs["kind"] == WITHIN, metric].to_numpy()
        rows.append({"metric": metric, **model_share(between, within)})
    return pd.DataFrame(rows)


def _agreement(
    results: Mapping[str, object],
    resampled: Mapping[str, object],
    scores: Mapping[str, Callable[[object, object], float]],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Scores of every pair of fits (``results``) and of each fit against its own resampled result, summarized."""
    if len(results) < 2:
        raise InvalidArgumentError(f"Comparing fits needs at least two, got {len(results)}.")
    unknown = sorted(set(resampled) - set(results))
    if unknown:
        raise InvalidArgumentError(f"Resampled results for fits that have no result: {unknown}.")
    rows = [
        {"kind": BETWEEN, "fit_a": a, "fit_b": b, **{n: f(results[a], results[b]) for n, f in scores.items()}}
        for a, b in combinations(results, 2)
    ]
    for a, other in resampled.items():
        rows.append({"kind": WITHIN, "fit_a": a, "fit_b": a, **{n: f(results[a], other) for n, f in scores.items()}})
    pairs = pd.DataFrame(rows)
    return pairs, summarize(pairs, list(scores))


# ----- differential expression -------------------------------------------------------------------------
def de_agreement(
    calls: Mapping[str, np.ndarray],
    lfc: Mapping[str, np.ndarray],
    resampled_calls: Mapping[str, np.ndarray],
    resampled_lfc: Mapping[str, np.ndarray],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Agreement of DE results between fits, against two sampling seeds of one fit.

    Parameters
    ----------
    calls, lfc
        Fit name -> boolean calls and LFC estimates (e.g. ``lfc_mean``) per gene, in one gene order, each computed
        with the fit's own sampling seed.
    resampled_calls, resampled_lfc
        Fit name -> the same for (some of) the fits recomputed with another sampling seed: the Monte Carlo baseline.

    Returns
    -------
    pairs, summary
        ``pairs``: one row per pair (``kind``, ``fit_a``, ``fit_b``, ``jaccard`` of the calls, ``spearman`` of the
        LFCs). ``summary``: one row per metric with :func:`model_share`.

    """
    if set(calls) != set(lfc) or set(resampled_calls) != set(resampled_lfc):
        raise InvalidArgumentError("calls and lfc (and their resampled versions) must name the same fits.")
    results = {name: (np.asarray(calls[name], bool), np.asarray(lfc[name], float)) for name in calls}
    resampled = {
        name: (np.asarray(resampled_calls[name], bool), np.asarray(resampled_lfc[name], float))
        for name in resampled_calls
    }
    scores = {"jaccard": lambda x, y: jaccard(x[0], y[0]), "spearman": lambda x, y: rank_correlation(x[1], y[1])}
    return _agreement(results, resampled, scores)


# ----- clusters -------------------------------------------------------------------------------------------
def label_agreement(
    labels: Mapping[str, np.ndarray], resampled_labels: Mapping[str, np.ndarray]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """ARI and NMI of cluster labels between fits, against two clustering seeds of one fit.

    Parameters
    ----------
    labels
        Fit name -> cluster label of each cell (same cells, same order).
    resampled_labels
        Fit name -> labels of the same fit's graph clustered with another seed.

    Returns
    -------
    pairs, summary
        As :func:`de_agreement`, with metrics ``ari`` and ``nmi``.

    """
    scores = {"ari": adjusted_rand_score, "nmi": normalized_mutual_info_score}
    return _agreement(
        {k: np.asarray(v) for k, v in labels.items()}, {k: np.asarray(v) for k, v in resampled_labels.items()}, scores
    )


def cluster_agreement(
    latents: Mapping[str, np.ndarray],
    n_neighbors: int = 15,
    resolution: float = 1.0,
    seeds: tuple[int, int] = (0, 1),
    flavor: str = "igraph",
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Leiden clusters (scanpy's) of each fit's neighbour graph, compared between fits and between two Leiden seeds.

    Each fit's graph is built once from its latent means (:func:`scanpy_graph`) and clustered
    (:func:`scanpy_leiden`) with ``seeds[0]`` (compared between fits) and ``seeds[1]`` (the baseline).

    Returns
    -------
    pairs, summary
        As :func:`label_agreement`.

    """
    if seeds[0] == seeds[1]:
        raise InvalidArgumentError("The baseline needs two different Leiden seeds.")
    labels, resampled = {}, {}
    for name, latent in latents.items():
        graph = scanpy_graph(latent, n_neighbors)
        labels[name] = scanpy_leiden(graph, resolution, seeds[0], flavor)
        resampled[name] = scanpy_leiden(graph, resolution, seeds[1], flavor)
    return label_agreement(labels, resampled)


# ----- scanpy's graph -------------------------------------------------------------------------------------
#: ``obsm`` key of the latent in the AnnData :func:`scanpy_graph` builds.
GRAPH_REP = "X_latent"
#: Leiden implementations of ``sc.tl.leiden`` -> the settings countvae passes with them (scanpy's
#: recommended ones for "igraph"; scanpy's defaults for "leidenalg").
LEIDEN_FLAVORS = {
    "igraph": {"flavor": "igraph", "n_iterations": 2, "directed": False},
    "leidenalg": {"flavor": "leidenalg"},
}


def scanpy_graph(latent: np.ndarray, n_neighbors: int = 15) -> ad.AnnData:
    """An AnnData holding ``latent`` in ``obsm["X_latent"]`` and scanpy's neighbour graph of it.

    The graph is ``sc.pp.neighbors(adata, use_rep="X_latent", n_neighbors=n_neighbors)`` with scanpy's defaults
    otherwise (Euclidean, UMAP connectivities, ``random_state=0``), the graph an analyst builds from
    ``obsm["X_countvae"]``. The latent is held as float32, the type ``CountVAE.get_latent_representation`` returns
    (and ``write_results`` stores), so that the distances are the analyst's.
    """
    sc = _require("scanpy", "scanpy's neighbour graph")
    latent = np.asarray(latent, dtype=np.float32)
    if latent.ndim != 2 or n_neighbors >= latent.shape[0]:
        raise InvalidArgumentError(
            f"A {n_neighbors}-NN graph needs a (cells, dims) array with more than {n_neighbors} cells, "
            f"got shape {latent.shape}."
        )
    adata = ad.AnnData(obs=pd.DataFrame(index=pd.RangeIndex(latent.shape[0]).astype(str)))
    adata.obsm[GRAPH_REP] = latent
    try:
        sc.pp.neighbors(adata, use_rep=GRAPH_REP, n_neighbors=int(n_neighbors))
    except AttributeError as error:
        if "getnnz" not in str(error):
            raise
        # From 8,192 cells scanpy asks pynndescent for the neighbours; pynndescent 0.7 returns a scipy sparse
        # array, which scanpy 1.11 cannot read. The package's extras bound pynndescent; another environment may not.
        raise MissingDependencyError(
            f"scanpy {importlib.metadata.version('scanpy')} cannot read the neighbour matrix of pynndescent "
            f"{importlib.metadata.version('pynndescent')} ({latent.shape[0]:,} cells: scanpy uses pynndescent from "
            "8,192). Install a pynndescent it reads: pip install 'pynndescent<0.7' (or 'countvae[downstream]')."
        ) from error
    return adata


def scanpy_leiden(graph: ad.AnnData, resolution: float = 1.0, seed: int = 0, flavor: str = "igraph") -> np.ndarray:
    """``sc.tl.leiden`` labels of a graph from :func:`scanpy_graph`, as integers.

    Parameters
    ----------
    graph
        The AnnData of :func:`scanpy_graph` (not modified).
    resolution
        Leiden's resolution.
    seed
        ``random_state`` of ``sc.tl.leiden``.
    flavor
        ``"igraph"`` (``flavor="igraph", n_iterations=2, directed=False``, scanpy's recommended settings) or
        ``"leidenalg"`` (scanpy's defaults).

    Returns
    -------
    numpy.ndarray
        The cluster label of each cell (scanpy's label strings as integers).

    """
    if flavor not in LEIDEN_FLAVORS:
        raise InvalidArgumentError(f"Leiden flavor must be one of {sorted(LEIDEN_FLAVORS)}, got {flavor!r}.")
    sc = _require("scanpy", "Leiden clustering")
    _require("igraph", "Leiden clustering")
    if flavor == "leidenalg":
        _require("leidenalg", "Leiden clustering")
    work = ad.AnnData(obs=pd.DataFrame(index=graph.obs_names), uns=dict(graph.uns), obsp=dict(graph.obsp))
    with warnings.catch_warnings():
        # scanpy's notice that its default flavor will change; the flavor here is chosen explicitly
        warnings.filterwarnings("ignore", "In the future, the default backend for leiden", FutureWarning)
        sc.tl.leiden(work, resolution=float(resolution), random_state=int(seed), **LEIDEN_FLAVORS[flavor])
    return work.obs["leiden"].astype(int).to_numpy(np.int64)


# ----- embeddings ------------------------------------------------------------------------------------------
def umap_embedding(latent: np.ndarray, seed: int = 0, n_neighbors: int = 15) -> np.ndarray:
    """2-D ``sc.tl.umap`` embedding of scanpy's neighbour graph of ``latent`` with ``random_state=seed``.

    The graph is :func:`scanpy_graph`'s; the embedding uses scanpy's defaults otherwise (``min_dist=0.5``). With a
    seed the coordinates are the same for the same input on the same machine.
    """
    sc = _require("scanpy", "UMAP embedding")
    _require("umap", "UMAP embedding")
    graph = scanpy_graph(latent, n_neighbors)
    sc.tl.umap(graph, random_state=int(seed))
    return np.asarray(graph.obsm["X_umap"], dtype=np.float64)


def neighbourhood_agreement(
    representations: Mapping[str, np.ndarray], resampled: Mapping[str, np.ndarray] | None = None, k: int = 15
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """k-NN overlap of representations of the same cells between fits, against a downstream-seed baseline.

    Parameters
    ----------
    representations
        Fit name -> (cells, dims): latent means, or an embedding computed with one seed.
    resampled
        Fit name -> the same fit's embedding computed with another seed (e.g. two UMAP seeds). ``None`` for a
        deterministic representation (latent means): the baseline disagreement is then 0.
    k
        Neighbours per cell.

    Returns
    -------
    pairs, summary
        As :func:`de_agreement`, with the metric ``knn_overlap``.

    """
    scores = {"knn_overlap": lambda a, b: neighbourhood_overlap(a, b, k)}
    return _agreement(dict(representations), dict(resampled or {}), scores)


def umap_agreement(
    latents: Mapping[str, np.ndarray],
    k: int = 15,
    seeds: tuple[int, int] = (0, 1),
    n_neighbors: int = 15,
    embed: Callable[[np.ndarray, int], np.ndarray] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Embedding neighbourhoods compared between fits and between two embedding seeds of each fit.

    Parameters
    ----------
    latents
        Fit name -> latent means of the same cells.
    k
        Neighbours per cell in the embedding.
    seeds
        Embedding seed of the between-fit comparison, and the baseline's second seed.
    n_neighbors
        UMAP's neighbourhood size.
    embed
        ``embed(latent, seed) -> (cells, 2)``; default :func:`umap_embedding`.

    Returns
    -------
    pairs, summary
        As :func:`neighbourhood_agreement`.

    """
    if seeds[0] == seeds[1]:
        raise InvalidArgumentError("The baseline needs two different embedding seeds.")
    if embed is None:
        embed = partial(umap_embedding, n_neighbors=n_neighbors)
    first = {name: embed(z, seeds[0]) for name, z in latents.items()}
    second = {name: embed(z, seeds[1]) for name, z in latents.items()}
    return neighbourhood_agreement(first, second, k)
