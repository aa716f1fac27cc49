"""How well the latent space of one fit maps onto another's, under five classes of map.

For two fits ``a`` and ``b`` evaluated on the same held-out cells, a map ``T`` from ``a``'s latent means to ``b``'s
is fitted on one half of the cells and scored on the other half (a general linear map has ``d^2 + d`` parameters and
would flatter itself in-sample). The classes of map (identity, signed permutation, orthogonal, linear, ICA) are
defined in :mod:`countvae.diagnostics.analyses.maps`; they are fitted by a
:class:`~countvae.diagnostics.analyses.maps.PairMaps` on the fitting half, once per pair.

The error of ``T`` is the mean Euclidean distance per scoring cell between ``T(z_a)`` and ``z_b``, divided by the
diameter of ``z_b`` (largest pairwise distance, on at most ``max_diameter_cells`` cells) as in Table 1 of Nelson,
Fumero, Karaletsos and Locatello (2026), and also by the RMS pairwise distance ``sqrt(2 tr Cov z_b)``, which is not
driven by one outlying cell. Both directions ``a -> b`` and ``b -> a`` are scored and averaged. The classes are
nested (signed permutations are rotations, rotations are linear maps), so ``e_linear <= e_orthogonal <=
e_permutation`` is expected; it is not exact on the scoring cells, because each map is fitted on the other half.

The ICA efficiency ``(e_perm - e_ICA) / (e_perm - e_orthogonal)`` is the share of the gap between the best signed
permutation and the best rotation that ICA closes without the cell pairing: 1 means ICA found the aligning rotation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import pandas as pd

from countvae.diagnostics.analyses.maps import MAP_CLASSES, AffineMap, PairMaps
from countvae.errors import InvalidArgumentError

__all__ = [
    "MAP_CLASSES",
    "alignment_errors",
    "ica_efficiency",
    "latent_diameter",
    "rms_distance",
    "split_halves",
    "summarize_alignment",
]

#: Cells on which the diameter (an O(n^2) maximum) is computed at most.
MAX_DIAMETER_CELLS = 10_000


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
class _ScoringCells:
    """One fit's latents on the scoring cells, with its normalisers."""

    latents: np.ndarray
    diameter: float
    rms: float


def _scoring_cells(z: np.ndarray, seed: int) -> _ScoringCells:
    return _ScoringCells(latents=z, diameter=latent_diameter(z, seed=seed), rms=rms_distance(z))


def _directed_error(t: AffineMap, a: _ScoringCells, b: _ScoringCells) -> tuple[float, float]:
    """Mean scoring-cell distance of ``T(z_a)`` to ``z_b``, over b's diameter and b's RMS distance."""
    dist = np.linalg.norm(t(a.latents) - b.latents, axis=1).mean()
    return float(dist / b.diameter) if b.diameter > 0 else np.nan, float(dist / b.rms) if b.rms > 0 else np.nan


def alignment_errors(
    latents: Mapping[str, np.ndarray], map_classes: Sequence[str] = MAP_CLASSES, seed: int = 0
) -> pd.DataFrame:
    """Symmetrised alignment errors of every pair of fits under each map class.

    Parameters
    ----------
    latents
        Fit name -> latent means on the same held-out cells, (cells, d) each, rows aligned.
    map_classes
        Which of :data:`MAP_CLASSES` to score.
    seed
        Seed of the fit/score split of the cells (and of the ICAs and of the diameter's subsample).

    Returns
    -------
    pandas.DataFrame
        One row per (pair, map class) with columns ``fit_a``, ``fit_b``, ``map``, ``error_diameter`` (the
        symmetrised error over the diameter), ``error_rms`` (over the RMS pairwise distance), ``error_a_to_b``,
        ``error_b_to_a`` (directed, over the diameter), ``n_fit_cells``, ``n_score_cells``.

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
    maps = PairMaps({k: v[fit_idx] for k, v in arrays.items()}, seed=seed)
    scoring = {k: _scoring_cells(v[score_idx], seed) for k, v in arrays.items()}
    rows = []
    for a, b in combinations(names, 2):
        for kind in map_classes:
            ab_d, ab_r = _directed_error(maps.map(kind, a, b), scoring[a], scoring[b])
            ba_d, ba_r = _directed_error(maps.map(kind, b, a), scoring[b], scoring[a])
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

    NaN where the orthogonal error is not below the permutation error (by more than 1e-12): on the scoring cells the
    best rotation does no better than the best signed permutation, so there is no gap to measure ICA against. That
    does not mean the fits are aligned (both maps may be poor, and ICA may beat both: compare ``e_ica`` with them).
    Both maps are fitted on one half of the cells and scored on the other, so on the scoring half the rotation can
    come out worse; dividing by that negative gap would flip the ratio's sign (ICA worse than both maps read as
    above 1).

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
    eff = (wide["permutation"] - wide["ica"]) / gap.where(gap > 1e-12)
    return pd.DataFrame(
        {
            "e_permutation": wide["permutation"],
            "e_orthogonal": wide["orthogonal"],
            "e_ica": wide["ica"],
            "ica_efficiency": eff,
        }
    ).reset_index()


def summarize_alignment(errors: pd.DataFrame) -> pd.DataFrame:
    """Mean, minimum and maximum error over pairs of fits, per map class (rows in :data:`MAP_CLASSES` order)."""
    grouped = errors.groupby("map", sort=False)[["error_diameter", "error_rms"]]
    out = grouped.agg(["mean", "min", "max"])
    out.columns = [f"{a}_{b}" for a, b in out.columns]
    order = [m for m in MAP_CLASSES if m in out.index]
    return out.loc[order].reset_index()
