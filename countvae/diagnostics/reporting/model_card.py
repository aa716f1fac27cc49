"""A model card: the report's findings in a short Markdown block to paste beside a figure or into a methods section.

It states what the fits identify and up to which symmetry (from the verdict rows), whether they are predictively
equivalent (with the interval of the worst pair), the measurements that carry no verdict (how well the batches mix,
where unseen cells land), the matching calibration scenario and how often each row's verdict was right there, the
package versions, and the settings that reproduce the fits and the report. Every number is read from the report; nothing
is recomputed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from countvae.diagnostics.reporting.settings import ReportSettings
from countvae.diagnostics.reporting.verdicts import (
    AGREE,
    ALIGNED,
    DIFFER,
    NOT_MEASURED,
    UNDETERMINED,
    quantities_by_verdict,
)

if TYPE_CHECKING:
    from countvae.diagnostics.reporting.report_content import ReportContent

#: Held-out cells of the calibration scenarios with adequate and with few cells (benchmarks/calibration.py);
#: a report is matched to the scenario whose size is nearer on a log scale.
CALIBRATION_CELLS = {"seeds": 1000, "few cells": 40}
#: What the symmetry group of the model means, by the fits' ``symmetry``.
SYMMETRY_WORDS = {
    "orthogonal": "every rotation or reflection of the latent space leaves p(x) unchanged",
    "signed permutation": "reordering the latent dimensions or flipping their signs leaves p(x) unchanged",
    "sign flip": "flipping the sign of a latent dimension leaves p(x) unchanged",
    "none": "no map of the latent space leaves p(x) unchanged",
}
#: Verdict -> the card's line label.
VERDICT_LABELS = {
    AGREE: "Identified (agree across seeds as they are)",
    ALIGNED: "Identified up to the symmetry (agree after aligning the seeds)",
    DIFFER: "Not reproduced (differ across seeds)",
    UNDETERMINED: "Undetermined (the data in the report cannot decide)",
    NOT_MEASURED: "Not measured",
}


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:  # a non-finite number of a report read back from report.json (saved as null)
        return "n/a"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return "n/a" if not np.isfinite(number) else f"{number:.{digits}g}"


def _fits_line(rep: ReportContent) -> str:
    fits = rep.provenance.get("fits", [])
    seeds = ", ".join(str(f["seed"]) for f in fits)
    symmetry = fits[0]["symmetry"] if fits else "unknown"
    kind = fits[0]["kind"] if fits else "unknown"
    width = fits[0]["n_latent"] if fits else "?"
    cells, genes = rep.provenance.get("heldout_cells", "?"), rep.provenance.get("genes", "?")
    return (
        f"- **Fits**: {len(fits)} seeds ({seeds}) of one {kind} model with {width} latent dimensions, compared on "
        f"{cells} held-out cells x {genes} genes. Symmetry: {symmetry} "
        f"({SYMMETRY_WORDS.get(symmetry, 'a group of latent maps leaves p(x) unchanged')}), so the latent "
        "coordinates are identified at most up to this group."
    )


def _verdict_lines(invariants: pd.DataFrame) -> list[str]:
    by_verdict = quantities_by_verdict(invariants).items()
    return [f"- **{VERDICT_LABELS[verdict]}**: {', '.join(names)}." for verdict, names in by_verdict if names]


def predictive_line(rep: ReportContent) -> str:
    """Predictive equivalence: the decision, the worst pair's per-cell difference with its interval, the margin."""
    record = rep.settings.get("predictive_equivalence", {})
    state = record.get("state", "not measured")
    pairs = rep.tables.get("predictive_pairs")
    if pairs is None or not len(pairs):
        return f"- **Predictive equivalence**: {state} (no held-out log p(x) for these fits)."
    worst = pairs.loc[pairs["diff_per_cell"].abs().idxmax()]
    level = 100 * float(worst["ci_level"])
    counts = ", ".join(f"{n} {k}" for k, n in record.get("pairs", {}).items())
    return (
        f"- **Predictive equivalence**: {state}. Largest held-out log p(x) difference between seeds "
        f"{_fmt(worst['diff_per_cell'])} nats per cell ({worst['fit_a']} - {worst['fit_b']}; {level:.3g}% interval "
        f"{_fmt(worst['ci_low'])} to {_fmt(worst['ci_high'])}) against a margin of "
        f"{_fmt(record.get('margin_nats_per_cell'))} nats per cell; pairs of seeds: {counts}."
    )


#: Record of a section without a verdict -> the card's label for its sentence.
MEASUREMENT_LABELS = {"batch_mixing": "Batch mixing", "placement": "Placement of unseen cells"}


def measurement_lines(rep: ReportContent) -> list[str]:
    """The sentences of the sections that measure without a verdict (batch mixing, placement), when present."""
    return [
        f"- **{label}** (a measurement, no verdict): {rep.settings[key]['sentence']}"
        for key, label in MEASUREMENT_LABELS.items()
        if rep.settings.get(key, {}).get("sentence")
    ]


def training_cell_line(rep: ReportContent) -> list[str]:
    """The latent rows' verdicts on the cells the fits were trained on, when the report measured them."""
    record = rep.settings.get("training_cells", {})
    table = rep.tables.get("training_cells")
    if not record.get("sentence") or table is None:
        return []
    changed = table[table["training_verdict"] != table["heldout_verdict"]]
    verdicts = (
        "; ".join(f"{r.quantity}: {r.training_verdict} (held-out: {r.heldout_verdict})" for r in changed.itertuples())
        if len(changed)
        else "the same verdicts as on held-out cells"
    )
    return [f"- **Training cells** ({verdicts}): {record['sentence']}"]


def calibration_regime(n_cells: int) -> str:
    """The calibration scenario (of :data:`CALIBRATION_CELLS`) nearest to ``n_cells`` held-out cells on a log scale."""
    return min(CALIBRATION_CELLS, key=lambda s: abs(np.log(max(n_cells, 1)) - np.log(CALIBRATION_CELLS[s])))


def _rates(rows: pd.DataFrame, oracle: bool = False) -> str:
    """Per row ``correct/undetermined/wrong`` %, and with ``oracle`` the runs the oracle left undecided (regimes)."""
    columns = ["correct %", "undetermined %", "wrong %"] + (["oracle undecided %"] if oracle else [])
    return "; ".join(
        f"{r['quantity']} " + "/".join(f"{r.get(c, float('nan')):.0f}" for c in columns)
        for r in rows.to_dict("records")
    )


def calibration_lines(rep: ReportContent) -> list[str]:
    """The matching calibration scenario and the share of correct, undetermined and wrong verdicts per row.

    The regime the report's calibration section chose for its configuration (fits, decoder, size, data), in its own
    words (whether the configuration is calibrated there); for a report without one, the simulated scenario nearest
    to its number of held-out cells.
    """
    regime = (rep.settings.get("calibration") or {}).get("regime")
    regimes = rep.tables.get("calibration_regime")
    if regime and regimes is not None and len(regimes):
        rows = regimes[regimes["scenario"] == regime["name"]]
        if len(rows):
            return [
                f"- **Calibration regime**: {regime['sentence']} Verdicts there, % correct/undetermined/wrong/"
                f"oracle undecided over {int(rows['replicates'].iloc[0])} replicates: {_rates(rows, oracle=True)}."
            ]
    table = rep.tables.get("calibration")
    if table is None or not len(table):
        return ["- **Calibration**: no calibration record."]
    regime = calibration_regime(int(rep.provenance.get("heldout_cells", 0)))
    rows = table[table["scenario"] == regime]
    if not len(rows):
        return [f"- **Calibration**: the scenario {regime!r} is not in the calibration record."]
    adequate = "adequate data" if bool(rows["adequate data"].iloc[0]) else "too few cells to decide"
    rates = _rates(rows)
    return [
        f"- **Calibration regime**: {regime!r} ({CALIBRATION_CELLS[regime]} held-out cells, {adequate}; the "
        "calibration scenario nearest to this report's size). Verdicts there, % correct/undetermined/wrong over "
        f"{int(rows['replicates'].iloc[0])} simulated replicates: {rates}."
    ]


def _versions_line(rep: ReportContent) -> str:
    """The report's package versions, and those the fits recorded that it lacks (scvi-tools for its fits)."""
    fitted = (rep.settings.get("fits") or {}).get("versions") or {}
    versions = {**fitted, **rep.provenance.get("versions", {})}
    return "- **Software**: " + ", ".join(f"{name} {v}" for name, v in versions.items()) + "."


def _data_calls(fits: dict[str, Any]) -> str:
    """The calls that prepare the data as the fits had it (registration, the genes kept), each followed by ", "."""
    registry = fits.get("registry")
    if not registry:
        return ""
    given = "".join(f", {k}={v!r}" for k, v in registry.items() if v not in (None, False))
    calls = f"`countvae.data.setup_anndata(adata{given})`, "
    selection = fits.get("gene_selection")
    if selection:
        calls += f"`adata = countvae.data.select_top_genes(adata, {selection['n_top_genes']})`, "
    return calls


def settings_line(rep: ReportContent) -> str:
    """How to make the fits and the report again: the fits' settings and the report's non-default settings."""
    fits = rep.settings.get("fits") or {}
    seeds = [f["seed"] for f in rep.provenance.get("fits", [])]
    defaults = ReportSettings().to_dict()
    changed = {k: v for k, v in (rep.settings.get("report") or {}).items() if defaults.get(k) != v}
    markers = rep.settings.get("markers")
    report_args = (f", markers={list(markers)!r}" if markers else "") + "".join(
        f", {k}={v!r}" for k, v in changed.items()
    )
    model_class = fits.get("model_class")
    # fits of another package (scvi-tools) are made with model_cls; countvae's are fit_seeds' default
    model_cls = f"model_cls={model_class}, " if model_class and not model_class.startswith("countvae.") else ""
    if fits:
        fit_call = _data_calls(fits) + (
            f"`fits = countvae.diagnostics.fit_seeds(adata, seeds={seeds}, {model_cls}"
            f"model_kwargs={fits.get('model_kwargs')}, "
            f"train_kwargs={fits.get('train_kwargs')}, heldout_fraction={fits.get('heldout_fraction')}, "
            f"split_seed={fits.get('split_seed')})`"
        )
    else:
        fit_call = f"fits of seeds {seeds} passed as a list (their settings are not recorded)"
    command = rep.settings.get("command")
    prefix = f"`{command}`, i.e. " if command else ""
    return f"- **Settings**: {prefix}{fit_call}, then `countvae.diagnostics.report(fits{report_args})`."


def model_card(rep: ReportContent) -> str:
    """The report as a short Markdown block (see the module docstring)."""
    lines = ["### Model card (countvae multi-seed diagnostics)", "", _fits_line(rep)]
    if "invariants" in rep.tables:  # a report of a subset of the sections may have none
        lines += _verdict_lines(rep.invariants)
    lines += [predictive_line(rep), *measurement_lines(rep), *training_cell_line(rep), *calibration_lines(rep)]
    lines += [_versions_line(rep), settings_line(rep)]
    return "\n".join(lines) + "\n"
