"""The process that started joblib workers SIGKILLed while they work: the workers must end on their own.

A child Python process starts two loky workers through countvae's real entry points (the seed fits of
``fit_seeds(n_jobs=2)``, and the report's held-out log p(x) with ``lpd_jobs=2``). Each worker records its pid and
then blocks (the run's ``progress`` callable, or the fit's estimator, sleeps), as a long fit would. The child is
killed with SIGKILL; its workers, and loky's resource trackers with them, must be gone within seconds instead of
waiting, reparented to init, for a result nobody reads. Once they are, loky's shared-memory folder and semaphores of
the killed process are gone from ``/dev/shm`` too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads processes from /proc (Linux)")

#: Seconds the killed process's workers are given to end (a busy machine: they check their parent every second).
END_WITHIN_S = 30.0
#: Seconds the child is given to start its two workers and reach the blocking call in each.
START_WITHIN_S = 180.0

CHILD = """
import os, sys, time
from pathlib import Path

import anndata as ad
import numpy as np


class SleepInWorker:
    '''Records the pid of the process it is called in, then blocks: a progress callable and a fit in one.'''

    def __init__(self, folder):
        self.folder = folder

    def __call__(self, *args):
        (self.folder / str(os.getpid())).touch()
        time.sleep(600)

    def log_predictive_density(self, *args):
        self(*args)


variant, sleeper = sys.argv[1], SleepInWorker(Path(sys.argv[2]))
if variant == "seed fits":
    import countvae as cv
    from countvae.diagnostics import fit_seeds

    adata = cv.data.simulate(n_cells=120, n_genes=20, n_latent=2, seed=5)
    cv.CountVAE.setup_anndata(adata)
    fit_seeds(adata, seeds=[0, 1], n_jobs=2, torch_threads=1, progress=sleeper, progress_bar=False,
              model_kwargs={"n_latent": 2, "n_hidden": 8}, train_kwargs={"max_epochs": 1})
else:
    from countvae.diagnostics.reporting.heldout_lpd import heldout_lpd
    from countvae.diagnostics.reporting.settings import ReportSettings

    cells = ad.AnnData(np.ones((4, 3), dtype=np.float32))
    heldout_lpd([sleeper, SleepInWorker(sleeper.folder)], cells, ReportSettings(n_lpd_samples=5, lpd_jobs=2))
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie waiting to be reaped has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _children(pid: int) -> set[int]:
    """The processes whose parent is ``pid``."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def _workers_started(child: subprocess.Popen, record: Path, log: Path) -> set[int]:
    """The pids of the child's two workers once both have reached the blocking call."""
    deadline = time.monotonic() + START_WITHIN_S
    while len(list(record.iterdir())) < 2:
        if child.poll() is not None:
            pytest.fail(f"the child ended (status {child.returncode}) before its workers started:\n{log.read_text()}")
        if time.monotonic() > deadline:
            pytest.fail(f"the workers did not start within {START_WITHIN_S:.0f} s:\n{log.read_text()}")
        time.sleep(0.2)
    return {int(p.name) for p in record.iterdir()}


@pytest.mark.parametrize("variant", ["seed fits", "held-out log p(x)"])
def test_joblib_workers_end_when_their_parent_is_killed(variant, tmp_path):
    record, temp = tmp_path / "workers", tmp_path / "tmp"
    record.mkdir()
    temp.mkdir()
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        TMPDIR=str(temp),  # the killed run's temporary and scratch folders stay in the test's folder
        OMP_NUM_THREADS="1",
    )
    log = tmp_path / "child.log"
    with log.open("w") as out:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, variant, str(record)], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    workers: set[int] = set()
    started: set[int] = set()
    try:
        workers = _workers_started(child, record, log)
        started = workers | _children(child.pid)  # the workers and loky's resource trackers
        assert workers <= _children(child.pid), "the recorded workers are not the child's own processes"
        child.kill()
        child.wait()
        killed = time.monotonic()
        while any(_running(pid) for pid in started) and time.monotonic() - killed < END_WITHIN_S:
            time.sleep(0.2)
        alive = sorted(pid for pid in started if _running(pid))
        assert alive == [], f"processes of the killed run still run {END_WITHIN_S:.0f} s after the kill: {alive}"
        print(f"{variant}: {len(started)} processes ended {time.monotonic() - killed:.1f} s after the kill")
        shm = Path("/dev/shm")
        if shm.is_dir():
            left = sorted(p.name for p in shm.iterdir() if f"_{child.pid}_" in p.name or f"-{child.pid}-" in p.name)
            assert left == [], f"loky's shared memory of the killed run was left in /dev/shm: {left}"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        _end(workers, started)


def _end(workers: set[int], started: set[int]) -> None:
    """SIGKILL the workers that still run, then the resource trackers that do not end once the workers have."""
    for pid in workers:  # only processes this test's child started
        if _running(pid):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while any(_running(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in started:
        if _running(pid):
            os.kill(pid, signal.SIGKILL)
