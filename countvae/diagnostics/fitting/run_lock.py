"""One writer per output folder: an OS file lock plus a record of who holds it.

``out_dir/.lock`` is locked with :class:`filelock.FileLock`, which the operating system releases when the holder
ends, even if killed. Beside it, ``out_dir/.lock.owner.json`` names the holder (pid, host, start time), so a second
run can say which run writes the folder. A run ending normally removes the record; a record found by a run that got
the lock was left by a killed run, and is taken over with a warning naming it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from countvae._io import explained_write_errors, refuse_file_in_the_way, write_json_atomic
from countvae.errors import OutputLockedError

logger = logging.getLogger(__name__)

LOCK_FILE = ".lock"
OWNER_FILE = ".lock.owner.json"


def read_owner(root: Path) -> dict[str, Any] | None:
    """The holder recorded in ``root/.lock.owner.json``, or ``None`` when there is no readable record."""
    try:
        record = json.loads((root / OWNER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def describe_owner(record: dict[str, Any] | None) -> str:
    """``"pid 123 on host h, started 2026-01-01T00:00:00Z"``, or a note that the holder is not recorded."""
    if record is None:
        return "a process that has not recorded itself"
    return f"pid {record.get('pid')} on host {record.get('host')}, started {record.get('started')}"


def pid_alive(pid: Any) -> bool:
    """Whether a process with this id runs on this host (one owned by another user counts as alive)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    """Whether the process has ended but its parent has not yet collected it (state Z in /proc, Linux only)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]


def _take_over_stale(root: Path) -> None:
    """Warn about the owner record of a run that ended without removing it (it was killed)."""
    record = read_owner(root)
    if record is None:
        return
    if record.get("host") != socket.gethostname():
        note = "its lock was released, so it has ended"
    elif pid_alive(record.get("pid")):
        note = "its lock was released, so it has ended (its pid now belongs to another process)"
    else:
        note = "it is no longer running"
    logger.warning(
        "%s was left locked by %s; %s, so this run takes the folder over.", root, describe_owner(record), note
    )


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold the lock of ``root`` for the block, or fail at once if another running process holds it.

    Raises
    ------
    OutputExistsError
        If ``root`` or a folder above it is a file; the message names it.
    OutputLockedError
        If another run holds the lock; the message names it (pid, host, start time).
    OutputWriteError
        If ``root`` cannot be created or written (a read-only folder, a full disk).

    """
    refuse_file_in_the_way(root, "choose another out_dir (--out)")
    lock = FileLock(root / LOCK_FILE, timeout=0)
    created = not root.exists()
    try:
        with explained_write_errors(root, reused=True):  # a read-only or full disk: one error that says so
            root.mkdir(parents=True, exist_ok=True)
            lock.acquire()
    except Timeout:
        raise OutputLockedError(
            f"{root} is being written by another run ({describe_owner(read_owner(root))}, holding "
            f"{root / LOCK_FILE}); wait for it to finish, stop it, or use another out_dir (--out)."
        ) from None
    try:
        _take_over_stale(root)
        started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        write_json_atomic(
            root / OWNER_FILE, {"pid": os.getpid(), "host": socket.gethostname(), "started": started}, overwrite=True
        )
        try:
            yield
        except BaseException:
            if created:  # a run refused before it wrote anything leaves no folder behind
                _remove_if_only_the_lock(root)
            raise
        finally:
            (root / OWNER_FILE).unlink(missing_ok=True)
    finally:
        lock.release()


def _remove_if_only_the_lock(root: Path) -> None:
    """Remove ``root`` if it holds nothing but the lock's own files."""
    if {p.name for p in root.iterdir()} <= {LOCK_FILE, OWNER_FILE}:
        shutil.rmtree(root, ignore_errors=True)
