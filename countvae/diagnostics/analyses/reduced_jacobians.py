"""Decoder Jacobians in a small gene-space basis, for bootstrap replicates of the decoder rows.

The decoder rows of the invariants table (gene-space span, decoder Gram, mean Jacobian loadings) are functions of
per-cell Jacobians ``J_i`` (genes x L). Recomputing them for hundreds of bootstrap replicates on thousands of genes is
too slow, so each fit's Jacobians are written once in the orthonormal basis ``U`` (genes x r) of their leading
``r = 3 L`` gene-space directions: ``J_i ~= U C_i``. A replicate then needs only ``r x r`` matrices:

* span: the leading eigenvectors of ``E = sum_i w_i C_i C_i^T``, scaled by the roots of their eigenvalues (as
  :func:`countvae.diagnostics.analyses.subspace.jacobian_span`);
* Gram: ``G ~= U E U^T``, and ``<G_a, G_b>_F = tr(E_a M E_b M^T)`` with ``M = U_a^T U_b``;
* loadings: ``U mean_w(C_i)``.

The basis keeps the share ``kept_energy`` of the Jacobians' squared norm (1 for a linear decoder, whose Jacobian is
its weight matrix). Only the replicates' deviations from the all-cells value use this reduction; the scores in the
table are computed on the full Jacobians.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.utils.extmath import randomized_svd

from countvae.diagnostics.analyses.resampling import concordance_from_moments

#: Basis directions per latent dimension.
RANK_PER_DIMENSION = 3


@dataclass(frozen=True)
class ReducedJacobians:
    """Per-cell Jacobians ``J_i ~= basis @ coefficients[i]``.

    Attributes
    ----------
    basis
        Orthonormal gene-space basis, (genes, r).
    coefficients
        (cells, r, n_latent).
    kept_energy
        ``sum ||C_i||^2 / sum ||J_i||^2``: the share of the Jacobians the basis holds.

    """

    basis: np.ndarray
    coefficients: np.ndarray
    kept_energy: float

    @property
    def n_latent(self) -> int:
        """Latent dimensions."""
        return self.coefficients.shape[2]


def reduce_jacobians(jacobians: np.ndarray, seed: int = 0) -> ReducedJacobians:
    """Write (cells, genes, L) Jacobians in the basis of their leading ``3 L`` gene-space directions."""
    jac = np.asarray(jacobians, dtype=np.float64)
    n_cells, n_genes, n_latent = jac.shape
    stacked = np.transpose(jac, (1, 0, 2)).reshape(n_genes, n_cells * n_latent)
    rank = min(RANK_PER_DIMENSION * n_latent, *stacked.shape)
    basis, _, _ = randomized_svd(stacked, n_components=rank, n_iter=4, random_state=seed)
    coefficients = np.einsum("gr,cgl->crl", basis, jac)
    total = float(np.sum(jac**2))
    kept = float(np.sum(coefficients**2)) / total if total > 0 else 1.0
    return ReducedJacobians(basis, coefficients, kept)


def energy_replicates(weights: np.ndarray, rj: ReducedJacobians) -> np.ndarray:
    """``sum_i w_i C_i C_i^T / sum_i w_i`` for each row of cell weights, (rows, r, r)."""
    c = rj.coefficients
    outer = np.einsum("crl,csl->crs", c, c).reshape(len(c), -1)
    r = c.shape[1]
    return ((weights @ outer) / weights.sum(axis=1, keepdims=True)).reshape(len(weights), r, r)


def span_replicates(energy: np.ndarray, n_latent: int) -> np.ndarray:
    """The leading ``n_latent`` eigenvectors of each energy matrix scaled by the roots of their eigenvalues."""
    values, vectors = np.linalg.eigh(energy)
    top = vectors[:, :, ::-1][:, :, :n_latent]
    return top * np.sqrt(np.clip(values[:, ::-1][:, :n_latent], 0.0, None))[:, None, :]


def overlap_replicates(xa: np.ndarray, xb: np.ndarray, basis_a: np.ndarray, basis_b: np.ndarray) -> np.ndarray:
    """:func:`~countvae.diagnostics.analyses.subspace.weighted_overlap` of ``U_a X_a[r]`` and ``U_b X_b[r]``."""
    m_ba = basis_b.T @ basis_a
    out = np.empty(len(xa))
    for r, (a, b) in enumerate(zip(xa, xb, strict=True)):
        qa, _ = np.linalg.qr(a)
        qb, _ = np.linalg.qr(b)
        share_a = np.linalg.norm(qb.T @ m_ba @ a) ** 2 / max(np.linalg.norm(a) ** 2, 1e-300)
        share_b = np.linalg.norm(qa.T @ m_ba.T @ b) ** 2 / max(np.linalg.norm(b) ** 2, 1e-300)
        out[r] = 0.5 * (share_a + share_b)
    return out


def gram_cosine_replicates(ea: np.ndarray, eb: np.ndarray, basis_a: np.ndarray, basis_b: np.ndarray) -> np.ndarray:
    """Cosine of the Gram matrices ``U_a E_a U_a^T`` and ``U_b E_b U_b^T`` per replicate."""
    m = basis_a.T @ basis_b
    inner = np.einsum("kij,jl,klm,im->k", ea, m, eb, m)
    norms = np.linalg.norm(ea, axis=(1, 2)) * np.linalg.norm(eb, axis=(1, 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        return inner / norms


def loading_replicates(weights: np.ndarray, rj: ReducedJacobians) -> np.ndarray:
    """Weighted mean coefficients (the mean Jacobian in the basis), (rows, r, L)."""
    c = rj.coefficients
    flat = (weights @ c.reshape(len(c), -1)) / weights.sum(axis=1, keepdims=True)
    return flat.reshape(len(weights), *c.shape[1:])


def loading_concordance_replicates(
    ya: np.ndarray, yb: np.ndarray, basis_a: np.ndarray, basis_b: np.ndarray, rotation: np.ndarray | None = None
) -> np.ndarray:
    """Mean over columns of the concordance of loadings ``U_a Y_a R`` and ``U_b Y_b`` over genes, per replicate."""
    if rotation is not None:
        ya = ya @ rotation
    n_genes = basis_a.shape[0]
    ua, ub = basis_a.sum(axis=0) / n_genes, basis_b.sum(axis=0) / n_genes
    mean_a, mean_b = np.einsum("r,krl->kl", ua, ya), np.einsum("r,krl->kl", ub, yb)
    e_aa, e_bb = np.sum(ya * ya, axis=1) / n_genes, np.sum(yb * yb, axis=1) / n_genes
    e_ab = np.einsum("krl,rs,ksl->kl", ya, basis_a.T @ basis_b, yb) / n_genes
    ccc = concordance_from_moments(mean_a, mean_b, e_aa - mean_a**2, e_bb - mean_b**2, e_ab - mean_a * mean_b)
    return np.nanmean(ccc, axis=1)
