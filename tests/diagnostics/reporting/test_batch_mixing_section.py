"""The batch-mixing section: planted latent spaces give their known mixing (0 for batches kept apart, about 1 for
latents drawn without regard to batch), the no-model row is the PCA of the normalized counts, and the section reads
back from report.json; without a registered batch, or with one batch, it says so instead of scoring."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from diagnostics_helpers import collect_for, saved_and_loaded

import countvae as cv
from countvae.diagnostics import load_report, report
from countvae.diagnostics.analyses.baseline import normalized_counts_pca
from countvae.diagnostics.analyses.heldout_data import observed_counts
from countvae.diagnostics.analyses.subspace import knn_sets
from countvae.diagnostics.reporting.collect import batch_reference
from countvae.diagnostics.reporting.sections.base import Shared
from countvae.diagnostics.reporting.sections.batch_mixing import (
    NO_MODEL,
    BatchMixingSection,
    mean_with_interval,
    mixing_sentences,
)
from countvae.diagnostics.reporting.settings import ReportSettings
from countvae.metrics import batch_mixing

SMALL = dict(n_lpd_samples=10, max_lpd_cells=60, n_rhat_draws=20, n_rhat_cells=6, max_jacobian_cells=30, n_bootstrap=50)


@pytest.fixture(scope="module")
def collected(seed_fits):
    s = ReportSettings(**SMALL)
    c = collect_for(seed_fits, BatchMixingSection.needs, s)
    return c, s


def test_planted_latent_spaces_give_their_known_mixing(collected):
    c, s = collected
    names = c.names
    held, fit = c.batches.heldout, c.batches.fit
    rng = np.random.default_rng(5)

    def apart(labels):  # each batch far from the others: no cell has a neighbour from another batch
        return (labels == held[0])[:, None] * 100.0 + rng.normal(size=(len(labels), 3))

    planted = {
        names[0]: (apart(held), apart(fit)),
        names[1]: (rng.normal(size=(len(held), 3)), rng.normal(size=(len(fit), 3))),  # batch plays no part
    }
    arrays = {name: c.arrays[name] for name in names}
    originals = {name: (a.latent, a.latent_fit) for name, a in arrays.items()}
    try:
        for name, (z_held, z_fit) in planted.items():
            arrays[name].latent, arrays[name].latent_fit = z_held, z_fit
        result = BatchMixingSection().compute(c, Shared(), s)
    finally:
        for name, (z_held, z_fit) in originals.items():
            arrays[name].latent, arrays[name].latent_fit = z_held, z_fit
    table = result.tables["batch_mixing"].set_index("fit")
    assert table.loc[names[0], ["batch_mixing", "low", "high"]].tolist() == [0.0, 0.0, 0.0]
    random_row = table.loc[names[1]]
    assert random_row["batch_mixing"] == pytest.approx(1.0, abs=0.1)
    assert random_row["low"] < random_row["batch_mixing"] < random_row["high"]
    record = result.records["batch_mixing"]
    # every fit cell is scored too, so the graph is the analyst's on all cells and k is not scaled
    assert record["k"] == s.k and record["graph_cells"] == c.n_cells + c.n_fit_cells == record["heldout_cells"] + 700
    assert result.headline[0].startswith("Batch mixing ('batch', 1 = as if at random): ")


def test_the_no_model_row_is_the_pca_of_the_normalized_counts(collected, seed_fits):
    c, s = collected
    result = BatchMixingSection().compute(c, Shared(), s)
    genes = c.var_names
    counts = [observed_counts(seed_fits.adata_heldout, genes), observed_counts(seed_fits.adata_fit, genes)]
    pcs = normalized_counts_pca(sp.vstack(counts, format="csr"), 3, seed=s.seed + 7)
    n = seed_fits.adata_heldout.n_obs
    pool = np.concatenate([c.batches.heldout, c.batches.fit])
    # every cell is at hand (300 held-out, 700 fit): the row is the mixing of the 15-NN graph on all of them
    expected = batch_mixing(knn_sets(pcs, s.k), pool)
    table = result.tables["batch_mixing"].set_index("fit")
    assert table.loc[NO_MODEL, "batch_mixing"] == pytest.approx(expected.mean(), rel=1e-9)
    assert table.loc[NO_MODEL, "heldout_cells"] == pytest.approx(expected[:n].mean(), rel=1e-9)
    per_batch = result.tables["batch_mixing_per_batch"].set_index("batch")
    assert per_batch["cells"].sum() == len(pool)
    # the batches' means, weighted by their cells, are the overall mean
    for column in table.index:
        weighted = (per_batch[column] * per_batch["cells"]).sum() / len(pool)
        assert weighted == pytest.approx(table.loc[column, "batch_mixing"], rel=1e-9)


def test_fit_cells_stand_for_all_fit_cells_when_only_some_are_scored(seed_fits):
    # held-out cells in a cluster of their own where batch is random (mixing about 1), fit cells in one cluster
    # per batch (mixing 0): the whole graph's mixing is about 300 / 1000, while an unweighted mean of the 300
    # held-out and 140 fit cells scored would be about 300 / 440
    s = ReportSettings(**SMALL, max_fit_cells=140)
    c = collect_for(seed_fits, BatchMixingSection.needs, s)
    rng = np.random.default_rng(2)
    b_held = seed_fits.adata_heldout.obs["batch"].astype(str).to_numpy()
    b_fit = seed_fits.adata_fit.obs["batch"].astype(str).to_numpy()
    z_held = rng.normal(size=(len(b_held), 3)) + [0.0, 500.0, 0.0]
    z_fit = (b_fit == b_held[0])[:, None] * 100.0 + rng.normal(size=(len(b_fit), 3))
    for arrays in c.arrays.values():
        arrays.latent, arrays.latent_fit = z_held, z_fit[c.subsets.fit]
    result = BatchMixingSection().compute(c, Shared(), s)
    truth = batch_mixing(knn_sets(np.vstack([z_held, z_fit]), s.k), np.concatenate([b_held, b_fit])).mean()
    row = result.tables["batch_mixing"].set_index("fit").iloc[0]
    assert truth == pytest.approx(0.3, abs=0.05)
    assert row["batch_mixing"] == pytest.approx(truth, abs=0.03)
    assert row["heldout_cells"] == pytest.approx(1.0, abs=0.1)
    record = result.records["batch_mixing"]
    assert record["fit_cells"] == 140 and record["graph_cells"] == 1000 and record["k"] == round(15 * 440 / 1000)


def test_without_a_registered_batch_or_with_one_batch_nothing_is_scored(collected):
    c, s = collected
    plain = cv.data.simulate(n_cells=50, n_genes=20, n_latent=2, seed=0)
    assert batch_reference(plain, None, plain.var_names, 2, 0) is None
    original = c.batches
    try:
        c.batches = None
        assert BatchMixingSection().compute(c, Shared(), s).tables == {}
        c.batches = SimpleNamespace(**{**vars(original), "heldout": np.full(len(original.heldout), "b0")})
        c.batches.fit = np.full(len(original.fit), "b0")
        result = BatchMixingSection().compute(c, Shared(), s)
    finally:
        c.batches = original
    assert result.tables == {} and "one batch of 'batch'" in result.records["batch_mixing"]["sentence"]
    empty = SimpleNamespace(tables={}, settings={})
    assert BatchMixingSection().layout(empty) == []
    one = SimpleNamespace(tables={}, settings={"batch_mixing": result.records["batch_mixing"]})
    assert [block.text for block in BatchMixingSection().layout(one)] == [result.records["batch_mixing"]["sentence"]]


def test_the_section_in_a_report_reads_back_from_its_file(seed_fits, tmp_path):
    rep = report(seed_fits, sections=["batch_mixing"], **SMALL)
    assert set(rep.tables) == {"batch_mixing", "batch_mixing_per_batch"}
    assert rep.headline[0].startswith("Batch mixing ('batch'")
    loaded = saved_and_loaded(rep, tmp_path / "rep", "batch_mixing", "batch_mixing", "0.9", "is not of type 'number'")
    assert loaded.to_markdown() == rep.to_markdown()
    html = loaded.to_html()
    assert 'id="batch_mixing"' in html and NO_MODEL in html


def test_fits_mix_the_batches_as_the_true_sources_do(collected, seed_fits):
    # the simulated sources do not depend on batch, and the fits model the batch effect with their covariate:
    # their latent spaces should mix the two batches as the true sources do (about 1)
    c, s = collected
    z_true = np.vstack(
        [seed_fits.adata_heldout.obsm["z_true"], seed_fits.adata_fit.obsm["z_true"][c.subsets.fit]]
    ).astype(np.float64)
    pool = np.concatenate([c.batches.heldout, c.batches.fit])
    truth = batch_mixing(knn_sets(z_true, s.k), pool).mean()
    table = BatchMixingSection().compute(c, Shared(), s).tables["batch_mixing"].set_index("fit")
    assert truth == pytest.approx(1.0, abs=0.05)
    for name in c.names:
        assert table.loc[name, "batch_mixing"] == pytest.approx(truth, abs=0.05)


def test_each_held_out_cells_mixing_flows_into_the_analysts_anndata(seed_fits, seed_report):
    rep = seed_report
    held = seed_fits.adata_heldout.copy()
    rep.write(held)
    column = held.obs["countvae_batch_mixing"].to_numpy()
    assert np.isfinite(column).all()  # every held-out cell is scored (300 < max_knn_cells)
    # the cells' mean is the fits' held-out column of the table, averaged over the fits
    table = rep.tables["batch_mixing"].set_index("fit")
    fits = [f.name for f in seed_fits.fits]
    assert column.mean() == pytest.approx(table.loc[fits, "heldout_cells"].mean(), rel=1e-9)
    assert "countvae_batch_mixing" in held.uns["countvae_report"]["key_notes"]


def test_a_subset_of_the_held_out_cells_is_scored_with_its_own_labels(seed_fits):
    # 100 of the 300 held-out cells scored (max_knn_cells): the labels, latents and no-model PCA must be those cells'
    s = ReportSettings(**SMALL, max_knn_cells=100)
    c = collect_for(seed_fits, BatchMixingSection.needs, s)
    assert len(c.batches.heldout) == len(c.batches.pca_heldout) == 100
    b_held = seed_fits.adata_heldout.obs["batch"].astype(str).to_numpy()
    np.testing.assert_array_equal(c.batches.heldout, b_held[c.subsets.knn])
    b_fit = seed_fits.adata_fit.obs["batch"].astype(str).to_numpy()[c.subsets.fit]
    rng = np.random.default_rng(8)
    for arrays in c.arrays.values():  # every batch far from the other: mixing exactly 0 if labels match cells
        arrays.latent = (b_held == b_held[0])[:, None] * 100.0 + rng.normal(size=(len(b_held), 3))
        arrays.latent_fit = (b_fit == b_held[0])[:, None] * 100.0 + rng.normal(size=(len(b_fit), 3))
    table = BatchMixingSection().compute(c, Shared(), s).tables["batch_mixing"].set_index("fit")
    assert (table.loc[c.names, "batch_mixing"] == 0.0).all()
    assert BatchMixingSection().compute(c, Shared(), s).records["batch_mixing"]["heldout_cells"] == 100


def test_the_model_card_states_both_measurements_and_reads_back(seed_report, tmp_path):
    card = seed_report.model_card()
    mixing, placement = (seed_report.settings[key]["sentence"] for key in ("batch_mixing", "placement"))
    assert f"- **Batch mixing** (a measurement, no verdict): {mixing}" in card
    assert f"- **Placement of unseen cells** (a measurement, no verdict): {placement}" in card
    assert card.index("Predictive equivalence") < card.index("Batch mixing") < card.index("Calibration regime")
    assert load_report(seed_report.save(tmp_path / "rep")).model_card() == card


def test_the_interval_widens_by_the_correlation_of_cells_whose_neighbourhoods_overlap():
    """Cells in groups of 4 mutual neighbours with one score per group inform like 1 cell in 4: twice as wide.

    The centre is the weighted mean either way; the deviations of the same bootstrap replicates are scaled by
    ``sqrt(4)`` against the interval without any pair of correlated cells.
    """
    rng = np.random.default_rng(3)
    groups, m = 60, 4
    scores = np.repeat(rng.uniform(0.5, 1.0, size=groups), m)
    weights = np.ones(groups * m)
    cells = np.arange(groups * m).reshape(groups, m)
    neighbours = np.vstack([np.delete(group, i) for group in cells for i in range(m)])
    s = ReportSettings(n_bootstrap=200)
    value, low, high = mean_with_interval(scores, weights, neighbours, s)
    plain_value, plain_low, plain_high = mean_with_interval(scores, weights, np.empty((groups * m, 0), int), s)
    assert value == plain_value == pytest.approx(scores.mean())
    assert value - low == pytest.approx(2 * (plain_value - plain_low))
    assert high - value == pytest.approx(2 * (plain_high - plain_value))


def test_the_sentences_state_the_seeds_mean_and_range_and_the_no_model_row_apart():
    """By hand: two seeds at 0.60 [0.50, 0.70] and 0.80 [0.76, 0.84], the PCA without a model at 0.20 [0.14, 0.26].
    The seeds' mean is 0.70 (the PCA is no seed: with it, 0.53), their range 0.60 to 0.80, and the median half-width
    of the three intervals 0.06 (their mean 0.07, the widest 0.10, the narrowest 0.04 and the seeds' median 0.07 all
    print otherwise)."""
    table = pd.DataFrame(
        {
            "fit": ["seed 0", "seed 1", NO_MODEL],
            "batch_mixing": [0.6, 0.8, 0.2],
            "low": [0.5, 0.76, 0.14],
            "high": [0.7, 0.84, 0.26],
        }
    )
    sentence, line = mixing_sentences(table, "donor", 3, 5)
    assert sentence == (
        "The 3 batches of 'donor' mix at 0.70 of random mixing in the latent spaces (seeds 0.60 to 0.80, each within "
        "about 0.06 from the sampling of cells), against 0.20 in a 5-component PCA without a model."
    )
    assert line == (
        "Batch mixing ('donor', 1 = as if at random): 0.70 in the latent spaces (seeds 0.60 to 0.80), 0.20 without "
        "a model."
    )


def test_held_out_cells_stand_for_all_held_out_cells_when_only_some_are_scored(seed_fits):
    """100 of the 300 held-out cells scored (max_knn_cells) beside every fit cell: each held-out cell stands for 3.

    Known answer: fit cells in one cluster per batch (each scores exactly 0), held-out cells in a cluster of their own
    where batch plays no part. The mixing of the whole graph is then 300 / 1,000 of the held-out cells' mean (an
    unweighted mean would give 100 / 800 of it), and each batch's mixing is its held-out cells' scores weighted 3 over
    3 times its held-out cells plus its fit cells.
    """
    s = ReportSettings(**SMALL, max_knn_cells=100)
    c = collect_for(seed_fits, BatchMixingSection.needs, s)
    rng = np.random.default_rng(4)
    b_fit = c.batches.fit
    z_held = rng.normal(size=(seed_fits.adata_heldout.n_obs, 3)) + [0.0, 500.0, 0.0]
    z_fit = (b_fit == b_fit[0])[:, None] * 100.0 + rng.normal(size=(len(b_fit), 3))
    for arrays in c.arrays.values():
        arrays.latent, arrays.latent_fit = z_held, z_fit
    result = BatchMixingSection().compute(c, Shared(), s)
    record = result.records["batch_mixing"]
    assert (record["heldout_cells"], record["fit_cells"], c.n_cells, c.n_fit_cells) == (100, 700, 300, 700)
    assert not result.values["fit_scores"].any()  # every fit cell's neighbours are of its own batch
    held_scores = result.values["heldout_scores"]
    table = result.tables["batch_mixing"].set_index("fit")
    for name in c.names:
        assert table.loc[name, "heldout_cells"] == pytest.approx(held_scores.mean(), rel=1e-12)
        assert table.loc[name, "batch_mixing"] == pytest.approx(0.3 * held_scores.mean(), rel=1e-12)
    per_batch = result.tables["batch_mixing_per_batch"].set_index("batch")
    for batch in per_batch.index:
        held_in = c.batches.heldout == batch
        expected = 3 * held_scores[held_in].sum() / (3 * held_in.sum() + (b_fit == batch).sum())
        assert per_batch.loc[batch, c.names[0]] == pytest.approx(expected, rel=1e-12)
