"""Saving and loading fitted models: JSON settings, tensors read without unpickling code.

A model folder holds

* ``model.json``: format name and version, constructor settings, data registry, gene names, training history, package
  versions and the SHA-256 of ``params.pt``;
* ``params.pt``: a dict of tensors written by ``torch.save`` and read with ``torch.load(weights_only=True)``, which
  refuses any pickled object but tensors and plain containers (no code runs on load);
* ``adata.h5ad`` when saved with ``save_anndata=True``.

The folder is built under a temporary name and renamed into place. ``overwrite=True`` replaces only a folder holding
nothing but these files (:data:`MODEL_FOLDER`): scvi-tools' ``save(overwrite=True)`` leaves other files be, and a
replaced folder would lose them.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

import anndata as ad
import torch

from countvae._io import (
    FolderLayout,
    atomic_directory,
    load_checked_tensors,
    read_versioned_json,
    sha256_file,
    write_bytes_atomic,
    write_json_atomic,
)
from countvae._provenance import package_versions
from countvae.errors import InvalidArgumentError, ModelFileError

FORMAT_NAME = "countvae-model"
FORMAT_VERSION = 1
SETTINGS_FILE = "model.json"
PARAMS_FILE = "params.pt"
ADATA_FILE = "adata.h5ad"

#: What a model folder holds (every release has written these names).
MODEL_FOLDER = FolderLayout("a model folder", frozenset({SETTINGS_FILE, PARAMS_FILE, ADATA_FILE}))


def _folder(dir_path: object) -> Path:
    """``dir_path`` as a :class:`~pathlib.Path`, refused unless it is a path."""
    if not isinstance(dir_path, str | os.PathLike):
        raise InvalidArgumentError(
            f"dir_path must be the path of a model folder (a str or os.PathLike), got {type(dir_path).__name__}."
        )
    return Path(dir_path)


def write_model_folder(
    dir_path: str | os.PathLike,
    settings: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    overwrite: bool = False,
    adata=None,
) -> Path:
    """Write a model folder atomically (see module docstring)."""
    with atomic_directory(_folder(dir_path), overwrite=overwrite, layout=MODEL_FOLDER) as tmp:
        # Serialised in memory: torch's file writer reports a full disk as a RuntimeError, the byte writer as OSError.
        buffer = io.BytesIO()
        torch.save({k: v.detach().cpu() for k, v in tensors.items()}, buffer)
        write_bytes_atomic(tmp / PARAMS_FILE, buffer.getvalue())
        record = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "versions": package_versions(),
            "checksums": {PARAMS_FILE: hashlib.sha256(buffer.getvalue()).hexdigest()},
            **settings,
        }
        if adata is not None:
            # anndata's function, not the method, which would move a backed AnnData onto the copy it writes
            ad.io.write_h5ad(tmp / ADATA_FILE, adata)
            record["checksums"][ADATA_FILE] = sha256_file(tmp / ADATA_FILE)
        write_json_atomic(tmp / SETTINGS_FILE, record)
    return Path(dir_path)


def read_model_folder(dir_path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, torch.Tensor], Path | None]:
    """Read and check a model folder.

    Returns
    -------
    settings, tensors, adata_path
        The JSON record, the tensors, and the saved AnnData's path (or ``None``).

    Raises
    ------
    ModelFileError
        If the folder or a file is missing, truncated, altered (checksum), of
        another format or version, or holds anything but tensors.

    """
    folder = _folder(dir_path)
    if not folder.is_dir():
        raise ModelFileError(
            f"{folder} is not a model folder (it does not exist or is not a directory); pass the folder that "
            "model.save wrote."
        )
    settings = read_versioned_json(folder / SETTINGS_FILE, FORMAT_NAME, FORMAT_VERSION, "a countvae model folder")
    checksums = settings.get("checksums", {})
    tensors = load_checked_tensors(folder / PARAMS_FILE, checksums.get(PARAMS_FILE))
    for name, expected in checksums.items():
        if name != PARAMS_FILE and (not (folder / name).is_file() or sha256_file(folder / name) != expected):
            raise ModelFileError(
                f"{folder / name} is missing or does not match the checksum recorded in {SETTINGS_FILE} "
                "(truncated, altered or replaced); refusing to load it. Restore the folder from a copy, or train and "
                "save the model again."
            )
    adata_path = folder / ADATA_FILE
    return settings, tensors, (adata_path if adata_path.is_file() else None)
