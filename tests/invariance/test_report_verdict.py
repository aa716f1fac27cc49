"""InvarianceReport's verdict from a hand-written checks table (the rules of status, failures and verdicts)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from countvae.invariance.result import CHECK_COLUMNS, InvarianceReport


def _report(rows):
    checks = pd.DataFrame([dict(zip(CHECK_COLUMNS, row, strict=True)) for row in rows], columns=CHECK_COLUMNS)
    checks["ok"] = pd.Series([row[-1] for row in rows], dtype=object)  # kept as given (None, bool or numpy bool)
    return InvarianceReport(checks=checks, transforms={}, variants={})


def _row(check, ok, transform="R", expect="equal", value=0.0, threshold=1.0):
    return ["fitted", transform, "orthogonal", "invariant", check, value, threshold, expect, ok]


def test_nothing_judged_is_not_verified():
    """Known answer: only "report" rows (ok None) judge nothing, so the result is "not verified", never "verified"."""
    report = _report([_row("crn_max_abs_diff", None, expect="report"), _row("indep_z_mean", None, expect="report")])
    assert report.status == "not verified" and not report.passed
    assert report.reasons() == ["no check with a verdict was made"]
    # a map whose checks are all unjudged is not shown as "ok" either, nor as a failure of the theory
    assert report.verdicts()["result"].tolist() == ["not verified"]


def test_a_map_whose_evidence_alone_failed_is_not_verified_not_failed():
    """Known answer: every theory check of the map agrees and only its estimates' reliability (an evidence check)
    fails: the row says "not verified", as the report's status does, where it said FAIL (the theory contradicted)."""
    evidence = _row("indep_unreliable_fraction", False, value=0.125, threshold=0.05)
    report = _report([_row("crn_max_abs_diff", True), _row("indep_z_mean", True), evidence])
    assert report.status == "not verified"
    assert report.verdicts()["result"].tolist() == ["not verified"]
    # the evidence outranks the theory, as in the status: a failed theory check beside it, or the model's own
    # estimator unreliable (its "(none)" row), leaves the map "not verified"
    both = _report([_row("indep_z_mean", False, value=5.0, threshold=3.0), evidence])
    assert both.verdicts()["result"].tolist() == ["not verified"]
    own = _row("unreliable_fraction", False, transform="(none)", value=0.5, threshold=0.1)
    assert _report([_row("crn_max_abs_diff", True), own]).verdicts()["result"].tolist() == ["not verified"]


def test_numpy_false_counts_as_a_failure():
    """Known answer: ok = np.False_ (as a numpy comparison returns) fails the check like False does."""
    report = _report([_row("crn_max_abs_diff", np.True_), _row("indep_z_mean", np.False_, value=5.0, threshold=3.0)])
    assert report.status == "failed" and not report.passed
    assert report.failures["check"].tolist() == ["indep_z_mean"]
    assert report.verdicts()["result"].tolist() == ["FAIL"]


def test_an_evidence_failure_outranks_a_theory_failure():
    """Known answer: with the estimator unreliable (an evidence check) and a theory check failed, the status is
    "not verified" and the evidence's reason comes first; with the evidence sound it is "failed"."""
    theory = _row("indep_z_mean", False, value=5.0, threshold=3.0)
    evidence = _row("unreliable_fraction", False, transform="(none)", value=0.5, threshold=0.1)
    both = _report([_row("crn_max_abs_diff", True), theory, evidence])
    assert both.status == "not verified"
    assert both.reasons()[0].startswith("fitted / (none): the log p(x) estimator is unreliable")
    assert _report([_row("crn_max_abs_diff", True), theory]).status == "failed"
    assert _report([_row("crn_max_abs_diff", True), _row("indep_z_mean", True)]).status == "verified numerically"


def test_failure_reasons_state_the_rule_the_value_broke():
    """Known answer: ``equal`` judges the absolute value, so a failed z of -5.2 against 3 reads "expected
    |indep_z_mean| <= 3" (it read "expected <= 3", which -5.2 is); ``differs`` reads "expected ... > t"; and the
    headline counts the failed checks, not all of them."""
    report = _report(
        [
            _row("crn_max_abs_diff", True),
            _row("indep_z_mean", False, value=-5.2, threshold=3.0),
            _row("prior_max_abs_diff", False, expect="differs", value=1e-9, threshold=1e-6),
            _row("own_z_mean", True, value=1.0, threshold=3.0),
        ]
    )
    assert report.status == "failed"
    assert report.reasons() == [
        "fitted / R: indep_z_mean = -5.2 (expected |indep_z_mean| <= 3)",
        "fitted / R: prior_max_abs_diff = 1e-09 (expected prior_max_abs_diff > 1e-06)",
    ]
    assert "FAILED (2 checks disagree with the theory)" in report.summary()


def test_an_undetected_control_is_inconclusive_not_a_disagreement():
    """Known answer: every orthogonal check agrees and a control's change is below what the estimates resolve
    (control_z under its threshold, as a briefly trained NB model gives a Laplace prior's rotation): the theory says a
    control may change p(x), not by how much, so the row is "inconclusive" and the result "not verified", where it
    said "failed" with "1 checks disagree with the theory"."""
    control = ["control: laplace prior", "rotation", "rotation", "changes", "control_z", -1.39, 4.0, "differs", False]
    rows = [_row("crn_max_abs_diff", True), _row("indep_z_mean", True, value=0.5, threshold=5.0), control]
    report = _report(rows)
    assert report.status == "not verified" and not report.passed and report.disagreements.empty
    assert report.verdicts()["result"].tolist() == ["ok", "inconclusive"]
    assert report.reasons() == [
        "control: laplace prior / rotation: inconclusive: the control changed log p(x) by too little for the "
        "estimates to resolve (control_z = -1.39, detected above 4), which does not contradict the theory: the change "
        "shrinks as the posterior widens (a briefly trained or overdispersed model); train the model longer, use more "
        "draws (a larger n_samples=...), or leave the control out: prior_controls=False drops the prior controls and "
        "controls=False the map controls"
    ]
    assert "NOT VERIFIED (control: laplace prior / rotation: inconclusive" in report.summary()
    # a disagreement beside it still fails the run, counted alone; the reasons, listed as disagreements, are its own
    both = _report([*rows, _row("own_z_mean", False, value=6.0, threshold=5.0)])
    assert both.status == "failed" and "FAILED (1 checks disagree with the theory)" in both.summary()
    assert len(both.reasons()) == 1 and both.reasons()[0].startswith("fitted / R: own_z_mean")
    assert "inconclusive" not in both.summary().split("Disagreements:")[1]
    assert both.verdicts()["result"].tolist() == ["FAIL", "inconclusive"]
