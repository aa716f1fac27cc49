"""glibc ``malloc`` settings for the ``countvae`` command line: keep freed memory in the process.

torch allocates every CPU tensor with ``malloc``. By default glibc serves blocks above a threshold (adjusted at run
time, at most 32 MiB) straight from the kernel and gives the top of the heap back once more than twice that threshold is
free, so a loop that allocates and frees the same tens of MiB of temporaries each iteration (the ``log p(x)``
estimator's (draws, cells, genes) blocks) touches fresh zeroed pages every time: on a default Kang ``countvae diagnose``
fit, about 1.7 million minor page faults and a quarter of the estimator's CPU time spent in the kernel
(benchmarks/RESULTS.md, report-diagnose). :func:`keep_freed_memory` raises the trim threshold and the top pad, and pins
the mmap threshold at glibc's own upper limit, so up to :data:`TRIM_THRESHOLD` bytes of freed memory stay in the process
for reuse.

The settings are process-wide, so they are applied only in processes countvae runs its own work in: the command
line's, and the worker processes that fit seeds and estimate held-out ``log p(x)`` for it (joblib's loky workers,
which joblib may reuse for later parallel calls in the same session, and Ray tasks); importing the library or training
a model in the caller's process never applies them. In the training loop they cut the per-epoch time by 4-10%
(benchmarks/RESULTS.md, training-sizes), where the step's (cells, genes) temporaries otherwise come back as fresh
pages. Settings given through glibc's environment variables (``MALLOC_TRIM_THRESHOLD_`` and friends, or
``glibc.malloc.*`` tunables in ``GLIBC_TUNABLES``) are left as they are.
"""

from __future__ import annotations

import ctypes
import os
import sys

#: ``mallopt`` parameters (glibc's malloc.h).
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3

#: Blocks up to this size come from the heap (glibc's largest dynamic mmap threshold on 64-bit).
MMAP_THRESHOLD = 32 * 2**20

#: Free memory at the top of the heap kept before it is given back to the kernel.
TRIM_THRESHOLD = 256 * 2**20

#: Extra memory requested whenever the heap grows.
TOP_PAD = 64 * 2**20

#: The environment variables through which a user may have set these already.
ENVIRONMENT = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_")


_applied = False


def _user_tuned_malloc() -> bool:
    """Whether the environment already sets glibc's malloc (variables or ``GLIBC_TUNABLES``)."""
    return any(name in os.environ for name in ENVIRONMENT) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")


def keep_freed_memory() -> bool:
    """Apply the settings where the C library is glibc; returns whether they were applied.

    Nothing happens when the user set any of :data:`ENVIRONMENT` or a ``glibc.malloc.*`` tunable.
    """
    global _applied
    if not sys.platform.startswith("linux") or _user_tuned_malloc():
        return False
    try:
        libc = ctypes.CDLL(None)  # the C library this process already runs on
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 (glibc only; other C libraries have other mallopt semantics)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settings = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD))
    _applied = all(mallopt(parameter, value) == 1 for parameter, value in settings) or _applied
    return _applied


def freed_memory_kept() -> bool:
    """Whether :func:`keep_freed_memory` has applied its settings in this process."""
    return _applied
