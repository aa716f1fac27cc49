"""Cross-seed R-hat: seeds as chains, draws from each fit's guide as draws.

If the seeds had found one and the same posterior, draws of any quantity from
different seeds would be draws from one distribution and R-hat would be near 1.
For latent coordinates under a rotation-invariant prior each seed lands in its own
rotation, so R-hat of raw coordinates is far above 1 even for perfectly
equivalent fits. Invariant quantities (distances between cells, decoded means)
and coordinates after aligning each seed to a reference seed with an orthogonal
Procrustes map should have R-hat near 1; where they do not, the seeds differ by
more than their posterior uncertainty, which no choice of coordinates explains.

R-hat is the rank-normalised split R-hat of Vehtari et al. (2021) as computed by
arviz, with its recommended threshold of 1.01; ESS is arviz's bulk and tail ESS.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations

import anndata as ad
import numpy as np
import pandas as pd

from countvae import _arviz
from countvae.diagnostics.analyses.alignment import AffineMap, fit_map
from countvae.diagnostics.fitting.fitted_model import FittedModel
from countvae.errors import InvalidArgumentError

#: R-hat above this marks a parameter whose chains (seeds) disagree (Vehtari et al., 2021).
RHAT_THRESHOLD = 1.01

QUANTITIES = ("raw coordinates", "aligned coordinates", "pairwise distances", "decoded log means")


def procrustes_to_reference(latents: Mapping[str, np.ndarray], reference: str) -> dict[str, AffineMap]:
    """Orthogonal Procrustes maps taking each fit's latent means to the reference fit's.

    Parameters
    ----------
    latents
        Fit name -> latent means on the same cells.
    reference
        Name of the fit whose coordinates the others are expressed in.

    """
    ref = np.asarray(latents[reference], dtype=np.float64)
    return {k: fit_map("orthogonal", np.asarray(v, dtype=np.float64), ref) for k, v in latents.items()}


def _pairwise_distances(draws: np.ndarray) -> np.ndarray:
    """(draws, cells, d) -> (draws, cell pairs) Euclidean distances."""
    pairs = np.array(list(combinations(range(draws.shape[1]), 2)))
    return np.linalg.norm(draws[:, pairs[:, 0]] - draws[:, pairs[:, 1]], axis=-1)


def collect_draws(
    fits: Sequence[FittedModel],
    adata_cells: ad.AnnData,
    n_draws: int = 100,
    gene_positions: np.ndarray | None = None,
    maps: Mapping[str, AffineMap] | None = None,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Draws of each quantity from each fit's guide, shaped (chains, draws, parameters).

    Chain ``c`` (fit ``c``) uses the guide noise seed ``seed + c`` so that the
    chains are independent even when two fits are identical.

    Parameters
    ----------
    fits
        The fits (chains).
    adata_cells
        The few held-out cells whose posteriors are compared (at least 2).
    n_draws
        Draws per chain.
    gene_positions
        Positions of the genes whose decoded log means are tracked; none when ``None``.
    maps
        Fit name -> map into the reference fit's coordinates (see
        :func:`procrustes_to_reference`); aligned coordinates are skipped when ``None``.
    seed
        Base seed of the draws.

    """
    if adata_cells.n_obs < 2:
        raise InvalidArgumentError("Cross-seed R-hat needs at least 2 cells.")
    if n_draws < 4:
        raise InvalidArgumentError(f"Cross-seed R-hat needs at least 4 draws per seed, got {n_draws}.")
    out: dict[str, list[np.ndarray]] = {q: [] for q in QUANTITIES}
    for c, fit in enumerate(fits):
        z = np.asarray(fit.latent_samples(adata_cells, n_draws, seed + c), dtype=np.float64)
        out["raw coordinates"].append(z.reshape(n_draws, -1))
        if maps is not None:
            out["aligned coordinates"].append(maps[fit.name](z).reshape(n_draws, -1))
        out["pairwise distances"].append(_pairwise_distances(z))
        if gene_positions is not None and len(gene_positions):
            log_rate = np.asarray(fit.decode_log_rate(adata_cells, z.astype(np.float32)), dtype=np.float64)
            out["decoded log means"].append(log_rate[..., gene_positions].reshape(n_draws, -1))
    return {q: np.stack(v) for q, v in out.items() if v}


def rhat_table(draws: Mapping[str, np.ndarray]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """R-hat and ESS of every parameter, and a summary per quantity.

    Parameters
    ----------
    draws
        Quantity -> (chains, draws, parameters), e.g. from :func:`collect_draws`.

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
