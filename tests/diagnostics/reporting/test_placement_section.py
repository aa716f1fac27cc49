"""The placement section: held-out cells planted apart from the fit cells score 0, drawn like them about 1, and the
simulation's true sources (which treat every cell alike) about 1, as the fits do; it reads back from report.json."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from diagnostics_helpers import collect_for, saved_and_loaded

from countvae.diagnostics.reporting.sections.base import Shared
from countvae.diagnostics.reporting.sections.placement import PlacementSection, placement_table
from countvae.diagnostics.reporting.settings import ReportSettings

SMALL = dict(n_lpd_samples=10, max_lpd_cells=60, n_rhat_draws=20, n_rhat_cells=6, max_jacobian_cells=30, n_bootstrap=50)


def test_planted_placements_give_their_known_scores():
    s = ReportSettings(**SMALL)
    rng = np.random.default_rng(1)
    fit = {"apart": rng.normal(size=(700, 3)), "alike": rng.normal(size=(700, 3))}
    held = {"apart": rng.normal(size=(300, 3)) + 100.0, "alike": rng.normal(size=(300, 3))}
    table = placement_table(held, fit, {"apart": 0, "alike": 1}, 15, s).set_index("fit")
    # held-out cells in a cluster of their own: every neighbour is held-out, none a fit cell
    assert table.loc["apart", ["placement", "low", "high"]].tolist() == [0.0, 0.0, 0.0]
    assert table.loc["apart", "heldout_neighbours"] == 1.0
    # drawn like the fit cells: a neighbour is held-out with the random share 299 / 999
    alike = table.loc["alike"]
    assert alike["expected_share"] == pytest.approx(299 / 999)
    assert alike["placement"] == pytest.approx(1.0, abs=0.05) and alike["low"] <= 1.0 <= alike["high"]
    assert alike["heldout_neighbours"] == pytest.approx(299 / 999, abs=0.02)


def test_fits_place_unseen_cells_as_the_true_sources_do(seed_fits):
    s = ReportSettings(**SMALL)
    c = collect_for(seed_fits, PlacementSection.needs, s)
    result = PlacementSection().compute(c, Shared(), s)
    truth = placement_table(
        {"truth": np.asarray(seed_fits.adata_heldout.obsm["z_true"], dtype=np.float64)},
        {"truth": np.asarray(seed_fits.adata_fit.obsm["z_true"], dtype=np.float64)[c.subsets.fit]},
        {},
        s.k,
        s,
    )
    assert truth["placement"].iloc[0] == pytest.approx(1.0, abs=0.05)
    table = result.tables["placement"]
    assert table["fit"].tolist() == c.names
    assert np.allclose(table["placement"], truth["placement"].iloc[0], atol=0.05)
    assert result.headline[0].startswith("Placement of unseen cells among the training cells (1 = as if at random)")
    # without the fit cells there is nothing to place the held-out cells among
    saved = {name: a.latent_fit for name, a in c.arrays.items()}
    try:
        for arrays in c.arrays.values():
            arrays.latent_fit = None
        assert PlacementSection().compute(c, Shared(), s).tables == {}
    finally:
        for name, arrays in c.arrays.items():
            arrays.latent_fit = saved[name]


def test_the_placement_table_reads_back_from_its_file(seed_report, tmp_path):
    assert 'id="placement"' in seed_report.to_html()
    loaded = saved_and_loaded(
        seed_report, tmp_path / "rep", "placement", "heldout_neighbours", 1.5, "greater than the maximum"
    )
    assert loaded.tables["placement"].equals(seed_report.tables["placement"])


def test_the_sentence_gives_the_seeds_range_and_the_sampling_error():
    from countvae.diagnostics.reporting.sections.placement import placement_sentences

    table = pd.DataFrame(
        {
            "fit": ["seed 0", "seed 1"],
            "placement": [0.90, 0.96],
            "low": [0.88, 0.92],
            "high": [0.92, 1.00],
            "heldout_neighbours": [0.15, 0.13],
            "expected_share": [0.1, 0.1],
        }
    )
    sentence, line = placement_sentences(table)
    # the median half-width of the intervals (0.02 and 0.04) is 0.03
    assert "at 0.93 of random placement (seeds 0.90 to 0.96, each within about 0.03 from the sampling" in sentence
    assert "held-out cells make 14.0% of the neighbours of held-out cells, where 10.0% would be random" in sentence
    assert line == (
        "Placement of unseen cells among the training cells (1 = as if at random): 0.93 (seeds 0.90 to 0.96)."
    )
    one, _ = placement_sentences(table.iloc[:1])
    assert "at 0.90 of random placement (within about 0.02 from the sampling of held-out cells)" in one
