"""Cross-seed R-hat: seeds as chains, draws from each fit's guide as draws.

If the seeds had found one and the same posterior, draws of any quantity from
different seeds would be draws from one distribution and R-hat would be near 1.
For latent coordinates under a rotation-invariant prior each seed lands in its own
rotation, so R-hat of raw coordinates is far above 1 even for perfectly
equivalent fits. Invariant quantities (distances between cells, decoded means)
and coordinates after aligning each seed to a reference seed with an orthogonal
Procrustes map should have R-hat near 1; where they do not, the seeds differ by
more than their posterior uncertainty, which no choice of coordinates explains.

The draws come from each fit's guide on a few held-out cells
(:func:`countvae.diagnostics.reporting.collect.guide_draws`); the maps into the
reference fit's coordinates are those of
:meth:`countvae.diagnostics.analyses.maps.PairMaps.to_reference`, shared with the
invariants table.

R-hat is the rank-normalised split R-hat of Vehtari et al. (2021) as computed by
arviz, with its recommended threshold of 1.01; ESS is arviz's bulk and tail ESS.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import combinations

import numpy as np
import pandas as pd

from countvae import _arviz
from countvae.diagnostics.analyses.maps import AffineMap
from countvae.errors import InvalidArgumentError

#: R-hat above this marks a parameter whose chains (seeds) disagree (Vehtari et al., 2021).
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
        ``"raw coordinates"``, ``"aligned coordinates"``, ``"pairwise distances"``
        (between the cells) and ``"decoded log means"`` -> (chains, draws, parameters),
        for those that apply.

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
        One row per quantity: ``quantity``, ``n_parameters``, ``rhat_median``,
        ``rhat_max``, ``fraction_above`` (share of parameters with R-hat above
        :data:`RHAT_THRESHOLD`), ``ess_bulk_median``, ``ess_bulk_min``,
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
        rhat, bulk, tail = _arviz.rhat_ess(values)
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
