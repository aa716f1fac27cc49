"""CountVAE.write_results: the documented AnnData slots, their values, and never overwriting by accident."""

from __future__ import annotations

import warnings

import anndata as ad
import numpy as np
import pytest
import scanpy as sc

import countvae as cv
from countvae.errors import (
    CountVAEWarning,
    InvalidArgumentError,
    InvalidDataError,
    NotTrainedError,
    OutputExistsError,
)

ALL_SLOTS = {"obsm": "X_countvae", "layers": "countvae_normalized", "varm": "countvae_loadings", "uns": "countvae"}


@pytest.fixture
def adata(trained_linear):
    return trained_linear.adata.copy()


def test_default_slots_hold_the_models_outputs(trained_linear, adata):
    written = trained_linear.write_results(adata)
    assert written == ALL_SLOTS
    np.testing.assert_array_equal(adata.obsm["X_countvae"], trained_linear.get_latent_representation(adata))
    expected = trained_linear.get_normalized_expression(adata, library_size=1e4, return_numpy=True)
    layer = adata.layers["countvae_normalized"]
    assert layer.dtype == np.float32 and layer.shape == (adata.n_obs, adata.n_vars)
    np.testing.assert_allclose(layer, expected, rtol=1e-6)
    np.testing.assert_array_equal(adata.varm["countvae_loadings"], trained_linear.get_loadings().to_numpy())
    record = adata.uns["countvae"]
    assert record["keys"] == ALL_SLOTS
    assert record["settings"]["n_latent"] == 2 and record["settings"]["decoder"] == "linear"
    assert record["registry"]["batch_key"] == "batch"
    assert record["training"]["epochs_trained"] == record["training"]["kept_epoch"] == 30  # no early stop
    assert record["training"]["loss_train_kept_epoch"] == float(trained_linear.history["loss_train"].iloc[-1])
    assert record["library_size"] == 1e4 and record["versions"]["countvae"]
    assert "rotation" in record["note"]


def test_the_training_record_gives_the_epoch_whose_parameters_produced_the_results(tmp_path):
    """With early stopping the model keeps the best epoch's parameters, but the record said "epochs" (those run) and
    gave the last epoch's losses as "final", without the kept epoch."""
    data = cv.data.simulate(n_cells=300, n_genes=30, n_latent=2, decoder="linear", n_batches=2, seed=3)
    cv.CountVAE.setup_anndata(data, batch_key="batch")
    model = cv.CountVAE(data, n_latent=2, decoder="linear")
    model.train(max_epochs=200, lr=3e-2, seed=0, progress_bar=False, early_stopping_patience=3)
    kept = model.training_summary["kept_epoch"]
    assert model.training_summary["stopped_early"] and kept < model.training_summary["epochs_trained"]
    at_kept = model.history.set_index("epoch").loc[kept]
    model.write_results()
    path = tmp_path / "written.h5ad"
    data.write_h5ad(path)
    record = ad.read_h5ad(path).uns["countvae"]["training"]
    assert {k: record[k] for k in model.training_summary} == model.training_summary
    assert record["loss_train_kept_epoch"] == float(at_kept["loss_train"])
    assert record["loss_validation_kept_epoch"] == float(at_kept["loss_validation"])
    assert record["loss_validation_min"] == float(model.history["loss_validation"].min())
    assert not any(key.endswith("_final") for key in record)


def test_default_target_is_the_training_anndata(sim_linear):
    data = sim_linear.copy()
    cv.CountVAE.setup_anndata(data)
    model = cv.CountVAE(data, n_latent=2, decoder="linear").train(max_epochs=2, progress_bar=False)
    model.write_results(layer=None)
    assert data.obsm["X_countvae"].shape == (data.n_obs, 2) and "countvae_normalized" not in data.layers


def test_existing_keys_are_refused_and_nothing_is_written(trained_linear, adata):
    adata.obsm["X_countvae"] = np.zeros((adata.n_obs, 2))
    with pytest.raises(OutputExistsError, match=r"obsm\['X_countvae'\].*overwrite=True"):
        trained_linear.write_results(adata)
    assert "countvae_normalized" not in adata.layers and "countvae" not in adata.uns
    assert not adata.obsm["X_countvae"].any()
    trained_linear.write_results(adata, overwrite=True)
    np.testing.assert_array_equal(adata.obsm["X_countvae"], trained_linear.get_latent_representation(adata))


def test_custom_keys_and_skipped_slots(trained_linear, adata):
    written = trained_linear.write_results(adata, latent_key="X_cv", layer=None, uns_key=None, loadings_key="W")
    assert written == {"obsm": "X_cv", "varm": "W"}
    assert "X_cv" in adata.obsm and "X_countvae" not in adata.obsm
    assert "W" in adata.varm and "countvae_loadings" not in adata.varm
    assert "countvae" not in adata.uns and "countvae_normalized" not in adata.layers
    trained_linear.write_results(adata, latent_key=None, layer="norm10", loadings_key=None, library_size=10.0)
    expected = trained_linear.get_normalized_expression(adata, library_size=10.0, return_numpy=True)
    np.testing.assert_allclose(adata.layers["norm10"], expected, rtol=1e-6)
    assert adata.uns["countvae"]["library_size"] == 10.0 and adata.uns["countvae"]["keys"] == {
        "layers": "norm10",
        "uns": "countvae",
    }


def test_overwriting_the_record_warns_about_entries_it_no_longer_describes(trained_linear, adata):
    """A second write with ``layer=None`` replaces the record, and the first write's layer stays: named in a warning."""
    trained_linear.write_results(adata)
    with pytest.warns(CountVAEWarning, match=r"adata.layers\['countvae_normalized'\] were written by an earlier"):
        trained_linear.write_results(adata, layer=None, overwrite=True)
    assert adata.uns["countvae"]["keys"] == {"obsm": "X_countvae", "varm": "countvae_loadings", "uns": "countvae"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same keys again, or a record that lists what is there: no warning
        trained_linear.write_results(adata, layer=None, overwrite=True)


def test_mlp_decoder_stores_no_loadings(trained_mlp):
    adata = trained_mlp.adata.copy()
    written = trained_mlp.write_results(adata)
    assert "varm" not in written and "countvae_loadings" not in adata.varm
    assert "varm" not in adata.uns["countvae"]["keys"]


def test_new_cells_are_encoded(trained_linear, sim_linear):
    query = sim_linear[:50].copy()  # not registered: read like the training data
    trained_linear.write_results(query)
    np.testing.assert_array_equal(query.obsm["X_countvae"], trained_linear.get_latent_representation(query))
    assert query.layers["countvae_normalized"].shape == (50, sim_linear.n_vars)


def test_h5ad_round_trip_and_scanpy_neighbours(trained_linear, adata, tmp_path):
    trained_linear.write_results(adata)
    adata.write_h5ad(tmp_path / "a.h5ad")
    back = ad.read_h5ad(tmp_path / "a.h5ad")
    np.testing.assert_array_equal(back.obsm["X_countvae"], adata.obsm["X_countvae"])
    np.testing.assert_array_equal(back.varm["countvae_loadings"], adata.varm["countvae_loadings"])
    assert back.uns["countvae"]["settings"]["likelihood"] == "nb"
    assert back.uns["countvae"]["keys"]["obsm"] == "X_countvae"
    sc.pp.neighbors(back, use_rep="X_countvae", n_neighbors=10, random_state=0)
    assert back.obsp["connectivities"].shape == (back.n_obs, back.n_obs)


def test_gene_programs_named_with_a_slash_survive_the_h5ad_round_trip(sim_linear, tmp_path):
    """h5ad reads "/" in a key as a group path: programs "T/NK" and "T" came back as "T" alone, with no error."""
    data = sim_linear.copy()
    cv.CountVAE.setup_anndata(data)
    genes = list(data.var_names)
    programs = {"T/NK": genes[:10], "T": genes[10:20]}
    model = cv.CountVAE(data, decoder="linear", gene_programs=programs)
    model.train(max_epochs=1, seed=0, progress_bar=False)
    target = data.copy()
    model.write_results(target, layer=None)
    target.write_h5ad(tmp_path / "p.h5ad")
    stored = ad.read_h5ad(tmp_path / "p.h5ad").uns["countvae"]["settings"]["gene_programs"]
    back = {entry["name"]: list(entry["genes"]) for _, entry in sorted(stored.items())}
    assert back == programs and list(back) == ["T/NK", "T"]


def test_bad_input(trained_linear, adata, sim_linear):
    with pytest.raises(InvalidArgumentError, match="latent_key"):
        trained_linear.write_results(adata, latent_key="")
    with pytest.raises(InvalidArgumentError, match="library_size"):
        trained_linear.write_results(adata, library_size=0)
    with pytest.raises(InvalidArgumentError, match="AnnData"):
        trained_linear.write_results(adata.X)
    other = adata.copy()
    other.var_names = [f"other_{i}" for i in range(other.n_vars)]
    with pytest.raises(InvalidDataError):
        trained_linear.write_results(other)
    untrained = cv.CountVAE(trained_linear.adata, n_latent=2)
    with pytest.raises(NotTrainedError):
        untrained.write_results(adata)


def test_an_anndata_with_more_genes_gets_the_embedding_of_the_models_genes(sim_linear):
    data = sim_linear[:, 10:50].copy()  # as after selecting highly variable genes
    cv.CountVAE.setup_anndata(data, batch_key="batch")
    model = cv.CountVAE(data, n_latent=2, decoder="linear")
    model.train(max_epochs=2, progress_bar=False, seed=0)
    expected = model.get_latent_representation(data)
    full = sim_linear.copy()
    with pytest.raises(InvalidDataError, match="Pass layer=None and loadings_key=None") as info:
        model.write_results(full)
    assert "sub = adata[:, model.var_names].copy(); model.write_results(sub)" in str(info.value)
    assert "X_countvae" not in full.obsm
    assert model.write_results(full, layer=None, loadings_key=None) == {"obsm": "X_countvae", "uns": "countvae"}
    np.testing.assert_allclose(full.obsm["X_countvae"], expected, rtol=1e-6)
    # registered with its counts in a layer, the genes in another order
    other = sim_linear[:, ::-1].copy()
    other.layers["counts"], other.X = other.X.copy(), other.X * 0.5
    cv.CountVAE.setup_anndata(other, layer="counts", batch_key="batch")
    model.write_results(other, layer=None, loadings_key=None)
    np.testing.assert_allclose(other.obsm["X_countvae"], expected, rtol=1e-6)
    sub = full[:, model.var_names].copy()
    model.write_results(sub, overwrite=True)
    assert set(sub.layers) == {"countvae_normalized"} and sub.varm["countvae_loadings"].shape == (40, 2)
