"""A trained model applies to cells in which some genes have no counts (held-out cells, small subsets)."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import countvae as cv
from countvae.data.split import split_indices
from countvae.errors import CountVAEWarning, InvalidArgumentError, InvalidDataError


def with_undetected_gene(adata, n_cells=3):
    few = adata[:n_cells].copy()
    counts = few.X.toarray()
    counts[:, 0] = 0.0
    few.X = sp.csr_matrix(counts)
    return few


def test_latent_and_lpd_of_cells_with_an_undetected_gene(trained_linear):
    few = with_undetected_gene(trained_linear.adata)
    z = trained_linear.get_latent_representation(few)
    assert z.shape == (3, 2) and np.isfinite(z).all()
    lpd = trained_linear.get_log_predictive_density(few, n_samples=10)
    assert np.isfinite(lpd["lpd"]).all()


def test_training_data_with_an_empty_gene_is_still_refused(sim_linear):
    with pytest.raises(InvalidDataError, match="zero total counts"):
        cv.CountVAE.setup_anndata(with_undetected_gene(sim_linear))


@pytest.fixture(scope="module")
def three_batches():
    adata = cv.data.simulate(n_cells=240, n_genes=30, n_latent=2, n_batches=3, seed=0)
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    return adata


def test_a_batch_registered_but_absent_from_the_training_cells_is_refused_as_unseen(three_batches, tmp_path):
    """Register, then subset: the model had an effect for the batch none of its cells has, never trained, and
    embedded and decoded such cells with it (identical to the reference batch) instead of refusing them."""
    labels = three_batches.obs["batch"].astype(str)
    left_out = sorted(set(labels))[-1]
    train = three_batches[(labels != left_out).to_numpy()].copy()
    model = cv.CountVAE(train, n_latent=2, decoder="linear")
    assert model.registry.batch_categories == sorted(set(labels) - {left_out})
    assert model.module.n_batches == 2
    model.train(max_epochs=2, progress_bar=False, seed=0)
    unseen = three_batches[(labels == left_out).to_numpy()].copy()
    with pytest.raises(InvalidDataError, match=rf"\['{left_out}'\].*not seen in training"):
        model.get_latent_representation(unseen)
    with pytest.raises(InvalidArgumentError, match="transform_batch"):
        model.get_normalized_expression(transform_batch=left_out)
    model.save(tmp_path / "m")
    with pytest.raises(InvalidDataError, match="not seen in training"):
        cv.CountVAE.load(tmp_path / "m", adata=unseen)
    # the training cells read the same through the narrowed categories, saved and loaded
    loaded = cv.CountVAE.load(tmp_path / "m", adata=train)
    np.testing.assert_array_equal(loaded.get_latent_representation(), model.get_latent_representation())
    # every batch present: the registration is the model's own, unchanged
    assert cv.CountVAE(three_batches).registry.batch_categories == sorted(set(labels))


def test_a_batch_whose_cells_all_fall_in_the_validation_split_is_warned_of(three_batches):
    """Its effect is never trained: those cells are scored with its starting value (it went without a word)."""
    adata = three_batches.copy()
    solo = adata.obs_names[0]
    adata.obs["batch"] = adata.obs["batch"].astype(str)
    adata.obs.loc[solo, "batch"] = "solo"
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    in_validation = next(s for s in range(50) if 0 in split_indices(adata.n_obs, 0.9, s)[1])
    in_training = next(s for s in range(50) if 0 in split_indices(adata.n_obs, 0.9, s)[0])
    with pytest.warns(CountVAEWarning, match=r"\['solo'\].*only in the validation split"):
        cv.CountVAE(adata, n_latent=2).train(max_epochs=1, progress_bar=False, seed=in_validation)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CountVAEWarning)
        cv.CountVAE(adata, n_latent=2).train(max_epochs=1, progress_bar=False, seed=in_training)
