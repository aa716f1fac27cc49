"""Checkpoints that the interruption tests use to stop a multi-seed run at a chosen moment.

With ``COUNTVAE_TEST_MARKER_DIR`` unset (always, outside the tests) a
checkpoint does nothing. When it is set, each checkpoint touches a marker file
``<event>-<seed>`` in that folder, and the checkpoint named by
``COUNTVAE_TEST_PAUSE_AT`` (``"<event>:<seed>"``) then waits forever, so a test
can SIGKILL the process at exactly that point (for example while a fit's folder
is written under its temporary name).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

MARKER_DIR_ENV = "COUNTVAE_TEST_MARKER_DIR"
PAUSE_AT_ENV = "COUNTVAE_TEST_PAUSE_AT"


def checkpoint(event: str, seed: int | None = None) -> None:
    """Mark that ``event`` was reached (for ``seed``, if given) and pause there if a test asked for it.

    The marker is ``<event>-<seed>`` and the pause key ``<event>:<seed>``; for an
    event that belongs to no seed (the report) both are just ``<event>``.
    """
    marker_dir = os.environ.get(MARKER_DIR_ENV)
    if not marker_dir:
        return
    name, key = (event, event) if seed is None else (f"{event}-{seed}", f"{event}:{seed}")
    Path(marker_dir, name).touch()
    if os.environ.get(PAUSE_AT_ENV) == key:
        while True:
            time.sleep(0.5)
