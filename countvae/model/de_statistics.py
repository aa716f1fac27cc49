"""Differential-expression statistics from posterior draws of two groups' expression (numpy only).

From the decoded expression draws of two groups of cells, the per-gene quantities of scvi-tools' ``mode="change"``
differential expression, each with its Monte Carlo standard error. The model-facing part (which draws, from which
cells, decoded in which batch) and the definitions are in :mod:`countvae.model.differential`.
"""

from __future__ import annotations

import numbers
from typing import Literal

import numpy as np
import scipy.sparse as sp

from countvae.errors import InvalidArgumentError

#: Added inside the logs of the Bayes factor, as scvi-tools does.
BAYES_FACTOR_EPS = 1e-8
#: The LFC summaries (mean, median, ...) use this fraction of the pseudocount, as scvi-tools does.
SUMMARY_PSEUDOCOUNT_FRACTION = 1e-3

TestMode = Literal["two", "three"]


def fdr_calls(proba_de: np.ndarray, fdr_target: float) -> np.ndarray:
    """Genes called differentially expressed at a posterior expected FDR of at most ``fdr_target``.

    As scvi-tools' ``is_de_fdr_<target>`` column: the largest set of genes with the highest ``proba_de`` (ties keep gene
    order) whose mean ``1 - proba_de`` (its posterior expected false discovery proportion) is at most ``fdr_target``.

    Parameters
    ----------
    proba_de
        Posterior probability of differential expression, (genes,) or (replicates, genes) to call each row separately.
    fdr_target
        Target posterior expected FDR, in (0, 1).

    Returns
    -------
    numpy.ndarray
        Boolean calls of the same shape as ``proba_de``.

    """
    if not 0.0 < fdr_target < 1.0:
        raise InvalidArgumentError(f"fdr_target must lie in (0, 1), got {fdr_target!r}.")
    proba = np.atleast_2d(np.asarray(proba_de, dtype=np.float64))
    order = np.argsort(-proba, axis=1, kind="stable")
    ranked = np.take_along_axis(proba, order, axis=1)
    expected_fdr = np.cumsum(1.0 - ranked, axis=1) / np.arange(1, proba.shape[1] + 1)
    # ``expected_fdr`` is non-decreasing along each row, so the calls are a prefix of the ranking.
    n_called = np.count_nonzero(expected_fdr <= fdr_target, axis=1)
    calls = np.zeros(proba.shape, dtype=bool)
    np.put_along_axis(calls, order, np.arange(proba.shape[1]) < n_called[:, None], axis=1)
    return calls.reshape(np.shape(proba_de))


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard index of two boolean call sets over the same genes; 1 when both are empty (they agree)."""
    a = np.asarray(a, dtype=bool)
    b = np.asarray(b, dtype=bool)
    if a.shape != b.shape:
        raise InvalidArgumentError(f"Call sets over different genes: shapes {a.shape} and {b.shape}.")
    union = np.count_nonzero(a | b)
    return 1.0 if union == 0 else np.count_nonzero(a & b) / union


def estimate_pseudocount(
    scales1: np.ndarray,
    scales2: np.ndarray,
    raw_mean1: np.ndarray,
    raw_mean2: np.ndarray,
    threshold_counts: float = 0.01,
    quantile: float = 0.9,
) -> float:
    """scvi-tools' data-driven pseudocount for the log fold change.

    For each group, the ``quantile`` of the largest sampled expression of the genes not expressed there (mean raw
    count below ``threshold_counts``); the pseudocount is the larger of the two divided by the number of genes (at
    least 1e-10). It shrinks the log fold changes of genes expressed in neither group towards 0.
    """
    n_genes = scales1.shape[1]
    values = []
    for scales, raw_mean in ((scales1, raw_mean1), (scales2, raw_mean2)):
        silent = np.asarray(raw_mean) < threshold_counts
        values.append(float(np.quantile(scales[:, silent].max(axis=0), quantile)) if silent.any() else 1e-10)
    return max(1e-10, max(values) / n_genes)


def _log2_ratio(scales1: np.ndarray, scales2: np.ndarray, pseudocount: float) -> np.ndarray:
    """``log2(scales1 + c) - log2(scales2 + c)`` in float32 (draws x genes can be large; sums use float64)."""
    c = np.float32(pseudocount)
    out = np.log2(np.asarray(scales1, dtype=np.float32) + c)
    out -= np.log2(np.asarray(scales2, dtype=np.float32) + c)
    return out


def _binomial_se(successes: np.ndarray, n: int) -> np.ndarray:
    """Standard error of a proportion from ``n`` independent draws, with the plus-one (Laplace) estimate of p.

    ``p~ = (k + 1) / (n + 2)`` keeps the error positive when every draw agreed
    (``k = 0`` or ``n``), where the plain ``sqrt(p (1 - p) / n)`` would claim 0.
    """
    p = (successes + 1.0) / (n + 2.0)
    return np.sqrt(p * (1.0 - p) / n)


def _summaries(lfc: np.ndarray) -> dict[str, np.ndarray]:
    """Mean, median, standard deviation and extremes of each column, with Monte Carlo errors.

    Standard errors: ``sd / sqrt(n)`` for the mean; for the median, half the distance between the quantiles at
    ``1/2 +- 1/(2 sqrt(n))``, which lie one standard error of the sample median, ``1 / (2 f(m) sqrt(n))``, from it (no
    density estimate needed); for the standard deviation the delta method, ``sqrt((m4 - m2^2) / n) / (2 sqrt(m2))``.
    """
    n = lfc.shape[0]
    mean = lfc.mean(axis=0, dtype=np.float64)
    half_width = 0.5 / np.sqrt(n)
    low, median, high = np.quantile(lfc, [0.5 - half_width, 0.5, 0.5 + half_width], axis=0).astype(np.float64)
    powers = lfc - mean.astype(np.float32)
    np.square(powers, out=powers)
    m2 = powers.mean(axis=0, dtype=np.float64)
    np.square(powers, out=powers)
    m4 = powers.mean(axis=0, dtype=np.float64)
    std = np.sqrt(m2)
    with np.errstate(invalid="ignore", divide="ignore"):
        std_se = np.where(m2 > 0, np.sqrt(np.maximum(m4 - m2**2, 0.0) / n) / (2.0 * std), 0.0)
    return {
        "lfc_mean": mean,
        "lfc_median": median,
        "lfc_std": std,
        "lfc_min": lfc.min(axis=0).astype(np.float64),
        "lfc_max": lfc.max(axis=0).astype(np.float64),
        "lfc_mean_mc_se": std / np.sqrt(n),
        "lfc_median_mc_se": (high - low) / 2.0,
        "lfc_std_mc_se": std_se,
    }


def _bootstrap_proba(
    plus: np.ndarray, minus: np.ndarray, test_mode: TestMode, n_bootstrap: int, rng: np.random.Generator
) -> np.ndarray:
    """``proba_de`` recomputed on ``n_bootstrap`` resamples (with replacement) of the paired draws."""
    n = plus.shape[0]
    weights = rng.multinomial(n, np.full(n, 1.0 / n), size=n_bootstrap).astype(np.float32)
    p_plus = weights @ plus.astype(np.float32) / n
    p_minus = weights @ minus.astype(np.float32) / n
    return (p_plus + p_minus) if test_mode == "two" else np.maximum(p_plus, p_minus)


def check_test_settings(delta: float, fdr_target: float, test_mode: str, n_bootstrap: int) -> None:
    """Check the settings of the change-mode test (see :func:`change_statistics`).

    Raises
    ------
    InvalidArgumentError
        Naming the first setting out of range.

    """
    if test_mode not in ("two", "three"):
        raise InvalidArgumentError(f"test_mode must be 'two' or 'three', got {test_mode!r}.")
    if not (_is_real(delta) and delta >= 0):
        raise InvalidArgumentError(f"delta must be a non-negative number, got {delta!r}.")
    if not (_is_real(fdr_target) and 0.0 < fdr_target < 1.0):
        raise InvalidArgumentError(f"fdr_target must lie in (0, 1), got {fdr_target!r}.")
    if isinstance(n_bootstrap, bool) or not isinstance(n_bootstrap, int | np.integer) or n_bootstrap < 2:
        raise InvalidArgumentError(f"n_bootstrap must be an integer of at least 2, got {n_bootstrap!r}.")


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def change_statistics(
    scales1: np.ndarray,
    scales2: np.ndarray,
    *,
    delta: float,
    pseudocount: float,
    fdr_target: float,
    test_mode: TestMode = "three",
    n_bootstrap: int = 100,
    seed: int = 0,
) -> dict[str, np.ndarray | float]:
    """Per-gene change-mode statistics of paired draws, with their Monte Carlo errors.

    Parameters
    ----------
    scales1, scales2
        (draws, genes) expression draws of the two groups, row ``s`` of both the pair ``s``; the standard errors need
        independent, identically distributed pairs.
    delta
        LFC threshold: a gene is differentially expressed in a pair when its
        ``log2`` fold change is at least ``delta`` (up) or below ``-delta`` (down).
    pseudocount
        Added to both groups' expression inside the log fold change of the test.
    fdr_target
        Target posterior expected FDR of the calls (:func:`fdr_calls`).
    test_mode
        ``"three"`` (scvi-tools' default): ``proba_de = max(P(up), P(down))``;
        ``"two"``: ``proba_de = P(up) + P(down) = P(|LFC| beyond delta)``.
    n_bootstrap
        Resamples of the pairs for the Monte Carlo variability of the calls.
    seed
        Seed of the resampling.

    Returns
    -------
    dict
        Arrays (genes,) under the column names of :func:`countvae.model.differential.differential_expression`, and
        the scalars ``pseudocounts``, ``delta`` and ``mc_call_jaccard``.

    """
    if scales1.shape != scales2.shape or scales1.ndim != 2:
        raise InvalidArgumentError(
            f"scales1 and scales2 must be (draws, genes) of one shape, got {scales1.shape}, {scales2.shape}."
        )
    check_test_settings(delta, fdr_target, test_mode, n_bootstrap)
    n = scales1.shape[0]
    test_lfc = _log2_ratio(scales1, scales2, pseudocount)
    plus = test_lfc >= delta
    minus = test_lfc < -delta
    del test_lfc
    n_plus = plus.sum(axis=0)
    n_minus = minus.sum(axis=0)
    n_de = n_plus + n_minus if test_mode == "two" else np.maximum(n_plus, n_minus)
    proba_de = n_de / n
    proba_se = _binomial_se(n_de, n)
    smoothed = (proba_de * n + 1.0) / (n + 2.0)
    calls = fdr_calls(proba_de, fdr_target)
    replicates = fdr_calls(
        _bootstrap_proba(plus, minus, test_mode, n_bootstrap, np.random.default_rng(seed)), fdr_target
    )
    del plus, minus
    # Two resamples differ by twice the sampling variance, as two runs with different seeds do.
    pair_jaccard = [jaccard(replicates[i], replicates[i + 1]) for i in range(0, n_bootstrap - 1, 2)]

    summaries = _summaries(_log2_ratio(scales1, scales2, SUMMARY_PSEUDOCOUNT_FRACTION * pseudocount))
    return {
        "proba_de": proba_de,
        "proba_not_de": 1.0 - proba_de,
        "bayes_factor": np.log(proba_de + BAYES_FACTOR_EPS) - np.log(1.0 - proba_de + BAYES_FACTOR_EPS),
        "scale1": scales1.mean(axis=0, dtype=np.float64),
        "scale2": scales2.mean(axis=0, dtype=np.float64),
        "pseudocounts": float(pseudocount),
        "delta": float(delta),
        **{key: summaries[key] for key in ("lfc_mean", "lfc_median", "lfc_std", "lfc_min", "lfc_max")},
        "is_de": calls,
        "proba_de_mc_se": proba_se,
        # delta method: d/dp log(p / (1 - p)) = 1 / (p (1 - p)), at the smoothed p
        "bayes_factor_mc_se": proba_se / (smoothed * (1.0 - smoothed)),
        "scale1_mc_se": scales1.std(axis=0, dtype=np.float64) / np.sqrt(n),
        "scale2_mc_se": scales2.std(axis=0, dtype=np.float64) / np.sqrt(n),
        **{key: summaries[key] for key in ("lfc_mean_mc_se", "lfc_median_mc_se", "lfc_std_mc_se")},
        "is_de_mc_frequency": replicates.mean(axis=0),
        "mc_call_jaccard": float(np.mean(pair_jaccard)),
    }


def raw_count_properties(counts1, counts2, library1: np.ndarray, library2: np.ndarray) -> dict[str, np.ndarray]:
    """Observed-count summaries of two groups of cells, as scvi-tools' ``all_stats`` columns.

    Parameters
    ----------
    counts1, counts2
        Cells x genes counts of each group (dense or scipy sparse).
    library1, library2
        Each cell's total count over all genes.

    Returns
    -------
    dict
        ``raw_mean1/2`` (mean count), ``non_zeros_proportion1/2`` (share of cells with a non-zero count) and
        ``raw_normalized_mean1/2`` (mean count per 10,000 counts of the cell's library).

    """
    means, nonzero, normalized = {}, {}, {}
    for k, (counts, library) in enumerate(((counts1, library1), (counts2, library2)), start=1):
        per_10k = (1e4 / np.asarray(library, dtype=np.float64))[:, None]
        if sp.issparse(counts):
            counts = sp.csr_matrix(counts)
            means[f"raw_mean{k}"] = np.asarray(counts.mean(axis=0), dtype=np.float64).ravel()
            nonzero[f"non_zeros_proportion{k}"] = np.asarray((counts != 0).mean(axis=0), dtype=np.float64).ravel()
            normalized[f"raw_normalized_mean{k}"] = np.asarray(counts.multiply(per_10k).mean(axis=0)).ravel()
        else:
            counts = np.asarray(counts)
            means[f"raw_mean{k}"] = counts.mean(axis=0, dtype=np.float64)
            nonzero[f"non_zeros_proportion{k}"] = (counts != 0).mean(axis=0)
            normalized[f"raw_normalized_mean{k}"] = (counts * per_10k).mean(axis=0)
    return {**means, **nonzero, **normalized}
