"""Are the seeds predictively equivalent? Held-out log predictive densities and their paired differences.

Every orthogonal reparameterization of a fit has exactly the same ``p(x)``, so
seeds that found the same solution up to a rotation must predict held-out cells
equally well. Differences beyond Monte Carlo and sampling noise mean the seeds
reached different optima (or did not converge), not that they chose different
coordinates.

Definitions (all log densities in nats, higher is better):

- ``elpd`` of a fit: the sum over held-out cells of its estimated ``log p(x_i)``.
- ``se``: the sampling standard error of that sum over cells, ``sqrt(n) sd_i``.
- ``mc_se``: the Monte Carlo standard error of the sum from the importance
  sampler, ``sqrt(sum_i mc_se_i^2)`` (cells are estimated independently).
- For two fits, ``diff = elpd_a - elpd_b`` and its paired standard error
  ``se_diff = sqrt(n) sd_i(lpd_ai - lpd_bi)``; the pairing removes the large
  between-cell variation that both fits share. The paired per-cell differences
  already carry each cell's Monte Carlo noise, so ``se_diff`` includes it.
- The fits are **predictively equivalent** when every pair has
  ``|diff| < 2 se_diff`` (the ``equivalent`` column of :func:`pairwise_table`,
  read by :func:`countvae.diagnostics.reporting.verdicts.predictive_verdict`):
  no difference in held-out fit is detectable on these cells at about the 5%
  level. It is a statement about what this many cells can resolve, not a proof
  of equal ``p(x)``: more held-out cells shrink ``se_diff``
  like ``1 / sqrt(n)`` relative to the total.
- ``n_unreliable``: cells whose estimate failed the Pareto k-hat check (column
  ``reliable`` of the per-cell frames, when present; their ``mc_se`` is NaN, so the
  Monte Carlo totals are NaN too). Whether a comparison with such cells can be
  trusted is for the verdict to decide; these tables only count them.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import combinations

import numpy as np
import pandas as pd

from countvae import _arviz
from countvae.errors import InvalidArgumentError

#: Pairwise differences smaller than this many paired standard errors count as equivalent.
EQUIVALENCE_Z = 2.0


def _check(lpds: Mapping[str, pd.DataFrame]) -> None:
    if len(lpds) < 2:
        raise InvalidArgumentError("Comparing predictive fit needs at least two fits.")
    lengths = {len(v) for v in lpds.values()}
    if len(lengths) != 1:
        raise InvalidArgumentError(f"All fits must be evaluated on the same cells; got {sorted(lengths)} cells.")
    first = next(iter(lpds.values())).index
    for name, frame in lpds.items():
        if "lpd" not in frame or "mc_se" not in frame:
            raise InvalidArgumentError(f"The log predictive densities of {name!r} need columns 'lpd' and 'mc_se'.")
        if not frame.index.equals(first):
            raise InvalidArgumentError(f"The held-out cells of {name!r} differ from those of the first fit.")
        if not np.isfinite(frame["lpd"].to_numpy()).all():
            raise InvalidArgumentError(f"The log predictive densities of {name!r} contain NaN or infinite values.")


def _unreliable(frame: pd.DataFrame) -> np.ndarray:
    """Per cell, whether its estimate is flagged unreliable (all False without a ``reliable`` column)."""
    if "reliable" not in frame:
        return np.zeros(len(frame), dtype=bool)
    return ~frame["reliable"].to_numpy(dtype=bool)


def per_fit_table(lpds: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per fit: held-out log predictive density with its sampling and Monte Carlo errors.

    Parameters
    ----------
    lpds
        Fit name -> per-cell frame with columns ``lpd`` and ``mc_se`` (as returned
        by :meth:`FittedModel.log_predictive_density`), on the same cells.

    Returns
    -------
    pandas.DataFrame
        Columns ``fit``, ``n_cells``, ``elpd``, ``se``, ``mc_se``, ``lpd_per_cell``
        (``elpd / n``), ``se_per_cell``, ``mc_se_per_cell``, ``max_cell_mc_se`` and ``n_unreliable``.

    """
    _check(lpds)
    rows = []
    for name, frame in lpds.items():
        values = frame["lpd"].to_numpy(dtype=np.float64)
        mc = frame["mc_se"].to_numpy(dtype=np.float64)
        n = values.size
        se = float(np.sqrt(n) * values.std(ddof=1)) if n > 1 else np.nan
        mc_total = float(np.sqrt(np.sum(mc**2)))
        rows.append(
            {
                "fit": name,
                "n_cells": n,
                "elpd": float(values.sum()),
                "se": se,
                "mc_se": mc_total,
                "lpd_per_cell": float(values.mean()),
                "se_per_cell": se / n,
                "mc_se_per_cell": mc_total / n,
                "max_cell_mc_se": float(mc.max()),
                "n_unreliable": int(_unreliable(frame).sum()),
            }
        )
    return pd.DataFrame(rows)


def pairwise_table(lpds: Mapping[str, pd.DataFrame], z: float = EQUIVALENCE_Z) -> pd.DataFrame:
    """Paired differences in held-out ``elpd`` for every pair of fits.

    Returns
    -------
    pandas.DataFrame
        Columns ``fit_a``, ``fit_b``, ``n_cells``, ``diff`` (``elpd_a - elpd_b``), ``se_diff``
        (paired, per cell), ``mc_se_diff``, ``diff_per_cell``,
        ``se_diff_per_cell``, ``z`` (``diff / se_diff``), ``equivalent``
        (``|diff| < z * se_diff``) and ``n_unreliable`` (cells unreliable in either fit).

    """
    _check(lpds)
    rows = []
    for a, b in combinations(list(lpds), 2):
        d = lpds[a]["lpd"].to_numpy(dtype=np.float64) - lpds[b]["lpd"].to_numpy(dtype=np.float64)
        n = d.size
        se = float(np.sqrt(n) * d.std(ddof=1)) if n > 1 else np.nan
        mc = float(np.sqrt(np.sum(lpds[a]["mc_se"].to_numpy() ** 2 + lpds[b]["mc_se"].to_numpy() ** 2)))
        diff = float(d.sum())
        ratio = diff / se if se > 0 else (0.0 if diff == 0 else np.inf)
        rows.append(
            {
                "fit_a": a,
                "fit_b": b,
                "n_cells": n,
                "diff": diff,
                "se_diff": se,
                "mc_se_diff": mc,
                "diff_per_cell": diff / n,
                "se_diff_per_cell": se / n,
                "z": ratio,
                "equivalent": bool(abs(ratio) < z),
                "n_unreliable": int((_unreliable(lpds[a]) | _unreliable(lpds[b])).sum()),
            }
        )
    return pd.DataFrame(rows)


def compare_table(lpds: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """The arviz comparison table (ranks, ``elpd_diff``, ``dse``, stacking weights), see :mod:`countvae._arviz`."""
    _check(lpds)
    return _arviz.compare_pointwise({k: v["lpd"].to_numpy() for k, v in lpds.items()})
