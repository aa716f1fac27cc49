"""The report's held-out log p(x) in worker processes: the same numbers as in the calling process, on fixed threads."""

from __future__ import annotations

import threading
import warnings

import pandas as pd
import pytest
import torch

import countvae as cv
from countvae.data.split import split_indices
from countvae.diagnostics import CountVAEFit
from countvae.diagnostics.fitting.lpd_quantity import QUANTITY_ATTR
from countvae.diagnostics.reporting import heldout_lpd as lpd_module
from countvae.diagnostics.reporting.collect import heldout_lpd
from countvae.diagnostics.reporting.settings import ReportSettings
from countvae.errors import InvalidArgumentError


@pytest.fixture(scope="module")
def mlp_fits():
    adata = cv.data.simulate(n_cells=300, n_genes=40, n_latent=2, decoder="mlp", n_batches=2, seed=3)
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    fit_idx, held_idx = split_indices(adata.n_obs, 0.8, 0)
    fit_data, held = adata[fit_idx].copy(), adata[held_idx].copy()
    fits = []
    for seed in (0, 1, 2):
        model = cv.CountVAE(fit_data, n_latent=2, n_hidden=16)
        model.train(max_epochs=3, progress_bar=False, seed=seed)
        fits.append(CountVAEFit(model, seed))
    return fits, held[:30].copy()


def test_workers_give_the_same_frames_as_the_calling_process(mlp_fits):
    fits, cells = mlp_fits
    settings = ReportSettings(n_lpd_samples=20, lpd_jobs=1)
    serial = heldout_lpd(fits, cells, settings)
    threads = torch.get_num_threads()
    parallel = heldout_lpd(fits, cells, settings.replace(lpd_jobs=2))
    assert torch.get_num_threads() == threads
    assert len(parallel) == len(fits)
    for one, other in zip(serial, parallel, strict=True):
        pd.testing.assert_frame_equal(one, other, check_exact=True)
        assert other.attrs[QUANTITY_ATTR] == one.attrs[QUANTITY_ATTR]
    assert not serial[0].lpd.equals(serial[1].lpd)  # the fits differ, and each frame is its own fit's


class _WarningFit:
    """Stands in for a fit whose estimator warns (only what heldout_lpd calls)."""

    def log_predictive_density(self, adata, n_samples, seed):
        warnings.warn(f"unreliable cells ({n_samples}, {seed})", UserWarning, stacklevel=1)
        return pd.DataFrame({"lpd": [float(seed)]})


def test_warnings_raised_in_workers_reach_the_caller():
    settings = ReportSettings(n_lpd_samples=7, seed=3, lpd_jobs=2)
    with pytest.warns(UserWarning, match=r"unreliable cells \(7, 3\)") as caught:
        frames = heldout_lpd([_WarningFit(), _WarningFit()], None, settings)
    assert len([w for w in caught if "unreliable cells" in str(w.message)]) == 2
    assert [float(f.lpd[0]) for f in frames] == [3.0, 3.0]


class _UnpicklableFit(_WarningFit):
    """A fit that cannot be sent to a worker (as a model bound to an open file)."""

    def __init__(self):
        self.lock = threading.Lock()


def test_fits_that_cannot_be_pickled_are_estimated_in_the_calling_process():
    settings = ReportSettings(n_lpd_samples=7, seed=5, lpd_jobs=2)
    with pytest.warns(UserWarning, match="unreliable cells"):
        frames = heldout_lpd([_UnpicklableFit(), _UnpicklableFit()], None, settings)
    assert [float(f.lpd[0]) for f in frames] == [5.0, 5.0]


def test_lpd_jobs_is_validated():
    with pytest.raises(InvalidArgumentError, match="lpd_jobs"):
        ReportSettings().replace(lpd_jobs=0)
    with pytest.raises(InvalidArgumentError, match="lpd_jobs"):
        ReportSettings().replace(lpd_jobs="two")
    with pytest.raises(InvalidArgumentError, match="lpd_threads"):
        ReportSettings().replace(lpd_threads=0)
    assert ReportSettings().lpd_jobs == "auto" and ReportSettings().lpd_threads == 1


class _ThreadSpyFit(_WarningFit):
    """Records the torch thread count its estimate runs on."""

    def log_predictive_density(self, adata, n_samples, seed):
        return pd.DataFrame({"lpd": [float(torch.get_num_threads())]})


def test_every_estimate_runs_on_lpd_threads_whatever_the_callers_threads():
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        for settings, expected in ((ReportSettings(lpd_jobs=1), 1.0), (ReportSettings(lpd_jobs=1, lpd_threads=3), 3.0)):
            frames = heldout_lpd([_ThreadSpyFit(), _ThreadSpyFit()], None, settings)
            assert [float(f.lpd[0]) for f in frames] == [expected, expected]
            assert torch.get_num_threads() == 2
        frames = heldout_lpd([_ThreadSpyFit(), _ThreadSpyFit()], None, ReportSettings(lpd_jobs=2))
        assert [float(f.lpd[0]) for f in frames] == [1.0, 1.0]  # in the workers too
    finally:
        torch.set_num_threads(previous)


def test_auto_sends_the_fits_left_to_workers_only_when_that_repays_their_start():
    start = lpd_module.WORKER_START_SECONDS
    # 4 fits left after a 0.5 s first estimate on 2 cores save 1 s in 2 workers: not worth their start
    assert lpd_module.auto_workers(0.5, 4, 2) == 1
    assert lpd_module.auto_workers(6.6, 4, 2) == 2  # Kang: saves 13 s
    assert lpd_module.auto_workers(start, 4, 8) == 4  # one worker per fit left, never more
    assert lpd_module.auto_workers(1000.0, 1, 8) == 1  # one fit left: nothing to share
    assert lpd_module.auto_workers(1000.0, 4, 1) == 1  # one core


def test_auto_with_workers_gives_the_numbers_of_one_process(mlp_fits, monkeypatch):
    fits, cells = mlp_fits
    serial = heldout_lpd(fits, cells, ReportSettings(n_lpd_samples=20, lpd_jobs=1))
    monkeypatch.setattr(lpd_module, "WORKER_START_SECONDS", 0.0)
    monkeypatch.setattr(lpd_module, "available_cores", lambda: 2)
    calls = []
    original = lpd_module._in_workers
    monkeypatch.setattr(lpd_module, "_in_workers", lambda f, c, s, jobs: calls.append(jobs) or original(f, c, s, jobs))
    auto = heldout_lpd(fits, cells, ReportSettings(n_lpd_samples=20))
    assert calls == [2]  # the first fit here, the other two in two workers
    for one, other in zip(serial, auto, strict=True):
        pd.testing.assert_frame_equal(one, other, check_exact=True)
