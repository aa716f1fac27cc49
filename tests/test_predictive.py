"""Held-out log predictive density: per-seed errors, paired differences, arviz table, verdict."""

import numpy as np
import pandas as pd
import pytest

from countvae.diagnostics.analyses.predictive import (
    compare_table,
    pairwise_table,
    per_fit_table,
)
from countvae.diagnostics.reporting.headline import predictive_sentence
from countvae.diagnostics.reporting.verdicts import predictive_verdict
from countvae.errors import InvalidArgumentError


def frames(n=400, shifts=(0.0, 0.0, 0.0), noise=1.0, seed=0):
    rng = np.random.default_rng(seed)
    base = rng.normal(-650.0, 40.0, n)  # cells differ a lot; the fits share that variation
    idx = pd.Index([f"c{i}" for i in range(n)])
    return {
        f"seed {k}": pd.DataFrame({"lpd": base + s + noise * rng.standard_normal(n), "mc_se": 0.1}, index=idx)
        for k, s in enumerate(shifts)
    }


def test_per_fit_table_known_values():
    lpds = frames(n=4, shifts=(0.0, 1.0))
    lpds["seed 0"]["lpd"] = [-1.0, -2.0, -3.0, -4.0]
    lpds["seed 0"]["mc_se"] = [0.3, 0.4, 0.0, 0.0]
    row = per_fit_table(lpds).set_index("fit").loc["seed 0"]
    assert row["elpd"] == -10.0
    assert row["lpd_per_cell"] == -2.5
    assert row["se"] == pytest.approx(np.sqrt(4) * np.std([-1, -2, -3, -4], ddof=1))
    assert row["mc_se"] == pytest.approx(0.5)
    assert row["max_cell_mc_se"] == pytest.approx(0.4)


def test_paired_difference_and_its_standard_error():
    lpds = frames(shifts=(0.0, -0.5))
    pair = pairwise_table(lpds).iloc[0]
    d = lpds["seed 0"]["lpd"].to_numpy() - lpds["seed 1"]["lpd"].to_numpy()
    assert pair["diff"] == pytest.approx(d.sum())
    assert pair["se_diff"] == pytest.approx(np.sqrt(d.size) * d.std(ddof=1))
    # Pairing removes the shared between-cell spread (sd 40), leaving the per-fit noise (sd sqrt 2).
    assert pair["se_diff"] < 0.1 * per_fit_table(lpds)["se"].iloc[0]
    assert pair["mc_se_diff"] == pytest.approx(np.sqrt(400 * 2 * 0.01))
    assert pair["z"] == pytest.approx(pair["diff"] / pair["se_diff"])


def test_unreliable_cells_are_counted_per_fit_and_per_pair():
    lpds = frames(n=5, shifts=(0.0, 0.0))
    assert per_fit_table(lpds)["n_unreliable"].tolist() == [0, 0]  # frames without the column: none flagged
    lpds["seed 0"]["reliable"] = [True, False, True, True, False]
    lpds["seed 1"]["reliable"] = [True, False, False, True, True]
    lpds["seed 0"].loc[["c1", "c4"], "mc_se"] = np.nan
    assert per_fit_table(lpds)["n_unreliable"].tolist() == [2, 2]
    assert np.isnan(per_fit_table(lpds)["mc_se"].iloc[0])  # no Monte Carlo total over cells without an SE
    assert pairwise_table(lpds)["n_unreliable"].tolist() == [3]


def test_verdict_equivalent_and_not():
    verdict = predictive_verdict(pairwise_table(frames(shifts=(0.0, 0.0, 0.0))))
    assert verdict.equivalent and predictive_sentence(verdict).startswith("Predictively equivalent")
    pairs = pairwise_table(frames(shifts=(0.0, 0.0, -1.0)))
    verdict = predictive_verdict(pairs)
    assert not verdict.equivalent and "2 of 3 pairs" in predictive_sentence(verdict)
    assert (verdict.n_pairs, verdict.n_different) == (3, 2)
    assert verdict.worst["fit_b"] == "seed 2" and abs(verdict.worst["z"]) == pairs["z"].abs().max()
    assert list(pairs["equivalent"]) == [True, False, False]
    # Without log p(x) for every fit there is no verdict, and the sentence says so.
    untested = predictive_verdict(None)
    assert untested.equivalent is None and "untested" in predictive_sentence(untested)


def test_arviz_compare_matches_paired_differences_and_weights_do_not_underflow():
    lpds = frames(shifts=(0.0, -0.3, -1.0), noise=0.5)
    table = compare_table(lpds)
    assert table.index[0] == "seed 0"
    pairs = pairwise_table(lpds).set_index(["fit_a", "fit_b"])
    for other in ("seed 1", "seed 2"):
        assert table.loc[other, "elpd_diff"] == pytest.approx(pairs.loc[("seed 0", other), "diff"], rel=1e-9)
        # arviz uses the population variance (ddof=0), countvae the sample variance (ddof=1).
        expected = pairs.loc[("seed 0", other), "se_diff"] * np.sqrt(399 / 400)
        assert table.loc[other, "dse"] == pytest.approx(expected, rel=1e-9)
    assert table.loc["seed 0", "elpd"] == pytest.approx(lpds["seed 0"]["lpd"].sum())
    # Per-cell values near -650 nats: without the per-cell shift stacking weights collapse to uniform.
    assert table["weight"].sum() == pytest.approx(1.0)
    assert table["weight"].max() > 0.5


def test_bad_inputs():
    lpds = frames()
    with pytest.raises(InvalidArgumentError, match="two fits"):
        per_fit_table({"a": lpds["seed 0"]})
    with pytest.raises(InvalidArgumentError, match="same cells"):
        pairwise_table({"a": lpds["seed 0"], "b": lpds["seed 1"].iloc[:10]})
    shuffled = lpds["seed 1"].iloc[::-1]
    with pytest.raises(InvalidArgumentError, match="held-out cells"):
        pairwise_table({"a": lpds["seed 0"], "b": shuffled})
    broken = lpds["seed 1"].copy()
    broken.iloc[0, 0] = np.nan
    with pytest.raises(InvalidArgumentError, match="NaN"):
        compare_table({"a": lpds["seed 0"], "b": broken})
