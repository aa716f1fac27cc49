"""On simulated data: how close each fit's coordinates come to the simulation's true sources.

When the held-out cells carry the sources they were simulated from (``obsm["z_true"]``, written by
:func:`countvae.data.simulate`), the report adds what no real data set can show: for each fit, the mean matched
|correlation| (MCC, :func:`countvae.metrics.mcc`) and the modularity InfoM (:func:`countvae.metrics.infomec`, sources
binned into 10 equally populated levels) of its raw latent coordinates and of its ICA coordinates (the ICA of
:mod:`countvae.diagnostics.analyses.components`, estimated on cells other than these). Raw coordinates of a
rotation-invariant model sit in an arbitrary rotation of the sources; ICA coordinates recover non-Gaussian sources up
to order and sign.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from countvae.diagnostics.analyses.subspace import subsample
from countvae.metrics import discretize, infomec, mcc

#: Columns of the ground-truth table.
TRUTH_COLUMNS = ("fit", "coordinates", "mcc", "infom")
#: Cells InfoM is estimated on at most (its k-NN mutual information is superlinear in cells).
MAX_INFOM_CELLS = 2_000


def ground_truth_table(
    latents: Mapping[str, np.ndarray],
    ica_sources: Mapping[str, np.ndarray] | None,
    true_sources: np.ndarray,
    seed: int = 0,
) -> pd.DataFrame:
    """MCC and InfoM of each fit's raw (and ICA) coordinates against the true sources of the same cells.

    Returns
    -------
    pandas.DataFrame
        One row per fit and kind of coordinates (``"raw"``, ``"ICA"``), columns :data:`TRUTH_COLUMNS`.

    """
    truth = np.asarray(true_sources, dtype=np.float64)
    cells = subsample(len(truth), MAX_INFOM_CELLS, seed)
    # ten levels, or two cells per level on fewer than 20 cells (a level of one cell carries no k-NN information)
    labels = discretize(truth[cells], n_bins=max(2, min(10, len(cells) // 2)))
    kinds = {"raw": latents} | ({"ICA": ica_sources} if ica_sources else {})
    rows = []
    for kind, coordinates in kinds.items():
        for name, z in coordinates.items():
            z = np.asarray(z, dtype=np.float64)
            rows.append(
                {
                    "fit": name,
                    "coordinates": kind,
                    "mcc": mcc(z, truth),
                    "infom": infomec(z[cells], labels, random_state=seed).infom,
                }
            )
    return pd.DataFrame(rows, columns=list(TRUTH_COLUMNS))
