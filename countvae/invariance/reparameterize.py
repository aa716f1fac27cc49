"""A fitted model rewritten in new latent coordinates ``z' = A z`` without changing what it computes.

For a model with decoder ``f(z)`` and guide ``q(z | x) = N(mu, diag sigma^2)``,
:func:`reparameterize` returns a model with decoder ``f'(z') = f(A^{-1} z')`` and
guide ``q'(z' | x) = N(A mu, A diag(sigma^2) A^T)`` (the law of ``A z``), with the
same prior. The decoder is rewritten only in the weight that multiplies ``z``:

* linear decoder: ``W -> W A^{-1}`` (``decoder.weight``, genes x L);
* MLP decoder: the first layer's weight on ``z`` (``decoder.hidden.linears[0].data.weight``).

Batch one-hot columns live in a separate ``covariate`` layer, and batch offsets,
dispersions, zero-inflation gates and library handling are left as they are.
For orthogonal ``A`` and the N(0, I) prior the new model has exactly the same
``p(x)``; for other maps (the controls) only the prior's mismatch changes it.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from countvae.errors import InvalidArgumentError, NotTrainedError
from countvae.invariance.transforms import as_matrix, check_orthogonal, nearest_orthogonal, orthogonality_error
from countvae.model import CountVAE

_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64"}

#: Condition number above which a non-orthogonal map is refused: its inverse would lose most digits.
MAX_CONDITION = 1e8

#: Deviation from orthogonality left as it is (a signed permutation or a float64 Haar draw is kept exactly).
_ROUNDING = 1e-14


def _require_model(model) -> None:
    if not isinstance(model, CountVAE):
        raise InvalidArgumentError(f"Expected a fitted countvae.CountVAE, got {type(model).__name__}.")
    if not model.is_trained:
        raise NotTrainedError("The model is not trained yet; call model.train() before reparameterizing it.")


def copy_model(model: CountVAE, dtype: torch.dtype | None = None) -> CountVAE:
    """An independent copy of a model, optionally converted to another floating-point type.

    Parameters and history are deep-copied; the AnnData is shared by reference
    (it is never modified), and the optimiser state is dropped (a copy that is
    trained further starts a fresh optimiser).

    Parameters
    ----------
    model
        The model to copy.
    dtype
        ``torch.float32`` or ``torch.float64``; ``None`` keeps the model's.

    """
    if dtype is not None and dtype not in _DTYPE_NAMES:
        raise InvalidArgumentError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}.")
    memo: dict[int, object] = {}
    if model.adata is not None:
        memo[id(model.adata)] = model.adata
    new = copy.deepcopy(model, memo)
    new._optimizer = None
    if dtype is not None:
        new.module.to(dtype=dtype)
        new._settings["dtype"] = _DTYPE_NAMES[dtype]
    return new


def latent_weight(model: CountVAE) -> torch.nn.Parameter:
    """The decoder parameter that multiplies ``z``: (genes x L) for linear, (hidden x L) for the MLP."""
    dec = model.module.decoder
    return dec.weight if model.settings["decoder"] == "linear" else dec.hidden.linears[0].data.weight


def reparameterize(model: CountVAE, Q, *, check: bool = True, atol: float = 1e-6) -> CountVAE:
    """A new fitted model whose latent variable is ``A z`` (``A = Q``), computing the same decoded means.

    Parameters
    ----------
    model
        A trained :class:`countvae.CountVAE` (left untouched).
    Q
        The L x L map ``A`` (array-like or tensor). With ``check=True`` it must be
        orthogonal within ``atol``; it is then replaced by its nearest orthogonal
        matrix (which differs from it by at most about ``atol``) unless it is
        orthogonal to rounding already, so that ``A^{-1} = A^T`` holds to rounding
        and the invariance is exact.
    check
        Require an orthogonal ``A`` (the symmetry of the N(0, I) prior). ``False``
        accepts any invertible map (the controls); ``A^{-1}`` is then computed by
        ``torch.linalg.inv``.
    atol
        Tolerance of the orthogonality check on ``max |Q^T Q - I|``.

    Returns
    -------
    CountVAE
        A deep copy (sharing the AnnData) with ``module.latent_map = A @ (previous map or I)``
        and the decoder's weight on ``z`` multiplied by ``A^{-1}`` on the right. Its
        posterior means are ``Z A^T``; its normalized expression equals the
        original's; its prior is unchanged (for a ``"laplace"`` or ``"diagonal"``
        prior this is what makes a rotation change ``p(x)``).

    Raises
    ------
    InvalidArgumentError
        If ``Q`` has the wrong shape or is not finite, is not orthogonal with
        ``check=True``, or is singular or badly conditioned with ``check=False``.
    NotTrainedError
        If the model has not been trained.

    Examples
    --------
    >>> from countvae import invariance
    >>> Q = invariance.random_rotation(model.n_latent, seed=0)  # doctest: +SKIP
    >>> rotated = invariance.reparameterize(model, Q)  # doctest: +SKIP
    >>> np.allclose(rotated.get_latent_representation(), model.get_latent_representation() @ Q.T)  # doctest: +SKIP
    True

    """
    _require_model(model)
    L = model.n_latent
    if check:
        A = check_orthogonal(Q, atol=atol, n_latent=L)
        if orthogonality_error(A) > _ROUNDING:
            A = nearest_orthogonal(A)
        A_inv = A.T
    else:
        A = as_matrix(Q, "Q", L)
        cond = np.linalg.cond(A)
        if not np.isfinite(cond) or cond > MAX_CONDITION:
            raise InvalidArgumentError(
                f"Q is singular or nearly so (condition number {cond:.3g} > {MAX_CONDITION:g}); "
                "a reparameterization needs an invertible map."
            )
        A_inv = torch.linalg.inv(torch.as_tensor(A, dtype=torch.float64)).numpy()
    new = copy_model(model)
    module = new.module
    dtype, device = next(module.parameters()).dtype, new.device
    previous = np.eye(L) if module.latent_map is None else module.latent_map.detach().cpu().double().numpy()
    module.latent_map = torch.as_tensor(A @ previous, dtype=dtype, device=device)
    weight = latent_weight(new)
    with torch.no_grad():
        rewritten = weight.detach().cpu().double() @ torch.as_tensor(A_inv, dtype=torch.float64)
        weight.copy_(rewritten.to(dtype=dtype, device=device))
    return new
