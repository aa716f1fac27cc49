"""Which ICA components of a model reproduce across seeds: the report's per-component stability table.

The alignment step (:mod:`countvae.diagnostics.analyses.alignment`) asks how well ICA
aligns two seeds as a whole; this module asks it per component, Icasso-style
(Himberg et al. 2004), with :func:`countvae.ica.ica_stability`: the first fit's
ICA is estimated on one random half of the held-out cells, every other fit's
ICA on the other half, and each component of the first fit is matched
(Hungarian, on |correlation| over all held-out cells) to the components of each
other fit. A component reproduces when its best-match |correlation|, averaged
over the other fits, is at least the threshold (0.95).

A component can fail to reproduce for two reasons, which the table tells apart
with a baseline: ``same_fit_match`` is the same comparison between the first
fit's ICA on one half of the cells and the *same fit's* ICA on the other half.
When that is high but the match across seeds is low, the seeds' solutions
differ along that component; when both are low, the cells are too few (or the
direction too close to Gaussian) to fix the axis even within one fit.

Estimating the ICAs on disjoint halves matters: seeds of a VAE agree nearly up
to a linear map on the same cells, so ICA on the same cells finds the same
accidental non-Gaussian directions of a Gaussian sample in every seed, and even
Gaussian components would look reproducible (see :func:`countvae.ica.ica_stability`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from countvae.errors import InvalidArgumentError
from countvae.ica import ica_stability

#: Columns of the per-component table, in order.
COMPONENT_COLUMNS = (
    "component",
    "reference_fit",
    "mean_match",
    "median_match",
    "min_match",
    "same_fit_match",
    "excess_kurtosis",
    "negentropy",
    "gaussian",
    "reproducible",
)
#: Columns of the per-fit match table (long format).
MATCH_COLUMNS = ("fit", "component", "best_match")


def empty_tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    """The two tables with their columns and no rows (the report without ICA)."""
    return pd.DataFrame(columns=list(COMPONENT_COLUMNS)), pd.DataFrame(columns=list(MATCH_COLUMNS))


def ica_component_stability(
    latents: Mapping[str, np.ndarray], threshold: float = 0.95, seed: int = 0
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-component reproducibility of ICA across fits, on the same held-out cells.

    Parameters
    ----------
    latents
        Fit name -> latent means on the same cells, (cells, d) each; the first
        fit is the reference whose components are listed.
    threshold
        A component reproduces when its mean best-match |correlation| is at least this.
    seed
        Seed of the split into halves and of the ICA initialisations.

    Returns
    -------
    table : pandas.DataFrame
        One row per component of the reference fit's ICA (``IC_0`` is its most
        non-Gaussian component), with the columns :data:`COMPONENT_COLUMNS`:
        ``mean_match``, ``median_match`` and ``min_match`` over the other fits,
        ``same_fit_match`` (the baseline within the first fit: its own ICA on
        the other half of the cells), the reference component's ``excess_kurtosis`` and ``negentropy``,
        ``gaussian`` (too close to Gaussian to be identified, see
        :class:`countvae.ica.ICARotation`) and ``reproducible``.
    matches : pandas.DataFrame
        Best-match |correlation| of each reference component in each other fit
        (columns :data:`MATCH_COLUMNS`).

    Raises
    ------
    InvalidArgumentError
        For fewer than two fits or a threshold outside (0, 1].

    """
    names = list(latents)
    if len(names) < 2:
        raise InvalidArgumentError(f"ICA component stability needs at least two fits, got {len(names)}.")
    result = ica_stability(
        [np.asarray(latents[n], dtype=np.float64) for n in names],
        resample="halves",
        threshold=threshold,
        random_state=seed,
    )
    reference = result.reference
    # Same halves and the same reference ICA (same random_state and cell count); the other ICA is the first fit's own.
    first = np.asarray(latents[names[0]], dtype=np.float64)
    baseline = ica_stability([first, first], resample="halves", threshold=threshold, random_state=seed)
    table = pd.DataFrame(
        {
            "component": list(result.table.index),
            "reference_fit": names[0],
            "mean_match": result.table["mean"].to_numpy(),
            "median_match": result.table["median"].to_numpy(),
            "min_match": result.table["min"].to_numpy(),
            "same_fit_match": baseline.table["mean"].to_numpy(),
            "excess_kurtosis": reference.kurtosis_,
            "negentropy": reference.negentropy_,
            "gaussian": result.table["gaussian"].to_numpy(dtype=bool),
            "reproducible": result.table["reproducible"].to_numpy(dtype=bool),
        }
    )
    matches = result.matches.set_axis(names[1:], axis=0)
    long = (
        matches.rename_axis(index="fit", columns="component")
        .stack()
        .rename("best_match")
        .reset_index()
        .loc[:, list(MATCH_COLUMNS)]
    )
    return table, long
