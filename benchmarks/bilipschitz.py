"""How far a count decoder is from an isometry: a per-cell bi-Lipschitz constant ``B(z)``.

Near-identifiability results (Buchholz and Schoelkopf 2024; Nelson et al. 2026)
bound the ambiguity left after fitting by how far the decoder is from a
(scaled) isometry: the closer the decoder's local stretch is to the same in
every latent direction, the closer independent fits are to a linear map of each
other, and the better ICA can then pick axes. For a count decoder distances in
gene space are measured by the likelihood's Fisher metric: at latent ``z`` with
mean counts ``mu(z)`` and ``J = d log mu / d z``,

``G(z) = J^T diag(w) J`` with ``w = mu`` (Poisson) or ``w = mu theta / (mu + theta)``
(negative binomial, variance ``mu + mu^2 / theta``).

Its eigenvalues are the squared singular values ``sigma_1 >= ... >= sigma_L``
of the decoder's local stretch, and ``B(z) = sqrt(sigma_max / sigma_min)`` is
the bi-Lipschitz constant after the best global rescaling
(``min_c max(c sigma_max, 1 / (c sigma_min))``); 1 for an isometry. The
unscaled ``max(sigma_max, 1 / sigma_min)`` is available too. All of these are
unchanged by a rotation of the latents (``z -> Qz``).

The cross-check uses finite distances instead of derivatives: the
variance-stabilizing map ``phi`` (``2 sqrt(mu)`` for Poisson,
``2 sqrt(theta) asinh(sqrt(mu / theta))`` for NB) turns the Fisher metric into
the Euclidean one, so the ratios ``|phi(mu(z_i)) - phi(mu(z_j))| / |z_i - z_j|``
over nearby cells ``j`` sample the same stretches.
"""

from __future__ import annotations

from typing import Any

import anndata as ad
import numpy as np
import pandas as pd
import torch
from scipy.special import log_softmax
from sklearn.neighbors import NearestNeighbors

from countvae.diagnostics.fitting.fitted_model import CountVAEFit
from countvae.errors import InvalidArgumentError, InvalidDataError
from countvae.model import CountVAE


def true_log_rate_jacobian(adata: ad.AnnData, z: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The simulating decoder's log mean and its Jacobian with respect to the sources.

    Parameters
    ----------
    adata
        Output of ``countvae.data.simulate`` (its ``uns['simulation']`` and ``obs``).
    z
        Source values, (cells, n_latent); default ``obsm['z_true']``.

    Returns
    -------
    log_mean, jacobian
        ``log mu`` (cells, genes), including each cell's size factor, batch
        offset and planted group effect, and ``d log mu / d z`` (cells, genes, n_latent). For the MLP
        decoder the Jacobian includes the softmax normalisation:
        ``(I - 1 p^T) V2 diag(leaky_relu'(u)) V1`` with ``p`` the gene shares.

    """
    params = adata.uns["simulation"]
    z = np.asarray(adata.obsm["z_true"] if z is None else z, dtype=np.float64)
    batch = adata.obs["batch"].cat.codes.to_numpy()
    offset = np.asarray(params["batch_offset"])[batch] + np.log(adata.obs["size_factor"].to_numpy())[:, None]
    if "de_lfc" in params:
        offset = offset + np.log(2.0) * np.asarray(params["de_lfc"])[adata.obs["group"].cat.codes.to_numpy()]
    if params["decoder"] == "linear":
        W = np.asarray(params["W"])
        log_mean = np.asarray(params["b"]) + z @ W.T + offset
        return log_mean, np.broadcast_to(W, (z.shape[0], *W.shape)).copy()
    V1, a1, V2 = (np.asarray(params[k]) for k in ("V1", "a1", "V2"))
    slope = float(params["leaky_slope"])
    pre = z @ V1.T + a1
    eta = log_softmax(np.asarray(params["b"]) + np.where(pre > 0, pre, slope * pre) @ V2.T, axis=1)
    inner = np.einsum("gh,nh,hl->ngl", V2, np.where(pre > 0, 1.0, slope), V1)
    shares = np.exp(eta)
    jacobian = inner - np.einsum("ng,ngl->nl", shares, inner)[:, None, :]
    return eta + offset, jacobian


def fisher_weights(mean: np.ndarray, theta: np.ndarray | None = None) -> np.ndarray:
    """Per-gene weight of the Fisher metric in log-mean coordinates: ``mu`` or ``mu theta / (mu + theta)``."""
    mean = np.asarray(mean, dtype=np.float64)
    if theta is None:
        return mean
    theta = np.asarray(theta, dtype=np.float64)
    return mean * theta / (mean + theta)


def fisher_singular_values(jacobian: np.ndarray, mean: np.ndarray, theta: np.ndarray | None = None) -> np.ndarray:
    """Singular values of the decoder under the Fisher metric, descending, (cells, L).

    Parameters
    ----------
    jacobian
        ``d log mu / d z`` per cell, (cells, genes, L).
    mean
        ``mu`` per cell and gene, (cells, genes).
    theta
        NB inverse dispersion per gene (or per cell and gene); ``None`` for Poisson.

    """
    jac = np.asarray(jacobian, dtype=np.float64)
    mean = np.asarray(mean, dtype=np.float64)
    if jac.ndim != 3 or mean.shape != jac.shape[:2]:
        raise InvalidDataError(
            f"jacobian must be (cells, genes, L) and mean (cells, genes); got {jac.shape}, {mean.shape}."
        )
    metric = np.einsum("ngl,ng,ngk->nlk", jac, fisher_weights(mean, theta), jac)
    eig = np.linalg.eigvalsh(metric)[:, ::-1]
    return np.sqrt(np.clip(eig, 0.0, None))


def bilipschitz_constant(singular_values: np.ndarray, scale_free: bool = True) -> np.ndarray:
    """``sqrt(sigma_max / sigma_min)`` per cell (or ``max(sigma_max, 1 / sigma_min)`` when not scale-free).

    Infinite where ``sigma_min = 0``: the decoder is locally not injective (e.g.
    a ReLU layer with too few active units), so no finite constant bounds it.
    """
    sv = np.asarray(singular_values, dtype=np.float64)
    smax, smin = sv.max(axis=-1), sv.min(axis=-1)
    out = np.full(smin.shape, np.inf)
    ok = smin > 0
    out[ok] = np.sqrt(smax[ok] / smin[ok]) if scale_free else np.maximum(smax[ok], 1.0 / smin[ok])
    return out


def variance_stabilized(mean: np.ndarray, theta: np.ndarray | None = None) -> np.ndarray:
    """``phi(mu)``, whose Euclidean distances are Fisher distances.

    ``2 sqrt(mu)`` for Poisson, ``2 sqrt(theta) asinh(sqrt(mu / theta))`` for NB:
    ``phi'(mu) = 1 / sqrt(Var x)`` in both cases.
    """
    mean = np.asarray(mean, dtype=np.float64)
    if theta is None:
        return 2.0 * np.sqrt(mean)
    theta = np.asarray(theta, dtype=np.float64)
    return 2.0 * np.sqrt(theta) * np.arcsinh(np.sqrt(mean / theta))


def knn_stretch(latents: np.ndarray, embedded: np.ndarray, n_neighbors: int = 10) -> pd.DataFrame:
    """Distance ratios between each cell and its nearest neighbours in latent space.

    For cell ``i`` and its ``n_neighbors`` nearest cells ``j`` (Euclidean, in
    ``latents``), ``r_ij = |embedded_i - embedded_j| / |latents_i - latents_j|``.

    Returns
    -------
    pandas.DataFrame
        Per cell: ``ratio_min``, ``ratio_max`` and ``b_knn = sqrt(ratio_max / ratio_min)``,
        a lower estimate of the scale-free ``B(z)`` (only ``n_neighbors`` directions are probed).

    """
    z = np.asarray(latents, dtype=np.float64)
    f = np.asarray(embedded, dtype=np.float64)
    if z.ndim != 2 or f.ndim != 2 or z.shape[0] != f.shape[0]:
        raise InvalidDataError("latents and embedded must be (cells, dims) arrays of the same cells.")
    if not 1 <= n_neighbors < z.shape[0]:
        raise InvalidArgumentError(f"n_neighbors must lie in [1, {z.shape[0] - 1}], got {n_neighbors!r}.")
    dist, idx = NearestNeighbors(n_neighbors=n_neighbors + 1).fit(z).kneighbors(z)
    dist, idx = dist[:, 1:], idx[:, 1:]
    if np.any(dist == 0):
        raise InvalidDataError("Some cells share the same latent position; drop duplicates first.")
    ratios = np.linalg.norm(f[idx] - f[:, None, :], axis=-1) / dist
    lo, hi = ratios.min(axis=1), ratios.max(axis=1)
    return pd.DataFrame({"ratio_min": lo, "ratio_max": hi, "b_knn": np.sqrt(hi / lo)})


def model_bilipschitz(fit: Any, adata: Any, library_size: float | None = None, n_neighbors: int = 10) -> pd.DataFrame:
    """``B(z)`` of a fitted count VAE at each cell's posterior mean, with the k-NN cross-check.

    Parameters
    ----------
    fit
        A :class:`countvae.CountVAE` or a :class:`countvae.diagnostics.fitting.fitted_model.CountVAEFit`.
    adata
        Cells at whose posterior means the decoder is evaluated.
    library_size
        Common library size of the evaluated means (default: the median total count of
        ``adata``), so that the stretch reflects the decoder, not each cell's depth.
    n_neighbors
        Neighbours of the k-NN cross-check.

    Returns
    -------
    pandas.DataFrame
        Per cell: ``sigma_min``, ``sigma_max``, ``b`` (scale-free), ``b_unscaled`` and ``b_knn``.
        The zero-inflation of a ZINB model is ignored (the NB part's metric is used).

    """
    if isinstance(fit, CountVAE):
        fit = CountVAEFit(fit, seed=0)
    if not isinstance(fit, CountVAEFit):
        raise InvalidArgumentError(f"model_bilipschitz needs a CountVAE or CountVAEFit, got {type(fit).__name__}.")
    module, (x, batch) = fit.tensors(adata)
    if library_size is None:
        library_size = float(np.median(x.sum(-1).cpu().numpy()))
    z = fit.latent(adata)
    log_rate = fit.decode_log_rate(adata, z)
    mean = library_size * np.exp(log_rate)
    log_theta = module.likelihood.log_theta_for(batch)
    theta = None
    if log_theta is not None:
        with torch.no_grad():
            theta = np.broadcast_to(torch.exp(log_theta).cpu().numpy(), mean.shape)
    sv = fisher_singular_values(fit.decoder_jacobian(adata), mean, theta)
    out = pd.DataFrame(
        {
            "sigma_min": sv[:, -1],
            "sigma_max": sv[:, 0],
            "b": bilipschitz_constant(sv),
            "b_unscaled": bilipschitz_constant(sv, scale_free=False),
        },
        index=adata.obs_names,
    )
    out["b_knn"] = knn_stretch(z, variance_stabilized(mean, theta), n_neighbors)["b_knn"].to_numpy()
    return out
