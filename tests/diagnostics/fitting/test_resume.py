"""Interrupted multi-seed runs, for real: a subprocess running fit_seeds is SIGKILLed, then rerun.

The subprocess is ``tests/seedrun.py``. Its ``progress`` callable (the public
event hook of ``fit_seeds`` and ``DiagnosticReport.save``) touches a marker file
per event and, when asked, pauses, so each kill lands at a known point: between
seeds, in the middle of a fit, while a fit's folder is being written under its
temporary name, and while the report is being written.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import countvae as cv
from countvae.diagnostics import fit_seeds

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "tests" / "seedrun.py"
SEEDS = [0, 1, 2]
WAIT_SECONDS = 900  # a guard against a hung run, not a speed check: a loaded machine can be slow


@pytest.fixture(scope="module")
def data_path(tmp_path_factory) -> Path:
    adata = cv.data.simulate(n_cells=240, n_genes=30, n_latent=2, seed=4)
    cv.CountVAE.setup_anndata(adata)
    path = tmp_path_factory.mktemp("resume") / "data.h5ad"
    adata.write_h5ad(path)
    return path


@pytest.fixture(scope="module")
def reference(data_path) -> dict[str, np.ndarray]:
    """An uninterrupted run in the test process (one torch thread, as in the subprocesses)."""
    import anndata as ad

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fits = fit_seeds(
            ad.read_h5ad(data_path),
            seeds=SEEDS,
            model_kwargs={"n_latent": 2, "n_hidden": 16, "decoder": "mlp"},
            train_kwargs={"max_epochs": 25, "batch_size": 64},
            torch_threads=1,
            progress_bar=False,
        )
        out = {}
        for fit in fits:
            out[f"latent_{fit.seed}"] = fit.latent(fits.adata_heldout)
            lpd = fit.log_predictive_density(fits.adata_heldout, n_samples=20, seed=0)
            out[f"lpd_{fit.seed}"] = lpd.to_numpy(dtype=np.float64)  # as tests/seedrun.py stores it
    finally:
        torch.set_num_threads(threads)
    return out


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env | extra


def _seedrun(markers: Path, pause_at: str | None, mode: str, *args: str) -> list[str]:
    pause = [] if pause_at is None else ["--pause-at", pause_at]
    return [sys.executable, str(SCRIPT), "--markers", str(markers), *pause, mode, *args]


def _start(data_path: Path, out_dir: Path | str, results: Path, markers: Path, pause_at: str | None = None):
    markers.mkdir(parents=True, exist_ok=True)
    for marker in markers.iterdir():
        marker.unlink()
    cmd = _seedrun(markers, pause_at, "fit", str(data_path), str(out_dir), str(results), *map(str, SEEDS))
    return subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def _wait_for(marker: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not marker.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended (code {proc.returncode}) before reaching {marker.name}:\n{out}\n{err}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"timed out waiting for {marker.name}")
        time.sleep(0.02)


def _kill(proc: subprocess.Popen) -> None:
    assert proc.poll() is None, "the run had already ended; the kill would not interrupt anything"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL


def _finish(proc: subprocess.Popen) -> tuple[dict, str]:
    out, err = proc.communicate(timeout=WAIT_SECONDS)
    assert proc.returncode == 0, f"the run failed:\n{out}\n{err}"
    return json.loads(out.strip().splitlines()[-1]), err


def _complete_folders(fits_dir: Path) -> list[int]:
    """Seeds with a folder under the final name; each must be complete (no half-written folder is visible)."""
    seeds = []
    for folder in sorted(fits_dir.glob("seed_*")):
        for name in ("fit.json", "model/model.json", "model/params.pt"):
            assert (folder / name).is_file(), f"{folder} is visible under its final name but lacks {name}"
        json.loads((folder / "fit.json").read_text())
        seeds.append(int(folder.name.removeprefix("seed_")))
    return sorted(seeds)


def _stamp(folder: Path) -> tuple[int, int, int]:
    """Inode and modification times: unchanged if and only if the folder was not rewritten."""
    return (
        folder.stat().st_ino,
        (folder / "fit.json").stat().st_mtime_ns,
        (folder / "model/params.pt").stat().st_mtime_ns,
    )


def _assert_equal_results(results: Path, reference: dict[str, np.ndarray]) -> None:
    got = np.load(results)
    assert sorted(got.files) == sorted(reference)
    for key, expected in reference.items():
        np.testing.assert_array_equal(got[key], expected, err_msg=key)


def test_killed_between_seeds_during_a_fit_and_while_writing_then_resumed(tmp_path, data_path, reference):
    out_dir, markers, results = tmp_path / "out", tmp_path / "markers", tmp_path / "results.npz"
    fits_dir = out_dir / "fits"

    # 1. Killed between seeds: seed 0 is stored, seed 1 has not started.
    proc = _start(data_path, out_dir, results, markers, pause_at="seed_stored:0")
    _wait_for(markers / "seed_stored-0", proc)
    _kill(proc)
    assert _complete_folders(fits_dir) == [0]
    assert not (markers / "seed_started-1").exists()
    seed0 = _stamp(fits_dir / "seed_0")

    # 2. Killed in the middle of seed 1's fit (started, not finished training).
    proc = _start(data_path, out_dir, results, markers)
    _wait_for(markers / "seed_started-1", proc)
    time.sleep(0.3)
    assert not (markers / "seed_trained-1").exists(), "seed 1 finished training before the kill; the kill was late"
    _kill(proc)
    assert (markers / "seed_reused-0").exists()
    assert not (markers / "seed_started-0").exists(), "seed 0 was refitted although it was complete"
    assert _complete_folders(fits_dir) == [0]
    assert not any(p.name.startswith(".seed_1") for p in fits_dir.iterdir())

    # 3. Killed while seed 2's folder is being written: it exists only under a temporary name.
    proc = _start(data_path, out_dir, results, markers, pause_at="seed_written:2")
    _wait_for(markers / "seed_written-2", proc)
    _kill(proc)
    assert _complete_folders(fits_dir) == [0, 1]
    partial = [p for p in fits_dir.iterdir() if p.name.startswith(".seed_2.") and p.name.endswith(".partial")]
    assert len(partial) == 1 and (partial[0] / "fit.json").is_file()
    seed1 = _stamp(fits_dir / "seed_1")

    # 4. The same command again finishes the run: only seed 2 is fitted.
    proc = _start(data_path, out_dir, results, markers)
    report, log = _finish(proc)
    assert report["reused"] == [0, 1]
    assert report["seconds"]["0"] == 0.0 and report["seconds"]["1"] == 0.0 and report["seconds"]["2"] > 0.0
    assert "Seed 0: reusing" in log and "Seed 1: reusing" in log and "Seed 2: fitted" in log
    assert not (markers / "seed_started-0").exists() and not (markers / "seed_started-1").exists()
    assert (markers / "seed_stored-2").exists()
    assert _stamp(fits_dir / "seed_0") == seed0 and _stamp(fits_dir / "seed_1") == seed1
    assert _complete_folders(fits_dir) == SEEDS
    assert not [p.name for p in fits_dir.iterdir() if p.name.startswith(".")], "a temporary folder was left behind"
    _assert_equal_results(results, reference)

    # 5. Once more: nothing is refitted and the numbers are the same.
    report, _ = _finish(_start(data_path, out_dir, results, markers))
    assert report["reused"] == SEEDS
    assert not list(markers.glob("seed_started-*"))
    assert sorted(p.name for p in markers.glob("seed_reused-*")) == [f"seed_reused-{s}" for s in SEEDS]
    _assert_equal_results(results, reference)


def test_same_seed_is_bit_identical_across_processes(tmp_path, data_path, reference):
    """A fresh process (no out_dir) reproduces the test process's latents and log densities exactly."""
    results = tmp_path / "results.npz"
    report, _ = _finish(_start(data_path, "-", results, tmp_path / "markers"))
    assert report["reused"] == []
    _assert_equal_results(results, reference)
    lat = reference["latent_0"]
    assert not np.array_equal(lat, reference["latent_1"]), "different seeds should give different fits"


def test_killed_while_writing_the_report_then_resumed(tmp_path):
    """`countvae diagnose` SIGKILLed mid-report: no report is visible; rerun, it finishes reusing the fits."""
    adata = cv.data.simulate(n_cells=300, n_genes=40, n_latent=2, decoder="linear", sources="laplace", seed=2)
    data = tmp_path / "sim.h5ad"
    adata.write_h5ad(data)
    fast = ["--seeds", "2", "--n-jobs", "1", "--n-latent", "2", "--decoder", "linear", "--max-epochs", "5"]
    fast += ["--n-lpd-samples", "10"]

    def run(out: Path, markers: Path, pause_at: str | None = None) -> subprocess.Popen:
        markers.mkdir(parents=True, exist_ok=True)
        cmd = _seedrun(markers, pause_at, "diagnose", str(data), *fast, "--out", str(out), "--quiet", "--json")
        env = _env(OMP_NUM_THREADS="1")
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)

    reference_out, out, markers = tmp_path / "reference", tmp_path / "diag", tmp_path / "markers"
    _finish_cli(run(reference_out, tmp_path / "markers_reference"))
    # The reference run reported its seeds and its three report files, in the order they were written.
    assert (tmp_path / "markers_reference" / "seed_stored-1").exists()
    for name in ("report.html", "report.json", "report.md"):
        assert (tmp_path / "markers_reference" / f"report_file_written-{name}").exists()

    proc = run(out, markers, pause_at="report_file_written:report.html")
    _wait_for(markers / "report_file_written-report.html", proc)
    _kill(proc)
    assert not (out / "report").exists(), "a half-written report is visible under its final name"
    partial = [p for p in out.iterdir() if p.name.startswith(".report.") and p.name.endswith(".partial")]
    assert len(partial) == 1 and (partial[0] / "report.html").is_file() and not (partial[0] / "report.json").exists()
    assert _complete_folders(out / "fits" / "fits") == [0, 1]

    result = _finish_cli(run(out, markers))
    assert result["reused_seeds"] == [0, 1]
    assert sorted(p.name for p in (out / "report").iterdir()) == ["report.html", "report.json", "report.md"]
    finished = json.loads((out / "report" / "report.json").read_text())
    expected = json.loads((reference_out / "report" / "report.json").read_text())
    assert finished["tables"] == expected["tables"]
    assert finished["headline"] == expected["headline"]
    assert not [p.name for p in out.iterdir() if p.name.startswith(".report.")], "the unfinished report was left behind"


def _finish_cli(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=WAIT_SECONDS)
    assert proc.returncode == 0, f"countvae diagnose failed:\n{out}\n{err}"
    return json.loads(out)
