"""A worker process SIGKILLed in the middle of a seed's fit (joblib/loky, and a local Ray instance).

The kill comes from inside the worker: the run's ``progress`` callable kills its
own process when seed 1 has trained and is about to be saved (see
``faults_helpers.KillWorkerOnce``). The run must stop with a one-line
:class:`~countvae.errors.WorkerLostError` that says to rerun; the rerun must reuse
every seed that was stored and give exactly the numbers of an uninterrupted run.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path

import pytest
from faults_helpers import KillWorkerOnce, assert_same_numbers, files_of, leftovers, numbers, run, tiny_data

from countvae.errors import WorkerLostError

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def adata():
    return tiny_data()


@pytest.fixture(scope="module")
def reference(adata):
    return numbers(run(adata, None))


def _check_lost_then_resumed(adata, reference, out, marker, run_killed, run_again):
    start = time.monotonic()
    with pytest.raises(WorkerLostError) as info:
        run_killed()
    stopped_in = time.monotonic() - start
    assert marker.is_file(), "the worker was not killed"
    message = str(info.value)
    assert "died" in message and "rerun the same call" in message
    not_done = re.search(r"Seeds \[([0-9, ]*)\] are not done", message)
    assert not_done and "1" in not_done.group(1).split(", "), message
    assert "\n" not in message
    assert stopped_in < 120, f"the run took {stopped_in:.0f} s to notice the lost worker"
    assert leftovers(out) == []
    stored = sorted(int(p.name.removeprefix("seed_")) for p in (out / "fits").glob("seed_*"))
    assert 1 not in stored
    before = {s: files_of(out / "fits" / f"seed_{s}") for s in stored}
    start = time.monotonic()
    fits = run_again()
    print(
        f"worker lost: stopped after {stopped_in:.1f} s, {len(stored)} seed(s) stored; "
        f"rerun {time.monotonic() - start:.1f} s"
    )
    assert fits.reused_seeds == stored, "a finished seed was not reused"
    assert {s: files_of(out / "fits" / f"seed_{s}") for s in stored} == before
    assert_same_numbers(fits, reference)


def test_joblib_worker_killed_mid_seed(adata, reference, tmp_path):
    out, marker = tmp_path / "out", tmp_path / "killed"
    _check_lost_then_resumed(
        adata,
        reference,
        out,
        marker,
        lambda: run(adata, out, n_jobs=2, progress=KillWorkerOnce(marker, seed=1)),
        lambda: run(adata, out, n_jobs=2),
    )


def test_ray_worker_killed_mid_seed(adata, reference, tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")  # the [ray] extra is part of [dev]
    temp_dir = tempfile.mkdtemp(prefix="cvray")  # short: Ray's socket paths must stay under 108 characters
    monkeypatch.setenv("RAY_TMPDIR", temp_dir)
    pythonpath = os.pathsep.join([str(TESTS.parent), str(TESTS), os.environ.get("PYTHONPATH", "")])
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=80 * 1024**2,
        configure_logging=False,
        runtime_env={"env_vars": {"PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}},
    )
    try:
        out, marker = tmp_path / "out", tmp_path / "killed"
        _check_lost_then_resumed(
            adata,
            reference,
            out,
            marker,
            lambda: run(adata, out, n_jobs=2, backend="ray", progress=KillWorkerOnce(marker, seed=1)),
            lambda: run(adata, out, n_jobs=2, backend="ray"),
        )
    finally:
        ray.shutdown()
