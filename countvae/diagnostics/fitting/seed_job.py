"""One seed's fit as a self-contained job: train, save into a scratch folder, return the files' bytes.

A job returns the saved model as bytes rather than writing into the output folder, so the calling process is the only
writer of ``out_dir`` (storing each folder atomically as results arrive) and a Ray worker on another machine needs no
shared file system. The function is importable at module level so that joblib and Ray can send it to worker
processes; a task's ``progress`` callable travels with it (see :mod:`.progress` for what that means).
"""

from __future__ import annotations

import resource
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anndata as ad
import torch

from countvae._allocator import freed_memory_kept
from countvae.data.file_cells import FileCells
from countvae.data.registry import get_registry
from countvae.diagnostics.fitting import scvi_storage
from countvae.diagnostics.fitting.progress import SEED_STARTED, SEED_TRAINED, Progress, ProgressEvent, notify
from countvae.diagnostics.fitting.scratch import scratch_prefix

#: Folder, inside each ``fits/seed_<s>/``, that holds the saved model.
MODEL_FOLDER = "model"


@dataclass(frozen=True)
class FitTask:
    """What one worker needs to fit one seed.

    Attributes
    ----------
    seed
        Seed of the fit (``CountVAE.train(seed=...)``, or ``scvi.settings.seed``).
    model_cls
        ``CountVAE`` (or a subclass), ``scvi.model.SCVI`` or ``scvi.model.LinearSCVI``.
    model_kwargs, train_kwargs
        Passed to the constructor and to ``train``.
    model_kwargs_record
        ``model_kwargs`` as recorded in JSON (stored with scvi-tools fits, which are rebuilt from it).
    torch_threads
        ``torch.set_num_threads`` for the fit.
    progress
        Receives :data:`~.progress.SEED_STARTED` and :data:`~.progress.SEED_TRAINED`
        where the fit runs (a copy of it in a worker process).
    group
        Which of several models fitted in one pool the task belongs to (its outcome carries it back).

    """

    seed: int
    model_cls: type
    model_kwargs: dict[str, Any]
    train_kwargs: dict[str, Any]
    model_kwargs_record: dict[str, Any]
    torch_threads: int
    progress: Progress | None = None
    group: int = 0


@dataclass
class FitOutcome:
    """A finished fit: the files of its model folder, and how it was made.

    ``training`` is the model's ``CountVAE.training_summary`` (for scvi-tools fits the epochs trained). ``node`` names
    the Ray node that fitted it (empty elsewhere). ``peak_rss_mib`` is the peak resident memory of the fitting process
    up to the end of the fit (Linux ``VmHWM``; in the calling process, its whole high-water mark). ``group`` is the
    task's. ``freed_memory_kept``: whether the fitting process ran with glibc keeping freed memory
    (:mod:`countvae._allocator`; the command line and countvae's worker processes do).
    """

    seed: int
    files: dict[str, bytes]
    seconds: float
    torch_threads: int
    host: str
    training: dict[str, Any] = field(default_factory=dict)
    node: str = ""
    peak_rss_mib: float = 0.0
    group: int = 0
    freed_memory_kept: bool = False


def _peak_rss_mib() -> float:
    """Peak resident memory of this process in MiB.

    On Linux ``VmHWM`` of ``/proc/self/status``, the high-water mark of this process's own memory since it started its
    program: Linux carries ``ru_maxrss`` across ``fork`` and ``exec``, so a worker started from a driver holding 3.6 GB
    reported 3.6 GB whatever it used itself (benchmarks/RESULTS.md, worker-memory). Elsewhere ``ru_maxrss`` (KiB on
    Linux, bytes on macOS).
    """
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024.0**2 if sys.platform == "darwin" else 1024.0)


def run_fit(task: FitTask, fit_data: ad.AnnData | FileCells) -> FitOutcome:
    """Fit one seed and return its saved files.

    ``fit_data`` is the fit cells: an AnnData registered with ``CountVAE.setup_anndata``, or a
    :class:`~countvae.data.file_cells.FileCells`, opened here (a backed view: minibatches are read from disk, the cells
    never loaded whole) and closed when the fit is saved. The torch threads are set for the fit and restored after, so
    a job run in the calling process leaves its settings unchanged.
    """
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(task.torch_threads)
    adata_fit = fit_data.open() if isinstance(fit_data, FileCells) else fit_data
    try:
        start = time.perf_counter()
        notify(task.progress, ProgressEvent(SEED_STARTED, seed=task.seed))
        with tempfile.TemporaryDirectory(prefix=scratch_prefix()) as scratch:
            folder = Path(scratch) / MODEL_FOLDER
            if scvi_storage.is_scvi_class(task.model_cls):
                adata_scvi = scvi_storage.setup_for_scvi(adata_fit, get_registry(adata_fit), task.model_cls)
                model = scvi_storage.fit_scvi(
                    task.model_cls, adata_scvi, task.model_kwargs, task.train_kwargs, task.seed
                )
                seconds = time.perf_counter() - start
                notify(task.progress, ProgressEvent(SEED_TRAINED, seed=task.seed, seconds=seconds))
                folder.mkdir()
                scvi_storage.save_scvi_fit(model, folder, task.model_kwargs_record)
                training = scvi_storage.training_summary(model)
            else:
                model = task.model_cls(adata_fit, **task.model_kwargs)
                model.train(**{"progress_bar": False, **task.train_kwargs, "seed": task.seed})
                seconds = time.perf_counter() - start
                notify(task.progress, ProgressEvent(SEED_TRAINED, seed=task.seed, seconds=seconds))
                model.save(folder)
                training = model.training_summary
            files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
    finally:
        torch.set_num_threads(previous_threads)
        if isinstance(fit_data, FileCells):
            adata_fit.file.close()
    return FitOutcome(
        seed=task.seed,
        files=files,
        seconds=seconds,
        torch_threads=task.torch_threads,
        host=socket.gethostname(),
        training=training,
        peak_rss_mib=_peak_rss_mib(),
        group=task.group,
        freed_memory_kept=freed_memory_kept(),
    )
