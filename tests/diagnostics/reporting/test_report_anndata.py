"""The report's findings in AnnData (``DiagnosticReport.write``, ``diagnose --write-h5ad``) and its model card.

Known answers: the per-cell and per-gene functions on arrays whose answer is known
by hand; the consensus latent recovers a latent from rotated copies; the fit cells'
columns single out a planted group of fit cells the seeds place apart; the per-cell
columns average to the report's own rows (held-out cells) and to the training-cells
section's row (fit cells); the whole scanpy recipe runs on a file read back from disk.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import anndata as ad
import matplotlib
import numpy as np
import pandas as pd
import pytest
from sklearn.neighbors import kneighbors_graph

import countvae as cv
from countvae.cli import main
from countvae.data import split_indices
from countvae.diagnostics import CountVAEFit, DownstreamRequest, DownstreamSettings, SeedFits, report
from countvae.diagnostics.analyses import stability_columns as sc_cols
from countvae.diagnostics.analyses.maps import PairMaps
from countvae.diagnostics.analyses.subspace import analyst_graph_k, subsample
from countvae.diagnostics.reporting.anndata_export import CONSENSUS_KEY, UNS_KEY, h5ad_ready
from countvae.diagnostics.reporting.model_card import calibration_regime, settings_line
from countvae.diagnostics.reporting.sections.per_cell import fit_cell_columns, within_seed_overlap
from countvae.diagnostics.reporting.settings import ReportSettings
from countvae.errors import InvalidArgumentError, InvalidDataError, OutputExistsError

TINY = dict(
    n_lpd_samples=20,
    max_lpd_cells=60,
    n_rhat_draws=20,
    n_rhat_cells=6,
    max_jacobian_cells=30,
    n_ppc_samples=4,
    n_bootstrap=50,
    max_genes=30,
)


# ----- known answers on arrays --------------------------------------------------------------------------
def test_knn_agreement_is_one_for_rotations_and_low_for_unrelated_latents():
    rng = np.random.default_rng(0)
    z = rng.standard_normal((200, 3))
    q, _ = np.linalg.qr(rng.standard_normal((3, 3)))
    np.testing.assert_allclose(sc_cols.cell_knn_agreement({"a": z, "b": z @ q, "c": -z}, k=5), 1.0)
    unrelated = sc_cols.cell_knn_agreement({"a": z, "b": rng.standard_normal((200, 3))}, k=5)
    assert unrelated.shape == (200,) and unrelated.mean() < 0.1
    np.testing.assert_allclose(sc_cols.cell_knn_baseline({"a": np.stack([z, z @ q])}, k=5), 1.0)


def test_knn_agreement_of_a_hand_made_case():
    # 1-D points; with k=1 every cell's neighbour is known: in a {1}, {0}, {3}, {2}, {3}
    a = np.array([[0.0], [1.0], [5.0], [6.5], [20.0]])
    b = 2.0 * a  # a scaled copy: the same neighbours
    c = np.array([[0.0], [4.0], [5.0], [9.5], [20.0]])  # neighbours {1}, {2}, {1}, {2}, {3}
    # pairs (a,b): all agree; (a,c) and (b,c): cells 0, 3 and 4 agree, cells 1 ({0} vs {2}) and 2 ({3} vs {1}) not
    jac_ac = np.array([1.0, 0.0, 0.0, 1.0, 1.0])
    np.testing.assert_allclose(sc_cols.cell_knn_agreement({"a": a, "b": b, "c": c}, k=1), (1.0 + 2 * jac_ac) / 3)


def test_gene_decoded_agreement_is_lins_concordance_by_hand():
    base = np.array([0.0, 1.0, 2.0, 3.0])  # population variance 1.25
    a = np.column_stack([base, base, base])
    b = np.column_stack([base, base + 1.0, 2.0 * base])
    # gene 0 identical: 1; gene 1 shifted by 1: 2 * 1.25 / (2 * 1.25 + 1); gene 2 doubled: 2 * 2.5 / (1.25 + 5 + 2.25)
    expected = np.array([1.0, 2.5 / 3.5, 5.0 / 8.5])
    np.testing.assert_allclose(sc_cols.gene_decoded_agreement({"a": a, "b": b}), expected)
    # three fits: the mean over the three pairs
    c = a.copy()
    np.testing.assert_allclose(
        sc_cols.gene_decoded_agreement({"a": a, "b": b, "c": c}), (1.0 + 2 * expected) / 3, rtol=1e-12
    )


def test_lpd_summary_and_de_frequency_by_hand():
    mean, sd = sc_cols.cell_lpd_summary({"a": np.array([-10.0, -4.0]), "b": np.array([-12.0, -4.0])})
    np.testing.assert_allclose(mean, [-11.0, -4.0])
    np.testing.assert_allclose(sd, [np.sqrt(2.0), 0.0])
    calls = pd.DataFrame({"a": [True, False, True], "b": [True, False, False]}, index=["g0", "g1", "g2"])
    assert sc_cols.de_call_frequency(calls).to_dict() == {"g0": 1.0, "g1": 0.0, "g2": 0.5}


def test_consensus_latent_recovers_a_latent_from_rotated_copies():
    rng = np.random.default_rng(1)
    truth = rng.standard_normal((300, 4)) + np.array([0.5, -1.0, 0.0, 2.0])
    rotations = [np.linalg.qr(rng.standard_normal((4, 4)))[0] for _ in range(3)]
    latents = {"ref": truth} | {f"rot{i}": truth @ q for i, q in enumerate(rotations)}
    consensus = sc_cols.consensus_latent(latents, PairMaps(latents).to_reference("ref"))
    np.testing.assert_allclose(consensus, truth, atol=1e-10)
    # with independent noise per copy, averaging reduces the error below any single copy's
    noisy = {name: z + 0.1 * rng.standard_normal(z.shape) for name, z in latents.items()}
    maps = PairMaps(noisy).to_reference("ref")
    consensus = sc_cols.consensus_latent(noisy, maps)
    single = np.sqrt(np.mean((noisy["ref"] - truth) ** 2))
    assert np.sqrt(np.mean((consensus - truth) ** 2)) < 0.7 * single


def test_h5ad_ready_stores_what_h5ad_can():
    record = h5ad_ready({"a/b": None, "x": [1, "two"], "rows": [{"k": np.nan}], "n": np.int64(3)})
    assert record == {"a or b": "", "x": ["1", "two"], "rows": {"0": {"k": ""}}, "n": 3}


def test_calibration_regime_by_size():
    assert calibration_regime(40) == "few cells" and calibration_regime(150) == "few cells"
    assert calibration_regime(300) == "seeds" and calibration_regime(50_000) == "seeds"


def test_fit_cell_columns_single_out_the_fit_cells_the_seeds_place_apart():
    """Two fits equal up to a rotation except on a far group of fit cells, where the second adds noise.

    Known answer: every other cell keeps its neighbours exactly (1.0, the noisy group lies 50 apart, beyond any
    neighbourhood); the noisy cells keep few. Identical guide draws give a within-seed overlap of exactly 1.
    """
    rng = np.random.default_rng(4)
    rotation, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    held, clean, far = rng.normal(size=(150, 3)), rng.normal(size=(250, 3)), rng.normal(size=(100, 3)) + 50.0
    fit_a = np.vstack([clean, far])
    fit_b = np.vstack([clean, far + 1.0 * rng.normal(size=far.shape)]) @ rotation
    arrays = {
        "latent": {"a": held, "b": held @ rotation},
        "latent_fit": {"a": fit_a, "b": fit_b},
        "latent_fit_all": {"a": None, "b": None},  # latent_fit holds every fit cell
        "knn_draws": {"a": np.stack([held, held]), "b": np.stack([held, held]) @ rotation},
        "knn_draws_fit": {"a": np.stack([fit_a, fit_a]), "b": np.stack([fit_b, fit_b])},
    }
    c = SimpleNamespace(
        per_fit=arrays.__getitem__,
        n_cells=150,
        n_fit_cells=350,
        subsets=SimpleNamespace(knn=None, fit=np.arange(350)),
        fit_obs_names=pd.Index([f"fit{i}" for i in range(350)]),
        names=["a", "b"],
    )
    s = ReportSettings(k=10)
    heldout_within, fit_within = within_seed_overlap(c, s)
    assert heldout_within.shape == (150,) and fit_within.shape == (350,)
    np.testing.assert_allclose(np.concatenate([heldout_within, fit_within]), 1.0)
    cells = fit_cell_columns(c, s, fit_within, batch_scores=np.full(350, 0.5))
    assert list(cells.index[:2]) == ["fit0", "fit1"] and not cells["heldout"].any()
    np.testing.assert_allclose(cells["knn_agreement"].to_numpy()[:250], 1.0)
    assert cells["knn_agreement"].to_numpy()[250:].mean() < 0.3
    np.testing.assert_allclose(cells["knn_agreement_within_seed"], 1.0)
    np.testing.assert_array_equal(cells["batch_mixing"], 0.5)
    no_fit = SimpleNamespace(**{**vars(c), "per_fit": {**arrays, "latent_fit": {"a": None, "b": None}}.__getitem__})
    assert fit_cell_columns(no_fit, ReportSettings()) is None


def test_within_seed_overlap_draws_every_cell_of_the_graph():
    """Held-out and fit cells drawn together: a cell's value does not depend on which kind of cell it is.

    Known answer with k = 1 on a line: the second draw swaps two fit cells' positions, so exactly the cells whose
    nearest neighbour was one of them (or who are them) change neighbours, whatever group they are in.
    """
    held = np.array([[0.0], [10.0]])
    fit_first = np.array([[1.0], [11.0], [30.0], [31.5]])
    fit_second = np.array([[11.0], [1.0], [30.0], [31.5]])  # the cells at 1 and 11 trade places
    arrays = {
        "latent": {"a": held, "b": held},
        "latent_fit": {"a": fit_first, "b": fit_first},
        "latent_fit_all": {"a": None, "b": None},  # absent: the fit cells above are all of them
        "knn_draws": {"a": np.stack([held, held]), "b": np.stack([held, held])},
        "knn_draws_fit": {"a": np.stack([fit_first, fit_second]), "b": np.stack([fit_first, fit_first])},
    }
    c = SimpleNamespace(
        per_fit=arrays.__getitem__, n_cells=2, n_fit_cells=4, subsets=SimpleNamespace(knn=None), names=["a", "b"]
    )
    heldout, fit = within_seed_overlap(c, ReportSettings(k=1))
    # fit "a": held-out cell 0's neighbour is fit cell 0 in draw 1 and fit cell 1 in draw 2 (overlap 0), held-out
    # cell 1's the other way round; fit cells 0 and 1 keep a held-out neighbour of another index; 2 and 3 keep theirs.
    # Fit "b" is drawn identically (1 everywhere); the column is the mean over fits.
    np.testing.assert_allclose(heldout, [0.5, 0.5])
    np.testing.assert_allclose(fit, [0.5, 0.5, 1.0, 1.0])


# ----- a small report -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_fits():
    """Two seeds of a linear model on two groups of cells, the DE request, and the data."""
    adata = cv.data.simulate(
        n_cells=600, n_genes=40, n_latent=2, decoder="linear", n_groups=2, n_de_genes=4, de_lfc=(2.0, 3.0), seed=3
    )
    cv.CountVAE.setup_anndata(adata)
    fit_idx, held_idx = split_indices(adata.n_obs, 0.7, 0)
    fit_data, held = adata[fit_idx].copy(), adata[held_idx].copy()
    fits = []
    for seed in (0, 1):
        model = cv.CountVAE(fit_data, n_latent=2, decoder="linear")
        model.train(max_epochs=30, batch_size=256, lr=3e-3, progress_bar=False, seed=seed)
        fits.append(CountVAEFit(model, seed))
    downstream = DownstreamRequest(
        "group", "group1", "group0", settings=DownstreamSettings(n_de_samples=300, clusters=False, umap=False)
    )
    seed_fits = SeedFits(fits=fits, adata_fit=fit_data, adata_heldout=held, settings={"note": "test"})
    return seed_fits, downstream, adata, held


@pytest.fixture(scope="module")
def small(small_fits):
    """The report with DE of :func:`small_fits`, and the data."""
    seed_fits, downstream, adata, held = small_fits
    return report(seed_fits, downstream=downstream, **TINY), adata, held


def test_key_notes_give_the_k_of_the_knn_columns(small, small_fits):
    rep, adata, _ = small
    target = adata.copy()
    rep.write(target)
    notes = target.uns[UNS_KEY]["key_notes"]
    assert rep.cells_knn_k == 15  # every cell is on the graph: the report's k
    for key in ("countvae_knn_agreement", "countvae_knn_agreement_within_seed"):
        assert notes[key].endswith("; k=15 neighbours per cell")
    # a graph standing for ten times the cells: k is scaled down, and the note says so
    scaled = report(small_fits[0], knn_graph_cells=10 * adata.n_obs, **TINY)
    k = analyst_graph_k(15, adata.n_obs, 10 * adata.n_obs)
    assert scaled.cells_knn_k == k < 15
    target = adata.copy()
    scaled.write(target)
    note = target.uns[UNS_KEY]["key_notes"]["countvae_knn_agreement"]
    assert note.endswith(
        f"; k={k} neighbours per cell, the report's k=15 scaled to the share of the cells the graph holds"
    )


def test_cell_columns_average_to_the_reports_rows(small):
    rep, adata, held = small
    cells = rep.cells[rep.cells["heldout"]]
    assert list(cells.index) == list(held.obs_names)
    row = rep.invariants.set_index("quantity").loc["k-NN graph"]
    # one pair of fits: the mean over cells of the per-cell overlap is the report's k-NN agreement
    assert cells["knn_agreement"].mean() == pytest.approx(row["agreement_mean"], rel=1e-12)
    assert cells["knn_agreement_within_seed"].between(0, 1).all()
    lpd = cells["lpd_mean"].dropna()
    assert len(lpd) == TINY["max_lpd_cells"] and cells["lpd_mean"].isna().sum() == held.n_obs - len(lpd)
    assert lpd.mean() == pytest.approx(rep.predictive["lpd_per_cell"].mean(), rel=1e-10)
    genes = rep.genes["decoded_agreement"]
    assert genes.notna().sum() == TINY["max_genes"] and genes.dropna().between(-1, 1).all()
    assert rep.consensus_latent.shape == (adata.n_obs, 2)


def test_fit_cell_columns_average_to_the_training_cells_row(small):
    """The fit cells' per-cell overlap, averaged over the training-cells section's cells, is that section's k-NN row.

    Two routes to one number: the per-cell column (each fit cell against the held-out cells' graph) and the
    invariants table run on the section's subset of fit cells with the other cells as reference.
    """
    rep, adata, held = small
    fit = rep.cells[~rep.cells["heldout"]]
    assert len(fit) == adata.n_obs - held.n_obs and not fit.index.isin(held.obs_names).any()
    assert fit["knn_agreement"].between(0, 1).all() and fit["knn_agreement_within_seed"].between(0, 1).all()
    assert fit["lpd_mean"].isna().all() and fit["lpd_sd"].isna().all()
    chosen = subsample(len(fit), held.n_obs, ReportSettings().seed + 9)  # the section's subset of fit cells
    table = rep.tables["training_cells"].set_index("quantity")
    expected = table.loc["k-NN graph", "training_agreement"]
    assert fit["knn_agreement"].iloc[chosen].mean() == pytest.approx(expected, rel=1e-12)


def _jaccard(graphs: list, rows: np.ndarray) -> np.ndarray:
    """Per row, the mean over pairs of graphs of the Jaccard overlap of its neighbour lists."""
    pairs = [(ga, gb) for i, ga in enumerate(graphs) for gb in graphs[i + 1 :]]
    return np.array([[len(set(a[r]) & set(b[r])) / len(set(a[r]) | set(b[r])) for r in rows] for a, b in pairs])


def test_read_on_subsets_the_knn_row_and_columns_are_those_of_the_graph_on_every_cell(seed_fits):
    """Known answer by brute force: 100 of 300 held-out and 200 of 700 fit cells read, the k-NN row, its per-cell
    column and the training cells' k-NN row are the 15-NN overlaps of the graph on all 1,000 cells.

    On the 300 cells read alone, k would be scaled to 15 x 300 / 1,000 (4): the within-seed baseline keeps that graph.
    """
    sections = ["per_cell", "training_cells", "about"]
    rep = report(seed_fits, sections=sections, ica=False, **TINY, max_knn_cells=100, max_fit_cells=200)
    held, fit = seed_fits.adata_heldout, seed_fits.adata_fit
    latents = [np.vstack([f.latent(held), f.latent(fit)]) for f in seed_fits.fits]
    graphs = [kneighbors_graph(z, 15, include_self=False).tolil().rows for z in latents]  # every cell, k = 15
    s = ReportSettings()
    knn, fit_rows = subsample(held.n_obs, 100, s.seed), subsample(fit.n_obs, 200, s.seed + 5)  # the cells read
    row = rep.invariants.set_index("quantity").loc["k-NN graph"]
    by_pair = _jaccard(graphs, knn)
    assert row["agreement"] == pytest.approx(by_pair.mean(axis=1).min(), abs=1e-12)
    assert row["agreement_mean"] == pytest.approx(by_pair.mean(), abs=1e-12)
    assert row["interval"].endswith("their rows of the k=15 graph on 1,000 cells (held-out and fit cells)")
    cells = rep.cells["knn_agreement"]
    np.testing.assert_allclose(cells[held.obs_names[knn]], by_pair.mean(axis=0), atol=1e-12)
    np.testing.assert_allclose(cells[fit.obs_names[fit_rows]], _jaccard(graphs, held.n_obs + fit_rows).mean(axis=0))
    assert (rep.cells_knn_k, rep.cells_within_seed_k) == (15, analyst_graph_k(15, 300, 1000))
    chosen = subsample(fit.n_obs, held.n_obs, s.seed + 9)  # the training-cells section's fit cells
    training = rep.tables["training_cells"].set_index("quantity").loc["k-NN graph"]
    expected = _jaccard(graphs, held.n_obs + chosen[subsample(len(chosen), 100, s.seed)]).mean(axis=1).min()
    assert training["training_agreement"] == pytest.approx(expected, abs=1e-12)
    text = rep.subsampling["k-NN graphs"]
    assert text.startswith("100 of 300 held-out cells and 200 of 700 fit cells, their neighbours found among all 1,000")
    assert text.endswith("these 300 cells alone: k=4 (scaled from 15: the graph stands for one on 1,000 cells)")


def test_on_held_out_cells_only_the_subsets_k_keeps_the_share_of_the_held_out_cells(seed_fits):
    """100 of 300 held-out cells read, no fit cells: the k-NN column finds neighbours among all 300 at k=15, so the
    within-seed baseline and the batch mixing, on the 100 cells alone, scale k to 15 x 100 / 300 (5); below the cap
    every graph is the report's k."""
    held, sections = seed_fits.adata_heldout, ["per_cell", "batch_mixing", "about"]
    rep = report(seed_fits.fits, held, sections=sections, ica=False, **TINY, max_knn_cells=100)
    k = analyst_graph_k(15, 100, held.n_obs)
    assert (rep.cells_knn_k, rep.cells_within_seed_k, rep.settings["batch_mixing"]["k"]) == (15, k, k) == (15, 5, 5)
    text = rep.subsampling["k-NN graphs"]
    assert text.endswith("these 100 cells alone: k=5 (scaled from 15: the graph stands for one on 300 cells)")
    whole = report(seed_fits.fits, held, sections=sections, ica=False, **TINY)
    assert (whole.cells_knn_k, whole.cells_within_seed_k, whole.settings["batch_mixing"]["k"]) == (15, 15, 15)
    assert whole.subsampling["k-NN graphs"] == "300 of 300 held-out cells; k=15"
    # 299 of 300 cells: k scales back to 15 by rounding, which "k=15 (scaled from 15 ...)" said as if it had not
    most = report(seed_fits.fits, held, sections=sections, ica=False, **TINY, max_knn_cells=held.n_obs - 1)
    assert most.subsampling["k-NN graphs"].endswith("these 299 cells alone: k=15")


def test_the_about_text_of_a_held_out_only_report_names_only_the_rows_on_the_subsets_graph(seed_fits):
    """Without fit cells the report has no placement, which the about text named among the rows on the graph of the
    100 cells read; nor the within-seed baseline or batch mixing in a report without their sections."""
    held, asked = seed_fits.adata_heldout, ["per_cell", "batch_mixing", "placement", "about"]
    rep = report(seed_fits.fits, held, sections=asked, ica=False, **TINY, max_knn_cells=100)
    assert "placement" not in rep.tables and "batch_mixing" in rep.tables
    text = rep.subsampling["k-NN graphs"]
    assert "held-out cells; k=15. The within-seed baseline and batch mixing, on the graph of these 100 cells" in text
    assert "placement" not in text
    asked = ["batch_mixing", "placement", "about"]
    rep = report(seed_fits.fits, held, sections=asked, ica=False, **TINY, max_knn_cells=100)
    assert "k=15. Batch mixing, on the graph of these 100 cells" in rep.subsampling["k-NN graphs"]
    rep = report(seed_fits.fits, held, sections=["placement", "about"], ica=False, **TINY, max_knn_cells=100)
    assert (
        rep.subsampling["k-NN graphs"]
        == "100 of 300 held-out cells, their neighbours found among all 300 held-out cells; k=15"
    )


def test_write_into_all_cells_fills_the_heldout_and_fit_cells(small):
    rep, adata, held = small
    other = adata[:2].copy()
    other.obs_names = ["x0", "x1"]  # two cells the report never saw
    target = ad.concat([adata, other], merge="same")
    written = rep.write(target)
    assert written["obs"][0] == "countvae_heldout" and written["obsm"] == [CONSENSUS_KEY]
    is_held = target.obs_names.isin(held.obs_names)
    is_fit = ~is_held & ~target.obs_names.isin(["x0", "x1"])
    np.testing.assert_array_equal(target.obs["countvae_heldout"].to_numpy(), is_held)
    assert target.obs.loc[is_fit, "countvae_knn_agreement"].notna().all()
    assert target.obs.loc[is_fit, ["countvae_lpd_mean", "countvae_lpd_sd"]].isna().all().all()
    assert target.obs.loc[["x0", "x1"]].filter(like="countvae_knn").isna().all().all()
    np.testing.assert_array_equal(
        target.obs.loc[rep.cells.index, "countvae_knn_agreement"].to_numpy(), rep.cells["knn_agreement"].to_numpy()
    )
    assert np.isnan(target.obsm[CONSENSUS_KEY][-2:]).all()
    positions = target.obs_names.get_indexer(rep.cells.index)
    np.testing.assert_allclose(target.obsm[CONSENSUS_KEY][positions], rep.consensus_latent, rtol=1e-6)
    summary = target.uns[UNS_KEY]
    assert (summary["heldout_cells"], summary["fit_cells"]) == (held.n_obs, adata.n_obs - held.n_obs)
    frequency = rep.downstream.de_calls.mean(axis=1)
    np.testing.assert_array_equal(target.var["countvae_de_call_frequency"].to_numpy(), frequency.to_numpy())
    assert set(np.unique(frequency)) <= {0.0, 0.5, 1.0}


def test_write_never_overwrites_unless_asked(small):
    rep, _, held = small
    target = held.copy()
    target.obs["countvae_lpd_mean"] = 1.0
    with pytest.raises(OutputExistsError, match=r"obs\['countvae_lpd_mean'\].*overwrite=True"):
        rep.write(target)
    assert "countvae_knn_agreement" not in target.obs and UNS_KEY not in target.uns  # nothing written
    rep.write(target, overwrite=True)
    assert target.obs["countvae_lpd_mean"].isna().sum() == held.n_obs - TINY["max_lpd_cells"]
    with pytest.raises(InvalidDataError, match="None of adata's"):
        rep.write(ad.AnnData(obs=pd.DataFrame(index=["x", "y"])))


def test_rewriting_removes_what_the_replaced_report_wrote_and_this_one_does_not(small, tmp_path):
    """A report of fits with a batch wrote countvae_batch_mixing; replacing it with this report (no batch) left that
    column beside a summary that did not list it, read as this report's finding. It goes; the analyst's own
    countvae-named column, which no summary lists, stays. The summary is read back from an .h5ad, as on a rerun."""
    rep, _, held = small
    target = held.copy()
    rep.write(target)
    target.obs["countvae_batch_mixing"] = 0.5
    target.uns[UNS_KEY]["keys"]["obs"] = [*target.uns[UNS_KEY]["keys"]["obs"], "countvae_batch_mixing"]
    target.obs["countvae_mine"] = 1.0
    target.write_h5ad(tmp_path / "earlier.h5ad")
    target = ad.read_h5ad(tmp_path / "earlier.h5ad")
    rep.write(target, overwrite=True)
    assert "countvae_batch_mixing" not in target.obs and (target.obs["countvae_mine"] == 1.0).all()
    written = {c for c in target.obs if c.startswith("countvae_") and c != "countvae_mine"}
    assert set(target.uns[UNS_KEY]["keys"]["obs"]) == written


def test_write_refuses_repeated_names_of_the_reports_cells_and_genes(small):
    """A second sample concatenated without index_unique shares barcodes: its cells got the first sample's columns,
    consensus rows and held-out flags; a repeated gene name got the real gene's values."""
    rep, adata, held = small
    other = held[:5].copy()
    target = ad.concat([held, other])  # the other sample's barcodes collide with the report's held-out cells
    with pytest.raises(InvalidDataError, match=r"cells' names repeat \(5 names.*obs_names_make_unique\(\), which"):
        rep.write(target)
    assert "countvae_heldout" not in target.obs and UNS_KEY not in target.uns  # nothing written
    target.obs_names_make_unique()  # the report's cells come first and keep their names
    rep.write(target)
    assert not target.obs["countvae_heldout"].iloc[-5:].any() and target.obs["countvae_lpd_mean"].iloc[-5:].isna().all()
    genes = held.copy()
    genes.var_names = [*genes.var_names[:-1], genes.var_names[0]]
    with pytest.raises(InvalidDataError, match=r"genes' names repeat \(1 names.*var_names_make_unique"):
        rep.write(genes)
    unmeasured = held.copy()
    unmeasured.obs_names = [*unmeasured.obs_names[:-2], "x", "x"]  # repeated names the report does not cover: NaN
    rep.write(unmeasured)
    assert unmeasured.obs["countvae_knn_agreement"].iloc[-2:].isna().all()


def test_write_into_a_view_is_refused(small):
    """The columns went to anndata's implicit copy of the view, and write() reported them written."""
    rep, _, held = small
    with pytest.raises(InvalidArgumentError, match=r"adata is a view .* report.write\(sub\)"):
        rep.write(held[:10])


def test_write_into_data_with_other_gene_identifiers_is_refused(small):
    # the report's cells, but genes named otherwise (Ensembl IDs for symbols): every per-gene column would be NaN
    rep, _, held = small
    target = held.copy()
    target.var_names = [f"ENSG{i:011d}" for i in range(target.n_vars)]
    with pytest.raises(InvalidDataError, match="None of adata's 40 genes is one of the report's 40 genes"):
        rep.write(target)
    assert UNS_KEY not in target.uns and "countvae_heldout" not in target.obs  # nothing written


def test_the_scanpy_recipe_on_a_file_read_back(small, tmp_path):
    """report.write(adata), write_h5ad, read_h5ad, then neighbours, UMAP and a plot coloured by a stability column."""
    import scanpy as sc

    matplotlib.use("Agg")
    rep, whole, _ = small
    adata = whole.copy()
    rep.write(adata)
    path = tmp_path / "analysed.h5ad"
    adata.write_h5ad(path)
    back = ad.read_h5ad(path)
    back = back[back.obs["countvae_knn_agreement"].notna()].copy()  # the cells the report measured
    assert back.n_obs == whole.n_obs  # all of them here: the held-out and every fit cell
    adata = adata[back.obs_names]
    for column in ("countvae_knn_agreement", "countvae_knn_agreement_within_seed", "countvae_lpd_mean"):
        np.testing.assert_array_equal(back.obs[column].to_numpy(), adata.obs[column].to_numpy())
    np.testing.assert_array_equal(back.var["countvae_decoded_agreement"], adata.var["countvae_decoded_agreement"])
    summary = back.uns[UNS_KEY]
    assert list(summary["verdicts"]["quantity"]) == rep.invariants["quantity"].tolist()
    assert summary["predictive_equivalence"]["state"] == rep.settings["predictive_equivalence"]["state"]
    assert summary["model_card"] == rep.model_card() and "countvae_knn_agreement" in summary["key_notes"]
    sc.pp.neighbors(back, use_rep=CONSENSUS_KEY, n_neighbors=10)
    sc.tl.umap(back, random_state=0)
    ax = sc.pl.umap(back, color="countvae_knn_agreement", show=False)
    assert ax.get_title() == "countvae_knn_agreement"
    matplotlib.pyplot.close("all")


def test_model_card_states_the_findings(small):
    rep, _, _ = small
    card = rep.model_card()
    assert card.startswith("### Model card")
    for quantity, verdict in zip(rep.invariants["quantity"], rep.invariants["verdict"], strict=True):
        assert quantity in card, quantity
        assert verdict != "agree after alignment" or "Identified up to the symmetry" in card
    assert "Symmetry: orthogonal" in card
    pairs = rep.tables["predictive_pairs"].iloc[0]
    assert rep.settings["predictive_equivalence"]["state"] in card
    assert f"{pairs['ci_low']:.3g} to {pairs['ci_high']:.3g}" in card and "90% interval" in card
    # the regime the report's calibration section chose, in its words (it named a simulated scenario by cell count)
    regime = rep.settings["calibration"]["regime"]
    assert f"Calibration regime**: {regime['sentence']}" in card and "% correct/undetermined/wrong" in card
    # with the runs the oracle left undecided, so that each row's shares add up to 100
    rates = rep.tables["calibration_regime"].iloc[0]
    shares = [rates[c] for c in ("correct %", "undetermined %", "wrong %", "oracle undecided %")]
    assert "/oracle undecided over" in card and f"{rates['quantity']} " + "/".join(f"{v:.0f}" for v in shares) in card
    assert sum(shares) == pytest.approx(100.0)
    assert f"countvae {cv.__version__}" in card and "torch" in card
    assert "n_lpd_samples=20" in card and "report(fits" in card


def test_model_card_settings_prepare_the_data_as_the_fits_had_it():
    # The card's "settings that reproduce the fits" left out the batch key and the genes kept.
    fits = {
        "registry": {"layer": "counts", "use_raw": False, "batch_key": "donor", "labels_key": None},
        "gene_selection": {"n_top_genes": 2000, "genes": ["A", "B"]},
        "model_kwargs": {"n_latent": 10},
        "train_kwargs": {"max_epochs": 5},
        "heldout_fraction": 0.1,
        "split_seed": 0,
    }
    rep = SimpleNamespace(settings={"fits": fits, "report": {}}, provenance={"fits": [{"seed": 0}, {"seed": 1}]})
    assert (
        "**Settings**: `countvae.data.setup_anndata(adata, layer='counts', batch_key='donor')`, "
        "`adata = countvae.data.select_top_genes(adata, 2000)`, `fits = countvae.diagnostics.fit_seeds(adata, "
        "seeds=[0, 1], model_kwargs={'n_latent': 10}"
    ) in settings_line(rep)


def test_model_card_of_scvi_tools_fits_makes_them_with_scvi_tools():
    """The settings line refitted an audit's SCVI fits as countvae's own model and left out the markers; the
    software line left out scvi-tools, recorded with the fits."""
    from countvae.diagnostics.reporting.model_card import _versions_line

    fits = {
        "model_class": "scvi.model.SCVI",
        "model_kwargs": {"n_latent": 3},
        "train_kwargs": {"max_epochs": 10},
        "heldout_fraction": 0.25,
        "split_seed": 0,
        "versions": {"scvi-tools": "1.4.2", "torch": "2.13.0"},
    }
    rep = SimpleNamespace(
        settings={"fits": fits, "report": {}, "markers": ["cell_type"]},
        provenance={"fits": [{"seed": 0}, {"seed": 1}], "versions": {"countvae": "0.1.0", "torch": "2.13.0"}},
    )
    line = settings_line(rep)
    assert "fit_seeds(adata, seeds=[0, 1], model_cls=scvi.model.SCVI, model_kwargs={'n_latent': 3}" in line
    assert "report(fits, markers=['cell_type'])" in line
    assert _versions_line(rep) == "- **Software**: scvi-tools 1.4.2, torch 2.13.0, countvae 0.1.0."


def test_diagnose_write_h5ad(tmp_path, capsys):
    adata = cv.data.simulate(n_cells=300, n_genes=30, n_latent=2, decoder="linear", seed=5)
    data = tmp_path / "data.h5ad"
    adata.write_h5ad(data)
    out, target = tmp_path / "diag", tmp_path / "analysed.h5ad"
    fast = ["--seeds", "2", "--n-latent", "2", "--decoder", "linear", "--max-epochs", "3", "--n-lpd-samples", "10"]
    argv = ["diagnose", str(data), *fast, "--no-ica", "--out", str(out), "--json", "--write-h5ad", str(target)]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["h5ad"] == str(target)
    back = ad.read_h5ad(target)
    assert back.n_obs == 300 and "X_countvae" in back.obsm and CONSENSUS_KEY in back.obsm
    # diagnose's default split of a 300-cell file: a quarter held out (10% would leave 30); every fit cell measured
    assert back.obs["countvae_heldout"].sum() == 75 and back.obs["countvae_knn_agreement"].notna().all()
    assert back.obs.loc[~back.obs["countvae_heldout"], "countvae_lpd_mean"].isna().all()
    assert not np.isnan(back.obsm[CONSENSUS_KEY]).any()
    # --max-fit-cells: the report reads 100 of the 225 fit cells, the others stay NaN
    fewer = tmp_path / "fewer.h5ad"
    redo = [*argv[:-5], "--out", str(tmp_path / "fewer"), "--write-h5ad", str(fewer), "--max-fit-cells", "100"]
    assert main(redo) == 0
    capsys.readouterr()
    back = ad.read_h5ad(fewer)
    measured = back.obs["countvae_knn_agreement"].notna()
    assert measured.sum() == 175 and back.obs.loc[measured, "countvae_heldout"].sum() == 75
    assert np.isnan(back.obsm[CONSENSUS_KEY]).any(axis=1).sum() == 125
    # an existing file is refused before any fitting
    assert main([*argv[:-2], "--out", str(tmp_path / "other"), "--write-h5ad", str(target)]) == 1
    assert "--overwrite" in capsys.readouterr().err and not (tmp_path / "other" / "fits").exists()


def test_every_key_written_is_documented(small):
    from pathlib import Path

    rep, _, held = small
    written = rep.write(held.copy())
    page = (Path(__file__).resolve().parents[3] / "docs" / "scanpy.md").read_text(encoding="utf-8")
    for keys in written.values():
        for key in keys:
            assert f"`{key}`" in page, f"{key} is written but not documented in docs/scanpy.md"
    summary = held.copy()
    rep.write(summary)
    assert set(summary.uns[UNS_KEY]["key_notes"]) == {k for keys in written.values() for k in keys} - {UNS_KEY}


def test_model_card_predictive_line_gives_the_pair_of_largest_absolute_difference():
    """By hand: of three pairs at +0.3, -1.2 and +0.9 nats per cell, the largest difference is seed 0 - seed 2's -1.2
    (the largest signed value, +0.9, is not); the interval's level is the table's (80% for a report at alpha 0.1)."""
    from countvae.diagnostics.reporting.model_card import predictive_line

    pairs = pd.DataFrame(
        {
            "fit_a": ["seed 0", "seed 0", "seed 1"],
            "fit_b": ["seed 1", "seed 2", "seed 2"],
            "diff_per_cell": [0.3, -1.2, 0.9],
            "ci_low": [0.1, -1.6, 0.6],
            "ci_high": [0.5, -0.8, 1.2],
            "ci_level": [0.8, 0.8, 0.8],
        }
    )
    record = {"state": "not equivalent", "margin_nats_per_cell": 0.5, "pairs": {"equivalent": 1, "not equivalent": 2}}
    rep = SimpleNamespace(settings={"predictive_equivalence": record}, tables={"predictive_pairs": pairs})
    assert predictive_line(rep) == (
        "- **Predictive equivalence**: not equivalent. Largest held-out log p(x) difference between seeds -1.2 nats "
        "per cell (seed 0 - seed 2; 80% interval -1.6 to -0.8) against a margin of 0.5 nats per cell; pairs of "
        "seeds: 1 equivalent, 2 not equivalent."
    )


def test_model_card_lists_every_quantity_under_its_verdict():
    from countvae.diagnostics.reporting.model_card import _verdict_lines

    invariants = pd.DataFrame(
        {
            "quantity": ["decoded means", "k-NN graph", "latent coordinates", "loadings"],
            "verdict": ["agree", "agree", "differ", "undetermined"],
        }
    )
    assert _verdict_lines(invariants) == [
        "- **Identified (agree across seeds as they are)**: decoded means, k-NN graph.",
        "- **Not reproduced (differ across seeds)**: latent coordinates.",
        "- **Undetermined (the data in the report cannot decide)**: loadings.",
    ]


def test_model_card_training_line_names_the_verdicts_that_change_on_training_cells():
    from countvae.diagnostics.reporting.model_card import training_cell_line

    table = pd.DataFrame(
        {
            "quantity": ["k-NN graph", "latent distances"],
            "training_verdict": ["differ", "agree"],
            "heldout_verdict": ["agree", "agree"],
        }
    )
    rep = SimpleNamespace(settings={"training_cells": {"sentence": "Measured on 700 fit cells."}}, tables={})
    rep.tables["training_cells"] = table
    assert training_cell_line(rep) == [
        "- **Training cells** (k-NN graph: differ (held-out: agree)): Measured on 700 fit cells."
    ]
    rep.tables["training_cells"] = table.assign(training_verdict="agree")
    assert training_cell_line(rep) == [
        "- **Training cells** (the same verdicts as on held-out cells): Measured on 700 fit cells."
    ]


def test_model_card_without_a_regime_names_the_nearest_scenario_and_whether_it_had_enough_cells():
    """A report without the calibration section's regime: 50 held-out cells are nearest (log scale) the 40-cell
    scenario, whose data were too few to decide; 5,000 the 1,000-cell one, with adequate data."""
    from countvae.diagnostics.reporting.model_card import calibration_lines

    table = pd.DataFrame(
        {
            "scenario": ["few cells", "seeds"],
            "adequate data": [False, True],
            "replicates": [20, 30],
            "quantity": ["k-NN graph", "k-NN graph"],
            "correct %": [40.0, 95.0],
            "undetermined %": [55.0, 5.0],
            "wrong %": [5.0, 0.0],
        }
    )
    rep = SimpleNamespace(settings={}, tables={"calibration": table}, provenance={"heldout_cells": 50})
    assert calibration_lines(rep) == [
        "- **Calibration regime**: 'few cells' (40 held-out cells, too few cells to decide; the calibration scenario "
        "nearest to this report's size). Verdicts there, % correct/undetermined/wrong over 20 simulated replicates: "
        "k-NN graph 40/55/5."
    ]
    rep.provenance["heldout_cells"] = 5000
    assert calibration_lines(rep)[0].startswith(
        "- **Calibration regime**: 'seeds' (1000 held-out cells, adequate data;"
    )


def test_existing_report_keys_names_every_slot_a_report_writes():
    """What diagnose --write-h5ad checks before fitting: a report's columns in obs and var, its consensus latent and
    its summary, each named with its slot; the analyst's own keys are not."""
    from countvae.diagnostics.reporting.anndata_export import existing_report_keys

    adata = ad.AnnData(np.zeros((3, 2)))
    adata.obs["countvae_lpd_mean"] = 1.0
    adata.obs["countvae_mine"] = 1.0
    adata.var["countvae_decoded_agreement"] = 1.0
    adata.obsm[CONSENSUS_KEY] = np.zeros((3, 2))
    adata.obsm["X_pca"] = np.zeros((3, 2))
    adata.uns[UNS_KEY] = {}
    assert existing_report_keys(adata) == [
        "obs['countvae_lpd_mean']",
        "var['countvae_decoded_agreement']",
        f"obsm['{CONSENSUS_KEY}']",
        f"uns['{UNS_KEY}']",
    ]
    assert existing_report_keys(ad.AnnData(np.zeros((3, 2)))) == []


def test_write_refuses_to_replace_a_gene_column_or_the_consensus_alone_and_counts_the_cells_written(small):
    """Any key the report would write, in any slot, is refused without overwrite (nothing written); the summary
    counts the analyst's cells that got the report's values (the held-out cells here, not every report cell)."""
    rep, _, held = small
    for slot, key in (("var", "countvae_decoded_agreement"), ("obsm", CONSENSUS_KEY), ("uns", UNS_KEY)):
        target = held.copy()
        if slot == "var":
            target.var[key] = 1.0
        elif slot == "obsm":
            target.obsm[key] = np.zeros((target.n_obs, 2))
        else:
            target.uns[key] = {"mine": 1}
        with pytest.raises(OutputExistsError, match=rf"{slot}\['{key}'\]"):
            rep.write(target)
        assert "countvae_heldout" not in target.obs  # nothing written
    target = held.copy()
    rep.write(target)
    summary = target.uns[UNS_KEY]
    assert summary["cells_written"] == held.n_obs < len(rep.cells)
    assert (summary["heldout_cells"], summary["fit_cells"]) == (held.n_obs, len(rep.cells) - held.n_obs)


def test_de_call_frequency_is_matched_to_genes_by_name():
    """The DE calls listed in another gene order than the report's genes: each gene gets its own frequency."""
    from countvae.diagnostics.reporting.anndata_export import _report_frames

    genes = pd.DataFrame({"decoded_agreement": [0.9, 0.8, 0.7]}, index=["g0", "g1", "g2"])
    calls = pd.DataFrame({"seed 0": [True, False, True], "seed 1": [True, False, False]}, index=["g2", "g0", "g1"])
    rep = SimpleNamespace(
        settings={},
        cells=pd.DataFrame({"heldout": [True]}, index=["c0"]),
        genes=genes,
        consensus_latent=np.zeros((1, 2)),
        downstream=SimpleNamespace(de_calls=calls),
    )
    _, written, _ = _report_frames(rep)
    assert written["de_call_frequency"].to_dict() == {"g0": 0.0, "g1": 0.5, "g2": 1.0}
    assert list(written["decoded_agreement"]) == [0.9, 0.8, 0.7]
