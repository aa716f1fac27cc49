"""Restriction analyses against hand-set inputs: the identification verdict's rule and the depth regression."""

import numpy as np

from countvae.diagnostics.analyses import restrictions as rs


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
