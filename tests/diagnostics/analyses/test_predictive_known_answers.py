"""Hand-computed answers for the equivalence test: the sign of a difference, the margin's ends, exact differences."""

import numpy as np
import pandas as pd
import pytest

from countvae.diagnostics.analyses.predictive import (
    EQUIVALENT,
    NOT_EQUIVALENT,
    UNDETERMINED,
    _pair_decision,
    equivalence_margin,
    equivalence_table,
    estimator_reliability,
    per_fit_table,
)


def _frames(lpd_a, lpd_b, mc_se=0.0):
    idx = pd.Index([f"c{i}" for i in range(len(lpd_a))])
    return {
        "a": pd.DataFrame({"lpd": np.asarray(lpd_a, dtype=float), "mc_se": mc_se}, index=idx),
        "b": pd.DataFrame({"lpd": np.asarray(lpd_b, dtype=float), "mc_se": mc_se}, index=idx),
    }


def test_a_fit_worse_by_more_than_the_margin_is_not_equivalent():
    """d_i = lpd_a - lpd_b = -1 +- 0.1 (alternating): the interval lies below -margin, with z negative."""
    base = np.linspace(-700.0, -600.0, 200)
    lpds = _frames(base, base + 1.0 + 0.1 * (-1.0) ** np.arange(200))
    row = equivalence_table(lpds, margin=0.5).iloc[0]
    assert row["diff_per_cell"] == pytest.approx(-1.0)
    assert row["ci_high"] < -0.5
    assert row["decision"] == NOT_EQUIVALENT
    assert row["z"] < 0


def test_decision_at_the_ends_of_the_margin():
    """Equivalent only strictly inside (-delta, delta); not equivalent only strictly outside [-delta, delta]."""
    assert _pair_decision(-0.49, 0.49, 0.5) == EQUIVALENT
    assert _pair_decision(-0.5, 0.2, 0.5) == UNDETERMINED  # touches -delta: not inside the open interval
    assert _pair_decision(-0.2, 0.5, 0.5) == UNDETERMINED
    assert _pair_decision(0.5, 0.9, 0.5) == UNDETERMINED  # touches delta: not outside the closed interval
    assert _pair_decision(-0.9, -0.5, 0.5) == UNDETERMINED
    assert _pair_decision(0.51, 0.9, 0.5) == NOT_EQUIVALENT
    assert _pair_decision(-0.9, -0.51, 0.5) == NOT_EQUIVALENT
    assert _pair_decision(-0.9, 0.9, 0.5) == UNDETERMINED
    assert _pair_decision(-0.1, 0.1, np.nan) == UNDETERMINED


def test_an_exactly_constant_difference_has_no_sampling_error():
    """lpd_b = lpd_a + 1 on every cell (integers, exact): sd(d) = 0, the interval is the point -1 and z is -inf."""
    lpd_a = -np.arange(100.0, 120.0)
    lpds = _frames(lpd_a, lpd_a + 1.0)
    wide = equivalence_table(lpds, margin=2.0).iloc[0]
    assert wide["se_diff_per_cell"] == 0.0 and wide["ci_low"] == wide["ci_high"] == -1.0
    assert wide["decision"] == EQUIVALENT and wide["p_equivalence"] == 0.0
    assert wide["z"] == -np.inf  # the sign of the difference: fit a is the worse one
    narrow = equivalence_table(lpds, margin=0.5).iloc[0]
    assert narrow["decision"] == NOT_EQUIVALENT and narrow["p_equivalence"] == 1.0
    same = equivalence_table(_frames(lpd_a, lpd_a), margin=0.5).iloc[0]
    assert same["z"] == 0.0 and same["decision"] == EQUIVALENT


def test_per_cell_errors_known_values():
    """lpd = -1, -2, -3, -4: se = sqrt(4) sd, se per cell = sd / sqrt(4), sd = sqrt(5/3); mc errors add in squares."""
    lpds = _frames([-1.0, -2.0, -3.0, -4.0], [-1.0, -2.0, -3.0, -4.0], mc_se=0.5)
    row = per_fit_table(lpds).iloc[0]
    sd = np.sqrt(5.0 / 3.0)
    assert row["se"] == pytest.approx(2.0 * sd)
    assert row["se_per_cell"] == pytest.approx(sd / 2.0)
    assert row["mc_se"] == pytest.approx(1.0)  # sqrt(4 * 0.25)
    assert row["mc_se_per_cell"] == pytest.approx(0.25)


def test_margin_is_a_share_of_the_mean_gain_not_its_median():
    """Gains of 10, 20 and 60 nats per cell: mean 30, so a 2% margin is 0.6 (the median, 20, would give 0.4)."""
    lpds = _frames([-100.0, -200.0, -300.0], [-102.0, -198.0, -300.0])
    mean_lpd = np.array([-101.0, -199.0, -300.0])
    margin, gain = equivalence_margin(lpds, mean_lpd - np.array([10.0, 20.0, 60.0]), 0.02)
    assert gain == pytest.approx(30.0) and margin == pytest.approx(0.6)
    # No gain at all over the baseline: no margin (not a margin of zero).
    margin, gain = equivalence_margin(lpds, mean_lpd, 0.02)
    assert gain == 0.0 and np.isnan(margin)


def test_a_bias_bound_of_exactly_a_tenth_of_the_margin_is_allowed():
    """mc_se = 0.5 on every cell: bias bound 0.5^2 / 2 = 0.125, at most 0.1 x 1.25 (equal in floating point)."""
    lpds = _frames([-1.0, -2.0, -3.0, -4.0], [-1.0, -2.0, -3.0, -4.0], mc_se=0.5)
    for frame in lpds.values():
        frame["khat"] = 0.3
    at = estimator_reliability(lpds, margin=1.25)
    assert at["mc_bias_bound"].tolist() == [0.125, 0.125] and at["reliable"].all()
    assert not estimator_reliability(lpds, margin=1.2)["reliable"].any()
