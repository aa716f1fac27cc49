"""Downstream agreement between fits (DE calls, Leiden clusters, neighbourhoods) against known answers."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from scipy.stats import ortho_group

from countvae.diagnostics.analyses import downstream as ds
from countvae.errors import InvalidArgumentError, MissingDependencyError


# ----- the decomposition ------------------------------------------------------------------------------
def test_model_share_known_answers():
    half = ds.model_share([0.8, 0.8], [0.9])
    assert half["disagreement_between"] == pytest.approx(0.2)
    assert half["disagreement_within"] == pytest.approx(0.1)
    assert half["model_share"] == pytest.approx(0.5)
    assert ds.model_share([0.6], [])["model_share"] == 1.0  # deterministic downstream step: all the model's
    assert ds.model_share([0.7, 0.9], [0.7])["model_share"] == pytest.approx(0.0, abs=1e-12)  # baseline as bad
    assert ds.model_share([0.9], [0.5])["model_share"] == 0.0  # clipped, never negative
    assert np.isnan(ds.model_share([1.0, 1.0], [1.0])["model_share"])  # nothing varies
    with pytest.raises(InvalidArgumentError, match="two model seeds"):
        ds.model_share([], [0.5])


# ----- differential expression ---------------------------------------------------------------------------
def test_de_agreement_known_answers():
    genes = 40
    first_ten = np.arange(genes) < 10
    shifted = (np.arange(genes) < 5) | ((np.arange(genes) >= 10) & (np.arange(genes) < 15))
    lfc = np.linspace(-2, 2, genes)
    calls = {"seed0": first_ten, "seed1": shifted, "seed2": first_ten}
    lfcs = {"seed0": lfc, "seed1": lfc[::-1], "seed2": lfc}
    pairs, summary = ds.de_agreement(calls, lfcs, {"seed0": first_ten}, {"seed0": lfc})
    between = pairs[pairs["kind"] == ds.BETWEEN].set_index(["fit_a", "fit_b"])
    assert between.loc[("seed0", "seed1"), "jaccard"] == pytest.approx(5 / 15)
    assert between.loc[("seed0", "seed2"), "jaccard"] == 1.0
    assert between.loc[("seed0", "seed1"), "spearman"] == pytest.approx(-1.0)
    within = pairs[pairs["kind"] == ds.WITHIN]
    assert len(within) == 1 and within["jaccard"].iloc[0] == 1.0
    row = summary.set_index("metric").loc["jaccard"]
    assert row["between_mean"] == pytest.approx((1 / 3 + 1 + 1 / 3) / 3)
    assert row["model_share"] == 1.0  # resampling one fit changes nothing; fits differ
    with pytest.raises(InvalidArgumentError, match="same fits"):
        ds.de_agreement(calls, {"seed0": lfc}, {}, {})
    with pytest.raises(InvalidArgumentError, match="different genes"):
        ds.de_agreement({"a": first_ten, "b": first_ten[:5]}, {"a": lfc, "b": lfc}, {}, {})


def test_de_agreement_when_all_disagreement_is_monte_carlo():
    rng = np.random.default_rng(0)
    base = rng.standard_normal(200)
    # every result is the same truth plus independent noise: fits and resamples alike
    noisy = {f"fit{i}": base + 0.3 * rng.standard_normal(200) for i in range(4)}
    again = {f"fit{i}": base + 0.3 * rng.standard_normal(200) for i in range(4)}
    pairs, summary = ds.de_agreement(
        {k: v > 1 for k, v in noisy.items()}, noisy, {k: v > 1 for k, v in again.items()}, again
    )
    shares = summary.set_index("metric")["model_share"]
    assert shares["spearman"] < 0.3 and shares["jaccard"] < 0.3


# ----- clusters ---------------------------------------------------------------------------------------
def test_label_agreement_identical_permuted_and_independent():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 5, 3000)
    renamed = (labels + 2) % 5
    independent = rng.integers(0, 5, 3000)
    pairs, summary = ds.label_agreement({"a": labels, "b": renamed, "c": independent}, {"a": labels})
    between = pairs[pairs["kind"] == ds.BETWEEN].set_index(["fit_a", "fit_b"])
    assert between.loc[("a", "b"), "ari"] == pytest.approx(1.0)
    assert between.loc[("a", "b"), "nmi"] == pytest.approx(1.0)
    assert abs(between.loc[("a", "c"), "ari"]) < 0.01 and between.loc[("a", "c"), "nmi"] < 0.01
    assert set(summary["metric"]) == {"ari", "nmi"}


def test_cluster_agreement_rotation_is_no_change_and_unrelated_fits_are():
    rng = np.random.default_rng(3)
    z = rng.standard_normal((300, 4))
    q = ortho_group.rvs(4, random_state=4)
    # a rotated copy has the same k-NN graph: same seed, same clusters
    pairs, _ = ds.cluster_agreement({"fit": z, "rotated": z @ q}, n_neighbors=10)
    between = pairs[pairs["kind"] == ds.BETWEEN]
    assert between["ari"].iloc[0] == 1.0 and between["nmi"].iloc[0] == pytest.approx(1.0)
    # unrelated latents: clusters agree far less between fits than between Leiden seeds of one fit
    unrelated = {f"fit{i}": np.random.default_rng(10 + i).standard_normal((300, 4)) for i in range(3)}
    pairs, summary = ds.cluster_agreement(unrelated, n_neighbors=10)
    ari = summary.set_index("metric").loc["ari"]
    assert ari["between_mean"] < 0.1 < ari["within_mean"]
    assert ari["model_share"] > 0.5
    with pytest.raises(InvalidArgumentError, match="two different"):
        ds.cluster_agreement(unrelated, seeds=(1, 1))


@pytest.mark.parametrize("flavor", ["igraph", "leidenalg"])
def test_cluster_labels_are_scanpys_own_leiden_labels(flavor):
    """What an analyst runs on obsm["X_countvae"] gives exactly the labels the report compares."""
    import anndata as ad
    import pandas as pd
    import scanpy as sc

    z = np.random.default_rng(5).standard_normal((400, 4)).astype(np.float32)
    analyst = ad.AnnData(obs=pd.DataFrame(index=[f"cell{i}" for i in range(len(z))]))
    analyst.obsm["X_countvae"] = z
    sc.pp.neighbors(analyst, use_rep="X_countvae", n_neighbors=12)
    for seed, resolution in ((0, 1.0), (3, 0.6)):
        sc.tl.leiden(analyst, resolution=resolution, random_state=seed, key_added="mine", **ds.LEIDEN_FLAVORS[flavor])
        ours = ds.scanpy_leiden(ds.scanpy_graph(z, 12), resolution, seed, flavor)
        np.testing.assert_array_equal(ours, analyst.obs["mine"].astype(int).to_numpy())
    pairs, _ = ds.cluster_agreement({"a": z, "b": z.copy()}, 12, 0.6, (3, 4), flavor)
    assert pairs.loc[pairs["kind"] == ds.BETWEEN, "ari"].iloc[0] == 1.0  # same graph, same seed: same labels
    with pytest.raises(InvalidArgumentError, match="flavor"):
        ds.scanpy_leiden(ds.scanpy_graph(z, 12), flavor="louvain")


def test_umap_embedding_is_scanpys_own_umap():
    import anndata as ad
    import pandas as pd
    import scanpy as sc

    z = np.random.default_rng(6).standard_normal((150, 3)).astype(np.float32)
    analyst = ad.AnnData(obs=pd.DataFrame(index=[f"cell{i}" for i in range(len(z))]))
    analyst.obsm["X_countvae"] = z
    sc.pp.neighbors(analyst, use_rep="X_countvae", n_neighbors=10)
    sc.tl.umap(analyst, random_state=4)
    out = ds.umap_embedding(z, seed=4, n_neighbors=10)
    assert out.shape == (150, 2) and out.dtype == np.float64
    np.testing.assert_allclose(out, analyst.obsm["X_umap"], rtol=0, atol=1e-6)


def test_missing_optional_dependency_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "leidenalg", None)
    with pytest.raises(MissingDependencyError, match=r"countvae\[downstream\]"):
        ds.scanpy_leiden(ds.scanpy_graph(np.random.default_rng(0).standard_normal((20, 2)), 3), flavor="leidenalg")
    monkeypatch.setitem(sys.modules, "scanpy", None)
    with pytest.raises(MissingDependencyError, match="scanpy"):
        ds.cluster_agreement({"a": np.zeros((20, 2)), "b": np.ones((20, 2))}, n_neighbors=3)
    monkeypatch.setitem(sys.modules, "umap", None)
    with pytest.raises(ImportError, match="umap"):
        ds.umap_embedding(np.zeros((20, 2)))


# ----- neighbourhoods ------------------------------------------------------------------------------------
def test_neighbourhood_overlap_identical_rotated_and_independent():
    rng = np.random.default_rng(5)
    z = rng.standard_normal((500, 5))
    assert ds.neighbourhood_overlap(z, z, k=10) == 1.0
    assert ds.neighbourhood_overlap(z, 3.0 * z @ ortho_group.rvs(5, random_state=6), k=10) == pytest.approx(1.0)
    independent = ds.neighbourhood_overlap(z, rng.standard_normal((500, 5)), k=10)
    assert independent < 0.03  # about k / (2 n) = 0.01
    pairs, summary = ds.neighbourhood_agreement({"a": z, "b": z @ ortho_group.rvs(5, random_state=7)}, k=10)
    row = summary.iloc[0]
    assert row["between_mean"] == pytest.approx(1.0) and row["n_within"] == 0 and np.isnan(row["model_share"])


class _FakeUMAP:
    """A seeded stand-in embedding: the latent's first two dims plus seeded noise."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def fit_transform(self, x):
        rng = np.random.default_rng(self.kwargs["random_state"])
        return x[:, :2] + 0.3 * rng.standard_normal((len(x), 2))


def test_umap_agreement_baseline_varies_only_the_embedding_seed():
    z = np.random.default_rng(9).standard_normal((200, 3))

    def embed(latent, seed):  # deterministic in (latent, seed), like seeded UMAP
        return _FakeUMAP(random_state=seed).fit_transform(latent)

    pairs, summary = ds.umap_agreement({"fit": z, "copy": z.copy()}, k=10, embed=embed)
    assert list(pairs["kind"]) == [ds.BETWEEN, ds.WITHIN, ds.WITHIN]
    row = summary.iloc[0]
    # the fits are equal, so between fits (same seed) nothing changes; the seed alone moves neighbours
    assert row["between_mean"] == 1.0 and row["within_mean"] < 0.9 and np.isnan(row["model_share"])
    with pytest.raises(InvalidArgumentError, match="two different"):
        ds.umap_agreement({"fit": z, "copy": z}, seeds=(2, 2), embed=embed)


def test_model_share_summary_fields_by_hand():
    # Between-fit scores 0.8 and 0.6: mean 0.7, minimum 0.6, disagreement 0.3; within 0.9: excess 0.2, share 2/3.
    out = ds.model_share([0.8, 0.6], [0.9])
    assert out["between_mean"] == pytest.approx(0.7) and out["between_min"] == pytest.approx(0.6)
    assert out["within_mean"] == pytest.approx(0.9)
    assert out["model_excess"] == pytest.approx(0.2) and out["model_share"] == pytest.approx(2 / 3)
    assert (out["n_between"], out["n_within"]) == (2, 1)


def test_label_agreement_ari_by_hand():
    # a = (0,0,0,1,1,1), b = (0,0,1,1,1,1): contingency pairs sum 4, row pairs 6, column pairs 7, all pairs 15:
    # ARI = (4 - 6*7/15) / ((6 + 7)/2 - 6*7/15) = 12/37. NMI by entropies: H(a) = ln 2, H(b) = H(1/3, 2/3),
    # I = H(b) - H(b|a) with H(b|a) = H(1/3, 2/3) / 2; arithmetic normalisation (H(a) + H(b)) / 2.
    a, b = np.array([0, 0, 0, 1, 1, 1]), np.array([0, 0, 1, 1, 1, 1])
    pairs, _ = ds.label_agreement({"a": a, "b": b}, {})
    h_b = -(1 / 3) * np.log(1 / 3) - (2 / 3) * np.log(2 / 3)
    mutual = h_b - h_b / 2
    row = pairs.iloc[0]
    assert row["ari"] == pytest.approx(12 / 37)
    assert row["nmi"] == pytest.approx(mutual / ((np.log(2) + h_b) / 2))


def test_graph_of_more_cells_than_scanpys_exact_search():
    """Above 8,192 cells scanpy builds the graph with pynndescent: the graph still comes back, of the nearest cells.

    This is the path of every report with many held-out cells; pynndescent 0.7 returned sparse arrays that
    scanpy 1.11 could not read (hence the bound in the ``downstream`` extra).
    """
    from sklearn.neighbors import NearestNeighbors

    z = np.random.default_rng(7).standard_normal((8300, 5)).astype(np.float32)
    graph = ds.scanpy_graph(z, 15)
    distances = graph.obsp["distances"].tocsr()
    exact = NearestNeighbors(n_neighbors=15).fit(z).kneighbors(z, return_distance=False)[:, 1:]
    recalls = []
    for cell, nearest in enumerate(exact):
        row = distances[cell]
        others = row.indices[row.indices != cell]  # this path stores the cell itself at distance 0
        found = others[np.argsort(row.data[row.indices != cell], kind="stable")][:14]
        assert len(found) == 14
        recalls.append(len(set(found) & set(nearest)) / 14)
    recall = np.mean(recalls)
    assert recall > 0.95  # approximate search, but of the nearest cells


def test_a_scanpy_that_cannot_read_pynndescents_matrix_gets_an_error_naming_the_fix(monkeypatch):
    """What scanpy 1.11 raises on pynndescent 0.7's sparse array becomes an error naming the pynndescent to install."""
    import scanpy as sc

    def unreadable(*args, **kwargs):
        raise AttributeError("'csr_array' object has no attribute 'getnnz'")

    monkeypatch.setattr(sc.pp, "neighbors", unreadable)
    with pytest.raises(MissingDependencyError, match=r"pynndescent<0\.7") as caught:
        ds.scanpy_graph(np.zeros((20, 2), dtype=np.float32), 3)
    assert isinstance(caught.value.__cause__, AttributeError)

    def other(*args, **kwargs):
        raise AttributeError("something else")

    monkeypatch.setattr(sc.pp, "neighbors", other)
    with pytest.raises(AttributeError, match="something else"):  # any other fault is not disguised
        ds.scanpy_graph(np.zeros((20, 2), dtype=np.float32), 3)


def test_rank_correlation_is_spearmans_one_for_any_monotone_map_and_pearson_of_ranks_otherwise() -> None:
    """``b = sign(a) a^4`` keeps the genes' order but not their spacing: Spearman is exactly 1 (and -1 reversed),
    where Pearson would be about 0.87. On unrelated noisy values it equals Pearson's correlation of the ranks computed
    here with numpy (no ties). Catches a Pearson correlation in place of Spearman; not the handling of ties.
    """
    a = np.linspace(-3.0, 3.0, 200)
    b = np.sign(a) * a**4
    assert ds.rank_correlation(a, b) == pytest.approx(1.0, abs=1e-12)
    assert ds.rank_correlation(a, -b) == pytest.approx(-1.0, abs=1e-12)
    rng = np.random.default_rng(0)
    x = rng.normal(size=100)
    y = np.exp(x + rng.normal(size=100))
    ranks = [np.argsort(np.argsort(v)).astype(np.float64) for v in (x, y)]
    assert ds.rank_correlation(x, y) == pytest.approx(np.corrcoef(*ranks)[0, 1], abs=1e-12)
