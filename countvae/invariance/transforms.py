"""Linear maps of the latent space: orthogonal symmetries of the N(0, I) prior and non-orthogonal controls.

Every function returns a float64 (L, L) array ``A`` acting on column vectors, ``z' = A z`` (for latents with cells
in rows, ``Z' = Z A^T``). Random maps take an integer ``seed`` and their own ``numpy.random.Generator``, never the
global random state.

The orthogonal maps (:func:`random_orthogonal`, :func:`random_rotation`, :func:`reflection`, :func:`permutation`,
:func:`signed_permutation`) leave N(0, I), hence ``p(x)``, unchanged; the non-orthogonal controls
(:func:`axis_scaling`, :func:`shear`) do not, even with the decoder compensated by ``A^{-1}``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import linalg
from scipy.optimize import linear_sum_assignment
from scipy.stats import ortho_group

from countvae._checks import check_int, check_number
from countvae.errors import InvalidArgumentError


def _check_dimension(L: int) -> int:
    return check_int("the latent dimension L", L, 1)


def _rng(seed: int | None) -> np.random.Generator:
    return np.random.default_rng(None if seed is None else check_int("seed", seed, 0))


def as_matrix(A, name: str = "A", n_latent: int | None = None) -> np.ndarray:
    """``A`` as a finite, square float64 array, optionally of a required size.

    Parameters
    ----------
    A
        Array-like or torch tensor.
    name
        Name used in error messages.
    n_latent
        Required size ``L`` of an (L, L) matrix, or ``None`` for any square size.

    Raises
    ------
    InvalidArgumentError
        If ``A`` is not a 2-d square finite matrix of the required size.

    """
    if hasattr(A, "detach"):
        A = A.detach().cpu().numpy()
    try:
        M = np.asarray(A, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{name} must be a numeric matrix: {exc}") from None
    if M.ndim != 2:
        raise InvalidArgumentError(f"{name} must be a 2-d matrix, got an array of shape {M.shape}.")
    if M.shape[0] != M.shape[1]:
        raise InvalidArgumentError(f"{name} must be square (L x L), got shape {M.shape}.")
    if M.shape[0] == 0:
        raise InvalidArgumentError(f"{name} is an empty 0 x 0 matrix; a latent space has at least one dimension.")
    if n_latent is not None and M.shape[0] != n_latent:
        raise InvalidArgumentError(
            f"{name} has shape {M.shape} but the model has n_latent={n_latent}; pass an {n_latent} x {n_latent} matrix."
        )
    if not np.isfinite(M).all():
        raise InvalidArgumentError(f"{name} contains NaN or infinite entries.")
    return M


def orthogonality_error(Q) -> float:
    """``max |Q^T Q - I|``, the largest entry of the deviation from orthogonality."""
    M = as_matrix(Q, "Q")
    return float(np.abs(M.T @ M - np.eye(M.shape[0])).max())


def check_orthogonal(Q, atol: float = 1e-6, n_latent: int | None = None) -> np.ndarray:
    """Check that ``Q`` is an orthogonal matrix and return it as float64.

    Parameters
    ----------
    Q
        Candidate matrix (array-like or tensor).
    atol
        Largest accepted entry of ``|Q^T Q - I|``.
    n_latent
        Required size, or ``None``.

    Raises
    ------
    InvalidArgumentError
        If ``Q`` is not a finite square matrix (of size ``n_latent``) or not orthogonal within ``atol``; the
        message gives ``||Q^T Q - I||``.

    """
    atol = check_number("atol", atol, 0.0)  # a NaN tolerance would accept every matrix
    M = as_matrix(Q, "Q", n_latent)
    deviation = M.T @ M - np.eye(M.shape[0])
    worst = float(np.abs(deviation).max())
    if worst > atol:
        raise InvalidArgumentError(
            f"Q is not orthogonal: max |Q^T Q - I| = {worst:.3g} (Frobenius norm "
            f"{np.linalg.norm(deviation):.3g}) exceeds atol={atol:g}. Only orthogonal maps leave a N(0, I) "
            "prior unchanged; pass check=False to apply a non-orthogonal map as a control."
        )
    return M


def nearest_orthogonal(Q) -> np.ndarray:
    """The orthogonal matrix closest to ``Q`` in Frobenius norm: the unitary polar factor (``scipy.linalg.polar``).

    Raises
    ------
    InvalidArgumentError
        If ``Q`` is singular (or nearly so): its closest orthogonal matrix is then not unique.

    """
    M = as_matrix(Q, "Q")
    singular_values = np.linalg.svd(M, compute_uv=False)
    if singular_values[-1] <= 1e-12 * max(singular_values[0], np.finfo(float).tiny):
        raise InvalidArgumentError(
            "Q is singular (or nearly so), so no single orthogonal matrix is closest to it; pass an invertible map."
        )
    return linalg.polar(M)[0]


def random_orthogonal(L: int, seed: int | None = 0) -> np.ndarray:
    """A Haar-distributed (uniformly random) orthogonal matrix; its determinant is +1 or -1.

    Drawn by ``scipy.stats.ortho_group`` from a generator seeded with ``seed``.
    """
    L = _check_dimension(L)
    return np.asarray(ortho_group.rvs(L, random_state=_rng(seed)), dtype=np.float64).reshape(L, L)


def random_rotation(L: int, seed: int | None = 0, degrees_from_axes: float = 0.0) -> np.ndarray:
    """A Haar-distributed rotation (orthogonal, determinant +1).

    A Haar orthogonal matrix with negative determinant has its first column negated; a fixed reflection preserves
    Haar measure, so the result is uniform on the rotation group. For ``L = 1`` the only rotation is the identity.
    With ``degrees_from_axes`` (at most 30), a draw within that angle of a signed permutation (the mean ``|entry|`` of
    its best-matched axes above the angle's cosine) is replaced by the generator's next draw (uniform on the rest):
    such a rotation nearly keeps priors with independent axes (Laplace, diagonal), so it tests little as a map that
    must change them. Only at ``L = 2`` is this common (15 degrees: a third of the draws; 30 degrees: two thirds).
    """
    L = _check_dimension(L)
    check_number("degrees_from_axes", degrees_from_axes, 0.0, 30.0)
    rng = _rng(seed)
    while True:
        Q = np.asarray(ortho_group.rvs(L, random_state=rng), dtype=np.float64).reshape(L, L)
        if np.linalg.det(Q) < 0:
            Q[:, 0] = -Q[:, 0]
        rows, cols = linear_sum_assignment(-np.abs(Q))
        if L < 2 or np.abs(Q[rows, cols]).mean() <= np.cos(np.radians(degrees_from_axes)):
            return Q


def reflection(signs: Sequence[float]) -> np.ndarray:
    """``diag(signs)`` for signs of +1 or -1: flips the chosen latent axes."""
    s = np.asarray(signs, dtype=np.float64)
    if s.ndim != 1 or s.size == 0 or not np.isin(s, (-1.0, 1.0)).all():
        raise InvalidArgumentError(f"signs must be a non-empty sequence of +1 and -1, got {signs!r}.")
    return np.diag(s)


def random_reflection(L: int, seed: int | None = 0) -> np.ndarray:
    """Random sign flips of the axes, never the identity (at least one axis is flipped)."""
    L = _check_dimension(L)
    rng = _rng(seed)
    signs = rng.choice([-1.0, 1.0], size=L)
    if (signs > 0).all():
        signs[rng.integers(L)] = -1.0
    return reflection(signs)


def permutation(order: Sequence[int]) -> np.ndarray:
    """The permutation matrix ``P`` with ``(P z)_i = z_{order[i]}``."""
    o = np.asarray(order)
    L = o.size
    if o.ndim != 1 or L == 0 or not np.issubdtype(o.dtype, np.integer) or sorted(o.tolist()) != list(range(L)):
        raise InvalidArgumentError(f"order must be a permutation of 0..L-1, got {order!r}.")
    P = np.zeros((L, L))
    P[np.arange(L), o] = 1.0
    return P


def random_permutation(L: int, seed: int | None = 0) -> np.ndarray:
    """A uniformly random permutation matrix other than the identity (for ``L >= 2``)."""
    L = _check_dimension(L)
    if L < 2:
        raise InvalidArgumentError("A non-identity permutation needs at least 2 latent dimensions.")
    rng = _rng(seed)
    while True:
        order = rng.permutation(L)
        if (order != np.arange(L)).any():
            return permutation(order)


def signed_permutation(order: Sequence[int], signs: Sequence[float]) -> np.ndarray:
    """``diag(signs) @ permutation(order)``: permute the axes, then flip the chosen ones."""
    P = permutation(order)
    S = reflection(signs)
    if S.shape != P.shape:
        raise InvalidArgumentError(f"order and signs must have the same length, got {P.shape[0]} and {S.shape[0]}.")
    return S @ P


def random_signed_permutation(L: int, seed: int | None = 0) -> np.ndarray:
    """A random non-identity permutation (for ``L >= 2``) combined with random sign flips."""
    L = _check_dimension(L)
    rng = _rng(seed)
    order = rng.permutation(L)
    while L >= 2 and (order == np.arange(L)).all():
        order = rng.permutation(L)
    signs = rng.choice([-1.0, 1.0], size=L)
    return signed_permutation(order, signs)


def is_signed_permutation(A, atol: float = 1e-12) -> bool:
    """Whether every row and column of ``A`` has exactly one entry of +-1 and zeros elsewhere (within ``atol``)."""
    M = as_matrix(A, "A")
    nonzero = np.abs(M) > atol
    if not (nonzero.sum(0) == 1).all() or not (nonzero.sum(1) == 1).all():
        return False
    return bool(np.allclose(np.abs(M[nonzero]), 1.0, rtol=0, atol=atol))


def axis_scaling(scales: Sequence[float]) -> np.ndarray:
    """``diag(scales)``: stretch or shrink latent axes (a non-orthogonal control unless all scales are +-1)."""
    s = np.asarray(scales, dtype=np.float64)
    if s.ndim != 1 or s.size == 0 or not np.isfinite(s).all() or (s == 0).any():
        raise InvalidArgumentError(f"scales must be a non-empty sequence of finite non-zero numbers, got {scales!r}.")
    return np.diag(s)


def default_scaling(L: int, factor: float = 1.5) -> np.ndarray:
    """Axis scaling by ``factor, 1/factor, factor, ...``: every axis is changed, det = 1 for even ``L``."""
    L = _check_dimension(L)
    if check_number("factor", factor, 0.0, low_open=True) == 1.0:
        raise InvalidArgumentError(f"factor must be positive and different from 1, got {factor!r}.")
    return axis_scaling([factor if k % 2 == 0 else 1.0 / factor for k in range(L)])


def shear(L: int, amount: float = 1.0) -> np.ndarray:
    """``I + amount * N`` with ``N`` all ones above the diagonal: a volume-preserving (det 1) non-orthogonal control.

    Every latent coordinate but the last receives ``amount`` times the ones after it, coupling every pair of axes.
    """
    L = _check_dimension(L)
    if L < 2:
        raise InvalidArgumentError("A shear needs at least 2 latent dimensions.")
    if check_number("amount", amount) == 0.0:
        raise InvalidArgumentError(f"amount must be a finite non-zero number, got {amount!r}.")
    return np.eye(L) + float(amount) * np.triu(np.ones((L, L)), k=1)


def classify(A, atol: float = 1e-10) -> str:
    """Name the kind of map: ``"identity"``, ``"sign flip"``, ``"permutation"``, ``"signed permutation"``,
    ``"rotation"`` (orthogonal, det +1), ``"orthogonal"`` (det -1), or ``"linear"`` (not orthogonal).
    """  # noqa: D205
    M = as_matrix(A, "A")
    L = M.shape[0]
    if np.allclose(M, np.eye(L), rtol=0, atol=atol):
        return "identity"
    if is_signed_permutation(M, atol):
        if np.allclose(np.abs(M), np.eye(L), rtol=0, atol=atol):
            return "sign flip"
        return "permutation" if (M > 0.5).sum() == L else "signed permutation"
    if orthogonality_error(M) <= atol:
        return "rotation" if np.linalg.det(M) > 0 else "orthogonal"
    return "linear"
