"""The held-out split shared by every seed: which cells the fits train on and which none of them sees."""

from __future__ import annotations

import anndata as ad
import numpy as np

from countvae._checks import check_int, check_number
from countvae.data.backed import cells_in_memory
from countvae.data.file_cells import FileCells
from countvae.data.registry import Registry
from countvae.data.split import split_indices
from countvae.errors import InvalidArgumentError

#: Share of the cells :func:`default_heldout_cells` holds out on a large file.
DEFAULT_HELDOUT_SHARE = 0.1
#: Held-out cells the default keeps on a small file, where 10% would leave report rows undecided, as long as
#: they are at most :data:`MAX_DEFAULT_HELDOUT_SHARE` of the cells: on a 1,400-cell Kang file, 300 held out
#: (against 140) left 13.6% of the verdicts undetermined instead of 21.8%, with none contradicted by the same fits
#: on 4,000 independent cells in either (benchmarks/RESULTS.md, section calibration-regimes).
SMALL_FILE_HELDOUT_CELLS = 300
#: The largest share of the cells the default takes from the fits to reach :data:`SMALL_FILE_HELDOUT_CELLS`.
MAX_DEFAULT_HELDOUT_SHARE = 0.25


def default_heldout_cells(n_obs: int) -> int:
    """Cells ``diagnose`` holds out by default: 10% of ``n_obs``, raised towards 300 on small files (at most 25%).

    3,000 cells and more: 10% (300 at 3,000); 1,200 to 3,000: 300; fewer: a quarter of them.
    """
    return max(
        round(DEFAULT_HELDOUT_SHARE * n_obs), min(SMALL_FILE_HELDOUT_CELLS, int(MAX_DEFAULT_HELDOUT_SHARE * n_obs))
    )


def resolve_heldout_fraction(heldout_fraction: float | None, n_obs: int) -> float:
    """``heldout_fraction``, or for ``None`` the share :func:`default_heldout_cells` gives ``n_obs`` cells."""
    if heldout_fraction is not None:
        return heldout_fraction
    return default_heldout_cells(n_obs) / n_obs if n_obs else DEFAULT_HELDOUT_SHARE


def heldout_split(n_obs: int, heldout_fraction: float, split_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the fit cells and the held-out cells (sorted), as :func:`fit_seeds` splits them."""
    check_number("heldout_fraction", heldout_fraction, 0.0, 1.0, low_open=True, high_open=True)
    split_seed = check_int("split_seed", split_seed, 0)  # split_indices would name it seed
    fit_idx, heldout_idx = split_indices(n_obs, 1.0 - heldout_fraction, split_seed)
    if len(heldout_idx) < 2 or len(fit_idx) < 2:
        raise InvalidArgumentError(
            f"heldout_fraction={heldout_fraction} of {n_obs} cells leaves {len(fit_idx)} cells to fit and "
            f"{len(heldout_idx)} held out; both need at least 2 cells."
        )
    return fit_idx, heldout_idx


def cells_at(adata: ad.AnnData, positions: np.ndarray) -> ad.AnnData:
    """The cells at ``positions`` as an AnnData in memory (read from disk when ``adata`` is backed)."""
    return cells_in_memory(adata, positions)


def fit_cells(
    adata: ad.AnnData, positions: np.ndarray, registry: Registry, stream: bool
) -> tuple[ad.AnnData, ad.AnnData | FileCells]:
    """The fit cells for this process, and what each fit's worker receives to read them.

    With ``stream`` (a countvae model on a backed AnnData) the cells stay in the file: this process gets a backed view,
    workers a :class:`~countvae.data.file_cells.FileCells` naming the file and positions, so each worker opens the file
    and reads minibatches from disk (nothing is copied into worker processes or Ray's object store). Otherwise the
    cells are an AnnData in memory, sent to the workers.
    """
    if stream:
        cells = FileCells.of(adata, positions, registry)
        return cells.open(), cells
    in_memory = cells_at(adata, positions)
    return in_memory, in_memory
