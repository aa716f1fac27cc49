"""On-disk (backed) AnnData: streamed minibatches, block shuffling, same fits as in memory."""

from __future__ import annotations

import anndata as ad
import numpy as np
import pytest
import scipy.sparse as sp
import torch

import countvae as cv
from countvae.data.loader import DEFAULT_BLOCK_CELLS, CountSource, block_shuffle_order
from countvae.errors import InvalidDataError
from countvae.model.training import to_tensors
from countvae.module.distributions import _NONZERO_ATTR, NegativeBinomialLogMean


@pytest.fixture(scope="module")
def h5ad_path(tmp_path_factory):
    adata = cv.data.simulate(n_cells=700, n_genes=40, n_latent=2, n_batches=2, seed=5)
    path = tmp_path_factory.mktemp("backed") / "sim.h5ad"
    adata.write_h5ad(path)
    return path


class SpyMatrix:
    """A backed dataset that records how it is indexed."""

    def __init__(self, inner):
        self.inner = inner
        self.keys = []

    shape = property(lambda self: self.inner.shape)
    dtype = property(lambda self: self.inner.dtype)
    format = property(lambda self: self.inner.format)

    def __getitem__(self, key):
        self.keys.append(key)
        return self.inner[key]


def _params(model):
    return torch.cat([p.detach().flatten() for p in model.module.parameters()])


def test_block_shuffle_order_is_a_permutation_made_of_whole_blocks():
    idx = np.sort(np.random.default_rng(0).choice(5000, 1000, replace=False))
    order, segments = block_shuffle_order(idx, block_cells=64, buffer_blocks=3, rng=np.random.default_rng(1))
    np.testing.assert_array_equal(np.sort(order), idx)
    blocks = [set(idx[b * 64 : (b + 1) * 64]) for b in range(-(-1000 // 64))]
    assert segments[0][0] == 0 and segments[-1][1] == 1000 and len(segments) == -(-16 // 3)
    for start, stop in segments:
        cells = set(order[start:stop])
        members = [b for b in blocks if b & cells]
        assert all(b <= cells for b in members)  # a buffer holds whole blocks only
        assert len(members) <= 3
    # cells are shuffled within a buffer, not left in file order
    assert not np.array_equal(order[segments[0][0] : segments[0][1]], np.sort(order[segments[0][0] : segments[0][1]]))


def test_backed_epoch_reads_each_row_once_in_contiguous_slices(h5ad_path):
    backed = ad.read_h5ad(h5ad_path, backed="r")
    memory = ad.read_h5ad(h5ad_path)
    spy = SpyMatrix(backed.X)
    batch = np.zeros(backed.n_obs, dtype=np.int64)
    source = CountSource(spy, batch)
    assert source.is_backed
    train = np.sort(np.random.default_rng(0).choice(700, 630, replace=False))
    seen = []
    for mb in source.iterate(train, 50, shuffle=True, rng=np.random.default_rng(3), shuffle_block_cells=100):
        np.testing.assert_array_equal(mb.counts, memory.X[mb.indices].toarray())
        flat = np.flatnonzero(mb.counts.reshape(-1))
        np.testing.assert_array_equal(mb.nonzero, flat)
        np.testing.assert_array_equal(mb.nonzero_rows * backed.n_vars + mb.nonzero_genes, flat)
        np.testing.assert_array_equal(mb.nonzero_per_row, (mb.counts != 0).sum(axis=1))
        seen.append(mb.indices)
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), train)
    assert all(isinstance(k, slice) for k in spy.keys)  # never a fancy index into the file
    rows_read = sum(k.stop - k.start for k in spy.keys)
    assert rows_read <= 700  # every row at most once per epoch (gaps of skipped cells included)
    # in-memory source, same block order: the very same minibatches
    mem_source = CountSource(memory.X, batch)
    a = list(source.iterate(train, 50, shuffle=True, rng=np.random.default_rng(3), shuffle_block_cells=100))
    b = list(mem_source.iterate(train, 50, shuffle=True, rng=np.random.default_rng(3), shuffle_block_cells=100))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.indices, y.indices)
        np.testing.assert_array_equal(x.counts, y.counts)


def test_backed_training_equals_in_memory_with_the_same_block_shuffling(h5ad_path):
    backed = ad.read_h5ad(h5ad_path, backed="r")
    memory = ad.read_h5ad(h5ad_path)
    for adata in (backed, memory):
        cv.CountVAE.setup_anndata(adata, batch_key="batch")
    m_backed = cv.CountVAE(backed, n_latent=2, n_hidden=16)
    m_memory = cv.CountVAE(memory, n_latent=2, n_hidden=16)
    # default for backed data: block shuffling with DEFAULT_BLOCK_CELLS
    m_backed.train(max_epochs=3, progress_bar=False, seed=4)
    m_memory.train(max_epochs=3, progress_bar=False, seed=4, shuffle_block_cells=DEFAULT_BLOCK_CELLS)
    assert torch.equal(_params(m_backed), _params(m_memory))
    np.testing.assert_array_equal(m_backed.history.values, m_memory.history.values)
    # a smaller block size on both sides: still identical, and different from the default
    m2_backed = cv.CountVAE(backed, n_latent=2, n_hidden=16).train(
        max_epochs=3, progress_bar=False, seed=4, shuffle_block_cells=32
    )
    m2_memory = cv.CountVAE(memory, n_latent=2, n_hidden=16).train(
        max_epochs=3, progress_bar=False, seed=4, shuffle_block_cells=32
    )
    assert torch.equal(_params(m2_backed), _params(m2_memory))
    assert not torch.equal(_params(m2_backed), _params(m_backed))
    # outputs read from disk equal outputs read from memory
    idx = np.array([5, 1, 400, 699])
    np.testing.assert_array_equal(
        m_backed.get_log_predictive_density(indices=idx, n_samples=20).values,
        m_memory.get_log_predictive_density(indices=idx, n_samples=20).values,
    )
    np.testing.assert_array_equal(m_backed.get_latent_representation(), m_memory.get_latent_representation())


def test_setup_and_model_on_backed_data_never_read_the_whole_matrix(h5ad_path, monkeypatch):
    expected_totals = np.asarray(ad.read_h5ad(h5ad_path).X.sum(0)).ravel()
    backed = ad.read_h5ad(h5ad_path, backed="r")
    cls = type(backed.X)

    def refuse(self, *args, **kwargs):
        raise AssertionError("the whole backed matrix was loaded")

    monkeypatch.setattr(cls, "to_memory", refuse)
    summary = cv.data.setup_anndata(backed, batch_key="batch")
    np.testing.assert_allclose(summary.gene_totals, expected_totals)
    model = cv.CountVAE(backed, n_latent=2, n_hidden=8)
    model.train(max_epochs=1, progress_bar=False)
    lpd = model.get_log_predictive_density(indices=np.arange(0, 700, 7), n_samples=5)
    assert lpd.shape == (100, 5) and list(lpd.columns) == ["lpd", "mc_se", "ess", "khat", "reliable"]


def test_backed_csc_matrix_is_refused(tmp_path):
    adata = cv.data.simulate(n_cells=60, n_genes=12, n_latent=2, seed=1)
    adata.X = sp.csc_matrix(adata.X)
    adata.write_h5ad(tmp_path / "csc.h5ad")
    backed = ad.read_h5ad(tmp_path / "csc.h5ad", backed="r")
    with pytest.raises(InvalidDataError, match=r"CSC.*adata.to_memory\(\).*a.X = a.X.tocsr\(\)"):
        CountSource(backed.X, np.zeros(60, dtype=np.int64))
    with pytest.raises(InvalidDataError, match="CSC"):  # at registration, before its pass over the file
        cv.data.setup_anndata(backed)
    # both remedies the message gives work (it advised adata.X.tocsr(), which a backed CSC dataset lacks)
    CountSource(backed.to_memory().X, np.zeros(60, dtype=np.int64))
    a = ad.read_h5ad(tmp_path / "csc.h5ad")
    a.X = a.X.tocsr()
    a.write_h5ad(tmp_path / "csr.h5ad")
    CountSource(ad.read_h5ad(tmp_path / "csr.h5ad", backed="r").X, np.zeros(60, dtype=np.int64))


def test_loader_nonzero_index_gives_the_same_likelihood(h5ad_path):
    memory = ad.read_h5ad(h5ad_path)
    source = CountSource(memory.X, np.zeros(memory.n_obs, dtype=np.int64))
    mb = source.rows(np.arange(0, 700, 3))
    assert mb.counts.dtype == np.float32  # no float64 round trip for float32 data
    x, _ = to_tensors(mb, torch.float64, torch.device("cpu"))
    assert hasattr(x, _NONZERO_ATTR)
    plain = x.clone()  # carries no index: the likelihood searches for the non-zeros itself
    assert not hasattr(plain, _NONZERO_ATTR)
    g = torch.Generator().manual_seed(0)
    log_mean = torch.randn(2, *x.shape, generator=g, dtype=torch.float64)
    log_theta = torch.randn(x.shape[1], generator=g, dtype=torch.float64)
    d = NegativeBinomialLogMean(log_mean, log_theta)
    torch.testing.assert_close(d.log_prob(x), d.log_prob(plain), rtol=0, atol=1e-12)


def test_explicitly_stored_zeros_are_not_non_zero_entries_of_a_minibatch():
    """A CSR matrix may store zeros explicitly; the minibatch's non-zero positions, rows, genes and entries per row
    leave them out, and the likelihood's sparse terms built from them equal those from a search of the dense block.
    Fails if a stored zero is counted, or if the per-row counts disagree with the rows."""
    from countvae.module.distributions import _nonzero_lgamma_terms

    dense = np.array([[0, 3, 0, 1], [2, 0, 0, 0], [0, 0, 0, 0], [1, 1, 9, 0]], dtype=np.float32)
    matrix = sp.csr_matrix(dense)
    matrix.data[matrix.data == 1] = 0  # three stored zeros, kept in the structure
    assert matrix.nnz == 6 and (matrix.data == 0).sum() == 3
    mb = CountSource(matrix, np.zeros(4, dtype=np.int64)).rows(np.arange(4))
    expected = np.flatnonzero(mb.counts.reshape(-1))
    np.testing.assert_array_equal(mb.nonzero, expected)
    np.testing.assert_array_equal(mb.nonzero_rows, expected // 4)
    np.testing.assert_array_equal(mb.nonzero_genes, expected % 4)
    np.testing.assert_array_equal(mb.nonzero_per_row, [1, 1, 0, 1])
    x, _ = to_tensors(mb, torch.float64, torch.device("cpu"))
    theta = torch.tensor([0.5, 2.0, 1.0, 7.0], dtype=torch.float64)
    torch.testing.assert_close(_nonzero_lgamma_terms(x, theta), _nonzero_lgamma_terms(x.clone(), theta))


def test_cells_of_a_backed_view_are_read_as_the_view_orders_rows_and_genes(h5ad_path):
    """anndata cannot index a backed view again; ``cells_in_memory`` composes the view's rows and genes with the
    positions asked for, reads them from the file, and leaves the caller's file open."""
    from countvae.data.backed import cells_in_memory

    memory = ad.read_h5ad(h5ad_path)
    backed = ad.read_h5ad(h5ad_path, backed="r")
    rows, genes, positions = np.arange(10, 600, 3), list(backed.var_names[::-1][:25]), np.array([0, 4, 5, 77, 150])
    got = cells_in_memory(backed[rows, genes], positions)
    expected = memory[rows][:, genes][positions]
    assert list(got.obs_names) == list(expected.obs_names) and list(got.var_names) == genes
    np.testing.assert_array_equal(sp.csr_matrix(got.X).toarray(), sp.csr_matrix(expected.X).toarray())
    assert backed.file.is_open and not got.isbacked
    whole = cells_in_memory(backed, positions)  # not a view: the same cells of the file
    np.testing.assert_array_equal(sp.csr_matrix(whole.X).toarray(), sp.csr_matrix(memory[positions].X).toarray())
    assert backed.file.is_open
