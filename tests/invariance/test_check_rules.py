"""The decisions of the invariance checks on hand-made numbers whose verdict is known.

Each check is given stand-ins for the evaluated models (only the attributes the check reads) and per-cell
numbers chosen so that the documented rule decides one way and a rule with another constant, another
comparison or another normalisation decides the other way.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from countvae.invariance.checks import (
    Measurement,
    control_change,
    estimator_accuracy,
    exact_quadrature,
    paired_statistics,
    quadrature_agreement_tolerance,
    quadrature_convergence,
)

SETTINGS = SimpleNamespace(
    seed=0,
    quadrature_tolerance=1e-8,
    max_unreliable_fraction=0.05,
    max_estimator_error=0.05,
    min_ess=10.0,
    z_threshold=5.0,
    change_threshold=4.0,
    tolerances={"abs": 1e-9, "rel": 0.0, "output": 1e-9},
    dtype=torch.float64,
)


def _quadrature(values, change=1e-9, nodes=65):
    values = np.asarray(values, dtype=np.float64)
    return SimpleNamespace(
        log_marginal=values, max_change=change, nodes_per_axis=np.full(len(values), nodes), converged=None
    )


def _estimate(lpd, se, khat=0.2, ess=100.0):
    n = len(lpd)
    return pd.DataFrame(
        {"lpd": lpd, "mc_se": se, "ess": np.full(n, ess), "khat": np.full(n, khat), "reliable": np.full(n, khat <= 0.7)}
    )


def _row(rows, name):
    (row,) = [r for r in rows if r.check == name]
    return row


def test_measurement_verdicts_at_their_thresholds():
    """``equal``: |value| at most the threshold; ``differs``: the value above it (one-sided: a control's chi-square z
    is far below 0 when nothing changed); ``at_least``: at least it."""
    assert Measurement("a", -0.5, 0.5, "equal").ok and not Measurement("a", 0.5000001, 0.5, "equal").ok
    assert not Measurement("a", 0.5, 0.5, "differs").ok and Measurement("a", 0.51, 0.5, "differs").ok
    assert not Measurement("a", -0.51, 0.5, "differs").ok
    assert Measurement("a", 0.5, 0.5, "at_least").ok and not Measurement("a", 0.49, 0.5, "at_least").ok
    assert Measurement("a", 3.0).ok is None


def test_paired_statistics_hand_computed():
    """Four cells with differences 0, 0.3, -0.5, 0.05 and combined standard errors ``sqrt(0.06^2 + 0.08^2) = 0.1``:
    mean -0.0375, ``z_mean = -0.0375 / (sqrt(4 * 0.01) / 4) = -0.75``, one cell beyond 4 se (0.5; 0.3 is 3 se),
    ``z_cells = (0 + 9 + 25 + 0.25 - 4) / sqrt(8)``."""
    base = pd.DataFrame({"lpd": [-10.0, -20.0, -30.0, -40.0], "mc_se": [0.06] * 4})
    other = pd.DataFrame({"lpd": [-10.0, -19.7, -30.5, -39.95], "mc_se": [0.08] * 4})
    stats = paired_statistics(base, other)
    assert stats["n"] == 4
    assert stats["mean_diff"] == pytest.approx(-0.0375, abs=1e-12)
    assert stats["z_mean"] == pytest.approx(-0.75, rel=1e-9)
    assert stats["outside_4se"] == pytest.approx(0.25)
    assert stats["z_cells"] == pytest.approx((9 + 25 + 0.25 - 4) / math.sqrt(8), rel=1e-9)
    # a cell whose two estimates both claim a zero error but differ is infinitely many errors apart
    exact = pd.DataFrame({"lpd": [-10.0, -20.0], "mc_se": [0.0, 0.1]})
    moved = pd.DataFrame({"lpd": [-10.5, -20.0], "mc_se": [0.0, 0.1]})
    assert paired_statistics(exact, moved)["z_cells"] == math.inf
    assert paired_statistics(exact, exact)["z_cells"] == pytest.approx(-2 / math.sqrt(4))


def _comparison(invariant, quad0, quad1):
    original = SimpleNamespace(quadrature=quad0)
    return SimpleNamespace(
        invariant=invariant, settings=SETTINGS, original=original, transformed=SimpleNamespace(quadrature=quad1)
    )


def test_quadrature_agreement_tolerance_and_verdicts():
    """Tolerance ``2 * quadrature_tolerance + 1e-13 * max |log p(x)|`` = 2e-8 + 1e-13 * 5e4 = 2.5e-8. An invariant
    map passes at a difference of 2.4e-8 and fails at 2.6e-8; a control must differ by more than 100 times it."""
    quad0 = _quadrature([-5e4, -100.0])
    assert quadrature_agreement_tolerance(_comparison(True, quad0, quad0)) == pytest.approx(2.5e-8, rel=1e-9)
    close = _comparison(True, quad0, _quadrature(quad0.log_marginal + [0.0, 2.4e-8]))
    far = _comparison(True, quad0, _quadrature(quad0.log_marginal + [0.0, 2.6e-8]))
    assert _row(exact_quadrature(close), "quadrature_max_abs_diff").ok
    assert not _row(exact_quadrature(far), "quadrature_max_abs_diff").ok
    # a control: 100 x 2.5e-8 = 2.5e-6
    assert not _row(
        exact_quadrature(_comparison(False, quad0, _quadrature([-5e4, -100.0 + 2e-6]))), "quadrature_max_abs_diff"
    ).ok
    assert _row(
        exact_quadrature(_comparison(False, quad0, _quadrature([-5e4, -100.0 + 3e-6]))), "quadrature_max_abs_diff"
    ).ok
    # the transformed model's own convergence is judged against the tolerance
    unconverged = _comparison(True, quad0, _quadrature(quad0.log_marginal, change=2e-8))
    assert not _row(exact_quadrature(unconverged), "quadrature_transformed_change").ok
    # in float32 the two models are float32 numbers: the float32 equality tolerance is added, 1e-4 + 2e-5 * 5e4
    float32 = SimpleNamespace(**{**vars(SETTINGS), "dtype": torch.float32, "tolerances": {"abs": 1e-4, "rel": 2e-5}})
    in_float32 = SimpleNamespace(**{**vars(_comparison(True, quad0, quad0)), "settings": float32})
    assert quadrature_agreement_tolerance(in_float32) == pytest.approx(2e-8 + 1e-4 + 1.0, rel=1e-9)


def _evaluated(lpd, se, exact, khat=0.2):
    frame = _estimate(np.asarray(lpd, dtype=np.float64), np.asarray(se, dtype=np.float64), khat=khat)
    return SimpleNamespace(settings=SETTINGS, quadrature=_quadrature(exact), lpd=lambda seed: frame)


def test_estimator_accuracy_counts_cells_outside_three_standard_errors_and_cells_without_one():
    """20 cells, exact value 0, standard error 0.01: errors of 0.029 are inside 3 se, 0.031 outside. One cell
    outside is 5% (passes), two are 10% (fails); a cell with no standard error (NaN) counts as outside."""
    se = np.full(20, 0.01)
    one_out = np.r_[0.031, np.full(19, 0.029)]
    rows = estimator_accuracy(_evaluated(one_out, se, np.zeros(20)))
    assert _row(rows, "estimator_outside_3se_fraction").value == pytest.approx(0.05)
    assert _row(rows, "estimator_outside_3se_fraction").ok
    assert _row(rows, "estimator_mean_abs_error").value == pytest.approx((0.031 + 19 * 0.029) / 20)
    two_out = np.r_[0.031, 0.031, np.full(18, 0.029)]
    assert not _row(estimator_accuracy(_evaluated(two_out, se, np.zeros(20))), "estimator_outside_3se_fraction").ok
    no_se = np.r_[np.nan, np.nan, np.full(18, 0.01)]
    rows = estimator_accuracy(_evaluated(np.zeros(20), no_se, np.zeros(20)))
    assert _row(rows, "estimator_outside_3se_fraction").value == pytest.approx(0.1)
    # the mean absolute error against its threshold of 0.05 nats per cell
    # (errors of +-0.06: their mean is 0, their mean absolute value 0.06)
    signed = 0.06 * np.where(np.arange(20) % 2 == 0, 1.0, -1.0)
    assert not _row(estimator_accuracy(_evaluated(signed, se, np.zeros(20))), "estimator_mean_abs_error").ok


def test_control_change_is_detected_by_the_chi_square_not_the_mean():
    """A control that raises half the cells by 0.5 and lowers the others by 0.5 (se 0.1 each, combined
    ``0.1 sqrt(2)``): mean 0, ``z_cells = (n * 12.5 - n) / sqrt(2 n)`` with n = 8, detected (above 4)."""
    n = 8
    base = _estimate(np.full(n, -50.0), np.full(n, 0.1))
    other = _estimate(-50.0 + 0.5 * np.where(np.arange(n) % 2 == 0, 1.0, -1.0), np.full(n, 0.1))
    model = SimpleNamespace(lpd=lambda seed: base if seed == SETTINGS.seed else other)
    c = SimpleNamespace(invariant=False, settings=SETTINGS, original=model, transformed=model)
    rows = control_change(c)
    z = _row(rows, "control_z")
    assert z.value == pytest.approx((n * 12.5 - n) / math.sqrt(2 * n), rel=1e-9) and z.ok
    assert _row(rows, "control_mean_diff").value == pytest.approx(0.0, abs=1e-12)
    same = SimpleNamespace(
        invariant=False,
        settings=SETTINGS,
        original=SimpleNamespace(lpd=lambda seed: base),
        transformed=SimpleNamespace(lpd=lambda seed: base),
    )
    assert not _row(control_change(same), "control_z").ok  # no change: z_cells = -n / sqrt(2 n) < 4


def test_quadrature_convergence_against_its_tolerance():
    """The largest change at the last doubling passes at the tolerance's value and fails just above it."""
    model = SimpleNamespace(settings=SETTINGS, quadrature=_quadrature([-3.0], change=1e-8))
    assert _row(quadrature_convergence(model), "quadrature_change").ok
    model = SimpleNamespace(settings=SETTINGS, quadrature=_quadrature([-3.0], change=1.01e-8))
    assert not _row(quadrature_convergence(model), "quadrature_change").ok


@pytest.mark.parametrize("n", [32, 100, 1000])
def test_a_control_that_changed_nothing_is_not_detected_at_any_number_of_cells(n):
    """Known answer: identical estimates give ``z_cells = (0 - n) / sqrt(2 n) = -sqrt(n / 2)``, -4 at 32 cells and
    -22.4 at 1,000: far below the threshold 4, so not detected. Judged by its absolute value, it was "detected" from
    33 cells on, so a control that changes nothing passed as evidence that the checks can see a change."""
    base = _estimate(np.linspace(-60.0, -40.0, n), np.full(n, 0.1))
    same = SimpleNamespace(
        invariant=False,
        settings=SETTINGS,
        original=SimpleNamespace(lpd=lambda seed: base),
        transformed=SimpleNamespace(lpd=lambda seed: base),
    )
    z = _row(control_change(same), "control_z")
    assert z.value == pytest.approx(-math.sqrt(n / 2), rel=1e-9)
    assert z.ok is False
