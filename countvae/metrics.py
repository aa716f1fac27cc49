"""Metrics against ground truth (InfoMEC, MCC, DCI) and downstream metrics of embeddings.

Ground-truth metrics compare latents with known sources (simulations):

* :func:`infomec`: InfoM, InfoE, InfoC of Hsu et al. (NeurIPS 2023, "Disentanglement via latent quantization"),
  with an unbiased InfoE for imbalanced labels;
* :func:`mcc`: mean correlation coefficient after Hungarian matching (Pearson or Spearman), as in ICE-BeeM
  (Khemakhem et al. 2020);
* :func:`dci`: disentanglement, completeness, informativeness (Eastwood and Williams 2018) from random-forest
  importances.

Downstream metrics need only labels (cell types, batches): :func:`normalized_gini` (sparsity of importances) and
:func:`concentration` (share of between-group variance carried by the top features), both used by the held-out-batch
classifier of the ICA benchmarks (``benchmarks/heldout_classification.py``). :func:`batch_mixing` reads a k-NN graph:
how often cells have neighbours from another batch, against random.

InfoE, DCI-I and the held-out AUROC of a linear model do not change under an invertible linear map of the latents;
InfoM, InfoC, MCC, DCI-D/C, importance sparsity and concentration do (they reward axis-aligned sources), and so does
the AUROC of tree ensembles, whose splits are axis-aligned.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
from scipy import stats
from scipy.optimize import linear_sum_assignment
from sklearn.exceptions import ConvergenceWarning

from countvae._checks import check_choice, check_int, check_number
from countvae.data.simulate import source_labels
from countvae.errors import InvalidArgumentError, InvalidDataError

CorrelationMethod = Literal["pearson", "spearman"]


# ----- input checks ------------------------------------------------------------------------------


def _as_matrix(values: Any, name: str) -> np.ndarray:
    try:
        x = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidDataError(f"{name} must be a numeric (cells, columns) array.") from None
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2:
        raise InvalidDataError(f"{name} must be 2-dimensional (cells, columns), got shape {x.shape}.")
    if x.size == 0:
        raise InvalidDataError(f"{name} is empty, shape {x.shape}; it needs at least one cell and one column.")
    if not np.all(np.isfinite(x)):
        raise InvalidDataError(f"{name} contains NaN or infinite values.")
    return x


def _same_cells(a: np.ndarray, b: np.ndarray, names: tuple[str, str]) -> None:
    if a.shape[0] != b.shape[0]:
        raise InvalidDataError(f"{names[0]} has {a.shape[0]} cells but {names[1]} has {b.shape[0]}.")


def _encode_labels(sources: Any) -> np.ndarray:
    """Integer codes 0..C-1 for each column of discrete sources (strings, categories or integers)."""
    frame = pd.DataFrame(np.asarray(sources) if not isinstance(sources, pd.DataFrame) else sources)
    codes = []
    for column in frame.columns:
        values = frame[column]
        if values.isna().any():
            raise InvalidDataError(f"Source column {column!r} has missing values.")
        if pd.api.types.is_float_dtype(values) and not np.all(np.mod(values.to_numpy(), 1.0) == 0.0):
            raise InvalidDataError(
                f"Source column {column!r} holds non-integer values; this metric needs discrete sources. "
                "Bin continuous sources first, e.g. countvae.metrics.discretize(sources, n_bins=10)."
            )
        code = pd.factorize(values, sort=True)[0]  # no -1 codes: missing values were refused above
        if code.max() < 1:
            raise InvalidDataError(f"Source column {column!r} has a single value; it carries no information.")
        codes.append(code)
    return np.stack(codes, axis=1)


def discretize(values: Any, n_bins: int = 10) -> np.ndarray:
    """Bin each column into ``n_bins`` equally populated (quantile) bins, labelled 0..n_bins-1.

    Columns with fewer distinct values than ``n_bins`` keep their values as labels (a discrete source stays as it is).
    """
    return source_labels(_as_matrix(values, "values"), check_int("n_bins", n_bins, 2))


def _entropy(codes: np.ndarray) -> float:
    return float(stats.entropy(np.bincount(codes)))


# ----- correlation matching and MCC --------------------------------------------------------------


@dataclass
class ComponentMatch:
    """A one-to-one matching of the columns of two matrices.

    Attributes
    ----------
    rows, cols
        Matched column indices of the first and second matrix.
    correlations
        Signed correlation of each matched pair.
    matrix
        All correlations, (columns of the first, columns of the second).

    """

    rows: np.ndarray
    cols: np.ndarray
    correlations: np.ndarray
    matrix: np.ndarray


def correlation_matrix(a: Any, b: Any, method: CorrelationMethod = "pearson") -> np.ndarray:
    """Correlations between every column of ``a`` and every column of ``b`` over the cells."""
    x, y = _as_matrix(a, "a"), _as_matrix(b, "b")
    _same_cells(x, y, ("a", "b"))
    if check_choice("method", method, ("pearson", "spearman")) == "spearman":
        x, y = stats.rankdata(x, axis=0), stats.rankdata(y, axis=0)
    # by range, not by the centred norm: a constant 0.1 leaves rounding residue after centring
    if np.any(np.ptp(x, axis=0) == 0) or np.any(np.ptp(y, axis=0) == 0):
        raise InvalidDataError("A column is constant; its correlation is undefined.")
    x = x - x.mean(axis=0)
    y = y - y.mean(axis=0)
    sx, sy = np.linalg.norm(x, axis=0), np.linalg.norm(y, axis=0)
    return (x / sx).T @ (y / sy)


def match_components(a: Any, b: Any, method: CorrelationMethod = "pearson") -> ComponentMatch:
    """Match columns of ``a`` to columns of ``b`` maximising the total |correlation| (Hungarian)."""
    corr = correlation_matrix(a, b, method)
    rows, cols = linear_sum_assignment(-np.abs(corr))
    return ComponentMatch(rows=rows, cols=cols, correlations=corr[rows, cols], matrix=corr)


def mcc(latents: Any, sources: Any, method: CorrelationMethod = "pearson") -> float:
    """Mean |correlation| between sources and their Hungarian-matched latents.

    1 exactly when the latents are the sources up to a signed permutation and per-coordinate scaling (Pearson) or
    monotone maps (Spearman). With unequal numbers of columns, the ``min`` of the two are matched.
    """
    x, y = _as_matrix(latents, "latents"), _as_matrix(sources, "sources")
    _same_cells(x, y, ("latents", "sources"))  # named as the caller passed them, not as match_components' a and b
    return float(np.mean(np.abs(match_components(y, x, method).correlations)))


# ----- InfoMEC ---------------------------------------------------------------------------------


@dataclass
class InfoMEC:
    """Modularity, explicitness and compactness of latents with respect to discrete sources.

    Attributes
    ----------
    infom, infoe, infoc
        The three scores in [0, 1] (NaN for InfoM with one source or InfoC with one active latent).
    nmi
        Normalized mutual information ``I(s_i; z_j) / H(s_i)``, sources x latents.
    active
        Which latents counted as active (InfoM and InfoC use only those).
    infoe_per_source
        Explicitness of each source.

    """

    infom: float
    infoe: float
    infoc: float
    nmi: pd.DataFrame
    active: np.ndarray
    infoe_per_source: pd.Series

    def as_dict(self) -> dict[str, float]:
        """``{"InfoM": ..., "InfoE": ..., "InfoC": ...}``."""
        return {"InfoM": self.infom, "InfoE": self.infoe, "InfoC": self.infoc}


def _normalized_share(matrix: np.ndarray, axis: int, n: int) -> float:
    if n < 2:
        return float("nan")
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.max(matrix, axis=axis) / np.sum(matrix, axis=axis)
    share = np.where(np.isfinite(share), share, 1.0 / n)  # a row without information is as uninformative as uniform
    return float((np.mean(share) - 1.0 / n) / (1.0 - 1.0 / n))


def explicitness(latents: Any, codes: np.ndarray, max_iter: int = 1000) -> float:
    """``(H(s) - CE) / H(s)`` for one discrete source ``s`` given all latents.

    ``CE`` is the in-sample cross-entropy (nats) of an unpenalized multinomial logistic regression of ``s`` on the
    standardized latents; ``H(s)``, the plug-in entropy of ``s``, is the in-sample cross-entropy of the
    intercept-only (null) model. This is McFadden's pseudo-R^2.

    Unlike Hsu et al.'s reference code, no class weights are used: with ``class_weight='balanced'`` the null model
    predicts the uniform law, its cross-entropy is ``log C`` rather than ``H(s)``, and InfoE is biased upward for
    imbalanced labels (cell types): for shares (0.8, 0.15, 0.05), ``log 3 = 1.10`` nats against ``H(s) = 0.62``.
    Unweighted, both terms are cross-entropies of the observed labels and a model that ignores the latents scores
    exactly 0. The score is invariant under any invertible affine map of the latents (the fitted model absorbs it).
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss

    check_int("max_iter", max_iter, 1)
    z = _as_matrix(latents, "latents")
    labels = _encode_labels(codes)
    if labels.shape[1] != 1:
        raise InvalidArgumentError(f"codes must be one source (one label per cell), got {labels.shape[1]} columns.")
    codes = labels[:, 0]
    _same_cells(z, labels, ("latents", "codes"))
    std = z.std(axis=0)
    z = (z - z.mean(axis=0)) / np.where(std > 0, std, 1.0)
    h = _entropy(codes)
    with warnings.catch_warnings():
        # Separable sources drive an unpenalized fit to the iteration limit; the loss is then near 0, as it should be.
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = LogisticRegression(C=np.inf, max_iter=max_iter).fit(z, codes)
    ce = log_loss(codes, model.predict_proba(z), labels=model.classes_)
    return float((h - ce) / h)


def infomec(
    latents: Any,
    sources: Any,
    *,
    n_neighbors: int = 10,
    random_state: int = 0,
    active_iqr_fraction: float = 0.1,
    max_iter: int = 1000,
    source_names: list[str] | None = None,
) -> InfoMEC:
    """InfoM, InfoE and InfoC (Hsu et al. 2023) of continuous latents against discrete sources.

    * ``NMI_ij = I(s_i; z_j) / H(s_i)``: the k-NN (Kraskov-type) estimate of mutual information between source
      ``i`` and standardized latent ``j`` (scikit-learn's ``mutual_info_classif``, ``n_neighbors``, seeded), divided
      by the plug-in entropy of the source, in nats.
    * Active latents: interquartile range above ``active_iqr_fraction`` times the largest (the reference code's
      rule); ``L`` of them, ``K`` sources.
    * ``InfoM = (mean_j max_i NMI_ij / sum_i NMI_ij - 1/K) / (1 - 1/K)`` over active latents: does each latent carry
      information about one source only?
    * ``InfoC = (mean_i max_j NMI_ij / sum_j NMI_ij - 1/L) / (1 - 1/L)``: is each source carried by one latent only?
    * ``InfoE``: mean over sources of :func:`explicitness` using all latents: how linearly decodable each source is.

    Parameters
    ----------
    latents
        (cells, latents) continuous values.
    sources
        (cells, sources) discrete labels (integers, strings or categories); bin continuous ones with :func:`discretize`.
    n_neighbors
        Neighbours of the mutual-information estimator.
    random_state
        Seed of the estimator's jitter.
    active_iqr_fraction
        Activity threshold relative to the largest interquartile range.
    max_iter
        Iterations of the logistic regressions.
    source_names
        Labels of the sources in the ``nmi`` table.

    """
    from sklearn.feature_selection import mutual_info_classif

    check_int("n_neighbors", n_neighbors, 1)
    check_int("random_state", random_state, 0)
    check_number("active_iqr_fraction", active_iqr_fraction, 0.0, 1.0, high_open=True)
    check_int("max_iter", max_iter, 1)
    z = _as_matrix(latents, "latents")
    codes = _encode_labels(sources)
    _same_cells(z, codes, ("latents", "sources"))
    n_sources = codes.shape[1]
    names = [f"source_{i}" for i in range(n_sources)] if source_names is None else list(source_names)
    if len(names) != n_sources:
        raise InvalidArgumentError(f"Got {len(names)} source names for {n_sources} sources.")
    if np.any(np.ptp(z, axis=0) == 0):  # by range: the std of a constant 0.1 is rounding residue, not 0
        raise InvalidDataError("A latent column is constant; drop it before computing InfoMEC.")
    for i, name in enumerate(names):
        counts = np.bincount(codes[:, i])
        if counts.max() < 2:  # the estimator leaves out single-cell levels, which would leave no cell at all
            raise InvalidDataError(
                f"Source {name!r} has {len(counts)} levels over {len(codes)} cells, one cell each: the k-NN mutual "
                "information needs a level shared by at least two cells. Bin it into fewer levels "
                "(countvae.metrics.discretize(..., n_bins=...)) or give more cells."
            )
    z_std = (z - z.mean(axis=0)) / z.std(axis=0)
    nmi = np.empty((n_sources, z.shape[1]))
    for i in range(n_sources):
        mi = mutual_info_classif(
            z_std, codes[:, i], discrete_features=False, n_neighbors=n_neighbors, random_state=random_state
        )
        nmi[i] = mi / _entropy(codes[:, i])
    q75, q25 = np.percentile(z, [75, 25], axis=0)
    iqr = q75 - q25
    active = iqr > active_iqr_fraction * iqr.max()
    pruned = nmi[:, active]
    infom = _normalized_share(pruned, axis=0, n=n_sources)
    infoc = _normalized_share(pruned, axis=1, n=int(active.sum()))
    per_source = pd.Series([explicitness(z, codes[:, i], max_iter) for i in range(n_sources)], index=names)
    return InfoMEC(
        infom=infom,
        infoe=float(per_source.mean()),
        infoc=infoc,
        nmi=pd.DataFrame(nmi, index=names, columns=[f"z_{j}" for j in range(z.shape[1])]),
        active=active,
        infoe_per_source=per_source,
    )


# ----- DCI -------------------------------------------------------------------------------------


@dataclass
class DCI:
    """Disentanglement, completeness and informativeness (Eastwood and Williams 2018).

    Attributes
    ----------
    disentanglement, completeness, informativeness
        Scores in [0, 1]; informativeness is the mean held-out accuracy.
    importance
        Random-forest importance of each latent (rows) for each source (columns).

    """

    disentanglement: float
    completeness: float
    informativeness: float
    importance: pd.DataFrame


def dci(
    latents: Any,
    sources: Any,
    *,
    n_estimators: int = 100,
    max_depth: int | None = 10,
    test_size: float = 0.1,
    random_state: int = 0,
) -> DCI:
    """DCI from one random-forest classifier (entropy criterion) per discrete source.

    ``R_jk`` is latent ``j``'s importance for source ``k`` (normalized per source). Disentanglement is
    ``sum_j rho_j (1 - H_K(R_j. / sum R_j.))`` with ``rho_j = sum_k R_jk / sum R`` and entropies in base ``K``;
    completeness is the same per source with base ``L``; informativeness is the mean accuracy on a held-out
    ``test_size`` share of cells.
    """
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.model_selection import train_test_split

    check_int("n_estimators", n_estimators, 1)
    if max_depth is not None:
        check_int("max_depth", max_depth, 1)
    check_number("test_size", test_size, 0.0, 1.0, low_open=True, high_open=True)
    check_int("random_state", random_state, 0)
    z = _as_matrix(latents, "latents")
    codes = _encode_labels(sources)
    _same_cells(z, codes, ("latents", "sources"))
    n_latents, n_sources = z.shape[1], codes.shape[1]
    importance = np.zeros((n_latents, n_sources))
    accuracy = []
    for k in range(n_sources):
        z_train, z_test, y_train, y_test = train_test_split(
            z, codes[:, k], test_size=test_size, random_state=random_state
        )
        forest = RandomForestClassifier(
            n_estimators=n_estimators, criterion="entropy", max_depth=max_depth, random_state=random_state
        ).fit(z_train, y_train)
        importance[:, k] = forest.feature_importances_
        accuracy.append(float(np.mean(forest.predict(z_test) == y_test)))
    total = importance.sum()
    weights = importance / total if total > 0 else np.full_like(importance, 1.0 / importance.size)

    def one_minus_entropy(rows: np.ndarray, base: int) -> np.ndarray:
        if base < 2:
            return np.ones(rows.shape[0])
        return 1.0 - stats.entropy(rows.T + 1e-11, base=base)

    disentanglement = float(np.sum(one_minus_entropy(importance, n_sources) * weights.sum(axis=1)))
    completeness = float(np.sum(one_minus_entropy(importance.T, n_latents) * weights.sum(axis=0)))
    return DCI(
        disentanglement=disentanglement,
        completeness=completeness,
        informativeness=float(np.mean(accuracy)),
        importance=pd.DataFrame(importance, index=[f"z_{j}" for j in range(n_latents)]),
    )


# ----- sparsity and concentration ------------------------------------------------------------------


def normalized_gini(values: Any) -> float:
    """Gini coefficient of non-negative values, scaled so that one non-zero value gives 1 and equal values 0.

    ``G = sum_ij |x_i - x_j| / (2 p^2 mean(x))``, divided by its maximum ``1 - 1/p`` (as ``normalized_gini`` in Hsu
    et al.'s code), computed in ``O(p log p)`` from the sorted values.
    """
    try:
        x = np.asarray(values, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        raise InvalidDataError("normalized_gini needs numeric values.") from None
    if x.size < 2:
        raise InvalidDataError("normalized_gini needs at least two values.")
    if np.any(~np.isfinite(x)) or np.any(x < 0):
        raise InvalidDataError("normalized_gini needs finite non-negative values (clip negative importances first).")
    if x.sum() == 0:
        raise InvalidDataError("normalized_gini is undefined when every value is zero.")
    p = x.size
    ranks = np.arange(1, p + 1)
    abs_diff_sum = 2.0 * np.sum((2 * ranks - p - 1) * np.sort(x))
    gini = abs_diff_sum / (2.0 * p**2 * x.mean())
    return float(gini / (1.0 - 1.0 / p))


def _group_keys(values: Any, name: str, n_cells: int) -> np.ndarray:
    """One group label per cell, without missing values (a cell without a group would be dropped silently)."""
    keys = np.asarray(values)
    if keys.ndim != 1 or keys.shape[0] != n_cells:
        raise InvalidDataError(f"{name} has shape {keys.shape}; it needs one entry per cell ({n_cells}).")
    if pd.isna(keys).any():
        raise InvalidDataError(f"{name} has missing values; label every cell or drop the unlabelled ones.")
    return keys


def group_variance(features: Any, labels: Any, within: Any = None) -> np.ndarray:
    """Variance of each feature explained by ``labels`` (between-group variance), (features,).

    ``v_j = sum_g (n_g / n) (mean_gj - mean_j)^2``. With ``within`` (e.g. cell types when ``labels`` are batches)
    each feature is first centred in each ``within`` group, so ``v_j`` is the variance of the label means inside
    those groups: batch effects not explained by cell-type composition.
    """
    x = _as_matrix(features, "features")
    frame = pd.DataFrame(x)
    keys = [_group_keys(labels, "labels", x.shape[0])]
    if within is not None:
        groups = _group_keys(within, "within", x.shape[0])
        frame = frame - frame.groupby(groups).transform("mean")
        keys = [groups, keys[0]]
    means = frame.groupby(keys).transform("mean").to_numpy()
    return np.mean((means - means.mean(axis=0)) ** 2, axis=0)


def concentration(features: Any, labels: Any, top_fraction: float = 0.25, within: Any = None) -> float:
    """Share of the between-group variance carried by the top ``ceil(top_fraction * p)`` features.

    ``sum_{top} v_j / sum_j v_j`` with ``v`` from :func:`group_variance`; about ``top_fraction`` when variation is
    spread evenly, 1 when it sits in the top features. Computed on the features as given (their scales count):
    compare embeddings with unit-variance features (whitened, ICA, rotated) with care against raw latents.
    """
    check_number("top_fraction", top_fraction, 0.0, 1.0, low_open=True)
    v = group_variance(features, labels, within)
    total = _as_matrix(features, "features").var(axis=0).sum()
    if v.sum() <= 1e-12 * total:  # rounding of group means that equal the overall means (e.g. a single group)
        raise InvalidDataError("The features do not vary between groups; concentration is undefined.")
    top = math.ceil(top_fraction * v.size)
    return float(np.sort(v)[::-1][:top].sum() / v.sum())


def batch_mixing(neighbours: Any, batches: Any) -> np.ndarray:
    """Per cell, the share of its neighbours from another batch over the share expected if batch were random.

    ``neighbours`` (query cells, k) holds indices into ``batches``, the batch of every cell of the graph; the query
    cells are the first ``len(neighbours)`` of them (as :func:`~countvae.diagnostics.analyses.subspace.knn_sets_among`
    stacks them). For a query cell of batch ``b`` among ``n`` cells of which ``n_b`` are in ``b``, a neighbour drawn at
    random from the other cells is of another batch with probability ``(n - n_b) / (n - 1)``. The score's mean over
    cells is 1 when batch is independent of the neighbourhoods and 0 when no cell has a neighbour from another batch.
    Rotations and reflections of the latent space leave it unchanged (it reads only the neighbour sets).

    Raises
    ------
    InvalidDataError
        If there are fewer than two batches, a label is missing, or a neighbour index does not point into ``batches``.

    """
    idx = np.asarray(neighbours)
    labels = _group_keys(batches, "batches", len(np.asarray(batches)))
    if idx.ndim != 2 or idx.shape[1] == 0 or not np.issubdtype(idx.dtype, np.integer):
        raise InvalidDataError(f"neighbours must be (cells, k) integer indices, got shape {idx.shape}.")
    if idx.shape[0] > len(labels) or idx.size and (idx.min() < 0 or idx.max() >= len(labels)):
        raise InvalidDataError(f"neighbours point outside the {len(labels)} cells of batches.")
    _, codes, counts = np.unique(labels, return_inverse=True, return_counts=True)
    if len(counts) < 2:
        raise InvalidDataError("batch_mixing needs cells from at least two batches.")
    own = codes[: idx.shape[0]]
    other = (codes[idx] != own[:, None]).mean(axis=1)
    expected = (len(codes) - counts[own]) / (len(codes) - 1)
    return other / expected
