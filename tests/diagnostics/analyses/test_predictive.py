"""Held-out log predictive density: per-seed errors, the equivalence test, the margin, arviz table, verdict."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from countvae.diagnostics.analyses.predictive import (
    EQUIVALENT,
    NOT_EQUIVALENT,
    UNDETERMINED,
    compare_table,
    equivalence_margin,
    equivalence_table,
    estimator_reliability,
    per_fit_table,
)
from countvae.diagnostics.reporting.headline import predictive_sentence
from countvae.diagnostics.reporting.verdicts import predictive_verdict
from countvae.errors import InvalidArgumentError


def frames(n=400, shifts=(0.0, 0.0, 0.0), noise=1.0, seed=0, khat=0.3):
    rng = np.random.default_rng(seed)
    base = rng.normal(-650.0, 40.0, n)  # cells differ a lot; the fits share that variation
    idx = pd.Index([f"c{i}" for i in range(n)])
    return {
        f"seed {k}": pd.DataFrame(
            {"lpd": base + s + noise * rng.standard_normal(n), "mc_se": 0.1, "khat": khat}, index=idx
        )
        for k, s in enumerate(shifts)
    }


def pairwise_table(lpds, margin=0.5, alpha=0.05):
    return equivalence_table(lpds, margin, alpha)


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


def test_equivalence_test_known_values_and_bonferroni_over_pairs():
    lpds = frames(shifts=(0.0, -0.1, -1.0))
    pairs = pairwise_table(lpds, margin=0.5, alpha=0.05).set_index(["fit_a", "fit_b"])
    d = lpds["seed 0"]["lpd"].to_numpy() - lpds["seed 1"]["lpd"].to_numpy()
    se = d.std(ddof=1) / np.sqrt(d.size)
    t = stats.t.ppf(1 - 0.05 / 3, d.size - 1)  # 3 pairs: each one-sided test at alpha / 3
    row = pairs.loc[("seed 0", "seed 1")]
    assert row["ci_low"] == pytest.approx(d.mean() - t * se) and row["ci_high"] == pytest.approx(d.mean() + t * se)
    assert row["ci_level"] == pytest.approx(1 - 0.1 / 3)
    p_one = max(stats.t.sf((d.mean() + 0.5) / se, d.size - 1), stats.t.cdf((d.mean() - 0.5) / se, d.size - 1))
    assert row["p_equivalence"] == pytest.approx(min(1.0, 3 * p_one))
    # |diff| 0.1 with se ~0.07: inside +-0.5 -> equivalent; 1.0 and 0.9 away: outside -> not equivalent.
    assert row["decision"] == EQUIVALENT
    assert pairs.loc[("seed 0", "seed 2"), "decision"] == NOT_EQUIVALENT
    assert pairs.loc[("seed 1", "seed 2"), "decision"] == NOT_EQUIVALENT
    # A difference on the margin cannot be decided; nor can anything without a margin.
    near = pairwise_table(frames(shifts=(0.0, -0.5)), margin=0.5)
    assert near["decision"].tolist() == [UNDETERMINED]
    assert pairwise_table(frames(shifts=(0.0, 0.0)), margin=np.nan)["decision"].tolist() == [UNDETERMINED]


def test_equivalence_means_the_interval_inside_the_margin_not_a_failure_to_reject():
    # Few, noisy cells: no difference is detectable (|z| < 2), and the test does not call them equivalent.
    lpds = frames(n=20, shifts=(0.0, 0.0), noise=5.0, seed=4)
    pair = pairwise_table(lpds, margin=0.5).iloc[0]
    assert abs(pair["z"]) < 2 and pair["decision"] == UNDETERMINED
    verdict = predictive_verdict(pairwise_table(lpds, margin=0.5), estimator_reliability(lpds, 0.5), 0.5, 25.0, 0.02)
    assert verdict.state == UNDETERMINED and "held-out cells" in verdict.remedy
    assert predictive_sentence(verdict).startswith("Predictive equivalence undetermined")


def test_margin_is_a_share_of_the_gain_over_the_no_latent_baseline():
    lpds = frames(n=10, shifts=(0.0, 2.0))
    mean_lpd = 0.5 * (lpds["seed 0"]["lpd"].to_numpy() + lpds["seed 1"]["lpd"].to_numpy())
    baseline = mean_lpd - 40.0
    margin, gain = equivalence_margin(lpds, baseline, 0.02)
    assert gain == pytest.approx(40.0) and margin == pytest.approx(0.8)
    assert np.isnan(equivalence_margin(lpds, mean_lpd + 1.0, 0.02)[0])  # worse than the baseline: no margin
    assert np.isnan(equivalence_margin(lpds, None, 0.02)[1])


def test_estimator_reliability_from_khat_and_monte_carlo_bias():
    lpds = frames(n=100, shifts=(0.0, 0.0))
    lpds["seed 1"]["khat"] = np.where(np.arange(100) < 10, 1.2, 0.3)  # 10% of cells above 0.7
    table = estimator_reliability(lpds, margin=0.5).set_index("fit")
    assert table.loc["seed 0", "reliable"] and not table.loc["seed 1", "reliable"]
    assert table.loc["seed 1", "share_khat_above"] == pytest.approx(0.1)
    assert table.loc["seed 0", "mc_bias_bound"] == pytest.approx(0.005)  # mean mc_se^2 / 2
    assert not estimator_reliability(lpds, margin=0.04).set_index("fit").loc["seed 0", "reliable"]  # bias > 10%
    no_khat = {k: v.drop(columns="khat") for k, v in lpds.items()}
    assert not estimator_reliability(no_khat, 0.5)["reliable"].any()


def test_estimator_reliability_reads_the_estimators_frame():
    """The package's estimator marks cells ``reliable`` and gives them no standard error where k-hat is too high."""
    lpds = frames(n=100, shifts=(0.0, 0.0))
    for frame in lpds.values():
        frame["ess"] = np.linspace(5.0, 95.0, 100)
        frame["reliable"] = True
    bad = np.arange(100) < 8  # 8% of cells: above the 5% allowed
    lpds["seed 1"].loc[bad, "reliable"] = False
    lpds["seed 1"].loc[bad, "mc_se"] = np.nan
    table = estimator_reliability(lpds, margin=0.5).set_index("fit")
    assert table.loc["seed 0", "reliable"] and not table.loc["seed 1", "reliable"]
    assert table.loc["seed 1", "share_khat_above"] == pytest.approx(0.08)  # from the column, k-hat being 0.3
    assert table.loc["seed 1", "mc_bias_bound"] == pytest.approx(0.005)  # NaN standard errors left out
    assert table.loc["seed 0", "min_ess"] == pytest.approx(5.0)
    assert table.loc["seed 0", "median_ess"] == pytest.approx(50.0)
    # No standard error on any cell: no bias bound, not reliable, and the verdict says why.
    lpds["seed 0"]["mc_se"] = np.nan
    table = estimator_reliability(lpds, margin=0.5)
    verdict = predictive_verdict(pairwise_table(lpds, 0.5), table, 0.5, 25.0, 0.02)
    assert verdict.state == "undetermined"
    assert "seed 0: no Monte Carlo standard error" in verdict.reason
    assert "seed 1: unreliable (Pareto k-hat above 0.7) on 8% of cells" in verdict.reason


def test_unreliable_cells_are_counted_per_fit_and_per_pair():
    lpds = frames(n=5, shifts=(0.0, 0.0))
    assert per_fit_table(lpds)["n_unreliable"].tolist() == [0, 0]  # frames without the column: none flagged
    lpds["seed 0"]["reliable"] = [True, False, True, True, False]
    lpds["seed 1"]["reliable"] = [True, False, False, True, True]
    lpds["seed 0"].loc[["c1", "c4"], "mc_se"] = np.nan
    assert per_fit_table(lpds)["n_unreliable"].tolist() == [2, 2]
    assert np.isnan(per_fit_table(lpds)["mc_se"].iloc[0])  # no Monte Carlo total over cells without an SE
    assert pairwise_table(lpds, margin=0.5)["n_unreliable"].tolist() == [3]


def test_verdict_equivalent_and_not():
    def decide(lpds, margin=0.5):
        return predictive_verdict(pairwise_table(lpds, margin), estimator_reliability(lpds, margin), margin, 25.0, 0.02)

    verdict = decide(frames(shifts=(0.0, 0.0, 0.0)))
    assert verdict.equivalent and predictive_sentence(verdict).startswith("Predictively equivalent")
    verdict = decide(frames(shifts=(0.0, 0.0, -1.0)))
    assert verdict.equivalent is False and "2 of 3 pairs" in predictive_sentence(verdict)
    assert verdict.counts[NOT_EQUIVALENT] == 2
    assert verdict.worst["fit_b"] == "seed 2"
    # Without log p(x) for every fit there is no verdict, and the sentence says so.
    untested = predictive_verdict(None)
    assert untested.equivalent is None and "not tested" in predictive_sentence(untested)


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
