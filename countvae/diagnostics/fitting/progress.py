"""The events a multi-seed run reports as it goes: seeds started, trained, stored or reused; report files written.

:func:`countvae.diagnostics.fit_seeds` and :meth:`countvae.diagnostics.DiagnosticReport.save` take ``progress``, a
callable receiving one :class:`ProgressEvent` per step. ``countvae diagnose`` prints its per-seed messages from these
events; the interruption tests (``tests/seedrun.py``) use them to stop a run at a known point.

Where the callable runs
-----------------------
Events about storing and reusing fits and writing report files are emitted in the calling process, in order.
:data:`SEED_STARTED` and :data:`SEED_TRAINED` are emitted where the fit runs: in the calling process when seeds are
fitted there (``n_jobs=1`` with the local backend), else in a joblib worker process or Ray task, which receives a
*copy* of ``progress`` with each seed's job. ``progress`` must then be picklable by cloudpickle (module functions,
lambdas, closures and instances of importable classes are), and what it changes in the worker (counters, lists) stays
there; a progress display should count the calling-process events.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass


class ProgressKind(enum.StrEnum):
    """What happened (the values are plain strings, e.g. ``"seed stored"``)."""

    SEED_STARTED = "seed started"
    """A seed's model is about to be built and trained (emitted where the fit runs)."""
    SEED_TRAINED = "seed trained"
    """Its training finished (emitted where the fit runs); ``seconds`` is the training time."""
    SEED_WRITTEN = "seed written"
    """Its files are complete under a temporary folder name, not yet renamed into place."""
    SEED_STORED = "seed stored"
    """Its folder is in place (``out_dir/fits/seed_<s>``); ``seconds`` is the fit's time."""
    SEED_REUSED = "seed reused"
    """A completed fit from an earlier run of the same settings is used instead of fitting the seed."""
    REPORT_FILE_WRITTEN = "report file written"
    """One report file (``name``) is complete inside the report's temporary folder."""


#: The event kinds, importable one by one.
SEED_STARTED = ProgressKind.SEED_STARTED
SEED_TRAINED = ProgressKind.SEED_TRAINED
SEED_WRITTEN = ProgressKind.SEED_WRITTEN
SEED_STORED = ProgressKind.SEED_STORED
SEED_REUSED = ProgressKind.SEED_REUSED
REPORT_FILE_WRITTEN = ProgressKind.REPORT_FILE_WRITTEN


@dataclass(frozen=True)
class ProgressEvent:
    """One step of a multi-seed run.

    Attributes
    ----------
    kind
        What happened, a :class:`ProgressKind`.
    seed
        The seed concerned (``None`` for report files).
    seconds
        The seed's training time (:attr:`ProgressKind.SEED_TRAINED`, :attr:`ProgressKind.SEED_STORED`), else ``None``.
    name
        The report file's name (for :attr:`ProgressKind.REPORT_FILE_WRITTEN`), else ``None``.

    """

    kind: ProgressKind
    seed: int | None = None
    seconds: float | None = None
    name: str | None = None


#: The type of a ``progress`` argument.
Progress = Callable[[ProgressEvent], None]


def notify(progress: Progress | None, event: ProgressEvent) -> None:
    """Call ``progress(event)`` unless ``progress`` is ``None``."""
    if progress is not None:
        progress(event)
