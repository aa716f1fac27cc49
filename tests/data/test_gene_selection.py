"""Seurat v3 highly variable genes on raw counts: equal to scanpy's, and the subset they make."""

from __future__ import annotations

import anndata as ad
import numba
import numpy as np
import pandas as pd
import pytest
import scanpy as sc
import scipy.sparse as sp

import countvae as cv
from countvae.data.gene_selection import UNS_KEY, highly_variable_genes, normalized_variance, select_top_genes
from countvae.errors import InvalidArgumentError, InvalidDataError, SetupError
from tests.conftest import real_dataset
from tests.ties import rank_differences_beyond_ties, selection_differences_beyond_ties


@pytest.fixture
def one_numba_thread():
    # scanpy sums the counts on numba's threads, and their number changes the last digits, to which
    # the loess is sensitive; countvae sums as scanpy does on one thread.
    previous = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(previous)


@pytest.mark.realdata
@pytest.mark.parametrize(("name", "batch_key"), [("pbmc_3tech", None), ("kang2018", "batch")])
def test_same_genes_ranks_and_variances_as_scanpy(name, batch_key, one_numba_thread):
    adata = real_dataset(name)
    expected = sc.pp.highly_variable_genes(
        adata, flavor="seurat_v3", n_top_genes=1000, batch_key=batch_key, inplace=False
    )
    batches = None if batch_key is None else adata.obs[batch_key].to_numpy()
    got = highly_variable_genes(adata.X, 1000, batches)
    assert got["highly_variable"].sum() == 1000
    np.testing.assert_allclose(got["variances_norm"].to_numpy(), expected["variances_norm"].to_numpy(), rtol=1e-12)
    # Ranks and the selection equal scanpy's up to ties: two genes whose normalized variances agree to
    # 1e-9 may be ordered either way by the last bits of a float (seen on another processor).
    labels = np.zeros(adata.n_obs) if batches is None else batches
    scores = np.vstack([normalized_variance(adata.X[labels == b]) for b in np.unique(labels)])
    got_rank, expected_rank = got["highly_variable_rank"].to_numpy(), expected["highly_variable_rank"].to_numpy()
    assert not rank_differences_beyond_ties(got_rank, expected_rank, scores)
    assert not selection_differences_beyond_ties(
        got["highly_variable"].to_numpy(), expected["highly_variable"].to_numpy(), got_rank, expected_rank
    )
    if batch_key is not None:
        differs = got["highly_variable_nbatches"].to_numpy() != expected["highly_variable_nbatches"].to_numpy()
        assert not differs[got_rank == expected_rank].any()


def test_rank_comparison_allows_broken_ties_and_nothing_else():
    scores = np.array([[5.0, 4.0, 3.0 * (1 + 1e-13), 3.0, 2.0, 1.0]])
    ranks = np.array([0.0, 1.0, 2.0, 3.0, np.nan, np.nan])  # top 4 of 6 genes
    swapped_tie = np.array([0.0, 1.0, 3.0, 2.0, np.nan, np.nan])
    assert rank_differences_beyond_ties(swapped_tie, ranks, scores) == []
    swapped_real = np.array([1.0, 0.0, 2.0, 3.0, np.nan, np.nan])
    assert rank_differences_beyond_ties(swapped_real, ranks, scores)
    # A tie at the cut: either of the tied genes may be the last one selected.
    cut = np.array([0.0, 1.0, np.nan, 2.0, np.nan, np.nan])
    at_cut = np.array([0.0, 1.0, 2.0, np.nan, np.nan, np.nan])
    assert rank_differences_beyond_ties(at_cut, cut, scores) == []
    assert not selection_differences_beyond_ties(~np.isnan(at_cut), ~np.isnan(cut), at_cut, cut)
    # A gene selected by one side with the same rank on both is a real difference.
    selected = ~np.isnan(ranks)
    flipped = selected.copy()
    flipped[4] = True
    assert selection_differences_beyond_ties(flipped, selected, ranks, ranks)
    # Several batches: a median rank may move only for a gene tied with another in some batch.
    two = np.vstack([scores[0], scores[0][::-1]])
    assert (
        rank_differences_beyond_ties(
            np.array([0.0, 1.5, 2.5, 2.0, 4.0, 5.0]), np.array([0.0, 1.5, 2.0, 2.5, 4.0, 5.0]), two
        )
        == []
    )
    assert rank_differences_beyond_ties(
        np.array([0.5, 1.0, 2.0, 2.5, 4.0, 5.0]), np.array([0.0, 1.5, 2.0, 2.5, 4.0, 5.0]), two
    )


def _toy_counts(n_cells=400, n_genes=120, seed=0):
    rng = np.random.default_rng(seed)
    means = np.exp(rng.normal(1.0, 0.7, n_genes))
    dispersion = np.where(np.arange(n_genes) < 20, 0.2, 50.0)  # the first 20 genes are overdispersed
    rates = rng.gamma(dispersion, means / dispersion, size=(n_cells, n_genes))
    return rng.poisson(rates).astype(np.float32)


def test_overdispersed_genes_are_chosen_and_layout_does_not_matter():
    counts = _toy_counts()
    dense = highly_variable_genes(counts, 20)
    # Genes of the same mean differ only in dispersion: the selection must find the overdispersed ones.
    assert set(np.flatnonzero(dense["highly_variable"])) == set(range(20))
    for layout in (sp.csr_matrix, sp.csc_matrix):
        other = highly_variable_genes(layout(counts), 20)
        pd.testing.assert_frame_equal(other, dense, check_exact=False, rtol=1e-12)


def test_small_integer_and_float16_counts_give_the_float64_ranking():
    counts = np.minimum(_toy_counts() * 40, 2000)  # counts up to 2,000: their squares overflow int16 and float16
    expected = highly_variable_genes(counts.astype(np.float64), 20)
    for dtype in (np.int16, np.uint16, np.float16):
        pd.testing.assert_frame_equal(highly_variable_genes(counts.astype(dtype), 20), expected)


def test_n_top_genes_and_batches_are_checked():
    counts = _toy_counts(n_cells=50, n_genes=30)
    with pytest.raises(InvalidArgumentError, match="between 1 and the number of genes"):
        highly_variable_genes(counts, 31)
    with pytest.raises(InvalidArgumentError, match="integer"):
        highly_variable_genes(counts, 2.5)
    with pytest.raises(InvalidDataError, match="at least 2 cells in batch"):
        highly_variable_genes(counts, 10, np.array(["a"] * 49 + ["b"]))
    for span in (0, "0.3", 1.5):
        with pytest.raises(InvalidArgumentError, match="span"):
            highly_variable_genes(counts, 10, span=span)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda x: np.where(x > 3, np.nan, x), "NaN or infinite"),  # the loess crashed the process (a segfault)
        (lambda x: np.vstack([np.full((1, x.shape[1]), np.inf), x[1:]]), "NaN or infinite"),
        (lambda x: x - 5.0, "negative values"),  # the message blamed too few cells and a batch key never given
        (lambda x: x + 0.5, "non-integer values"),
    ],
)
def test_counts_that_are_not_raw_counts_are_refused(change, message):
    counts = np.random.default_rng(0).poisson(3, (100, 20)).astype(float)
    with pytest.raises(InvalidDataError, match=message):
        highly_variable_genes(change(counts), 5)


@pytest.fixture
def registered():
    adata = cv.data.simulate(n_cells=300, n_genes=60, n_latent=2, decoder="linear", n_batches=2, seed=4)
    cv.data.setup_anndata(adata, batch_key="batch")
    return adata


def test_select_top_genes_keeps_the_ranked_genes_in_order_and_records_them(registered):
    batches = cv.data.registry.batch_codes(registered, cv.data.get_registry(registered))
    chosen = highly_variable_genes(registered.X, 25, batches)["highly_variable"].to_numpy()
    subset = select_top_genes(registered, 25)
    assert list(subset.var_names) == list(registered.var_names[chosen])
    np.testing.assert_array_equal(subset.X.toarray(), registered.X[:, chosen].toarray())
    assert cv.data.get_registry(subset).batch_key == "batch" and registered.n_vars == 60  # input untouched
    record = cv.data.get_gene_selection(subset)
    assert record == {
        "flavor": "seurat_v3",
        "n_top_genes": 25,
        "n_genes_before": 60,
        "counts": "adata.X",
        "batch_key": "batch",
        "genes": list(subset.var_names),
    }
    assert cv.data.get_gene_selection(registered) is None


def test_select_top_genes_reads_layers_and_raw(registered):
    expected = list(select_top_genes(registered, 10).var_names)
    layered = registered.copy()
    layered.layers["counts"] = layered.X.copy()
    layered.X = sp.csr_matrix(np.log1p(layered.X.toarray()))
    cv.data.setup_anndata(layered, layer="counts", batch_key="batch")
    from_layer = select_top_genes(layered, 10)
    assert list(from_layer.var_names) == expected and cv.data.get_registry(from_layer).layer == "counts"
    assert from_layer.uns[UNS_KEY]["counts"] == "adata.layers['counts']"

    with_raw = layered.copy()
    with_raw.raw = ad.AnnData(X=registered.X.copy(), var=registered.var.copy(), obs=registered.obs.copy())
    with_raw = with_raw[:, :30].copy()  # X keeps fewer genes than raw, as after a scanpy workflow
    cv.data.setup_anndata(with_raw, use_raw=True, batch_key="batch")
    from_raw = select_top_genes(with_raw, 10)
    assert list(from_raw.var_names) == expected and from_raw.uns[UNS_KEY]["n_genes_before"] == 60


def test_select_top_genes_errors(registered):
    lonely = registered.copy()
    lonely.obs["batch"] = ["donor A"] * (lonely.n_obs - 1) + ["donor B"]
    cv.data.setup_anndata(lonely, batch_key="batch")
    with pytest.raises(InvalidDataError, match="at least 2 cells in batch 'donor B'"):  # its name, not its code
        select_top_genes(lonely, 10)
    with pytest.raises(InvalidArgumentError, match="more than the 60 genes"):
        select_top_genes(registered, 61)
    with pytest.raises(InvalidArgumentError, match="fewer than 5"):
        select_top_genes(registered, 4, min_genes=5)
    for min_genes in ("2", True, 0):
        with pytest.raises(InvalidArgumentError, match="min_genes"):
            select_top_genes(registered, 10, min_genes=min_genes)
    with pytest.raises(SetupError, match="setup_anndata"):
        select_top_genes(ad.AnnData(X=registered.X.copy()), 10)


def test_a_cell_without_counts_in_the_chosen_genes_is_an_error():
    counts = _toy_counts()
    counts[0] = 0
    counts[0, 100] = 1  # this cell's only count is in a gene that is not overdispersed
    adata = ad.AnnData(X=sp.csr_matrix(counts))
    cv.data.setup_anndata(adata)
    with pytest.raises(InvalidDataError, match="1 of 400 cells have no counts in the 20 most variable genes"):
        select_top_genes(adata, 20)


def test_matches_scanpy_on_simulated_counts_with_batches_and_constant_genes(one_numba_thread):
    """scanpy's seurat_v3 is the known answer, on synthetic counts (no shared data file needed).

    Two batches of different depth, an all-zero gene and a constant gene (zero variance: left out of the
    loess, normalized variance exactly 0): the normalized variances, ranks, batch counts and selection must
    all equal scanpy's.
    """
    rng = np.random.default_rng(7)
    counts = np.vstack([_toy_counts(n_cells=300, seed=1), 3 * _toy_counts(n_cells=200, seed=2)])
    counts = counts[rng.permutation(len(counts))]
    counts[:, 5] = 0.0
    counts[:, 6] = 4.0
    batches = np.array(["b"] * 300 + ["a"] * 200)[rng.permutation(500)]
    adata = ad.AnnData(
        X=counts.astype(np.float64), obs=pd.DataFrame({"batch": batches}, index=[str(i) for i in range(500)])
    )
    for batch_key, labels in ((None, None), ("batch", batches)):
        expected = sc.pp.highly_variable_genes(
            adata, flavor="seurat_v3", n_top_genes=25, batch_key=batch_key, inplace=False
        )
        got = highly_variable_genes(counts if batch_key is None else sp.csr_matrix(counts), 25, labels)
        columns = ["highly_variable_rank", "highly_variable"]
        columns += [] if batch_key is None else ["highly_variable_nbatches"]
        np.testing.assert_allclose(got["variances_norm"], expected["variances_norm"].to_numpy(), rtol=1e-10)
        for column in columns:
            np.testing.assert_array_equal(got[column].to_numpy(), expected[column].to_numpy(), err_msg=column)
    per_batch = [normalized_variance(counts[batches == b]) for b in ("a", "b")]
    for norm_var in per_batch:
        assert norm_var[5] == 0.0 and norm_var[6] == 0.0


def test_normalized_variance_clips_at_mean_plus_sigma_sqrt_n():
    """Known answer by hand: one outlier count is clipped at mean + sigma * sqrt(n) before standardising.

    The normalized variance is the ddof=1 variance of (min(x, mean + sigma sqrt(n)) - mean) / sigma, with sigma
    the loess fit; here it is computed directly from the clipped values (not from sums) and must agree.
    """
    from skmisc.loess import loess

    counts = _toy_counts(n_cells=200, seed=3).astype(np.float64)
    counts[0, 30] = 5000.0  # far above any clip
    n = counts.shape[0]
    mean, var = counts.mean(0), counts.var(0, ddof=1)
    fit = loess(np.log10(mean), np.log10(var), span=0.3, degree=2)
    fit.fit()
    sigma = np.sqrt(10**fit.outputs.fitted_values)
    clipped = np.minimum(counts, mean + sigma * np.sqrt(n))
    assert clipped[0, 30] < 5000.0
    expected = np.sum(((clipped - mean) / sigma) ** 2, axis=0) / (n - 1)
    np.testing.assert_allclose(normalized_variance(counts), expected, rtol=1e-10)
    np.testing.assert_allclose(normalized_variance(sp.csr_matrix(counts)), expected, rtol=1e-10)


def test_choose_genes_keeps_all_genes_unless_there_are_more_than_the_default(registered):
    """With no explicit number, data with exactly ``default`` genes is kept whole; one gene fewer selects."""
    from countvae.data.gene_selection import choose_genes

    whole = choose_genes(registered, None, 60, n_latent=2)
    assert not whole.selected and whole.adata is registered and whole.record() is None
    chosen = choose_genes(registered, None, 59, n_latent=2)
    assert chosen.selected and not chosen.explicit and chosen.adata.n_vars == 59
    assert choose_genes(registered, "all", 10, n_latent=2).adata.n_vars == 60
    explicit = choose_genes(registered, 30, None, n_latent=2)
    assert explicit.explicit and explicit.record()["n_top_genes"] == 30
    assert choose_genes(registered, np.int64(30), None, n_latent=2).adata.n_vars == 30
    # int() truncated 12.9 and read "12"; other strings raised int()'s error
    for bad in (12.9, "12", "ALL", True):
        with pytest.raises(InvalidArgumentError, match="n_top_genes must be a positive integer"):
            choose_genes(registered, bad, None, n_latent=2)


def _ranks_from_scores(monkeypatch, scores, n_top_genes):
    """``highly_variable_genes`` with the per-batch normalized variances replaced by ``scores`` (batches x genes).

    Cells of batch ``b`` (labelled ``"b0"``, ``"b1"``, ...) hold the count ``b`` everywhere, which is how the
    stand-in tells the batches apart; the counts are sparse, as on real data.
    """
    import countvae.data.gene_selection as gene_selection

    scores = np.asarray(scores, dtype=np.float64)
    monkeypatch.setattr(gene_selection, "normalized_variance", lambda counts, span: scores[int(counts[0, 0])])
    counts = np.repeat(np.arange(len(scores), dtype=np.float64), 3)[:, None] * np.ones((1, scores.shape[1]))
    labels = np.repeat([f"b{b}" for b in range(len(scores))], 3)
    return highly_variable_genes(sp.csr_matrix(counts), n_top_genes, labels)


def test_batch_ranks_are_medians_over_the_batches_where_a_gene_is_in_the_top(monkeypatch):
    """Hand-computed ranks of 5 genes in 3 batches, top 3 (0 = most variable).

    Batch ranks: gene 0 (0, 0, 2), gene 1 (1, 1, 0), gene 2 (2, 2, -), gene 3 (-, -, -), gene 4 (-, -, 1):
    median ranks 0, 1, 2, NaN, 1 (the mean would give 2/3 for genes 0 and 1), batches in the top 3, 3, 2, 0, 1;
    selected: genes 0, 1 and 4 (median rank 0, 1, 1 before gene 2's 2).
    """
    scores = [[5, 4, 3, 2, 1], [5, 4, 3, 2, 1], [3, 5, 1, 2, 4]]
    table = _ranks_from_scores(monkeypatch, scores, 3)
    np.testing.assert_array_equal(table["highly_variable_rank"].to_numpy(), [0, 1, 2, np.nan, 1])
    np.testing.assert_array_equal(table["highly_variable_nbatches"].to_numpy(), [3, 3, 2, 0, 1])
    np.testing.assert_array_equal(table["highly_variable"].to_numpy(), [True, True, False, False, True])
    np.testing.assert_allclose(table["variances_norm"].to_numpy(), np.mean(scores, axis=0))


def test_equal_median_ranks_are_broken_by_the_number_of_batches(monkeypatch):
    """Top 1 of 4 genes in 3 batches: genes 0 (top in 2 batches) and 3 (top in 1) both have median rank 0;
    the gene top in more batches is the one selected.
    """
    scores = [[4, 3, 2, 1], [4, 2, 3, 1], [1, 2, 3, 4]]
    table = _ranks_from_scores(monkeypatch, scores, 1)
    np.testing.assert_array_equal(table["highly_variable_rank"].to_numpy(), [0, np.nan, np.nan, 0])
    np.testing.assert_array_equal(table["highly_variable_nbatches"].to_numpy(), [2, 0, 0, 1])
    np.testing.assert_array_equal(table["highly_variable"].to_numpy(), [True, False, False, False])
