"""The groups of latent maps ``z -> A z`` that can leave a model's ``p(x)`` unchanged, and how they combine.

Each part of a model that is not rotation-invariant (the prior on ``z``, a prior on the loadings ``W``) declares the
largest group of maps that leaves its density unchanged. The model keeps only the maps every part keeps: the
intersection of their groups, which, the groups being nested (largest first), is the smallest of them:

``"orthogonal"``
    every orthogonal ``A`` (the N(0, I) prior with free loadings);
``"signed permutation"``
    reorderings and sign flips of the axes (factorised non-Gaussian priors,
    exchangeable priors on the columns of ``W``);
``"sign flip"``
    sign flips of individual axes (a diagonal prior with distinct scales, named gene programs with distinct gene
    sets); axes every part treats alike (equal scales, identical gene sets) keep more, which the numerical check of
    :mod:`countvae.invariance` evaluates map by map;
``"none"``
    only the identity.
"""

from __future__ import annotations

from countvae.errors import InvalidArgumentError

#: The symmetry groups, largest first; each contains the ones after it.
SYMMETRY_GROUPS = ("orthogonal", "signed permutation", "sign flip", "none")


def intersect_symmetries(*groups: str) -> str:
    """The largest group contained in all of ``groups`` (the smallest of them, as they are nested).

    Raises
    ------
    InvalidArgumentError
        For a name not in :data:`SYMMETRY_GROUPS`.

    """
    unknown = [g for g in groups if g not in SYMMETRY_GROUPS]
    if unknown:
        raise InvalidArgumentError(f"Unknown symmetry groups {unknown}; known: {SYMMETRY_GROUPS}.")
    if not groups:
        return SYMMETRY_GROUPS[0]
    return max(groups, key=SYMMETRY_GROUPS.index)
