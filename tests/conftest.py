"""Shared fixtures: small simulated datasets and the real datasets of ../shared/data."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from diagnostics_helpers import SMALL, random_rotation

import countvae as cv
from countvae.data import split_indices
from countvae.diagnostics import CountVAEFit, SeedFits, report
from countvae.errors import DataFileNotFoundError
from countvae.invariance import reparameterize

#: Set by .ci/run: a missing real dataset fails the test instead of skipping it.
REQUIRE_DATA_ENV = "COUNTVAE_REQUIRE_DATA"
#: Set by .ci/run, which installs Chromium: a missing browser fails the rendering tests instead of skipping them.
REQUIRE_BROWSER_ENV = "COUNTVAE_REQUIRE_BROWSER"


def _processor() -> str:
    """The CPU model and torch's CPU kernels: last digits of fits differ between processors and kernels."""
    model = next(
        (line.split(":", 1)[1].strip() for line in _cpuinfo() if line.lower().startswith("model name")), "unknown"
    )
    return f"{model}; torch CPU kernels {torch.backends.cpu.get_cpu_capability()}"


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def pytest_terminal_summary(terminalreporter):
    """Name the processor at the end of the run, where CI's shortened output keeps it."""
    terminalreporter.write_line(f"processor: {_processor()}")


@pytest.fixture(autouse=True)
def _quiet_and_fixed_threads():
    torch.set_num_threads(1)
    logging.getLogger("countvae").setLevel(logging.WARNING)
    yield


def real_dataset(name: str, backed: bool = False):
    """Load a shared dataset; skip (or fail under CI) with a message saying where to put it."""
    try:
        return cv.data.load_dataset(name, backed=backed)
    except DataFileNotFoundError as exc:
        if os.environ.get(REQUIRE_DATA_ENV):
            pytest.fail(f"{REQUIRE_DATA_ENV} is set and a real dataset is missing: {exc}")
        pytest.skip(str(exc))


@pytest.fixture
def private_ray_temp(monkeypatch):
    """A Ray temporary folder of the test's own, removed afterwards (``RAY_TMPDIR`` points at it).

    Without it Ray keeps its sockets, logs and the address of the last cluster started under
    ``/tmp/ray``, shared with every other Ray run on the machine: a cluster started with its own
    ``temp_dir`` still writes that address file there and fails when ``/tmp/ray`` does not exist
    (a fresh machine), and a test could find what an earlier one left. The folder is short (``/tmp/cvray...``):
    Ray's socket paths must stay under 108 characters.
    """
    folder = tempfile.mkdtemp(prefix="cvray", dir="/tmp" if os.path.isdir("/tmp") else None)
    (Path(folder) / "ray").mkdir()
    monkeypatch.setenv("RAY_TMPDIR", folder)
    yield Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def sim_linear():
    """800 cells x 60 genes, NB counts from a 2-d linear model with two batches."""
    return cv.data.simulate(n_cells=800, n_genes=60, n_latent=2, decoder="linear", n_batches=2, seed=3)


@pytest.fixture
def small_adata(sim_linear):
    adata = sim_linear.copy()
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    return adata


@pytest.fixture(scope="session")
def trained_linear(sim_linear):
    """A linear NB model trained briefly (shared; do not mutate)."""
    adata = sim_linear.copy()
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    model = cv.CountVAE(adata, n_latent=2, decoder="linear", likelihood="nb")
    model.train(max_epochs=30, progress_bar=False, seed=0)
    return model


@pytest.fixture(scope="session")
def trained_mlp(sim_linear):
    adata = sim_linear.copy()
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    model = cv.CountVAE(adata, n_latent=2, decoder="mlp", likelihood="zinb", n_hidden=32)
    model.train(max_epochs=20, progress_bar=False, seed=0)
    return model


def assert_close(a, b, atol=0.0, rtol=0.0):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol, rtol=rtol)


# ----- real seeds for the multi-seed report (shared by the report tests) ---------------------------------
@pytest.fixture(scope="session")
def seed_fits():
    """Three seeds of a linear NB model on counts from 3 Laplace sources, with a shared held-out split."""
    adata = cv.data.simulate(
        n_cells=1000, n_genes=60, n_latent=3, decoder="linear", sources="laplace", n_batches=2, seed=11
    )
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    fit_idx, held_idx = split_indices(adata.n_obs, 0.7, 0)
    fit_data, held = adata[fit_idx].copy(), adata[held_idx].copy()
    fits = []
    for seed in (0, 1, 2):
        model = cv.CountVAE(fit_data, n_latent=3, decoder="linear", likelihood="nb")
        model.train(max_epochs=100, batch_size=256, lr=3e-3, early_stopping=False, progress_bar=False, seed=seed)
        fits.append(CountVAEFit(model, seed))
    return SeedFits(fits=fits, adata_fit=fit_data, adata_heldout=held, settings={"note": "test"})


@pytest.fixture(scope="session")
def seed_report(seed_fits):
    return report(seed_fits, **SMALL)


@pytest.fixture(scope="session")
def copies_report(seed_fits):
    """Seed 0 and two exact copies of it in other orthogonal coordinates (real models, known truth)."""
    base = seed_fits[0].model
    fits = [seed_fits[0]] + [CountVAEFit(reparameterize(base, random_rotation(3, k)), k) for k in (1, 2)]
    return report(fits, seed_fits.adata_heldout, adata_fit=seed_fits.adata_fit, **SMALL)
