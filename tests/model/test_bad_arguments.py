"""The model API refuses what it used to coerce, ignore or fail on with another library's error.

Arguments of the per-cell methods, differential expression, write_results, save, load and
train, and the AnnData given to load: each wrong value is refused with a countvae error
naming it (before, a float ``seed`` or ``indices`` was truncated, a string ``overwrite``
counted as True, ``load`` attached log-normalized data, and others raised numpy's or
torch's errors); the accepted spellings (numpy integers, integer batch labels) work.
"""

from __future__ import annotations

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

import countvae as cv
from countvae.errors import InvalidArgumentError, InvalidDataError


@pytest.fixture(scope="module")
def model():
    adata = cv.data.simulate(n_cells=120, n_genes=20, n_latent=2, n_batches=2, seed=0)
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    adata.obs["cluster"] = np.arange(adata.n_obs) % 3  # integer group labels, as many clusterings give
    return cv.CountVAE(adata, n_latent=2, n_hidden=8, decoder="linear").train(max_epochs=1, progress_bar=False)


@pytest.mark.parametrize(
    ("indices", "message"),
    [
        ([], "selects no cells"),
        (np.arange(120) < 5, "boolean mask"),
        ([0.5, 1.7], "integer positions"),
        (["cell0"], "integer positions"),
        ([[0, 1], [2, 3]], "1-d"),
        (3, "1-d"),
    ],
)
def test_indices_that_are_not_cell_positions_are_refused(model, indices, message):
    with pytest.raises(InvalidArgumentError, match=message):
        model.get_latent_representation(indices=indices)


def test_integer_positions_of_any_integer_type_are_accepted(model):
    full = model.get_latent_representation()
    positions = np.array([7, 2, 30], dtype=np.int32)
    np.testing.assert_array_equal(model.get_latent_representation(indices=positions), full[positions])


@pytest.mark.parametrize(
    ("method", "kwargs"),
    [
        ("get_latent_representation", {"seed": 1.5}),
        ("get_latent_representation", {"seed": "1"}),
        ("get_latent_representation", {"seed": -1}),
        ("get_latent_representation", {"batch_size": 0}),
        ("get_latent_representation", {"batch_size": True}),
        ("get_latent_representation", {"give_mean": "no"}),
        ("get_normalized_expression", {"seed": "1"}),
        ("get_normalized_expression", {"return_numpy": "yes"}),
        ("get_elbo", {"seed": "x"}),
        ("get_elbo", {"return_mean": 0}),
        ("posterior_predictive_sample", {"seed": 1.5}),
        ("get_log_predictive_density", {"n_samples": 4, "seed": "s"}),
        ("get_log_predictive_density", {"n_samples": 4, "progress_bar": "no"}),
    ],
)
def test_per_cell_method_arguments_are_checked(model, method, kwargs):
    name = next(k for k in kwargs if k != "n_samples")
    with pytest.raises(InvalidArgumentError, match=name):
        getattr(model, method)(**kwargs)


def test_numpy_integer_seed_and_batch_size_are_accepted(model):
    z = model.get_latent_representation(give_mean=False, seed=np.int64(3), batch_size=np.int64(16))
    np.testing.assert_array_equal(z, model.get_latent_representation(give_mean=False, seed=3))


@pytest.mark.parametrize("kwargs", [{"seed": -1}, {"batch_correction": "yes"}, {"all_stats": 0}])
def test_differential_expression_arguments_are_checked(model, kwargs):
    with pytest.raises(InvalidArgumentError, match=next(iter(kwargs))):
        model.differential_expression(groupby="batch", n_samples_overall=10, n_bootstrap=2, **kwargs)


def test_an_integer_group1_is_one_group(model):
    kwargs = {"groupby": "cluster", "group2": "2", "n_samples_overall": 20, "n_bootstrap": 2}
    for group1 in (1, np.int64(1)):
        frame = model.differential_expression(group1=group1, **kwargs)
        assert (frame["group1"] == "1").all() and len(frame) == model.adata.n_vars
    pd.testing.assert_frame_equal(frame, model.differential_expression(group1="1", **kwargs))


@pytest.mark.parametrize(
    ("method", "kwargs", "message"),
    [
        ("differential_expression", {"mode": "vanilla"}, r"mode must be 'change'.*nearest equivalent pass delta=0"),
        ("differential_expression", {"mode": ["change"]}, "mode must be 'change'"),
        (
            "differential_expression",
            {"batchid1": ["0"], "batchid2": ["1"]},
            r"does not take scvi-tools' batchid1, batchid2\. batchid1: not offered; pass batch_correction=True",
        ),
        ("differential_expression", {"weights": "uniform"}, "weights: draws are weighted uniformly"),
        ("differential_expression", {"importance_weighting_kwargs": {}}, "importance weights are not offered"),
        ("differential_expression", {"filter_outlier_cells": True}, "filter_outlier_cells: not offered"),
        ("differential_expression", {"silent": True}, "silent: it shows no progress bar"),
        ("differential_expression", {"batch_size": 128}, "batch_size: it decodes 1024 pairs per pass"),
        ("get_latent_representation", {"mc_samples": 10}, "mc_samples: the posterior of z is normal"),
        ("get_latent_representation", {"return_dist": True}, "return_dist: not offered; pass give_mean=False"),
        ("get_normalized_expression", {"gene_list": ["gene0"]}, r"get_normalized_expression\(\.\.\.\)\[genes\]"),
        ("get_normalized_expression", {"return_mean": False}, r"\(return_mean=False\) are not offered"),
        ("posterior_predictive_sample", {"gene_list": ["gene0"]}, r"draws\[:, model\.var_names\.get_indexer"),
        ("posterior_predictive_sample", {"transform_batch": "0"}, "simulated in each cell's own batch"),
        ("get_normalized_expression", {"n_sample": 2}, "unknown argument 'n_sample'. Did you mean 'n_samples'"),
        ("get_elbo", {"batch_size": 128}, "batch_size: it evaluates 512 cells per pass"),
        ("get_elbo", {"dataloader": None}, "dataloader: not offered; pass the cells as adata= and indices="),
    ],
)
def test_scvi_tools_keywords_are_refused_with_what_to_do_instead(model, method, kwargs, message):
    """They failed with Python's TypeError ("unexpected keyword argument"), which names no alternative."""
    with pytest.raises(InvalidArgumentError, match=message) as refused:
        getattr(model, method)(**kwargs)
    # a keyword the method does not take stays the TypeError Python raises for one, which ported code may catch
    assert isinstance(refused.value, TypeError) == ("mode" not in kwargs)


def test_mode_change_is_the_test_differential_expression_implements(model):
    # scvi-tools 1.4 defaults to mode="vanilla", so code ported from it names mode="change"
    kwargs = {"groupby": "cluster", "group1": "1", "group2": "2", "n_samples_overall": 20, "n_bootstrap": 2}
    pd.testing.assert_frame_equal(
        model.differential_expression(mode="change", **kwargs), model.differential_expression(**kwargs)
    )


def test_write_results_refuses_a_view_and_a_non_bool_overwrite(model):
    adata = model.adata.copy()
    with pytest.raises(InvalidArgumentError, match="view"):
        model.write_results(adata[:10], layer=None)
    assert "X_countvae" not in adata.obsm
    model.write_results(adata, layer=None)
    before = adata.obsm["X_countvae"].copy()
    adata.obsm["X_countvae"][:] = 0
    with pytest.raises(InvalidArgumentError, match="overwrite"):
        model.write_results(adata, layer=None, overwrite="no")
    assert (adata.obsm["X_countvae"] == 0).all() and not (before == 0).all()


@pytest.fixture(scope="module")
def folder(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("saved") / "m"
    model.save(path)
    return path


def _unregistered(adata):
    copy = adata.copy()
    del copy.uns["_countvae"]
    return copy


def test_load_checks_the_anndata_like_any_new_data(model, folder):
    logged = _unregistered(model.adata)
    logged.X = sp.csr_matrix(np.log1p(logged.X.toarray()))
    with pytest.raises(InvalidDataError, match="non-integer"):
        cv.CountVAE.load(folder, adata=logged)
    unseen = _unregistered(model.adata)
    unseen.obs["batch"] = "batch9"
    with pytest.raises(InvalidDataError, match="not seen in training"):
        cv.CountVAE.load(folder, adata=unseen)
    with pytest.raises(InvalidArgumentError, match="AnnData"):
        cv.CountVAE.load(folder, adata="adata.h5ad")


def test_training_a_loaded_model_needs_its_training_cells(model, folder):
    fewer = cv.CountVAE.load(folder, adata=_unregistered(model.adata[:50]))
    assert fewer.get_latent_representation().shape == (50, 2)  # other cells can be evaluated
    with pytest.raises(InvalidDataError, match="trained on 120 cells, but its AnnData has 50"):
        fewer.train(max_epochs=1, progress_bar=False)
    # as many cells, but not the training cells in their order: the saved split would select other cells
    for other in (model.adata[::-1], model.adata[np.r_[1:120, 0]]):
        shuffled = cv.CountVAE.load(folder, adata=_unregistered(other))
        with pytest.raises(InvalidDataError, match="trained on other cells, or on these in another order"):
            shuffled.train(max_epochs=1, progress_bar=False)
    same = cv.CountVAE.load(folder, adata=_unregistered(model.adata))
    same.train(max_epochs=1, progress_bar=False)
    assert len(same.history) == len(model.history) + 1


def test_a_loaded_model_trains_on_the_anndatas_own_registration(model, folder):
    """The layer the AnnData was set up with is the one read, in training as in every other method."""
    adata = _unregistered(model.adata)
    adata.layers["counts"] = adata.X.copy()
    adata.X = sp.csr_matrix(np.log1p(adata.X.toarray()))
    cv.CountVAE.setup_anndata(adata, layer="counts", batch_key="batch")
    loaded = cv.CountVAE.load(folder, adata=adata)
    np.testing.assert_array_equal(loaded.get_latent_representation(), model.get_latent_representation())
    loaded.train(max_epochs=1, progress_bar=False)
    on_counts = cv.CountVAE.load(folder, adata=_unregistered(model.adata)).train(max_epochs=1, progress_bar=False)
    pd.testing.assert_frame_equal(loaded.history, on_counts.history)


def test_save_refuses_non_bool_flags_and_a_path_that_is_not_one(model, folder, tmp_path):
    before = (folder / "params.pt").read_bytes()
    with pytest.raises(InvalidArgumentError, match="overwrite"):
        model.save(folder, overwrite="no")
    assert (folder / "params.pt").read_bytes() == before
    with pytest.raises(InvalidArgumentError, match="save_anndata"):
        model.save(tmp_path / "m", save_anndata="no")
    assert not (tmp_path / "m").exists()
    with pytest.raises(InvalidArgumentError, match="dir_path"):
        model.save(5)
    with pytest.raises(InvalidArgumentError, match="dir_path"):
        cv.CountVAE.load(5)
    with pytest.raises(InvalidArgumentError, match="return_uncertainty"):
        model.get_loadings(return_uncertainty="yes")


def test_a_query_with_a_duplicated_gene_is_told_so(model):
    adata = model.adata
    with pytest.warns(UserWarning, match="not unique"):  # anndata's own note
        query = ad.AnnData(
            X=sp.hstack([adata.X, adata.X[:, :1]], format="csr"),
            obs=adata.obs[["batch"]].copy(),
            var=pd.DataFrame(index=[*adata.var_names, adata.var_names[0]]),
        )
    with pytest.raises(InvalidDataError, match="not unique"):
        model.get_latent_representation(query)


def test_transform_batch_takes_an_integer_batch_label():
    adata = cv.data.simulate(n_cells=80, n_genes=12, n_latent=2, n_batches=2, seed=1)
    adata.obs["donor"] = np.where(adata.obs["batch"] == "batch0", 9, 10)
    cv.CountVAE.setup_anndata(adata, batch_key="donor")
    model = cv.CountVAE(adata, n_latent=2, n_hidden=8).train(max_epochs=1, progress_bar=False)
    expected = model.get_normalized_expression(transform_batch="9", return_numpy=True)
    for label in (9, np.int64(9)):
        decoded = model.get_normalized_expression(transform_batch=label, return_numpy=True)
        np.testing.assert_array_equal(decoded, expected)
    with pytest.raises(InvalidArgumentError, match="not a training batch"):
        model.get_normalized_expression(transform_batch=11)


def test_write_results_never_replaces_the_counts_or_the_registration(model):
    adata = model.adata.copy()
    adata.layers["counts"] = adata.X.copy()
    cv.CountVAE.setup_anndata(adata, layer="counts", batch_key="batch")
    registration = dict(adata.uns["_countvae"])
    with pytest.raises(InvalidArgumentError, match="raw counts the model reads"):
        model.write_results(adata, layer="counts", overwrite=True)
    with pytest.raises(InvalidArgumentError, match="registration"):
        model.write_results(adata, uns_key="_countvae", overwrite=True)
    assert (adata.layers["counts"] != adata.X).nnz == 0 and dict(adata.uns["_countvae"]) == registration
    model.write_results(adata, layer="counts_normalized")  # another key is fine


def test_training_settings_the_split_or_the_network_cannot_honour_are_refused_before_anything_changes(model):
    fresh = cv.CountVAE(model.adata, n_latent=2, n_hidden=8)
    before = [p.detach().clone() for p in fresh.module.parameters()]
    with pytest.raises(InvalidArgumentError, match="needs validation cells"):
        fresh.train(max_epochs=1, train_size=1.0, early_stopping=True, progress_bar=False)
    with pytest.raises(InvalidArgumentError, match=r"on by default.*early_stopping=False"):
        fresh.train(max_epochs=1, train_size=1.0, progress_bar=False)
    with pytest.raises(InvalidArgumentError, match="batch_size=1"):
        fresh.train(max_epochs=1, batch_size=1, progress_bar=False)
    after = list(fresh.module.parameters())
    assert not fresh.is_trained and len(fresh.train_indices) == 0
    assert all(bool((a == b).all()) for a, b in zip(after, before, strict=True))
    plain = cv.CountVAE(model.adata, n_latent=2, n_hidden=8, batch_norm=False)
    assert len(plain.train(max_epochs=1, batch_size=1, progress_bar=False).history) == 1
    every_cell = cv.CountVAE(model.adata, n_latent=2, n_hidden=8)
    every_cell.train(max_epochs=1, train_size=1.0, early_stopping=False, progress_bar=False)
    assert len(every_cell.train_indices) == model.adata.n_obs and len(every_cell.validation_indices) == 0


def test_estimate_training_time_arguments_are_checked(model):
    from countvae.model import estimate_training_time

    small = {"n_latent": 2, "n_hidden": 8}
    for kwargs in ({"n_steps": 0}, {"n_steps": 1.0}, {"torch_threads": 0}, {"torch_threads": "2"}):
        with pytest.raises(InvalidArgumentError, match=next(iter(kwargs))):
            estimate_training_time(model.adata, small, **kwargs)
    with pytest.raises(InvalidArgumentError, match="AnnData"):
        estimate_training_time("adata.h5ad", small)
    assert estimate_training_time(model.adata, small, n_steps=np.int64(1)).warmup_steps == 1
