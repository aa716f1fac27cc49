"""Seeds fitted in joblib worker processes and as Ray tasks give exactly the fits of the in-process run."""

from __future__ import annotations

import logging
import threading
import warnings

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch

import countvae as cv
from countvae.data.file_cells import FileCells
from countvae.data.registry import get_registry
from countvae.diagnostics import fit_seeds
from countvae.diagnostics.fitting import parallelism
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
    # The workers ran with glibc keeping freed memory (countvae._allocator) and still gave the same fits.
    if _allocator_applies():
        assert all(fits.records[s]["freed_memory_kept"] is True for s in (0, 1))


def _allocator_applies() -> bool:
    import ctypes
    import sys

    from countvae import _allocator

    if not sys.platform.startswith("linux") or _allocator._user_tuned_malloc():
        return False
    return hasattr(ctypes.CDLL(None), "gnu_get_libc_version")


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


# ----- n_jobs="auto", the default ------------------------------------------------------------------
DEFAULT_RUN = {**OPTIONS, "seeds": [0, 1, 2]}
DEFAULT_RUN.pop("torch_threads")  # the default thread budget too


@pytest.fixture
def two_cores(monkeypatch):
    """A machine with 2 usable cores, whatever runs the test."""
    monkeypatch.setattr(parallelism, "available_cores", lambda: 2)


@pytest.fixture
def instant_workers(monkeypatch):
    """Workers worth starting for any fit, so that these tiny fits go to worker processes."""
    monkeypatch.setattr(parallelism, "MIN_STEPS_FOR_WORKERS", 0)


def _parameters_and_history(fits):
    return [
        ({k: v.clone() for k, v in fit.model.module.state_dict().items()}, fit.model.history.copy()) for fit in fits
    ]


def test_default_fits_seeds_in_parallel_with_the_numbers_of_a_serial_run(adata, two_cores, instant_workers):
    serial = fit_seeds(adata, n_jobs=1, **DEFAULT_RUN)
    default = fit_seeds(adata, **DEFAULT_RUN)
    assert serial.settings["n_jobs"] == 1
    assert default.settings["n_jobs"] == 2, "the default should use both cores"
    assert default.settings["parallelism"] == "2 seeds at a time, 1 torch thread each"
    for (state_a, history_a), (state_b, history_b) in zip(
        _parameters_and_history(serial), _parameters_and_history(default), strict=True
    ):
        assert state_a.keys() == state_b.keys()
        for name in state_a:
            assert torch.equal(state_a[name], state_b[name]), name
        pd.testing.assert_frame_equal(history_a, history_b, check_exact=True)


def test_auto_takes_the_seeds_left_and_the_thread_budget(adata, two_cores):
    data = adata[:10].copy()
    assert parallelism.plan_parallelism("auto", 5, data, 1).n_jobs == 2
    assert parallelism.plan_parallelism("auto", 1, data, 1).n_jobs == 1
    assert parallelism.plan_parallelism("auto", 5, data, 2).n_jobs == 1  # 2 cores / 2 threads per fit
    assert parallelism.plan_parallelism(-1, 5, data, 1).n_jobs == 2
    assert parallelism.plan_parallelism(4, 3, data, 1).n_jobs == 3
    assert parallelism.plan_parallelism(-1, 5, data, 1, backend="ray").n_jobs == 5


def test_steps_per_seed_counts_epochs_times_minibatches():
    assert parallelism.steps_per_seed(1000, {"max_epochs": 10, "batch_size": 128}) == 10 * 8  # 1000/128 -> 8
    assert parallelism.steps_per_seed(1024, {"max_epochs": 10, "batch_size": 128}) == 10 * 8
    assert parallelism.steps_per_seed(1000, {}) == 400 * 8  # scvi-tools' epochs for 1,000 cells, 128 per batch
    assert parallelism.steps_per_seed(40_000, {"max_epochs": None, "batch_size": 256}) == 200 * 157


def test_auto_fits_in_process_when_the_seeds_end_before_workers_would_start(adata, two_cores):
    data = adata[:10].copy()  # one minibatch per epoch: the steps are the epochs
    few = {"max_epochs": parallelism.MIN_STEPS_FOR_WORKERS - 1}
    plan = parallelism.plan_parallelism("auto", 5, data, 1, train_kwargs=few)
    assert plan.n_jobs == 1 and "minibatch steps per seed" in plan.reason
    enough = {"max_epochs": parallelism.MIN_STEPS_FOR_WORKERS}
    assert parallelism.plan_parallelism("auto", 5, data, 1, train_kwargs=enough).n_jobs == 2
    assert parallelism.plan_parallelism(2, 5, data, 1, train_kwargs=few).n_jobs == 2, "an explicit n_jobs is obeyed"
    assert parallelism.plan_parallelism(-1, 5, data, 1, train_kwargs=few).n_jobs == 2


def test_one_seed_at_a_time_is_said_once_with_its_reason(adata, two_cores, caplog):
    # It was logged twice in one run: as planned ("Fitting one seed at a time: ..."), then as fitted.
    with caplog.at_level(logging.INFO, logger="countvae"):
        fits = fit_seeds(adata, **DEFAULT_RUN)  # 3 epochs x 3 minibatches per seed
    assert fits.settings["n_jobs"] == 1
    assert fits.settings["parallelism"] == "1 seed at a time, 1 torch thread each"
    said = [r.getMessage() for r in caplog.records if "at a time" in r.getMessage()]
    assert said == [
        "Fitting 3 seeds: 1 seed at a time, 1 torch thread each "
        "(9 minibatch steps per seed end sooner than worker processes would start)."
    ]


def test_the_seeds_are_counted_in_words_in_the_log(adata, two_cores, monkeypatch, caplog, tmp_path):
    """The fits' messages and the plan's reason said "1 seed(s)"; they say "1 seed" and "2 seeds"."""
    monkeypatch.setattr(parallelism, "available_cores", lambda: 3)
    per_worker = parallelism.worker_memory_estimate(adata)
    for n, seeds in ((1, "1 seed"), (2, "2 seeds")):
        room = (n + 0.5) * per_worker / parallelism.MEMORY_SHARE  # room for n workers, of the 3 asked for below
        monkeypatch.setattr(parallelism, "available_memory_bytes", lambda room=room: int(room))
        assert parallelism.plan_parallelism("auto", n, adata, 1).reason == f"{seeds} left to fit"
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="countvae"):
            parallelism.plan_parallelism(3, 5, adata, 1)
        assert caplog.records[0].getMessage().startswith(f"Fitting {seeds} at a time instead of 3: ")
    said = []
    for run in ([0, 1], [0, 1, 2]):  # 2 seeds, then the third alone, reusing them
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="countvae"):
            fit_seeds(adata, **{**OPTIONS, "seeds": run, "n_jobs": 1, "out_dir": tmp_path / "fits"})
        said += [r.getMessage() for r in caplog.records if r.getMessage().startswith("Fitting ")]
    each = "1 seed at a time, 1 torch thread each (n_jobs as given)."
    assert said == [f"Fitting 2 seeds: {each}", f"Fitting 1 seed: {each}"]


def test_auto_falls_back_to_one_seed_at_a_time_for_an_unpicklable_progress(adata, two_cores, caplog):
    lock = threading.Lock()

    def progress(event):
        with lock:
            pass

    with caplog.at_level(logging.INFO, logger="countvae"):
        fits = fit_seeds(adata, progress=progress, **OPTIONS)
    assert fits.settings["n_jobs"] == 1
    assert any("cannot be copied into worker processes" in r.getMessage() for r in caplog.records)


def test_fewer_workers_when_their_copies_exceed_the_available_memory(adata, two_cores, monkeypatch, caplog):
    data = adata[:10].copy()
    per_worker = parallelism.worker_memory_estimate(data)
    # Room for 1.5 workers within the share the workers may take: one seed at a time.
    monkeypatch.setattr(parallelism, "available_memory_bytes", lambda: int(1.5 * per_worker / parallelism.MEMORY_SHARE))
    with caplog.at_level(logging.WARNING, logger="countvae.diagnostics.fitting.parallelism"):
        plan = parallelism.plan_parallelism("auto", 5, data, 1)
    assert plan.n_jobs == 1 and plan.reason.startswith("memory:")
    assert any("a smaller n_jobs" in r.getMessage() for r in caplog.records)
    monkeypatch.setattr(parallelism, "available_memory_bytes", lambda: int(2.5 * per_worker / parallelism.MEMORY_SHARE))
    assert parallelism.plan_parallelism(2, 5, data, 1).n_jobs == 2


def _memory_warning(data, monkeypatch, caplog, base: int) -> str:
    monkeypatch.setattr(parallelism, "WORKER_BASE_BYTES", base)
    per_worker = parallelism.worker_memory_estimate(data)
    monkeypatch.setattr(parallelism, "available_memory_bytes", lambda: int(1.5 * per_worker / parallelism.MEMORY_SHARE))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="countvae.diagnostics.fitting.parallelism"):
        assert parallelism.plan_parallelism(2, 5, data, 1).n_jobs == 1
    (record,) = caplog.records
    return record.getMessage()


def test_memory_warning_splits_the_worker_base_from_the_copy_and_advises_backed_data_only_where_it_helps(
    adata, monkeypatch, caplog
):
    data = adata[:100].copy()
    copy = 2 * parallelism.counts_nbytes(data)
    # the fixed base dominates: a backed file would spare little, so fewer workers is the remedy
    message = _memory_warning(data, monkeypatch, caplog, 10 * copy)
    assert f"{10 * copy / 1024**3:.2f} GiB for torch and the model, {copy / 1024**3:.2f} GiB for its copy" in message
    assert "backed" not in message and "Pass a smaller n_jobs" in message
    # the counts' copy dominates: from Python a backed file spares it
    message = _memory_warning(data, monkeypatch, caplog, copy // 10)
    assert "anndata.read_h5ad(path, backed='r')" in message
    # where no backed file can be used (the command line, diagnose after gene selection): fewer workers
    with parallelism.backed_remedy_off():
        message = _memory_warning(data, monkeypatch, caplog, copy // 10)
    assert "backed" not in message and "Pass a smaller n_jobs" in message


def test_worker_memory_grows_with_the_in_memory_counts_only(adata, tmp_path):
    data = adata[:100].copy()
    data.X = sp.csr_matrix(data.X)
    matrix = data.X
    expected = matrix.data.nbytes + matrix.indices.nbytes + matrix.indptr.nbytes
    assert parallelism.counts_nbytes(data) == expected
    assert parallelism.worker_memory_estimate(data) == parallelism.WORKER_BASE_BYTES + 2 * expected
    path = tmp_path / "cells.h5ad"
    data.write_h5ad(path)
    backed = ad.read_h5ad(path, backed="r")
    assert parallelism.counts_nbytes(FileCells.of(backed, np.arange(10), get_registry(backed))) == 0


def test_workers_reading_a_file_hold_its_layers_whole_and_are_not_told_to_open_it_backed(
    adata, tmp_path, monkeypatch, caplog
):
    """anndata's backed mode keeps X on disk but reads every layer whole, whichever cells a worker fits. Known answer:
    10 of a file's 100 cells, counts in a CSR layer, cost each worker the whole layer BACKED_LAYER_FACTOR (2) times, as
    measured (its data, indices and indptr bytes in the file). A worker that already reads a file is told to pass a
    smaller n_jobs, not to open the data backed, however large its counts."""
    data = adata[:100].copy()
    data.layers["counts"] = sp.csr_matrix(data.X)
    data.X = np.zeros(data.shape, dtype=np.float32)  # what the layer's counts were normalized into
    cv.CountVAE.setup_anndata(data, layer="counts", batch_key="batch")
    layer = data.layers["counts"]
    layer_bytes = layer.data.nbytes + layer.indices.nbytes + layer.indptr.nbytes
    path = tmp_path / "cells.h5ad"
    data.write_h5ad(path)
    backed = ad.read_h5ad(path, backed="r")
    cells = FileCells.of(backed, np.arange(10), get_registry(backed))
    assert parallelism.counts_nbytes(cells) == layer_bytes
    assert parallelism.worker_memory_estimate(cells) == parallelism.WORKER_BASE_BYTES + 2 * layer_bytes
    message = _memory_warning(cells, monkeypatch, caplog, 16)
    assert "GiB for the file's layers, read whole)" in message
    assert "backed" not in message and "Pass a smaller n_jobs" in message


def test_a_normalized_x_beside_counts_in_a_layer_is_not_counted_and_a_backed_file_is_never_advised_for_it(
    adata, tmp_path, monkeypatch, caplog
):
    """scanpy's layout, counts in a layer and a dense normalized X. Workers were measured to hold the layer's copy, not
    X, in memory, and the file's layer about twice when reading it backed, always more (benchmarks/RESULTS.md,
    worker-memory-layer). Known answer: in memory COPY_FACTOR x the layer, backed 2 x the whole layer, so a backed file
    spares nothing (negative) and the remedy is fewer workers however short memory is; with the counts in X beside the
    an (empty) layer, the advice names the saving, COPY_FACTOR x X less the layer read whole twice."""
    data = adata[:100].copy()
    data.layers["counts"] = sp.csr_matrix(data.X)
    data.X = np.full(data.shape, 0.5, dtype=np.float32)
    cv.CountVAE.setup_anndata(data, layer="counts", batch_key="batch")
    layer = data.layers["counts"]
    layer_bytes = layer.data.nbytes + layer.indices.nbytes + layer.indptr.nbytes
    assert parallelism.counts_nbytes(data) == layer_bytes
    assert parallelism.worker_memory_estimate(data) == parallelism.WORKER_BASE_BYTES + 2 * layer_bytes
    data.write_h5ad(tmp_path / "cells.h5ad")
    backed = ad.read_h5ad(tmp_path / "cells.h5ad", backed="r")
    cells = FileCells.of(backed, np.arange(100), get_registry(backed))
    assert parallelism.worker_memory_estimate(cells) == parallelism.WORKER_BASE_BYTES + 2 * layer_bytes
    assert parallelism._backed_spares(data) == 0
    for base in (2 * layer_bytes, layer_bytes // 2, 16):
        message = _memory_warning(data, monkeypatch, caplog, base)
        assert f"{2 * layer_bytes / 1024**3:.2f} GiB for its copy of the data)" in message
        assert "backed" not in message and "Pass a smaller n_jobs" in message
    data.X = data.layers["counts"].toarray()
    data.layers["counts"] = sp.csr_matrix(data.shape, dtype=np.float32)  # an empty layer: its indptr alone
    cv.CountVAE.setup_anndata(data, batch_key="batch")
    spared = 2 * data.X.nbytes - 2 * data.layers["counts"].indptr.nbytes
    assert parallelism._backed_spares(data) == spared > 0
    message = _memory_warning(data, monkeypatch, caplog, 16)
    assert "Open the data backed (anndata.read_h5ad(path, backed='r')) so that workers read it from the file" in message
    assert (
        f"sparing about {spared / 1024**3:.2f} GiB per worker ({2 * spared / 1024**3:.1f} GiB for 2 workers)" in message
    )


@pytest.mark.parametrize("bad", [0, -2, 1.5, "all", True, None])
def test_n_jobs_is_checked(adata, bad):
    with pytest.raises(InvalidArgumentError, match="n_jobs must be 'auto'"):
        fit_seeds(adata, n_jobs=bad, **OPTIONS)


def test_workers_fit_under_the_callers_warning_filters(monkeypatch):
    # A worker starts with Python's default filters; the wrapper every worker runs installs the caller's.
    from countvae.diagnostics.fitting import backends

    def warning_fit(task, fit_data):
        warnings.warn("lightning says hello", UserWarning, stacklevel=1)
        return "outcome"

    class LocalWarning(UserWarning):  # defined in a function: cannot be pickled to a worker
        pass

    monkeypatch.setattr(backends, "run_fit", warning_fit)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message="lightning says")
        warnings.filterwarnings("ignore", category=LocalWarning)
        filters = backends.caller_warning_filters()
    assert all(entry[2] is not LocalWarning for entry in filters)
    assert any(entry[0] == "ignore" and entry[1] is not None and entry[1].match("lightning says") for entry in filters)

    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        before = list(warnings.filters)
        assert backends._run_fit_with_filters(None, None, filters) == "outcome"
        assert not shown, "the caller's 'ignore' filter did not reach the fit"
        assert warnings.filters == before, "the worker's own filters were not restored after the fit"
        backends._run_fit_with_filters(None, None, [("always", None, Warning, None, 0)])
        assert [str(w.message) for w in shown] == ["lightning says hello"]


def test_seconds_and_records_are_in_seed_order_whatever_order_the_fits_finish_in(adata, monkeypatch):
    from countvae.diagnostics.fitting import fit_seeds as fit_seeds_module

    real = fit_seeds_module.run_tasks

    def finishing_backwards(*args, **kwargs):
        yield from reversed(list(real(*args, **kwargs)))

    monkeypatch.setattr(fit_seeds_module, "run_tasks", finishing_backwards)
    fits = fit_seeds(adata, n_jobs=1, **{**OPTIONS, "seeds": [0, 1, 2]})
    assert list(fits.seconds) == [0, 1, 2]
    assert list(fits.records) == [0, 1, 2]
    assert [fit.seed for fit in fits] == [0, 1, 2]


def test_models_fitted_in_one_pool_are_the_fits_of_separate_runs(
    adata, in_process, two_cores, instant_workers, tmp_path
):
    from countvae.diagnostics.fitting.fit_seeds import FitSeedsSettings, fit_models

    other = {**OPTIONS, "model_kwargs": {"n_latent": 3, "n_hidden": 16}}
    runs = [
        FitSeedsSettings(**OPTIONS, out_dir=tmp_path / "a"),
        FitSeedsSettings(**other, out_dir=tmp_path / "b"),
    ]
    pooled = fit_models(adata, runs)
    assert [f.settings["n_jobs"] for f in pooled] == [2, 2]  # 4 fits of two models shared both workers
    _assert_same_fits(pooled[0], in_process)
    _assert_same_fits(pooled[1], fit_seeds(adata, **other))
    # each model resumes from its own folder, as fit_seeds does
    again = fit_models(adata, runs)
    assert [f.reused_seeds for f in again] == [[0, 1], [0, 1]]
    _assert_same_fits(again[1], pooled[1])


def test_models_in_one_pool_must_share_the_split_and_have_their_own_folders(adata, tmp_path):
    from countvae.diagnostics.fitting.fit_seeds import FitSeedsSettings, fit_models

    with pytest.raises(InvalidArgumentError, match="these differ: \\['heldout_fraction'\\]"):
        fit_models(adata, [FitSeedsSettings(**OPTIONS), FitSeedsSettings(**OPTIONS, heldout_fraction=0.2)])
    shared = tmp_path / "same"
    with pytest.raises(InvalidArgumentError, match="two of them share one"):
        fit_models(adata, [FitSeedsSettings(**OPTIONS, out_dir=shared), FitSeedsSettings(**OPTIONS, out_dir=shared)])
    with pytest.raises(InvalidArgumentError, match="at least one model"):
        fit_models(adata, [])


def test_memory_plan_is_the_share_of_available_memory_over_each_workers_need(adata, monkeypatch):
    """Known answers with a worker needing 1,000 bytes: the workers may take 80% of what is available.

    4 cores and 4 seeds asked; 3,000 bytes available -> 2,400 for the workers -> floor(2.4) = 2 at once;
    exactly 4,000 * 0.8 / 4 = 1,000 per worker fits 3 at 3,750 bytes (3,000 <= 3,000: the boundary keeps them).
    """
    data = adata[:10].copy()
    monkeypatch.setattr(parallelism, "available_cores", lambda: 4)
    monkeypatch.setattr(parallelism, "worker_memory_estimate", lambda _: 1000)
    monkeypatch.setattr(parallelism, "available_memory_bytes", lambda: 3000)
    assert parallelism.plan_parallelism("auto", 4, data, 1).n_jobs == 2
    assert parallelism.plan_parallelism(3, 4, data, 1).n_jobs == 2
    monkeypatch.setattr(parallelism, "available_memory_bytes", lambda: 3750)  # 0.8 * 3750 = 3000 exactly
    at_boundary = parallelism.plan_parallelism(3, 4, data, 1)
    assert (at_boundary.n_jobs, at_boundary.reason) == (3, "n_jobs as given")  # no memory warning at equality
    monkeypatch.setattr(parallelism, "available_memory_bytes", lambda: 2400)  # 1,920 for the workers: 1 at a time
    assert parallelism.plan_parallelism(4, 4, data, 1).n_jobs == 1
    # Ray tasks may run on other machines: no memory estimate applies, an explicit n_jobs is kept
    assert parallelism.plan_parallelism(3, 4, data, 1, backend="ray").n_jobs == 3
    monkeypatch.setattr(parallelism, "available_memory_bytes", lambda: None)  # unknown memory: no reduction
    assert parallelism.plan_parallelism(4, 4, data, 1).n_jobs == 4


def test_only_the_registered_counts_are_part_of_each_workers_copy(adata):
    """A worker reads only the registered counts; X, the other layers and raw.X beside them were counted, and a
    normalized X was measured to cost it nothing (WORKER_BASE_BYTES). Known answer: the registered matrix's bytes."""
    data = adata[:20].copy()
    X = np.asarray(data.X.toarray() if sp.issparse(data.X) else data.X, dtype=np.float32)
    data.X = X
    data.layers["counts"] = X.astype(np.float64)
    data.raw = data.copy()
    assert parallelism.counts_nbytes(data) == X.nbytes  # registered in X
    cv.CountVAE.setup_anndata(data, layer="counts")
    assert parallelism.counts_nbytes(data) == 2 * X.nbytes  # the float64 layer
