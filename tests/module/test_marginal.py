"""The core ``log p(x)`` estimator against closed forms, with bad proposals it must flag.

Target with a known marginal: the linear-Gaussian model ``z ~ N(0, I_L)``,
``x | z ~ N(W z + a, s^2 I_D)``, for which ``x ~ N(a, W W^T + s^2 I)`` exactly.
With small ``s`` the posterior is narrow (like a high-count cell's), so a guide
that is off by a few posterior sd is a poor proposal on its own.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from countvae.errors import InvalidArgumentError
from countvae.module.importance import KHAT_THRESHOLD
from countvae.module.marginal import MarginalSettings, estimate_log_marginal, finite_difference_neg_hessian

D, L, N_CELLS, NOISE = 12, 2, 40, 0.05


def _normal_log_prob(x: torch.Tensor, mean: torch.Tensor, sd: float) -> torch.Tensor:
    return (-0.5 * ((x - mean) / sd) ** 2 - math.log(sd) - 0.5 * math.log(2 * math.pi)).sum(-1)


@pytest.fixture(scope="module")
def gaussian_problem():
    gen = torch.Generator().manual_seed(7)
    W = torch.randn(D, L, generator=gen, dtype=torch.float64)
    a = torch.randn(D, generator=gen, dtype=torch.float64)
    z = torch.randn(N_CELLS, L, generator=gen, dtype=torch.float64)
    x = z @ W.T + a + NOISE * torch.randn(N_CELLS, D, generator=gen, dtype=torch.float64)

    def log_joint(zz: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        return _normal_log_prob(x[cells], zz @ W.T + a, NOISE) + _normal_log_prob(zz, torch.zeros(()), 1.0)

    marginal = torch.distributions.MultivariateNormal(a, W @ W.T + NOISE**2 * torch.eye(D, dtype=torch.float64))
    exact = marginal.log_prob(x).numpy()
    precision = W.T @ W / NOISE**2 + torch.eye(L, dtype=torch.float64)
    post_cov = torch.linalg.inv(precision)
    post_mean = (x - a) @ W / NOISE**2 @ post_cov
    post_sd = torch.sqrt(torch.diagonal(post_cov))
    return log_joint, exact, post_mean, post_sd


def _errors(summary, exact):
    err = summary.lpd - exact
    return float(np.abs(err).mean()), float(np.mean(np.abs(err) <= 3 * summary.mc_se))


def test_recovers_the_closed_form_marginal_from_an_offset_narrow_guide(gaussian_problem):
    log_joint, exact, post_mean, post_sd = gaussian_problem
    loc = post_mean + 5 * post_sd  # five posterior sd off: the guide alone would be a poor proposal
    scale = 0.3 * post_sd.expand(N_CELLS, L)
    summary = estimate_log_marginal(log_joint, loc, scale, torch.Generator().manual_seed(0))
    mean_abs, within = _errors(summary, exact)
    assert mean_abs < 0.02 and within >= 0.95
    assert summary.reliable.all() and np.isfinite(summary.mc_se).all()
    assert (summary.mc_se > 0).all()  # a real Monte Carlo error, not an exact proposal
    frame = summary.to_frame()
    assert list(frame.columns) == ["lpd", "mc_se", "ess", "khat", "reliable"]


def test_full_covariance_factor_of_the_guide_is_accepted_and_agrees(gaussian_problem):
    log_joint, exact, post_mean, post_sd = gaussian_problem
    rotation = torch.tensor([[math.cos(0.7), -math.sin(0.7)], [math.sin(0.7), math.cos(0.7)]], dtype=torch.float64)
    factor = (rotation * torch.tensor([0.02, 0.05], dtype=torch.float64)).expand(N_CELLS, L, L)  # not triangular
    summary = estimate_log_marginal(log_joint, post_mean, factor, torch.Generator().manual_seed(1))
    mean_abs, within = _errors(summary, exact)
    assert mean_abs < 0.02 and within >= 0.95


def test_bad_proposal_is_flagged_by_khat_with_no_standard_error(gaussian_problem):
    log_joint, exact, post_mean, post_sd = gaussian_problem
    # no Newton, no restarts, no redraw or second pass: a t at a guide four posterior sd off, too narrow
    crippled = MarginalSettings(
        n_pilot=0, pilot_restarts=0, newton_steps=0, guide_weight=0.0, redraw=0, escalation_draws=0
    )
    loc = post_mean + 4 * post_sd
    scale = 0.3 * post_sd.expand(N_CELLS, L)
    bad = estimate_log_marginal(log_joint, loc, scale, torch.Generator().manual_seed(2), crippled)
    flagged = bad.khat > KHAT_THRESHOLD
    assert flagged.mean() > 0.5
    assert np.isnan(bad.mc_se[flagged]).all() and not bad.reliable[flagged].any()
    assert float(np.mean(bad.lpd - exact)) < -0.5  # and the estimate is indeed far too low
    # the default settings repair the same proposal: Newton moves to the mode
    good = estimate_log_marginal(log_joint, loc, scale, torch.Generator().manual_seed(2))
    assert good.reliable.all() and _errors(good, exact)[0] < 0.02


def test_second_pass_redoes_flagged_cells_with_more_draws(gaussian_problem):
    log_joint, exact, post_mean, post_sd = gaussian_problem
    loc = post_mean + 4 * post_sd
    scale = 0.3 * post_sd.expand(N_CELLS, L)
    first_pass_bad = MarginalSettings(n_pilot=0, pilot_restarts=0, newton_steps=0, guide_weight=0.0)
    summary = estimate_log_marginal(log_joint, loc, scale, torch.Generator().manual_seed(2), first_pass_bad)
    # the second pass keeps newton_steps=0, so it cannot move the centre; what it changes is the draw count
    without = estimate_log_marginal(
        log_joint,
        loc,
        scale,
        torch.Generator().manual_seed(2),
        MarginalSettings(**{**vars(first_pass_bad), "escalation_draws": 0}),
    )
    redone = without.khat > KHAT_THRESHOLD
    assert redone.any()
    np.testing.assert_array_equal(summary.lpd[~redone], without.lpd[~redone])
    assert not np.array_equal(summary.lpd[redone], without.lpd[redone])


def test_redraw_replaces_flagged_cells_with_fresh_draws_and_cannot_hide_a_bad_proposal(gaussian_problem):
    log_joint, exact, post_mean, post_sd = gaussian_problem
    scale = 0.5 * post_sd.expand(N_CELLS, L)
    # no Newton and no restarts: the t sits at the guide's mean, one posterior sd off (some cells' k-hat from
    # 100 draws exceeds the threshold) or two sd off (a poor proposal for most cells)
    plain = MarginalSettings(
        n_draws=100, n_pilot=0, pilot_restarts=0, prior_restarts=0, newton_steps=0, redraw=0, escalation_draws=0
    )
    with_redraw = MarginalSettings(**{**vars(plain), "redraw": 4})
    loc = post_mean + post_sd
    first = estimate_log_marginal(log_joint, loc, scale, torch.Generator().manual_seed(4), plain)
    redrawn = estimate_log_marginal(log_joint, loc, scale, torch.Generator().manual_seed(4), with_redraw)
    flagged = first.khat > KHAT_THRESHOLD
    assert 3 <= flagged.sum() <= N_CELLS // 2
    np.testing.assert_array_equal(redrawn.lpd[~flagged], first.lpd[~flagged])  # the same first pass
    assert not np.intersect1d(redrawn.lpd[flagged], first.lpd[flagged]).size  # new values, from fresh draws
    assert redrawn.reliable.all()  # 400 draws from the same mixture pass
    err = np.abs(redrawn.lpd[flagged] - exact[flagged])
    assert err.mean() < 0.15 and np.all(err <= 4 * redrawn.mc_se[flagged])
    # two sd off: more draws from the same poor mixture leave most cells flagged
    far = post_mean + 2 * post_sd
    poor = estimate_log_marginal(log_joint, far, scale, torch.Generator().manual_seed(4), with_redraw)
    assert (~poor.reliable).mean() > 0.5


def test_restarts_find_a_second_mode_that_the_guide_never_sees():
    # log joint: exp(c) (N(z; m, s^2 I) + N(z; -m, s^2 I)) / 2, normaliser exp(c); the guide sits on +m only
    m = torch.tensor([2.0, 1.0], dtype=torch.float64)
    sd, c = 0.1, -30.0

    def log_joint(zz: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        both = torch.stack([_normal_log_prob(zz, m, sd), _normal_log_prob(zz, -m, sd)])
        return c + torch.logsumexp(both, dim=0) - math.log(2.0)

    n = 20
    loc, scale = m.expand(n, 2).clone(), torch.full((n, 2), sd, dtype=torch.float64)
    found = estimate_log_marginal(log_joint, loc, scale, torch.Generator().manual_seed(3))
    assert np.abs(found.lpd - c).max() < 0.05 and found.reliable.all()
    single = MarginalSettings(n_pilot=0, pilot_restarts=0, prior_restarts=0)
    missed = estimate_log_marginal(log_joint, loc, scale, torch.Generator().manual_seed(3), single)
    # without restarts half the mass is missed (log 2 low); the weights cannot show it
    np.testing.assert_allclose(missed.lpd, c - math.log(2.0), atol=0.05)


def test_snapped_restarts_stop_early_and_keep_the_estimate_and_the_second_mode(gaussian_problem):
    log_joint, exact, post_mean, post_sd = gaussian_problem
    calls = {"points": 0}

    def counted(zz: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        calls["points"] += zz.shape[0] * zz.shape[1]
        return log_joint(zz, cells)

    scale = 0.3 * post_sd.expand(N_CELLS, L)
    cost, error = {}, {}
    for radius in (0.0, 3.0):
        calls["points"] = 0
        settings = MarginalSettings(snap_radius=radius)
        summary = estimate_log_marginal(counted, post_mean + post_sd, scale, torch.Generator().manual_seed(8), settings)
        cost[radius], error[radius] = calls["points"], _errors(summary, exact)[0]
        assert summary.reliable.all()
    # pilot restarts start inside the first mode's bulk and stop at once; the estimate stays exact
    assert cost[3.0] < cost[0.0]
    assert error[3.0] < 0.02 and error[0.0] < 0.02
    # a second mode far from the first is still found: the snap only applies near the first mode
    m = torch.tensor([2.0, 1.0], dtype=torch.float64)

    def two_modes(zz: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        both = torch.stack([_normal_log_prob(zz, m, 0.1), _normal_log_prob(zz, -m, 0.1)])
        return -30.0 + torch.logsumexp(both, dim=0) - math.log(2.0)

    loc, sd = m.expand(20, 2).clone(), torch.full((20, 2), 0.1, dtype=torch.float64)
    snapping = MarginalSettings(snap_radius=3.0)
    found = estimate_log_marginal(two_modes, loc, sd, torch.Generator().manual_seed(3), snapping)
    assert np.abs(found.lpd + 30.0).max() < 0.05 and found.reliable.all()


def test_pooled_pilot_and_final_weights_are_unbiased_for_the_closed_form_marginal(gaussian_problem):
    # exp(lpd) must average to p(x) over seeds; few draws make a wrong mixture density visible as a bias.
    # The guide is three posterior sd off and twice as wide, so the pilot's guide draws and its t draws
    # have different densities: adding the pilot's draws to the wrong components would bias the mean.
    log_joint, exact, post_mean, post_sd = gaussian_problem
    loc, scale = post_mean + 3 * post_sd, 2 * post_sd.expand(N_CELLS, L)
    few = MarginalSettings(
        n_draws=10, n_pilot=10, pilot_restarts=2, prior_restarts=2, guide_weight=0.3, redraw=0, escalation_draws=0
    )
    ratios = np.concatenate(
        [
            np.exp(estimate_log_marginal(log_joint, loc, scale, torch.Generator().manual_seed(s), few).lpd - exact)
            for s in range(25)
        ]
    )
    se = ratios.std(ddof=1) / math.sqrt(ratios.size)
    assert abs(ratios.mean() - 1.0) < 4 * se and se < 0.01
    # the unpooled estimator is unbiased too, with fewer draws: the pooled one is closer to p(x) per cell
    unpooled = replace(few, pool_pilot=False)
    spread = {
        pool: np.abs(estimate_log_marginal(log_joint, loc, scale, torch.Generator().manual_seed(99), st).lpd - exact)
        for pool, st in ((True, few), (False, unpooled))
    }
    assert spread[True].mean() < spread[False].mean()


def test_restarts_with_the_first_modes_metric_need_fewer_curvatures_and_still_find_both_modes(gaussian_problem):
    log_joint, exact, post_mean, post_sd = gaussian_problem
    calls = {"rows": 0}

    def counted_curvature(zz: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        calls["rows"] += zz.shape[0]
        return finite_difference_neg_hessian(log_joint)(zz, cells)

    loc, scale = post_mean + 3 * post_sd, post_sd.expand(N_CELLS, L)
    rows = {}
    for fixed in (False, True):
        calls["rows"] = 0
        settings = MarginalSettings(fixed_restart_metric=fixed, snap_radius=0.0)
        gen = torch.Generator().manual_seed(2)
        summary = estimate_log_marginal(log_joint, loc, scale, gen, settings, neg_hessian=counted_curvature)
        rows[fixed] = calls["rows"]
        assert _errors(summary, exact)[0] < 0.02 and summary.reliable.all()
    assert rows[True] < rows[False]
    m = torch.tensor([2.0, 1.0], dtype=torch.float64)

    def two_modes(zz: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        both = torch.stack([_normal_log_prob(zz, m, 0.1), _normal_log_prob(zz, -m, 0.1)])
        return -30.0 + torch.logsumexp(both, dim=0) - math.log(2.0)

    loc, sd = m.expand(20, 2).clone(), torch.full((20, 2), 0.1, dtype=torch.float64)
    fixed = MarginalSettings(fixed_restart_metric=True)
    found = estimate_log_marginal(two_modes, loc, sd, torch.Generator().manual_seed(3), fixed)
    assert np.abs(found.lpd + 30.0).max() < 0.05 and found.reliable.all()


def test_same_seed_same_numbers_and_chunking_does_not_change_the_draws(gaussian_problem):
    log_joint, _, post_mean, post_sd = gaussian_problem
    scale = post_sd.expand(N_CELLS, L)
    runs = [
        estimate_log_marginal(log_joint, post_mean, scale, torch.Generator().manual_seed(5), points_per_call=ppc)
        for ppc in (2**14, 2**14, 37)
    ]
    np.testing.assert_array_equal(runs[0].lpd, runs[1].lpd)
    np.testing.assert_allclose(runs[0].lpd, runs[2].lpd, rtol=0, atol=1e-9)
    other = estimate_log_marginal(log_joint, post_mean, scale, torch.Generator().manual_seed(6))
    assert not np.array_equal(runs[0].lpd, other.lpd)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("n_draws", 1, "n_draws must be an integer >= 2"),
        ("n_pilot", -1, "n_pilot"),
        ("pilot_restarts", 300, "cannot exceed n_pilot"),
        ("guide_weight", 1.0, r"guide_weight must be a number in \[0, 1\)"),
        ("mode_floor", 1.5, "mode_floor"),
        ("df", 2.5, "positive integer or math.inf"),
        ("newton_tol", 0.0, "newton_tol"),
        ("restart_tol", -1e-3, "restart_tol"),
        ("snap_radius", -1.0, "snap_radius"),
        ("snap_radius", math.inf, "snap_radius"),
        ("redraw", -1, "redraw must be an integer >= 0"),
        ("escalation_draws", 1, "escalation_draws"),
        ("pool_pilot", 1, "pool_pilot must be True or False"),
        ("fixed_restart_metric", None, "fixed_restart_metric must be True or False"),
        ("n_draws", 10.0, "n_draws must be an integer"),
    ],
)
def test_settings_are_validated(field, value, match):
    with pytest.raises(ValueError, match=match):
        MarginalSettings(**{field: value})


def test_settings_errors_are_countvaes_and_numpy_integers_are_numbers():
    with pytest.raises(InvalidArgumentError, match="cannot exceed n_pilot"):
        MarginalSettings(pilot_restarts=300)
    for df in (True, "5"):
        with pytest.raises(InvalidArgumentError, match="positive integer or math.inf"):
            MarginalSettings(df=df)
    assert MarginalSettings(df=np.int64(5)).df == 5 and MarginalSettings(df=math.inf).df == math.inf


def test_inputs_are_validated(gaussian_problem):
    log_joint, _, post_mean, post_sd = gaussian_problem
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="scale must have shape"):
        estimate_log_marginal(log_joint, post_mean, post_sd, gen)
    with pytest.raises(TypeError, match="torch.Generator"):
        estimate_log_marginal(log_joint, post_mean, post_sd.expand(N_CELLS, L), 0)
    with pytest.raises(ValueError, match="finite"):
        estimate_log_marginal(log_joint, post_mean * math.nan, post_sd.expand(N_CELLS, L), gen)
    with pytest.raises(ValueError, match="log_joint returned shape"):
        estimate_log_marginal(lambda z, c: log_joint(z, c).sum(0), post_mean, post_sd.expand(N_CELLS, L), gen)


def test_proposal_densities_are_the_closed_form_gaussian_and_student_t():
    """Known answer: scipy's multivariate normal and multivariate t log densities at the same points, for a
    lower-triangular scale factor (the t's scale matrix is ``tril tril^T``, df 4; df inf is the Gaussian)."""
    from scipy import stats

    from countvae.module.marginal import _LocationScale

    gen = torch.Generator().manual_seed(0)
    loc = torch.randn(2, 3, generator=gen, dtype=torch.float64)
    tril = torch.tril(torch.randn(2, 3, 3, generator=gen, dtype=torch.float64))
    tril = tril - torch.diag_embed(torch.diagonal(tril, dim1=-2, dim2=-1)) + torch.diag_embed(torch.rand(2, 3) + 0.5)
    z = torch.randn(5, 2, 3, generator=gen, dtype=torch.float64) * 2
    for df in (4, math.inf):
        ours = _LocationScale(loc, tril, df).log_prob(z).numpy()
        for c in range(2):
            shape = (tril[c] @ tril[c].T).numpy()
            ref = (
                stats.multivariate_normal(loc[c].numpy(), shape).logpdf(z[:, c].numpy())
                if df == math.inf
                else stats.multivariate_t(loc[c].numpy(), shape, df=df).logpdf(z[:, c].numpy())
            )
            np.testing.assert_allclose(ours[:, c], ref, rtol=1e-12, atol=1e-12)


def test_student_t_draws_have_the_t_variance():
    """Known answer: a multivariate t with df 5 and scale matrix ``S`` has covariance ``S df / (df - 2)``."""
    from countvae.module.marginal import _LocationScale

    tril = torch.tensor([[[1.0, 0.0], [0.6, 0.8]]], dtype=torch.float64)
    t = _LocationScale(torch.zeros(1, 2, dtype=torch.float64), tril, 5)
    draws = t.sample(200_000, torch.Generator().manual_seed(3))[:, 0]
    cov = torch.cov(draws.T)
    torch.testing.assert_close(cov, (tril[0] @ tril[0].T) * 5 / 3, rtol=0.04, atol=0.02)


def test_mode_shares_are_laplace_masses_mixed_with_a_uniform_floor():
    """Known answer by hand: two modes with log joints 0 and log 2 and precisions ``I`` and ``4 I`` (2-d) have
    Laplace masses ``exp(f) det(H)^(-1/2)`` = 1 and 2 / 4 = 0.5, shares 2/3 and 1/3; with a floor of 0.3 the shares
    are ``0.7 * (2/3, 1/3) + 0.15``."""
    from countvae.module.marginal import _mode_shares, _Modes

    eye = torch.eye(2, dtype=torch.float64).expand(3, 2, 2)
    first = _Modes(torch.zeros(3, 2, dtype=torch.float64), torch.zeros(3, dtype=torch.float64), eye)
    second = _Modes(
        torch.ones(3, 2, dtype=torch.float64), torch.full((3,), math.log(2.0), dtype=torch.float64), 4 * eye
    )
    shares = _mode_shares([first, second], 0.3)
    expected = torch.tensor([0.7 * 2 / 3 + 0.15, 0.7 / 3 + 0.15], dtype=torch.float64)
    torch.testing.assert_close(shares, expected.unsqueeze(1).expand(2, 3), rtol=1e-12, atol=0)


def test_draws_per_component_follow_the_largest_remainders():
    """Known answer by hand: shares (0.5, 0.3, 0.2) of 7 draws are 3.5, 2.1, 1.4: floors 3, 2, 1 and the one draw
    left goes to the largest remainder (0.5): 4, 2, 1. Shares (0.34, 0.33, 0.33) of 2 draws: 0.68, 0.66, 0.66 give
    floors 0 and the two draws go to the first component and then the second (a tie keeps component order)."""
    from countvae.module.marginal import _LocationScale, _Mixture

    one = _LocationScale(torch.zeros(2, 1, dtype=torch.float64), torch.ones(2, 1, 1, dtype=torch.float64), math.inf)
    shares = torch.tensor([[0.5, 0.34], [0.3, 0.33], [0.2, 0.33]], dtype=torch.float64)
    counts = _Mixture((one, one, one), shares).counts(7)
    assert counts[:, 0].tolist() == [4, 2, 1]
    assert _Mixture((one, one, one), shares).counts(2)[:, 1].tolist() == [1, 1, 0]
    # the realised mixture density of identical components is the component's density
    z = torch.randn(4, 2, 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.testing.assert_close(
        _Mixture((one, one, one), shares).realised_log_prob(z, counts), one.log_prob(z), rtol=1e-12, atol=1e-12
    )


def test_the_guide_component_is_the_guides_gaussian():
    """Known answer: the guide enters the mixture as ``N(loc, diag(scale^2))`` for a diagonal sd and as
    ``N(loc, A A^T)`` for a (non-triangular) factor ``A`` of the covariance; torch's normal densities."""
    from countvae.module.marginal import _guide

    gen = torch.Generator().manual_seed(1)
    loc = torch.randn(3, 2, generator=gen, dtype=torch.float64)
    sd = torch.rand(3, 2, generator=gen, dtype=torch.float64) + 0.2
    factor = torch.randn(3, 2, 2, generator=gen, dtype=torch.float64)
    z = torch.randn(4, 3, 2, generator=gen, dtype=torch.float64)
    diag_ref = torch.distributions.Normal(loc, sd).log_prob(z).sum(-1)
    torch.testing.assert_close(_guide(loc, sd).log_prob(z), diag_ref, rtol=1e-12, atol=1e-12)
    full_ref = torch.distributions.MultivariateNormal(loc, covariance_matrix=factor @ factor.transpose(-1, -2))
    torch.testing.assert_close(_guide(loc, factor).log_prob(z), full_ref.log_prob(z), rtol=1e-10, atol=1e-10)


def test_flat_and_negative_curvature_directions_take_the_fallbacks_curvature():
    """Known answer by hand: a symmetric matrix with eigenvalues -1, 0 and 3 along the axes and a fallback of
    ``5 I``: the directions with curvature below 1e-6 (-1 and exactly 0) take 5, the positive one keeps 3."""
    from countvae.module.marginal import _patched_precision

    neg_hess = torch.diag(torch.tensor([-1.0, 0.0, 3.0], dtype=torch.float64)).unsqueeze(0)
    fallback = 5 * torch.eye(3, dtype=torch.float64).unsqueeze(0)
    expected = torch.diag(torch.tensor([5.0, 5.0, 3.0], dtype=torch.float64)).unsqueeze(0)
    torch.testing.assert_close(_patched_precision(neg_hess, fallback), expected, rtol=1e-12, atol=1e-12)


def test_a_restart_snaps_to_the_first_mode_only_inside_its_bulk_and_not_above_it():
    """Known answer from the rule ``(z - mode)^T H (z - mode) < radius^2`` and ``f(z) <= f(mode) + tol``: with
    ``H = 4 I`` and radius 1.5 a point at distance 0.7 (Mahalanobis 1.4) snaps, one at 0.8 (1.6) does not, and a
    point at 0.7 whose log joint is above the mode's by more than ``tol`` is climbing elsewhere and does not."""
    from countvae.module.marginal import _Modes, _near

    known = _Modes(
        torch.zeros(3, 2, dtype=torch.float64),
        torch.zeros(3, dtype=torch.float64),
        4 * torch.eye(2, dtype=torch.float64).expand(3, 2, 2),
    )
    z = torch.tensor([[0.7, 0.0], [0.0, 0.8], [0.7, 0.0]], dtype=torch.float64)
    value = torch.tensor([-0.5, -0.5, 0.02], dtype=torch.float64)
    assert _near(known, z, value, 1.5, 0.01).tolist() == [True, False, False]


def test_the_guides_precision_is_the_inverse_of_its_covariance():
    """Known answer: for a guide with covariance ``A A^T`` (non-triangular ``A``) the fallback curvature is
    ``(A A^T)^-1``."""
    from countvae.module.marginal import _guide, _precision_of

    factor = torch.tensor([[[1.0, 0.5], [-0.3, 0.4]]], dtype=torch.float64)
    expected = torch.linalg.inv(factor @ factor.transpose(-1, -2))
    torch.testing.assert_close(_precision_of(_guide(torch.zeros(1, 2, dtype=torch.float64), factor)), expected)


def test_the_second_pass_settings_are_as_documented():
    """``escalated()``: ``escalation_draws`` final draws, twice the pilot and the restarts, 1.5 times the restart
    steps (rounded down), and no third pass."""
    s = MarginalSettings(n_pilot=50, pilot_restarts=3, prior_restarts=5, restart_steps=9, escalation_draws=700)
    e = s.escalated()
    assert (e.n_draws, e.n_pilot, e.pilot_restarts, e.prior_restarts, e.restart_steps) == (700, 100, 6, 10, 13)
    assert e.redraw == 0 and e.escalation_draws == 0
