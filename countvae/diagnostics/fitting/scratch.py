"""The scratch folders fits are saved into before their bytes go home, and the removal of those a killed process left.

A fit saves its model into a temporary folder (:mod:`.seed_job`), removed when the fit returns. A worker killed
mid-fit (SIGKILL, the out-of-memory killer) cannot remove it, so the folder is named after its host and process,
``countvae-fit-<host>-<pid>-<random>``, and :func:`remove_orphaned` removes those whose process no longer runs on this
host.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path

from countvae.diagnostics.fitting.run_lock import pid_alive

logger = logging.getLogger(__name__)

PREFIX = "countvae-fit-"
_NAME = re.compile(rf"^{re.escape(PREFIX)}(?P<host>.+)-(?P<pid>\d+)-[^-]+$")


def scratch_prefix() -> str:
    """The ``prefix`` of this process's scratch folders (``tempfile.TemporaryDirectory(prefix=...)``)."""
    return f"{PREFIX}{socket.gethostname()}-{os.getpid()}-"


def remove_orphaned(temp_dir: str | os.PathLike | None = None, wait_s: float = 0.0) -> list[Path]:
    """Remove the scratch folders, in ``temp_dir`` (default: the temporary folder), of processes that have ended.

    Only folders made on this host whose process is gone are removed: a running fit's folder, or another host's
    sharing the folder, is never touched. With ``wait_s``, folders whose process still runs are looked at again until
    it ends or ``wait_s`` seconds have passed: workers cancelled after a lost one are killed asynchronously and take a
    moment to end. Returns the folders removed.
    """
    root = Path(tempfile.gettempdir() if temp_dir is None else temp_dir)
    host = socket.gethostname()
    deadline = time.monotonic() + wait_s
    removed = []
    while True:
        waiting = False
        for path in root.glob(f"{PREFIX}*"):
            match = _NAME.match(path.name)
            if not match or match["host"] != host or not path.is_dir():
                continue
            if pid_alive(int(match["pid"])):
                waiting = True
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
            logger.info("Removed %s, the scratch folder of a fit whose process was killed.", path)
        if not waiting or time.monotonic() >= deadline:
            return removed
        time.sleep(0.2)
