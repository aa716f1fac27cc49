"""Per-cell and per-gene stability across seeds, and the consensus latent (arrays in, arrays out).

These are the report's numbers resolved to single cells and genes, so that they can sit beside the analyst's own
columns in an AnnData (see :meth:`countvae.diagnostics.DiagnosticReport.write`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import combinations

import numpy as np
import pandas as pd

from countvae.diagnostics.analyses.invariants import concordance
from countvae.diagnostics.analyses.subspace import knn_jaccard_per_cell, knn_sets, knn_sets_among
from countvae.errors import InvalidArgumentError


def _pairs(values: Mapping[str, object]) -> list[tuple[str, str]]:
    if len(values) < 2:
        raise InvalidArgumentError(f"Agreement across seeds needs at least two fits, got {len(values)}.")
    return list(combinations(values, 2))


def cell_knn_agreement(
    latents: Mapping[str, np.ndarray],
    k: int,
    reference: Mapping[str, np.ndarray] | None = None,
    rows: np.ndarray | None = None,
) -> np.ndarray:
    """Per cell, the k-NN Jaccard overlap between the latent means of two fits, averaged over pairs of fits.

    Its mean over cells, for one pair, is the report's k-NN overlap of that pair.

    Parameters
    ----------
    latents
        Fit name -> latent means of the same cells, (cells, n_latent).
    k
        Neighbours per cell.
    reference
        Fit name -> latent means of other cells (the fit cells) among which the neighbours are found too (the
        invariants table's k-NN row does the same).
    rows
        Positions of the cells scored (default: all); the other cells of ``latents`` stay in the graph.

    Returns
    -------
    numpy.ndarray
        (rows,) values in [0, 1]; 1 when every pair of fits gives the cell the same neighbours.

    """
    pairs = _pairs(latents)
    neighbours = {name: _neighbours(z, reference, name, k, rows) for name, z in latents.items()}
    return np.mean([knn_jaccard_per_cell(neighbours[a], neighbours[b]) for a, b in pairs], axis=0)


def _neighbours(
    z: np.ndarray, reference: Mapping[str, np.ndarray] | None, name: str, k: int, rows: np.ndarray | None
) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    rows = np.arange(len(z)) if rows is None else np.asarray(rows)
    others = z[np.setdiff1d(np.arange(len(z)), rows)]
    if reference is not None:
        others = np.vstack([others, np.asarray(reference[name], dtype=np.float64)])
    return knn_sets_among(z[rows], others, k)


def cell_knn_baseline(draws: Mapping[str, np.ndarray], k: int) -> np.ndarray:
    """Per cell, the k-NN Jaccard overlap between two guide draws of one fit, averaged over fits.

    How much a cell's neighbourhood moves under the posterior's own uncertainty, with the seed held fixed.

    Parameters
    ----------
    draws
        Fit name -> two independent draws from the fit's guide on the same cells, (2, cells, n_latent):
        every cell of the graph is drawn again, its neighbours found among the cells of the same draw.
    k
        Neighbours per cell.

    Returns
    -------
    numpy.ndarray
        (cells,) values in [0, 1].

    """
    if not draws:
        raise InvalidArgumentError("The within-seed baseline needs the guide draws of at least one fit.")
    values = []
    for name, z in draws.items():
        z = np.asarray(z, dtype=np.float64)
        if z.ndim != 3 or z.shape[0] != 2:
            raise InvalidArgumentError(f"{name!r}: expected two draws (2, cells, n_latent), got shape {z.shape}.")
        first, second = (knn_sets(draw, k) for draw in z)
        values.append(knn_jaccard_per_cell(first, second))
    return np.mean(values, axis=0)


def cell_lpd_summary(lpds: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per cell, the mean over seeds of held-out log p(x) and its standard deviation across seeds (ddof 1).

    Parameters
    ----------
    lpds
        Fit name -> per-cell held-out log p(x) in nats, on the same cells.

    Returns
    -------
    mean, sd
        (cells,) each; ``sd`` is NaN with a single fit.

    """
    if not lpds:
        raise InvalidArgumentError("No held-out log p(x) to summarize.")
    stacked = np.vstack([np.asarray(v, dtype=np.float64) for v in lpds.values()])
    sd = stacked.std(axis=0, ddof=1) if len(stacked) > 1 else np.full(stacked.shape[1], np.nan)
    return stacked.mean(axis=0), sd


def _per_column(a: np.ndarray, b: np.ndarray, score: Callable[[np.ndarray, np.ndarray], float]) -> np.ndarray:
    return np.array([score(a[:, g], b[:, g]) for g in range(a.shape[1])])


def gene_decoded_agreement(log_rates: Mapping[str, np.ndarray]) -> np.ndarray:
    """Per gene, Lin's concordance of the decoded log means of two fits across cells, averaged over pairs.

    Parameters
    ----------
    log_rates
        Fit name -> decoded log means of the same cells and genes, (cells, genes).

    Returns
    -------
    numpy.ndarray
        (genes,) values in [-1, 1]; 1 when the fits decode the gene identically in every cell.
        A shift or rescaling between fits lowers it (unlike a correlation).

    """
    pairs = _pairs(log_rates)
    shapes = {np.shape(v) for v in log_rates.values()}
    if len(shapes) != 1:
        raise InvalidArgumentError(f"Decoded means of different shapes: {sorted(shapes)}.")
    arrays = {name: np.asarray(v, dtype=np.float64) for name, v in log_rates.items()}
    return np.mean([_per_column(arrays[a], arrays[b], concordance) for a, b in pairs], axis=0)


def de_call_frequency(calls: pd.DataFrame) -> pd.Series:
    """Per gene (row), the fraction of fits (columns) that call it DE."""
    if calls.shape[1] == 0:
        raise InvalidArgumentError("No DE calls: the report was made without DE.")
    return calls.astype(bool).mean(axis=1)


def consensus_latent(
    latents: Mapping[str, np.ndarray], maps: Mapping[str, Callable[[np.ndarray], np.ndarray]]
) -> np.ndarray:
    """The mean over fits of each fit's latent means mapped onto the reference fit.

    Parameters
    ----------
    latents
        Fit name -> latent means of the same cells, (cells, n_latent).
    maps
        Fit name -> the map taking that fit's latents to the reference's (the identity for the reference), e.g. the
        orthogonal maps (Procrustes on centred means, the symmetry group of a N(0, I) prior) of
        :meth:`~countvae.diagnostics.analyses.maps.PairMaps.to_reference`.

    Returns
    -------
    numpy.ndarray
        (cells, n_latent), in the reference fit's coordinates.

    """
    missing = sorted(set(latents) - set(maps))
    if missing:
        raise InvalidArgumentError(f"No map to the reference for {missing}.")
    return np.mean([maps[name](np.asarray(z, dtype=np.float64)) for name, z in latents.items()], axis=0)
