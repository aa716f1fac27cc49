"""The training-time estimate: which stopping settings the calibrated stop applies to, the warm-up's step count, and
the time a fit on a backed file spends reading it."""

from __future__ import annotations

import time

import anndata as ad
import numpy as np

import countvae as cv
from countvae.data.loader import CountSource
from countvae.data.split import split_indices
from countvae.model import warmup


def _adata():
    adata = cv.data.simulate(n_cells=300, n_genes=20, n_latent=2, decoder="linear", seed=7)
    cv.data.setup_anndata(adata)
    return adata


def test_the_calibrated_stop_applies_only_to_the_shared_rules_validation_interval():
    """Known answer: the shared rule validates every 2 epochs; at 20 genes and 270 training cells (300 x 0.9) it
    predicts round(310.43 * 20**-0.201 * 270**-0.058) = 123 epochs.

    Validating every 5 epochs with the same patience is another rule, and so is a learning rate of 1e-3
    throughout: the estimate then takes every epoch (400).
    """
    adata = _adata()
    predicted = 123
    same = {"max_epochs": 400, "early_stopping": True, "check_val_every_n_epoch": 2}
    other = {"max_epochs": 400, "early_stopping": True, "check_val_every_n_epoch": 5}
    assert warmup.estimate_training_time(adata, {"n_latent": 2}, same, n_steps=1).expected_epochs == predicted
    assert warmup.estimate_training_time(adata, {"n_latent": 2}, other, n_steps=1).expected_epochs == 400
    constant_rate = {**same, "lr": 1e-3, "early_stopping_lr_reductions": 0}
    assert warmup.estimate_training_time(adata, {"n_latent": 2}, constant_rate, n_steps=1).expected_epochs == 400


def test_warmup_steps_count_a_partial_last_minibatch():
    """300 cells, train_size 0.9: 270 training cells, all timed (10 x 128 > 270), in ceil(270 / 128) = 3 minibatches.

    Validation cells in the fit's proportion: round(270 * 0.1 / 0.9) = 30, so 300 cells are timed.
    """
    est = warmup.estimate_training_time(_adata(), {"n_latent": 2}, {"max_epochs": 5, "batch_size": 128}, n_steps=10)
    assert (est.warmup_steps, est.warmup_cells) == (3, 300)


def test_expected_stop_of_no_genes_is_that_of_one_gene():
    """Known answer: the power law at 1 gene and 1 cell is its scale, 310.43 epochs; 0 counts as 1 instead of
    dividing by 0."""
    assert warmup.expected_stop_epoch(1, 1, 1000) == round(warmup.STOP_EPOCH_SCALE) == 310
    assert warmup.expected_stop_epoch(0, 0, 1000) == 310


def test_a_subset_made_after_registering_is_timed_with_the_batches_its_model_has():
    """The model keeps only the batches its cells have; the warm-up read the codes of every registered batch, and
    torch's one-hot refused the code of a batch the model has no column for."""
    adata = cv.data.simulate(n_cells=240, n_genes=30, n_latent=2, n_batches=3, seed=0)
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    labels = adata.obs["batch"].astype(str)
    subset = adata[(labels != sorted(set(labels))[1]).to_numpy()].copy()  # the middle batch left out
    est = warmup.estimate_training_time(subset, {"n_latent": 2}, {"max_epochs": 2}, n_steps=2)
    assert est.seconds_per_epoch > 0


def test_a_backed_files_estimate_adds_the_fits_reads_timed_on_the_file(tmp_path, monkeypatch):
    """The warm-up timed its cells in memory, so a fit reading its minibatches from the file took several times the
    printed estimate. Each read of the file is made 0.2 s slower here: the estimate reads the fit's training cells
    (2,000 x 0.9 = 1,800, under one shuffling buffer of 8 x 1,024: one read) and its first validation minibatch (all
    200 validation cells, one read, validated every 2 epochs), so an epoch reads for at least
    0.2 + 0.2 / 2 = 0.3 s. Data in memory reads no file, and its estimate adds nothing."""
    simulated = cv.data.simulate(n_cells=2000, n_genes=30, n_latent=2, decoder="linear", seed=3)
    simulated.write_h5ad(tmp_path / "cells.h5ad")
    backed = ad.read_h5ad(tmp_path / "cells.h5ad", backed="r")
    cv.data.setup_anndata(backed)
    reads, read_rows = [], CountSource.read_rows

    def slow_file(source, rows):
        if source.is_backed:
            reads.append(np.asarray(rows).copy())
            time.sleep(0.2)
        return read_rows(source, rows)

    monkeypatch.setattr(CountSource, "read_rows", slow_file)
    train = {"max_epochs": 2, "batch_size": 128}
    est = warmup.estimate_training_time(backed, {"n_latent": 2}, train, n_steps=2)
    fit_train, fit_validation = split_indices(2000, 0.9, 0)
    assert [r.tolist() for r in reads] == [fit_train.tolist(), fit_validation.tolist()]
    assert est.read_seconds_per_epoch >= 0.3
    assert est.seconds_per_epoch > est.read_seconds_per_epoch
    reads.clear()
    in_memory = warmup.estimate_training_time(backed.to_memory(), {"n_latent": 2}, train, n_steps=2)
    assert reads == [] and in_memory.read_seconds_per_epoch == 0.0
    backed.file.close()


def test_a_backed_file_with_its_counts_in_a_layer_and_no_x_is_estimated_as_in_memory(tmp_path):
    """anndata holds a backed file's layers in memory, and the fit trains on them: the estimate used to read the cells
    through the file's X (a raw h5py KeyError where the file has none) and timed in-memory indexing as file reads."""
    simulated = cv.data.simulate(n_cells=600, n_genes=30, n_latent=2, decoder="linear", seed=3)
    simulated.layers["counts"] = simulated.X.copy()
    simulated.X = None
    simulated.write_h5ad(tmp_path / "layer.h5ad")
    backed = ad.read_h5ad(tmp_path / "layer.h5ad", backed="r")
    cv.data.setup_anndata(backed, layer="counts")
    for cells in (backed, backed[np.arange(0, 600, 2)]):
        est = warmup.estimate_training_time(cells, {"n_latent": 2}, {"max_epochs": 2, "batch_size": 64}, n_steps=2)
        assert est.read_seconds_per_epoch == 0.0 and est.seconds_per_epoch > 0
    backed.file.close()
