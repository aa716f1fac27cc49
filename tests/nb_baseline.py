"""A per-gene negative-binomial baseline with no latent variables.

Each gene ``g`` gets mean ``l_n * p_g`` (``p_g`` its share of the training counts,
``l_n`` the cell's total) and an inverse dispersion ``theta_g`` fitted by maximum
likelihood on the training cells. A count VAE that does not beat this baseline
on held-out cells has learned nothing about cell-to-cell variation.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.optimize import minimize_scalar
from scipy.special import gammaln


def _dense(matrix) -> np.ndarray:
    return matrix.toarray() if sp.issparse(matrix) else np.asarray(matrix)


def _nb_loglik(x: np.ndarray, mu: np.ndarray, theta: float) -> np.ndarray:
    log_total = np.logaddexp(np.log(theta), np.log(mu))
    return (
        gammaln(x + theta)
        - gammaln(theta)
        - gammaln(x + 1)
        + theta * (np.log(theta) - log_total)
        + x * (np.log(mu) - log_total)
    )


def fit_per_gene_nb(train_counts) -> tuple[np.ndarray, np.ndarray]:
    """Fit ``(p_g, theta_g)`` on training counts (cells x genes).

    Returns
    -------
    proportions, theta
        Each gene's share of all counts, and its maximum-likelihood inverse
        dispersion (searched on ``log theta`` in [-6, 12]).

    """
    X = _dense(train_counts).astype(np.float64)
    library = X.sum(1, keepdims=True)
    proportions = X.sum(0) / X.sum()
    mu = library * proportions
    theta = np.empty(X.shape[1])
    for g in range(X.shape[1]):
        res = minimize_scalar(
            lambda lt, g=g: -_nb_loglik(X[:, g], mu[:, g], np.exp(lt)).sum(), bounds=(-6.0, 12.0), method="bounded"
        )
        theta[g] = np.exp(res.x)
    return proportions, theta


def per_gene_nb_log_likelihood(train_counts, test_counts) -> np.ndarray:
    """Held-out log-likelihood per test cell (nats) of the per-gene NB baseline fitted on ``train_counts``."""
    proportions, theta = fit_per_gene_nb(train_counts)
    X = _dense(test_counts).astype(np.float64)
    mu = X.sum(1, keepdims=True) * np.clip(proportions, 1e-300, None)
    return _nb_loglik(X, mu, theta[None, :]).sum(1)
