"""The held-out split shared by every seed: which cells the fits train on and which none of them sees."""

from __future__ import annotations

import anndata as ad
import numpy as np

from countvae.data.split import split_indices
from countvae.errors import InvalidArgumentError


def heldout_split(n_obs: int, heldout_fraction: float, split_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the fit cells and the held-out cells (sorted), as :func:`fit_seeds` splits them."""
    fit_idx, heldout_idx = split_indices(n_obs, 1.0 - heldout_fraction, split_seed)
    if len(heldout_idx) < 2 or len(fit_idx) < 2:
        raise InvalidArgumentError(
            f"heldout_fraction={heldout_fraction} of {n_obs} cells leaves {len(fit_idx)} cells to fit and "
            f"{len(heldout_idx)} held out; both need at least 2 cells."
        )
    return fit_idx, heldout_idx


def cells_at(adata: ad.AnnData, positions: np.ndarray) -> ad.AnnData:
    """The cells at ``positions`` as an AnnData in memory (read from disk when ``adata`` is backed)."""
    view = adata[positions]
    return view.to_memory() if adata.isbacked else view.copy()
