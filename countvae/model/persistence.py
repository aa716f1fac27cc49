"""Saving and loading fitted models: JSON settings, tensors read without unpickling code.

A model folder holds

* ``model.json``: format name and version, constructor settings, the data
  registry, gene names, training history, package versions and the SHA-256 of
  ``params.pt``;
* ``params.pt``: a dict of tensors written by ``torch.save`` and read with
  ``torch.load(weights_only=True)``, which refuses any pickled object that is
  not a tensor or a plain container (no code runs on load);
* ``adata.h5ad`` when saved with ``save_anndata=True``.

The folder is built under a temporary name and renamed into place.
"""

from __future__ import annotations

import json
import os
import pickle
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from countvae._io import atomic_directory, sha256_file, write_json_atomic
from countvae.errors import ModelFileError

FORMAT_NAME = "countvae-model"
FORMAT_VERSION = 1
SETTINGS_FILE = "model.json"
PARAMS_FILE = "params.pt"
ADATA_FILE = "adata.h5ad"


def package_versions() -> dict[str, str]:
    """Versions of the packages that determine a fit's numbers."""
    versions = {}
    for name in ("countvae", "torch", "pyro-ppl", "numpy", "scipy", "anndata", "scikit-learn"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def write_model_folder(
    dir_path: str | os.PathLike,
    settings: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    overwrite: bool = False,
    adata=None,
) -> Path:
    """Write a model folder atomically (see module docstring)."""
    with atomic_directory(dir_path, overwrite=overwrite) as tmp:
        params = tmp / PARAMS_FILE
        torch.save({k: v.detach().cpu() for k, v in tensors.items()}, params)
        record = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "versions": package_versions(),
            "checksums": {PARAMS_FILE: sha256_file(params)},
            **settings,
        }
        if adata is not None:
            adata.write_h5ad(tmp / ADATA_FILE)
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
    folder = Path(dir_path)
    if not folder.is_dir():
        raise ModelFileError(f"{folder} is not a model folder (it does not exist or is not a directory).")
    settings_path = folder / SETTINGS_FILE
    if not settings_path.is_file():
        raise ModelFileError(f"{settings_path} is missing; {folder} is not a complete countvae model folder.")
    try:
        settings = json.loads(settings_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFileError(f"{settings_path} is not valid JSON (truncated or corrupted): {exc}") from None
    if not isinstance(settings, dict) or settings.get("format") != FORMAT_NAME:
        raise ModelFileError(f"{settings_path} does not describe a countvae model (format {settings.get('format')!r}).")
    version = settings.get("format_version")
    if version != FORMAT_VERSION:
        raise ModelFileError(
            f"{settings_path} has format version {version!r}; this countvae reads version {FORMAT_VERSION}. "
            "Load it with the countvae release that wrote it."
        )
    checksums = settings.get("checksums", {})
    for name, expected in checksums.items():
        path = folder / name
        if not path.is_file():
            raise ModelFileError(f"{path} is missing from the model folder.")
        actual = sha256_file(path)
        if actual != expected:
            raise ModelFileError(
                f"{path} does not match the checksum recorded in {SETTINGS_FILE} (truncated, altered or "
                "replaced); refusing to load it."
            )
    params_path = folder / PARAMS_FILE
    if PARAMS_FILE not in checksums:
        raise ModelFileError(f"{settings_path} records no checksum for {PARAMS_FILE}.")
    try:
        tensors = torch.load(params_path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as exc:
        raise ModelFileError(f"{params_path} could not be read as tensors only, refusing to load it: {exc}") from None
    if not isinstance(tensors, dict) or not all(isinstance(v, torch.Tensor) for v in tensors.values()):
        raise ModelFileError(f"{params_path} does not hold a dict of tensors.")
    adata_path = folder / ADATA_FILE
    return settings, tensors, (adata_path if adata_path.is_file() else None)
