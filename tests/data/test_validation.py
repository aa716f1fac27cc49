"""Bad input to setup_anndata and to a fitted model gets a clear, documented error."""

from __future__ import annotations

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

import countvae as cv
from countvae.errors import InvalidArgumentError, InvalidDataError, NotTrainedError, SetupError


def _adata(X, **obs):
    a = ad.AnnData(X=X)
    a.obs_names = [f"c{i}" for i in range(a.n_obs)]
    a.var_names = [f"g{j}" for j in range(a.n_vars)]
    for k, v in obs.items():
        a.obs[k] = v
    return a


def _counts(n=20, g=8, seed=0):
    return np.random.default_rng(seed).poisson(3.0, (n, g)).astype(np.float32) + np.eye(n, g, dtype=np.float32)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda X: X.__setitem__((0, 0), 1.5), "non-integer"),
        (lambda X: X.__setitem__((0, 0), -1.0), "negative"),
        (lambda X: X.__setitem__((0, 0), np.nan), "NaN or infinite"),
        (lambda X: X.__setitem__((0, 0), np.inf), "NaN or infinite"),
        (lambda X: X.__setitem__((slice(0, 2), slice(None)), 0.0), "2 of 20 cells"),
        (lambda X: X.__setitem__((slice(None), 3), 0.0), "1 of 8 genes"),
    ],
)
@pytest.mark.parametrize("fmt", ["dense", "csr", "csc"])
def test_bad_counts_are_refused(mutate, message, fmt):
    X = _counts()
    mutate(X)
    matrix = {"dense": X, "csr": sp.csr_matrix(X), "csc": sp.csc_matrix(X)}[fmt]
    adata = _adata(matrix)
    with pytest.raises(InvalidDataError, match=message):
        cv.CountVAE.setup_anndata(adata)
    assert "_countvae" not in adata.uns  # nothing registered on failure


def test_error_messages_say_how_to_fix():
    X = _counts()
    X[0, 0] = 0.5
    with pytest.raises(InvalidDataError, match="layer=") as info:
        cv.CountVAE.setup_anndata(_adata(X))
    assert "raw counts" in str(info.value)
    X = _counts()
    X[3] = 0
    with pytest.raises(InvalidDataError, match="filter_cells"):
        cv.CountVAE.setup_anndata(_adata(X))


def test_empty_and_non_numeric():
    with pytest.raises(InvalidDataError, match="empty"):
        cv.CountVAE.setup_anndata(_adata(np.zeros((0, 5), dtype=np.float32)))
    a = _adata(_counts())
    a.layers["text"] = np.full(a.shape, "1", dtype=object)
    with pytest.raises(InvalidDataError, match="dtype"):
        cv.CountVAE.setup_anndata(a, layer="text")


def test_missing_layer_and_keys():
    a = _adata(_counts(), batch=["a"] * 10 + ["b"] * 10)
    with pytest.raises(SetupError, match="layer 'counts' is not in adata.layers"):
        cv.CountVAE.setup_anndata(a, layer="counts")
    with pytest.raises(SetupError, match="batch_key='donor' is not a column"):
        cv.CountVAE.setup_anndata(a, batch_key="donor")
    with pytest.raises(SetupError, match="use_raw"):
        cv.CountVAE.setup_anndata(a, use_raw=True)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"batch_key": ["batch"]}, SetupError),
        ({"layer": 0}, SetupError),
        ({"labels_key": 5}, SetupError),
        ({"use_raw": "yes"}, InvalidArgumentError),
        ({"use_raw": 0}, InvalidArgumentError),
    ],
)
def test_setup_arguments_of_the_wrong_type_are_refused(kwargs, error):
    a = _adata(_counts(), batch=["a"] * 10 + ["b"] * 10)
    with pytest.raises(error, match=next(iter(kwargs))):
        cv.CountVAE.setup_anndata(a, **kwargs)
    assert "_countvae" not in a.uns


def test_a_view_of_a_backed_anndata_is_registered_through_its_file(tmp_path):
    _adata(_counts(), batch=["a"] * 10 + ["b"] * 10).write_h5ad(tmp_path / "a.h5ad")
    backed = ad.read_h5ad(tmp_path / "a.h5ad", backed="r")
    with pytest.raises(SetupError, match="before taking the subset"):
        cv.CountVAE.setup_anndata(backed[:10], batch_key="batch")
    cv.CountVAE.setup_anndata(backed, batch_key="batch")  # the remedy: its views keep the registration
    assert cv.data.get_registry(backed[:10]).batch_key == "batch"


def test_float16_counts_are_summed_without_overflow():
    counts = np.random.default_rng(0).poisson(60.0, (1500, 6)) + 1  # gene totals near 90,000 > float16's 65,504
    a = _adata(counts.astype(np.float16))
    summary = cv.data.setup_anndata(a)
    np.testing.assert_array_equal(summary.gene_totals, counts.sum(0))
    np.testing.assert_array_equal(summary.cell_totals, counts.sum(1))
    proportions = np.exp(cv.CountVAE(a, n_latent=2).data_summary.log_proportions)
    np.testing.assert_allclose(proportions, counts.sum(0) / counts.sum(), rtol=1e-12)


def test_batch_with_missing_values_refused():
    a = _adata(_counts(), batch=pd.Categorical(["a"] * 19 + [None]))
    with pytest.raises(InvalidDataError, match="1 missing values"):
        cv.CountVAE.setup_anndata(a, batch_key="batch")


@pytest.mark.parametrize(
    ("batch", "order"),
    [
        ([10, 9, 1, 2] * 5, ["1", "2", "9", "10"]),  # numbers sort as numbers, as scvi-tools orders them
        (["b", "a", "c", "a"] * 5, ["a", "b", "c"]),
        (pd.Categorical(["x", "y"] * 10, categories=["y", "x", "unused"]), ["y", "x"]),  # a categorical's order
    ],
)
def test_batch_categories_follow_pandas_order(batch, order):
    a = _adata(_counts(), batch=batch)
    cv.CountVAE.setup_anndata(a, batch_key="batch")
    assert cv.data.get_registry(a).batch_categories == order
    codes = cv.data.registry.batch_codes(a, cv.data.get_registry(a))
    assert [order[c] for c in codes] == [str(b) for b in a.obs["batch"]]


def test_duplicated_gene_names_refused():
    a = _adata(_counts())
    a.var_names = ["g0"] * 2 + [f"g{j}" for j in range(2, 8)]
    with pytest.raises(InvalidDataError, match="var_names_make_unique"):
        cv.CountVAE.setup_anndata(a)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.float64])
def test_dense_sparse_and_dtypes_accepted_identically(dtype):
    X = _counts().astype(dtype)
    latents = []
    for matrix in (X, sp.csr_matrix(X), sp.csc_matrix(X)):
        a = _adata(matrix)
        cv.CountVAE.setup_anndata(a)
        m = cv.CountVAE(a, n_latent=2, n_hidden=8)
        m.train(max_epochs=2, progress_bar=False, batch_size=8)
        latents.append(m.get_latent_representation())
    np.testing.assert_array_equal(latents[0], latents[1])
    np.testing.assert_array_equal(latents[0], latents[2])


def test_counts_in_layer_and_raw():
    X = _counts()
    a = _adata(np.log1p(X))
    a.layers["counts"] = sp.csr_matrix(X)
    cv.CountVAE.setup_anndata(a, layer="counts")
    m1 = cv.CountVAE(a, n_latent=2, n_hidden=8).train(max_epochs=2, progress_bar=False, batch_size=8)
    b = _adata(np.log1p(X))
    b.raw = _adata(X)
    cv.CountVAE.setup_anndata(b, use_raw=True)
    m2 = cv.CountVAE(b, n_latent=2, n_hidden=8).train(max_epochs=2, progress_bar=False, batch_size=8)
    np.testing.assert_array_equal(m1.get_latent_representation(), m2.get_latent_representation())


@pytest.mark.parametrize("n_latent", [0, -1, 8, 100, 2.5, True])
def test_bad_latent_size(small_adata, n_latent):
    a = _adata(_counts())
    cv.CountVAE.setup_anndata(a)
    with pytest.raises(InvalidArgumentError, match="n_latent"):
        cv.CountVAE(a, n_latent=n_latent)


def test_bad_options(small_adata):
    for kwargs, name in [
        ({"likelihood": "gaussian"}, "likelihood"),
        ({"decoder": "conv"}, "decoder"),
        ({"prior": "cauchy"}, "prior"),
        ({"dispersion": "gene-cell"}, "dispersion"),
        ({"dropout_rate": 1.5}, "dropout_rate"),
        ({"dtype": "float16"}, "dtype"),
    ]:
        with pytest.raises(InvalidArgumentError, match=name):
            cv.CountVAE(small_adata, n_latent=2, **kwargs)
    a = _adata(_counts())
    cv.CountVAE.setup_anndata(a)
    with pytest.raises(InvalidArgumentError, match="gene-batch"):
        cv.CountVAE(a, n_latent=2, dispersion="gene-batch")


def test_not_set_up_and_not_trained(small_adata):
    with pytest.raises(SetupError, match="setup_anndata"):
        cv.CountVAE(_adata(_counts()), n_latent=2)
    m = cv.CountVAE(small_adata, n_latent=2)
    for call in (m.get_latent_representation, m.get_normalized_expression, m.get_log_predictive_density, m.get_elbo):
        with pytest.raises(NotTrainedError, match="train"):
            call()


def test_bad_training_arguments(small_adata):
    m = cv.CountVAE(small_adata, n_latent=2)
    for kwargs in ({"max_epochs": 0}, {"batch_size": 0}, {"lr": -1.0}, {"train_size": 1.5}, {"engine": "jax"}):
        with pytest.raises(InvalidArgumentError):
            m.train(progress_bar=False, **kwargs)


def test_query_genes_must_match(trained_linear):
    a = trained_linear.adata
    with pytest.raises(InvalidDataError, match="missing"):
        trained_linear.get_latent_representation(a[:, :-3].copy())
    b = a[:, ::-1].copy()
    with pytest.raises(InvalidDataError, match="different order"):
        trained_linear.get_latent_representation(b)
    c = a.copy()
    c.var_names = [f"other{j}" for j in range(c.n_vars)]
    with pytest.raises(InvalidDataError, match="not in training"):
        trained_linear.get_latent_representation(c)


def test_query_unseen_batch_and_bad_counts(trained_linear):
    a = trained_linear.adata[:50].copy()
    a.obs["batch"] = pd.Categorical(["batch9"] * 50)
    with pytest.raises(InvalidDataError, match="batch9"):
        trained_linear.get_latent_representation(a)
    b = trained_linear.adata[:50].copy()
    b.X = b.X.toarray()
    b.X[0, 0] = 0.3
    with pytest.raises(InvalidDataError, match="non-integer"):
        trained_linear.get_latent_representation(b)
    c = trained_linear.adata[:50].copy()
    del c.obs["batch"]
    with pytest.raises(SetupError, match="batch"):
        trained_linear.get_latent_representation(c)


def test_query_without_the_raw_counts_of_a_raw_model():
    a = _adata(_counts(n=40), batch=["a"] * 20 + ["b"] * 20)
    a.raw = a.copy()
    cv.CountVAE.setup_anndata(a, use_raw=True)
    model = cv.CountVAE(a, n_latent=2, n_hidden=8).train(max_epochs=1, progress_bar=False)
    query = _adata(_counts(n=40), batch=["a"] * 40)  # not registered: read as the model reads, from adata.raw
    with pytest.raises(SetupError, match=r"reads its counts from adata.raw.X, which this AnnData lacks"):
        model.get_latent_representation(query)
    registered = a.copy()
    del registered.raw  # registered with use_raw=True, then its raw counts dropped
    with pytest.raises(SetupError, match="adata.raw is None"):
        model.get_latent_representation(registered)


def test_query_without_the_layer_of_a_layer_model_is_told_to_register():
    a = _adata(_counts(n=40))
    a.layers["counts"] = a.X.copy()
    cv.CountVAE.setup_anndata(a, layer="counts")
    model = cv.CountVAE(a, n_latent=2, n_hidden=8).train(max_epochs=1, progress_bar=False)
    query = _adata(_counts(n=40))
    with pytest.raises(SetupError, match=r"adata.layers\['counts'\], which this AnnData lacks; .*setup_anndata"):
        model.get_latent_representation(query)
    cv.CountVAE.setup_anndata(query)  # the remedy: its counts are in X
    assert model.get_latent_representation(query).shape == (40, 2)


def test_query_transfers_setup_from_model(trained_linear):
    a = trained_linear.adata[:40].copy()
    del a.uns["_countvae"]
    z = trained_linear.get_latent_representation(a)
    np.testing.assert_allclose(z, trained_linear.get_latent_representation(indices=np.arange(40)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("seed", ["0", 1.5, -1, True])
def test_split_seed_must_be_an_integer(seed):
    with pytest.raises(InvalidArgumentError, match="seed"):
        cv.data.split_indices(10, 0.5, seed)
    first, second = cv.data.split_indices(10, 0.5, np.int64(1))
    np.testing.assert_array_equal(np.sort(np.concatenate([first, second])), np.arange(10))


def test_counts_up_to_two_to_the_24_are_accepted_and_larger_refused():
    """2**24 is the largest integer float32 holds exactly: a count of 2**24 passes, 2**24 + 1 is refused."""
    from countvae.data.validation import MAX_EXACT_COUNT, validate_counts

    assert MAX_EXACT_COUNT == 16_777_216
    X = _counts().astype(np.float64)
    X[4, 2] = 2**24
    for matrix in (X, sp.csr_matrix(X)):
        assert validate_counts(matrix).gene_totals[2] == X[:, 2].sum()
    X[4, 2] = 2**24 + 1
    for matrix in (X, sp.csr_matrix(X), X.astype(np.int64)):
        with pytest.raises(InvalidDataError, match="16777217"):
            validate_counts(matrix)


def test_complex_counts_are_refused():
    """A complex matrix is numeric to numpy but cannot hold counts."""
    from countvae.data.validation import validate_counts

    with pytest.raises(InvalidDataError, match="dtype complex"):
        validate_counts(_counts().astype(np.complex128))


class _RowSliced:
    """Stands in for a backed dataset: a shape, a dtype and contiguous row slices, nothing else."""

    def __init__(self, matrix):
        self.matrix, self.shape, self.dtype = matrix, matrix.shape, matrix.dtype

    def __getitem__(self, rows):
        assert isinstance(rows, slice)
        return self.matrix[rows]


def test_totals_add_up_over_chunks_of_rows():
    """Known answer: the cell and gene totals of a matrix read in several chunks of 4096 rows equal its sums."""
    from countvae.data.validation import count_totals, validate_counts

    X = np.random.default_rng(1).poisson(2.0, (9000, 5)).astype(np.float32) + 1
    for matrix in (X, sp.csc_matrix(X), _RowSliced(X), _RowSliced(sp.csr_matrix(X))):
        for summary in (validate_counts(matrix), count_totals(matrix)):
            np.testing.assert_array_equal(summary.gene_totals, X.sum(0, dtype=np.float64))
            np.testing.assert_array_equal(summary.cell_totals, X.sum(1, dtype=np.float64))
    X[8999] = 0  # the last cell, in the last chunk
    with pytest.raises(InvalidDataError, match="1 of 9000 cells"):
        validate_counts(_RowSliced(X))


def test_batch_codes_refuse_missing_values_and_follow_the_registry_order():
    """Codes index the registry's categories (here ``["y", "x"]``, a categorical's order); a missing batch in
    data coded later (a query) is refused by name rather than read as a batch called "nan"."""
    a = _adata(_counts(), batch=pd.Categorical(["x", "y"] * 10, categories=["y", "x"]))
    cv.data.setup_anndata(a, batch_key="batch")
    registry = cv.data.get_registry(a)
    np.testing.assert_array_equal(cv.data.registry.batch_codes(a, registry), [1, 0] * 10)
    query = _adata(_counts(), batch=["x"] * 19 + [np.nan])
    with pytest.raises(InvalidDataError, match="missing values"):
        cv.data.registry.batch_codes(query, registry)


def test_a_missing_dataset_lists_every_folder_searched_including_the_one_beside_the_repository(tmp_path, monkeypatch):
    # The message kept 6 of 8 folders, leaving out shared/data beside the repository (which it recommends), and
    # listed a folder under datasets.py itself.
    from pathlib import Path

    import countvae
    from countvae.data.datasets import DATA_DIR_ENV, find_dataset
    from countvae.errors import DataFileNotFoundError

    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)
    beside = Path(countvae.__file__).resolve().parents[2] / "shared" / "data" / "no_such.h5ad"
    monkeypatch.setitem(countvae.data.datasets.DATASETS, "missing", "no_such.h5ad")
    with pytest.raises(DataFileNotFoundError) as raised:
        find_dataset("missing")
    listed = str(raised.value).split("Looked in:")[1].split()
    assert str(beside) in listed and str(tmp_path / "empty" / "no_such.h5ad") == listed[0]
    assert not any(".py/" in place for place in listed)
