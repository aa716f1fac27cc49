"""Paired bootstrap over held-out cells: an interval for every agreement score of the report.

Every agreement score compares two fits on a sample of held-out cells; another sample would give another score.
The interval of a score comes from a paired bootstrap over those cells:

* one set of replicates per set of cells, drawn once and used for **every** pair of fits (replicate ``r`` weighs cell
  ``i`` by the number of times it was drawn), so the pairs' replicates come from one resample and can be read together;
* each replicate recomputes the score from weighted moments of the arrays the score reads (no copies of the data);
* a pair's interval is the percentile interval of its replicates, at level ``1 - 2 alpha`` (each side errs with
  probability ``alpha``); a row's, of its worst pair, is bounded through the pairs' intervals (:func:`worst_interval`).

For a score on more cells than ``max_cells``, the replicates resample ``m = max_cells`` of the ``n`` cells (an
m-out-of-n bootstrap): the spread of the replicates around the score of those ``m`` cells is scaled by ``sqrt(m / n)``
(the spread of a smooth statistic shrinks like ``1 / sqrt(n)``) and centred on the score of all ``n`` cells.

The intervals cover the sampling of held-out cells, not the fits themselves (the seeds' randomness is what a row
measures) nor the maps, neighbour sets and ICA unmixings, which are fitted once and held fixed; except the orthogonal
map of the aligned coordinates and marker correlations, refitted in every replicate (:class:`RefittedAlignment`)
because it is fitted on the cells those are scored on. A mean of per-cell k-NN scores can widen its interval for the
correlation of neighbouring cells' scores (:func:`neighbour_inflation`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from countvae.errors import InvalidArgumentError

#: Replicates of each bootstrap (the percentile interval's tails then hold 10 replicates each at alpha = 0.05).
N_REPLICATES = 200
#: Cells resampled at most; beyond, an m-out-of-n bootstrap (see the module docstring).
MAX_CELLS = 2_000


@dataclass(frozen=True)
class CellBootstrap:
    """Bootstrap weights over a set of ``n_cells`` cells, the same for every pair of fits.

    Attributes
    ----------
    weights
        (1 + replicates, m): row 0 weighs every resampled cell once (the reference: the score of the ``m`` cells
        themselves); row ``r`` holds how often each cell was drawn in replicate ``r``.
    positions
        The ``m`` cells resampled, as positions among the ``n_cells``.
    n_cells
        Cells the score itself is computed on.

    """

    weights: np.ndarray
    positions: np.ndarray
    n_cells: int

    @property
    def shrink(self) -> float:
        """``sqrt(m / n)``: how much narrower the spread of ``n`` cells is than that of the ``m`` resampled."""
        return float(np.sqrt(len(self.positions) / self.n_cells))

    @property
    def n_replicates(self) -> int:
        """Bootstrap replicates (rows of ``weights`` after the reference)."""
        return self.weights.shape[0] - 1


def cell_bootstrap(
    n_cells: int, n_replicates: int = N_REPLICATES, seed: int = 0, max_cells: int = MAX_CELLS
) -> CellBootstrap:
    """Multinomial bootstrap weights over ``min(n_cells, max_cells)`` of ``n_cells`` cells (seeded)."""
    if n_cells < 2:
        raise InvalidArgumentError(f"A bootstrap over cells needs at least 2 cells, got {n_cells}.")
    rng = np.random.default_rng(seed)
    m = min(n_cells, max_cells)
    positions = np.arange(n_cells) if m == n_cells else np.sort(rng.choice(n_cells, m, replace=False))
    draws = rng.integers(0, m, size=(n_replicates, m))
    counts = np.zeros((n_replicates, m))
    np.add.at(counts, (np.repeat(np.arange(n_replicates), m), draws.ravel()), 1.0)
    return CellBootstrap(np.vstack([np.ones((1, m)), counts]), positions, int(n_cells))


@dataclass(frozen=True)
class Interval:
    """A score with its bootstrap interval (``low <= high``; NaN when not measured)."""

    value: float
    low: float
    high: float

    @staticmethod
    def exact(value: float) -> Interval:
        """A score without sampling error (e.g. of a linear decoder's weights, which no cell informs)."""
        return Interval(float(value), float(value), float(value))

    @staticmethod
    def missing() -> Interval:
        """No score."""
        return Interval(np.nan, np.nan, np.nan)


def percentile_interval(value: float, replicates: np.ndarray, shrink: float, alpha: float) -> Interval:
    """The interval of ``value`` from replicates whose element 0 is the reference (see :class:`CellBootstrap`).

    The deviations of the replicates from the reference, scaled by ``shrink``, are added to ``value``; with
    ``shrink = 1`` and ``value`` equal to the reference this is the plain percentile interval. The interval is widened
    where needed to contain ``value`` (the percentile interval of a worst pair, a minimum, can otherwise lie beside it).
    """
    replicates = np.asarray(replicates, dtype=np.float64)
    if not np.isfinite(value) or not np.isfinite(replicates[0]):
        return Interval(float(value), np.nan, np.nan)
    deviations = (replicates[1:] - replicates[0]) * shrink
    deviations = deviations[np.isfinite(deviations)]
    if deviations.size == 0:
        return Interval.exact(value)
    low, high = np.quantile(deviations, [alpha, 1.0 - alpha])
    return Interval(float(value), float(value + min(low, 0.0)), float(value + max(high, 0.0)))


def worst_interval(
    values: Sequence[float], replicates: Sequence[np.ndarray], shrink: float, alpha: float, higher_is_better: bool
) -> Interval:
    """The interval of the worst pair's score, from each pair's score and its replicates (element 0 the reference).

    The worst of several estimates is biased towards the bad side (the smallest of noisy scores falls below the
    smallest of what they estimate), and the percentile interval of each replicate's worst pair carries that bias a
    second time: with five seeds of near-equal agreement it left the true worst score above the whole interval in
    26% (300 cells) to 34% (150 cells) of simulated draws, against the ``alpha`` it promises. Each side is therefore
    bounded through the pairs' own intervals:

    * the bad side is the worst of the pairs' bad-side bounds, each at level ``alpha``: it errs only if the truly
      worst pair's bound does (no correction for the number of pairs is needed);
    * the good side is the worst of the pairs' good-side bounds taken *simultaneously*: each pair's percentile bound
      widened by one factor, chosen on the joint replicates so that in a fraction ``alpha`` of them some pair passes
      its widened bound (the factor depends on how the pairs' errors go together: none for one pair, most for
      independent pairs).

    With one pair this is :func:`percentile_interval`. Pairs without finite replicates count as exact; pairs without
    a finite score are left out.
    """
    if not higher_is_better:
        flipped = worst_interval(
            [-v for v in values], [-np.asarray(r, dtype=np.float64) for r in replicates], shrink, alpha, True
        )
        return Interval(-flipped.value, -flipped.high, -flipped.low)
    keep = [k for k, v in enumerate(values) if np.isfinite(v)]
    if not keep:
        return Interval.missing()
    value = np.array([values[k] for k in keep], dtype=np.float64)
    stacked = np.vstack([np.asarray(replicates[k], dtype=np.float64) for k in keep])
    with np.errstate(invalid="ignore"):
        deviations = (stacked[:, 1:] - stacked[:, :1]) * shrink
    finite = np.isfinite(deviations)
    if len(keep) == 1:
        return percentile_interval(float(value[0]), stacked[0], shrink, alpha)
    if not finite.any():
        return Interval(float(value.min()), np.nan, np.nan)
    low = np.array([np.quantile(d[f], alpha) if f.any() else 0.0 for d, f in zip(deviations, finite, strict=True)])
    high = np.array([np.quantile(d[f], 1 - alpha) if f.any() else 0.0 for d, f in zip(deviations, finite, strict=True)])
    high = np.maximum(high, 0.0) * _simultaneous_factor(deviations, high, alpha)
    return Interval(float(value.min()), float(np.min(value + np.minimum(low, 0.0))), float(np.min(value + high)))


def _simultaneous_factor(deviations: np.ndarray, high: np.ndarray, alpha: float) -> float:
    """How much to widen every pair's good-side bound ``high`` so that they hold together.

    Each replicate's deviation is divided by its pair's bound; the factor is the ``1 - alpha`` quantile, over
    replicates, of the largest such ratio over the pairs (1 for a single pair; about the ratio of the normal quantiles
    at ``1 - alpha / pairs`` and ``1 - alpha`` for independent pairs). Only this one quantile is read from the
    replicates: the bounds' own extreme quantiles would rest on the one or two most extreme replicates. Pairs whose
    replicates never exceed their score take no part.
    """
    moving = high > 0
    if moving.sum() < 2:
        return 1.0
    with np.errstate(invalid="ignore"):
        ratios = deviations[moving] / high[moving, None]
    largest = np.nanmax(np.where(np.isfinite(ratios), ratios, -np.inf), axis=0)
    return max(1.0, float(np.quantile(largest, 1.0 - alpha)))


# ----- weighted scores --------------------------------------------------------------------------------
def concordance_from_moments(mean_a, mean_b, var_a, var_b, cov):
    """Lin's concordance from two means, two variances and the covariance (1 for two equal constants)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        denom = var_a + var_b + (mean_a - mean_b) ** 2
        return np.where(denom > 0, 2.0 * cov / np.where(denom > 0, denom, 1.0), 1.0)


def weighted_concordance(weights: np.ndarray, a: np.ndarray, b: np.ndarray, centre_columns: bool = False) -> np.ndarray:
    """Lin's concordance of two (cells, columns) arrays, flattened, for each row of cell weights.

    With ``centre_columns`` each column is first centred by the pooled weighted mean of both arrays (as
    :func:`countvae.diagnostics.analyses.invariants.gene_centred_concordance`).
    """
    w = weights / weights.sum(axis=1, keepdims=True)
    ma, mb = w @ a, w @ b
    saa, sbb, sab = w @ (a * a), w @ (b * b), w @ (a * b)
    c = 0.5 * (ma + mb) if centre_columns else np.zeros_like(ma)
    mean_a, mean_b = np.mean(ma - c, axis=1), np.mean(mb - c, axis=1)
    e_aa = np.mean(saa - 2.0 * c * ma + c * c, axis=1)
    e_bb = np.mean(sbb - 2.0 * c * mb + c * c, axis=1)
    e_ab = np.mean(sab - c * (ma + mb) + c * c, axis=1)
    return concordance_from_moments(mean_a, mean_b, e_aa - mean_a**2, e_bb - mean_b**2, e_ab - mean_a * mean_b)


def weighted_column_concordance(weights: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Mean over columns of the concordance of column ``k`` of ``a`` with column ``k`` of ``b``, per weight row."""
    w = weights / weights.sum(axis=1, keepdims=True)
    ma, mb = w @ a, w @ b
    var_a, var_b = w @ (a * a) - ma**2, w @ (b * b) - mb**2
    cov = w @ (a * b) - ma * mb
    return np.nanmean(concordance_from_moments(ma, mb, var_a, var_b, cov), axis=1)


@dataclass(frozen=True)
class RefittedAlignment:
    """The orthogonal Procrustes map of ``a`` onto ``b`` refitted for each row of bootstrap weights.

    Each row gets its own weighted map (rotation of the weighted-centred ``a`` plus the offset that matches the
    weighted means), so scores computed through it carry the map's sampling error and its in-sample optimism; row
    ``r`` equals the map fitted on the cells repeated as row ``r`` counts them. Scores are computed from weighted
    moments: no (replicates, cells, dims) array.

    Attributes
    ----------
    weights
        (rows, cells) weights, each row summing to 1.
    a
        The cells' latents that are mapped, (cells, d).
    rotation
        (rows, d, d): ``(a - mean_a) @ rotation[r] + mean_b`` under row ``r``'s weights.
    cov_a
        (rows, d, d) weighted covariance of ``a``.
    cov_ab
        (rows, d, d) weighted cross-covariance of ``a`` and ``b``.

    """

    weights: np.ndarray
    a: np.ndarray
    rotation: np.ndarray
    cov_a: np.ndarray
    cov_ab: np.ndarray

    @staticmethod
    def fit(weights: np.ndarray, a: np.ndarray, b: np.ndarray) -> RefittedAlignment:
        """Fit the maps for every row of ``weights`` (rows, cells) over the cells of ``a`` and ``b`` (cells, d)."""
        w = weights / weights.sum(axis=1, keepdims=True)
        ma, mb = w @ a, w @ b
        cov_a = _weighted_outer(w, a, a) - ma[:, :, None] * ma[:, None, :]
        cov_ab = _weighted_outer(w, a, b) - ma[:, :, None] * mb[:, None, :]
        u, _, vt = np.linalg.svd(cov_ab)
        return RefittedAlignment(w, a, u @ vt, cov_a, cov_ab)  # U V^T maximises tr(R^T cov_ab), as scipy's

    def mapped_variances(self) -> np.ndarray:
        """(rows, d) weighted variance of each mapped column."""
        return np.einsum("rij,rik,rkj->rj", self.rotation, self.cov_a, self.rotation)

    def column_concordance(self, b: np.ndarray) -> np.ndarray:
        """:func:`weighted_column_concordance` of the mapped ``a`` with ``b``, per row."""
        mb = self.weights @ b
        cov = np.einsum("rij,rij->rj", self.rotation, self.cov_ab)
        # the map's offset makes the mapped means equal b's: no mean-shift term
        return np.nanmean(
            concordance_from_moments(mb, mb, self.mapped_variances(), self.weights @ (b * b) - mb**2, cov), axis=1
        )

    def correlations(self, markers: np.ndarray) -> np.ndarray:
        """:func:`weighted_correlations` of the mapped ``a`` with every marker, (rows, markers, dims)."""
        w = self.weights
        mm = w @ markers
        cov = np.einsum(
            "rmi,rij->rmj",
            _weighted_outer(w, markers, self.a) - mm[:, :, None] * (w @ self.a)[:, None, :],
            self.rotation,
        )
        var_m = w @ (markers * markers) - mm**2
        with np.errstate(invalid="ignore", divide="ignore"):
            return cov / np.sqrt(var_m[:, :, None] * self.mapped_variances()[:, None, :])


def _weighted_outer(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(rows, p, q): ``sum_i w[r, i] x[i, p] y[i, q]``, one matrix product."""
    n, p, q = len(x), x.shape[1], y.shape[1]
    return (w @ (x[:, :, None] * y[:, None, :]).reshape(n, p * q)).reshape(-1, p, q)


def weighted_mean(weights: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Weighted mean of per-cell values, per weight row."""
    return weights @ values / weights.sum(axis=1)


def neighbour_inflation(scores: np.ndarray, weights: np.ndarray, neighbours: np.ndarray) -> float:
    """How much wider than a bootstrap over cells the interval of a weighted mean of k-NN scores must be (>= 1).

    A cell's k-NN score reads its own label and its neighbours'; two cells whose sets of cells read overlap (one is
    among the other's neighbours, or they share a neighbour) have correlated scores, so a bootstrap that resamples
    cells as if independent is too narrow. With residuals ``r_i = w_i (s_i - mean)``, the variance of the weighted
    mean is taken as ``sum_i r_i^2 + sum_{i ~ j} r_i r_j`` over the ordered pairs of such cells (a network form of a
    spatial HAC estimator, Conley 1999) against ``sum_i r_i^2`` for independent cells; the square root of the ratio,
    floored at 1, scales the bootstrap's deviations. Cells identical within mutual-neighbour groups of ``m`` give
    ``sqrt(m)``; scores independent of the graph give about 1 (``tests/diagnostics/analyses``). Counting only pairs
    of neighbours, without shared neighbours, left the placement intervals of real fits covering in 80-91% at
    nominal 90% (benchmarks/RESULTS.md, section heldout-placement).

    Parameters
    ----------
    scores, weights
        Per scored cell (``n``,).
    neighbours
        (``n``, k) indices of each scored cell's neighbours; indices ``>= n`` are cells that are neighbours without
        being scored (they link the cells that share them).

    """
    scores, weights = np.asarray(scores, dtype=np.float64), np.asarray(weights, dtype=np.float64)
    neighbours = np.asarray(neighbours, dtype=np.int64)
    n = len(scores)
    if n == 0 or np.ptp(scores) == 0.0:  # no spread (a mean of equal scores can differ from them in the last bit)
        return 1.0
    residuals = weights * (scores - np.average(scores, weights=weights))
    independent = float(residuals @ residuals)
    # Row i marks the cells i's score reads: itself and its neighbours; i ~ j when their rows share a cell.
    reads = np.hstack([np.arange(n)[:, None], neighbours])
    n_cells = max(n, int(reads.max()) + 1)
    rows = np.repeat(np.arange(n), reads.shape[1])
    membership = sp.csr_matrix((np.ones(reads.size), (rows, reads.ravel())), shape=(n, n_cells))
    linked = (membership @ membership.T).astype(bool).astype(np.float64)
    linked.setdiag(0.0)
    correlated = independent + float(residuals @ (linked @ residuals))
    return float(np.sqrt(max(correlated / independent, 1.0)))


@dataclass(frozen=True)
class PairSums:
    """Sums over pairs of distinct cells of one fit's distances, per weight row (see :func:`pair_sums`)."""

    count: np.ndarray
    first: np.ndarray
    second: np.ndarray


def pair_sums(weights: np.ndarray, distances: np.ndarray) -> PairSums:
    """Weighted number of cell pairs, and sums of distances and squared distances over them.

    ``distances`` is a square matrix with zero diagonal; a pair of cells ``(i, j)`` counts ``w_i w_j`` times (copies
    of one cell are not a pair).
    """
    total = weights.sum(axis=1)
    count = 0.5 * (total**2 - np.sum(weights**2, axis=1))
    first = 0.5 * np.sum((weights @ distances) * weights, axis=1)
    second = 0.5 * np.sum((weights @ (distances * distances)) * weights, axis=1)
    return PairSums(count, first, second)


def distance_concordance(
    weights: np.ndarray, da: np.ndarray, db: np.ndarray, sums_a: PairSums, sums_b: PairSums
) -> np.ndarray:
    """Concordance of two fits' pairwise distances over the weighted pairs of cells, per weight row."""
    cross = 0.5 * np.sum((weights @ (da * db)) * weights, axis=1)
    n = sums_a.count
    mean_a, mean_b = sums_a.first / n, sums_b.first / n
    return concordance_from_moments(
        mean_a, mean_b, sums_a.second / n - mean_a**2, sums_b.second / n - mean_b**2, cross / n - mean_a * mean_b
    )


def weighted_correlations(weights: np.ndarray, z: np.ndarray, markers: np.ndarray) -> np.ndarray:
    """(rows, markers, dims) weighted Pearson correlations of every latent dimension with every marker."""
    w = weights / weights.sum(axis=1, keepdims=True)
    mz, mm = w @ z, w @ markers
    vz, vm = w @ (z * z) - mz**2, w @ (markers * markers) - mm**2
    cov = _weighted_outer(w, markers, z) - mm[:, :, None] * mz[:, None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        return cov / np.sqrt(vm[:, :, None] * vz[:, None, :])


def rowwise_concordance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Concordance of ``a[r]`` and ``b[r]`` (flattened, non-finite entries dropped) for each leading index ``r``."""
    a, b = a.reshape(len(a), -1), b.reshape(len(b), -1)
    ok = np.isfinite(a) & np.isfinite(b)
    count = ok.sum(axis=1)
    a0, b0 = np.where(ok, a, 0.0), np.where(ok, b, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        ma, mb = a0.sum(1) / count, b0.sum(1) / count
        var_a = np.where(ok, (a0 - ma[:, None]) ** 2, 0.0).sum(1) / count
        var_b = np.where(ok, (b0 - mb[:, None]) ** 2, 0.0).sum(1) / count
        cov = np.where(ok, (a0 - ma[:, None]) * (b0 - mb[:, None]), 0.0).sum(1) / count
    out = concordance_from_moments(ma, mb, var_a, var_b, cov)
    return np.where(count >= 2, out, np.nan)
