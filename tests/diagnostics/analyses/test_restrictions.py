"""Restriction analyses on hand-set inputs: verdict rules, truth recovery, predictive cost, program R^2, depth."""

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import Ridge
from sklearn.metrics import r2_score

from countvae.diagnostics.analyses import restrictions as rs
from countvae.diagnostics.analyses.alignment import split_halves


def test_identified_needs_every_pair_to_agree_not_the_mean():
    # Mean agreement above the threshold but one pair of seeds far below it: not identified, and not "not
    # identified" either (some pairs agree): undetermined. With every pair above: identified.
    high = rs.IDENTIFIED_AGREEMENT + 0.5 * (1 - rs.IDENTIFIED_AGREEMENT)
    assert rs.identification_verdict(0.2, high, 0.1, split_half=high) == rs.UNDETERMINED
    assert rs.identification_verdict(high, high, 0.1, split_half=high) == rs.IDENTIFIED


def test_depth_residuals_remove_a_quadratic_trend_in_log_depth_exactly():
    # Expression exactly 1 + 2 log l - 0.3 (log l)^2 (gene 0) and 5 - log l (gene 1): residuals are 0;
    # a depth-free gene keeps its deviations from its mean.
    rng = np.random.default_rng(0)
    library = rng.uniform(500, 20000, size=200)
    log_l = np.log(library)
    noise = rng.standard_normal(200)
    expression = np.column_stack([1 + 2 * log_l - 0.3 * log_l**2, 5 - log_l, noise])
    residuals = rs.depth_residuals(expression, library)
    np.testing.assert_allclose(residuals[:, :2], 0.0, atol=1e-8)
    design = np.column_stack([np.ones(200), log_l, log_l**2])
    projection = design @ np.linalg.pinv(design)
    np.testing.assert_allclose(residuals[:, 2], noise - projection @ noise, atol=1e-8)


@pytest.mark.parametrize(("z_in_margin", "verdict"), [(1.8, "equivalent"), (1.5, "gains")])
def test_predictive_cost_is_equivalent_when_the_90_percent_interval_is_inside_the_margin(
    z_in_margin: float, verdict: str
) -> None:
    """One seed, 400 cells, per-cell differences with mean 0.3 and sd 1.2 exactly (no Monte Carlo error).

    The estimate is then 0.3 and its standard error 1.2 / sqrt(400) = 0.06. A margin of 0.3 + 1.8 se lies between the
    90% (1.645 se) and 95% (1.96 se) one-sided widths, so the 90% interval fits inside it: ``equivalent``. At
    0.3 + 1.5 se it does not, and the 95% interval lies above 0: ``gains``. Catches an equivalence judged on the 95%
    interval (or any width outside 1.5 to 1.8 se); not the seed-variance term, which one seed leaves at 0.
    """
    rng = np.random.default_rng(0)
    n = 400
    noise = rng.normal(size=n)
    d = 0.3 + 1.2 * (noise - noise.mean()) / noise.std(ddof=1)
    base = rng.normal(-100.0, 5.0, n)
    restricted = {0: pd.DataFrame({"lpd": base + d, "mc_se": 0.0})}
    unrestricted = {0: pd.DataFrame({"lpd": base, "mc_se": 0.0})}
    out = rs.predictive_cost(restricted, unrestricted, margin=0.3 + z_in_margin * 0.06)
    assert (out["difference_per_cell"], out["se_per_cell"]) == pytest.approx((0.3, 0.06), abs=1e-12)
    assert out["verdict"] == verdict


def test_sources_mcc_min_is_the_worst_fit_and_sources_mcc_the_mean() -> None:
    """One fit is the sources, the other the sources rotated by 45 degrees.

    The sources are made exactly uncorrelated with equal variance, so every correlation of a rotated coordinate with
    a source is +-1/sqrt(2): the rotated fit's MCC is 1/sqrt(2), the worst fit's, and the mean is
    (1 + 1/sqrt(2)) / 2. Against an unrestricted MCC of 0.70 the worst fit is not above it by the growth margin, so
    the verdict is "no closer". Catches the worst fit read as the mean; not the Hungarian matching itself.
    """
    rng = np.random.default_rng(0)
    raw = rng.laplace(size=(500, 2))
    z = np.linalg.qr(raw - raw.mean(0))[0] * np.sqrt(500)
    c = np.sqrt(0.5)
    scores = rs.truth_recovery({"s0": z, "s1": z @ np.array([[c, -c], [c, c]])}, {"s0": None, "s1": None}, z)
    assert scores["sources_mcc_min"] == pytest.approx(c, abs=1e-12)
    assert scores["sources_mcc"] == pytest.approx((1 + c) / 2, abs=1e-12)
    verdict = rs.truth_verdict(scores["sources_mcc"], scores["sources_mcc_min"], 0.70)
    assert verdict == rs.NOT_CLOSER


def test_program_r2_is_sklearns_r2_score_on_the_scored_half_for_an_offset_coordinate() -> None:
    """Held-out R^2 of a coordinate with mean 2 against ``sklearn.metrics.r2_score`` on the same halves.

    The reference refits the same ridge (standardised on the fit half) and scores with scikit-learn's R^2, whose total
    sum of squares is centred on the scored cells' mean (about 0.55 here). Catches an uncentred total (about 0.94 on
    this offset coordinate); it relies on the halves being :func:`split_halves`'s, which it does not test.
    """
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 5))
    z = 2.0 + x @ np.array([0.5, 0.3, 0.0, 0.0, 0.0]) + 0.5 * rng.normal(size=300)
    fit, score = split_halves(300, 0)
    xs = (x - x[fit].mean(0)) / x[fit].std(0)
    expected = r2_score(z[score], Ridge(alpha=1.0).fit(xs[fit], z[fit]).predict(xs[score]))
    assert rs.program_dimension_r2(z, x, seed=0) == pytest.approx(expected, abs=1e-10)


def test_split_half_within_the_growth_margin_below_the_cross_seed_value_reads_as_not_growing() -> None:
    """Not identified, cross-seed 0.60: a split half of 0.58 is within the 0.05 growth margin, so agreement "does not
    grow with cells"; 0.54 is below by more than the margin, so the halves "agree less" than the seeds.

    Catches a comparison that drops the margin; the wording itself is pinned only by its opening words.
    """
    assert rs.split_half_reading(rs.NOT_IDENTIFIED, 0.60, 0.58).startswith("agreement does not grow with cells")
    assert rs.split_half_reading(rs.NOT_IDENTIFIED, 0.60, 0.54).startswith("independent halves agree less")
