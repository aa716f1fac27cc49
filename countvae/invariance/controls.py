"""What :func:`countvae.invariance.verify` compares: the latent maps, and the same networks under other priors.

A map ``A`` leaves ``p(x)`` unchanged exactly when the law of ``A z`` under the prior is the prior itself
(:func:`prior_preserves`). The default maps are orthogonal (symmetries of N(0, I)); the controls are non-orthogonal
maps, and copies of the model with a prior whose symmetry group is smaller (:func:`with_prior`).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

from countvae._checks import check_choice, check_int
from countvae.errors import InvalidArgumentError
from countvae.invariance import transforms as T
from countvae.model import CountVAE, copy_model
from countvae.module.loadings import HorseshoeLoadings, LoadingsPrior, ProgramLoadings
from countvae.module.priors import LatentPrior
from countvae.module.vae import CountVAEModule

#: Scales of the diagonal-prior control (geometric from 0.5 to 2): distinct, so only sign flips preserve it.
CONTROL_SCALE_RANGE = (0.5, 2.0)

#: Degrees the default rotation keeps from every signed permutation (``random_rotation``'s ``degrees_from_axes``):
#: nearer, it nearly keeps the control priors (both keep sign flips), and an NB model's Laplace control went undetected
#: at 178 degrees (2 latent dimensions, where a third of the draws come this close; none of seeds 0-49 at 3-30).
ROTATION_DEGREES_FROM_AXES = 15.0

#: The map of each control prior's own symmetry group that :func:`verify` applies (it must not change p(x)).
OWN_GROUP = {"laplace": "signed permutation", "diagonal": "reflection"}


def default_transforms(n_latent: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The orthogonal maps :func:`countvae.invariance.verify` applies by default, by name.

    A Haar rotation (at least ``ROTATION_DEGREES_FROM_AXES``, 15 degrees, from every signed permutation), a sign flip
    of random axes, a non-identity permutation, a signed permutation and a Haar orthogonal matrix (either determinant);
    for ``n_latent = 1`` only the sign flip.
    """
    seeds = np.random.default_rng(check_int("seed", seed, 0)).integers(0, 2**31 - 1, size=5)
    maps = {}
    if n_latent >= 2:
        maps["rotation"] = T.random_rotation(n_latent, int(seeds[0]), ROTATION_DEGREES_FROM_AXES)
    maps["reflection"] = T.random_reflection(n_latent, int(seeds[1]))
    if n_latent >= 2:
        maps["permutation"] = T.random_permutation(n_latent, int(seeds[2]))
        maps["signed permutation"] = T.random_signed_permutation(n_latent, int(seeds[3]))
        maps["haar orthogonal"] = T.random_orthogonal(n_latent, int(seeds[4]))
    return maps


def control_transforms(n_latent: int) -> dict[str, np.ndarray]:
    """Non-orthogonal controls: axis scaling by 2 and 1/2 (alternating) and a unit shear (``L >= 2``)."""
    maps = {"scaling (control)": T.default_scaling(n_latent, 2.0)}
    if n_latent >= 2:
        maps["shear (control)"] = T.shear(n_latent, 1.0)
    return maps


def prior_preserves(prior: LatentPrior, A: np.ndarray, atol: float = 1e-8) -> bool:
    """Whether the law of ``A z`` equals the law of ``z`` under ``prior``.

    N(0, I): ``A A^T = I``. Laplace (independent, non-Gaussian): ``A`` is a signed
    permutation. N(0, D^2): ``A D^2 A^T = D^2`` (relative to the largest variance).
    """
    if prior.kind == "normal":
        return bool(np.abs(A @ A.T - np.eye(len(A))).max() <= atol)
    if prior.kind == "laplace":
        return T.is_signed_permutation(A, atol)
    variances = np.exp(2.0 * prior.log_scale.detach().cpu().double().numpy())
    D2 = np.diag(variances)
    return bool(np.abs(A @ D2 @ A.T - D2).max() <= atol * variances.max())


def loadings_preserve(loadings_prior: LoadingsPrior | None, A: np.ndarray, atol: float = 1e-8) -> bool | None:
    """Whether ``p(W A^-1) = p(W)`` for every ``W`` under the prior on the loadings (``None`` without one).

    ``z' = A z`` rewrites the loadings as ``W' = W A^-1``. Horseshoe (independent, identically distributed, even
    entries): ``A`` is a signed permutation. Gene programs (``W_gk ~ N(0, s_gk^2)``): ``A^-1 D_g A^-T = D_g`` for
    every gene ``g``, with ``D_g = diag(1 / s_g^2)``; for orthogonal ``A``, when ``A`` only flips signs and swaps
    columns with the same gene set.
    """
    if loadings_prior is None:
        return None
    if isinstance(loadings_prior, HorseshoeLoadings):
        return T.is_signed_permutation(A, atol)
    if isinstance(loadings_prior, ProgramLoadings):
        precision = 1.0 / loadings_prior.prior_scale.detach().cpu().double().numpy() ** 2
        A_inv = np.linalg.inv(A)
        mapped = np.einsum("ij,gj,kj->gik", A_inv, precision, A_inv)  # A^-1 D_g A^-T, per gene
        diagonal = np.einsum("gk,ik->gik", precision, np.eye(len(A)))
        return bool(np.abs(mapped - diagonal).max() <= atol * precision.max())
    raise InvalidArgumentError(f"No invariance rule for the loadings prior {type(loadings_prior).__name__}.")


def model_preserves(module: CountVAEModule, A: np.ndarray, atol: float = 1e-8) -> bool:
    """Whether the whole model keeps ``p(x)`` under ``A``: its prior on ``z`` and, if any, its prior on ``W``."""
    kept = loadings_preserve(module.loadings_prior, A, atol)
    return prior_preserves(module.prior, A, atol) and kept is not False


def with_prior(model: CountVAE, kind: Literal["normal", "laplace", "diagonal"], scales=None) -> CountVAE:
    """A copy of ``model`` with the same networks and another prior (a control for :func:`verify`).

    Parameters
    ----------
    model
        A trained model.
    kind
        ``"normal"``, ``"laplace"`` (unit variance) or ``"diagonal"``.
    scales
        Standard deviations of the diagonal prior; default geometric from 0.5 to 2.

    """
    check_choice("kind", kind, ("normal", "laplace", "diagonal"))
    L = model.n_latent
    prior = LatentPrior(kind, L)
    if kind == "diagonal":
        s = np.geomspace(*CONTROL_SCALE_RANGE, L) if scales is None else np.asarray(scales, dtype=np.float64)
        if s.shape != (L,) or not (np.isfinite(s).all() and (s > 0).all()):
            raise InvalidArgumentError(f"scales must be {L} positive numbers, got {scales!r}.")
        with torch.no_grad():
            prior.log_scale.copy_(torch.as_tensor(np.log(s)))
    return copy_model(model, prior=prior)


def prior_control_variants(model: CountVAE, seed: int) -> dict[str, tuple[CountVAE, dict[str, np.ndarray]]]:
    """The prior controls of :func:`verify`, by label: a copy with each prior the model does not have.

    Each comes with the default rotation (must change ``p(x)``) and the default map of the prior's own group (must not).
    """
    defaults = default_transforms(model.n_latent, seed)
    return {
        f"control: {kind} prior": (with_prior(model, kind), {"rotation": defaults["rotation"], own: defaults[own]})
        for kind, own in OWN_GROUP.items()
        if kind != model.settings.prior
    }
