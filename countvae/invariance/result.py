"""The result of :func:`countvae.invariance.verify`: every measurement, its threshold and its verdict.

The verdict (``InvarianceReport.status``) is "verified numerically", "not verified" or "failed".

:class:`InvarianceReport` shares its verbs with :class:`countvae.diagnostics.DiagnosticReport`: ``summary()``,
``to_frame()``, ``tables``, ``to_dict()``, ``to_markdown()``, ``to_html()`` and ``save(dir_path)``, which writes
``report.json``, ``report.md`` and ``report.html`` into a new folder atomically (:mod:`countvae._report_files`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from countvae import plotting
from countvae._formatting import format_value, json_ready, markdown_table
from countvae._report_files import check_report_folder, html_page, template_environment, write_report_folder

#: Title of the report (Markdown and HTML).
TITLE = "Rotation invariance check"

#: What the per-map table means (Markdown and HTML).
INTRODUCTION = (
    "Each latent map `A` gives a reparameterized model with `z' = A z`, the decoder's weight on `z` "
    "multiplied by `A^-1` and the guide pushed forward. `p(x)` is expected to be unchanged exactly "
    "when `A` preserves the prior (any orthogonal map for N(0, I); signed permutations for a "
    "Laplace prior; sign flips for a diagonal prior with distinct scales). With a prior on the "
    "loadings `W` the model's density is `log p(x_heldout, W)` at the posterior mean of `W`, and the "
    "map must preserve that prior too (signed permutations for the horseshoe, sign flips for gene programs)."
)

#: What the measurements show and what they do not (Markdown and HTML).
CONCLUSIONS = (
    "Maps that preserve the prior leave the held-out log predictive density, decoded expression, "
    "latent distances and neighbour graphs unchanged, so predictive fit cannot tell such models apart.",
    "Latent coordinates, per-dimension loadings and per-dimension gene correlations change under "
    "the same maps: reading meaning into a single latent coordinate is a choice, not a finding.",
    "The controls change `p(x)` by more than the estimators' error although the decoder is compensated: "
    "the prior, not the decoder, fixes the symmetry group.",
    "The common-random-number and pointwise checks follow from the code's own algebra and catch a wrong "
    "rewrite; the evidence that `p(x)` is unchanged comes from estimates that share no random numbers, from a "
    "proposal built from the transformed model alone, and (linear Poisson or NB models with a normal or diagonal "
    "prior, up to 3 dimensions) from quadrature on grids along each model's own axes.",
    "A mean-field guide is not closed under rotations, so the ELBO (unlike `p(x)`) can prefer "
    "some coordinates: the 'near' in near-identifiability.",
)

#: Columns of :meth:`InvarianceReport.to_frame`.
CHECK_COLUMNS = ["variant", "transform", "kind", "p_x_expected", "check", "value", "threshold", "expect", "ok"]

#: What each check measures, in the words used by the summaries.
CHECK_DESCRIPTIONS: dict[str, str] = {
    "crn_max_abs_diff": "max over cells of |log p(x) original - transformed|, guide proposal, same base noise (nats)",
    "indep_unreliable_fraction": "share of cells where either independent estimate is unreliable (k-hat, ESS)",
    "indep_mean_diff": "mean over cells of log p(x) transformed - original, independent estimates (nats)",
    "indep_z_mean": "that mean difference / its reported standard error (independent estimates)",
    "indep_outside_4se_fraction": "share of cells whose two independent estimates differ by > 4 reported SE",
    "own_unreliable_fraction": "share of cells where the original's or the own-proposal estimate is unreliable",
    "own_mean_diff": "mean over cells of log p(x) transformed (proposal from its own log joint) - original (nats)",
    "own_z_mean": "that mean difference / its reported standard error",
    "own_outside_4se_fraction": "share of cells where the own-proposal estimate differs from the original's by > 4 SE",
    "control_unreliable_fraction": "share of cells where either estimate of a control is unreliable",
    "control_mean_diff": "mean over cells of log p(x) transformed - original for a control (nats)",
    "control_z_mean": "that mean change / its reported standard error",
    "control_z": "(sum over cells of (change / its SE)^2 - n) / sqrt(2n): ~0 if unchanged; must exceed the threshold",
    "control_outside_4se_fraction": "share of cells whose log p(x) changed by > 4 reported SE under a control",
    "pointwise_loglik_max_abs_diff": "max |log p(x | z) - log p'(x | A z)| at sampled z (nats)",
    "prior_max_abs_diff": "max |log p(z) - log p(A z)| at sampled z (nats)",
    "quadrature_max_abs_diff": "max over cells of |exact log p(x) original - transformed| (axis-aligned grids, nats)",
    "quadrature_mean_diff": "mean over cells of exact log p(x) transformed - original (axis-aligned grids, nats)",
    "quadrature_transformed_change": "transformed model's quadrature: largest change at its last node doubling (nats)",
    "quadrature_transformed_nodes": "transformed model's quadrature: most nodes per axis used",
    "latent_map_max_abs_error": "max |Z' - Z A^T| of posterior means",
    "normalized_expression_max_rel_diff": "max relative change of decoded expected counts",
    "pairwise_distance_max_rel_diff": "max change of latent pairwise distances / largest distance",
    "knn_graph_changed_fraction": "1 - mean Jaccard overlap of each cell's latent k-NN set",
    "loading_gram_max_rel_diff": "max change of W W^T / max |W W^T| (linear decoder)",
    "coordinates_rel_change": "||Z' - Z|| / ||Z|| (latent coordinates)",
    "loadings_rel_change": "||W' - W|| / ||W|| (per-dimension loadings or mean decoder Jacobian)",
    "gene_correlation_max_abs_change": "max change of a latent dimension's correlation with a gene",
    "elbo_pushforward_max_abs_diff": "max |ELBO with the pushed-forward full-covariance guide - original| (same noise)",
    "elbo_original_mean": "mean ELBO per cell of the original model (its mean-field guide)",
    "elbo_projected_mean": "mean ELBO per cell of the transformed model with the projected mean-field guide",
    "elbo_projected_mean_diff": "mean ELBO change with the mean-field projection of the pushed-forward guide",
    "elbo_projected_z": "that change / its Monte Carlo standard error",
    "elbo_refit_original_mean": "mean ELBO of each cell's best mean-field guide, original coordinates",
    "elbo_refit_transformed_mean": "mean ELBO of each cell's best mean-field guide, transformed coordinates",
    "elbo_refit_mean_diff": "transformed - original best mean-field ELBO (negative: the fit prefers its own axes)",
    "elbo_refit_z": "that difference / its Monte Carlo standard error",
    "loadings_log_prior_abs_diff": "|log p(W A^-1) - log p(W)| under the prior on the loadings (nats)",
    "joint_abs_change": "|change of log p(x_heldout, W)| with common noise: held-out sum plus log p(W) (nats)",
    "joint_change_over_mc_error": "change of log p(x_heldout, W) at two seeds: their mean / half their difference",
    "unreliable_fraction": "share of cells whose estimate is unreliable (k-hat > 0.7 or ESS below the minimum)",
    "ess_median": "median effective sample size of the estimator",
    "khat_max": "largest Pareto k-hat of the estimator's importance weights",
    "estimator_minus_quadrature_mean": "mean of estimator - exact log p(x) (nats)",
    "estimator_mean_abs_error": "mean |estimator - exact log p(x)| (nats per cell)",
    "estimator_outside_3se_fraction": "share of cells with |estimator - exact| > 3 reported standard errors",
    "quadrature_change": "largest change of the axis-aligned quadrature at its last node doubling (nats)",
    "quadrature_nodes": "most nodes per axis the axis-aligned quadrature used",
}

#: Checks of the evidence itself: when one fails, the result is "not verified" (the numbers cannot be used),
#: with the reason and what to do about it.
EVIDENCE_CHECKS: dict[str, str] = {
    "unreliable_fraction": "the log p(x) estimator is unreliable (k-hat > 0.7 or low ESS) on {value} of the cells "
    "(at most {threshold} allowed); raise n_samples or check the model",
    "indep_unreliable_fraction": "the independent estimates are unreliable on {value} of the cells "
    "(at most {threshold} allowed); raise n_samples",
    "own_unreliable_fraction": "the estimates from the transformed model's own proposal are unreliable on {value} of "
    "the cells (at most {threshold} allowed); raise n_samples",
    "control_unreliable_fraction": "the control's estimates are unreliable on {value} of the cells "
    "(at most {threshold} allowed); raise n_samples",
    "estimator_mean_abs_error": "the log p(x) estimator is off exact quadrature by {value} nats per cell "
    "(at most {threshold} allowed)",
    "estimator_outside_3se_fraction": "{value} of the cells lie outside 3 reported standard errors of exact "
    "quadrature (at most {threshold} allowed): the standard errors are too small",
    "quadrature_change": "the axis-aligned quadrature did not converge: it changed by {value} nats at its last "
    "node doubling (tolerance {threshold}); raise quadrature_max_nodes",
    "quadrature_transformed_change": "the transformed model's axis-aligned quadrature did not converge: it changed "
    "by {value} nats at its last node doubling (tolerance {threshold}); raise quadrature_max_nodes",
}

#: Checks that a control's change of ``log p(x)`` is seen: when one fails, the control is inconclusive, not a
#: disagreement (the theory says the control may change ``p(x)``, not by how much), so the result is "not verified"
#: with this reason. The change shrinks as the posterior widens towards the prior (a briefly trained or overdispersed
#: model), and a Laplace prior under a rotation differs from its own group only beyond the second moments.
INCONCLUSIVE_CHECKS: dict[str, str] = {
    "control_z": "inconclusive: the control changed log p(x) by too little for the estimates to resolve "
    "(control_z = {value}, detected above {threshold}), which does not contradict the theory: the change shrinks as "
    "the posterior widens (a briefly trained or overdispersed model); train the model longer, use more draws (a "
    "larger n_samples=...), or leave the control out: prior_controls=False drops the prior controls and "
    "controls=False the map controls",
}


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.3g}%"


@dataclass
class InvarianceReport:
    """Measurements of whether ``p(x)`` and other outputs are unchanged by latent maps.

    Attributes
    ----------
    checks
        One row per measurement (see :meth:`to_frame`).
    transforms
        The maps applied, by name (float64 L x L arrays, ``z' = A z``).
    variants
        Each model evaluated (values: its prior and symmetry group): ``"fitted"`` is the model passed in (converted to
        ``dtype``); the prior controls are the same networks with another prior.
    per_cell
        Per-cell numbers by ``"variant / transform"``: ``lpd`` and ``lpd_crn`` (the original and the transformed model
        with the guide proposal and the same base noise: the common-random-number pair), ``estimate`` and ``mc_se`` (the
        package's estimator on the original), ``estimate_indep`` and ``mc_se_indep`` (on the transformed model,
        independent noise), ``estimate_own`` and ``mc_se_own`` (the transformed model's own proposal; fitted model,
        invariant maps), and ``quadrature`` / ``quadrature_transformed`` (axis-aligned grids) where quadrature applies.
    outputs
        Output-by-map table of changes for the fitted model, with the maps under which each output is invariant
        (:func:`countvae.invariance.verification.outputs_table`).
    latent
        Posterior means of the evaluated cells under the fitted model, (cells, L).
    settings
        Arguments of the run and a description of the model.

    """

    checks: pd.DataFrame
    transforms: dict[str, np.ndarray]
    variants: dict[str, dict[str, str]]
    per_cell: dict[str, pd.DataFrame] = field(default_factory=dict)
    outputs: pd.DataFrame = field(default_factory=pd.DataFrame)
    latent: np.ndarray | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    # ----- verdicts ----------------------------------------------------------------------------
    @property
    def status(self) -> str:
        """``"verified numerically"``, ``"not verified"`` or ``"failed"``.

        "not verified": a check of the evidence failed (``EVIDENCE_CHECKS``: the estimator is unreliable or disagrees
        with quadrature, or the quadrature did not converge; :meth:`reasons` says which), or nothing was judged; the
        other checks' numbers cannot then be used either way. "failed": the evidence is sound and a check disagrees
        with the theory. Otherwise "not verified" too when a control was not detected (``INCONCLUSIVE_CHECKS``): the
        other checks agree, but this run does not show that they would see that control's change.
        """
        if self.checks["ok"].dropna().empty or len(self._evidence_failures()):
            return "not verified"
        if len(self.disagreements):
            return "failed"
        return "not verified" if len(self.failures) else "verified numerically"

    @property
    def passed(self) -> bool:
        """Whether the result is "verified numerically" (every judged check agrees and the evidence is sound)."""
        return self.status == "verified numerically"

    @property
    def failures(self) -> pd.DataFrame:
        """The checks whose value disagrees with its expectation (of the theory, the evidence or a control)."""
        failed = self.checks["ok"].map(lambda v: v is False or v is np.False_)
        return self.checks[failed.astype(bool)].reset_index(drop=True)

    @property
    def disagreements(self) -> pd.DataFrame:
        """The failed checks that disagree with the theory (:attr:`failures` less the evidence's and the controls')."""
        failed = self.failures
        return failed[~failed["check"].isin([*EVIDENCE_CHECKS, *INCONCLUSIVE_CHECKS])].reset_index(drop=True)

    def _evidence_failures(self) -> pd.DataFrame:
        failed = self.failures
        return failed[failed["check"].isin(list(EVIDENCE_CHECKS))].reset_index(drop=True)

    def _reasons_heading(self) -> str:
        """The heading of :meth:`reasons`: a failed check disagrees, unreliable evidence leaves the question open."""
        return "Why this failed" if self.status == "failed" else "Why this is not verified"

    def reasons(self) -> list[str]:
        """Why the result is not "verified numerically", one line per failed check (evidence first, controls last).

        A failed result lists its disagreements only; its table still marks an undetected control "inconclusive".
        """
        if self.checks["ok"].dropna().empty:
            return ["no check with a verdict was made"]
        lines = []
        for _, row in self._evidence_failures().iterrows():
            shown = _percent if row["check"].endswith("_fraction") else format_value
            text = EVIDENCE_CHECKS[row["check"]].format(value=shown(row["value"]), threshold=shown(row["threshold"]))
            lines.append(f"{row['variant']} / {row['transform']}: {text}")
        for _, row in self.disagreements.iterrows():
            # "equal" judges the absolute value, so the expectation names it: "-5.2 (expected <= 3)" read as agreeing
            judged = f"|{row['check']}|" if row["expect"] == "equal" else row["check"]
            relation = {"equal": "<=", "differs": ">", "at_least": ">="}.get(row["expect"], "?")
            lines.append(
                f"{row['variant']} / {row['transform']}: {row['check']} = {format_value(row['value'])} "
                f"(expected {judged} {relation} {format_value(row['threshold'])})"
            )
        if self.status == "failed":  # the disagreements say why; an inconclusive control is no disagreement
            return lines
        for _, row in self.failures[self.failures["check"].isin(list(INCONCLUSIVE_CHECKS))].iterrows():
            text = INCONCLUSIVE_CHECKS[row["check"]].format(
                value=format_value(row["value"]), threshold=format_value(row["threshold"])
            )
            lines.append(f"{row['variant']} / {row['transform']}: {text}")
        return lines

    def to_frame(self) -> pd.DataFrame:
        """Every measurement as a long table.

        Columns: ``variant``, ``transform``, ``kind`` (of the map), ``p_x_expected`` (``"invariant"`` or ``"changes"``,
        from the prior's symmetry group), ``check``, ``value``, ``threshold``, ``expect`` (see
        ``Measurement.expect`` in :mod:`countvae.invariance.checks`) and ``ok``.
        """
        return self.checks.copy()

    @property
    def tables(self) -> dict[str, pd.DataFrame]:
        """Every table of the report, by name (``verdicts``, ``checks``, ``outputs``, ``estimator_accuracy``).

        ``estimator_accuracy`` holds the per-model rows (transform ``"(none)"``): the estimator's reliability, its
        agreement with quadrature, and the quadrature's convergence.
        """
        return {
            "verdicts": self.verdicts(),
            "checks": self.to_frame(),
            "outputs": self.outputs.copy(),
            "estimator_accuracy": self._estimator_accuracy(),
        }

    def _estimator_accuracy(self) -> pd.DataFrame:
        other = self.checks[self.checks["transform"] == "(none)"]
        return other[["variant", "check", "value", "threshold", "ok"]].reset_index(drop=True)

    def verdicts(self) -> pd.DataFrame:
        """One row per model variant and map: the headline numbers and its ``result``.

        ``"ok"`` (every judged check agrees), ``"not verified"`` (a check of the evidence failed, the map's own or its
        model variant's, ``EVIDENCE_CHECKS``, or nothing was judged: as :attr:`status`, the evidence outranks
        the theory), ``"FAIL"`` (the evidence is sound and a check of the theory disagrees) or ``"inconclusive"`` (a
        control that was not detected, ``INCONCLUSIVE_CHECKS``, and no disagreement).
        """
        unsound = set(self._evidence_failures()["variant"])
        rows = []
        for (variant, transform), group in self.checks.groupby(["variant", "transform"], sort=False):
            if transform == "(none)":
                continue
            values = dict(zip(group["check"], group["value"], strict=True))
            judged = group["ok"].dropna().astype(bool)
            failed = set(group.loc[judged.index[~judged.to_numpy()], "check"])
            if not len(judged) or variant in unsound or failed & set(EVIDENCE_CHECKS):
                result = "not verified"
            else:
                result = "FAIL" if failed - set(INCONCLUSIVE_CHECKS) else "inconclusive" if failed else "ok"
            rows.append(
                {
                    "variant": variant,
                    "transform": transform,
                    "kind": group["kind"].iloc[0],
                    "p(x) expected": group["p_x_expected"].iloc[0],
                    "CRN max |diff|": values.get("crn_max_abs_diff", np.nan),
                    "z independent": values.get("indep_z_mean", np.nan),
                    "z own proposal": values.get("own_z_mean", np.nan),
                    "z control": values.get("control_z", np.nan),
                    "quadrature max |diff|": values.get("quadrature_max_abs_diff", np.nan),
                    "prior max |diff|": values.get("prior_max_abs_diff", np.nan),
                    "result": result,
                }
            )
        return pd.DataFrame(rows)

    # ----- export -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dictionary: settings, verdict, transforms, variants, checks and the outputs table."""
        return {
            "passed": self.passed,
            "status": self.status,
            "reasons": self.reasons(),
            "settings": json_ready(self.settings),
            "transforms": {k: json_ready(np.asarray(v)) for k, v in self.transforms.items()},
            "variants": json_ready(self.variants),
            "verdicts": json_ready(self.verdicts()),
            "checks": json_ready(self.checks),
            "outputs": json_ready(self.outputs.to_dict(orient="index")),
            "check_descriptions": dict(CHECK_DESCRIPTIONS),
            "evidence_checks": sorted(EVIDENCE_CHECKS),
        }

    def _headline(self) -> str:
        s = self.settings
        status = self.status
        if status == "verified numerically":
            verdict = "VERIFIED NUMERICALLY"
        elif status == "failed":
            verdict = f"FAILED ({len(self.disagreements)} checks disagree with the theory)"
        else:
            verdict = f"NOT VERIFIED ({self.reasons()[0]})"
        return (
            f"Invariance check of {s.get('model', 'the model')} on {s.get('n_cells', '?')} cells "
            f"({s.get('dtype', '?')}, {s.get('n_samples', '?')} importance draws, seed {s.get('seed', '?')}): "
            f"{verdict}"
        )

    def summary(self) -> str:
        """A short text summary: the verdict, one line per variant and map, and the reasons when not verified."""
        table = self.verdicts()
        lines = [self._headline(), ""]
        if len(table):
            lines.append(table.map(format_value).to_string(index=False))
        if not self.passed:
            lines += ["", "Not verified because:" if self.status == "not verified" else "Disagreements:"]
            lines += [f"  {line}" for line in self.reasons()]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def _descriptions(self) -> list[tuple[str, str]]:
        present = set(self.checks["check"])
        return [(k, v) for k, v in CHECK_DESCRIPTIONS.items() if k in present]

    def _conclusions(self) -> list[str]:
        """:data:`CONCLUSIONS`, saying so where this model had no quadrature (its evidence is the estimates alone)."""
        if self.settings.get("quadrature", True):
            return list(CONCLUSIONS)
        note = str(self.settings.get("quadrature_note", "")).rstrip(".")
        return [*CONCLUSIONS, f"No quadrature ran for this model ({note}): its evidence is the estimates alone."]

    def to_markdown(self) -> str:
        """The report as Markdown: verdict, per-map table, outputs table, and how to read them."""
        parts = [f"# {TITLE}", "", self._headline(), "", INTRODUCTION, "", "## Per map", ""]
        parts += [markdown_table(self.verdicts()), ""]
        if len(self.outputs):
            parts += [
                "## Which outputs change (fitted model)",
                "",
                "Values are changes between the original and the reparameterized model (0 = identical).",
                "",
                markdown_table(self.outputs.reset_index()),
                "",
            ]
        accuracy = self._estimator_accuracy()
        if len(accuracy):
            parts += ["## The evidence: estimator reliability and accuracy, quadrature convergence", ""]
            parts += [markdown_table(accuracy), ""]
        if not self.passed:
            parts += [f"## {self._reasons_heading()}", ""] + [f"- {line}" for line in self.reasons()] + [""]
        parts += ["## Checks", ""]
        parts += [f"- `{k}`: {v}" for k, v in self._descriptions()]
        parts += ["", "## What this shows and what it does not", ""]
        parts += [f"- {line}" for line in self._conclusions()]
        parts += [""]
        return "\n".join(parts)

    def _figures(self) -> list[dict[str, Any]]:
        """The report's figures: title, caption and a function drawing each (on its own Agg figure)."""
        figures = []
        if self.per_cell:
            tolerance = self.settings.get("tolerances", {}).get("abs")
            figures.append(
                {
                    "title": "log p(x) with the same base noise",
                    "caption": "Per-cell |log p(x) transformed - original| for every map; maps that preserve the "
                    "prior sit at rounding level, the controls at the size of a real change.",
                    "draw": lambda: plotting.lpd_differences(self.per_cell, threshold=tolerance),
                }
            )
        if len(self.outputs):
            figures.append(
                {
                    "title": "Which outputs change",
                    "caption": "log10 change of each output of the fitted model under each map (-17: none).",
                    "draw": lambda: plotting.output_changes(self.outputs),
                }
            )
        return figures

    def to_html(self) -> str:
        """The report as one self-contained HTML page (inline figures; text from the data escaped)."""
        accuracy = self._estimator_accuracy()
        body = (
            template_environment(__package__)
            .get_template("invariance_report.html.j2")
            .render(
                title=TITLE,
                headline=self._headline(),
                introduction=INTRODUCTION,
                verdicts=self.verdicts(),
                figures=self._figures(),
                outputs=self.outputs.reset_index() if len(self.outputs) else None,
                accuracy=accuracy if len(accuracy) else None,
                reasons=[] if self.passed else self.reasons(),
                reasons_heading=self._reasons_heading(),
                failures=self.failures if len(self.failures) else None,
                checks=self._descriptions(),
                conclusions=self._conclusions(),
                settings=self.settings,
            )
        )
        return html_page(TITLE, [body])

    def _repr_html_(self) -> str:
        """The verdict and the per-map table, for notebooks (text escaped)."""
        template = template_environment(__package__).get_template("invariance_summary.html.j2")
        return template.render(headline=self._headline(), verdicts=self.verdicts())

    def save(self, dir_path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write ``report.json`` (:meth:`to_dict`), ``report.md`` and ``report.html`` into a new folder.

        The folder is built under a temporary name and renamed into place, so it appears complete or not at all.

        Parameters
        ----------
        dir_path
            Destination folder.
        overwrite
            Replace an existing report folder; otherwise it is an error (:class:`countvae.errors.OutputExistsError`).
            A folder holding anything but ``report.json``, ``report.md`` and ``report.html``, a file or a symbolic
            link is refused whatever ``overwrite`` says (it is replaced whole), before the report is rendered.

        Returns
        -------
        Path
            The folder.

        """
        check_report_folder(dir_path, overwrite)
        return write_report_folder(
            dir_path, html_text=self.to_html(), record=self.to_dict(), markdown=self.to_markdown(), overwrite=overwrite
        )
