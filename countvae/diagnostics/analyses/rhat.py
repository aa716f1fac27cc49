"""Spread of guide draws across seeds: R-hat with seeds as chains and amortized-guide draws as draws.

This is **not** an MCMC convergence diagnostic. The draws come from each fit's amortized guide ``q(z | x)`` on a few
held-out cells (:func:`countvae.diagnostics.reporting.collect.guide_draws`), independent and exact for that guide, so
within one seed there is nothing to converge. R-hat (the rank-normalised split R-hat of Vehtari et al. 2021, as arviz
computes it) answers one question here: is the seed-to-seed spread of a quantity's draws larger than one seed's?

* Raw coordinates: each seed lands in its own rotation, so R-hat is far above 1 even for exactly equivalent fits.
* Coordinates after the orthogonal map to a reference seed
  (:meth:`countvae.diagnostics.analyses.maps.PairMaps.to_reference`), distances between cells and decoded means:
  near 1 only when the seeds' guides agree to within the width of one guide's posterior.

**Baseline.** Two independent sets of draws from the *same* fit give the value R-hat takes when nothing differs but
the draws (the ``baseline_*`` columns); ``fraction_above_baseline`` is the share of parameters whose cross-seed R-hat
exceeds the largest baseline value. A guide's posterior for one cell is narrow (its standard deviation is a fraction
of the between-cell spread), so two seeds whose decoded means agree to a concordance of 0.98 can still sit several
guide-widths apart. Measured on the embedded data of ``countvae diagnose`` (``benchmarks/RESULTS.md``, section
report-embedded), where the five seeds agree on every invariant and all ICA components: median R-hat of aligned
coordinates 1.155, of decoded log means 1.19, against a within-seed baseline of 1.00, with 84-99% of parameters above
the baseline's maximum; exact rotated copies of one fit give the baseline itself
(``tests/diagnostics/analyses/test_rhat.py``, and the copies scenario of ``benchmarks/calibration.py``). Because it
does not separate equivalent from non-equivalent fits, it is left out of the verdicts; the report shows it as a
description of the spread.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import combinations

import numpy as np
import pandas as pd

from countvae import _arviz
from countvae.diagnostics.analyses.maps import AffineMap
from countvae.errors import InvalidArgumentError

#: Vehtari et al.'s (2021) convergence threshold, shown for reference (``fraction_above``); not a verdict here.
RHAT_THRESHOLD = 1.01

QUANTITIES = ("raw coordinates", "aligned coordinates", "pairwise distances", "decoded log means")


def _pairwise_distances(draws: np.ndarray) -> np.ndarray:
    """(draws, cells, d) -> (draws, cell pairs) Euclidean distances."""
    pairs = np.array(list(combinations(range(draws.shape[1]), 2)))
    return np.linalg.norm(draws[:, pairs[:, 0]] - draws[:, pairs[:, 1]], axis=-1)


def rhat_chains(
    latent_draws: Mapping[str, np.ndarray],
    decoded: Mapping[str, np.ndarray] | None = None,
    maps: Mapping[str, AffineMap] | None = None,
) -> dict[str, np.ndarray]:
    """Each quantity's draws from every fit, shaped (chains, draws, parameters).

    Parameters
    ----------
    latent_draws
        Fit name -> draws from its guide, (draws, cells, n_latent), the same cells for every fit (the chains).
    decoded
        Fit name -> decoded log means at those draws, (draws, cells, genes), for the genes tracked; none when ``None``.
    maps
        Fit name -> map into the reference fit's coordinates; aligned coordinates are skipped when ``None``.

    Returns
    -------
    dict
        ``"raw coordinates"``, ``"aligned coordinates"``, ``"pairwise distances"`` (between the cells) and
        ``"decoded log means"`` -> (chains, draws, parameters), for those that apply.

    """
    draws = {name: np.asarray(z, dtype=np.float64) for name, z in latent_draws.items()}
    shapes = {z.shape for z in draws.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 3:
        raise InvalidArgumentError(
            f"Guide draws must be (draws, cells, n_latent) and alike for every fit, got {shapes}."
        )
    n_draws, n_cells, _ = shapes.pop()
    if n_cells < 2:
        raise InvalidArgumentError("Cross-seed R-hat needs at least 2 cells.")
    if n_draws < 4:
        raise InvalidArgumentError(f"Cross-seed R-hat needs at least 4 draws per seed, got {n_draws}.")
    out: dict[str, list[np.ndarray]] = {q: [] for q in QUANTITIES}
    for name, z in draws.items():
        out["raw coordinates"].append(z.reshape(n_draws, -1))
        if maps is not None:
            out["aligned coordinates"].append(maps[name](z).reshape(n_draws, -1))
        out["pairwise distances"].append(_pairwise_distances(z))
        if decoded is not None:
            out["decoded log means"].append(np.asarray(decoded[name], dtype=np.float64).reshape(n_draws, -1))
    return {q: np.stack(v) for q, v in out.items() if v}


def rhat_table(draws: Mapping[str, np.ndarray]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """R-hat and ESS of every parameter, and a summary per quantity.

    Parameters
    ----------
    draws
        Quantity -> (chains, draws, parameters), e.g. from :func:`rhat_chains`.

    Returns
    -------
    summary
        One row per quantity: ``quantity``, ``n_parameters``, ``rhat_median``, ``rhat_max``, ``fraction_above``
        (share of parameters with R-hat above :data:`RHAT_THRESHOLD`), ``ess_bulk_median``, ``ess_bulk_min``,
        ``ess_tail_median``, ``n_chains``, ``n_draws``.
    per_parameter
        ``quantity``, ``parameter`` (position), ``rhat``, ``ess_bulk``, ``ess_tail``.

    """
    rows, per = [], []
    for quantity, values in draws.items():
        if values.ndim != 3 or values.shape[0] < 2:
            raise InvalidArgumentError(
                f"{quantity}: draws must be (chains >= 2, draws, parameters), got {values.shape}."
            )
    # One arviz call for every quantity at once (its overhead per call dominates at these sizes).
    names = list(draws)
    sizes = np.cumsum([draws[q].shape[2] for q in names])[:-1]
    shapes = {draws[q].shape[:2] for q in names}
    if len(shapes) == 1:
        together = _arviz.rhat_ess(np.concatenate([draws[q] for q in names], axis=2))
        results = dict(zip(names, zip(*(np.split(v, sizes) for v in together), strict=True), strict=True))
    else:
        results = {q: _arviz.rhat_ess(draws[q]) for q in names}
    for quantity, values in draws.items():
        rhat, bulk, tail = results[quantity]
        rows.append(
            {
                "quantity": quantity,
                "n_parameters": values.shape[2],
                "rhat_median": float(np.nanmedian(rhat)),
                "rhat_max": float(np.nanmax(rhat)),
                "fraction_above": float(np.mean(rhat > RHAT_THRESHOLD)),
                "ess_bulk_median": float(np.nanmedian(bulk)),
                "ess_bulk_min": float(np.nanmin(bulk)),
                "ess_tail_median": float(np.nanmedian(tail)),
                "n_chains": values.shape[0],
                "n_draws": values.shape[1],
            }
        )
        per.append(
            pd.DataFrame(
                {"quantity": quantity, "parameter": np.arange(values.shape[2]), "rhat": rhat, "ess_bulk": bulk}
                | {"ess_tail": tail}
            )
        )
    return pd.DataFrame(rows), pd.concat(per, ignore_index=True)


def add_baseline(
    summary: pd.DataFrame, per_parameter: pd.DataFrame, baseline_draws: Mapping[str, np.ndarray]
) -> pd.DataFrame:
    """Add the within-seed baseline to :func:`rhat_table`'s summary.

    Parameters
    ----------
    summary, per_parameter
        The cross-seed summary (one row per quantity) and per-parameter table of :func:`rhat_table`.
    baseline_draws
        Quantity -> (2, draws, parameters): two independent draw sets of one fit (as :func:`rhat_chains` shapes
        them, with the fit's own coordinates as "aligned" ones).

    Returns
    -------
    pandas.DataFrame
        ``summary`` with ``baseline_rhat_median``, ``baseline_rhat_max`` and ``fraction_above_baseline`` (share of
        parameters whose cross-seed R-hat is above ``baseline_rhat_max``).

    """
    out = summary.copy()
    medians, maxima, above = [], [], []
    # One arviz call for every quantity at once (its overhead per call dominates at these sizes).
    names = list(baseline_draws)
    sizes = [baseline_draws[q].shape[2] for q in names]
    values = _arviz.rank_rhat(np.concatenate([baseline_draws[q] for q in names], axis=2))
    per = dict(zip(names, np.split(values, np.cumsum(sizes)[:-1]), strict=True))
    for row in summary.itertuples(index=False):
        base = per.get(row.quantity)
        if base is None:
            medians.append(np.nan)
            maxima.append(np.nan)
            above.append(np.nan)
            continue
        medians.append(float(np.nanmedian(base)))
        maxima.append(float(np.nanmax(base)))
        cross = per_parameter.loc[per_parameter["quantity"] == row.quantity, "rhat"].to_numpy()
        above.append(float(np.mean(cross > maxima[-1])))
    out["baseline_rhat_median"] = medians
    out["baseline_rhat_max"] = maxima
    out["fraction_above_baseline"] = above
    return out
