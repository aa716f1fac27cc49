"""Posterior predictive checks per seed: whether counts drawn from each fit look like the data.

The statistics follow ``scvi.criticism.PosteriorPredictiveCheck`` (scvi-tools 1.4.2): the coefficient of variation of
each gene over cells and of each cell over genes, per posterior predictive draw, averaged over draws; the zero fraction
per gene; and the calibration error, the sum over symmetric central intervals (2.5-97.5%, 5-95%, ..., 17.5-82.5%) of the
squared difference between the share of observed counts inside the predictive interval and the interval's nominal width.

Why not call ``scvi.criticism`` itself: it draws samples through ``model.posterior_predictive_sample(model.adata,
...)``, i.e. on the model's own training AnnData rather than the held-out cells, needs an scvi-tools model object
(countvae fits are not), and its calibration error reads the samples of a model named ``"model1"`` whatever the
dictionary holds. Its ``zero_fraction`` also returns the fraction of *non-zero* counts. The code below computes the
same statistics from :meth:`FittedModel.posterior_predictive` on the held-out cells, and reports the fraction of
zeros.

All of these are functions of ``p(x | z)`` integrated over ``q(z | x)``, so an orthogonal reparameterization of a fit
leaves them unchanged. Seeds are compared (:func:`ppc_agreement`) by the concordance of their predicted per-gene
statistics (coefficient of variation and zero fraction; the smaller of the two), the number the invariants table
judges, and, as a description, by their difference in units of the Monte Carlo noise between two halves of one
seed's draws. The noise ratio is not a verdict: it measures whether a difference is detectable, and with enough
cells and draws any difference is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import pandas as pd

from countvae.diagnostics.analyses.resampling import concordance_from_moments
from countvae.errors import InvalidArgumentError

#: Quantile levels of scvi-tools' default calibration error (symmetric pairs).
CALIBRATION_LEVELS = (0.025, 0.05, 0.075, 0.1, 0.125, 0.15, 0.175, 0.825, 0.85, 0.875, 0.9, 0.925, 0.95, 0.975)


@dataclass
class PPCStatistics:
    """Posterior predictive statistics of one fit on a set of cells.

    Attributes
    ----------
    cv_gene, cv_cell
        Predicted coefficient of variation per gene (over cells) and per cell (over genes), averaged over draws.
    zero_fraction
        Predicted fraction of zero counts per gene.
    calibration_error
        See the module docstring; 0 is perfect calibration.
    coverage
        Observed share inside each central interval, by nominal width.

    """

    cv_gene: np.ndarray
    cv_cell: np.ndarray
    zero_fraction: np.ndarray
    calibration_error: float
    coverage: dict[float, float]


def _cv(values: np.ndarray, axis: int) -> np.ndarray:
    mean = values.mean(axis=axis)
    std = values.std(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(mean > 0, std / mean, np.nan)


def observed_statistics(counts: np.ndarray) -> PPCStatistics:
    """The same statistics on the observed counts (cells, genes); calibration is not defined (NaN)."""
    counts = np.asarray(counts, dtype=np.float64)
    return PPCStatistics(_cv(counts, 0), _cv(counts, 1), (counts == 0).mean(0), np.nan, {})


def calibration(counts: np.ndarray, draws: np.ndarray, levels=CALIBRATION_LEVELS) -> tuple[float, dict[float, float]]:
    """Calibration error and coverage of central predictive intervals (scvi-tools' definition).

    Parameters
    ----------
    counts
        Observed counts, (cells, genes).
    draws
        Posterior predictive counts, (cells, genes, draws).
    levels
        Quantile levels, an even number, symmetric around 0.5.

    """
    levels = sorted(levels)
    if len(levels) % 2:
        raise InvalidArgumentError("Calibration needs an even number of quantile levels (symmetric pairs).")
    quantiles = np.quantile(draws, levels, axis=-1)
    error, coverage = 0.0, {}
    for i in range(len(levels) // 2):
        lo, hi = quantiles[i], quantiles[len(levels) - 1 - i]
        width = levels[len(levels) - 1 - i] - levels[i]
        share = float(np.mean((counts >= lo) & (counts <= hi)))
        coverage[round(width, 6)] = share
        error += (share - width) ** 2
    return float(error), coverage


def _mean_over_draws(values: np.ndarray) -> np.ndarray:
    """Mean over the last axis of the finite values; NaN (without numpy's all-NaN warning) where there are none.

    A gene no draw gives a count to has no coefficient of variation in any draw.
    """
    finite = np.isfinite(values)
    n = finite.sum(axis=-1)
    total = np.where(finite, values, 0.0).sum(axis=-1)
    return np.divide(total, n, out=np.full(total.shape, np.nan), where=n > 0)


def predictive_statistics(counts: np.ndarray, draws: np.ndarray) -> PPCStatistics:
    """Posterior predictive statistics from draws (cells, genes, draws) against observed counts (cells, genes)."""
    counts, draws = np.asarray(counts, dtype=np.float64), np.asarray(draws, dtype=np.float64)
    if draws.ndim != 3 or draws.shape[:2] != counts.shape:
        raise InvalidArgumentError(
            f"Draws must be (cells, genes, draws) matching counts {counts.shape}, got {draws.shape}."
        )
    cv_gene = _mean_over_draws(_cv(draws, 0))
    cv_cell = _mean_over_draws(_cv(draws, 1))
    zero = (draws == 0).mean(axis=(0, 2))
    error, coverage = calibration(counts, draws)
    return PPCStatistics(cv_gene, cv_cell, zero, error, coverage)


def _median_relative(x: np.ndarray, y: np.ndarray, scale: np.ndarray) -> float:
    """Median of ``|x - y| / scale`` over the entries where all three are finite and ``scale > 0``."""
    ok = np.isfinite(x) & np.isfinite(y) & np.isfinite(scale) & (scale > 0)
    return float(np.median(np.abs(x[ok] - y[ok]) / scale[ok])) if ok.any() else np.nan


def ppc_table(observed: PPCStatistics, predicted: Mapping[str, PPCStatistics]) -> pd.DataFrame:
    """One row per fit: how far its posterior predictive statistics are from the observed ones.

    Returns
    -------
    pandas.DataFrame
        Columns ``fit``; ``cv_gene_rel_error`` and ``cv_cell_rel_error`` (median over genes/cells of
        ``|predicted - observed| / observed``); ``zero_fraction_abs_error`` (mean over genes); ``calibration_error``;
        ``coverage_95`` (share of counts inside the central 95% interval).

    """
    rows = []
    for name, stats in predicted.items():
        rows.append(
            {
                "fit": name,
                "cv_gene_rel_error": _median_relative(stats.cv_gene, observed.cv_gene, observed.cv_gene),
                "cv_cell_rel_error": _median_relative(stats.cv_cell, observed.cv_cell, observed.cv_cell),
                "zero_fraction_abs_error": float(np.mean(np.abs(stats.zero_fraction - observed.zero_fraction))),
                "calibration_error": stats.calibration_error,
                "coverage_95": stats.coverage.get(0.95, np.nan),
            }
        )
    return pd.DataFrame(rows)


def split_half_statistics(counts: np.ndarray, draws: np.ndarray) -> tuple[PPCStatistics, PPCStatistics]:
    """Statistics from the even-numbered and from the odd-numbered draws: two independent Monte Carlo estimates."""
    if draws.shape[-1] < 2:
        raise InvalidArgumentError("Splitting the posterior predictive draws in halves needs at least 2 draws.")
    return predictive_statistics(counts, draws[..., 0::2]), predictive_statistics(counts, draws[..., 1::2])


def _ratio(between: float, within: float) -> float:
    if within > 0:
        return between / within
    return 1.0 if between == 0 else np.inf


def ppc_agreement(
    observed: PPCStatistics,
    halves: Mapping[str, tuple[PPCStatistics, PPCStatistics]],
    predicted: Mapping[str, PPCStatistics] | None = None,
) -> pd.DataFrame:
    """Seed-to-seed differences of the predicted statistics, in units of their own Monte Carlo noise.

    Each fit's draws are split in halves (:func:`split_half_statistics`). The difference between two fits (first half of
    each) is compared with that between the two halves of one fit, which has the same Monte Carlo noise and no seed
    effect. Equivalent seeds give a ratio near 1; well above 1, the seeds predict different count distributions.

    Returns
    -------
    pandas.DataFrame
        Columns ``fit_a``, ``fit_b``; ``cv_gene_rel_diff`` (median over genes of ``|cv_a - cv_b| / cv_observed``) and
        ``cv_gene_noise`` (the same between halves of one fit, averaged over the two fits); ``zero_fraction_abs_diff``
        (mean over genes) and ``zero_fraction_noise``; ``noise_ratio``, the larger of the two ratios of difference to
        noise; with ``predicted`` also ``cv_gene_ccc`` and ``zero_fraction_ccc`` (concordance over genes of the two
        fits' predicted statistics, from all draws) and ``agreement``, the smaller of the two.

    """
    rows = []
    for a, b in combinations(list(halves), 2):
        (a1, a2), (b1, b2) = halves[a], halves[b]
        cv_between = _median_relative(a1.cv_gene, b1.cv_gene, observed.cv_gene)
        cv_within = 0.5 * (
            _median_relative(a1.cv_gene, a2.cv_gene, observed.cv_gene)
            + _median_relative(b1.cv_gene, b2.cv_gene, observed.cv_gene)
        )
        zero_between = float(np.mean(np.abs(a1.zero_fraction - b1.zero_fraction)))
        zero_within = 0.5 * float(
            np.mean(np.abs(a1.zero_fraction - a2.zero_fraction)) + np.mean(np.abs(b1.zero_fraction - b2.zero_fraction))
        )
        rows.append(
            {
                "fit_a": a,
                "fit_b": b,
                "cv_gene_rel_diff": cv_between,
                "cv_gene_noise": cv_within,
                "zero_fraction_abs_diff": zero_between,
                "zero_fraction_noise": zero_within,
                "noise_ratio": max(_ratio(cv_between, cv_within), _ratio(zero_between, zero_within)),
            }
        )
        if predicted is not None:
            rows[-1] |= statistics_concordance(predicted[a], predicted[b])
    return pd.DataFrame(rows)


def _concordance(a: np.ndarray, b: np.ndarray, genes: np.ndarray) -> np.ndarray:
    """Lin's concordance of ``a[g]`` and ``b[g]`` over each row ``g`` of gene positions (non-finite genes dropped)."""
    ok = np.isfinite(a) & np.isfinite(b)
    x, y, w = np.where(ok, a, 0.0)[genes], np.where(ok, b, 0.0)[genes], ok[genes].astype(np.float64)
    n = w.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mx, my = (w * x).sum(1) / n, (w * y).sum(1) / n
        vx = (w * (x - mx[:, None]) ** 2).sum(1) / n
        vy = (w * (y - my[:, None]) ** 2).sum(1) / n
        cov = (w * (x - mx[:, None]) * (y - my[:, None])).sum(1) / n
    return concordance_from_moments(mx, my, vx, vy, cov)


def statistics_concordance(a: PPCStatistics, b: PPCStatistics, genes: np.ndarray | None = None) -> dict:
    """Concordance over genes of two fits' predicted CV and zero fraction, and the smaller of the two.

    With ``genes`` ((replicates, genes) positions) each value is an array over the resamples; otherwise a number on
    all genes.
    """
    rows = np.arange(len(a.cv_gene))[None, :] if genes is None else genes
    cv = _concordance(a.cv_gene, b.cv_gene, rows)
    zero = _concordance(a.zero_fraction, b.zero_fraction, rows)
    both = np.minimum(cv, zero)
    if genes is None:
        return {"cv_gene_ccc": float(cv[0]), "zero_fraction_ccc": float(zero[0]), "agreement": float(both[0])}
    return {"cv_gene_ccc": cv, "zero_fraction_ccc": zero, "agreement": both}
