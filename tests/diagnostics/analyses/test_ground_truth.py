"""The ground-truth table of the report on simulated data, against sources whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import ortho_group

from countvae.diagnostics.analyses.ground_truth import TRUTH_COLUMNS, ground_truth_table


def test_recovered_sources_score_one_and_a_rotation_does_not():
    rng = np.random.default_rng(0)
    truth = rng.laplace(size=(1500, 3))
    # The "ICA" coordinates are the sources up to order, sign and scale; the raw ones a rotation of them.
    ica = truth[:, [2, 0, 1]] * np.array([-2.0, 0.5, 3.0])
    rotated = truth @ ortho_group.rvs(3, random_state=1).T
    table = ground_truth_table({"seed 0": rotated}, {"seed 0": ica}, truth, seed=0)
    assert list(table.columns) == list(TRUTH_COLUMNS)
    rows = table.set_index("coordinates")
    assert rows.loc["ICA", "mcc"] == pytest.approx(1.0)
    assert rows.loc["raw", "mcc"] < 0.9
    # Each recovered coordinate carries the information of one source only; a rotation mixes them.
    assert rows.loc["ICA", "infom"] > rows.loc["raw", "infom"] + 0.2


def test_without_ica_only_raw_rows():
    truth = np.random.default_rng(1).laplace(size=(300, 2))
    table = ground_truth_table({"a": truth, "b": -truth}, None, truth)
    assert table["coordinates"].tolist() == ["raw", "raw"]
    np.testing.assert_allclose(table["mcc"], 1.0)


@pytest.mark.parametrize("n_cells", [8, 10, 19])
def test_few_held_out_cells_are_binned_into_levels_of_two_cells(n_cells):
    """Ten levels over 10 held-out cells left one cell per level, and the report stopped with scikit-learn's error
    (the report accepts 8 held-out cells)."""
    rng = np.random.default_rng(2)
    truth = rng.laplace(size=(n_cells, 2))
    table = ground_truth_table({"seed 0": truth @ ortho_group.rvs(2, random_state=3).T}, {"seed 0": truth}, truth)
    assert np.isfinite(table["infom"]).all()
    assert table.set_index("coordinates").loc["ICA", "mcc"] == pytest.approx(1.0)
