"""Random partitions of cells: train/validation during training, fit/held-out for diagnostics."""

from __future__ import annotations

import numpy as np

from countvae.errors import InvalidArgumentError


def split_indices(n_obs: int, first_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split ``range(n_obs)`` at random into two sorted parts.

    Parameters
    ----------
    n_obs
        Number of cells.
    first_fraction
        Fraction of cells in the first part, in (0, 1]. The first part gets
        ``round(first_fraction * n_obs)`` cells (at least one).
    seed
        Seed of the permutation.

    Returns
    -------
    first, second
        Sorted integer positions; ``second`` is empty when ``first_fraction == 1``.

    """
    if not 0.0 < first_fraction <= 1.0:
        raise InvalidArgumentError(f"The fraction must lie in (0, 1], got {first_fraction}.")
    n_first = min(n_obs, max(1, int(round(first_fraction * n_obs))))
    order = np.random.default_rng(seed).permutation(n_obs)
    return np.sort(order[:n_first]), np.sort(order[n_first:])
