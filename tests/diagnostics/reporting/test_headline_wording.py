"""The headline's wording: each reason said once, verbs agreeing with the number of components or pairs."""

from __future__ import annotations

import numpy as np
import pandas as pd

from countvae.diagnostics.analyses.predictive import EQUIVALENT, NOT_EQUIVALENT, UNDETERMINED
from countvae.diagnostics.reporting.headline import ica_sentence, predictive_sentence, verdict_lines
from countvae.diagnostics.reporting.verdicts import (
    AGREE,
    DIFFER,
    FEW_CELLS_REASON,
    GAUSSIAN_REASON,
    ICA_QUANTITY,
    LPD_QUANTITY,
    ica_row_judgement,
    judge_invariants,
    predictive_verdict,
)


def _pairs(decisions: list[str], diffs: list[float] | None = None) -> pd.DataFrame:
    n = len(decisions)
    diff = np.zeros(n) if diffs is None else np.asarray(diffs, dtype=float)
    return pd.DataFrame(
        {
            "fit_a": [f"seed {i}" for i in range(n)],
            "fit_b": [f"seed {i + 1}" for i in range(n)],
            "n_cells": 200,
            "diff_per_cell": diff,
            "ci_low": diff - 0.3,
            "ci_high": diff + 0.3,
            "ci_level": 0.98,
            "decision": decisions,
        }
    )


def _invariants() -> pd.DataFrame:
    """Two rows, both agreeing by their intervals: the predictive verdict decides the log p(x) row."""
    common = {
        "aligned_agreement": np.nan,
        "aligned_low": np.nan,
        "aligned_high": np.nan,
        "threshold": 0.9,
        "comparison": ">=",
        "n_cells": 200,
        "cells_setting": "max_lpd_cells",
        "invariant_in_theory": "yes",
    }
    return pd.DataFrame(
        [
            {"quantity": "decoded means", "agreement": 0.99, "low": 0.98, "high": 0.995} | common,
            {"quantity": "held-out log p(x)", "agreement": 0.99, "low": 0.98, "high": 0.995} | common,
        ]
    )


def _lines(judged: pd.DataFrame, predictive, ica: str | None = None) -> list[str]:
    """The headline's invariants sentences, then the predictive sentence and the ICA one (as the report orders them)."""
    sentence = predictive_sentence(predictive)
    return [*verdict_lines(judged, sentence, ica, 3), sentence, *([ica] if ica else [])]


def _headline(predictive) -> list[str]:
    return _lines(judge_invariants(_invariants(), {LPD_QUANTITY: predictive.as_row_judgement()}), predictive)


def test_an_unreliable_log_p_x_is_explained_in_one_sentence_only():
    reliability = pd.DataFrame(
        {"fit": ["seed 1"], "share_khat_above": [0.4], "mc_bias_bound": [0.001], "reliable": [False]}
    )
    verdict = predictive_verdict(_pairs([EQUIVALENT] * 3), reliability, 0.5, 25.0, n_lpd_samples=100)
    assert verdict.state == UNDETERMINED and verdict.reason.startswith("unreliable log p(x)")
    lines = _headline(verdict)
    # The log p(x) row is still listed as undetermined, but its reason and remedy appear once, in the
    # predictive sentence (the old headline repeated both in the "Undetermined" sentence).
    undetermined = next(line for line in lines if line.startswith("Undetermined on these cells:"))
    assert "held-out log p(x) (see the sentence on predictive equivalence)" in undetermined
    for text in (verdict.reason, verdict.remedy):
        assert sum(text in line for line in lines) == 1, (text, lines)
    assert sum(line.count("Pareto k-hat above 0.7") for line in lines) == 1


def test_other_undetermined_rows_keep_their_reason_in_the_undetermined_sentence():
    table = _invariants()
    table.loc[0, ["low", "high"]] = [0.85, 0.95]  # decoded means: the interval straddles 0.9
    verdict = predictive_verdict(_pairs([EQUIVALENT] * 3), None, 0.5, 25.0)
    judged = judge_invariants(table, {LPD_QUANTITY: verdict.as_row_judgement()})
    lines = _lines(judged, verdict)
    undetermined = next(line for line in lines if line.startswith("Undetermined on these cells:"))
    assert "decoded means (its interval 0.85 to 0.95 contains the threshold (>= 0.9); to decide:" in undetermined


def _components(verdicts: list[str], reasons: list[str]) -> pd.DataFrame:
    n = len(verdicts)
    return pd.DataFrame(
        {
            "component": [f"IC_{i}" for i in range(n)],
            "verdict": verdicts,
            "reason": reasons,
            "remedy": ["more cells"] * n,
            "estimated_on": "halves of the fit cells",
            "n_estimation_cells": 1000,
            "n_matching_cells": 300,
        }
    )


def test_ica_verbs_agree_with_the_number_of_components():
    few = f"{FEW_CELLS_REASON}: split-half match 0.50 < 0.95"
    several = _components([UNDETERMINED, UNDETERMINED, UNDETERMINED], [few, few, GAUSSIAN_REASON])
    row = ica_row_judgement(several)
    assert "IC_0, IC_1 do not reproduce even within one seed" in row.reason
    assert "IC_2 is too close to Gaussian" in row.reason
    assert "does not reproduce" not in row.reason
    sentence = ica_sentence(several, 0.95)
    assert "IC_0, IC_1 undetermined (do not reproduce even within one seed" in sentence

    one = _components([UNDETERMINED, UNDETERMINED, AGREE], [few, GAUSSIAN_REASON, GAUSSIAN_REASON])
    one.loc[2, "reason"] = ""
    row = ica_row_judgement(one)
    assert "IC_0 does not reproduce even within one seed" in row.reason
    assert "IC_1 is too close to Gaussian" in row.reason
    sentence = ica_sentence(one, 0.95)
    assert "IC_2 agrees across seeds" in sentence and "IC_0 undetermined (does not reproduce" in sentence

    differ = _components([DIFFER, AGREE, AGREE], ["", "", ""])
    assert ica_row_judgement(differ).reason.startswith("IC_0 differs between seeds (it reproduces")
    sentence = ica_sentence(differ, 0.95)
    assert "IC_1, IC_2 agree across seeds; IC_0 differs between seeds" in sentence
    both = _components([DIFFER, DIFFER, AGREE], ["", "", ""])
    assert ica_row_judgement(both).reason.startswith("IC_0, IC_1 differ between seeds (each reproduces")


def test_pair_counts_agree_with_their_verb():
    ok = pd.DataFrame({"fit": ["seed 0"], "share_khat_above": [0.0], "mc_bias_bound": [0.001], "reliable": [True]})
    one = predictive_verdict(_pairs([EQUIVALENT, NOT_EQUIVALENT, EQUIVALENT], [0.0, 2.0, 0.0]), ok, 0.5, 25.0, 0.02)
    assert "1 of 3 pairs differs by more than" in predictive_sentence(one)
    two = predictive_verdict(_pairs([NOT_EQUIVALENT, NOT_EQUIVALENT, EQUIVALENT], [2.0, 2.0, 0.0]), ok, 0.5, 25.0, 0.02)
    assert "2 of 3 pairs differ by more than" in predictive_sentence(two)
    undecided = predictive_verdict(_pairs([EQUIVALENT, UNDETERMINED, EQUIVALENT], [0.0, 0.4, 0.0]), ok, 0.5, 25.0, 0.02)
    assert undecided.reason.startswith("the interval of 1 of 3 pairs contains the margin")
    undecided = predictive_verdict(
        _pairs([UNDETERMINED, UNDETERMINED, EQUIVALENT], [0.4, 0.4, 0.0]), ok, 0.5, 25.0, 0.02
    )
    assert undecided.reason.startswith("the intervals of 2 of 3 pairs contain the margin")


def test_an_undetermined_ica_row_is_explained_in_the_ica_sentence_only():
    few = f"{FEW_CELLS_REASON}: split-half match 0.50 < 0.95"
    components = _components([UNDETERMINED, UNDETERMINED, AGREE], [few, GAUSSIAN_REASON, ""])
    row = ica_row_judgement(components)
    table = pd.concat(
        [_invariants(), _invariants().iloc[[0]].assign(quantity="ICA coordinates", threshold=0.95)],
        ignore_index=True,
    )
    verdict = predictive_verdict(_pairs([EQUIVALENT] * 3), None, 0.5, 25.0)
    judged = judge_invariants(table, {LPD_QUANTITY: verdict.as_row_judgement(), ICA_QUANTITY: row})
    ica = ica_sentence(components, 0.95)
    lines = _lines(judged, verdict, ica)
    undetermined = next(line for line in lines if line.startswith("Undetermined on these cells:"))
    assert "ICA coordinates (see the sentence on ICA components)" in undetermined
    # Each component's reason and the remedy appear once, in the ICA sentence (they used to appear in both).
    for text in ("does not reproduce even within one seed", "too close to Gaussian", "more cells"):
        assert sum(text in line for line in lines) == 1, (text, lines)
    # Without the ICA sentence, the undetermined sentence keeps the reason.
    alone = _lines(judged, verdict)
    assert sum("does not reproduce even within one seed" in line for line in alone) == 1


def _verdict_table(rows: list[tuple[str, str, str, float, float]]) -> pd.DataFrame:
    """(quantity, invariant_in_theory, verdict, agreement, aligned_agreement) -> the columns verdict_lines reads."""
    return pd.DataFrame(
        [
            {"quantity": q, "invariant_in_theory": t, "verdict": v, "agreement": a, "aligned_agreement": al}
            | {"threshold": 0.9, "comparison": ">=", "reason": "", "remedy": ""}
            for q, t, v, a, al in rows
        ]
    )


def test_differing_rows_are_split_by_whether_theory_says_they_are_invariant():
    from countvae.diagnostics.reporting.verdicts import ALIGNED

    table = _verdict_table(
        [
            ("decoded means", "yes", DIFFER, 0.5, np.nan),
            ("per-dimension coordinates", "no (changes with every rotation)", DIFFER, 0.2, 0.5),
            ("per-dimension loadings", "no (changes with every rotation)", DIFFER, 0.5, 0.6),
            ("per-dimension marker correlations", "no (changes with every rotation)", ALIGNED, 0.1, 0.95),
        ]
    )
    lines = verdict_lines(table, "Predictively equivalent.", None, 2)
    assert lines[0] == "Agree across both seeds: none."
    assert lines[1].startswith("Agree only after aligning the seeds by a rotation: per-dimension marker correlations.")
    assert lines[2].startswith("Differ between seeds although the model's symmetry cannot explain it: decoded means.")
    assert lines[3] == "Differ between seeds even after alignment: per-dimension coordinates, per-dimension loadings."
    # a gain of exactly 0.3 (0.2 -> 0.5) is named; 0.1 (0.5 -> 0.6) is not
    assert lines[4].startswith("Rotating the seeds onto each other raises the agreement of per-dimension coordinates ")
    assert "loadings" not in lines[4] and len(lines) == 5
    # alignment that lowers the agreement is no gain
    lowered = _verdict_table([("per-dimension coordinates", "no", DIFFER, 0.8, 0.4)])
    assert not any(line.startswith("Rotating") for line in verdict_lines(lowered, "", None, 2))


def test_components_that_only_differ_are_still_reported_as_one_subspace():
    sentence = ica_sentence(_components([DIFFER, AGREE, AGREE], ["", "", ""]), 0.95)
    assert sentence.endswith("Report the components that do not agree as one subspace, not as separate axes.")
    assert "subspace" not in ica_sentence(_components([AGREE, AGREE], ["", ""]), 0.95)


def test_the_numeric_sentences_state_the_tables_extremes():
    from countvae.diagnostics.reporting.headline import alignment_lines, marker_lines, truth_sentence

    truth = pd.DataFrame({"coordinates": ["raw"] * 3, "mcc": [0.5, 0.9, 0.7], "infom": [0.2, 0.4, 0.3]})
    assert "raw coordinates MCC 0.50 to 0.90, InfoM 0.20 to 0.40" in truth_sentence(truth)
    markers = pd.DataFrame(
        {"best_dim_agrees": [True, False, False], "r2_max": [0.9, 0.8, 0.5], "r2_min": [0.85, 0.7, 0.49]}
    )
    assert marker_lines(markers)[0].startswith("Markers: for 2 of 3 markers")
    assert "varies by at most 0.100 across seeds" in marker_lines(markers)[0]
    # on as few held-out cells as latent dimensions + 1 no R^2 can be computed: it printed "at most nan"
    unmeasured = markers.assign(r2_max=np.nan, r2_min=np.nan)
    line = marker_lines(unmeasured)[0]
    assert "nan" not in line and line.endswith(
        "cannot be computed on these cells (it needs more held-out cells than latent dimensions + 1)."
    )
    efficiency = pd.DataFrame(
        {"ica_efficiency": [0.2, 0.3, 1.0], "e_permutation": [0.4, 0.5, 0.6], "e_orthogonal": [0.1, 0.1, 0.3]}
    )
    lines = alignment_lines(pd.Series({"rotation": 0.1}), efficiency)
    assert "mean 0.50, range 0.20 to 1.00, over a gap of 0.333 of the latent diameter" in lines[1]
    # a ratio that can leave [0, 1] is not called a share (it printed 11.70 as a "share ... 1 = all")
    assert "share" not in lines[1] and "above 1 = better than the best rotation" in lines[1]


def test_the_predictive_sentence_gives_the_worst_pairs_interval():
    ok = pd.DataFrame({"fit": ["seed 0"], "share_khat_above": [0.0], "mc_bias_bound": [0.001], "reliable": [True]})
    verdict = predictive_verdict(_pairs([EQUIVALENT, EQUIVALENT], [0.05, -0.1]), ok, 0.5, 25.0, 0.02)
    assert "seed 1 vs seed 2, -0.100 nats per cell (98.0% simultaneous interval -0.400 to +0.200)" in (
        predictive_sentence(verdict)
    )


def _rotation_sentences(agreement: float, aligned: float) -> list[str]:
    """The "Rotating the seeds ..." sentences for one coordinate row that differs even after alignment."""
    table = _verdict_table(
        [("per-dimension coordinates", "no (changes with every rotation)", DIFFER, agreement, aligned)]
    )
    return [line for line in verdict_lines(table, "Predictively equivalent.", None, 3) if line.startswith("Rotating")]


def test_the_rotation_sentence_needs_a_gain_of_at_least_0_3():
    """A row that differs is said to gain from alignment only when aligning raises its agreement by 0.3 or more.

    Known answer: the cutoff documented in ``_rotation_gain`` is 0.3, so gains of 0.25 and 0.29 (0.5 -> 0.75, 0.79)
    give no sentence and 0.31 (0.5 -> 0.81) gives one. The 0.01 margins are far above the float error of the
    subtraction (~1e-16), so no tolerance is needed. With the exact gain of 0.3 named in the test above, this catches
    a cutoff moved anywhere outside (0.29, 0.30]; it cannot catch one moved inside that interval.
    """
    assert _rotation_sentences(0.5, 0.75) == []
    assert _rotation_sentences(0.5, 0.79) == []
    (sentence,) = _rotation_sentences(0.5, 0.81)
    assert "per-dimension coordinates from 0.50 to 0.81 (threshold 0.9)" in sentence


def test_most_or_part_of_the_difference_is_the_rotation_by_the_share_of_the_gap_to_full_agreement():
    """The rotation is "most" of a difference when aligning closes over half of the gap ``1 - agreement``, else "part".

    Known answer, from the printed numbers: 0.2 -> 0.59 closes 0.39 of a gap of 0.8 (48.75%, "part"); 0.2 -> 0.61
    closes 0.41 of 0.8 (51.25%, "most"); 0.2 -> 0.55 closes 0.35 of 0.8 (43.75%, "part"). Each share is at least
    0.0125 from one half, far above float error. Dividing by ``1 - aligned`` instead (the gap left after aligning)
    gives 95%, 105% and 78%, all "most", so that slip fails here, as does swapping the two words. Cannot catch a
    cutoff moved within (48.75%, 51.25%) or ``>`` turned into ``>=`` at exactly one half.
    """
    for aligned, share, relation in ((0.59, "part", "less"), (0.61, "most", "more"), (0.55, "part", "less")):
        (sentence,) = _rotation_sentences(0.2, aligned)
        assert f"per-dimension coordinates from 0.20 to {aligned:.2f} (threshold 0.9): {share} of their" in sentence
        assert f"rotation ({relation} than half of the gap to full agreement)" in sentence


def test_the_ica_efficiency_gap_is_the_mean_over_the_pairs_whose_efficiency_is_printed():
    """The gap printed with the ICA efficiency averages ``e_permutation - e_orthogonal`` over the same pairs as it.

    The table comes from :func:`ica_efficiency` on four hand-written pairs: two with a gap (0.1 and 0.2, efficiency
    0.8 and 0.6), one with no gap and one where the rotation scores worse than the permutation (gap -0.06); the last
    two have no efficiency (NaN). Known answer: mean 0.70, range 0.60 to 0.80, gap (0.1 + 0.2) / 2 = 0.150; averaging
    over every pair would print (0.1 + 0 + 0.2 - 0.06) / 4 = 0.060. Printed to 3 decimals, far from a rounding edge.
    Cannot catch an error in the efficiency itself (``test_alignment.py`` covers that).
    """
    from countvae.diagnostics.analyses.alignment import ica_efficiency
    from countvae.diagnostics.reporting.headline import alignment_lines

    scores = {  # pair -> (e_permutation, e_orthogonal, e_ica)
        ("a", "b"): (0.20, 0.10, 0.12),
        ("a", "c"): (0.05, 0.05, 0.06),
        ("a", "d"): (0.10, 0.16, 0.20),
        ("b", "c"): (0.30, 0.10, 0.18),
    }
    errors = pd.DataFrame(
        [
            {"fit_a": a, "fit_b": b, "map": m, "error_diameter": e}
            for (a, b), values in scores.items()
            for m, e in zip(("permutation", "orthogonal", "ica"), values, strict=True)
        ]
    )
    efficiency = ica_efficiency(errors)
    assert efficiency["ica_efficiency"].isna().tolist() == [False, True, True, False]
    line = alignment_lines(pd.Series({"orthogonal": 0.1}), efficiency)[1]
    assert (
        "mean 0.70, range 0.60 to 0.80, over a gap of 0.150 of the latent diameter (means over 2 of 4 seed pairs)."
        in line
    )
    assert line.endswith(
        "against 0.075 for the signed permutation and 0.105 for the rotation; lower than both maps in 0 of 2."
    )


def _efficiency_table(scores):
    """:func:`ica_efficiency` of hand-written pairs, ``(fit_a, fit_b) -> (e_permutation, e_orthogonal, e_ica)``."""
    from countvae.diagnostics.analyses.alignment import ica_efficiency

    errors = pd.DataFrame(
        [
            {"fit_a": a, "fit_b": b, "map": m, "error_diameter": e}
            for (a, b), values in scores.items()
            for m, e in zip(("permutation", "orthogonal", "ica"), values, strict=True)
        ]
    )
    return ica_efficiency(errors)


def test_the_ica_efficiency_sentence_says_which_pairs_have_none_and_how_ica_did_there():
    """One of three pairs has no efficiency: its rotation (0.199) is no closer than its permutation (0.198) on the
    scoring cells, while ICA (0.124) beats both, as in a real 3-seed run. Known answer: the mean and range over the
    other two pairs (2.00 and 1.33: mean 1.67, gap (0.02 + 0.03) / 2), said to be over 2 of 3 pairs, then why the
    third has none ('–' in the table) with its three errors and "lower than both maps in 1 of 1". Fails if the pair
    is dropped without a word ("mean over pairs")."""
    from countvae.diagnostics.reporting.headline import alignment_lines

    efficiency = _efficiency_table(
        {
            ("seed 0", "seed 1"): (0.18, 0.16, 0.14),
            ("seed 0", "seed 2"): (0.198, 0.199, 0.124),
            ("seed 1", "seed 2"): (0.17, 0.14, 0.13),
        }
    )
    line = alignment_lines(pd.Series({"orthogonal": 0.15}), efficiency)[1]
    assert (
        "mean 1.67, range 1.33 to 2.00, over a gap of 0.025 of the latent diameter (means over 2 of 3 seed pairs)."
        in line
    )
    assert line.endswith(
        " The other pair has none (– in the table): on its scoring cells the best rotation was no closer than the best "
        "signed permutation, so there is no positive permutation-to-rotation gap to measure ICA against. ICA's error "
        "there: 0.124 of the latent diameter, against 0.198 for the signed permutation and 0.199 for the rotation; "
        "lower than both maps in 1 of 1."
    )


def test_the_ica_efficiency_sentence_remains_when_no_pair_has_one():
    """No pair has an efficiency (every rotation no closer than its permutation). Known answer: a sentence saying
    so for the 3 pairs, with the mean errors over them (e_ICA (0.1 + 0.3 + 0.2) / 3 = 0.200, permutation
    (0.2 + 0.1 + 0.3) / 3 = 0.200, rotation (0.2 + 0.25 + 0.3) / 3 = 0.250) and ICA lower than both in 2 of 3.
    Fails if the sentence disappears, as it did."""
    from countvae.diagnostics.reporting.headline import EFFICIENCY_LEAD, alignment_lines

    efficiency = _efficiency_table(
        {("a", "b"): (0.2, 0.2, 0.1), ("a", "c"): (0.1, 0.25, 0.3), ("b", "c"): (0.3, 0.3, 0.2)}
    )
    assert efficiency["ica_efficiency"].isna().all()
    lines = alignment_lines(pd.Series({"orthogonal": 0.25}), efficiency)
    assert len(lines) == 2 and lines[1].startswith(f"{EFFICIENCY_LEAD}: none of the 3 seed pairs has one (– in the")
    assert lines[1].endswith(
        "ICA's error there (means over them): 0.200 of the latent diameter, against 0.200 for the signed permutation "
        "and 0.250 for the rotation; lower than both maps in 2 of 3."
    )


def test_the_ica_efficiency_sentence_speaks_of_one_pair_in_the_singular():
    """Two seeds make one pair. Known answers: when it has no efficiency (rotation 0.25 no closer than permutation
    0.2) the sentence says "the seed pair has none", not "none of the 1 seed pairs has one"; when it has one
    ((0.3 - 0.12) / (0.3 - 0.1) = 0.90), that value is printed, not a mean and a range of one number; with one scored
    pair of three, it says "1 of 3 seed pairs", not "means over 1 of 3"."""
    from countvae.diagnostics.reporting.headline import EFFICIENCY_LEAD, alignment_lines

    mean = pd.Series({"orthogonal": 0.2})
    none = alignment_lines(mean, _efficiency_table({("a", "b"): (0.2, 0.25, 0.1)}))[1]
    assert none.startswith(f"{EFFICIENCY_LEAD}: the seed pair has none (– in the table): on its scoring cells")
    one = alignment_lines(mean, _efficiency_table({("a", "b"): (0.3, 0.1, 0.12)}))[1]
    assert one == f"{EFFICIENCY_LEAD}: 0.90, over a gap of 0.200 of the latent diameter (the only seed pair)."
    scores = {("a", "b"): (0.3, 0.1, 0.12), ("a", "c"): (0.2, 0.25, 0.1), ("b", "c"): (0.2, 0.25, 0.3)}
    one_of_three = alignment_lines(mean, _efficiency_table(scores))[1]
    assert f"{EFFICIENCY_LEAD}: 0.90, over a gap of 0.200 of the latent diameter (1 of 3 seed pairs). The other 2" in (
        one_of_three
    )
