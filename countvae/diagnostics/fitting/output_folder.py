"""The resumable output folder of :func:`countvae.diagnostics.fit_seeds`: lock, manifest check, storing, reading back.

Layout::

    out_dir/
      .lock              held while a run writes the folder (see :mod:`.run_lock`)
      .lock.owner.json   who holds it: pid, host, start time
      manifest.json      what determines the fits (see :mod:`.manifest`), written before the first fit
      fits/seed_<s>/     one complete fit per seed: fit.json and model/ (see :mod:`.seed_job`)

Each ``fits/seed_<s>/`` is built under a temporary name and renamed into place,
so a folder under its final name is always complete.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anndata as ad

from countvae._formatting import counted
from countvae._io import (
    atomic_directory,
    explained_write_errors,
    interrupted_writes,
    read_versioned_json,
    refuse_file_in_the_way,
    refuse_folder_at_file,
    refuse_non_folder,
    remove_interrupted_writes,
    temporary_prefix,
    write_bytes_atomic,
    write_json_atomic,
)
from countvae.data.registry import Registry
from countvae.diagnostics.fitting import scvi_storage
from countvae.diagnostics.fitting.broken_fits import FILES_KEY, broken, check_model_files, file_checksums
from countvae.diagnostics.fitting.fitted_model import CountVAEFit, FittedModel
from countvae.diagnostics.fitting.manifest import MANIFEST_FORMAT, MANIFEST_VERSION, comparable, describe_mismatch
from countvae.diagnostics.fitting.progress import SEED_STORED, SEED_WRITTEN, Progress, ProgressEvent, notify
from countvae.diagnostics.fitting.run_lock import LOCK_FILE, OWNER_FILE
from countvae.diagnostics.fitting.scvi_fit import SCVIFit
from countvae.diagnostics.fitting.seed_job import MODEL_FOLDER, FitOutcome
from countvae.errors import BrokenFitError, ModelFileError, OutputExistsError

logger = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
FITS_FOLDER = "fits"
FIT_RECORD = "fit.json"
#: How errors name a folder written by :func:`fit_seeds`.
WHAT = "a fit_seeds output folder"


def seed_folder(fits_dir: Path, seed: int) -> Path:
    """Where seed ``seed``'s fit is stored."""
    return fits_dir / f"seed_{seed}"


def stored_seeds(fits_dir: Path) -> list[int]:
    """The seeds whose fits are stored in ``fits_dir`` (a fit is moved into place whole), in increasing order."""
    if not fits_dir.is_dir():
        return []
    names = [p.name.removeprefix("seed_") for p in fits_dir.glob("seed_*") if p.is_dir()]
    # only the names seed_folder gives: a copy named seed_02 is not seed 2's folder
    return sorted(int(name) for name in names if name.isascii() and name.isdigit() and str(int(name)) == name)


def refuse_obstacles(root: Path, remedy: str, seeds: Iterable[int] = ()) -> None:
    """Refuse, before any work or removal, an entry that a run writing ``root`` would otherwise meet only later.

    A file or a symbolic link to a missing path at ``root``, at a folder above it or at its fits folder
    (:func:`~countvae._io.refuse_file_in_the_way`, naming the entry, then ``remedy``), and a folder at a file the run
    writes there (its manifest, lock and lock owner): :func:`prepare` and the lock met them only after ``overwrite`` had
    discarded the fits it replaces, and ``diagnose`` after its report. ``seeds``: those of a run that resumes (without
    ``overwrite``, which discards the fits folder whole); when ``root`` holds a manifest (fits without one are refused
    by :func:`refuse_unrecorded_fits`), such an entry where one of them is stored (``fits/seed_<s>``) is refused as
    well, which :func:`store` met only once that seed was fitted.
    """
    refuse_file_in_the_way(root, remedy)
    refuse_file_in_the_way(root / FITS_FOLDER, remedy)
    for name in (MANIFEST_FILE, LOCK_FILE, OWNER_FILE):
        refuse_folder_at_file(root / name)
    if (root / MANIFEST_FILE).is_file():
        for seed in seeds:
            where = f"the fit of seed {seed} is stored there: move or rename it, or {remedy}"
            refuse_file_in_the_way(seed_folder(root / FITS_FOLDER, seed), where)


def prepare(root: Path, manifest: dict[str, Any], overwrite: bool) -> None:
    """Create or check ``root/manifest.json``; with ``overwrite`` remove earlier fits first."""
    manifest_path = root / MANIFEST_FILE
    fits_dir = root / FITS_FOLDER
    if manifest_path.is_file() and overwrite:
        logger.warning("Discarding the fits in %s (overwrite=True).", root)
        discard_folder(fits_dir)
    elif manifest_path.is_file():
        check_manifest(root, manifest["settings"])
    else:
        if not overwrite:
            refuse_unrecorded_fits(root)
        elif stored_seeds(fits_dir):
            logger.warning("Discarding the fits in %s (overwrite=True).", root)
        discard_folder(fits_dir)  # fits/ without a manifest cannot be trusted to match this run
    with explained_write_errors(manifest_path, reused=True):
        write_json_atomic(manifest_path, manifest, overwrite=True)
    fits_dir.mkdir(exist_ok=True)
    for path in [*remove_interrupted_writes(root), *remove_interrupted_writes(fits_dir)]:
        logger.info("Removed %s, left by an interrupted run.", path)


def refuse_unrecorded_fits(root: Path) -> None:
    """Refuse a ``root`` without its manifest that holds what a run would otherwise discard unasked.

    Entries a run does not write (it is no fit_seeds output folder), or stored fits: the manifest is written before
    the first fit, so fits without it are left by a hand (a manifest deleted, or a folder at its path moved aside as
    refused), and can neither be checked against a run nor discarded silently.
    """
    manifest_path = root / MANIFEST_FILE
    if manifest_path.is_file() or not root.is_dir():
        return
    leftovers = {p.name for p in interrupted_writes(root)}  # a run killed while writing them: prepare removes them
    unexpected = [p.name for p in root.iterdir() if p.name not in {LOCK_FILE, OWNER_FILE, FITS_FOLDER, *leftovers}]
    if unexpected:
        manifest = f"{MANIFEST_FILE} is not a file" if os.path.lexists(manifest_path) else f"no {MANIFEST_FILE}"
        raise OutputExistsError(
            f"{root} already exists and is not a fit_seeds output folder (it holds {sorted(unexpected)[:5]}; "
            f"{manifest}); choose another out_dir (--out), or pass overwrite=True (--overwrite)."
        )
    n_stored = len(stored_seeds(root / FITS_FOLDER))
    if n_stored:
        raise OutputExistsError(
            f"{root / FITS_FOLDER} holds {counted(n_stored, 'stored fit')} but {root} has no {MANIFEST_FILE}, the "
            "record of the settings and data they were made with, so this run can neither check nor reuse them: "
            f"restore {root / MANIFEST_FILE}, choose another out_dir (--out), or pass overwrite=True (--overwrite on "
            "the command line) to discard them and fit afresh."
        )


def check_manifest(root: Path, settings: dict[str, Any]) -> None:
    """Refuse the fits stored in ``root`` unless its manifest records ``settings`` (a run's, as it would write them).

    Raises
    ------
    ModelFileError
        If ``root/manifest.json`` cannot be read.
    OutputExistsError
        If it records other settings or data (each difference named).

    """
    manifest_path = root / MANIFEST_FILE
    try:
        recorded = read_versioned_json(manifest_path, MANIFEST_FORMAT, MANIFEST_VERSION, WHAT)
    except ModelFileError as exc:
        raise ModelFileError(
            f"{exc} Without a readable record of the run its fits cannot be checked against this one: pass "
            f"overwrite=True (--overwrite on the command line) to start afresh, or restore {manifest_path}."
        ) from None
    differences = describe_mismatch(comparable(recorded.get("settings", {})), comparable(settings))
    if differences:
        raise OutputExistsError(
            f"{root} holds fits made with other settings or data, which this run cannot reuse:\n  - "
            + "\n  - ".join(differences)
            + "\nRerun with the recorded settings to resume, choose another out_dir (--out), or pass "
            "overwrite=True (--overwrite on the command line) to discard the earlier fits."
        )


def discard_folder(folder: Path) -> None:
    """Remove ``folder`` if it exists, moved aside first so that a run killed meanwhile leaves all of it or none.

    A file or link at ``folder`` is refused, never moved (:func:`~countvae._io.refuse_non_folder`).
    """
    refuse_non_folder(folder)
    if folder.exists():
        aside = Path(tempfile.mkdtemp(prefix=temporary_prefix(folder), suffix=".old", dir=folder.parent))
        aside.rmdir()
        os.replace(folder, aside)
        shutil.rmtree(aside, ignore_errors=True)


def store(fits_dir: Path, outcome: FitOutcome, family: str, progress: Progress | None = None) -> None:
    """Write one finished fit to ``fits/seed_<s>/`` atomically (temporary name, then rename).

    ``progress`` receives :data:`~.progress.SEED_WRITTEN` when the files are complete under the temporary name and
    :data:`~.progress.SEED_STORED` once the folder is in place.
    """
    final = seed_folder(fits_dir, outcome.seed)
    with explained_write_errors(final, reused=True), atomic_directory(final) as tmp:
        for relative, data in outcome.files.items():
            path = tmp / MODEL_FOLDER / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(path, data)
        record = {
            "seed": outcome.seed,
            "family": family,
            "seconds": outcome.seconds,
            "torch_threads": outcome.torch_threads,
            "host": outcome.host,
            "training": outcome.training,
            "peak_rss_mib": round(outcome.peak_rss_mib, 1),
            "freed_memory_kept": outcome.freed_memory_kept,
            FILES_KEY: file_checksums(outcome.files),
        }
        if outcome.node:
            record["ray_node"] = outcome.node
        write_json_atomic(tmp / FIT_RECORD, record)
        notify(progress, ProgressEvent(SEED_WRITTEN, seed=outcome.seed, seconds=outcome.seconds))
    notify(progress, ProgressEvent(SEED_STORED, seed=outcome.seed, seconds=outcome.seconds))


def read_fit_record(folder: Path, seed: int) -> dict[str, Any]:
    """The ``fit.json`` of a stored fit.

    Raises
    ------
    BrokenFitError
        If it is missing, empty or not valid JSON; the message names the remedy.

    """
    path = folder / FIT_RECORD
    if not path.is_file():
        raise broken(folder, seed, f"{path} is missing.")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise broken(folder, seed, f"{path} is not valid JSON (truncated or corrupted: {exc}).") from None
    if not isinstance(record, dict):
        raise broken(folder, seed, f"{path} does not hold a fit record.")
    return record


def check_stored_files(fits_dir: Path, seed: int, family: str) -> None:
    """Check seed ``seed``'s stored fit of a ``family`` model as :class:`FitLoader` does before loading the model.

    Its ``fit.json`` must describe it, and each file of its model folder match the checksum recorded there.

    Raises
    ------
    BrokenFitError
        Naming the folder, what is wrong and the remedy.

    """
    folder = seed_folder(fits_dir, seed)
    record = read_fit_record(folder, seed)
    if record.get("seed") != seed or record.get("family") != family:
        raise broken(
            folder,
            seed,
            f"{folder / FIT_RECORD} describes seed {record.get('seed')} of a {record.get('family')} model, "
            f"not seed {seed} of a {family} model (swapped or copied from elsewhere).",
        )
    check_model_files(folder / MODEL_FOLDER, record, seed, folder)


class FitLoader:
    """Reads stored fits back as :class:`FittedModel` adapters, on the fit cells.

    Parameters
    ----------
    model_cls
        The model class the fits were made with.
    family
        ``"countvae"``, ``"scvi"`` or ``"linearscvi"``.
    adata_fit
        The cells the fits were trained on, registered with ``CountVAE.setup_anndata``.
    registry
        That registration (scvi-tools models get a copy of the cells set up the same way).

    """

    def __init__(self, model_cls: type, family: str, adata_fit: ad.AnnData, registry: Registry):
        self.model_cls = model_cls
        self.family = family
        self.adata_fit = adata_fit
        self._adata_scvi = None if family == "countvae" else scvi_storage.setup_for_scvi(adata_fit, registry, model_cls)

    @property
    def adata_for_fits(self) -> ad.AnnData:
        """The fit cells as the models hold them (set up for scvi-tools when the models are scvi-tools')."""
        return self.adata_fit if self._adata_scvi is None else self._adata_scvi

    def load(self, fits_dir: Path, seed: int) -> FittedModel:
        """The stored fit of ``seed``."""
        folder = seed_folder(fits_dir, seed)
        check_stored_files(fits_dir, seed, self.family)
        try:
            if self.family == "countvae":
                model = self.model_cls.load(folder / MODEL_FOLDER, adata=self.adata_fit)
                return CountVAEFit(model, seed=seed)
            model = scvi_storage.load_scvi_fit(folder / MODEL_FOLDER, self.model_cls, self._adata_scvi)
        except BrokenFitError:
            raise
        except ModelFileError as exc:
            raise broken(folder, seed, str(exc)) from None
        return SCVIFit(model, seed=seed)
