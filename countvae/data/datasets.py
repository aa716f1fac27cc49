"""The real single-cell datasets used by tests, tutorials and benchmarks (never downloaded)."""

from __future__ import annotations

import os
from pathlib import Path

import anndata as ad

from countvae.errors import DataFileNotFoundError, InvalidArgumentError

#: Environment variable naming a folder that holds the dataset files.
DATA_DIR_ENV = "COUNTVAE_DATA_DIR"

#: Short name -> file name, as shipped in the project's shared data folder.
DATASETS: dict[str, str] = {
    "pbmc_small": "pbmc_small_seurat.h5ad",
    "kang2018": "kang2018_pbmc_ctrl_5donors.h5ad",
    "pbmc_3tech": "pbmc_3tech_savercat.h5ad",
}


def _candidate_dirs() -> list[Path]:
    dirs = []
    if os.environ.get(DATA_DIR_ENV):
        dirs.append(Path(os.environ[DATA_DIR_ENV]))
    # The repository sits beside shared/ (``<root>/main`` and ``<root>/shared/data``);
    # look above the working directory and above the installed package.
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for parent in [start, *start.parents]:
            dirs.append(parent / "shared" / "data")
    return list(dict.fromkeys(dirs))  # without repeats, in order


def find_dataset(name: str, path: str | os.PathLike | None = None) -> Path:
    """Locate a dataset file and return its path.

    Parameters
    ----------
    name
        One of ``"pbmc_small"``, ``"kang2018"``, ``"pbmc_3tech"``.
    path
        An explicit file path (or a folder holding the file); checked first.

    Raises
    ------
    DataFileNotFoundError
        If the file is in none of the places searched; the message lists them.

    """
    if name not in DATASETS:
        raise InvalidArgumentError(f"Unknown dataset {name!r}; choose one of {sorted(DATASETS)}.")
    filename = DATASETS[name]
    candidates = [d / filename for d in _candidate_dirs()]
    if path is not None:
        p = Path(path)
        candidates.insert(0, p / filename if p.is_dir() else p)
    for c in candidates:
        if c.is_file():
            return c
    shown = "\n  ".join(str(c) for c in candidates)  # every place searched, as the docstring says
    raise DataFileNotFoundError(
        f"Dataset {name!r} ({filename}) was not found. Put the file in a folder and set "
        f"{DATA_DIR_ENV}=<folder>, pass path=..., or place it in shared/data beside the repository. "
        f"Looked in:\n  {shown}"
    )


def load_dataset(name: str, path: str | os.PathLike | None = None, backed: bool = False) -> ad.AnnData:
    """Read one of the project's real count datasets.

    Parameters
    ----------
    name
        ``"pbmc_small"`` (80 x 230, Seurat's pbmc_small), ``"kang2018"`` (8,684 x 2,511 control PBMCs of 5 donors;
        ``obs['batch']`` = donor, ``obs['cell_type']``) or ``"pbmc_3tech"`` (2,000 x 8,513 PBMCs from three 10x
        chemistries; ``obs['batch']``, ``obs['cell_type']``).
    path
        Explicit location of the file, see :func:`find_dataset`.
    backed
        Open read-only on disk (``anndata.read_h5ad(..., backed="r")``).

    Returns
    -------
    AnnData
        Raw integer counts in ``X`` (CSR, float32).

    """
    return ad.read_h5ad(find_dataset(name, path), backed="r" if backed else None)
