"""The invariants table: which outputs of the fits survive a re-run, and which are a choice of coordinates.

One row per quantity. For each: whether the model's symmetry group leaves it
unchanged in theory; how well the seeds agree on it (a number with its
definition, for the worst pair of seeds, and its mean over pairs); the same
after aligning each pair of seeds by the orthogonal Procrustes map of their
latent means (only for coordinate-level quantities, where alignment changes
anything); a verdict; and what to report instead when the quantity is not
stable.

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

Verdicts
--------
``stable``
    The worst pair of seeds meets the threshold as the quantity stands.
``stable up to rotation``
    It does not, but it does after the orthogonal alignment: the seeds agree
    on the thing itself, not on its coordinates.
``unstable``
    It does not, even after alignment. For a quantity that is invariant in
    theory this means the seeds reached different optima (or did not
    converge), not that they picked different coordinates.
``not measured``
    The fits' API does not provide what the quantity needs.

Thresholds (module constants, conventions rather than laws): concordance,
weighted subspace overlap, Gram cosine and ICA MCC at least 0.9 (seeds share at least
90% of the quantity's variation); k-NN Jaccard at least :data:`KNN_THRESHOLD`;
held-out ``log p(x)`` within 2 paired standard errors; posterior predictive
statistics within twice their own Monte Carlo noise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import pandas as pd

from countvae.diagnostics.analyses.alignment import fit_ica_axes, fit_map, signed_permutation
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

STABLE, ROTATION, UNSTABLE, NOT_MEASURED = "stable", "stable up to rotation", "unstable", "not measured"


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
    from scipy.spatial.distance import pdist

    return pdist(np.asarray(z, dtype=np.float64))


def matched_component_correlation(sa: np.ndarray, sb: np.ndarray) -> float:
    """Mean correlation of components after the best signed permutation (MCC)."""
    p = signed_permutation(sa, sb)
    matched = sa @ p
    return float(np.mean([np.corrcoef(matched[:, k], sb[:, k])[0, 1] for k in range(sb.shape[1])]))


@dataclass(frozen=True)
class QuantitySpec:
    """How one row of the table is defined."""

    quantity: str
    invariant: str
    metric: str
    threshold: float
    higher_is_better: bool
    report_when_stable: str
    report_when_rotation: str
    report_when_unstable: str


_INVARIANT_ROWS = (
    QuantitySpec(
        "held-out log p(x)",
        "yes",
        "|z|",
        EQUIVALENCE_Z,
        False,
        "held-out log p(x) of any seed",
        "",
        "the seeds reached different optima: train longer, or keep the seed with the best held-out log p(x)",
    ),
    QuantitySpec(
        "posterior predictive statistics",
        "yes",
        "noise ratio",
        PPC_THRESHOLD,
        False,
        "posterior predictive checks of any seed",
        "",
        "check convergence; report the checks of every seed",
    ),
    QuantitySpec(
        "decoded means",
        "yes",
        "ccc",
        AGREEMENT_THRESHOLD,
        True,
        "decoded means (log rate per gene and cell) of any seed",
        "",
        "average decoded means over seeds and report their spread",
    ),
    QuantitySpec(
        "normalized expression",
        "yes",
        "ccc",
        AGREEMENT_THRESHOLD,
        True,
        "normalized expression of any seed",
        "",
        "average normalized expression over seeds and report the spread",
    ),
    QuantitySpec(
        "latent distances",
        "yes",
        "ccc",
        AGREEMENT_THRESHOLD,
        True,
        "distances between cells in latent space",
        "",
        "distances averaged over seeds, with their spread",
    ),
    QuantitySpec(
        "k-NN graph",
        "yes",
        "jaccard",
        KNN_THRESHOLD,
        True,
        "the k-NN graph (clusters, UMAP) of any seed",
        "",
        "a consensus graph over seeds (neighbours shared by most seeds); check clusters on every seed",
    ),
    QuantitySpec(
        "latent subspace (gene space)",
        "yes",
        "weighted overlap",
        AGREEMENT_THRESHOLD,
        True,
        "the gene-space span of the decoder, compared by principal angles",
        "",
        "only the leading directions that agree (small principal angles)",
    ),
    QuantitySpec(
        "W W^T / decoder Gram",
        "yes",
        "cosine",
        AGREEMENT_THRESHOLD,
        True,
        "gene-gene decoder Gram matrix (W W^T, or the mean Jacobian Gram of an MLP)",
        "",
        "the Gram matrix averaged over seeds, with its spread",
    ),
)

_COORDINATE_ROWS = (
    QuantitySpec(
        "per-dimension coordinates",
        "no",
        "ccc",
        AGREEMENT_THRESHOLD,
        True,
        "latent coordinates (the seeds happen to agree; the model does not guarantee it)",
        "latent distances, the k-NN graph or the latent subspace; or ICA coordinates if they are stable",
        "latent distances, the k-NN graph or the latent subspace",
    ),
    QuantitySpec(
        "per-dimension loadings",
        "no",
        "ccc",
        AGREEMENT_THRESHOLD,
        True,
        "loadings per dimension (the seeds happen to agree; the model does not guarantee it)",
        "the span of the loadings (principal angles) or W W^T; loadings per ICA component if ICA is stable",
        "the span of the loadings (principal angles) or W W^T",
    ),
    QuantitySpec(
        "per-dimension marker correlations",
        "no",
        "ccc",
        AGREEMENT_THRESHOLD,
        True,
        "marker correlations per dimension (the seeds happen to agree; the model does not guarantee it)",
        "R^2 of each marker on all latent dimensions (rotation-invariant)",
        "R^2 of each marker on all latent dimensions (rotation-invariant)",
    ),
)

_ICA_ROW = QuantitySpec(
    "ICA coordinates",
    "convention (up to order and sign)",
    "mcc",
    AGREEMENT_THRESHOLD,
    True,
    "ICA coordinates: reproducible across seeds, a convention backed by non-Gaussianity, not proof of biology",
    "",
    "the ICA subspace, not individual components (the latents are too close to Gaussian to fix axes)",
)

#: Symmetry group -> what "invariant" means for coordinate-level rows.
_COORDINATE_THEORY = {
    "orthogonal": "no (changes with every rotation)",
    "signed permutation": "up to order and sign",
    "sign flip": "up to sign",
}


def _verdict(spec: QuantitySpec, value: float, aligned: float) -> str:
    def ok(v: float) -> bool:
        if not np.isfinite(v):
            return False
        return v >= spec.threshold if spec.higher_is_better else v < spec.threshold

    if not np.isfinite(value):
        return NOT_MEASURED
    if ok(value):
        return STABLE
    if ok(aligned):
        return ROTATION
    return UNSTABLE


def _pair_lookup(frame: pd.DataFrame | None, column: str, absolute: bool = False) -> Callable[[str, str], float]:
    """A score function reading one column of a per-pair table (either order of the pair)."""
    values = {}
    if frame is not None:
        for a, b, v in zip(frame["fit_a"], frame["fit_b"], frame[column], strict=True):
            values[a, b] = values[b, a] = abs(float(v)) if absolute else float(v)
    return lambda a, b: values.get((a, b), np.nan)


def _worst(values: list[float], higher_is_better: bool) -> float:
    finite = [v for v in values if np.isfinite(v)]
    if not finite:
        return np.nan
    return min(finite) if higher_is_better else max(finite)


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


def invariants_table(
    inputs: InvariantInputs,
    k: int = 15,
    max_knn_cells: int = 5_000,
    max_distance_cells: int = MAX_DISTANCE_CELLS,
    seed: int = 0,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Build the invariants table.

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
        Seed of the subsets and of the ICA.

    Returns
    -------
    table
        One row per quantity: ``quantity``, ``invariant_in_theory``,
        ``metric``, ``agreement`` (worst pair), ``agreement_mean`` (over pairs),
        ``aligned_agreement`` (worst pair after orthogonal alignment; NaN where
        alignment does not apply), ``threshold``, ``verdict``, ``report_instead``.
    pairs
        One row per quantity and pair of fits: ``quantity``, ``fit_a``,
        ``fit_b``, ``agreement``, ``aligned_agreement``.

    """
    latents = {name: np.asarray(z, dtype=np.float64) for name, z in inputs.latents.items()}
    names = list(latents)
    if len(names) < 2:
        raise InvalidArgumentError("The invariants table needs at least two fits.")
    pairs = list(combinations(names, 2))
    maps = {(a, b): fit_map("orthogonal", latents[a], latents[b]) for a, b in pairs}
    n_cells = len(latents[names[0]])
    knn_cells = subsample(n_cells, max_knn_cells, seed)
    dist_cells = subsample(n_cells, max_distance_cells, seed + 1)

    per_pair: list[dict] = []

    def record(spec: QuantitySpec, score: Callable[[str, str], float], aligned=None) -> None:
        for a, b in pairs:
            per_pair.append(
                {
                    "quantity": spec.quantity,
                    "fit_a": a,
                    "fit_b": b,
                    "agreement": score(a, b),
                    "aligned_agreement": aligned(a, b) if aligned is not None else np.nan,
                }
            )

    rows_specs: list[QuantitySpec] = []
    available: dict[str, bool] = {}

    def add(spec: QuantitySpec, ok: bool, score=None, aligned=None) -> None:
        rows_specs.append(spec)
        available[spec.quantity] = ok
        if ok:
            record(spec, score, aligned)

    add(_INVARIANT_ROWS[0], inputs.lpd_pairs is not None, _pair_lookup(inputs.lpd_pairs, "z", absolute=True))
    add(_INVARIANT_ROWS[1], inputs.ppc_pairs is not None, _pair_lookup(inputs.ppc_pairs, "noise_ratio"))
    lr, ne = inputs.log_rates, inputs.normalized
    add(_INVARIANT_ROWS[2], lr is not None, lambda a, b: gene_centred_concordance(lr[a], lr[b]))
    add(_INVARIANT_ROWS[3], ne is not None, lambda a, b: gene_centred_concordance(ne[a], ne[b]))
    dists = {n: pairwise_distances(z[dist_cells]) for n, z in latents.items()}
    add(_INVARIANT_ROWS[4], True, lambda a, b: concordance(dists[a], dists[b]))
    k_eff = min(k, len(knn_cells) - 1)
    neighbours = {n: knn_sets(z[knn_cells], k_eff) for n, z in latents.items()}
    add(_INVARIANT_ROWS[5], True, lambda a, b: float(np.mean(knn_jaccard_per_cell(neighbours[a], neighbours[b]))))
    spans, grams = inputs.spans, inputs.grams
    add(_INVARIANT_ROWS[6], spans is not None, lambda a, b: weighted_overlap(spans[a], spans[b]))
    add(_INVARIANT_ROWS[7], grams is not None, lambda a, b: gram_cosine(grams[a], grams[b]))

    add(
        _COORDINATE_ROWS[0],
        True,
        lambda a, b: per_column_concordance(latents[a], latents[b]),
        lambda a, b: per_column_concordance(maps[a, b](latents[a]), latents[b]),
    )
    w = inputs.loadings
    add(
        _COORDINATE_ROWS[1],
        w is not None,
        lambda a, b: per_column_concordance(w[a], w[b]),
        lambda a, b: per_column_concordance(w[a] @ maps[a, b].matrix, w[b]),
    )
    markers = inputs.markers
    if markers is not None and len(markers) != n_cells:
        raise InvalidArgumentError(f"markers cover {len(markers)} cells but the latents {n_cells}.")

    def marker_corr(z: np.ndarray) -> np.ndarray:
        return np.stack([dimension_correlations(z, markers[m].to_numpy()) for m in markers.columns])

    add(
        _COORDINATE_ROWS[2],
        markers is not None and markers.shape[1] > 0,
        lambda a, b: concordance(marker_corr(latents[a]), marker_corr(latents[b])),
        lambda a, b: concordance(marker_corr(maps[a, b](latents[a])), marker_corr(latents[b])),
    )
    if inputs.ica:
        sources = {n: fit_ica_axes(z, random_state=seed).transform(z) for n, z in latents.items()}
        add(_ICA_ROW, True, lambda a, b: matched_component_correlation(sources[a], sources[b]))

    pair_frame = pd.DataFrame(per_pair, columns=["quantity", "fit_a", "fit_b", "agreement", "aligned_agreement"])
    theory_coord = _COORDINATE_THEORY.get(inputs.symmetry, "no")
    rows = []
    for spec in rows_specs:
        sub = pair_frame[pair_frame["quantity"] == spec.quantity]
        if not available[spec.quantity] or sub.empty:
            value = mean = aligned = np.nan
        else:
            value = _worst(sub["agreement"].tolist(), spec.higher_is_better)
            mean = float(np.nanmean(sub["agreement"]))
            aligned = _worst(sub["aligned_agreement"].tolist(), spec.higher_is_better)
        verdict = _verdict(spec, value, aligned)
        instead = {
            STABLE: spec.report_when_stable,
            ROTATION: spec.report_when_rotation,
            UNSTABLE: spec.report_when_unstable,
            NOT_MEASURED: "not available for these fits",
        }[verdict]
        rows.append(
            {
                "quantity": spec.quantity,
                "invariant_in_theory": theory_coord if spec in _COORDINATE_ROWS else spec.invariant,
                "metric": spec.metric,
                "agreement": value,
                "agreement_mean": mean,
                "aligned_agreement": aligned,
                "threshold": f"{'>=' if spec.higher_is_better else '<'} {spec.threshold:g}",
                "verdict": verdict,
                "report_instead": instead,
            }
        )
    return pd.DataFrame(rows), pair_frame
