"""Two runs on one output folder: the second refuses at once naming the first; a killed run's lock is taken over.

The first run is a real ``fit_seeds`` in a subprocess whose ``progress`` callable
stops it (waits) right after seed 1 has trained, when seed 0 is already stored;
it is then SIGKILLed, leaving its lock record and its scratch folder behind.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from faults_helpers import assert_same_numbers, numbers, run, tiny_data

from countvae.diagnostics.fitting.run_lock import OWNER_FILE, read_owner
from countvae.errors import OutputExistsError, OutputLockedError

TESTS = Path(__file__).resolve().parents[2]
HOLDER = """
import sys, time
from pathlib import Path
from faults_helpers import run, tiny_data

def hold(event):
    if event.kind == "seed trained" and event.seed == 1:
        Path(sys.argv[1], "holding").touch()
        time.sleep(600)

# in this process (n_jobs=1): the killed run is then one process, whose pid names its lock and scratch folder
run(tiny_data(), Path(sys.argv[1]) / "out", progress=hold, n_jobs=1)
"""


def _start_holder(tmp_path: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS.parent), str(TESTS)]), OMP_NUM_THREADS="1")
    env["TMPDIR"] = tempfile.gettempdir()
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], env=env)
    deadline = time.monotonic() + 300
    while not (tmp_path / "holding").exists():
        assert proc.poll() is None, "the holding run ended early"
        assert time.monotonic() < deadline, "the holding run did not reach seed 1 in time"
        time.sleep(0.2)
    return proc


def test_second_run_refused_naming_the_first_then_stale_lock_taken_over(tmp_path, caplog, monkeypatch):
    temp = tmp_path / "tmp"  # the holder's scratch folder is left here when it is killed
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    adata = tiny_data()
    out = tmp_path / "out"
    holder = _start_holder(tmp_path)
    try:
        start = time.monotonic()
        with pytest.raises(OutputLockedError) as info:
            run(adata, out)
        refused_in = time.monotonic() - start
        print(f"lock: the second run was refused after {refused_in:.2f} s")
        message = str(info.value)
        assert f"pid {holder.pid}" in message and socket.gethostname() in message and "started 20" in message
        assert "wait for it to finish" in message and "\n" not in message
        assert isinstance(info.value, OutputExistsError)  # `except OutputExistsError` still catches it
        assert refused_in < 10, f"the refusal took {refused_in:.1f} s; it must not wait for the lock"
        assert (out / "fits" / "seed_0").is_dir() and not (out / "fits" / "seed_1").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The OS released the killed run's lock; its owner record stays behind and names it.
    assert read_owner(out)["pid"] == holder.pid
    with caplog.at_level(logging.WARNING, logger="countvae"):
        fits = run(adata, out)
    assert f"pid {holder.pid}" in caplog.text and "no longer running" in caplog.text
    assert fits.reused_seeds == [0]
    assert list(temp.glob("countvae-fit-*")) == [], "the killed run's scratch folder was not removed"
    assert not (out / OWNER_FILE).exists(), "a finished run removes its owner record"
    assert_same_numbers(fits, numbers(run(adata, None)))  # as an uninterrupted run


def test_diagnose_holds_its_folder_from_the_first_fit_to_the_saved_report(tmp_path):
    """A second run started while the first reports (its fits done) is refused, not left to replace the report."""
    from countvae.diagnostics import diagnose
    from countvae.diagnostics.fitting.run_lock import locked

    out = tmp_path / "out"
    refusals = []

    def try_the_folder(fits):  # called once the seeds are fitted, before the report is made and saved
        with pytest.raises(OutputLockedError) as info, locked(out):
            pass
        refusals.append(str(info.value))

    diagnose(
        tiny_data(),
        seeds=2,
        out_dir=out,
        n_jobs=1,
        model_kwargs={"n_latent": 2, "n_hidden": 16},
        train_kwargs={"max_epochs": 2},
        report_kwargs={"ica": False, "n_lpd_samples": 10},
        after_fitting=try_the_folder,
    )
    assert len(refusals) == 1 and f"pid {os.getpid()}" in refusals[0]
    assert (out / "report" / "report.json").is_file() and not (out / OWNER_FILE).exists()
    with locked(out):  # released once the report is saved
        pass
