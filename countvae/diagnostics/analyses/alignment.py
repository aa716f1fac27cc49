"""How well the latent space of one fit maps onto another's, under five classes of map.

For two fits ``a`` and ``b`` evaluated on the same held-out cells, a map ``T``
from ``a``'s latent means to ``b``'s is fitted on one half of the cells and scored
on the other half (a general linear map has ``d^2 + d`` parameters and would
flatter itself in-sample). The classes, from most to least restrictive:

``identity``
    ``T(z) = z``: the coordinates agree as they are.
``permutation``
    A signed permutation of the centred coordinates (Hungarian matching on the
    absolute correlations, each sign from its correlation).
``orthogonal``
    A rigid rotation/reflection of the centred coordinates
    (:func:`scipy.linalg.orthogonal_procrustes`): the symmetry group of a N(0, I)
    prior.
``linear``
    A general affine map (least squares with intercept).
``ica``
    Each fit is rotated separately into ICA axes (:class:`countvae.ica.ICARotation`); the axes are matched by a
    signed permutation and a scale per axis. The rotation comes from each fit's
    own latents; the pairing of cells only picks the order, signs and scales.

The error of ``T`` is the mean Euclidean distance per scoring cell between
``T(z_a)`` and ``z_b``, divided by the diameter of ``z_b`` (largest pairwise
distance, on at most ``max_diameter_cells`` cells) as in Table 1 of Nelson,
Fumero, Karaletsos and Locatello (2026), and also by the RMS pairwise distance
``sqrt(2 tr Cov z_b)``, which is not driven by one outlying cell. Both
directions ``a -> b`` and ``b -> a`` are scored and averaged. The classes are
nested (signed permutations are rotations, rotations are linear maps), so
``e_linear <= e_orthogonal <= e_permutation`` is expected; it is not exact on
the scoring cells, because each map is fitted on the other half.

The ICA efficiency ``(e_perm - e_ICA) / (e_perm - e_orthogonal)`` is the share of
the gap between the best signed permutation and the best rotation that ICA closes
without using the cell pairing: 1 means ICA found the aligning rotation.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import pandas as pd
from scipy.linalg import orthogonal_procrustes
from scipy.optimize import linear_sum_assignment

from countvae.errors import InvalidArgumentError

MAP_CLASSES: tuple[str, ...] = ("identity", "permutation", "orthogonal", "linear", "ica")

#: Cells on which the diameter (an O(n^2) maximum) is computed at most.
MAX_DIAMETER_CELLS = 10_000
#: Cells ICA is fitted on at most (the rotation is then applied to every cell).
MAX_ICA_CELLS = 10_000


@dataclass(frozen=True)
class AffineMap:
    """``T(z) = z @ matrix + offset`` for row vectors ``z``."""

    matrix: np.ndarray
    offset: np.ndarray

    def __call__(self, z: np.ndarray) -> np.ndarray:
        """Apply the map to the rows of ``z``."""
        return z @ self.matrix + self.offset


@dataclass(frozen=True)
class ICAAxes:
    """A fit's latents in ICA axes: ``s = (z - mean) @ unmixing``, ``z = s @ mixing + mean``."""

    mean: np.ndarray
    unmixing: np.ndarray
    mixing: np.ndarray

    def transform(self, z: np.ndarray) -> np.ndarray:
        """Sources of ``z``."""
        return (z - self.mean) @ self.unmixing


def fit_ica_axes(z: np.ndarray, random_state: int = 0, max_iter: int = 1000, max_cells: int = MAX_ICA_CELLS) -> ICAAxes:
    """Whiten ``z`` and rotate it to maximally non-Gaussian axes with :class:`countvae.ica.ICARotation`.

    Only the rotation matters here (components are matched across fits
    afterwards), so the Gaussian null behind ``ICARotation``'s flags is skipped
    (``n_null=0``); :func:`countvae.ica.ica_stability` reports those flags.

    Parameters
    ----------
    z
        Latent means, (cells, d).
    random_state
        Seed of the ICA's initial rotation (and of the cell subset).
    max_iter
        ICA iterations.
    max_cells
        Fit on a random subset of at most this many cells.

    """
    from countvae.ica import ICARotation

    if len(z) > max_cells:
        z = z[np.sort(np.random.default_rng(random_state).choice(len(z), max_cells, replace=False))]
    with warnings.catch_warnings():
        # A non-converged ICA still returns a valid rotation; the cross-fit error
        # (and the ICA efficiency) then shows how useful it is.
        warnings.simplefilter("ignore")
        ica = ICARotation(random_state=random_state, max_iter=max_iter, n_null=0).fit(z)
    return ICAAxes(mean=ica.mean_.copy(), unmixing=ica.components_.T.copy(), mixing=ica.mixing_.T.copy())


def signed_permutation(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The signed permutation ``P`` that best matches the columns of ``a`` to those of ``b``.

    Columns are matched by the Hungarian algorithm on the absolute Pearson
    correlations (scale-free, unlike the raw cross-product ``a^T b``); each
    matched pair gets the sign of its correlation. ``a @ P`` has ``b``'s column
    order and signs.
    """
    corr = _cross_correlation(a, b)
    rows, cols = linear_sum_assignment(-np.abs(corr))
    p = np.zeros_like(corr)
    p[rows, cols] = np.where(corr[rows, cols] < 0, -1.0, 1.0)
    return p


def _cross_correlation(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ac = a - a.mean(0)
    bc = b - b.mean(0)
    sa = np.linalg.norm(ac, axis=0)
    sb = np.linalg.norm(bc, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = (ac.T @ bc) / np.outer(sa, sb)
    return np.nan_to_num(corr)


def fit_map(
    kind: str,
    za: np.ndarray,
    zb: np.ndarray,
    ica_a: ICAAxes | None = None,
    ica_b: ICAAxes | None = None,
) -> AffineMap:
    """Fit a map of class ``kind`` taking ``za`` to ``zb`` (rows are the same cells).

    Parameters
    ----------
    kind
        One of :data:`MAP_CLASSES`.
    za, zb
        Latent means of the two fits on the fitting cells, (cells, d).
    ica_a, ica_b
        ICA axes of each fit (required for ``kind="ica"``; see :func:`fit_ica_axes`).

    """
    ma, mb = za.mean(0), zb.mean(0)
    d_a, d_b = za.shape[1], zb.shape[1]
    if kind == "linear":
        design = np.column_stack([za, np.ones(len(za))])
        coef, *_ = np.linalg.lstsq(design, zb, rcond=None)
        return AffineMap(coef[:-1], coef[-1])
    if d_a != d_b:
        raise InvalidArgumentError(f"A {kind!r} map needs latents of equal width, got {d_a} and {d_b}.")
    if kind == "identity":
        return AffineMap(np.eye(d_a), np.zeros(d_a))
    if kind == "permutation":
        p = signed_permutation(za, zb)
        return AffineMap(p, mb - ma @ p)
    if kind == "orthogonal":
        r, _ = orthogonal_procrustes(za - ma, zb - mb)
        return AffineMap(r, mb - ma @ r)
    if kind == "ica":
        if ica_a is None or ica_b is None:
            raise InvalidArgumentError("An 'ica' map needs the ICA axes of both fits.")
        sa, sb = ica_a.transform(za), ica_b.transform(zb)
        p = signed_permutation(sa, sb)
        matched = sa @ p
        scale = np.std(sb, axis=0) / np.maximum(np.std(matched, axis=0), 1e-12)
        matrix = ica_a.unmixing @ p @ np.diag(scale) @ ica_b.mixing
        return AffineMap(matrix, ica_b.mean - ica_a.mean @ matrix)
    raise InvalidArgumentError(f"Unknown map class {kind!r}; choose from {MAP_CLASSES}.")


def latent_diameter(z: np.ndarray, max_cells: int = MAX_DIAMETER_CELLS, seed: int = 0, chunk: int = 2048) -> float:
    """Largest pairwise Euclidean distance among the rows of ``z`` (at most ``max_cells`` of them, at random)."""
    if len(z) > max_cells:
        z = z[np.sort(np.random.default_rng(seed).choice(len(z), max_cells, replace=False))]
    z = np.asarray(z, dtype=np.float64)
    z = z - z.mean(0)
    sq = np.einsum("ij,ij->i", z, z)
    best = 0.0
    for start in range(0, len(z), chunk):
        block = z[start : start + chunk]
        d2 = sq[start : start + chunk, None] + sq[None, :] - 2.0 * block @ z.T
        best = max(best, float(d2.max()))
    return float(np.sqrt(max(best, 0.0)))


def rms_distance(z: np.ndarray) -> float:
    """Root mean squared distance between two random rows of ``z``: ``sqrt(2 tr Cov z)``."""
    return float(np.sqrt(2.0 * np.var(z, axis=0, ddof=1).sum()))


def split_halves(n_cells: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random halves of ``range(n_cells)``: cells to fit maps on, cells to score them on."""
    if n_cells < 4:
        raise InvalidArgumentError(f"Alignment needs at least 4 held-out cells, got {n_cells}.")
    order = np.random.default_rng(seed).permutation(n_cells)
    half = n_cells // 2
    return np.sort(order[:half]), np.sort(order[half:])


@dataclass
class _FitView:
    """One fit's latents split into fitting and scoring cells, with its normalisers."""

    fit_cells: np.ndarray
    score_cells: np.ndarray
    diameter: float
    rms: float
    ica: ICAAxes | None


def _view(z: np.ndarray, fit_idx: np.ndarray, score_idx: np.ndarray, ica: bool, seed: int) -> _FitView:
    zs = z[score_idx]
    return _FitView(
        fit_cells=z[fit_idx],
        score_cells=zs,
        diameter=latent_diameter(zs, seed=seed),
        rms=rms_distance(zs),
        ica=fit_ica_axes(z[fit_idx], random_state=seed) if ica else None,
    )


def _directed_error(kind: str, a: _FitView, b: _FitView) -> tuple[float, float]:
    """Mean scoring-cell distance of ``T(z_a)`` to ``z_b``, over b's diameter and b's RMS distance."""
    t = fit_map(kind, a.fit_cells, b.fit_cells, a.ica, b.ica)
    dist = np.linalg.norm(t(a.score_cells) - b.score_cells, axis=1).mean()
    return float(dist / b.diameter) if b.diameter > 0 else np.nan, float(dist / b.rms) if b.rms > 0 else np.nan


def alignment_errors(
    latents: Mapping[str, np.ndarray],
    map_classes: Sequence[str] = MAP_CLASSES,
    seed: int = 0,
) -> pd.DataFrame:
    """Symmetrised alignment errors of every pair of fits under each map class.

    Parameters
    ----------
    latents
        Fit name -> latent means on the same held-out cells, (cells, d) each, rows aligned.
    map_classes
        Which of :data:`MAP_CLASSES` to score.
    seed
        Seed of the fit/score split of the cells (and of the ICA and of the
        diameter's subsample).

    Returns
    -------
    pandas.DataFrame
        One row per (pair, map class) with columns ``fit_a``, ``fit_b``, ``map``,
        ``error_diameter`` (the symmetrised error over the diameter),
        ``error_rms`` (over the RMS pairwise distance), ``error_a_to_b``,
        ``error_b_to_a`` (directed, over the diameter), ``n_fit_cells``,
        ``n_score_cells``.

    """
    names = list(latents)
    if len(names) < 2:
        raise InvalidArgumentError("Alignment needs at least two fits.")
    unknown = [m for m in map_classes if m not in MAP_CLASSES]
    if unknown:
        raise InvalidArgumentError(f"Unknown map classes {unknown}; choose from {MAP_CLASSES}.")
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in latents.items()}
    n_cells = {v.shape[0] for v in arrays.values()}
    if len(n_cells) != 1:
        raise InvalidArgumentError(f"All latents must cover the same cells; got row counts {sorted(n_cells)}.")
    for k, v in arrays.items():
        if not np.isfinite(v).all():
            raise InvalidArgumentError(f"The latents of {k!r} contain NaN or infinite values.")
    fit_idx, score_idx = split_halves(n_cells.pop(), seed)
    views = {k: _view(v, fit_idx, score_idx, "ica" in map_classes, seed) for k, v in arrays.items()}
    rows = []
    for a, b in combinations(names, 2):
        for kind in map_classes:
            ab_d, ab_r = _directed_error(kind, views[a], views[b])
            ba_d, ba_r = _directed_error(kind, views[b], views[a])
            rows.append(
                {
                    "fit_a": a,
                    "fit_b": b,
                    "map": kind,
                    "error_diameter": 0.5 * (ab_d + ba_d),
                    "error_rms": 0.5 * (ab_r + ba_r),
                    "error_a_to_b": ab_d,
                    "error_b_to_a": ba_d,
                    "n_fit_cells": len(fit_idx),
                    "n_score_cells": len(score_idx),
                }
            )
    return pd.DataFrame(rows)


def ica_efficiency(errors: pd.DataFrame, column: str = "error_diameter") -> pd.DataFrame:
    """``(e_perm - e_ICA) / (e_perm - e_orthogonal)`` per pair of fits.

    NaN where the permutation and orthogonal errors coincide (within 1e-12): the
    fits are then already aligned up to a signed permutation and there is no
    gap for ICA to close.

    Returns
    -------
    pandas.DataFrame
        Columns ``fit_a``, ``fit_b``, ``e_permutation``, ``e_orthogonal``, ``e_ica``, ``ica_efficiency``.

    """
    wide = errors.pivot_table(index=["fit_a", "fit_b"], columns="map", values=column, sort=False)
    missing = {"permutation", "orthogonal", "ica"} - set(wide.columns)
    if missing:
        raise InvalidArgumentError(f"ICA efficiency needs the map classes {sorted(missing)} in the errors table.")
    gap = wide["permutation"] - wide["orthogonal"]
    eff = (wide["permutation"] - wide["ica"]) / gap.where(gap.abs() > 1e-12)
    out = pd.DataFrame(
        {
            "e_permutation": wide["permutation"],
            "e_orthogonal": wide["orthogonal"],
            "e_ica": wide["ica"],
            "ica_efficiency": eff,
        }
    )
    return out.reset_index()


def summarize_alignment(errors: pd.DataFrame) -> pd.DataFrame:
    """Mean, minimum and maximum error over pairs of fits, per map class (rows in :data:`MAP_CLASSES` order)."""
    grouped = errors.groupby("map", sort=False)[["error_diameter", "error_rms"]]
    out = grouped.agg(["mean", "min", "max"])
    out.columns = [f"{a}_{b}" for a, b in out.columns]
    order = [m for m in MAP_CLASSES if m in out.index]
    return out.loc[order].reset_index()
