"""The numbers of the invariants table: how well the fits agree on each output, as it is and after alignment.

One row per quantity, defined by a :class:`Quantity` in the registry
:data:`QUANTITIES` (looked up by name in :data:`QUANTITY_BY_NAME`), which
carries its score function. For each: whether the model's symmetry group leaves
it unchanged in theory; how well the seeds agree on it (a number with its
definition, for the worst pair of seeds, and its mean over pairs); the same
after aligning each pair of seeds by the orthogonal Procrustes map of their
latent means (only for coordinate-level quantities, where alignment changes
anything); and its :class:`Threshold`, a number with a comparison. The verdict
and what to report instead are decided from these numbers by
:mod:`countvae.diagnostics.reporting.verdicts`.

Agreement scores
----------------
``ccc``
    Lin's concordance correlation coefficient ``2 cov(a, b) / (var a + var b +
    (mean a - mean b)^2)`` of the two seeds' values, flattened. 1 only when the
    values are equal; unlike Pearson's correlation it penalises shifts and
    changes of scale. Matrices of expression (cells x genes) are first centred
    per gene by the two seeds' pooled gene mean, so that the large spread of
    mean expression between genes does not make any two fits look alike.
``jaccard``
    Mean over cells of the Jaccard overlap of the ``k`` nearest neighbours.
``weighted overlap``
    Share of one seed's decoder variation in gene space (Jacobian or loading
    energy) that lies in the other seed's gene-space span, averaged over both
    directions (:func:`countvae.diagnostics.analyses.subspace.weighted_overlap`). The
    principal angles themselves are in ``DiagnosticReport.subspace``.
``cosine``
    ``<G_a, G_b>_F / (||G_a||_F ||G_b||_F)`` of two gene x gene Gram matrices.
``mcc``
    Mean correlation of matched components after a signed permutation (Hungarian).
``|z|``
    Held-out ``log p(x)``: the largest paired difference in standard errors
    (see :mod:`countvae.diagnostics.analyses.predictive`); smaller is better.
``noise ratio``
    Posterior predictive statistics: the seed-to-seed difference of the
    predicted per-gene coefficient of variation and zero fraction, divided by
    the difference between two independent halves of one seed's draws (the
    larger of the two ratios; see :func:`countvae.diagnostics.analyses.ppc.ppc_agreement`);
    about 1 for equivalent seeds, smaller is better.

Thresholds (module constants, conventions rather than laws): concordance,
weighted subspace overlap, Gram cosine and ICA MCC at least 0.9 (seeds share at least
90% of the quantity's variation); k-NN Jaccard at least :data:`KNN_THRESHOLD`;
held-out ``log p(x)`` within 2 paired standard errors; posterior predictive
statistics within twice their own Monte Carlo noise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
import pandas as pd
from scipy.spatial.distance import pdist

from countvae.diagnostics.analyses.maps import PairMaps, fit_signed_permutation
from countvae.diagnostics.analyses.markers import dimension_correlations
from countvae.diagnostics.analyses.predictive import EQUIVALENCE_Z
from countvae.diagnostics.analyses.subspace import knn_jaccard_per_cell, knn_sets, subsample, weighted_overlap
from countvae.errors import InvalidArgumentError

#: Agreement (concordance, overlap, cosine, MCC) at or above which a quantity counts as stable.
AGREEMENT_THRESHOLD = 0.9
#: Mean k-NN Jaccard overlap at or above which the neighbour graph counts as stable.
KNN_THRESHOLD = 0.5
#: Largest ratio of seed-to-seed difference to Monte Carlo noise of the predictive checks that counts as stable.
PPC_THRESHOLD = 2.0
#: Cells whose pairwise latent distances are compared at most (the number of pairs is quadratic).
MAX_DISTANCE_CELLS = 1_000

#: Columns of the table :func:`invariants_table` returns.
TABLE_COLUMNS = (
    "quantity",
    "invariant_in_theory",
    "metric",
    "agreement",
    "agreement_mean",
    "aligned_agreement",
    "threshold",
    "comparison",
)
#: Columns of its per-pair table.
PAIR_COLUMNS = ("quantity", "fit_a", "fit_b", "agreement", "aligned_agreement")


# ----- agreement scores ---------------------------------------------------------------------------------
def concordance(a: np.ndarray, b: np.ndarray) -> float:
    """Lin's concordance correlation coefficient of two arrays (flattened)."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    if a.size < 2:
        return np.nan
    denom = a.var() + b.var() + (a.mean() - b.mean()) ** 2
    if denom == 0:
        return 1.0
    return float(2.0 * np.mean((a - a.mean()) * (b - b.mean())) / denom)


def gene_centred_concordance(a: np.ndarray, b: np.ndarray) -> float:
    """Concordance of two (cells, genes) matrices after removing the pooled mean of each gene."""
    centre = 0.5 * (np.mean(a, axis=0) + np.mean(b, axis=0))
    return concordance(a - centre, b - centre)


def per_column_concordance(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over columns of the concordance of column ``k`` of ``a`` with column ``k`` of ``b``."""
    return float(np.nanmean([concordance(a[:, k], b[:, k]) for k in range(a.shape[1])]))


def gram_cosine(ga: np.ndarray, gb: np.ndarray) -> float:
    """Cosine similarity of two Gram matrices under the Frobenius inner product."""
    denom = np.linalg.norm(ga) * np.linalg.norm(gb)
    return float(np.sum(ga * gb) / denom) if denom > 0 else np.nan


def pairwise_distances(z: np.ndarray) -> np.ndarray:
    """Condensed Euclidean distances between the rows of ``z``."""
    return pdist(np.asarray(z, dtype=np.float64))


def matched_component_correlation(sa: np.ndarray, sb: np.ndarray) -> float:
    """Mean correlation of components after the best signed permutation (MCC)."""
    p = fit_signed_permutation(sa, sb)
    matched = sa @ p
    return float(np.mean([np.corrcoef(matched[:, k], sb[:, k])[0, 1] for k in range(sb.shape[1])]))


# ----- what is compared ---------------------------------------------------------------------------------
@dataclass
class InvariantInputs:
    """What the table compares, all on the same held-out cells, keyed by fit name.

    Attributes
    ----------
    latents
        Latent means (cells, L).
    symmetry
        The fits' symmetry group (``"orthogonal"`` for a N(0, I) prior).
    lpd_pairs
        :func:`countvae.diagnostics.analyses.predictive.pairwise_table`.
    ppc_pairs
        :func:`countvae.diagnostics.analyses.ppc.ppc_agreement`.
    log_rates
        Decoded log means at the latent means, (cells, genes) on a subset.
    normalized
        ``log1p`` normalized expression, (cells, genes) on the same subset.
    spans
        Gene-space bases (genes, L) scaled by singular values (see
        :func:`countvae.diagnostics.analyses.subspace.jacobian_span`).
    grams
        Gene x gene decoder Gram matrices on a gene subset.
    loadings
        Per-dimension loadings (genes, L): linear weights, or mean decoder Jacobians.
    markers
        Marker values (cells, markers) on the cells of ``latents``.
    ica
        Whether to add the ICA row.

    """

    latents: Mapping[str, np.ndarray]
    symmetry: str = "orthogonal"
    lpd_pairs: pd.DataFrame | None = None
    ppc_pairs: pd.DataFrame | None = None
    log_rates: Mapping[str, np.ndarray] | None = None
    normalized: Mapping[str, np.ndarray] | None = None
    spans: Mapping[str, np.ndarray] | None = None
    grams: Mapping[str, np.ndarray] | None = None
    loadings: Mapping[str, np.ndarray] | None = None
    markers: pd.DataFrame | None = None
    ica: bool = True


@dataclass
class Comparison:
    """What the score functions read: the inputs, and what is computed once per fit or per pair.

    Built by :func:`invariants_table`; a score function takes it and two fit names.

    Attributes
    ----------
    inputs
        The per-fit quantities.
    latents
        Latent means as float64, by fit.
    maps
        The orthogonal maps between fits and each fit's ICA axes, on the cells of ``latents``.
    distances
        Condensed pairwise latent distances on a subset of cells, by fit.
    neighbours
        k-NN index sets on a subset of cells, by fit.

    """

    inputs: InvariantInputs
    latents: dict[str, np.ndarray]
    maps: PairMaps
    distances: dict[str, np.ndarray]
    neighbours: dict[str, np.ndarray]
    lpd_z: Callable[[str, str], float]
    ppc_noise_ratio: Callable[[str, str], float]
    _marker_correlations: dict[str, np.ndarray] = field(default_factory=dict)

    def marker_correlations(self, name: str) -> np.ndarray:
        """(markers, dims) correlations of fit ``name``'s latent dimensions with each marker (computed once)."""
        if name not in self._marker_correlations:
            self._marker_correlations[name] = self.marker_correlations_of(self.latents[name])
        return self._marker_correlations[name]

    def marker_correlations_of(self, z: np.ndarray) -> np.ndarray:
        """(markers, dims) correlations of the columns of ``z`` with each marker."""
        markers = self.inputs.markers
        return np.stack([dimension_correlations(z, markers[m].to_numpy()) for m in markers.columns])


# ----- the quantities -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Threshold:
    """A threshold with its direction: agreement ``>=`` value, or a discrepancy ``<`` value, counts as met.

    Attributes
    ----------
    value
        The number.
    comparison
        ``">="`` (higher is better) or ``"<"`` (lower is better).

    """

    value: float
    comparison: str

    def __post_init__(self) -> None:
        if self.comparison not in (">=", "<"):
            raise InvalidArgumentError(f"comparison must be '>=' or '<', got {self.comparison!r}.")

    @property
    def higher_is_better(self) -> bool:
        """Whether larger numbers mean closer agreement."""
        return self.comparison == ">="

    def met(self, value: float) -> bool:
        """Whether ``value`` meets the threshold (never for NaN)."""
        if not np.isfinite(value):
            return False
        return value >= self.value if self.higher_is_better else value < self.value

    def worst(self, values: list[float]) -> float:
        """The worst of ``values`` (the smallest when higher is better), ignoring NaN; NaN if none is finite."""
        finite = [v for v in values if np.isfinite(v)]
        if not finite:
            return np.nan
        return min(finite) if self.higher_is_better else max(finite)


#: A score: how well fits ``a`` and ``b`` agree on a quantity.
ScoreFunction = Callable[[Comparison, str, str], float]


def _always(inputs: InvariantInputs) -> bool:
    return True


@dataclass(frozen=True)
class Quantity:
    """One row of the invariants table: what it measures, how it is scored, and what to report instead.

    Attributes
    ----------
    name
        The row's label, e.g. ``"latent distances"``.
    invariant_in_theory
        ``"yes"`` for outputs the prior's symmetry leaves unchanged; for
        coordinate-level rows (``coordinate_level``) the table states what the
        fits' symmetry group leaves of them instead.
    coordinate_level
        Whether the quantity changes with the latent coordinates (aligned scores then apply).
    metric
        Name of the agreement score (defined in the module docstring).
    threshold
        When the agreement counts as stable.
    report_when_stable, report_when_rotation, report_when_unstable
        What to report, by verdict (see :mod:`countvae.diagnostics.reporting.verdicts`).
    score
        Agreement of two fits.
    aligned_score
        Agreement after the orthogonal map of one fit onto the other (coordinate-level rows).
    available
        Whether the inputs hold what the score needs (else the row is not measured).
    included
        Whether the row is in the table at all for these inputs.

    """

    name: str
    invariant_in_theory: str
    coordinate_level: bool
    metric: str
    threshold: Threshold
    report_when_stable: str
    report_when_rotation: str
    report_when_unstable: str
    score: ScoreFunction
    aligned_score: ScoreFunction | None = None
    available: Callable[[InvariantInputs], bool] = _always
    included: Callable[[InvariantInputs], bool] = _always


def _lpd(c: Comparison, a: str, b: str) -> float:
    return c.lpd_z(a, b)


def _ppc(c: Comparison, a: str, b: str) -> float:
    return c.ppc_noise_ratio(a, b)


def _decoded_means(c: Comparison, a: str, b: str) -> float:
    return gene_centred_concordance(c.inputs.log_rates[a], c.inputs.log_rates[b])


def _normalized(c: Comparison, a: str, b: str) -> float:
    return gene_centred_concordance(c.inputs.normalized[a], c.inputs.normalized[b])


def _distances(c: Comparison, a: str, b: str) -> float:
    return concordance(c.distances[a], c.distances[b])


def _knn(c: Comparison, a: str, b: str) -> float:
    return float(np.mean(knn_jaccard_per_cell(c.neighbours[a], c.neighbours[b])))


def _subspace(c: Comparison, a: str, b: str) -> float:
    return weighted_overlap(c.inputs.spans[a], c.inputs.spans[b])


def _gram(c: Comparison, a: str, b: str) -> float:
    return gram_cosine(c.inputs.grams[a], c.inputs.grams[b])


def _coordinates(c: Comparison, a: str, b: str) -> float:
    return per_column_concordance(c.latents[a], c.latents[b])


def _coordinates_aligned(c: Comparison, a: str, b: str) -> float:
    return per_column_concordance(c.maps.orthogonal(a, b)(c.latents[a]), c.latents[b])


def _loadings(c: Comparison, a: str, b: str) -> float:
    return per_column_concordance(c.inputs.loadings[a], c.inputs.loadings[b])


def _loadings_aligned(c: Comparison, a: str, b: str) -> float:
    return per_column_concordance(c.inputs.loadings[a] @ c.maps.orthogonal(a, b).matrix, c.inputs.loadings[b])


def _markers(c: Comparison, a: str, b: str) -> float:
    return concordance(c.marker_correlations(a), c.marker_correlations(b))


def _markers_aligned(c: Comparison, a: str, b: str) -> float:
    mapped = c.maps.orthogonal(a, b)(c.latents[a])
    return concordance(c.marker_correlations_of(mapped), c.marker_correlations(b))


def _ica(c: Comparison, a: str, b: str) -> float:
    return matched_component_correlation(c.maps.ica_sources(a), c.maps.ica_sources(b))


def _has(field_name: str) -> Callable[[InvariantInputs], bool]:
    def available(inputs: InvariantInputs) -> bool:
        return getattr(inputs, field_name) is not None

    return available


def _has_markers(inputs: InvariantInputs) -> bool:
    return inputs.markers is not None and inputs.markers.shape[1] > 0


def _with_ica(inputs: InvariantInputs) -> bool:
    return inputs.ica


_AGREE = Threshold(AGREEMENT_THRESHOLD, ">=")

#: Every row of the table, in order.
QUANTITIES: tuple[Quantity, ...] = (
    Quantity(
        "held-out log p(x)",
        "yes",
        False,
        "|z|",
        Threshold(EQUIVALENCE_Z, "<"),
        "held-out log p(x) of any seed",
        "",
        "the seeds reached different optima: train longer, or keep the seed with the best held-out log p(x)",
        score=_lpd,
        available=_has("lpd_pairs"),
    ),
    Quantity(
        "posterior predictive statistics",
        "yes",
        False,
        "noise ratio",
        Threshold(PPC_THRESHOLD, "<"),
        "posterior predictive checks of any seed",
        "",
        "check convergence; report the checks of every seed",
        score=_ppc,
        available=_has("ppc_pairs"),
    ),
    Quantity(
        "decoded means",
        "yes",
        False,
        "ccc",
        _AGREE,
        "decoded means (log rate per gene and cell) of any seed",
        "",
        "average decoded means over seeds and report their spread",
        score=_decoded_means,
        available=_has("log_rates"),
    ),
    Quantity(
        "normalized expression",
        "yes",
        False,
        "ccc",
        _AGREE,
        "normalized expression of any seed",
        "",
        "average normalized expression over seeds and report the spread",
        score=_normalized,
        available=_has("normalized"),
    ),
    Quantity(
        "latent distances",
        "yes",
        False,
        "ccc",
        _AGREE,
        "distances between cells in latent space",
        "",
        "distances averaged over seeds, with their spread",
        score=_distances,
    ),
    Quantity(
        "k-NN graph",
        "yes",
        False,
        "jaccard",
        Threshold(KNN_THRESHOLD, ">="),
        "the k-NN graph (clusters, UMAP) of any seed",
        "",
        "a consensus graph over seeds (neighbours shared by most seeds); check clusters on every seed",
        score=_knn,
    ),
    Quantity(
        "latent subspace (gene space)",
        "yes",
        False,
        "weighted overlap",
        _AGREE,
        "the gene-space span of the decoder, compared by principal angles",
        "",
        "only the leading directions that agree (small principal angles)",
        score=_subspace,
        available=_has("spans"),
    ),
    Quantity(
        "W W^T / decoder Gram",
        "yes",
        False,
        "cosine",
        _AGREE,
        "gene-gene decoder Gram matrix (W W^T, or the mean Jacobian Gram of an MLP)",
        "",
        "the Gram matrix averaged over seeds, with its spread",
        score=_gram,
        available=_has("grams"),
    ),
    Quantity(
        "per-dimension coordinates",
        "no",
        True,
        "ccc",
        _AGREE,
        "latent coordinates (the seeds happen to agree; the model does not guarantee it)",
        "latent distances, the k-NN graph or the latent subspace; or ICA coordinates if they are stable",
        "latent distances, the k-NN graph or the latent subspace",
        score=_coordinates,
        aligned_score=_coordinates_aligned,
    ),
    Quantity(
        "per-dimension loadings",
        "no",
        True,
        "ccc",
        _AGREE,
        "loadings per dimension (the seeds happen to agree; the model does not guarantee it)",
        "the span of the loadings (principal angles) or W W^T; loadings per ICA component if ICA is stable",
        "the span of the loadings (principal angles) or W W^T",
        score=_loadings,
        aligned_score=_loadings_aligned,
        available=_has("loadings"),
    ),
    Quantity(
        "per-dimension marker correlations",
        "no",
        True,
        "ccc",
        _AGREE,
        "marker correlations per dimension (the seeds happen to agree; the model does not guarantee it)",
        "R^2 of each marker on all latent dimensions (rotation-invariant)",
        "R^2 of each marker on all latent dimensions (rotation-invariant)",
        score=_markers,
        aligned_score=_markers_aligned,
        available=_has_markers,
    ),
    Quantity(
        "ICA coordinates",
        "convention (up to order and sign)",
        False,
        "mcc",
        _AGREE,
        "ICA coordinates: reproducible across seeds, a convention backed by non-Gaussianity, not proof of biology",
        "",
        "the ICA subspace, not individual components (the latents are too close to Gaussian to fix axes)",
        score=_ica,
        included=_with_ica,
    ),
)
#: The quantities by name.
QUANTITY_BY_NAME: dict[str, Quantity] = {q.name: q for q in QUANTITIES}

#: Symmetry group -> what "invariant" means for coordinate-level rows.
COORDINATE_THEORY = {
    "orthogonal": "no (changes with every rotation)",
    "signed permutation": "up to order and sign",
    "sign flip": "up to sign",
}


def _pair_lookup(frame: pd.DataFrame | None, column: str, absolute: bool = False) -> Callable[[str, str], float]:
    """A score function reading one column of a per-pair table (either order of the pair)."""
    values = {}
    if frame is not None:
        for a, b, v in zip(frame["fit_a"], frame["fit_b"], frame[column], strict=True):
            values[a, b] = values[b, a] = abs(float(v)) if absolute else float(v)
    return lambda a, b: values.get((a, b), np.nan)


def invariants_table(
    inputs: InvariantInputs,
    k: int = 15,
    max_knn_cells: int = 5_000,
    max_distance_cells: int = MAX_DISTANCE_CELLS,
    seed: int = 0,
    maps: PairMaps | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Measure how well every pair of fits agrees on each quantity of :data:`QUANTITIES`.

    Parameters
    ----------
    inputs
        The per-fit quantities.
    k
        Neighbours per cell of the k-NN graph.
    max_knn_cells, max_distance_cells
        Random subsets of cells for the k-NN graph and for pairwise distances
        (the number of distances is quadratic in cells).
    seed
        Seed of the subsets and of the ICAs.
    maps
        The maps between the fits on the cells of ``inputs.latents`` (shared
        with other analyses); by default they are fitted here.

    Returns
    -------
    table
        One row per quantity: ``quantity``, ``invariant_in_theory``,
        ``metric``, ``agreement`` (worst pair), ``agreement_mean`` (over pairs),
        ``aligned_agreement`` (worst pair after orthogonal alignment; NaN where
        alignment does not apply), ``threshold`` (a number) and ``comparison``
        (``">="`` or ``"<"``: how ``agreement`` must compare with it to count
        as stable). :func:`countvae.diagnostics.reporting.verdicts.judge_invariants`
        adds the verdicts.
    pairs
        One row per quantity and pair of fits: ``quantity``, ``fit_a``,
        ``fit_b``, ``agreement``, ``aligned_agreement``.

    """
    comparison = _compare(inputs, maps, k, max_knn_cells, max_distance_cells, seed)
    pairs = list(combinations(list(comparison.latents), 2))
    theory_coord = COORDINATE_THEORY.get(inputs.symmetry, "no")
    per_pair: list[dict] = []
    rows = []
    for q in QUANTITIES:
        if not q.included(inputs):
            continue
        agreement = aligned = []
        if q.available(inputs):
            agreement = [q.score(comparison, a, b) for a, b in pairs]
            aligned = [q.aligned_score(comparison, a, b) if q.aligned_score else np.nan for a, b in pairs]
            per_pair += [
                {"quantity": q.name, "fit_a": a, "fit_b": b, "agreement": v, "aligned_agreement": w}
                for (a, b), v, w in zip(pairs, agreement, aligned, strict=True)
            ]
        measured = bool(agreement)
        rows.append(
            {
                "quantity": q.name,
                "invariant_in_theory": theory_coord if q.coordinate_level else q.invariant_in_theory,
                "metric": q.metric,
                "agreement": q.threshold.worst(agreement) if measured else np.nan,
                "agreement_mean": float(np.nanmean(agreement)) if measured else np.nan,
                "aligned_agreement": q.threshold.worst(aligned) if measured else np.nan,
                "threshold": q.threshold.value,
                "comparison": q.threshold.comparison,
            }
        )
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS)), pd.DataFrame(per_pair, columns=list(PAIR_COLUMNS))


def _compare(
    inputs: InvariantInputs,
    maps: PairMaps | None,
    k: int,
    max_knn_cells: int,
    max_distance_cells: int,
    seed: int,
) -> Comparison:
    latents = {name: np.asarray(z, dtype=np.float64) for name, z in inputs.latents.items()}
    names = list(latents)
    if len(names) < 2:
        raise InvalidArgumentError("The invariants table needs at least two fits.")
    if maps is None:
        maps = PairMaps(latents, seed=seed)
    elif maps.names != names or any(maps.latents[n].shape != latents[n].shape for n in names):
        raise InvalidArgumentError(f"maps were fitted on other fits or cells than the latents ({maps.names}).")
    n_cells = len(latents[names[0]])
    if inputs.markers is not None and len(inputs.markers) != n_cells:
        raise InvalidArgumentError(f"markers cover {len(inputs.markers)} cells but the latents {n_cells}.")
    knn_cells = subsample(n_cells, max_knn_cells, seed)
    dist_cells = subsample(n_cells, max_distance_cells, seed + 1)
    k_eff = min(k, len(knn_cells) - 1)
    return Comparison(
        inputs=inputs,
        latents=latents,
        maps=maps,
        distances={n: pairwise_distances(z[dist_cells]) for n, z in latents.items()},
        neighbours={n: knn_sets(z[knn_cells], k_eff) for n, z in latents.items()},
        lpd_z=_pair_lookup(inputs.lpd_pairs, "z", absolute=True),
        ppc_noise_ratio=_pair_lookup(inputs.ppc_pairs, "noise_ratio"),
    )
