"""Step 4 of the report: the verdict in plain sentences, most important first (``DiagnosticReport.headline``).

The sentences only state what :mod:`.verdicts` decided and the numbers behind
it; they make no decision of their own.
"""

from __future__ import annotations

import pandas as pd

from countvae.diagnostics.reporting.verdicts import ROTATION, STABLE, UNSTABLE, PredictiveVerdict, quantities_by_verdict


def predictive_sentence(verdict: PredictiveVerdict) -> str:
    """Whether the seeds are predictively equivalent, with the pair that differs most."""
    if verdict.equivalent is None:
        return "Held-out log p(x) is not available for these fits, so predictive equivalence is untested."
    worst, z = verdict.worst, verdict.z_threshold
    cells = f" on {int(worst['n_cells'])} held-out cells"
    detail = (
        f"the largest difference is {worst['fit_a']} vs {worst['fit_b']}: "
        f"{worst['diff_per_cell']:+.3f} ± {worst['se_diff_per_cell']:.3f} nats per cell ({worst['z']:+.1f} SE)"
    )
    if verdict.equivalent:
        return f"Predictively equivalent: no pair of fits differs by {z:g} paired standard errors{cells}; {detail}."
    return (
        f"Not predictively equivalent: {verdict.n_different} of {verdict.n_pairs} pairs differ by more than {z:g} "
        f"paired standard errors{cells}, so the seeds reached different optima (or did not converge); {detail}."
    )


def ica_sentence(table: pd.DataFrame, threshold: float) -> str | None:
    """One sentence for the report's verdict: which components reproduce, which do not, and why."""
    if not len(table):
        return None
    good = table.loc[table["reproducible"], "component"].tolist()
    bad = table.loc[~table["reproducible"], "component"].tolist()
    lead = (
        f"ICA components (ICAs of different seeds estimated on disjoint halves of the held-out cells; reproducible "
        f"at a mean best-match |corr| >= {threshold:g}):"
    )
    if not bad:
        return (
            f"{lead} all {len(table)} reproduce across seeds, so the ICA axes are a reproducible choice of coordinates."
        )
    failing = table.loc[~table["reproducible"]]
    gaussian = int(failing["gaussian"].sum())
    why = f", {gaussian} of them too close to Gaussian to be identified" if gaussian else ""
    kept = f" ({', '.join(good)})" if good else ""
    within = int((failing["same_fit_match"] >= threshold).sum())
    causes = []
    if within:
        causes.append(
            f"{within} reproduce between the two halves of the cells within one seed, so the seeds' "
            "solutions differ along them"
        )
    if len(failing) - within:
        causes.append(
            f"{len(failing) - within} do not reproduce even within one seed (too few cells, or too close to "
            "Gaussian, to fix those axes)"
        )
    return (
        f"{lead} {len(good)} of {len(table)} reproduce across seeds{kept}; {', '.join(bad)} do not{why}. "
        f"Of the components that do not, {'; '.join(causes)}. Report them as one subspace, not as separate axes."
    )


def _listing(names: list[str]) -> str:
    return ", ".join(names) if names else "none"


def headline(
    invariants: pd.DataFrame,
    predictive: str,
    alignment_mean: pd.Series,
    efficiency: pd.DataFrame | None,
    markers: pd.DataFrame,
    n_fits: int,
    ica: str | None = None,
) -> list[str]:
    """The verdict in sentences.

    Parameters
    ----------
    invariants
        The judged invariants table (:func:`.verdicts.judge_invariants`).
    predictive
        :func:`predictive_sentence`.
    alignment_mean
        Mean seed-pair alignment error by map class.
    efficiency
        The ICA efficiency table, or ``None``.
    markers
        The marker summary table.
    n_fits
        Number of fits.
    ica
        :func:`ica_sentence`, or ``None``.

    """
    by = quantities_by_verdict(invariants)
    theory = dict(zip(invariants["quantity"], invariants["invariant_in_theory"], strict=True))
    seeds = "both seeds" if n_fits == 2 else f"all {n_fits} seeds"
    lines = [f"Identified here (agree across {seeds}): {_listing(by[STABLE])}."]
    if by[ROTATION]:
        lines.append(
            f"Determined only up to a rotation of the latent space (differ between seeds, agree after aligning "
            f"them): {_listing(by[ROTATION])}. Do not interpret these one dimension at a time."
        )
    unstable_invariant = [q for q in by[UNSTABLE] if theory.get(q) == "yes"]
    unstable_other = [q for q in by[UNSTABLE] if theory.get(q) != "yes"]
    if unstable_invariant:
        lines.append(
            f"Not reproducible although the model's symmetry cannot explain it: {_listing(unstable_invariant)}. "
            "The seeds reached different solutions (or did not converge); report their spread."
        )
    if unstable_other:
        lines.append(f"Not reproducible even after alignment: {_listing(unstable_other)}.")
        rows = invariants.set_index("quantity").loc[unstable_other]
        gain = rows["aligned_agreement"] - rows["agreement"]
        mostly = rows[gain >= 0.3]
        if len(mostly):
            changes = ", ".join(
                f"{q} from {r.agreement:.2f} to {r.aligned_agreement:.2f}" for q, r in mostly.iterrows()
            )
            lines.append(
                f"Rotating the seeds onto each other raises the agreement of {changes} (threshold "
                f"{mostly['threshold'].iloc[0]:g}): most of their seed-to-seed difference is the arbitrary "
                "rotation, the remainder a genuine difference between the solutions."
            )
    lines.append(predictive)
    parts = [f"{m} {alignment_mean[m]:.3f}" for m in alignment_mean.index]
    lines.append(
        "Mean seed-pair alignment error (fraction of the latent diameter; lower is better): " + ", ".join(parts) + "."
    )
    if efficiency is not None and efficiency["ica_efficiency"].notna().any():
        eff = efficiency["ica_efficiency"]
        lines.append(
            f"ICA efficiency (share of the permutation-to-rotation gap that ICA closes; 1 = all): "
            f"mean {eff.mean():.2f}, range {eff.min():.2f} to {eff.max():.2f}."
        )
    if ica:
        lines.append(ica)
    if len(markers):
        moved = int((~markers["best_dim_agrees"]).sum())
        spread = float((markers["r2_max"] - markers["r2_min"]).max())
        lines.append(
            f"Markers: for {moved} of {len(markers)} markers the best-correlated latent dimension (or its sign) "
            f"changes between seeds, while the rotation-invariant R^2 on all dimensions varies by at most "
            f"{spread:.3f} across seeds."
        )
    return lines
