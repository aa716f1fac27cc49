"""The report's held-out log p(x) of each fit: on a fixed number of torch threads, here or in worker processes.

It is the most expensive output of a report (about 6 s a fit on 500 Kang cells and 2,000 genes, one thread). Two rules
keep its numbers and its speed independent of the machine:

* every estimate runs on ``lpd_threads`` torch threads (default 1). On CPU the estimates depend on the thread count (it
  sets the order of torch's sums): between 1 and 2 threads the estimate of a Kang cell moved by up to 0.84 nats. A count
  taken from the machine would give the same fits other numbers on other machines, and workers that each inherit the
  caller's threads oversubscribe the cores (2 workers of 2 threads on 2 cores took 2.2-7.4x as long as one process on
  Kang, 12-16x on the embedded data; benchmarks/RESULTS.md, section report-lpd-workers);
* ``lpd_jobs="auto"`` estimates the first fit here, times it, and sends the others to one worker per usable core only
  when their estimates would take longer here than the workers take to start (:data:`WORKER_START_SECONDS`); on small
  data the workers' start alone costs more than the estimates (embedded data: 3.4 s for 5 fits on one thread here).

A worker computes the same numbers as this process (same threads, same seeds), so ``lpd_jobs`` never changes a report.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import time
import warnings
from collections.abc import Sequence

import anndata as ad
import pandas as pd
import torch
from joblib import Parallel, delayed
from threadpoolctl import threadpool_limits

from countvae._allocator import keep_freed_memory
from countvae.diagnostics.fitting.backends import available_cores, loky_worker_options
from countvae.diagnostics.fitting.fitted_model import FittedModel
from countvae.diagnostics.fitting.parallelism import AUTO
from countvae.diagnostics.reporting.settings import ReportSettings

logger = logging.getLogger(__name__)

#: Seconds that worker processes take to start and receive the fits before they estimate anything (loky's
#: start, the imports, unpickling the models): 4-9 s for 2 workers on 2 cores (section report-lpd-workers).
#: ``lpd_jobs="auto"`` uses workers only when they would save more than this.
WORKER_START_SECONDS = 10.0

_Result = tuple[pd.DataFrame | None, list[warnings.WarningMessage]]


def _fit_lpd(fit: FittedModel, cells: ad.AnnData, s: ReportSettings) -> _Result:
    """One fit's held-out log p(x) on ``s.lpd_threads`` torch threads, and the warnings it raised."""
    previous = torch.get_num_threads()
    torch.set_num_threads(s.lpd_threads)
    limit = threadpool_limits(limits=s.blas_threads, user_api="blas") if s.blas_threads else contextlib.nullcontext()
    try:
        with limit, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            frame = fit.log_predictive_density(cells, s.n_lpd_samples, s.seed)
    finally:
        torch.set_num_threads(previous)
    return frame, list(caught)


def _fit_lpd_in_worker(fit: FittedModel, cells: ad.AnnData, s: ReportSettings) -> _Result:
    """:func:`_fit_lpd` in a worker process, which keeps freed memory for reuse (:mod:`countvae._allocator`)."""
    keep_freed_memory()
    return _fit_lpd(fit, cells, s)


def _in_workers(fits: Sequence[FittedModel], cells: ad.AnnData, s: ReportSettings, jobs: int) -> list[_Result]:
    """The fits' estimates in ``jobs`` loky workers, or here when they cannot be sent (or ``jobs`` is 1).

    The workers end on their own when this process is killed
    (:func:`~countvae.diagnostics.fitting.backends.exit_with_parent`).
    """
    if jobs > 1:
        try:
            parallel = Parallel(n_jobs=jobs, backend="loky", **loky_worker_options())
            return parallel(delayed(_fit_lpd_in_worker)(fit, cells, s) for fit in fits)
        except (pickle.PicklingError, TypeError) as error:  # e.g. a model on a backed (file-bound) AnnData
            logger.info("The fits cannot be sent to worker processes (%s); estimating in this process.", error)
    return [_fit_lpd(fit, cells, s) for fit in fits]


def auto_workers(first_seconds: float, n_left: int, cores: int) -> int:
    """Workers for the ``n_left`` estimates after a first one that took ``first_seconds`` here (1: none).

    Workers pay when the time they save, ``first_seconds * n_left * (1 - 1 / jobs)``, exceeds their start-up.
    """
    jobs = min(cores, n_left)
    if jobs < 2 or first_seconds * n_left * (1.0 - 1.0 / jobs) <= WORKER_START_SECONDS:
        return 1
    return jobs


def heldout_lpd(fits: Sequence[FittedModel], cells: ad.AnnData, s: ReportSettings) -> list[pd.DataFrame | None]:
    """Each fit's held-out log p(x) on ``cells``, in order (``s.lpd_jobs`` and ``s.lpd_threads``: module docstring).

    The warnings the estimator raises in a worker (e.g. unreliable cells) are raised again here.
    """
    fits = list(fits)
    results: list[_Result] = []
    if s.lpd_jobs == AUTO and fits:
        started = time.perf_counter()
        results.append(_fit_lpd(fits[0], cells, s))
        jobs = auto_workers(time.perf_counter() - started, len(fits) - 1, available_cores())
        left = fits[1:]
    else:
        jobs, left = min(int(s.lpd_jobs), len(fits)), fits
    logger.info("Estimating the held-out log p(x) of %d fits (%d worker(s)).", len(left), jobs)
    results += _in_workers(left, cells, s, jobs)
    for _, caught in results:
        for message in caught:
            warnings.warn_explicit(message.message, message.category, message.filename, message.lineno)
    return [frame for frame, _ in results]
