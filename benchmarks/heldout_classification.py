"""Cell-type classification on held-out batches: the classifier of Table 3 of ``ica_tables34_real.py``.

For each held-out batch a gradient-boosted classifier is trained on the other
batches; its one-vs-rest AUROC and the permutation importance of each feature
(with their sparsity, :func:`countvae.metrics.normalized_gini`) measure how well,
and from how few features, a label is read across batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from countvae import metrics
from countvae.errors import InvalidArgumentError, InvalidDataError


@dataclass
class HeldoutClassification:
    """Cell-type classification on held-out batches.

    Attributes
    ----------
    auroc
        One-vs-rest AUROC, held-out batch (rows) x class (columns); NaN where a
        class is absent from the held-out batch.
    importance
        Permutation importance (drop of the mean AUROC) of each feature (columns)
        per held-out batch (rows).
    sparsity
        :func:`countvae.metrics.normalized_gini` of each row of ``importance`` after clipping at 0.

    """

    auroc: pd.DataFrame
    importance: pd.DataFrame
    sparsity: pd.Series

    @property
    def mean_auroc(self) -> float:
        """Mean AUROC over classes and held-out batches."""
        return float(np.nanmean(self.auroc.to_numpy()))


def _mean_ovr_auroc(y: np.ndarray, proba: np.ndarray, classes: np.ndarray) -> np.ndarray:
    from sklearn.metrics import roc_auc_score

    out = np.full(classes.size, np.nan)
    for c, label in enumerate(classes):
        positive = y == label
        if 0 < positive.sum() < y.size:
            out[c] = roc_auc_score(positive, proba[:, c])
    return out


def heldout_batch_classification(
    features: Any,
    labels: Any,
    batches: Any,
    *,
    test_batches: list[Any] | None = None,
    n_repeats: int = 5,
    random_state: int = 0,
    classifier_params: dict[str, Any] | None = None,
    n_threads: int | None = 1,
) -> HeldoutClassification:
    """Train a gradient-boosted classifier on all batches but one and score it on the held-out batch.

    For each held-out batch a ``HistGradientBoostingClassifier`` (scikit-learn;
    a LightGBM-style model) is trained on the other batches' cells; its
    one-vs-rest AUROC per label on the held-out cells measures how well the
    label is read from the features across batches. Feature importance is the
    mean drop of that AUROC when a feature's values are permuted among the
    held-out cells (``n_repeats`` permutations), the same for every embedding.

    Parameters
    ----------
    features
        (cells, features) embedding.
    labels
        Cell labels to classify (e.g. cell types).
    batches
        Batch of each cell.
    test_batches
        Batches to hold out in turn (default: every batch).
    n_repeats
        Permutations per feature.
    random_state
        Seed of the classifier and the permutations.
    classifier_params
        Extra arguments of ``HistGradientBoostingClassifier``.
    n_threads
        OpenMP threads of the classifier (``None``: all cores). The default of 1
        avoids the large slow-down of OpenMP's busy-waiting on a shared machine.

    Returns
    -------
    HeldoutClassification

    """
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or not np.all(np.isfinite(x)):
        raise InvalidDataError("features must be a finite (cells, features) array.")
    y = np.asarray(labels)
    b = np.asarray(batches)
    if y.shape[0] != x.shape[0] or b.shape[0] != x.shape[0]:
        raise InvalidDataError("features, labels and batches must describe the same cells.")
    held = list(pd.unique(b)) if test_batches is None else list(test_batches)
    if len(pd.unique(b)) < 2:
        raise InvalidDataError("Held-out-batch classification needs at least two batches.")
    classes = np.unique(y)
    rng = np.random.default_rng(random_state)
    aurocs, importances = [], []
    with threadpool_limits(limits=n_threads, user_api="openmp"):
        for batch in held:
            auroc, drops = _heldout_one(
                x, y, b == batch, batch, classes, rng, n_repeats, random_state, classifier_params
            )
            aurocs.append(auroc)
            importances.append(drops)
    index = pd.Index([str(h) for h in held], name="held_out_batch")
    importance = pd.DataFrame(importances, index=index)
    sparsity = importance.clip(lower=0.0).apply(
        lambda row: metrics.normalized_gini(row.to_numpy()) if row.sum() > 0 else np.nan, axis=1
    )
    return HeldoutClassification(
        auroc=pd.DataFrame(aurocs, index=index, columns=[str(c) for c in classes]),
        importance=importance,
        sparsity=sparsity,
    )


def _heldout_one(
    x: np.ndarray,
    y: np.ndarray,
    test: np.ndarray,
    batch: Any,
    classes: np.ndarray,
    rng: np.random.Generator,
    n_repeats: int,
    random_state: int,
    classifier_params: dict[str, Any] | None,
) -> tuple[np.ndarray, np.ndarray]:
    """AUROC per class on one held-out batch and the permutation importance of each feature."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    if not test.any():
        raise InvalidArgumentError(f"Batch {batch!r} has no cells.")
    params = dict(random_state=random_state, **(classifier_params or {}))
    model = HistGradientBoostingClassifier(**params).fit(x[~test], y[~test])
    columns = np.searchsorted(classes, model.classes_)
    proba = np.zeros((int(test.sum()), classes.size))
    proba[:, columns] = model.predict_proba(x[test])
    auroc = _mean_ovr_auroc(y[test], proba, classes)
    baseline = np.nanmean(auroc)
    drops = np.zeros(x.shape[1])
    for j in range(x.shape[1]):
        for _ in range(n_repeats):
            shuffled = x[test].copy()
            shuffled[:, j] = rng.permutation(shuffled[:, j])
            proba[:, columns] = model.predict_proba(shuffled)
            drops[j] += baseline - np.nanmean(_mean_ovr_auroc(y[test], proba, classes))
    return auroc, drops / n_repeats
