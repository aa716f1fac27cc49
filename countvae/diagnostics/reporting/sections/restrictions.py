"""The restrictions section: what each restriction buys in identified coordinates and costs in held-out fit.

Only when asked for (``report(fits, held, restrictions=RestrictionRequest(...))``, ``fits`` being the unrestricted
model's seeds): the restricted fits are read in the collect step (:func:`..restriction_readout.collect_restrictions`);
:func:`restriction_analysis`, the section's ``compute``, works on those arrays alone with the functions of
:mod:`countvae.diagnostics.analyses.restrictions`: agreement across seeds (loadings and marker correlations too) after a
signed permutation only, the split half (fits on disjoint halves of the cells from different seeds), the predictive cost
against the unrestricted fit of each seed (paired held-out ``log p(x)`` with a 95% interval and an equivalence margin),
the recovery of the true sources and loadings for data from :func:`countvae.data.simulate` (MCC) and the support of each
gene program; the verdicts are stated in sentences (:func:`headline`).
:func:`..compare_restrictions.compare_restrictions` fits the models and runs the same two steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from countvae.diagnostics.analyses.restrictions import (
    ALREADY,
    CLOSER,
    IDENTIFIED,
    IDENTIFIED_AGREEMENT,
    LOWERS,
    NO_CLAIM,
    NOT_IDENTIFIED,
    RECOVERS,
    SAME_CELLS,
    TOO_GAUSSIAN,
    agreement_pairs,
    identification_verdict,
    pair_agreement,
    predictive_cost,
    program_support,
    split_half_reading,
    summarize_agreement,
    truth_recovery,
    truth_verdict,
)
from countvae.diagnostics.fitting.restrictions import LABELS
from countvae.diagnostics.reporting.collect import Collected
from countvae.diagnostics.reporting.report_content import ReportContent
from countvae.diagnostics.reporting.restriction_readout import ModelReadout, RestrictionArrays
from countvae.diagnostics.reporting.sections.base import (
    HTML,
    Block,
    Bullets,
    Details,
    Heading,
    KeyValues,
    Paragraph,
    Section,
    SectionResult,
    Shared,
    Table,
)
from countvae.diagnostics.reporting.settings import ReportSettings
from countvae.errors import InvalidArgumentError
from countvae.module.importance import MAX_UNRELIABLE_SHARE

TITLE = "Restrictions: what each one identifies, and at what cost"

#: How to read the tables (Markdown and HTML).
INTRODUCTION = (
    "Every model was fitted from the same seeds on the same training cells and evaluated on the same "
    "held-out cells. Agreement is measured after a signed permutation of the latent dimensions only "
    "(no rotation), so it is high only when the dimensions themselves reproduce; the rotation ceiling "
    "is the same agreement after the best rotation. The split half fits the first two seeds on two disjoint "
    "halves of the training cells, one each (for ICA: the unrestricted split-half fits, each re-read by an ICA "
    "of its own half's cells); a restriction is credited with identifying the axes only when the seeds agree "
    "and the independent halves agree too, because seeds that see the same cells can agree on axes of that "
    "sample alone; an ICA with a component no more non-Gaussian than Gaussian noise of the same size is "
    "not credited either. "
    "Predictive cost is the held-out log p(x) of the restricted model minus the unrestricted one's, "
    "per cell (negative: the restriction costs fit)."
)

#: The comparison's tables, in the order they are shown, with their headings.
TABLE_HEADINGS = {
    "restrictions": "Per restriction",
    "symmetry": "Declared symmetry and its numerical check",
    "programs": "Gene programs: supported by the data?",
    "agreement_pairs": "Agreement per pair of seeds",
    "split_half": "Split half",
    "predictive_seeds": "Predictive cost per seed",
}
#: Each table's name among the multi-seed report's tables (prefixed, but for the main one).
REPORT_TABLES = {name: name if name == "restrictions" else f"restriction_{name}" for name in TABLE_HEADINGS}
#: The refusal of the section without restricted fits.
NO_REQUEST = (
    "The 'restrictions' section compares the report's fits (the unrestricted model's seeds) with restricted models "
    "fitted from the same seeds and cells: pass restrictions=RestrictionRequest(fit_restrictions(...)) "
    "(countvae.diagnostics.reporting.restriction_readout, countvae.diagnostics.fitting.restrictions), or run "
    "countvae.diagnostics.compare_restrictions(adata, ...), which fits them."
)


# ----- sentences -----------------------------------------------------------------------------------------
def _cost_phrase(row: pd.Series) -> str:
    if row["kind"] == "post hoc":
        return "at no cost in held-out log p(x) (the model is unchanged; only its axes are re-read)"
    d, se, m = row["lpd_difference_per_cell"], row["lpd_se_per_cell"], row["margin"]
    verdict = row["predictive"]
    if verdict == "equivalent":
        return f"with no detectable cost in held-out log p(x) ({d:+.2f} ± {se:.2f} nats/cell, within ±{m:g})"
    if verdict == "costs":
        return f"at a cost of {-d:.2f} ± {se:.2f} nats/cell in held-out log p(x)"
    if verdict == "gains":
        return f"with a gain of {d:.2f} ± {se:.2f} nats/cell in held-out log p(x)"
    unreliable, cells = row.get("lpd_unreliable_cells", np.nan), row.get("lpd_cells", np.nan)
    if np.isfinite(unreliable) and unreliable > MAX_UNRELIABLE_SHARE * cells:
        return (
            f"with a held-out log p(x) difference of {d:+.2f} ± {se:.2f} nats/cell that cannot be judged: the "
            f"estimates are unreliable (Pareto k-hat) on {unreliable:.0f} of {cells:.0f} held-out cells"
        )
    return f"with a held-out log p(x) difference of {d:+.2f} ± {se:.2f} nats/cell (neither a cost nor within ±{m:g})"


def _truth_lines(table: pd.DataFrame) -> list[str]:
    """What the simulated truth says: each model's recovery (MCC), and whether a restriction's axes are the sources."""
    base = table.iloc[0]
    loadings = table["loadings_mcc"].astype(float)  # NaN for a model without loadings (an MLP decoder)
    parts = [
        f"{row['sources_mcc']:.2f}"
        + (f" (loadings {loadings[index]:.2f})" if np.isfinite(loadings[index]) else "")
        + f" under the {row['label']}"
        for index, row in table.iterrows()
    ]
    bracket = "; loadings MCC in brackets" if np.isfinite(loadings).any() else ""
    lines = [
        "Against the simulated truth, the held-out sources are recovered dimension by dimension (MCC, mean over "
        f"seeds{bracket}) at {'; '.join(parts)}."
    ]
    for _, row in table.iloc[1:].iterrows():
        versus = f"MCC {row['sources_mcc']:.2f} vs {base['sources_mcc']:.2f} under the {base['label']}"
        if row["truth"] == RECOVERS:
            lines.append(f"The {row['label']} recovers the simulated sources ({versus}).")
        elif row["truth"] == CLOSER:
            lines.append(f"The {row['label']} brings the axes closer to the simulated sources ({versus}).")
        elif row["identified"] in (IDENTIFIED, SAME_CELLS):
            lines.append(
                f"The axes on which the {row['label']} agrees are not the simulated sources ({versus}): "
                "reproducible is not the same as true."
            )
    return lines


def _undetermined_why(row: pd.Series, base: pd.Series) -> str:
    """Which of :func:`identification_verdict`'s undetermined cases a restriction's row is in."""
    mean, worst = row["coordinates_agreement"], row["coordinates_agreement_min"]
    if not np.isfinite(mean):
        return "the agreement could not be measured"
    if worst >= IDENTIFIED_AGREEMENT:
        return "every seed pair agrees, but the split half was not measured"
    if mean >= IDENTIFIED_AGREEMENT:
        return "some seed pairs agree, some do not"
    return f"above the {base['label']}'s, but below {IDENTIFIED_AGREEMENT:g} on the worst pair"


def headline(table: pd.DataFrame, n_seeds: int, programs: pd.DataFrame | None) -> list[str]:
    """The verdicts in sentences, most important first (they only state the table's numbers and verdicts)."""
    base = table.iloc[0]
    lines = []
    identified = table[table["identified"] == IDENTIFIED]
    if len(identified):
        for _, row in identified.iterrows():
            lines.append(
                f"Per-dimension coordinates are reproducible across {n_seeds} seeds and between independent halves "
                f"of the cells under the {row['label']} "
                f"(agreement {row['coordinates_agreement']:.2f}, worst pair {row['coordinates_agreement_min']:.2f}, "
                f"vs {base['coordinates_agreement']:.2f} under the {base['label']}), {_cost_phrase(row)}; "
                f"the axes are a consequence of that restriction ({row['split_half_reading']})."
            )
    else:
        lines.append(
            f"No restriction makes per-dimension coordinates reproducible across {n_seeds} seeds and between "
            f"independent halves of the cells (threshold {IDENTIFIED_AGREEMENT:g} for every pair); read no single "
            "latent dimension of these fits."
        )
    lines.append(
        f"Under the {base['label']} the seeds agree at {base['coordinates_agreement']:.2f} dimension by dimension and "
        f"at {base['rotation_ceiling']:.2f} after the best rotation: "
        + (
            "the axes already agree without a restriction (credited to the fit, not to any restriction)."
            if base["identified"] == ALREADY
            else "the latent space reproduces, its axes do not."
            if base["rotation_ceiling"] >= IDENTIFIED_AGREEMENT
            else "even the latent space differs between seeds."
        )
    )
    for _, row in table.iloc[1:].iterrows():
        if row["identified"] == IDENTIFIED:
            continue
        verdict = {
            NOT_IDENTIFIED: "does not make per-dimension coordinates reproducible",
            ALREADY: "is not needed for agreement here",
            LOWERS: "makes per-dimension coordinates agree less than without it",
            SAME_CELLS: "makes per-dimension coordinates agree across seeds that see the same cells, not between "
            "independent halves of the cells, so it is not credited with identifying them",
            TOO_GAUSSIAN: f"cannot identify the axes: {row.get('gaussian_components', 0):.0f} of its components are no "
            "more non-Gaussian than what ICA finds in Gaussian noise of this size",
        }.get(row["identified"], f"leaves the per-dimension agreement undetermined ({_undetermined_why(row, base)})")
        lines.append(
            f"The {row['label']} {verdict} (agreement {row['coordinates_agreement']:.2f}, worst pair "
            f"{row['coordinates_agreement_min']:.2f}), {_cost_phrase(row)}; {row['split_half_reading']}."
        )
    if "sources_mcc" in table:
        lines += _truth_lines(table)
    if programs is not None and len(programs):
        bad = programs.loc[~programs["supported"].astype(bool), "program"].tolist()
        good = programs.loc[programs["supported"].astype(bool), "program"].tolist()
        lines.append(
            f"Gene programs: {len(good)} of {len(programs)} supported by the data"
            + (f" ({', '.join(good)})" if good else "")
            + (f"; not supported: {', '.join(bad)}." if bad else ".")
        )
    return lines


# ----- tables -------------------------------------------------------------------------------------------
def restriction_tables(
    readouts: Mapping[str, ModelReadout],
    order: list[str],
    marker_values: np.ndarray,
    truth: tuple[np.ndarray, np.ndarray | None] | None,
    margin: float,
    seed: int,
) -> dict[str, pd.DataFrame]:
    """The comparison's tables from the read-out arrays alone: one row per model, pairs, split halves, symmetry."""
    rows, pair_tables, split_rows, seed_rows = [], [], [], []
    for name in order:
        readout = readouts[name]
        pairs = agreement_pairs(readout.latents, readout.loadings, marker_values, seed)
        pair_tables.append(pairs.assign(model=name))
        split = None if readout.split is None else pair_agreement(*readout.split, marker_values, seed)
        if split is not None:
            split_rows.append({"model": name, **split})
        row = _model_row(readout, summarize_agreement(pairs), rows[0] if rows else None, split, truth)
        row |= _cost_columns(readout, readouts["unrestricted"], margin, seed_rows)
        rows.append(row)
    return {
        "restrictions": pd.DataFrame(rows),
        "symmetry": pd.DataFrame([r for name in order for r in readouts[name].symmetry_rows]),
        "agreement_pairs": pd.concat(pair_tables, ignore_index=True),
        "split_half": pd.DataFrame(split_rows),
        "predictive_seeds": pd.DataFrame(seed_rows),
    }


def _model_row(
    readout: ModelReadout,
    summary: dict[str, float],
    base: dict[str, Any] | None,
    split: dict[str, float] | None,
    truth: tuple[np.ndarray, np.ndarray | None] | None,
) -> dict[str, Any]:
    """One model's row: its agreement, what it identifies, and (simulated data) how well it recovers the truth."""
    name = readout.restriction.name
    split_value = np.nan if split is None else split["coordinates"]
    verdict = identification_verdict(
        summary["coordinates_agreement_min"],
        summary["coordinates_agreement"],
        (base or summary)["coordinates_agreement"],
        split_value,
        too_gaussian=readout.gaussian_components > 0,
    )
    if name == "unrestricted" and verdict != ALREADY:
        verdict = "reference"
    row = {
        "model": name,
        "label": LABELS[name],
        "kind": "post hoc" if readout.restriction.post_hoc else "model",
        "symmetry": readout.symmetry,
        **summary,
        "identified": verdict,
        "split_half_agreement": split_value,
        "split_half_reading": split_half_reading(verdict, summary["coordinates_agreement"], split_value)
        if name != "unrestricted"
        else "reference",
        "gaussian_components": readout.gaussian_components if name == "ica" else np.nan,
        "fit_seconds_per_seed": float(np.mean(list(readout.seconds.values()))),
    }
    if truth is not None:
        row.update(truth_recovery(readout.latents, readout.loadings, *truth))
        base_mcc = None if base is None else base["sources_mcc"]
        # components as Gaussian as noise identify nothing, so their MCC is a chance alignment
        row["truth"] = (
            NO_CLAIM if verdict == TOO_GAUSSIAN else truth_verdict(row["sources_mcc"], row["sources_mcc_min"], base_mcc)
        )
    return row


def _cost_columns(
    readout: ModelReadout, unrestricted: ModelReadout, margin: float, seed_rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """The predictive cost against the unrestricted fit of each seed (appending the per-seed differences)."""
    name = readout.restriction.name
    if name != "unrestricted" and not readout.restriction.post_hoc:
        cost = predictive_cost(readout.lpd, unrestricted.lpd, margin)
        seed_rows.append({"model": name, "seed_differences_per_cell": cost["seed_differences"]})
        return {
            "lpd_difference_per_cell": cost["difference_per_cell"],
            "lpd_se_per_cell": cost["se_per_cell"],
            "ci95_low": cost["ci95_low"],
            "ci95_high": cost["ci95_high"],
            "margin": margin,
            "lpd_unreliable_cells": cost["n_unreliable"],
            "lpd_cells": cost["n_cells"],
            "predictive": cost["verdict"],
        }
    return {
        "lpd_difference_per_cell": 0.0 if name == "ica" else np.nan,
        "lpd_se_per_cell": 0.0 if name == "ica" else np.nan,
        "ci95_low": np.nan,
        "ci95_high": np.nan,
        "margin": margin,
        "lpd_unreliable_cells": np.nan,
        "lpd_cells": np.nan,
        "predictive": "unchanged model" if name == "ica" else "reference",
    }


def restriction_analysis(
    arrays: RestrictionArrays, margin: float, seed: int
) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """The comparison's tables (in the order of :data:`TABLE_HEADINGS`) and its verdict in sentences."""
    readouts = arrays.readouts
    tables = restriction_tables(readouts, list(readouts), arrays.markers, arrays.truth, margin, seed)
    if arrays.programs is not None:
        tables["programs"] = program_support(
            readouts["programs"].latents,
            readouts["programs"].posterior_loadings,
            arrays.expression,
            arrays.programs,
            arrays.var_names,
            arrays.library,
            seed,
        )
    lines = headline(tables["restrictions"], len(readouts["unrestricted"].latents), tables.get("programs"))
    return {name: tables[name] for name in TABLE_HEADINGS if name in tables}, lines


# ----- the section ---------------------------------------------------------------------------------------
class RestrictionsSection(Section):
    """The restriction comparison in the multi-seed report; not a default section (it needs restricted fits)."""

    name = "restrictions"
    title = TITLE
    needs = frozenset({"restrictions"})
    headline_rank = 55

    def compute(self, c: Collected, shared: Shared, s: ReportSettings) -> SectionResult:
        """The tables and sentences from the collected read-outs; the first sentence joins the report's verdict."""
        request, arrays = c.restriction_request, c.restriction_arrays
        if request is None or arrays is None:
            raise InvalidArgumentError(NO_REQUEST)
        tables, lines = restriction_analysis(arrays, request.margin, request.seed)
        record = {
            "verdict": lines,
            "restrictions": list(arrays.readouts)[1:],
            "seeds": [f["seed"] for f in c.fits],
            "heldout_cells": c.n_cells,
            "markers": c.marker_names,
            "margin_nats_per_cell": request.margin,
            "identified_threshold": IDENTIFIED_AGREEMENT,
            "n_lpd_samples": request.n_lpd_samples,
            "check_symmetry": request.check_symmetry,
            "split_half": any(r.split is not None for r in arrays.readouts.values()),
            "gene_programs": arrays.programs,
        }
        return SectionResult(
            tables={REPORT_TABLES[name]: table for name, table in tables.items()},
            headline=lines[:1],
            records={"restrictions": record},
        )

    def layout(self, rep: ReportContent) -> list[Block]:
        """The verdict lines, how to read the tables, each table, and the comparison's settings folded."""
        if REPORT_TABLES["restrictions"] not in rep.tables:
            return []
        record: dict[str, Any] = dict(rep.settings.get("restrictions", {}))
        blocks: list[Block] = [Bullets(tuple(record.pop("verdict", ()))), Paragraph(INTRODUCTION)]
        for name, heading in TABLE_HEADINGS.items():
            frame = rep.tables.get(REPORT_TABLES[name])
            if frame is not None and len(frame):
                blocks += [Heading(heading), Table(frame, max_rows=80)]
        return [*blocks, Details("Settings of the comparison", (KeyValues(record),), formats=frozenset({HTML}))]
