"""Damaged seed folders of a fit_seeds output folder: naming what is wrong, the remedy, and moving them aside.

A seed folder under its final name was complete when stored, but a disk error, a copy cut short or a hand edit can
damage it later. A :class:`~countvae.errors.BrokenFitError` names the seed folder and the file;
``fit_seeds(..., refit_broken=True)`` moves such folders to ``out_dir/broken/`` (nothing is deleted) and refits only
those seeds.
"""

from __future__ import annotations

import datetime
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from countvae._io import sha256_file
from countvae.errors import BrokenFitError

#: Folder of ``out_dir`` that damaged seed folders are moved to by ``refit_broken=True``.
BROKEN_FOLDER = "broken"
#: Key of ``fit.json`` that records the SHA-256 of each file of the seed's model folder.
FILES_KEY = "files_sha256"


def remedy(folders: Sequence[Path]) -> str:
    """The sentence that says how to repair damaged seed folders."""
    named = ", ".join(str(f) for f in folders)
    return (
        "Rerun with refit_broken=True (countvae diagnose --refit-broken) to move the damaged folder(s) to "
        f"{BROKEN_FOLDER}/ and refit only those seeds, or remove {named} and rerun."
    )


def without_refit_broken(exc: BrokenFitError) -> BrokenFitError:
    """``exc`` with the one remedy left where ``refit_broken`` cannot be set (``compare_models``, select, restrictions).

    Moving the folder aside keeps it, as ``refit_broken`` would; the rerun refits only the seeds whose folder is gone.
    """
    named, many = ", ".join(exc.folders), len(exc.folders) > 1
    message = str(exc).removesuffix(remedy([Path(f) for f in exc.folders]))
    return BrokenFitError(
        f"{message}Move {named} out of the run's folder (or remove {'them' if many else 'it'}) and rerun: only "
        f"{'those seeds are' if many else 'that seed is'} refitted.",
        exc.seed,
        exc.folder,
        exc.problem,
        exc.folders,
    )


def broken(folder: Path, seed: int, problem: str) -> BrokenFitError:
    """A :class:`BrokenFitError` for ``folder``: the problem, then the remedy."""
    message = f"Stored fit of seed {seed} in {folder} is damaged: {problem} {remedy([folder])}"
    return BrokenFitError(message, seed, str(folder), problem)


def all_broken(errors: Sequence[BrokenFitError]) -> BrokenFitError:
    """One error naming every damaged seed folder (the first one's seed and folder as attributes)."""
    if len(errors) == 1:
        return errors[0]
    lines = "; ".join(f"seed {e.seed} ({e.folder}): {e.problem}" for e in errors)
    message = f"{len(errors)} stored fits are damaged: {lines} {remedy([Path(e.folder) for e in errors])}"
    return BrokenFitError(message, errors[0].seed, errors[0].folder, lines, [e.folder for e in errors])


def file_checksums(files: dict[str, bytes]) -> dict[str, str]:
    """SHA-256 of each file's bytes, by its path relative to the model folder."""
    return {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())}


def check_model_files(model_folder: Path, record: dict[str, Any], seed: int, folder: Path) -> None:
    """Check each file of ``model_folder`` against the checksums in ``fit.json`` (older records have none).

    This catches what the model's own checks cannot: a model folder swapped in whole from another seed or another run is
    self-consistent, but not the files stored for this seed.
    """
    recorded = record.get(FILES_KEY)
    if recorded is None:
        return
    if not isinstance(recorded, dict):
        raise broken(folder, seed, f"its fit.json holds no valid {FILES_KEY!r} record.")
    for name, expected in sorted(recorded.items()):
        path = model_folder / name
        if not path.is_file():
            raise broken(folder, seed, f"{path} is missing.")
        if path.stat().st_size == 0:
            raise broken(folder, seed, f"{path} is empty (zero bytes).")
        if sha256_file(path) != expected:
            raise broken(
                folder,
                seed,
                f"{path} does not match the checksum recorded in fit.json (truncated, altered or swapped).",
            )


def set_aside(root: Path, folder: Path) -> Path:
    """Move a damaged seed folder to ``root/broken/<name>.<UTC time>`` (a rename: nothing is copied or deleted)."""
    target_dir = root / BROKEN_FOLDER
    target_dir.mkdir(exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    target = target_dir / f"{folder.name}.{stamp}"
    os.replace(folder, target)
    return target
