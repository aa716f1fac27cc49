"""How many seeds are fitted at once: every usable core by default, within the memory the workers need.

``fit_seeds(n_jobs="auto")`` (the default) fits ``min(seeds left, usable cores // torch threads per fit)`` seeds at
once. Each fit keeps its own torch threads (1 unless told otherwise), so a parallel run computes exactly a serial
run's numbers: a fit depends on its seed, the data, the settings and its torch threads, never on the fits beside it.

With an in-memory AnnData each worker process receives a copy of the fit cells' counts; :func:`plan_parallelism`
estimates each worker's peak memory from their size (:func:`worker_memory_estimate`) and fits fewer seeds at once,
saying why, when the machine's available memory (cgroup limits respected) would not hold them. Workers reading a
backed file open it by path and hold no copy of ``X`` or ``raw.X``, but anndata's backed mode reads the file's layers
whole into each of them (measured at about twice their size). The warning gives each worker's fixed base and the data
it holds, and advises a backed file, with the memory it would spare, only where it would spare more than that base: a
countvae model (scvi-tools models fit from an in-memory copy even of backed data) on in-memory data whose registered
counts (in ``X`` or ``raw.X``, left on disk when backed) outweigh the base and the file's layers, and a caller that
can open one (:func:`backed_remedy_off`); otherwise a smaller ``n_jobs``. Counts in a layer cost a backed worker
more than an in-memory one, so the advice is never given for them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anndata as ad
import cloudpickle
import h5py
import numpy as np
import scipy.sparse as sp

from countvae._formatting import counted
from countvae.data.file_cells import FileCells
from countvae.data.registry import get_count_matrix, get_registry
from countvae.diagnostics.fitting.backends import available_cores
from countvae.errors import InvalidArgumentError

logger = logging.getLogger(__name__)

#: ``n_jobs`` value meaning: as many seeds at once as there are usable cores (and seeds left).
AUTO = "auto"
#: Peak resident memory of a worker before the copy of the counts (torch, the model, minibatches), in bytes.
#: Workers fitting from a backed file peaked at 764-776 MiB on 18,000 cells x 2,000 genes and at 830 MiB on
#: 900,000 cells x 200 genes (benchmarks/RESULTS.md, worker-memory-20k and worker-memory). A normalized X beside
#: in-memory counts in a layer was measured not to be held: on 34,736 cells x 2,511 genes (Kang x 4, counts in a
#: 113 MiB CSR layer beside a 333 MiB dense normalized X, 2 workers, 1 epoch) workers peaked at 812-814 MiB,
#: where counting X too estimated 1,602; from the backed file, reading the layer whole, they peaked at 928-943 MiB.
WORKER_BASE_BYTES = 800 * 1024**2
#: A worker's copy of in-memory counts costs about this many times their size at its peak (the pickled bytes
#: and the rebuilt matrix are alive together while it unpickles). An upper bound: the run above, and the same
#: cells with the counts in a sparse X (811-816 MiB against 1,003 estimated), peaked lower.
COPY_FACTOR = 2.0
#: A worker reading a backed file holds its layers (read whole) about this many times their size at its peak:
#: with counts in a CSR layer beside a normalized X, workers peaked at 676 MiB + 1.98 x the file's layer on 20,000,
#: 100,000 and 250,000 cells x 2,000 genes (2,644 MiB for a 993 MiB layer; benchmarks/RESULTS.md,
#: worker-memory-layer), always above the same cells in memory (1,595 MiB). Counting the layer once fell short.
BACKED_LAYER_FACTOR = 2.0
#: Share of the available memory that the workers may take (the calling process and others need the rest).
MEMORY_SHARE = 0.8
#: Whether the memory warning may advise opening the data backed (off within :func:`backed_remedy_off`).
_BACKED_REMEDY: ContextVar[bool] = ContextVar("backed_remedy", default=True)
#: Minibatch steps per seed below which ``"auto"`` fits in the calling process. Two loky workers take
#: 7-13 s to start and import torch and countvae on 2 cores; 3 seeds of the default model in two workers
#: took 2.3x the serial time at 200 steps per seed, 0.94x at 1,000 and 0.82x at 2,000 (benchmarks/RESULTS.md,
#: section worker-start): below about 1,000 steps the workers cost more than they save.
MIN_STEPS_FOR_WORKERS = 1000
#: Cells per minibatch when the training arguments do not say (countvae's and scvi-tools' default).
DEFAULT_BATCH_SIZE = 128


@dataclass(frozen=True)
class Parallelism:
    """What a multi-seed run will do at once, and why.

    Attributes
    ----------
    n_jobs
        Seeds fitted at once (``1``: in the calling process).
    torch_threads
        Torch threads of each fit.
    reason
        Why this number, in a few words (e.g. ``"2 usable cores"``, ``"1 seed left to fit"``).

    """

    n_jobs: int
    torch_threads: int
    reason: str

    def at_full_speed(self) -> int:
        """Seeds that progress at full speed at once: those run at once, at most one per ``torch_threads`` usable cores.

        ``n_jobs`` as given may exceed the cores; the seeds beyond them share the cores and progress no faster in all.
        """
        return min(self.n_jobs, seeds_per_cores(self.torch_threads))

    def describe(self) -> str:
        """E.g. ``"2 seeds at a time, 1 torch thread each"``."""
        return f"{counted(self.n_jobs, 'seed')} at a time, {counted(self.torch_threads, 'torch thread')} each"


def check_n_jobs(n_jobs: Any) -> int | str:
    """``"auto"``, ``-1`` (every usable core) or a positive integer; anything else is refused."""
    if isinstance(n_jobs, str) and n_jobs.strip().lower() == AUTO:
        return AUTO
    if isinstance(n_jobs, int | np.integer) and not isinstance(n_jobs, bool) and (n_jobs == -1 or n_jobs >= 1):
        return int(n_jobs)
    raise InvalidArgumentError(
        f"n_jobs must be 'auto' (one seed per usable core, the default), -1 (every usable core) or a positive "
        f"integer, got {n_jobs!r}."
    )


def available_memory_bytes() -> int | None:
    """Memory this process could still take: ``MemAvailable``, capped by a cgroup limit; ``None`` if unknown."""
    available = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except OSError:
        return None
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),  # v1
    ):
        try:
            limit, usage = Path(limit_file).read_text().strip(), int(Path(usage_file).read_text())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and available is not None:
            available = min(available, max(0, int(limit) - usage))
        break
    return available


def steps_per_seed(n_cells: int, train_kwargs: dict[str, Any]) -> int:
    """Most minibatch steps one fit on ``n_cells`` cells takes: epochs x minibatches per epoch.

    ``max_epochs`` absent or ``None`` means scvi-tools' (and countvae's) default for that many cells; an
    early-stopping fit may take fewer steps, never more.
    """
    from countvae.model.training import default_max_epochs

    epochs = train_kwargs.get("max_epochs") or default_max_epochs(n_cells)
    batch_size = train_kwargs.get("batch_size") or DEFAULT_BATCH_SIZE
    return int(epochs) * -(-max(int(n_cells), 1) // int(batch_size))


def _nbytes(matrix: Any) -> int:
    """Bytes of a matrix in memory, or stored in an .h5ad file (a dataset, or a sparse matrix's group of them)."""
    if sp.issparse(matrix):
        return matrix.data.nbytes + matrix.indices.nbytes + matrix.indptr.nbytes
    if isinstance(matrix, np.ndarray):
        return matrix.nbytes
    if isinstance(matrix, h5py.Dataset):
        return matrix.size * matrix.dtype.itemsize
    if isinstance(matrix, h5py.Group):
        return sum(_nbytes(part) for part in matrix.values())
    return 0  # a backed matrix, read from its file in minibatches


def counts_nbytes(fit_data: ad.AnnData | FileCells) -> int:
    """Bytes of the data matrices a worker holds for ``fit_data``.

    The registered counts of an in-memory AnnData, the only matrix the worker reads (a normalized ``X`` beside counts
    in a layer was measured to cost it nothing: :data:`WORKER_BASE_BYTES`); for cells read from a file, the file's
    layers, which anndata's backed mode reads whole (``X`` and ``raw.X`` stay on disk).
    """
    if isinstance(fit_data, FileCells):
        with h5py.File(fit_data.path, "r") as file:
            return int(sum(_nbytes(layer) for layer in file.get("layers", {}).values()))
    registry = get_registry(fit_data)
    return int(_nbytes(fit_data.X if registry is None else get_count_matrix(fit_data, registry)))


def worker_memory_estimate(fit_data: ad.AnnData | FileCells) -> int:
    """Expected peak resident memory of one worker process fitting a seed on ``fit_data``, in bytes."""
    factor = BACKED_LAYER_FACTOR if isinstance(fit_data, FileCells) else COPY_FACTOR
    return int(WORKER_BASE_BYTES + factor * counts_nbytes(fit_data))


def _backed_spares(fit_data: ad.AnnData | FileCells) -> int:
    """Bytes of each worker's copy that reading ``fit_data`` from a backed file would spare.

    The in-memory worker's copy of its counts (:data:`COPY_FACTOR` times them), less the layers that backed mode reads
    whole (:data:`BACKED_LAYER_FACTOR` times them): counts in ``X`` are left on disk; counts in a layer spare nothing
    (the whole layer at least matches the fit cells' copy); none for cells already read from a file.
    """
    if isinstance(fit_data, FileCells):
        return 0
    layers = sum(_nbytes(layer) for layer in fit_data.layers.values())
    return int(COPY_FACTOR * counts_nbytes(fit_data) - BACKED_LAYER_FACTOR * layers)


def seeds_per_cores(torch_threads: int) -> int:
    """Seeds that the usable cores fit at once at full speed, ``torch_threads`` each (at least 1)."""
    return max(1, available_cores() // torch_threads)


def plan_parallelism(
    n_jobs: int | str,
    n_seeds: int,
    fit_data: ad.AnnData | FileCells,
    torch_threads: int,
    backend: str = "local",
    progress: Any = None,
    train_kwargs: dict[str, Any] | None = None,
    warn: bool = True,
) -> Parallelism:
    """How many of ``n_seeds`` seeds to fit at once for ``n_jobs``.

    ``"auto"`` and ``-1`` take one seed per ``torch_threads`` usable cores (affinity and cgroup quotas respected), at
    most ``n_seeds``; ``"auto"`` fits in the calling process instead when ``progress`` cannot be copied into worker
    processes (an explicit ``n_jobs`` then raises, as the caller checks), or each seed takes fewer than
    ``MIN_STEPS_FOR_WORKERS`` minibatch steps (the workers would take longer to start than the fits). With the
    local backend and in-memory data, fewer seeds run at once, with a warning, when their workers' estimated memory
    exceeds a share (``MEMORY_SHARE``) of the available memory. With the Ray backend, ``-1`` keeps every seed in flight
    (Ray places the tasks by its resources) and no memory estimate applies (the tasks may run on other machines).

    Parameters
    ----------
    n_jobs
        ``"auto"``, ``-1`` (all cores) or a number of seeds at once.
    n_seeds
        Seeds left to fit.
    fit_data
        The fit cells (in memory or backed), for the memory estimate.
    torch_threads
        Torch threads per fit.
    backend
        ``"local"`` or ``"ray"``.
    progress
        The progress callable the workers would be given, if any.
    train_kwargs
        Each fit's training arguments, whose minibatch steps on ``fit_data``'s cells (``steps_per_seed``) are
        counted; ``None``: not considered. Every caller that says or decides how many seeds run at once (the fits, the
        blocks ``diagnose`` and ``select`` print before fitting) passes them, so that all come to the same number.
    warn
        Log the memory warning; the blocks printed before fitting pass ``False``, so that it is logged once, by the
        fits.

    Returns
    -------
    Parallelism
        The number of seeds fitted at once, the threads of each, and why.
    """
    n_jobs = check_n_jobs(n_jobs)
    n_seeds = max(1, int(n_seeds))
    n_cells = len(fit_data.positions) if isinstance(fit_data, FileCells) else fit_data.n_obs
    steps = None if train_kwargs is None else steps_per_seed(n_cells, train_kwargs)
    if backend == "ray" and n_jobs == -1:
        return Parallelism(n_seeds, torch_threads, "every seed in flight (n_jobs=-1); Ray places them")
    if n_jobs in (AUTO, -1):
        per_core = seeds_per_cores(torch_threads)
        # not logged here: the caller that fits logs the outcome and its reason once (fit_seeds)
        if n_jobs == AUTO and per_core > 1 and n_seeds > 1 and pickling_error(progress) is not None:
            return Parallelism(1, torch_threads, "the progress callable cannot be copied into worker processes")
        if n_jobs == AUTO and per_core > 1 and n_seeds > 1 and steps is not None and steps < MIN_STEPS_FOR_WORKERS:
            return Parallelism(
                1, torch_threads, f"{steps} minibatch steps per seed end sooner than worker processes would start"
            )
        jobs = min(per_core, n_seeds)
        left = f"{counted(n_seeds, 'seed')} left to fit"
        reason = left if jobs == n_seeds < per_core else counted(available_cores(), "usable core")
    else:
        jobs, reason = min(n_jobs, n_seeds), "n_jobs as given"
    if backend == "local" and jobs > 1:
        jobs, reason = _within_memory(jobs, reason, fit_data, warn)
    return Parallelism(jobs, torch_threads, reason)


def _within_memory(jobs: int, reason: str, fit_data: ad.AnnData | FileCells, warn: bool) -> tuple[int, str]:
    per_worker = worker_memory_estimate(fit_data)
    available = available_memory_bytes()
    if available is None or jobs * per_worker <= MEMORY_SHARE * available:
        return jobs, reason
    # One seed at a time runs in this process, which holds the data already: no copy, so always possible.
    fitting = max(1, int(MEMORY_SHARE * available // per_worker))
    copy = per_worker - WORKER_BASE_BYTES
    held = "the file's layers, read whole" if isinstance(fit_data, FileCells) else "its copy of the data"
    why = (
        f"{jobs} workers would need about {jobs * per_worker / 1024**3:.1f} GiB ({per_worker / 1024**3:.2f} GiB each: "
        f"{WORKER_BASE_BYTES / 1024**3:.2f} GiB for torch and the model, {copy / 1024**3:.2f} GiB for {held}), more "
        f"than {MEMORY_SHARE:.0%} of the {available / 1024**3:.1f} GiB available"
    )
    # Only where the caller can open a backed file (see backed_remedy_off) and it spares more than the fixed base.
    spared = _backed_spares(fit_data)
    if _BACKED_REMEDY.get() and spared > WORKER_BASE_BYTES:
        remedy = (
            "Open the data backed (anndata.read_h5ad(path, backed='r')) so that workers read it from the file, "
            f"sparing about {spared / 1024**3:.2f} GiB per worker ({jobs * spared / 1024**3:.1f} GiB for {jobs} "
            "workers)"
        )
    else:
        remedy = "Pass a smaller n_jobs, or free memory"
    if warn:
        logger.warning("Fitting %s at a time instead of %d: %s. %s.", counted(fitting, "seed"), jobs, why, remedy)
    return fitting, f"memory: {why}"


@contextlib.contextmanager
def backed_remedy_off() -> Iterator[None]:
    """Within it, the memory warning does not advise opening the data backed.

    For callers that cannot use a backed file: the command line reads the whole file, gene selection needs the
    counts in memory, and scvi-tools models fit from an in-memory copy even of backed data.
    """
    token = _BACKED_REMEDY.set(False)
    try:
        yield
    finally:
        _BACKED_REMEDY.reset(token)


def pickling_error(progress: Any) -> Exception | None:
    """Why ``progress`` cannot be copied into worker processes, or ``None`` when it can."""
    try:
        cloudpickle.dumps(progress)
    except Exception as exc:  # cloudpickle raises several types for objects it cannot copy
        return exc
    return None
