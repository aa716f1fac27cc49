"""A fitted model rewritten in new latent coordinates ``z' = A z`` without changing what it computes.

For a model with decoder ``f(z)`` and guide ``q(z | x) = N(mu, diag sigma^2)``, :func:`reparameterize` returns a
model with decoder ``f'(z') = f(A^{-1} z')``, guide ``q'(z' | x) = N(A mu, A diag(sigma^2) A^T)`` (the law of
``A z``) and the same prior. The decoder is rewritten only in the weight that multiplies ``z``:

* linear decoder: ``W -> W A^{-1}`` (``decoder.weight``, genes x L);
* MLP decoder: the first layer's weight on ``z`` (``decoder.hidden.linears[0].data.weight``).

Batch one-hot columns live in a separate ``covariate`` layer; batch offsets, dispersions, zero-inflation gates and
library handling are left as they are. For orthogonal ``A`` and the N(0, I) prior the new model has exactly the same
``p(x)``; for other maps (the controls) only the prior's mismatch changes it. With a prior on the loadings
(:mod:`countvae.module.loadings`) the decoder weight is their posterior mean, rewritten as above; the guide's
variances are mapped with it and the prior on ``W`` is kept, which is what makes a rotation change ``p(W)``.
"""

from __future__ import annotations

import numpy as np
import torch

from countvae._checks import check_bool
from countvae.errors import InvalidArgumentError
from countvae.ica import ICARotation
from countvae.invariance.transforms import as_matrix, check_orthogonal, nearest_orthogonal, orthogonality_error
from countvae.model import CountVAE, copy_model

#: Condition number above which a non-orthogonal map is refused: its inverse would lose most digits.
MAX_CONDITION = 1e8

#: Deviation from orthogonality left as it is (a signed permutation or a float64 Haar draw is kept exactly).
_ROUNDING = 1e-14


def check_trained_model(model) -> CountVAE:
    """``model`` itself when it is a trained :class:`countvae.CountVAE`.

    Raises
    ------
    InvalidArgumentError
        If it is something else.
    NotTrainedError
        If it has not been trained.

    """
    if not isinstance(model, CountVAE):
        raise InvalidArgumentError(f"Expected a fitted countvae.CountVAE, got {type(model).__name__}.")
    model.require_trained()
    return model


def reparameterize(model: CountVAE, Q, *, check: bool = True, atol: float = 1e-6) -> CountVAE:
    """A new fitted model whose latent variable is ``A z`` (``A = Q``), computing the same decoded means.

    Parameters
    ----------
    model
        A trained :class:`countvae.CountVAE` (left untouched).
    Q
        The L x L map ``A`` (array-like or tensor). With ``check=True`` it must be orthogonal within ``atol``; unless
        orthogonal to rounding already, it is then replaced by its nearest orthogonal matrix (at most about ``atol``
        away), so that ``A^{-1} = A^T`` holds to rounding and the invariance is exact.
    check
        Require an orthogonal ``A`` (the symmetry of the N(0, I) prior). ``False`` accepts any invertible map (the
        controls), inverted by ``torch.linalg.inv``.
    atol
        Tolerance of the orthogonality check on ``max |Q^T Q - I|``.

    Returns
    -------
    CountVAE
        A deep copy (sharing the AnnData) with ``module.latent_map = A @ (previous map or I)`` and the decoder's weight
        on ``z`` multiplied by ``A^{-1}`` on the right. Its posterior means are ``Z A^T``; its normalized expression
        equals the original's; its prior is unchanged (for a ``"laplace"`` or ``"diagonal"`` prior this is what makes a
        rotation change ``p(x)``).

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
    check_trained_model(model)
    L = model.n_latent
    if check_bool("check", check):
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
    weight = module.decoder.latent_weight  # the parameter that multiplies z
    with torch.no_grad():
        rewritten = weight.detach().cpu().double() @ torch.as_tensor(A_inv, dtype=torch.float64)
        weight.copy_(rewritten.to(dtype=dtype, device=device))
    if module.loadings_prior is not None:  # the guide of W around the rewritten mean; its prior is kept
        module.loadings_prior.map_guide(torch.as_tensor(A_inv, dtype=dtype, device=device))
    return new


def reparameterize_ica(model: CountVAE, ica: ICARotation | None = None) -> CountVAE:
    """A copy of a fitted :class:`countvae.CountVAE` whose latent coordinates are ICA axes.

    With ``A = ica.components_`` (k = n_latent components), the copy's latent is ``z' = A z`` and its decoder
    ``f'(z') = f(A^{-1} z')``, through :func:`reparameterize` (the guide returns the law of ``A z``; the prior stays
    N(0, I)). What this preserves, exactly:

    * decoded means at mapped points, ``f'(A z) = f(z)``: normalized expression, posterior-predictive draws and every
      per-cell decoder output are unchanged (to rounding);
    * the latent *space*: posterior means become ``A mu = ica.transform(mu) + A mean_``, the ICA sources up to the
      constant ``A @ ica.mean_`` (near 0 for centred latents), and posterior covariances ``A diag(sigma^2) A^T``;
    * for a linear decoder, the loadings become ``W A^{-1} = W @ ica.mixing_``: the copy's ``get_loadings()`` has
      one gene-loading column per ICA component.

    What it does not preserve, unless ``A`` is orthogonal (``ICARotation(whiten=False)``):

    * ``p(x)``: the copy keeps the N(0, I) prior on ``z'``, which on the original coordinates is
      ``N(0, (A^T A)^{-1})`` = ``N(0, Sigma)`` with ``Sigma`` the covariance of the posterior means. ``log p(x)``,
      the ELBO and the held-out predictive density therefore change (they are the original decoder's under that
      prior); with ``whiten=False`` they are exactly unchanged.
    * Euclidean distances and k-NN graphs of the latents, and the decoder's stretch ``B(z)`` (the Jacobian becomes
      ``J A^{-1}``).

    Parameters
    ----------
    model
        A trained ``CountVAE``.
    ica
        A fitted :class:`countvae.ica.ICARotation` of this model's latents, used as is; unfitted (or ``None``:
        ``ICARotation()``), it is fitted here to the posterior means of the model's training cells,
        ``ica.fit(model.get_latent_representation())``. It must keep all ``n_latent`` components.

    Returns
    -------
    CountVAE
        The re-expressed copy; the original is untouched.

    Examples
    --------
    >>> from countvae.ica import ICARotation
    >>> ica = ICARotation().fit(model.get_latent_representation())  # doctest: +SKIP
    >>> in_ica_axes = reparameterize_ica(model, ica)  # doctest: +SKIP

    """
    check_trained_model(model)
    if ica is None:
        ica = ICARotation()
    if not isinstance(ica, ICARotation):
        raise InvalidArgumentError(f"ica must be an ICARotation or None, got {type(ica).__name__}.")
    if not hasattr(ica, "components_"):
        ica.fit(model.get_latent_representation())
    if ica.components_.shape != (model.n_latent, model.n_latent):
        raise InvalidArgumentError(
            f"The ICA keeps {ica.components_.shape[0]} of {model.n_latent} dimensions (of {ica.mean_.shape[0]} "
            "inputs); re-expressing the model needs an invertible map of its latent space, so fit it to this "
            "model's latents with n_components=None."
        )
    return reparameterize(model, ica.components_, check=not ica.whiten)
