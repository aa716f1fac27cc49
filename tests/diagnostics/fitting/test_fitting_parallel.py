"""Seeds fitted in joblib worker processes and as Ray tasks give exactly the fits of the in-process run."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import countvae as cv
from countvae.diagnostics import fit_seeds
from countvae.diagnostics.fitting.progress import SEED_STORED, SEED_WRITTEN
from countvae.errors import InvalidArgumentError

OPTIONS = {
    "seeds": [0, 1],
    "model_kwargs": {"n_latent": 2, "n_hidden": 16},
    "train_kwargs": {"max_epochs": 3, "batch_size": 64},
    "torch_threads": 1,
    "progress_bar": False,
}


@pytest.fixture(autouse=True)
def _one_thread():
    # One torch thread: on a shared 2-core machine two threads can be 15x slower (spin-waiting).
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def adata():
    adata = cv.data.simulate(n_cells=160, n_genes=25, n_latent=2, n_batches=2, seed=2)
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    return adata


@pytest.fixture(scope="module")
def in_process(adata):
    return fit_seeds(adata, **OPTIONS)


def _assert_same_fits(fits, reference):
    assert fits.seeds == reference.seeds
    for a, b in zip(fits, reference, strict=True):
        np.testing.assert_array_equal(a.latent(fits.adata_heldout), b.latent(reference.adata_heldout))
        np.testing.assert_array_equal(
            a.log_predictive_density(fits.adata_heldout, 10, 0).to_numpy(),
            b.log_predictive_density(reference.adata_heldout, 10, 0).to_numpy(),
        )


def test_joblib_processes_match_in_process(adata, in_process, tmp_path):
    events = []
    fits = fit_seeds(adata, n_jobs=2, out_dir=tmp_path, progress=events.append, **OPTIONS)
    _assert_same_fits(fits, in_process)
    # Started and trained happen in the workers, on copies of `progress`; this process sees the storing.
    assert sorted((e.seed, e.kind) for e in events) == [
        (s, kind) for s in (0, 1) for kind in sorted([SEED_STORED, SEED_WRITTEN])
    ]
    assert sorted(p.name for p in (tmp_path / "fits").iterdir()) == ["seed_0", "seed_1"]
    assert fits.settings["n_jobs"] == 2 and all(fits.seconds[s] > 0 for s in (0, 1))


def test_ray_tasks_match_local(adata, in_process, tmp_path, private_ray_temp):
    import ray  # the [ray] extra is part of [dev]

    fits = fit_seeds(adata, backend="ray", n_jobs=2, out_dir=tmp_path, **OPTIONS)
    assert not ray.is_initialized(), "the local Ray instance started by fit_seeds should be shut down"
    assert (private_ray_temp / "ray").is_dir(), "the local Ray instance should have used the test's own folder"
    _assert_same_fits(fits, in_process)
    # The folder is resumable whichever backend wrote it.
    again = fit_seeds(adata, out_dir=tmp_path, **OPTIONS)
    assert again.reused_seeds == [0, 1]


def test_progress_for_workers_must_be_picklable(adata):
    lock = threading.Lock()  # a lock cannot be copied into another process

    def progress(event):
        with lock:
            pass

    with pytest.raises(InvalidArgumentError, match="picklable"):
        fit_seeds(adata, n_jobs=2, progress=progress, **OPTIONS)
