"""Random partitions of cells: train/validation during training, fit/held-out for diagnostics."""

from __future__ import annotations

import numpy as np

from countvae._checks import check_int, check_number


def first_part_size(n_obs: int, first_fraction: float) -> int:
    """The size of :func:`split_indices`'s first part: ``round(first_fraction * n_obs)``, within 1 to ``n_obs``."""
    check_int("n_obs", n_obs, 0)
    check_number("first_fraction", first_fraction, 0.0, 1.0, low_open=True)
    return min(n_obs, max(1, int(round(first_fraction * n_obs))))


def split_indices(n_obs: int, first_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split ``range(n_obs)`` at random into two sorted parts.

    Parameters
    ----------
    n_obs
        Number of cells.
    first_fraction
        Fraction of cells in the first part, in (0, 1]: ``round(first_fraction * n_obs)`` cells, at least one.
    seed
        Seed of the permutation.

    Returns
    -------
    first, second
        Sorted integer positions; ``second`` is empty when ``first_fraction == 1``.

    """
    seed = check_int("seed", seed, 0)
    n_first = first_part_size(n_obs, first_fraction)
    order = np.random.default_rng(seed).permutation(n_obs)
    return np.sort(order[:n_first]), np.sort(order[n_first:])
