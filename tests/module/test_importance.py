"""The one summary of importance weights: estimate, standard error, ESS and Pareto k-hat, against closed forms.

Target: an unnormalised density ``exp(c) N(z; 0, 1)`` whose normaliser ``log Z = c`` is known. Proposal:
``N(0, s^2)``. For ``s < 1`` the weights have a Pareto tail with shape ``k = 1 - s^2`` (the weight is
``exp(a z^2)`` with ``a = (1/s^2 - 1) / 2`` and ``z^2 ~ s^2 chi^2_1``); for ``s >= 1`` they are bounded.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from countvae.module.importance import (
    KHAT_THRESHOLD,
    MAX_UNRELIABLE_SHARE,
    MIN_ESS,
    ImportanceSummary,
    estimate_reliability,
    summarize_log_weights,
)

LOG_Z = -12.5


def _log_weights(s: float, n_draws: int, n_cells: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    z = s * torch.randn((n_draws, n_cells), generator=gen, dtype=torch.float64)
    log_target = LOG_Z - 0.5 * z**2 - 0.5 * math.log(2 * math.pi)
    log_proposal = -0.5 * (z / s) ** 2 - math.log(s) - 0.5 * math.log(2 * math.pi)
    return log_target - log_proposal


def test_exact_proposal_gives_the_normaliser_with_zero_error_and_full_ess():
    log_w = torch.full((50, 3), LOG_Z, dtype=torch.float64)
    summary = summarize_log_weights(log_w)
    np.testing.assert_allclose(summary.lpd, LOG_Z, atol=1e-12)
    np.testing.assert_allclose(summary.mc_se, 0.0, atol=1e-7)
    np.testing.assert_allclose(summary.ess, 50.0, rtol=1e-12)


def test_wide_proposal_is_accurate_reliable_and_its_standard_error_is_calibrated():
    summary = summarize_log_weights(_log_weights(1.5, 2000, 400, seed=0))
    z = (summary.lpd - LOG_Z) / summary.mc_se
    assert summary.reliable.mean() > 0.98
    assert abs(float(np.mean(summary.lpd - LOG_Z))) < 0.01
    assert 0.85 < float(np.std(z)) < 1.15  # the delta-method SE matches the spread over independent repeats


def test_narrow_proposal_is_flagged_and_khat_follows_the_theoretical_pareto_shape():
    medians = {}
    for s in (0.3, 0.5, 0.7):
        summary = summarize_log_weights(_log_weights(s, 4000, 40, seed=1))
        medians[s] = float(np.median(summary.khat))
        if s == 0.3:
            # theory k = 1 - s^2 = 0.91; PSIS underestimates slowly converging tails by ~0.1 at 4,000 draws
            assert abs(medians[s] - 0.91) < 0.15
            assert (summary.khat > KHAT_THRESHOLD).mean() > 0.6
            assert float(np.mean(summary.lpd - LOG_Z)) < -0.1
            # the empirical SE formula is at most 1 whatever the error, so flagged cells report none
            flagged = summary.khat > KHAT_THRESHOLD
            assert np.isnan(summary.mc_se[flagged]).all() and not summary.reliable[flagged].any()
            assert np.isfinite(summary.mc_se[~flagged]).all()
    assert medians[0.3] > medians[0.5] > medians[0.7]  # heavier tails for narrower proposals, as k = 1 - s^2


def test_summary_rows_concatenate_take_and_frame():
    a = summarize_log_weights(_log_weights(1.2, 100, 3, seed=2))
    b = summarize_log_weights(_log_weights(1.2, 100, 2, seed=3))
    both = ImportanceSummary.concatenate([a, b])
    frame = both.take(np.array([4, 0])).to_frame(index=["x", "y"])
    assert list(frame.columns) == ["lpd", "mc_se", "ess", "khat", "reliable"]
    assert frame.loc["x", "lpd"] == b.lpd[1] and frame.loc["y", "lpd"] == a.lpd[0]
    replaced = a.replace_rows(np.array([2, 0]), b)
    assert replaced.lpd[2] == b.lpd[0] and replaced.lpd[0] == b.lpd[1] and replaced.lpd[1] == a.lpd[1]
    with pytest.raises(ValueError, match="at least 2"):
        summarize_log_weights(torch.zeros((1, 3)))
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        summarize_log_weights(torch.tensor([[0.0, float("nan")], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="every importance weight zero"):
        summarize_log_weights(torch.tensor([[0.0, -math.inf], [0.0, -math.inf]]))


def _frame(khat, ess=50.0):
    summary = ImportanceSummary(
        lpd=np.zeros(len(khat)),
        mc_se=np.full(len(khat), 0.1),
        ess=np.broadcast_to(ess, len(khat)),
        khat=np.array(khat),
        flat=np.zeros(len(khat), dtype=bool),
    )
    return summary.to_frame()


def test_estimate_reliability_is_khat_ess_and_the_share_of_cells():
    frame = _frame([0.1, 0.5, 0.9, np.nan] + [0.2] * 16, ess=np.r_[[50.0] * 19, 5.0])
    by_khat = estimate_reliability(frame)
    np.testing.assert_array_equal(by_khat.unreliable[:4], [False, False, True, True])
    assert by_khat.share == pytest.approx(0.1) and not by_khat.reliable  # 2 of 20 cells > MAX_UNRELIABLE_SHARE
    assert estimate_reliability(frame, max_share=0.1).reliable
    with_ess = estimate_reliability(frame, min_ess=MIN_ESS)
    assert with_ess.unreliable[-1] and with_ess.share == pytest.approx(0.15)
    assert estimate_reliability(frame.drop(columns="reliable")).share == pytest.approx(0.1)  # k-hat alone
    unjudged = estimate_reliability(frame.drop(columns=["reliable", "khat"]))
    assert np.isnan(unjudged.share) and not unjudged.reliable and not unjudged.unreliable.any()
    assert MAX_UNRELIABLE_SHARE == 0.05 and KHAT_THRESHOLD == 0.7


def test_every_reliability_rule_of_the_package_is_estimate_reliability(monkeypatch):
    """Moving the one threshold moves the summary, the invariance checks and the report's predictive rule."""
    from countvae.diagnostics.analyses.predictive import estimator_reliability, per_fit_table
    from countvae.invariance.checks import pair_unreliable_fraction
    from countvae.module import importance

    frame = _frame([0.3] * 10)
    lpds = {"a": frame, "b": frame.copy()}
    assert pair_unreliable_fraction(frame, frame, MIN_ESS) == 0.0 and estimator_reliability(lpds, 1.0)["reliable"].all()
    monkeypatch.setattr(importance, "KHAT_THRESHOLD", 0.2)
    moved = frame.drop(columns="reliable")  # the column was computed under the old threshold
    assert pair_unreliable_fraction(moved, moved, MIN_ESS) == 1.0
    assert (estimator_reliability({"a": moved, "b": moved}, 1.0)["share_khat_above"] == 1.0).all()
    assert per_fit_table({"a": moved, "b": moved})["n_unreliable"].tolist() == [10, 10]
    assert not _frame([0.3])["reliable"].iloc[0]


def test_hand_computed_estimate_standard_error_and_ess_of_fixed_weights():
    """Known answer, by hand: weights ``w_s = 1 + s / (S - 1)`` for ``s = 0..S-1`` (S = 101, bounded, so k-hat
    passes) give ``lpd = log mean(w) + c``, ``mc_se = sd(w) / (sqrt(S) mean(w))`` with the n - 1 sample standard
    deviation, and ``ess = (sum w)^2 / sum w^2``. Fails on an n for n - 1 in either place, a missing square
    root, or an ESS of ``1 / sqrt(sum wn^2)``."""
    w = 1.0 + np.arange(101) / 100.0
    shift = -40.0  # the summary is invariant to a common factor of the weights (a log p(x) far below 0)
    summary = summarize_log_weights(torch.as_tensor(np.log(w) + shift).unsqueeze(1))
    assert summary.reliable.all()
    np.testing.assert_allclose(summary.lpd, [math.log(w.mean()) + shift], rtol=0, atol=1e-12)
    np.testing.assert_allclose(summary.mc_se, [w.std(ddof=1) / (math.sqrt(101) * w.mean())], rtol=1e-10)
    np.testing.assert_allclose(summary.ess, [w.sum() ** 2 / (w**2).sum()], rtol=1e-12)


def test_the_thresholds_are_inclusive_as_documented():
    """Known answer from the documented rule: a k-hat of exactly 0.7 is reliable ("at most"), an ESS of exactly
    ``min_ess`` is not below it, and a share of unreliable cells of exactly ``max_share`` passes."""
    columns = (np.array([x, x]) for x in (-3.0, 0.1, 40.0))
    summary = ImportanceSummary(*columns, khat=np.array([KHAT_THRESHOLD, 0.71]), flat=np.zeros(2, dtype=bool))
    np.testing.assert_array_equal(summary.reliable, [True, False])
    frame = _frame([KHAT_THRESHOLD] * 19 + [0.9], ess=np.full(20, MIN_ESS))
    rule = estimate_reliability(frame, min_ess=MIN_ESS, max_share=0.05)
    np.testing.assert_array_equal(rule.unreliable, [False] * 19 + [True])
    assert rule.share == pytest.approx(0.05) and rule.reliable


def _plateau_and_peak_weights(n_draws: int, n_cells: int, seed: int) -> tuple[torch.Tensor, float]:
    """Bounded weights shaped like those of a one-dimensional posterior close to its Student-t proposal: half the
    draws on a plateau at 0.9375, 3% piling up below the maximum 1 (density ~ ``1 / sqrt(1 - w)``), the rest
    uniform below 0.9. Returns the log weights and the log of their exact mean."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand((n_draws, n_cells), generator=gen, dtype=torch.float64)
    component = torch.rand((n_draws, n_cells), generator=gen, dtype=torch.float64)
    plateau, peak, low = 0.9375 * (1 - 1e-3 * u), 1 - 0.0625 * u**2, 0.9 * u
    weights = torch.where(component < 0.5, plateau, torch.where(component < 0.53, peak, low))
    mean = 0.5 * 0.9375 * (1 - 0.5e-3) + 0.03 * (1 - 0.0625 / 3) + 0.47 * 0.45
    return torch.log(weights), math.log(mean)


def test_bounded_weights_with_a_plateau_are_reliable_although_the_pareto_fit_says_otherwise():
    """Known answer: iid bounded weights of known mean. The generalized-Pareto fit to their top draws (the plateau's
    edge, then the pile below the maximum) returns a median k-hat of 5, as it returned 2-3 for 1-d MLP models whose
    estimates were within 0.01 nats of quadrature. The largest weight is at most 1.5 times the mean, so the cells are
    reliable, with standard errors that match the spread over repeats. Fails if k-hat alone decides."""
    log_w, log_mean = _plateau_and_peak_weights(4000, 100, seed=0)
    summary = summarize_log_weights(log_w)
    assert (summary.khat > KHAT_THRESHOLD).mean() > 0.9  # the false alarm this rule exists for
    assert summary.flat.all() and summary.reliable.all() and np.isfinite(summary.mc_se).all()
    z = (summary.lpd - log_mean) / summary.mc_se
    assert abs(float(np.mean(summary.lpd - log_mean))) < 0.002 and 0.85 < float(np.std(z)) < 1.15
    assert not summarize_log_weights(log_w[:199]).flat.any()  # too few draws to call a tail absent


@pytest.mark.parametrize("n_draws", [200, 1000])
def test_pareto_tails_are_never_flat_so_flat_weights_cannot_hide_them(n_draws):
    """Closed form: a proposal ``N(0, s^2)`` for ``N(0, 1)`` gives weights with a Pareto tail of shape
    ``k = 1 - s^2``. For k from 0.70 to 0.91, no cell of 400 has every weight at most 2.5 times the mean with 200
    or more draws (the smallest largest-to-mean ratio of 20,000 cells was 2.7 at 200 draws, 6.8 at 1,000), so
    reliability stays with k-hat there. Fails if the flat threshold were loose enough to clear heavy tails."""
    for s in (0.3, 0.45, 0.55):
        summary = summarize_log_weights(_log_weights(s, n_draws, 400, seed=1))
        assert not summary.flat.any()
        np.testing.assert_array_equal(summary.reliable, summary.khat <= KHAT_THRESHOLD)


def test_reliability_of_a_frame_is_its_reliable_column_where_there_is_one():
    """A cell with k-hat above the threshold and flat weights is ``reliable`` in the summary's frame, and the
    report's rule reads that column rather than k-hat alone; a frame without it falls back to k-hat."""
    frame = _frame([0.9, 0.3])
    frame.loc[0, "reliable"] = True  # as ImportanceSummary.to_frame writes a flat cell
    np.testing.assert_array_equal(estimate_reliability(frame).unreliable, [False, False])
    np.testing.assert_array_equal(estimate_reliability(frame.drop(columns="reliable")).unreliable, [True, False])
