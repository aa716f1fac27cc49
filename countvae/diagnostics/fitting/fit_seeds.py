"""Fit one model from several seeds on a shared held-out split, saving each fit as it finishes.

:func:`fit_seeds` is the first step of the multi-seed diagnostics. All seeds train on the same cells (``adata_fit``); no
fit sees the held-out cells (``adata_heldout``), so predictive comparisons between seeds are paired on the same cells.

With ``out_dir`` the run is resumable:

* ``out_dir/manifest.json`` records, before the first fit starts, what determines the fits (model class and
  arguments, training arguments, held-out split, torch threads, a SHA-256 of the data, package versions);
* each fit is stored in ``out_dir/fits/seed_<s>/`` when it finishes, atomically (:mod:`.output_folder`);
* a rerun with the same settings loads the completed seeds and fits only the missing ones, bit-identical to an
  uninterrupted run: every fit (new or reused) is read back from its folder, and depends only on its seed, the data,
  the settings and the number of torch threads;
* a rerun with other settings or data is refused (``overwrite=True`` starts afresh), and so are stored fits whose
  manifest is missing (restore it, or start afresh).

A lock file (``out_dir/.lock``, its holder named in ``.lock.owner.json``) keeps two runs from writing one folder: the
second stops at once, naming the first (:mod:`.run_lock`). Faults stop a run with an error naming the remedy, losing
nothing stored:

* a seed folder damaged after storing (a file cut short, emptied or swapped) is named with its file;
  ``refit_broken=True`` moves it to ``out_dir/broken/`` and refits that seed alone (:mod:`.broken_fits`);
* a worker killed mid-fit (out of memory, SIGKILL) raises :class:`~countvae.errors.WorkerLostError`; the rerun fits
  the seeds not stored;
* a full or read-only disk raises :class:`~countvae.errors.OutputWriteError` once the temporary files are removed.

``progress`` reports each step (see :mod:`.progress`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import logging
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anndata as ad
import numpy as np
from tqdm.auto import tqdm

from countvae._checks import check_bool, check_choice, check_int, check_number
from countvae._formatting import counted
from countvae._io import read_versioned_json
from countvae._provenance import package_versions
from countvae._settings import takes_settings, unknown_setting
from countvae.data.file_cells import FileCells
from countvae.data.gene_selection import get_gene_selection
from countvae.data.registry import Registry, get_count_matrix, get_registry, get_var_names
from countvae.data.validation import column_totals
from countvae.diagnostics.fitting import scvi_storage
from countvae.diagnostics.fitting.backends import BACKENDS, DEFAULT_TORCH_THREADS, run_tasks
from countvae.diagnostics.fitting.broken_fits import all_broken, set_aside
from countvae.diagnostics.fitting.fit_seeds_settings import FitSeedsSettings
from countvae.diagnostics.fitting.fitted_model import FittedModel
from countvae.diagnostics.fitting.heldout import cells_at, fit_cells, heldout_split
from countvae.diagnostics.fitting.manifest import (
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    data_fingerprint,
    describe_mismatch,
    to_json_value,
)
from countvae.diagnostics.fitting.output_folder import (
    FITS_FOLDER,
    MANIFEST_FILE,
    WHAT,
    FitLoader,
    check_manifest,
    check_stored_files,
    prepare,
    read_fit_record,
    refuse_obstacles,
    refuse_unrecorded_fits,
    seed_folder,
    store,
    stored_seeds,
)
from countvae.diagnostics.fitting.parallelism import (
    AUTO,
    Parallelism,
    backed_remedy_off,
    check_n_jobs,
    pickling_error,
    plan_parallelism,
)
from countvae.diagnostics.fitting.progress import SEED_REUSED, ProgressEvent, notify
from countvae.diagnostics.fitting.run_lock import locked
from countvae.diagnostics.fitting.scratch import remove_orphaned
from countvae.diagnostics.fitting.seed_fits import SeedFits
from countvae.diagnostics.fitting.seed_job import FitOutcome, FitTask
from countvae.errors import (
    BrokenFitError,
    InvalidArgumentError,
    InvalidDataError,
    ModelFileError,
    SetupError,
    WorkerLostError,
)
from countvae.model import CountVAE, TrainingPlan

logger = logging.getLogger(__name__)

__all__ = ["FitSeedsSettings", "fit_models", "fit_seeds", "heldout_split", "load_seed_fits"]

_MAX_SEED = 2**32 - 1
#: Seconds the scratch folders of workers lost or cancelled mid-fit are waited for (their processes ending).
LOST_WORKER_WAIT_S = 10.0
#: Classes that ``load_seed_fits`` may import by the name recorded in a manifest (nothing else is imported).
_LOADABLE_CLASSES = {
    "countvae.CountVAE": ("countvae", "CountVAE"),
    "scvi.model.SCVI": ("scvi.model", "SCVI"),
    "scvi.model.LinearSCVI": ("scvi.model", "LinearSCVI"),
}


# ----- input checks ----------------------------------------------------------------------------
def check_seeds(seeds: Iterable[int]) -> list[int]:
    """``seeds`` as a list of at least two distinct integers in ``[0, 2**32 - 1]``, refused clearly otherwise."""
    if isinstance(seeds, str | bytes) or not isinstance(seeds, Iterable):
        raise InvalidArgumentError(f"seeds must be a sequence of integers such as range(5), got {seeds!r}.")
    values = list(seeds)
    for s in values:
        if isinstance(s, bool) or not isinstance(s, int | np.integer):
            raise InvalidArgumentError(f"Every seed must be an integer; got {s!r} ({type(s).__name__}) in {values}.")
        if not 0 <= int(s) <= _MAX_SEED:
            raise InvalidArgumentError(f"Seeds must lie in [0, 2**32 - 1]; got {s}.")
    values = [int(s) for s in values]
    if len(values) < 2:
        raise InvalidArgumentError(
            f"seeds must hold at least two seeds to compare fits, got {values}; for example seeds=range(5)."
        )
    duplicated = sorted({s for s in values if values.count(s) > 1})
    if duplicated:
        raise InvalidArgumentError(
            f"Seeds {duplicated} are given more than once; identical seeds give identical fits, so each seed "
            "must be distinct."
        )
    return values


def _check_registered(adata: Any) -> Registry:
    if not isinstance(adata, ad.AnnData):
        raise InvalidArgumentError(f"fit_seeds expects an AnnData, got {type(adata).__name__}.")
    registry = get_registry(adata)
    if registry is None:
        raise SetupError(
            "This AnnData is not set up; call countvae.CountVAE.setup_anndata(adata, layer=..., batch_key=...) "
            "first (also for scvi-tools models: fit_seeds sets them up with the same layer and batch key)."
        )
    return registry


def _check_progress(progress: Any, parallel: bool) -> None:
    if progress is None:
        return
    if not callable(progress):
        raise InvalidArgumentError(f"progress must be a callable taking a ProgressEvent, or None; got {progress!r}.")
    error = pickling_error(progress) if parallel else None
    if error is not None:
        raise InvalidArgumentError(
            f"progress cannot be copied into worker processes ({type(error).__name__}: {error}); with n_jobs > 1, "
            "n_jobs=-1 or backend='ray' it must be picklable (see countvae.diagnostics.fitting.progress), or "
            "fit with n_jobs=1 (n_jobs='auto', the default, falls back to it)."
        )


def _check_kwargs(name: str, kwargs: dict[str, Any] | None, forbidden: dict[str, str]) -> dict[str, Any]:
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise InvalidArgumentError(f"{name} must be a dict of keyword arguments, got {kwargs!r}.")
    for key, why in forbidden.items():
        if key in kwargs:
            raise InvalidArgumentError(f"{name} must not contain {key!r}: {why}")
    return dict(kwargs)


def _model_family(model_cls: Any) -> str:
    """``"countvae"``, ``"scvi"`` or ``"linearscvi"``."""
    if isinstance(model_cls, type) and issubclass(model_cls, CountVAE):
        return "countvae"
    if scvi_storage.is_scvi_class(model_cls):
        return scvi_storage.scvi_kind(model_cls)
    raise InvalidArgumentError(
        f"model_cls must be countvae.CountVAE, scvi.model.SCVI or scvi.model.LinearSCVI, got {model_cls!r}."
    )


# ----- data ---
def genes_without_counts(adata: ad.AnnData, registry: Registry) -> tuple[int, list[str]]:
    """How many genes have no count in ``adata``'s cells, and the names of the first five."""
    empty = np.flatnonzero(column_totals(get_count_matrix(adata, registry)) == 0)
    return int(empty.size), list(get_var_names(adata, registry)[empty[:5]])


def check_fit_genes(adata_fit: ad.AnnData, registry: Registry) -> None:
    """Every gene needs a count among the fit cells (a model initialises each gene's mean from them)."""
    n_empty, names = genes_without_counts(adata_fit, registry)
    if n_empty:
        raise InvalidDataError(
            f"{n_empty} genes have no counts in the cells left for fitting after the held-out split (e.g. {names}): "
            "each is detected only in held-out cells. Remove rarely detected genes first: a gene seen in n cells has "
            "them all held out with chance (held-out share)**n, e.g. 0.25**3 = 1.6% for min_cells=3, too likely among "
            "2,000 genes, and 1e-6 for scanpy.pp.filter_genes(adata, min_cells=10); or hold out fewer cells."
        )


def check_fit_batches(adata_fit: ad.AnnData, registry: Registry, adata: ad.AnnData) -> None:
    """Every batch of ``adata``'s cells needs a fit cell (a model learns each batch's effect from its fit cells only).

    ``setup_anndata`` on the whole file registers every batch, so a batch whose cells were all held out would be
    scored with an effect no fit cell trained. Registered batches that no cell of ``adata`` has (a subset made after
    registering) are no concern.
    """
    if registry.batch_key is None:
        return
    present = set(adata_fit.obs[registry.batch_key].astype(str))
    absent = sorted(set(adata.obs[registry.batch_key].astype(str)) - present)
    if absent:
        raise InvalidDataError(
            f"Batch categories {absent[:10]} of adata.obs[{registry.batch_key!r}] have no cell left for fitting after "
            "the held-out split: a model learns a batch's effect from its fit cells, so those held-out cells would be "
            "scored with an effect nothing trained. Merge such small batches into another, remove their cells, or "
            "hold out fewer cells or use another split seed."
        )


def _check_countvae_settings(
    adata_fit: ad.AnnData, model_cls: type, model_kwargs: dict[str, Any], train_kwargs: dict[str, Any]
) -> None:
    """Refuse, before anything is written, the settings each fit would refuse (it builds the model as a fit does).

    Raised only inside the first fit, they would leave a manifest behind, and the corrected rerun would be refused
    as one with other settings.
    """
    model_cls(adata_fit, **model_kwargs)
    known = [f.name for f in dataclasses.fields(TrainingPlan) if f.name != "seed"]
    for name in train_kwargs:
        if name not in (*known, "plan"):
            raise unknown_setting(name, known, "train_kwargs")
    values = {k: v for k, v in train_kwargs.items() if k != "plan"}
    plan = train_kwargs.get("plan")
    if isinstance(plan, TrainingPlan):
        dataclasses.replace(plan, **values)
    elif plan is None:
        TrainingPlan(**values)


# ----- public API ------------------------------------------------------------------------------
@takes_settings(FitSeedsSettings, positional=11)
def fit_seeds(adata: ad.AnnData, *, settings: FitSeedsSettings) -> SeedFits:
    """Fit the same model from several seeds on one shared train/held-out split.

    Parameters
    ----------
    adata
        Cells x genes, registered with :meth:`countvae.CountVAE.setup_anndata`, also for scvi-tools models (each fit's
        cells are then set up with ``model_cls.setup_anndata`` with the same layer, batch and labels keys, so both
        kinds see the same counts and covariates). The settings record genes chosen by
        :func:`countvae.data.select_top_genes` (``gene_selection``).
    {settings}
    settings
        All of the above as one :class:`FitSeedsSettings`; keywords given with it replace its fields.

    Returns
    -------
    SeedFits
        The fits in ``seeds`` order, with ``adata_fit``, ``adata_heldout`` and the recorded settings.

    Raises
    ------
    InvalidArgumentError
        For fewer than two seeds, repeated or non-integer seeds, a held-out
        fraction outside (0, 1), an unknown backend or model class.
    SetupError
        If ``adata`` was not registered with ``CountVAE.setup_anndata``.
    InvalidDataError
        If a gene has no counts among the fit cells.
    OutputExistsError
        If ``out_dir`` holds fits of other settings or data (or is not a fit_seeds folder) and ``overwrite`` is False.
    OutputLockedError
        If another running fit_seeds writes ``out_dir`` (the message names its pid, host and start time).
    BrokenFitError
        If a stored seed folder is damaged and ``refit_broken`` is False.
    OutputWriteError
        If a file cannot be written (disk full, read-only); nothing is left half-written and a rerun resumes.
    WorkerLostError
        If a worker process died mid-fit; the finished seeds are stored and a rerun fits the rest.

    Examples
    --------
    >>> import countvae as cv
    >>> from countvae.diagnostics import fit_seeds
    >>> adata = cv.data.simulate(n_cells=300, n_genes=40, n_latent=2, seed=0)
    >>> cv.CountVAE.setup_anndata(adata)
    >>> fits = fit_seeds(
    ...     adata, seeds=[0, 1], model_kwargs={"n_latent": 2}, train_kwargs={"max_epochs": 5}, progress_bar=False
    ... )
    >>> fits.seeds, fits.adata_heldout.n_obs
    ([0, 1], 30)

    """
    return fit_models(adata, [settings])[0]


@dataclasses.dataclass
class _Run:
    """One model's seeds, checked and split, with what storing and loading its fits needs."""

    settings: FitSeedsSettings
    adata_fit: ad.AnnData
    fit_data: ad.AnnData | FileCells
    adata_heldout: ad.AnnData
    recorded: dict[str, Any]
    tasks: list[FitTask]
    loader: FitLoader
    manifest: dict[str, Any]
    fits: dict[int, FittedModel] = dataclasses.field(default_factory=dict)
    seconds: dict[int, float] = dataclasses.field(default_factory=dict)
    records: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    reused: list[int] = dataclasses.field(default_factory=list)


def fit_models(
    adata: ad.AnnData, settings: list[FitSeedsSettings], fingerprint: dict[str, Any] | None = None
) -> list[SeedFits]:
    """:func:`fit_seeds` for several models on one split, their seeds fitted in one pool of workers.

    Each model is stored and resumed in its own ``out_dir`` as by :func:`fit_seeds`; all their seeds share the
    workers, so no core waits at the end of one model's seeds for the next model to start (3 seeds of each of 5 models
    on 8 cores: 2 rounds of fits instead of 5). The models must share the held-out split, model class, backend,
    ``n_jobs`` and torch threads. ``fingerprint`` is the checksum of ``adata`` that :func:`check_stored_fits` returned,
    not computed again (``None``: computed here, once for all the models).

    Raises
    ------
    InvalidArgumentError
        If the models differ in any of the settings they must share, or no settings are given.
    """
    if not settings:
        raise InvalidArgumentError("fit_models needs the settings of at least one model.")
    checked = [_checked_settings(adata, s) for s in settings]
    for s, _, _ in checked:
        if s.out_dir is not None:  # before anything is discarded, and before _check_shared resolves the folders
            refuse_obstacles(Path(s.out_dir), "choose another out_dir (--out)", () if s.overwrite else s.seeds)
    _check_shared([s for s, _, _ in checked])  # before any model's cells are copied and hashed
    fingerprint = data_fingerprint(adata, checked[0][1]) if fingerprint is None else fingerprint
    runs = [_prepared_run(adata, *c, group, fingerprint) for group, c in enumerate(checked)]
    parallelism = _fit_or_reuse(runs)
    return [_seed_fits(run, parallelism) for run in runs]


def check_stored_fits(adata: ad.AnnData, settings: list[FitSeedsSettings]) -> dict[str, Any] | None:
    """Refuse now the fits stored in an ``out_dir`` of ``settings`` that :func:`fit_models` would refuse later.

    For callers that do work before fitting (``diagnose`` and ``select`` time a warm-up and print their block): a
    folder whose manifest records other settings or data, or cannot be read, is refused before that work, with the
    message :func:`fit_models` gives as it starts; so is an entry other than a folder where a resumed seed's fit is
    stored (:func:`refuse_obstacles`), which it met only once that seed was fitted, a folder without a manifest that
    holds fits or other entries, and (without ``refit_broken``) a resumed seed whose stored files are damaged
    (:func:`check_stored_files`, as the fits check them before loading). The checksum of ``adata`` is
    computed only when a folder holds a manifest to compare with (and ``overwrite`` is off), and returned for
    :func:`fit_models`'s ``fingerprint``; ``None`` otherwise.
    """
    fingerprint = None
    for s, registry, family in (_checked_settings(adata, s) for s in settings):
        if s.out_dir is None:
            continue
        refuse_obstacles(Path(s.out_dir), "choose another out_dir (--out)", () if s.overwrite else s.seeds)
        if s.overwrite:
            continue
        refuse_unrecorded_fits(Path(s.out_dir))
        if not (Path(s.out_dir) / MANIFEST_FILE).is_file():
            continue
        fingerprint = data_fingerprint(adata, registry) if fingerprint is None else fingerprint
        fit_idx, heldout_idx = heldout_split(adata.n_obs, s.heldout_fraction, s.split_seed)
        model_record = to_json_value(s.model_kwargs, "model_kwargs")
        recorded = _recorded_settings(adata, registry, s, family, model_record, fit_idx, heldout_idx, fingerprint)
        check_manifest(Path(s.out_dir), recorded)
        if not s.refit_broken:  # with it the fits move a damaged seed aside and refit it
            _refuse_damaged_seeds(Path(s.out_dir) / FITS_FOLDER, s.seeds, family)
    return fingerprint


def _refuse_damaged_seeds(fits_dir: Path, seeds: Iterable[int], family: str) -> None:
    """Refuse the stored fits of ``seeds`` whose files are damaged, all named at once as the fits name them."""
    damaged = []
    for seed in sorted(set(seeds) & set(stored_seeds(fits_dir))):
        try:
            check_stored_files(fits_dir, seed, family)
        except BrokenFitError as exc:
            damaged.append(exc)
    if damaged:
        raise all_broken(damaged)


_SHARED = ("heldout_fraction", "split_seed", "model_cls", "backend", "n_jobs", "torch_threads", "progress_bar")


def _check_shared(settings: list[FitSeedsSettings]) -> None:
    first = settings[0]
    for other in settings[1:]:
        differ = [name for name in _SHARED if getattr(other, name) != getattr(first, name)]
        if differ:
            raise InvalidArgumentError(
                f"Models fitted in one pool must share {', '.join(_SHARED)}; these differ: {differ}."
            )
    folders = [Path(s.out_dir).resolve() for s in settings if s.out_dir is not None]
    if len(set(folders)) != len(folders):
        raise InvalidArgumentError("Models fitted in one pool need an out_dir each; two of them share one.")


def _prepared_run(
    adata: ad.AnnData, s: FitSeedsSettings, registry: Registry, family: str, group: int, fingerprint: dict[str, Any]
) -> _Run:
    fit_idx, heldout_idx = heldout_split(adata.n_obs, s.heldout_fraction, s.split_seed)
    stream = adata.isbacked and family == "countvae"
    adata_fit, fit_data = fit_cells(adata, fit_idx, registry, stream)
    check_fit_genes(adata_fit, registry)
    check_fit_batches(adata_fit, registry, adata)
    model_record = to_json_value(s.model_kwargs, "model_kwargs")
    if family == "countvae":
        _check_countvae_settings(adata_fit, s.model_cls, s.model_kwargs, s.train_kwargs)
    recorded = _recorded_settings(adata, registry, s, family, model_record, fit_idx, heldout_idx, fingerprint)
    tasks = [
        FitTask(
            seed=seed,
            model_cls=s.model_cls,
            model_kwargs=s.model_kwargs,
            train_kwargs=s.train_kwargs,
            model_kwargs_record=model_record,
            torch_threads=s.torch_threads,
            progress=s.progress,
            group=group,
        )
        for seed in s.seeds
    ]
    return _Run(
        settings=s,
        adata_fit=adata_fit,
        fit_data=fit_data,
        adata_heldout=cells_at(adata, heldout_idx),
        recorded=recorded,
        tasks=tasks,
        loader=FitLoader(s.model_cls, family, adata_fit, registry),
        manifest={
            "format": MANIFEST_FORMAT,
            "format_version": MANIFEST_VERSION,
            "settings": recorded,
            "seeds": s.seeds,
        },
    )


def _seed_fits(run: _Run, parallelism: Parallelism) -> SeedFits:
    s, records = run.settings, run.records
    return SeedFits(
        fits=[run.fits[seed] for seed in s.seeds],
        adata_fit=run.loader.adata_for_fits,
        adata_heldout=run.adata_heldout,
        settings={
            **run.recorded,
            "seeds": s.seeds,
            "backend": s.backend,
            "n_jobs": parallelism.n_jobs,
            "parallelism": parallelism.describe(),
            "training": [{"seed": seed, **records[seed].get("training", {})} for seed in s.seeds],
        },
        seconds={seed: run.seconds[seed] for seed in s.seeds},  # in seed order, not the order the fits finished in
        out_dir=None if s.out_dir is None else Path(s.out_dir),
        reused_seeds=run.reused,
        records={seed: records[seed] for seed in s.seeds},
    )


def _checked_settings(adata: Any, s: FitSeedsSettings) -> tuple[FitSeedsSettings, Registry, str]:
    """``s`` checked and normalised (seeds a list, kwargs dicts, threads a number), the registry and model family."""
    seeds = check_seeds(s.seeds)
    registry = _check_registered(adata)
    heldout_fraction = check_number("heldout_fraction", s.heldout_fraction, 0.0, 1.0, low_open=True, high_open=True)
    split_seed = check_int("split_seed", s.split_seed, minimum=0)
    n_jobs = check_n_jobs(s.n_jobs)
    check_choice("backend", s.backend, BACKENDS)
    _check_progress(s.progress, parallel=s.backend == "ray" or n_jobs not in (1, AUTO))
    family = _model_family(s.model_cls)
    checked = dataclasses.replace(
        s,
        seeds=seeds,
        heldout_fraction=heldout_fraction,
        split_seed=split_seed,
        n_jobs=n_jobs,
        model_kwargs=_check_kwargs("model_kwargs", s.model_kwargs, {"adata": "fit_seeds passes the fit cells itself."}),
        train_kwargs=_check_kwargs(
            "train_kwargs", s.train_kwargs, {"seed": "fit_seeds sets each fit's seed from `seeds`."}
        ),
        torch_threads=(
            DEFAULT_TORCH_THREADS if s.torch_threads is None else check_int("torch_threads", s.torch_threads, minimum=1)
        ),
        refit_broken=check_bool("refit_broken", s.refit_broken),
        overwrite=check_bool("overwrite", s.overwrite),
    )
    return checked, registry, family


def _recorded_settings(
    adata: ad.AnnData,
    registry: Registry,
    s: FitSeedsSettings,
    family: str,
    model_record: Any,
    fit_idx: np.ndarray,
    heldout_idx: np.ndarray,
    fingerprint: dict[str, Any],
) -> dict[str, Any]:
    """What determines the fits, as written to the manifest (a rerun with other values is refused).

    ``fingerprint`` is :func:`data_fingerprint` of ``adata``.
    """
    recorded = {
        "model_class": scvi_storage.class_path(s.model_cls),
        "model_family": family,
        "model_kwargs": model_record,
        "train_kwargs": to_json_value(s.train_kwargs, "train_kwargs"),
        "heldout_fraction": s.heldout_fraction,
        "split_seed": s.split_seed,
        "registry": {key: getattr(registry, key) for key in ("layer", "use_raw", "batch_key", "labels_key")},
        "data": fingerprint,
        "split": {
            "n_fit": int(len(fit_idx)),
            "n_heldout": int(len(heldout_idx)),
            "heldout_sha256": _sha256_ints(heldout_idx),
        },
        "torch_threads": s.torch_threads,
        "versions": package_versions(*(() if family == "countvae" else ("scvi-tools", "lightning"))),
    }
    gene_selection = get_gene_selection(adata)
    if gene_selection is not None:  # recorded only when genes were selected, so older folders still resume
        recorded["gene_selection"] = gene_selection
    # minibatches come from the file in blocks, not from memory cell by cell: other fits (fit_cells streams them)
    if adata.isbacked and family == "countvae":
        recorded["fit_cells"] = "read from the backed file by each fit"
    return recorded


def _fit_or_reuse(runs: list[_Run]) -> Parallelism:
    """Load each run's completed seeds from its ``out_dir``, fit the others in one pool and store them.

    Fills each run's fits, seconds, reused seeds and ``fit.json`` records; returns the parallelism used.
    """
    first = runs[0].settings
    with contextlib.ExitStack() as stack:
        roots = [_locked_root(stack, run.settings.out_dir) for run in runs]
        for run, root in zip(runs, roots, strict=True):
            prepare(root, run.manifest, run.settings.overwrite)
        remove_orphaned()  # left by the workers of a run that was killed
        for run, root in zip(runs, roots, strict=True):
            _reuse_stored(run, root)
            for seed in run.reused:
                run.seconds[seed] = 0.0
                notify(run.settings.progress, ProgressEvent(SEED_REUSED, seed=seed))
        todo = [t for run in runs for t in run.tasks if t.seed not in run.reused]
        fit_data = runs[0].fit_data
        # Only countvae models stream from a backed file (fit_cells): a backed file spares an scvi-tools fit nothing.
        with backed_remedy_off() if runs[0].loader.family != "countvae" else contextlib.nullcontext():
            parallelism = plan_parallelism(
                first.n_jobs,
                len(todo),
                fit_data,
                first.torch_threads,
                first.backend,
                first.progress,
                first.train_kwargs,
            )
        if todo:
            logger.info("Fitting %s: %s (%s).", counted(len(todo), "seed"), parallelism.describe(), parallelism.reason)
        total = sum(len(run.tasks) for run in runs)
        done = sum(len(run.reused) for run in runs)
        with tqdm(total=total, initial=done, desc="Seeds", unit="fit", disable=not first.progress_bar) as bar:
            try:
                for outcome in run_tasks(first.backend, todo, fit_data, parallelism.n_jobs):
                    _keep(runs[outcome.group], roots[outcome.group] / FITS_FOLDER, outcome)
                    bar.set_postfix_str(f"seed {outcome.seed} done")
                    bar.update(1)
            except WorkerLostError as exc:
                # The killed worker could not remove its scratch folder, nor can the workers cancelled after it
                # (killed asynchronously): give them a few seconds to end.
                remove_orphaned(wait_s=LOST_WORKER_WAIT_S)
                raise _lost_with_remedy(exc, runs) from None
    return parallelism


def _locked_root(stack: contextlib.ExitStack, out_dir: str | os.PathLike | None) -> Path:
    """``out_dir`` locked for this run, or a temporary folder removed when ``stack`` closes."""
    if out_dir is None:
        return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="countvae-seeds-")))
    root = Path(out_dir)
    stack.enter_context(locked(root))  # which names a file in the way
    return root


def _keep(run: _Run, fits_dir: Path, outcome: FitOutcome) -> None:
    """Store a finished fit in its run's folder and load it back from there."""
    store(fits_dir, outcome, run.loader.family, run.settings.progress)
    run.fits[outcome.seed] = run.loader.load(fits_dir, outcome.seed)
    run.records[outcome.seed] = read_fit_record(seed_folder(fits_dir, outcome.seed), outcome.seed)
    run.seconds[outcome.seed] = outcome.seconds
    logger.info("Seed %d: fitted in %.1f s and saved.", outcome.seed, outcome.seconds)


def _reuse_stored(run: _Run, root: Path) -> None:
    """Load the stored seeds into ``run``'s fits and records; damaged ones stop the run, or are set aside to refit."""
    fits_dir = root / FITS_FOLDER
    reused, damaged = [], []
    for s in (t.seed for t in run.tasks):
        folder = seed_folder(fits_dir, s)
        if not folder.is_dir():
            continue
        try:
            run.fits[s] = run.loader.load(fits_dir, s)
            run.records[s] = read_fit_record(folder, s)
        except BrokenFitError as exc:
            damaged.append(exc)
            continue
        logger.info("Seed %d: reusing the completed fit in %s.", s, folder)
        reused.append(s)
    if damaged and not run.settings.refit_broken:
        raise all_broken(damaged)
    for exc in damaged:
        aside = set_aside(root, Path(exc.folder))
        logger.warning("Seed %d: %s Moved it to %s; refitting that seed.", exc.seed, exc.problem, aside)
    run.reused = reused


def _lost_with_remedy(exc: WorkerLostError, runs: list[_Run]) -> WorkerLostError:
    parts = [_what_is_kept(run) for run in runs if any(t.seed not in run.fits for t in run.tasks)]
    return WorkerLostError(f"{exc} {'; '.join(parts)} (with a smaller n_jobs if memory ran out).")


def _what_is_kept(run: _Run) -> str:
    missing = [t.seed for t in run.tasks if t.seed not in run.fits]
    kept, out_dir = sorted(run.fits), run.settings.out_dir
    if out_dir is None:
        where = "no out_dir was given, so nothing was kept; pass out_dir=... so that a rerun resumes"
    elif kept:
        where = f"seeds {kept} are stored in {out_dir}; rerun the same call to fit the rest, reusing them"
    else:
        where = f"none was stored yet in {out_dir}; rerun the same call to fit them"
    return f"Seeds {missing} are not done; {where}"


def _sha256_ints(values: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(values, dtype="<i8").tobytes()).hexdigest()


def load_seed_fits(out_dir: str | os.PathLike, adata: ad.AnnData, model_cls: type | None = None) -> SeedFits:
    """Read the completed fits of a :func:`fit_seeds` output folder, on the data they were made from.

    Parameters
    ----------
    out_dir
        Folder written by :func:`fit_seeds`.
    adata
        The full AnnData given to :func:`fit_seeds` (registered with ``CountVAE.setup_anndata``), checked against the
        recorded checksum and split the same way.
    model_cls
        The model class; by default the one recorded (only countvae's and
        scvi-tools' supported classes are imported by name).

    Raises
    ------
    InvalidDataError
        If ``adata`` is not the fits' data (naming whether the genes, cells, counts or batches differ).
    ModelFileError
        If ``out_dir`` has no manifest or fewer than two completed fits.

    """
    root = Path(out_dir)
    manifest_path = root / MANIFEST_FILE
    manifest = read_versioned_json(manifest_path, MANIFEST_FORMAT, MANIFEST_VERSION, WHAT)
    settings = manifest["settings"]
    registry = _check_registered(adata)
    current = data_fingerprint(adata, registry)
    if current["sha256"] != settings["data"]["sha256"]:
        raise InvalidDataError(
            f"The fits in {root} were made on other data than this AnnData: "
            + "; ".join(describe_mismatch({"data": settings["data"]}, {"data": current}))
            + ". Pass the AnnData the fits were made from."
        )
    if model_cls is None:
        name = settings["model_class"]
        if name not in _LOADABLE_CLASSES:
            raise InvalidArgumentError(
                f"{manifest_path} records model class {name!r}; pass model_cls=... to load fits of this class."
            )
        module, attr = _LOADABLE_CLASSES[name]
        model_cls = getattr(importlib.import_module(module), attr)
    family = _model_family(model_cls)
    if family != settings["model_family"]:
        raise InvalidArgumentError(
            f"{root} holds {settings['model_family']} fits; model_cls={model_cls.__name__} is a {family} model."
        )
    fit_idx, heldout_idx = heldout_split(adata.n_obs, settings["heldout_fraction"], settings["split_seed"])
    adata_fit, _ = fit_cells(adata, fit_idx, registry, stream=adata.isbacked and family == "countvae")
    adata_heldout = cells_at(adata, heldout_idx)
    loader = FitLoader(model_cls, family, adata_fit, registry)
    fits_dir = root / FITS_FOLDER
    # every stored fit: the manifest names the seeds of the last call, and an earlier call into the folder may have
    # stored others (a later call with fewer seeds keeps them)
    seeds = stored_seeds(fits_dir)
    if len(seeds) < 2:
        raise ModelFileError(
            f"{root} holds {len(seeds)} completed fit(s) of seeds {manifest['seeds']}; rerun fit_seeds with the "
            "same settings and out_dir to finish them."
        )
    records = {s: read_fit_record(seed_folder(fits_dir, s), s) for s in seeds}
    return SeedFits(
        fits=[loader.load(fits_dir, s) for s in seeds],
        adata_fit=loader.adata_for_fits,
        adata_heldout=adata_heldout,
        settings={
            **settings,
            "seeds": seeds,
            "training": [{"seed": s, **records[s].get("training", {})} for s in seeds],
        },
        seconds=dict.fromkeys(seeds, 0.0),
        out_dir=root,
        reused_seeds=seeds,
        records=records,
    )
