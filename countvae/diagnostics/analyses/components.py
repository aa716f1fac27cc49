"""Which ICA components of a model reproduce across seeds: the one source of the report's ICA verdicts.

Per component, Icasso-style (Himberg et al. 2004): the first fit's ICA is estimated on one half of a set of cells,
every other fit's ICA on the other half, and each component of the first fit is matched (Hungarian, on
|correlation|) to the components of each other fit on the held-out cells. Its ``worst_match`` is the smallest
best-match |correlation| over the other fits (the worst pair with the reference fit), with a bootstrap interval over
the held-out cells the matching is computed on (the ICAs themselves held fixed), bounded through each pair's own
interval as every worst-pair row of the report is (:func:`countvae.diagnostics.analyses.resampling.worst_interval`).

Which cells the ICAs are estimated on matters:

* **the cells the fits were trained on** (``SeedFits.adata_fit``, which every seed shares), split in two disjoint
  halves: many cells, none of them held out. The coordinator's measurement on the embedded demo (5 Laplace sources,
  1,350 cells per half): every component matched at 0.989-0.996 across seeds;
* otherwise, halves of the held-out cells (150 each on the demo: 0.79-0.99, too few cells to fix the axes).

ICAs estimated on the *same* cells are not evidence: seeds of a VAE agree nearly up to a linear map, so ICA finds the
same accidental non-Gaussian directions of a Gaussian sample in each (see :func:`countvae.ica.ica_stability`). The
halves and the ICAs on them are :func:`countvae.ica.split_half_icas`, shared with :func:`countvae.ica.ica_stability`.

Two baselines tell why a component does not reproduce: ``same_fit_match``, the same comparison between the first
fit's ICA on one half and *its own* ICA on the other half (low: too few cells, or too close to Gaussian, to fix the
axis even within one seed), and ``gaussian``, the reference component's negentropy against what ICA finds in
Gaussian noise of that size (:class:`countvae.ica.ICARotation`).

An ICA estimated on a finite half is off its population axis, and that error lowers every match it enters, the same
fit's as much as another seed's: with two seeds that reached one solution, the other fit's ICA and the reference's
own ICA are estimated on the same half and carry the same error. ``corrected_match`` is therefore
``worst_match / same_fit_match`` (Spearman's correction for attenuation, capped at 1), with its interval from each
pair's ratio of the same bootstrap replicates: the match the seeds' ICA axes would have if each were estimated on all
cells of the distribution. Without it, a component matched at 0.936 across seeds whose ICA on 2,000-cell halves
matches itself at 0.95 was called "differ", while the same fits' ICA on 4,000 cells matched at 0.99.
:func:`countvae.diagnostics.reporting.verdicts.judge_components` turns these numbers into verdicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from countvae.diagnostics.analyses.resampling import CellBootstrap, Interval, weighted_correlations, worst_interval
from countvae.errors import InvalidArgumentError
from countvae.ica import attenuation_ratio, split_half_icas
from countvae.metrics import match_components

#: Columns of the per-component table, in order (the verdict columns are added by the verdicts step).
COMPONENT_COLUMNS = (
    "component",
    "reference_fit",
    "worst_match",
    "low",
    "high",
    "mean_match",
    "same_fit_match",
    "corrected_match",
    "corrected_low",
    "corrected_high",
    "excess_kurtosis",
    "negentropy",
    "gaussian",
    "estimated_on",
    "n_estimation_cells",
    "n_matching_cells",
)
#: Columns of the per-fit match table (long format).
MATCH_COLUMNS = ("fit", "component", "best_match")
#: Where the ICAs were estimated.
FIT_CELLS, HELDOUT_CELLS = "halves of the fit cells", "halves of the held-out cells"


@dataclass
class ComponentStability:
    """The per-component table, the per-fit matches, and each fit's ICA sources on the held-out cells.

    Attributes
    ----------
    table
        One row per component of the reference fit (columns :data:`COMPONENT_COLUMNS`).
    matches
        Best-match |correlation| of each reference component in each other fit.
    sources
        Fit name -> its latents on the held-out cells in its own ICA axes (for the ground truth of simulated data).

    """

    table: pd.DataFrame
    matches: pd.DataFrame
    sources: dict[str, np.ndarray]


def empty_stability() -> ComponentStability:
    """The tables with their columns and no rows (the report without ICA)."""
    return ComponentStability(
        pd.DataFrame(columns=list(COMPONENT_COLUMNS)), pd.DataFrame(columns=list(MATCH_COLUMNS)), {}
    )


def _best_matches(reference: np.ndarray, other: np.ndarray, bootstrap: CellBootstrap) -> tuple[np.ndarray, np.ndarray]:
    """Per reference component: its best-match |correlation| in ``other`` and that pair's bootstrap replicates."""
    match = match_components(reference, other)
    k, cells = reference.shape[1], bootstrap.positions
    best, replicates = np.zeros(k), np.zeros((k, len(bootstrap.weights)))
    best[match.rows] = np.abs(match.correlations)
    for r, c in zip(match.rows, match.cols, strict=True):
        pair = weighted_correlations(bootstrap.weights, reference[cells, r][:, None], other[cells, c][:, None])
        replicates[r] = np.abs(pair[:, 0, 0])
    return best, replicates


def _capped(interval: Interval) -> Interval:
    """A corrected match with its interval capped at 1 (a correlation cannot exceed it; above is noise)."""
    return Interval(*(float(min(v, 1.0)) for v in (interval.value, interval.low, interval.high)))


def ica_component_stability(
    heldout: Mapping[str, np.ndarray],
    bootstrap: CellBootstrap,
    fit_cells: Mapping[str, np.ndarray] | None = None,
    alpha: float = 0.05,
    seed: int = 0,
) -> ComponentStability:
    """Per-component reproducibility of ICA across fits.

    Parameters
    ----------
    heldout
        Fit name -> latent means on the same held-out cells, (cells, d); the first fit is the reference whose
        components are listed.
    bootstrap
        Bootstrap weights over the held-out cells (see :mod:`.resampling`).
    fit_cells
        Fit name -> latent means on the same cells the fits were trained on; the ICAs are estimated on halves of
        these when given, else on halves of the held-out cells.
    alpha
        Each side of the interval of ``worst_match`` errs with this probability.
    seed
        Seed of the split into halves and of the ICA initialisations.

    Returns
    -------
    ComponentStability
        ``table`` (one row per component, ``IC_0`` the reference's most non-Gaussian), ``matches``, ``sources``.

    """
    names = list(heldout)
    if len(names) < 2:
        raise InvalidArgumentError(f"ICA component stability needs at least two fits, got {len(names)}.")
    held = {n: np.asarray(z, dtype=np.float64) for n, z in heldout.items()}
    estimation = held if fit_cells is None else {n: np.asarray(fit_cells[n], dtype=np.float64) for n in names}
    split = split_half_icas([estimation[n] for n in names], random_state=seed)
    reference, own, half_a = split.reference, split.own, split.halves[0]
    others = dict(zip(names[1:], split.others, strict=True))
    ref_sources = reference.transform(held[names[0]])
    sources = {names[0]: ref_sources} | {n: ica.transform(held[n]) for n, ica in others.items()}
    k = ref_sources.shape[1]
    matched = [_best_matches(ref_sources, sources[n], bootstrap) for n in others]
    best = np.array([m[0] for m in matched]).reshape(len(others), k)
    replicates = np.array([m[1] for m in matched])
    baseline, own_rep = _best_matches(ref_sources, own.transform(held[names[0]]), bootstrap)
    intervals = [
        worst_interval(list(best[:, c]), list(replicates[:, c]), bootstrap.shrink, alpha, True) for c in range(k)
    ]
    ratios, ratio_rep = attenuation_ratio(best, baseline), attenuation_ratio(replicates, own_rep)
    corrected = [
        _capped(worst_interval(list(ratios[:, c]), list(ratio_rep[:, c]), bootstrap.shrink, alpha, True))
        for c in range(k)
    ]
    table = pd.DataFrame(
        {
            "component": reference.component_names_,
            "reference_fit": names[0],
            "worst_match": best.min(axis=0),
            "low": [iv.low for iv in intervals],
            "high": [iv.high for iv in intervals],
            "mean_match": best.mean(axis=0),
            "same_fit_match": baseline,
            "corrected_match": [iv.value for iv in corrected],
            "corrected_low": [iv.low for iv in corrected],
            "corrected_high": [iv.high for iv in corrected],
            "excess_kurtosis": reference.kurtosis_,
            "negentropy": reference.negentropy_,
            "gaussian": reference.gaussian_.astype(bool),
            "estimated_on": HELDOUT_CELLS if fit_cells is None else FIT_CELLS,
            "n_estimation_cells": len(half_a),
            "n_matching_cells": len(next(iter(held.values()))),
        },
        columns=list(COMPONENT_COLUMNS),
    )
    matches = pd.DataFrame(
        [
            {"fit": n, "component": reference.component_names_[c], "best_match": float(best[i, c])}
            for i, n in enumerate(others)
            for c in range(k)
        ],
        columns=list(MATCH_COLUMNS),
    )
    return ComponentStability(table, matches, sources)
