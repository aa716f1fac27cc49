"""Step 4 of the report: the sentences of ``DiagnosticReport.headline``, which each section places by its rank.

The sentences only state what :mod:`.verdicts` decided and the numbers behind it; they decide nothing themselves. Each
sentence that names quantities or components begins with a fixed label (:data:`LEADS`), so that a test can check every
sentence against the tables (``tests/diagnostics/reporting/test_headline_consistency.py``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from countvae._formatting import MISSING
from countvae.diagnostics.analyses.predictive import EQUIVALENT, NOT_EQUIVALENT
from countvae.diagnostics.reporting.verdicts import (
    AGREE,
    ALIGNED,
    DIFFER,
    ICA_QUANTITY,
    LPD_QUANTITY,
    NOT_TESTED,
    UNDETERMINED,
    PredictiveVerdict,
    quantities_by_verdict,
    reason_in_number,
    undetermined_by_reason,
)

#: The first words of each sentence that lists quantities of one verdict.
LEADS = {
    AGREE: "Agree across {seeds}:",
    ALIGNED: "Agree only after aligning the seeds by a rotation:",
    "differ_invariant": "Differ between seeds although the model's symmetry cannot explain it:",
    "differ_other": "Differ between seeds even after alignment:",
    UNDETERMINED: "Undetermined on these cells:",
}
#: The first words of the predictive sentence, by state.
PREDICTIVE_LEADS = {
    EQUIVALENT: "Predictively equivalent:",
    NOT_EQUIVALENT: "Not predictively equivalent:",
    UNDETERMINED: "Predictive equivalence undetermined:",
    NOT_TESTED: "Predictive equivalence not tested:",
}
#: The first words of the ICA components sentence and of the ground-truth sentence.
ICA_LEAD = "ICA components"
TRUTH_LEAD = "Against the simulation's true sources"


def _listing(names: list[str]) -> str:
    return ", ".join(names) if names else "none"


def predictive_sentence(verdict: PredictiveVerdict) -> str:
    """Whether the seeds are predictively equivalent, against which margin, with the pair that differs most."""
    lead = PREDICTIVE_LEADS[verdict.state]
    if verdict.state == NOT_TESTED:
        return f"{lead} {verdict.reason}."
    worst = verdict.worst
    detail = (
        f"the largest difference is {worst['fit_a']} vs {worst['fit_b']}, {worst['diff_per_cell']:+.3f} nats per cell "
        f"({100 * worst['ci_level']:.1f}% simultaneous interval {worst['ci_low']:+.3f} to {worst['ci_high']:+.3f}) "
        f"on {int(worst['n_cells'])} held-out cells"
    )
    if np.isfinite(verdict.margin):
        margin = (
            f"margin +-{verdict.margin:.3g} nats per cell ({100 * verdict.margin_fraction:g}% of the "
            f"{verdict.gain:.3g} nats per cell the latent variables add over a no-latent model)"
        )
    else:
        margin = "no margin"
    counts = verdict.counts
    if verdict.state == EQUIVALENT:
        return f"{lead} every pair of fits is within the {margin}; {detail}."
    if verdict.state == NOT_EQUIVALENT:
        differ = "differs" if counts[NOT_EQUIVALENT] == 1 else "differ"
        return (
            f"{lead} {counts[NOT_EQUIVALENT]} of {len(verdict.pairs)} pairs {differ} by more than the {margin}, so "
            f"the seeds reached different optima (or did not converge); {detail}."
        )
    return f"{lead} {verdict.reason} ({margin}); {detail}. To decide: {verdict.remedy}."


def ica_sentence(components: pd.DataFrame, threshold: float) -> str | None:
    """Which ICA components agree, differ and are undetermined across seeds, why, and what would decide them.

    The one place the headline gives the ICA row's reasons (``None`` without ICA).
    """
    if not len(components):
        return None
    first = components.iloc[0]
    lead = (
        f"{ICA_LEAD} (each seed's ICA estimated on {first['estimated_on']}, {int(first['n_estimation_cells']):,} "
        f"cells per half, matched on {int(first['n_matching_cells']):,} held-out cells; agree when the worst "
        f"best-match |corr| is at least {threshold:g} with confidence):"
    )
    parts = []
    for verdict, (one, several) in (
        (AGREE, ("agrees across seeds", "agree across seeds")),
        (DIFFER, ("differs between seeds", "differ between seeds")),
    ):
        names = components.loc[components["verdict"] == verdict, "component"].tolist()
        if names:
            parts.append(f"{_listing(names)} {one if len(names) == 1 else several}")
    reasons, remedies = undetermined_by_reason(components)
    for why, names in reasons.items():
        decide = f"; to decide: {remedies[why]}" if remedies[why] else ""
        parts.append(f"{_listing(names)} undetermined ({reason_in_number(why, len(names))}{decide})")
    tail = ""
    if reasons or (components["verdict"] == DIFFER).any():
        tail = " Report the components that do not agree as one subspace, not as separate axes."
    return f"{lead} {'; '.join(parts)}.{tail}"


def truth_sentence(truth: pd.DataFrame) -> str | None:
    """MCC and InfoM of raw and ICA coordinates against the true sources, over seeds (``None`` if not simulated)."""
    if truth is None or not len(truth):
        return None
    parts = [
        f"{coordinates} coordinates MCC {sub['mcc'].min():.2f} to {sub['mcc'].max():.2f}, "
        f"InfoM {sub['infom'].min():.2f} to {sub['infom'].max():.2f}"
        for coordinates, sub in truth.groupby("coordinates", sort=False)
    ]
    return f"{TRUTH_LEAD} (held-out cells, over seeds): {'; '.join(parts)}."


def _why_undetermined(quantity: str, rows: pd.DataFrame, predictive: str, ica: str | None) -> str:
    """Why a row is undetermined and what would decide it (said once: log p(x) and ICA point to their own sentence)."""
    if quantity == LPD_QUANTITY and predictive.startswith(PREDICTIVE_LEADS[UNDETERMINED]):
        return f"{quantity} (see the sentence on predictive equivalence)"
    if quantity == ICA_QUANTITY and ica:
        return f"{quantity} (see the sentence on ICA components)"
    return f"{quantity} ({rows.loc[quantity, 'reason']}; to decide: {rows.loc[quantity, 'remedy']})"


def verdict_lines(invariants: pd.DataFrame, predictive: str, ica: str | None, n_fits: int) -> list[str]:
    """The sentences of the invariants table: which rows agree, agree after alignment, differ, are undetermined."""
    by = quantities_by_verdict(invariants)
    rows = invariants.set_index("quantity")
    theory = rows["invariant_in_theory"].to_dict()
    seeds = "both seeds" if n_fits == 2 else f"all {n_fits} seeds"
    lines = [f"{LEADS[AGREE].format(seeds=seeds)} {_listing(by[AGREE])}."]
    if by[ALIGNED]:
        lines.append(
            f"{LEADS[ALIGNED]} {_listing(by[ALIGNED])}. They differ between seeds as they stand: do not "
            "interpret them one dimension at a time."
        )
    differ_invariant = [q for q in by[DIFFER] if theory.get(q) == "yes"]
    differ_other = [q for q in by[DIFFER] if theory.get(q) != "yes"]
    if differ_invariant:
        lines.append(
            f"{LEADS['differ_invariant']} {_listing(differ_invariant)}. The seeds reached different solutions (or "
            "did not converge); report their spread."
        )
    if differ_other:
        lines.append(f"{LEADS['differ_other']} {_listing(differ_other)}.")
        lines += _rotation_gain(rows.loc[differ_other])
    if by[UNDETERMINED]:
        details = "; ".join(_why_undetermined(q, rows, predictive, ica) for q in by[UNDETERMINED])
        lines.append(f"{LEADS[UNDETERMINED]} {_listing(by[UNDETERMINED])}. Why, and what would decide: {details}.")
    return lines


def _rotation_gain(coordinate: pd.DataFrame) -> list[str]:
    """The sentences on rows that differ but gain much by aligning the seeds (none when no row gains 0.3).

    "Most" of the difference is the rotation when aligning closes more than half of the gap to full agreement,
    ``(aligned - agreement) / (1 - agreement) > 0.5``; otherwise the rotation is "part" of it.
    """
    coordinate = coordinate[np.isfinite(coordinate["aligned_agreement"].astype(float))]
    gain = coordinate["aligned_agreement"] - coordinate["agreement"]
    gained = coordinate[gain >= 0.3]
    closed = (gained["aligned_agreement"] - gained["agreement"]) / (1.0 - gained["agreement"])
    lines = []
    for rows, share in ((gained[closed > 0.5], "most"), (gained[closed <= 0.5], "part")):
        if len(rows):
            changes = ", ".join(f"{q} from {r.agreement:.2f} to {r.aligned_agreement:.2f}" for q, r in rows.iterrows())
            lines.append(
                f"Rotating the seeds onto each other raises the agreement of {changes} (threshold "
                f"{rows['threshold'].iloc[0]:g}): {share} of their seed-to-seed difference is the arbitrary "
                f"rotation ({'more' if share == 'most' else 'less'} than half of the gap to full agreement), the "
                "remainder a genuine difference between the solutions."
            )
    return lines


#: What the ICA efficiency is and how to read it, the start of its headline sentence.
EFFICIENCY_LEAD = (
    "ICA efficiency ((e_permutation - e_ICA) / (e_permutation - e_orthogonal), fitted on held-out cells; 1 = ICA "
    "closes the permutation-to-rotation gap, above 1 = better than the best rotation, below 0 = worse than the best "
    "signed permutation)"
)


def alignment_lines(alignment_mean: pd.Series, efficiency: pd.DataFrame | None) -> list[str]:
    """The mean alignment error per map class and, with ICA, the ICA efficiency and the pairs that have none."""
    parts = [f"{m} {alignment_mean[m]:.3f}" for m in alignment_mean.index]
    lines = [
        "Mean seed-pair alignment error (fraction of the latent diameter; lower is better): " + ", ".join(parts) + "."
    ]
    if efficiency is None or not len(efficiency):
        return lines
    eff = efficiency["ica_efficiency"]
    scored, missing = efficiency[eff.notna()], efficiency[eff.isna()]
    if not len(scored):
        none = "the seed pair has none" if len(efficiency) == 1 else f"none of the {len(efficiency)} seed pairs has one"
        lines.append(f"{EFFICIENCY_LEAD}: {none}{_no_gap(missing)}")
        return lines
    gap = scored["e_permutation"] - scored["e_orthogonal"]
    value = scored["ica_efficiency"]
    if len(scored) == 1:  # one pair's value, not a mean and a range of one number
        over = "the only seed pair" if not len(missing) else f"1 of {len(efficiency)} seed pairs"
        spread = f"{value.iloc[0]:.2f}"
    else:
        over = "mean over pairs" if not len(missing) else f"means over {len(scored)} of {len(efficiency)} seed pairs"
        spread = f"mean {value.mean():.2f}, range {value.min():.2f} to {value.max():.2f}"
    # A ratio, not a share: above 1 ICA beats the best rotation, below 0 it is worse than the best signed
    # permutation, and over a gap within the maps' noise it is large either way, so the gap is printed with it.
    line = f"{EFFICIENCY_LEAD}: {spread}, over a gap of {gap.mean():.3f} of the latent diameter ({over})."
    if len(missing):
        others = "pair has" if len(missing) == 1 else f"{len(missing)} pairs have"
        line += f" The other {others} none{_no_gap(missing)}"
    lines.append(line)
    return lines


def _no_gap(missing: pd.DataFrame) -> str:
    """Why the pairs in ``missing`` have no ICA efficiency, and how ICA did on them (one clause and a sentence)."""
    m = len(missing)
    better = (missing["e_ica"] < missing["e_permutation"]) & (missing["e_ica"] < missing["e_orthogonal"])
    return (
        f" ({MISSING} in the table): on {'its' if m == 1 else 'their'} scoring cells the best rotation was no closer "
        "than the best signed permutation, so there is no positive permutation-to-rotation gap to measure ICA against. "
        f"ICA's error there{'' if m == 1 else ' (means over them)'}: {missing['e_ica'].mean():.3f} of the latent "
        f"diameter, against {missing['e_permutation'].mean():.3f} for the signed permutation and "
        f"{missing['e_orthogonal'].mean():.3f} for the rotation; lower than both maps in {int(better.sum())} of {m}."
    )


def marker_lines(markers: pd.DataFrame) -> list[str]:
    """The marker pitfall in one sentence (none without markers)."""
    if not len(markers):
        return []
    moved = int((~markers["best_dim_agrees"]).sum())
    spreads = (markers["r2_max"] - markers["r2_min"]).astype(float)
    lead = (
        f"Markers: for {moved} of {len(markers)} markers the best-correlated latent dimension (or its sign) "
        "changes between seeds"
    )
    if not np.isfinite(spreads).any():
        return [
            f"{lead}; the rotation-invariant R^2 on all dimensions cannot be computed on these cells (it needs more "
            "held-out cells than latent dimensions + 1)."
        ]
    return [
        f"{lead}, while the rotation-invariant R^2 on all dimensions varies by at most {np.nanmax(spreads):.3f} "
        "across seeds."
    ]
