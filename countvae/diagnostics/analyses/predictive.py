"""Are the seeds predictively equivalent? Held-out log predictive densities, paired, with an equivalence test.

Every orthogonal reparameterization of a fit has exactly the same ``p(x)``, so seeds that found the same solution
up to a rotation predict held-out cells equally well. Failing to detect a difference is not evidence of equivalence;
this module therefore tests equivalence itself, against a stated margin.

Definitions (all log densities in nats, higher is better):

- ``elpd`` of a fit: the sum over held-out cells of its estimated ``log p(x_i)``; ``se`` its sampling standard
  error ``sqrt(n) sd_i``; ``mc_se`` the Monte Carlo standard error of the sum, ``sqrt(sum_i mc_se_i^2)``.
- For two fits, the paired per-cell differences ``d_i = lpd_ai - lpd_bi``; their mean ``diff_per_cell`` and its
  standard error ``se_diff_per_cell = sd(d) / sqrt(n)``. The pairing removes the large between-cell variation both
  fits share, and the differences carry each cell's Monte Carlo noise.
- **Margin** ``delta`` (nats per cell): a fraction (``equivalence_margin``) of the mean per-cell gain of the fits'
  held-out ``log p(x)`` over a model without latent variables (:mod:`countvae.diagnostics.analyses.baseline`):
  differences smaller than that share of what the latent variables explain are taken to be immaterial. Stated this
  way it means the same on data of any size or gene count.
- **Equivalence test** (two one-sided tests, Schuirmann 1987) per pair, with a Bonferroni correction over the
  ``K = m (m - 1) / 2`` pairs of ``m`` fits: the simultaneous interval
  ``diff_per_cell +- t_{n-1}(1 - alpha / K) se_diff_per_cell`` (``ci_low``, ``ci_high``; level at least
  ``1 - 2 alpha`` for all pairs at once). A pair is ``equivalent`` when its interval lies inside
  ``(-delta, delta)``, ``not equivalent`` when it lies outside ``[-delta, delta]``, otherwise ``undetermined``.
  ``p_equivalence`` is the TOST p-value times ``K`` (capped at 1).
- **Reliability of the estimator**, a precondition (:func:`estimator_reliability`): the package's one rule,
  :func:`countvae.module.importance.estimate_reliability` (Pareto k-hat at most 0.7 on at least 95% of each fit's
  cells), and the bias of the log of a Monte Carlo mean (``mc_se^2 / 2`` per cell, the delta-method bound) at most
  a tenth of the margin. :mod:`countvae.diagnostics.reporting.verdicts` decides the verdict from these numbers.
- ``n_unreliable``: cells whose estimate fails that rule (their ``mc_se`` is NaN, and so are the Monte Carlo totals).
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import combinations

import numpy as np
import pandas as pd
from scipy import stats

from countvae import _arviz
from countvae.diagnostics.analyses.lpd_comparability import require_same_quantity
from countvae.errors import InvalidArgumentError
from countvae.module.importance import estimate_reliability

#: Default margin: differences below this share of the per-cell gain over the no-latent baseline are immaterial.
EQUIVALENCE_MARGIN = 0.02
#: Largest mean per-cell Monte Carlo bias bound (``mc_se^2 / 2``), as a share of the margin.
MAX_BIAS_SHARE = 0.1
#: Decisions of one pair (and of the fits as a whole) in the equivalence table.
EQUIVALENT, NOT_EQUIVALENT, UNDETERMINED = "equivalent", "not equivalent", "undetermined"


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
    require_same_quantity(lpds)


def per_fit_table(lpds: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per fit: held-out log predictive density with its sampling and Monte Carlo errors.

    Parameters
    ----------
    lpds
        Fit name -> per-cell frame with columns ``lpd`` and ``mc_se`` (as returned by
        :meth:`FittedModel.log_predictive_density`), on the same cells.

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
                "n_unreliable": int(estimate_reliability(frame).unreliable.sum()),
            }
        )
    return pd.DataFrame(rows)


def equivalence_table(lpds: Mapping[str, pd.DataFrame], margin: float, alpha: float = 0.05) -> pd.DataFrame:
    """Paired differences in held-out ``log p(x)`` and the equivalence test of every pair of fits.

    Parameters
    ----------
    lpds
        Fit name -> per-cell frame with columns ``lpd`` and ``mc_se``, on the same cells.
    margin
        ``delta``, in nats per cell (see the module docstring); NaN when it cannot be stated.
    alpha
        Error rate of each one-sided test for all pairs together (Bonferroni over pairs).

    Returns
    -------
    pandas.DataFrame
        Columns ``fit_a``, ``fit_b``, ``n_cells``, ``diff`` (``elpd_a - elpd_b``), ``se_diff``, ``mc_se_diff``,
        ``diff_per_cell``, ``se_diff_per_cell``, ``z`` (``diff / se_diff``), ``ci_low`` and ``ci_high`` (simultaneous,
        nats per cell), ``ci_level``, ``margin``, ``p_equivalence``, ``decision`` (:data:`EQUIVALENT`,
        :data:`NOT_EQUIVALENT` or :data:`UNDETERMINED`) and ``n_unreliable`` (cells unreliable in either fit).

    """
    _check(lpds)
    names = list(lpds)
    n_pairs = len(names) * (len(names) - 1) // 2
    rows = []
    for a, b in combinations(names, 2):
        d = lpds[a]["lpd"].to_numpy(dtype=np.float64) - lpds[b]["lpd"].to_numpy(dtype=np.float64)
        n = d.size
        mean = float(d.mean())
        se = float(d.std(ddof=1) / np.sqrt(n)) if n > 1 else np.nan
        t = float(stats.t.ppf(1.0 - alpha / n_pairs, df=max(n - 1, 1)))
        low, high = (mean - t * se, mean + t * se) if np.isfinite(se) else (np.nan, np.nan)
        mc = float(np.sqrt(np.sum(lpds[a]["mc_se"].to_numpy() ** 2 + lpds[b]["mc_se"].to_numpy() ** 2)))
        rows.append(
            {
                "fit_a": a,
                "fit_b": b,
                "n_cells": n,
                "diff": mean * n,
                "se_diff": se * n,
                "mc_se_diff": mc,
                "diff_per_cell": mean,
                "se_diff_per_cell": se,
                "z": mean / se if se > 0 else (0.0 if mean == 0 else float(np.copysign(np.inf, mean))),
                "ci_low": low,
                "ci_high": high,
                "ci_level": 1.0 - 2.0 * alpha / n_pairs,
                "margin": margin,
                "p_equivalence": _tost_p(mean, se, n, margin, n_pairs),
                "decision": _pair_decision(low, high, margin),
                "n_unreliable": int(
                    (estimate_reliability(lpds[a]).unreliable | estimate_reliability(lpds[b]).unreliable).sum()
                ),
            }
        )
    return pd.DataFrame(rows)


def _tost_p(mean: float, se: float, n: int, margin: float, n_pairs: int) -> float:
    """The larger of the two one-sided p-values (H0: diff <= -delta; H0: diff >= delta), times the pairs."""
    if not (np.isfinite(margin) and np.isfinite(se)):
        return np.nan
    if se == 0:
        return 0.0 if abs(mean) < margin else 1.0
    df = max(n - 1, 1)
    p = max(stats.t.sf((mean + margin) / se, df), stats.t.cdf((mean - margin) / se, df))
    return float(min(1.0, p * n_pairs))


def _pair_decision(low: float, high: float, margin: float) -> str:
    if not (np.isfinite(margin) and np.isfinite(low) and np.isfinite(high)):
        return UNDETERMINED
    if -margin < low and high < margin:
        return EQUIVALENT
    if low > margin or high < -margin:
        return NOT_EQUIVALENT
    return UNDETERMINED


def equivalence_margin(lpds: Mapping[str, pd.DataFrame], baseline: np.ndarray | None, fraction: float) -> tuple:
    """The margin in nats per cell, and the mean per-cell gain over the no-latent baseline it is a share of.

    Returns ``(margin, gain)``; both NaN without a baseline, and the margin NaN when the fits explain no more than
    the baseline (a non-positive gain).
    """
    if baseline is None:
        return np.nan, np.nan
    mean_lpd = np.mean([frame["lpd"].to_numpy(dtype=np.float64) for frame in lpds.values()], axis=0)
    gain = float(np.mean(mean_lpd - np.asarray(baseline, dtype=np.float64)))
    return (fraction * gain if gain > 0 else np.nan), gain


def estimator_reliability(lpds: Mapping[str, pd.DataFrame], margin: float) -> pd.DataFrame:
    """Whether each fit's ``log p(x)`` estimates can be believed, at the precision the margin asks for.

    Which cells are unreliable, and whether few enough are, is the package's one rule,
    :func:`countvae.module.importance.estimate_reliability` (Pareto k-hat above 0.7 or missing, unless the weights
    are flat; ESS not judged).
    Cells without a Monte Carlo standard error (NaN, as the estimator reports where k-hat says the weights' variance
    is infinite) are left out of the bias bound; they already count as unreliable.

    Returns
    -------
    pandas.DataFrame
        One row per fit: ``fit``, ``share_khat_above`` (share of unreliable cells; NaN when the frame has neither
        ``reliable`` nor ``khat``), ``median_khat``, ``median_ess`` and ``min_ess`` (importance sampling's effective
        sample size per cell, NaN without an ``ess`` column; shown, not judged: a small ESS with an acceptable k-hat
        shows up as a large Monte Carlo error, which the bias bound judges), ``mc_bias_bound`` (mean per-cell
        ``mc_se^2 / 2``, nats), and ``reliable``: at most :data:`~countvae.module.importance.MAX_UNRELIABLE_SHARE`
        of cells unreliable and a bias bound at most :data:`MAX_BIAS_SHARE` of the margin. Without a margin (NaN: the
        fits gain nothing over a model without latent variables) the bias bound is not judged: there is no precision
        to hold it to, and what fails is the fits, which the verdicts say, not the estimator.

    """
    rows = []
    for name, frame in lpds.items():
        mc = frame["mc_se"].to_numpy(dtype=np.float64)
        bias = float(np.mean(mc[np.isfinite(mc)] ** 2) / 2.0) if np.isfinite(mc).any() else np.nan
        khat = frame["khat"].to_numpy(dtype=np.float64) if "khat" in frame else None
        judged = estimate_reliability(frame)
        median = float(np.nanmedian(khat)) if khat is not None and np.isfinite(khat).any() else np.nan
        ess = frame["ess"].to_numpy(dtype=np.float64) if "ess" in frame else np.full(1, np.nan)
        finite_ess = ess[np.isfinite(ess)]
        ok_bias = bool(np.isfinite(bias) and bias <= MAX_BIAS_SHARE * margin) if np.isfinite(margin) else True
        rows.append(
            {
                "fit": name,
                "share_khat_above": judged.share,
                "median_khat": median,
                "median_ess": float(np.median(finite_ess)) if finite_ess.size else np.nan,
                "min_ess": float(finite_ess.min()) if finite_ess.size else np.nan,
                "mc_bias_bound": bias,
                "reliable": judged.reliable and ok_bias,
            }
        )
    return pd.DataFrame(rows)


def compare_table(lpds: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """The arviz comparison table (ranks, ``elpd_diff``, ``dse``, stacking weights), see :mod:`countvae._arviz`."""
    _check(lpds)
    return _arviz.compare_pointwise({k: v["lpd"].to_numpy() for k, v in lpds.items()})
