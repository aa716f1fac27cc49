"""Where seeds are fitted: in this process, in joblib worker processes, or as Ray tasks.

Each backend yields :class:`~countvae.diagnostics.fitting.seed_job.FitOutcome` objects as fits finish (not in seed
order), so the caller stores every fit the moment it is done.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import anndata as ad
import joblib

from countvae._allocator import keep_freed_memory
from countvae.data.file_cells import FileCells
from countvae.diagnostics.fitting.seed_job import FitOutcome, FitTask, run_fit
from countvae.errors import InvalidArgumentError, WorkerLostError

logger = logging.getLogger(__name__)

BACKENDS = ("local", "ray")
#: The fit cells as workers receive them: an AnnData in memory, or cells of a file that each worker opens.
FitData = ad.AnnData | FileCells
#: Seconds an idle joblib worker lives on after the last fit (joblib's default is 300).
_IDLE_WORKER_SECONDS = 5
#: Seconds between a joblib worker's checks that the process that started it still runs.
PARENT_CHECK_SECONDS = 1.0


def available_cores() -> int:
    """CPU cores this process may use (affinity and cgroup quotas respected, as joblib counts them)."""
    return max(1, int(joblib.cpu_count()))


#: Torch threads per fit unless ``fit_seeds(torch_threads=...)`` says otherwise: one, on every machine (why:
#: ``FitSeedsSettings.torch_threads``).
DEFAULT_TORCH_THREADS = 1


def caller_warning_filters() -> list[tuple]:
    """The warning filters of this process that can be sent to a worker process (those that pickle)."""
    sendable = []
    for entry in warnings.filters:
        try:
            pickle.dumps(entry)
        except Exception:  # a filter on a warning class defined inside a function: it stays behind
            continue
        sendable.append(entry)
    return sendable


def exit_with_parent(parent_pid: int, interval: float = PARENT_CHECK_SECONDS) -> None:
    """End this worker process as soon as ``parent_pid`` is no longer its parent (a loky worker ``initializer``).

    Loky workers are told to stop by the process that started them. When that process is killed outright (SIGKILL,
    the out-of-memory killer) nothing tells them: they are reparented to init (or a subreaper) and wait on their pipes
    to it forever, each holding its model and data, and loky's resource trackers keep the run's shared-memory folder
    and semaphores for as long as the workers live. A daemon thread compares ``os.getppid()`` with ``parent_pid``
    every ``interval`` seconds and ends the process with :func:`os._exit` once they differ: a normal exit would wait
    for the fit running in the main thread. The scratch folder of a fit cut short this way is removed by the next run
    (:func:`~countvae.diagnostics.fitting.scratch.remove_orphaned`).

    Polling works on Linux and macOS alike. ``prctl(PR_SET_PDEATHSIG)`` would be Linux-only and fires when the
    *thread* that started the worker ends, and loky starts replacement workers from its management thread.

    Parameters
    ----------
    parent_pid
        The process that started the worker (:func:`loky_worker_options` passes the caller's pid).
    interval
        Seconds between two checks.
    """

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval)
        os._exit(1)

    threading.Thread(target=watch, name="countvae-exit-with-parent", daemon=True).start()


def loky_worker_options() -> dict[str, object]:
    """Keyword arguments for ``joblib.Parallel(backend="loky")`` whose workers end when this process ends.

    Each worker runs :func:`exit_with_parent` with this process's pid when it starts. The arguments are the same on
    every call from this process, so they never stop joblib from reusing its workers.
    """
    return {"initializer": exit_with_parent, "initargs": (os.getpid(),)}


def _run_fit_with_filters(task: FitTask, fit_data: FitData, filters: list[tuple]) -> FitOutcome:
    """:func:`run_fit` under the caller's warning filters.

    A worker process starts with Python's default filters, so every worker would print a warning the caller silenced
    (``warnings.filterwarnings("ignore", module="lightning")``), and whether it shows would depend on ``n_jobs``. The
    filters are restored afterwards, as the worker is reused. The worker keeps freed memory for reuse
    (:func:`countvae._allocator.keep_freed_memory`): this runs only in worker processes, never in the caller's.
    """
    keep_freed_memory()
    with warnings.catch_warnings():
        warnings.filters[:] = filters
        return run_fit(task, fit_data)


def run_local(tasks: Sequence[FitTask], fit_data: FitData, n_jobs: int) -> Iterator[FitOutcome]:
    """Fit in this process (``n_jobs=1``) or in ``n_jobs`` joblib (loky) worker processes.

    Workers receive ``fit_data`` pickled: a copy of an in-memory AnnData, or, for a
    :class:`~countvae.data.file_cells.FileCells`, only the file's path and the positions. They end on their own when
    this process is killed (:func:`exit_with_parent`).
    """
    if n_jobs == 1 or len(tasks) <= 1:
        for task in tasks:
            yield run_fit(task, fit_data)
        return
    threads = max(task.torch_threads for task in tasks)
    parallel = joblib.Parallel(
        n_jobs=min(n_jobs, len(tasks)),
        backend="loky",
        return_as="generator_unordered",
        inner_max_num_threads=threads,
        idle_worker_timeout=_IDLE_WORKER_SECONDS,
        **loky_worker_options(),
    )
    try:
        filters = caller_warning_filters()
        yield from parallel(joblib.delayed(_run_fit_with_filters)(task, fit_data, filters) for task in tasks)
    except BrokenProcessPool as exc:  # loky's TerminatedWorkerError: a worker was killed (SIGKILL, out of memory)
        raise WorkerLostError(f"A joblib worker process died while fitting ({_first_line(exc)}).") from None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0].rstrip(".") if lines else type(exc).__name__


def _import_ray():
    try:
        import ray  # an optional dependency (the [ray] extra), imported only when asked for
    except ImportError as exc:
        raise InvalidArgumentError(
            f"backend='ray' needs Ray, which cannot be imported ({exc}); install it with `pip install 'countvae[ray]'`."
        ) from None
    return ray


def _pythonpath_with_this_countvae() -> str:
    """PYTHONPATH under which Ray workers import the same countvae as this process (e.g. a source checkout)."""
    package_parent = str(Path(__file__).resolve().parents[3])  # countvae/diagnostics/fitting/backends.py
    return os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH", "")) if p)


def _fit_on_ray_node(task: FitTask, fit_data: FitData, filters: list[tuple]) -> FitOutcome:
    """:func:`run_fit` inside a Ray task under the caller's warning filters, recording the node it ran on."""
    outcome = _run_fit_with_filters(task, fit_data, filters)
    outcome.node = _import_ray().get_runtime_context().get_node_id()
    return outcome


def run_ray(tasks: Sequence[FitTask], fit_data: FitData, n_jobs: int) -> Iterator[FitOutcome]:
    """Fit each seed as a Ray task on the cluster ``ray.init`` connected to.

    Without an initialised Ray, a small local instance (``n_jobs`` CPUs, no dashboard, a 128 MB object store) whose
    workers import this process's countvae is started, and shut down when the fits are done. Each task asks Ray for
    as many CPUs as its torch threads. At most ``n_jobs`` tasks are in flight at once (``-1``: all).

    ``fit_data`` goes into the object store once. For fit cells in a backed file
    (:class:`~countvae.data.file_cells.FileCells`) that is the path and the cells' positions, not the counts: every node
    must see the file at the same path (a shared or copied file system) and each task reads its minibatches from it.
    """
    if not tasks:
        return
    ray = _import_ray()
    in_flight_limit = len(tasks) if n_jobs == -1 else n_jobs
    started_here = False
    if not ray.is_initialized():
        n_cpus = max(in_flight_limit, max(t.torch_threads for t in tasks))
        logger.info("Starting a local Ray instance with %d CPUs.", n_cpus)
        ray.init(
            address="local",  # a new instance: without it, ray.init joins any Ray cluster running on this machine
            num_cpus=n_cpus,
            include_dashboard=False,
            log_to_driver=False,
            object_store_memory=128 * 1024**2,
            configure_logging=False,
            runtime_env={"env_vars": {"PYTHONPATH": _pythonpath_with_this_countvae()}},
        )
        started_here = True
    pending: dict = {}
    queue = list(tasks)
    try:
        data_ref = ray.put(fit_data)
        filters = caller_warning_filters()
        while queue or pending:
            while queue and len(pending) < in_flight_limit:
                task = queue.pop(0)
                remote = ray.remote(num_cpus=task.torch_threads, max_retries=0)(_fit_on_ray_node)
                pending[remote.remote(task, data_ref, filters)] = task.seed
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                seed = pending.pop(ref)
                try:
                    outcome = ray.get(ref)
                except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as exc:
                    raise WorkerLostError(
                        f"The Ray worker fitting seed {seed} died ({type(exc).__name__}: {_first_line(exc)})."
                    ) from None
                yield outcome
    finally:
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        if started_here:
            ray.shutdown()


def run_tasks(backend: str, tasks: Sequence[FitTask], fit_data: FitData, n_jobs: int) -> Iterator[FitOutcome]:
    """Dispatch to :func:`run_local` or :func:`run_ray`."""
    return run_ray(tasks, fit_data, n_jobs) if backend == "ray" else run_local(tasks, fit_data, n_jobs)
