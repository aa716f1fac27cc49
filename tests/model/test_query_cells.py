"""A trained model applies to cells in which some genes have no counts (held-out cells, small subsets)."""

import numpy as np
import pytest
import scipy.sparse as sp

import countvae as cv
from countvae.errors import InvalidDataError


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
