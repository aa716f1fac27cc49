"""From log importance weights to an estimate of ``log p(x)`` with its error and reliability.

Every importance-sampling estimator in the package (the guide proposal, the
per-cell Student-t proposal, the scvi-tools adapter) produces log weights
``log w_s = log p(x, z_s) - log r(z_s)`` for draws ``z_s`` from a proposal ``r``,
and hands them to :func:`summarize_log_weights`, so the estimate, its standard
error, the effective sample size and the Pareto k-hat are defined once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from countvae import _arviz

#: Above this Pareto k-hat an importance-sampling estimate and its standard error are not to be believed
#: (Vehtari et al. 2024, PSIS: with k > 0.7 the number of draws needed grows impractically fast).
KHAT_THRESHOLD = 0.7

#: Columns of :meth:`ImportanceSummary.to_frame`, in order.
COLUMNS = ("lpd", "mc_se", "ess", "khat")


@dataclass(frozen=True)
class ImportanceSummary:
    """Per-cell importance-sampling estimate of ``log p(x)`` and its diagnostics.

    Attributes
    ----------
    lpd
        ``log mean_s w_s`` in nats (a log density: higher is better).
    mc_se
        Delta-method Monte Carlo standard error of ``lpd``,
        ``sd(w) / (sqrt(S) mean(w)) = sqrt((S sum_s wn_s^2 - 1) / (S - 1))`` with normalised
        weights ``wn``. It cannot exceed 1 whatever the true error, so it is meaningful only
        where ``khat`` is at most :data:`KHAT_THRESHOLD`.
    ess
        Effective sample size ``1 / sum_s wn_s^2``.
    khat
        Pareto k-hat of the weights (PSIS); above :data:`KHAT_THRESHOLD` the estimate is unreliable.

    """

    lpd: np.ndarray
    mc_se: np.ndarray
    ess: np.ndarray
    khat: np.ndarray

    @property
    def reliable(self) -> np.ndarray:
        """Cells whose Pareto k-hat is at most :data:`KHAT_THRESHOLD`."""
        return self.khat <= KHAT_THRESHOLD

    def to_frame(self, index: Sequence | pd.Index | None = None) -> pd.DataFrame:
        """The summary as a DataFrame with columns :data:`COLUMNS`."""
        return pd.DataFrame({name: getattr(self, name) for name in COLUMNS}, index=index)

    def take(self, positions: np.ndarray) -> ImportanceSummary:
        """The rows at ``positions``."""
        return ImportanceSummary(*(getattr(self, name)[positions] for name in COLUMNS))

    @staticmethod
    def concatenate(parts: Sequence[ImportanceSummary]) -> ImportanceSummary:
        """Rows of several summaries, in order."""
        if not parts:
            return ImportanceSummary(*(np.empty(0) for _ in COLUMNS))
        return ImportanceSummary(*(np.concatenate([getattr(p, name) for p in parts]) for name in COLUMNS))


def summarize_log_weights(log_weights: torch.Tensor) -> ImportanceSummary:
    """Estimate, standard error, ESS and Pareto k-hat from log weights of shape (draws, cells).

    Parameters
    ----------
    log_weights
        ``log p(x, z_s) - log r(z_s)`` for ``S >= 2`` independent draws per cell.

    Returns
    -------
    ImportanceSummary

    """
    n_draws = log_weights.shape[0]
    if n_draws < 2:
        raise ValueError("at least 2 importance draws per cell are needed for a standard error")
    log_w = log_weights.detach().to(torch.float64)
    total = torch.logsumexp(log_w, dim=0)
    normalised = torch.exp(log_w - total)
    sum_sq = (normalised**2).sum(0)
    lpd = (total - math.log(n_draws)).cpu().numpy()
    mc_se = torch.sqrt(torch.clamp(n_draws * sum_sq - 1.0, min=0.0) / (n_draws - 1)).cpu().numpy()
    ess = (1.0 / sum_sq).cpu().numpy()
    khat = _arviz.pareto_khat(log_w.T.cpu().numpy())
    return ImportanceSummary(lpd=lpd, mc_se=mc_se, ess=ess, khat=khat)
