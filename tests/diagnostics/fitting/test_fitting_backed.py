"""Seeds fitted from a backed .h5ad: workers open the file by path, read minibatches from disk, and agree exactly.

The Ray test starts a real two-node Ray cluster on the loopback address (a head node and
a second node, one CPU each, as separate raylet processes; see tests/raycluster.py), fits
two seeds at once on it from a backed file, and shuts it down, also when the run fails.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import anndata as ad
import cloudpickle
import numpy as np
import pytest
import scipy.sparse as sp
import torch

import countvae as cv
from countvae.data.backed import BackedRows
from countvae.data.file_cells import FileCells
from countvae.data.registry import get_count_matrix, get_registry
from countvae.diagnostics import fit_seeds, load_seed_fits
from countvae.errors import InvalidDataError

MODEL = {"n_latent": 2, "n_hidden": 16}
#: Block shuffling with the same block size for in-memory and backed cells, so both visit cells in the same order.
TRAIN = {"max_epochs": 3, "batch_size": 32, "shuffle_block_cells": 16}
OPTIONS = {"seeds": [0, 1], "model_kwargs": MODEL, "train_kwargs": TRAIN, "torch_threads": 1, "progress_bar": False}
ROOT = Path(__file__).resolve().parents[3]
#: Generous: the whole run (start two nodes, fit two seeds, stop) takes minutes only on a heavily loaded machine.
RAY_TIMEOUT_S = 900


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def h5ad_path(tmp_path_factory) -> Path:
    adata = cv.data.simulate(n_cells=400, n_genes=30, n_latent=2, n_batches=2, seed=4)
    adata.X = sp.csr_matrix(adata.X, dtype=np.float32)
    path = tmp_path_factory.mktemp("backed") / "cells.h5ad"
    adata.write_h5ad(path)
    return path


def _backed(path: Path) -> ad.AnnData:
    adata = ad.read_h5ad(path, backed="r")
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    return adata


def _in_memory(path: Path) -> ad.AnnData:
    adata = ad.read_h5ad(path)
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    return adata


@pytest.fixture(scope="module")
def local_backed_fits(h5ad_path):
    return fit_seeds(_backed(h5ad_path), **OPTIONS)


def _same_fits(fits, reference) -> None:
    assert fits.seeds == reference.seeds
    for a, b in zip(fits, reference, strict=True):
        np.testing.assert_array_equal(a.latent(fits.adata_heldout), b.latent(reference.adata_heldout))
        np.testing.assert_array_equal(a.model.history.to_numpy(), b.model.history.to_numpy())


def test_a_backed_view_reads_its_rows_from_the_file(h5ad_path):
    backed, memory = _backed(h5ad_path), _in_memory(h5ad_path)
    rows = np.sort(np.random.default_rng(0).choice(400, 250, replace=False))
    counts = get_count_matrix(backed[rows], get_registry(backed))
    assert isinstance(counts, BackedRows) and counts.shape == (250, 30)
    expected = memory.X[rows].toarray()
    np.testing.assert_array_equal(counts[0:250].toarray(), expected)
    np.testing.assert_array_equal(counts[17:121].toarray(), expected[17:121])
    assert counts[5:5].shape[0] == 0


def test_a_backed_view_of_chosen_genes_reads_them_in_its_order(h5ad_path):
    # A view's genes, reversed and a third left out: the reader must apply the view's columns, not the file's, and
    # so must the worker that reopens the file from FileCells.
    backed, memory = _backed(h5ad_path), _in_memory(h5ad_path)
    rows, genes = np.arange(0, 400, 3), list(memory.var_names[::-1][:20])
    view = backed[rows, genes]
    counts = get_count_matrix(view, get_registry(backed))
    assert isinstance(counts, BackedRows) and counts.shape == (len(rows), 20)
    np.testing.assert_array_equal(counts[0 : len(rows)].toarray(), memory[rows, genes].X.toarray())
    assert counts[4:4].shape == (0, 20)
    opened = FileCells.of(view, np.arange(10), get_registry(backed)).open()
    assert list(opened.var_names) == genes
    np.testing.assert_array_equal(
        get_count_matrix(opened, get_registry(backed))[0:10].toarray(), counts[0:10].toarray()
    )
    opened.file.close()
    fitted = [
        cv.CountVAE(cells, **MODEL).train(seed=0, progress_bar=False, **TRAIN)
        for cells in (view, memory[rows, genes].copy())
    ]
    np.testing.assert_array_equal(fitted[0].get_latent_representation(), fitted[1].get_latent_representation())


def test_backed_fits_stream_and_equal_in_memory_fits(h5ad_path, local_backed_fits):
    fits = local_backed_fits
    for fit in fits:  # each model holds a view of the file, not a copy of the counts
        assert fit.model.adata.isbacked
        assert isinstance(get_count_matrix(fit.model.adata, fit.model.registry), BackedRows)
    assert fits.settings["fit_cells"] == "read from the backed file by each fit"
    # Same cells, same order of visits: identical numbers to fits on the same cells in memory.
    _same_fits(fits, fit_seeds(_in_memory(h5ad_path), **OPTIONS))


def test_joblib_workers_open_the_file_themselves(h5ad_path, local_backed_fits, tmp_path):
    fits = fit_seeds(_backed(h5ad_path), n_jobs=2, out_dir=tmp_path, **OPTIONS)
    _same_fits(fits, local_backed_fits)
    _same_fits(load_seed_fits(tmp_path, _backed(h5ad_path)), local_backed_fits)


def test_file_cells_carry_the_path_not_the_counts(h5ad_path):
    backed = _backed(h5ad_path)
    positions = np.arange(0, 400, 2)
    cells = FileCells.of(backed, positions, get_registry(backed))
    # what a worker receives grows with the number of cells (their positions), not with the counts
    assert len(cloudpickle.dumps(cells)) < 8 * len(positions) + 4_000
    opened = cells.open()
    np.testing.assert_array_equal(opened.obs_names, backed.obs_names[positions])
    assert get_registry(opened) == get_registry(backed)
    opened.file.close()


def test_a_changed_file_is_refused(h5ad_path, tmp_path):
    copy = tmp_path / "copy.h5ad"
    shutil.copy(h5ad_path, copy)
    backed = _backed(copy)
    cells = FileCells.of(backed, np.arange(10), get_registry(backed))
    backed.file.close()
    os.utime(copy, ns=(0, 0))
    with pytest.raises(InvalidDataError, match="has changed"):
        cells.open()
    copy.unlink()
    with pytest.raises(InvalidDataError, match="cannot be opened"):
        cells.open()


def test_ray_cluster_fits_from_the_backed_file(h5ad_path, local_backed_fits, tmp_path, private_ray_temp):
    pytest.importorskip("ray")  # the [ray] extra is part of [dev]
    out_dir = tmp_path / "fits"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    options = {k: v for k, v in OPTIONS.items()} | {"n_jobs": 2}
    command = [sys.executable, str(ROOT / "tests" / "raycluster.py"), str(h5ad_path), str(out_dir), json.dumps(options)]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=RAY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the cluster's processes die with their reaper
        proc.communicate()
        pytest.fail(f"the Ray cluster run took more than {RAY_TIMEOUT_S} s")
    assert proc.returncode == 0, stderr[-3000:]
    nodes = set(json.loads(stdout.strip().splitlines()[-1]))
    assert len(nodes) == 2
    fits = load_seed_fits(out_dir, _backed(h5ad_path))
    _same_fits(fits, local_backed_fits)
    # The two seeds ran at once, one per node: each node has one CPU and each task asks for one.
    assert {fits.records[s]["ray_node"] for s in fits.seeds} == nodes
    assert all(fits.records[s]["peak_rss_mib"] > 0 for s in fits.seeds)


def test_diagnose_on_a_backed_file_reports_as_in_memory_and_leaves_the_file_open(h5ad_path):
    """The main call on a backed AnnData: the same report as on the data in memory, and the caller's file still open.

    Reading cells into memory (anndata's ``to_memory``) closed the caller's file, so a second call failed; the report
    then indexed the streamed fit cells, a view of the backed file, which anndata cannot index again. With fewer
    ``max_fit_cells`` than fit cells, the k-NN row reads every fit cell's latent means from that view, 100 at a time.
    """
    from countvae.diagnostics import diagnose

    options = {
        "seeds": 2,
        "n_jobs": 1,
        "model_kwargs": MODEL,
        "train_kwargs": TRAIN,
        "report_kwargs": {"ica": False, "n_lpd_samples": 10, "max_fit_cells": 100},
    }
    backed = _backed(h5ad_path)
    on_disk = diagnose(backed, **options)
    assert backed.file.is_open
    in_memory = diagnose(_in_memory(h5ad_path), **options)
    for name in ("invariants", "alignment"):
        numbers = [rep.tables[name].select_dtypes("number").to_numpy() for rep in (on_disk, in_memory)]
        np.testing.assert_allclose(*numbers, rtol=1e-6, atol=1e-9)
    _same_fits(fit_seeds(backed, **OPTIONS), fit_seeds(backed, **OPTIONS))  # again on the same object
