"""How often the report's verdicts are right: the calibration suite's measured rates, bundled with the package.

``benchmarks/calibration.py`` runs the whole report on simulations of known truth and writes, next to its RESULTS.md
section, the per-scenario and per-row counts of correct, undetermined and wrong verdicts to :data:`CALIBRATION_FILE`
(one JSON file, written atomically). This module turns that file into the report's section "How often these verdicts
are right": a table, and one plain sentence for every row that falls short (:func:`calibration_sentences`).

The numbers describe the suite's simulations (linear NB data with 3 sources, 5,000 cells), not the data at hand: they
say how far each row's verdict can be trusted where its assumptions hold, and where it is known to fail.

**Regimes.** ``benchmarks/calibration_regimes.py`` adds, under ``regimes``, the rates measured in other configurations
(package, decoder, likelihood, prior, architecture, latent dimensions, held-out cells, genes, batch, seeds, training,
report settings), each scored against the same fits' verdicts on a large independent pool of cells.
:func:`nearest_regime` picks the regime nearest to a report's configuration (:func:`report_configuration`) and says
whether the report is within its calibrated range (:data:`TOLERANCE`; every other setting equal); the table, summary
and sentences take ``regime=`` to show its numbers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from countvae.model.settings import ModelSettings

#: The bundled calibration record (written by ``benchmarks/calibration.py``).
CALIBRATION_FILE = Path(__file__).with_name("verdict_calibration.json")
#: Share of correct verdicts the suite aims at in every scenario.
GOAL_CORRECT = 0.95
#: Largest share of undetermined verdicts the suite aims at where the data are adequate.
GOAL_UNDETERMINED = 0.2
#: A report's configuration, as :func:`report_configuration` gives it and each regime records it.
CONFIGURATION_KEYS = (
    "model",
    "decoder",
    "n_latent",
    "n_heldout_cells",
    "n_genes",
    "batch",
    "likelihood",
    "prior",
    "dispersion",
    "n_hidden",
    "n_layers",
    "n_seeds",
    "early_stopping",
    "fit_cells",
    "report_settings",
)
#: Settings that choose between equally near regimes without making a report uncalibrated: real cells prefer a
#: regime of real cells, simulated ones a simulated regime (the regimes' simulations are drawn from models of real
#: cells, so each speaks for the other, but the nearer kind is the better evidence).
PREFERENCE_KEYS = ("data",)
#: What a regime recorded before a key existed: every regime without ``model`` was measured on countvae's fits.
_RECORDED_BEFORE = {"model": "countvae"}
#: ``report_settings`` of a report run with every verdict-affecting setting at its default.
DEFAULT_REPORT_SETTINGS = "defaults"
#: Report settings that do not change what a verdict says (threads, workers, the subsets' seed, whether ICA rows are
#: added, how many default markers are shown); every other setting away from its default makes a report uncalibrated.
NEUTRAL_REPORT_SETTINGS = frozenset({"seed", "blas_threads", "lpd_jobs", "lpd_threads", "ica", "n_markers"})
#: How far a report's numeric settings may be from a regime's and still count as calibrated by it: the largest
#: ratio either way. Every other setting must match exactly.
TOLERANCE = {"n_latent": 2.0, "n_heldout_cells": 2.0, "n_genes": 4.0, "n_seeds": 2.0}
_LABELS = {
    "n_latent": "latent dimensions",
    "n_heldout_cells": "held-out cells",
    "n_genes": "genes",
    "n_seeds": "seeds",
    "n_hidden": "hidden width",
    "n_layers": "hidden layers",
    "early_stopping": "early stopping",
    "fit_cells": "fit cells given to the report",
    "report_settings": "report settings",
}
_MODEL_DEFAULTS = {f.name: f.default for f in fields(ModelSettings)}
#: Columns of :func:`calibration_table`.
CALIBRATION_COLUMNS = (
    "scenario",
    "quantity",
    "truth",
    "replicates",
    "correct %",
    "undetermined %",
    "wrong %",
    "oracle undecided %",
    "correct % of confident",
    "adequate data",
)


@cache
def _read(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def load_calibration(path: str | Path | None = None) -> dict[str, Any]:
    """The calibration record: ``scenarios`` (description, adequate, rows with counts) and how it was made."""
    return _read(str(path or CALIBRATION_FILE))


def calibration_table(
    record: dict[str, Any], quantities: list[str] | None = None, truth: str = "theory", regime: str | None = None
) -> pd.DataFrame:
    """One row per scenario and report row: the truth and the shares of correct, undetermined and wrong verdicts.

    Parameters
    ----------
    record
        :func:`load_calibration`.
    quantities
        Keep only these report rows (default: all), in this order within a scenario.
    truth
        ``"theory"`` (the scenario's theoretical truth) or ``"oracle"`` (the truth conditioned on what the simulation's
        oracle shows the fits reached; only the scenarios that have one).
    regime
        A name in ``record["regimes"]`` (e.g. :attr:`RegimeChoice.name`): that regime's rows instead, against its oracle
        (``truth`` is then ignored); ``correct %`` and ``wrong %`` are shares of all its verdicts, as for the scenarios.

    """
    if regime is not None:
        entry = _regime(record, regime)
        rows = _rate_rows(regime, entry["rows"], quantities, bool(entry.get("adequate", True)), _regime_truth(entry))
    else:
        rows = [
            row
            for scenario, entry in record["scenarios"].items()
            for row in _rate_rows(
                scenario, entry.get("rows" if truth == "theory" else "oracle_rows") or {}, quantities, entry["adequate"]
            )
        ]
    return pd.DataFrame(rows, columns=list(CALIBRATION_COLUMNS))


def _rate_rows(
    scenario: str, counts: dict[str, Any], quantities: list[str] | None, adequate: bool, truth: str | None = None
) -> list[dict[str, Any]]:
    """The table's rows of one scenario or regime (``truth``: the regime's, else each row's own)."""
    names = list(counts) if quantities is None else [q for q in quantities if q in counts]
    return [
        {
            "scenario": scenario,
            "quantity": quantity,
            "truth": counts[quantity]["truth"] if truth is None else truth,
            "replicates": (n := counts[quantity]["runs"]),
            "correct %": 100.0 * counts[quantity]["correct"] / n,
            "undetermined %": 100.0 * counts[quantity]["undetermined"] / n,
            "wrong %": 100.0 * counts[quantity]["wrong"] / n,
            # regimes only: runs where the oracle itself was undetermined, which score neither way
            "oracle undecided %": 100.0 * counts[quantity].get("oracle_undecided", 0) / n,
            "correct % of confident": _share(counts[quantity]["correct"], counts[quantity]["wrong"]),
            "adequate data": bool(adequate),
        }
        for quantity in names
    ]


def _share(correct: int, wrong: int) -> float:
    return 100.0 * correct / (correct + wrong) if correct + wrong else math.nan


def calibration_sentences(
    record: dict[str, Any], quantities: list[str] | None = None, regime: str | None = None
) -> list[str]:
    """One plain sentence per report row that falls short anywhere in the calibration suite.

    With ``regime``, the rows falling short in that regime instead: fewer than :data:`GOAL_CORRECT` of their confident
    verdicts confirmed by the oracle, or undetermined in more than :data:`GOAL_UNDETERMINED` of the replicates.

    A row falls short in a scenario with adequate data when right in fewer than :data:`GOAL_CORRECT` of the replicates,
    and in a scenario with too few cells when it gives any wrong verdict (there "undetermined" is the right answer
    whenever the truth is not reached).
    """
    if regime is not None:
        return _regime_sentences(record, regime, quantities)
    table = calibration_table(record, quantities)
    scenarios = record["scenarios"]
    clauses: dict[str, list[str]] = {}
    for r in table.to_dict("records"):
        entry = scenarios[r["scenario"]]
        adequate = r["adequate data"]
        if (adequate and r["correct %"] >= 100 * GOAL_CORRECT) or (not adequate and r["wrong %"] == 0):
            continue
        shares = [f"wrong in {r['wrong %']:.1f}%" if r["wrong %"] else ""]
        if adequate and r["undetermined %"]:
            shares.append(f"undetermined in {r['undetermined %']:.1f}%")
        note = entry.get("notes", {}).get(r["quantity"], "")
        clauses.setdefault(r["quantity"], []).append(
            f"on {entry['description']} it was {' and '.join(s for s in shares if s)} of {r['replicates']} "
            f"replicates (truth: {r['truth']})" + (f", {note}" if note else "")
        )
    return [f"{quantity}: {'; '.join(parts)}." for quantity, parts in clauses.items()]


def calibration_summary(record: dict[str, Any], regime: str | None = None) -> str:
    """Where the numbers come from: the command, the date and the number of replicates (of ``regime`` if given)."""
    if regime is not None:
        entry = _regime(record, regime)
        return (
            f"Measured by `{entry['command']}` ({entry['written']}): {entry['replicates']} replicates of "
            f"{entry['description']}. A confident verdict is correct when it is {_regime_truth(entry)} (the oracle), "
            "wrong when that is another confident verdict; verdicts where the oracle is itself undetermined are not "
            "scored. "
            f"Goal: at least {100 * GOAL_CORRECT:g}% of confident verdicts correct on every row."
        )
    return (
        f"Measured by `{record['command']}` ({record['written']}): {record['replicates']} replicates per scenario "
        f"of simulated data ({record['data']}). A verdict is correct when it is the scenario's truth, wrong when it "
        "is another decision, undetermined otherwise (not counted as wrong, but against the goal where the data "
        f"are adequate). Goal: at least {100 * GOAL_CORRECT:g}% correct in every scenario."
    )


# ----- regimes ------------------------------------------------------------------------------------------
def report_configuration(
    decoder: str | None,
    n_latent: int,
    n_heldout_cells: int,
    n_genes: int,
    batch: bool,
    model: str = "countvae",
    *,
    likelihood: str | None = _MODEL_DEFAULTS["likelihood"],
    prior: str | None = _MODEL_DEFAULTS["prior"],
    dispersion: str | None = _MODEL_DEFAULTS["dispersion"],
    n_hidden: int | None = _MODEL_DEFAULTS["n_hidden"],
    n_layers: int | None = _MODEL_DEFAULTS["n_layers"],
    n_seeds: int = 3,
    early_stopping: bool | None = True,
    fit_cells: bool = True,
    report_settings: str = DEFAULT_REPORT_SETTINGS,
    data: str = "real",
) -> dict[str, Any]:
    """A report's configuration in the terms the regimes record (:data:`CONFIGURATION_KEYS`, :data:`PREFERENCE_KEYS`).

    The keyword settings default to the countvae regimes' own: countvae's default model, 3 seeds with early stopping,
    fit cells given, default report settings, real cells (``countvae diagnose`` fits 5 seeds by default, within the
    factor of 2 that :data:`TOLERANCE` allows).

    Parameters
    ----------
    decoder
        ``"linear"`` or ``"mlp"`` (``None`` when the fits do not say).
    n_latent, n_heldout_cells, n_genes
        Latent dimensions, held-out cells the report was run on, genes of the fits.
    batch
        Whether the fits have a batch covariate (more than one batch).
    model
        The package whose fits were audited: ``"countvae"`` or ``"scvi-tools"``.
    likelihood, prior, dispersion, n_hidden, n_layers
        The fits' count distribution, latent prior, dispersion, and hidden width and layers (``None``: not known).
    n_seeds
        Fits compared.
    early_stopping
        Whether the fits were trained with early stopping (``None``: not recorded, as for scvi-tools fits).
    fit_cells
        Whether the report was given the fits' training cells.
    report_settings
        :data:`DEFAULT_REPORT_SETTINGS`, or the verdict-affecting settings away from their defaults
        (:func:`changed_report_settings`).
    data
        ``"real"`` or ``"simulated"`` cells (a preference between equally near regimes, not a calibration limit).

    """
    return {
        "model": model,
        "decoder": decoder,
        "n_latent": int(n_latent),
        "n_heldout_cells": int(n_heldout_cells),
        "n_genes": int(n_genes),
        "batch": bool(batch),
        "likelihood": likelihood,
        "prior": prior,
        "dispersion": dispersion,
        "n_hidden": None if n_hidden is None else int(n_hidden),
        "n_layers": None if n_layers is None else int(n_layers),
        "n_seeds": int(n_seeds),
        "early_stopping": None if early_stopping is None else bool(early_stopping),
        "fit_cells": bool(fit_cells),
        "report_settings": str(report_settings),
        "data": str(data),
    }


def changed_report_settings(settings: Any) -> str:
    """The verdict-affecting report settings away from their defaults, ``"alpha=0.45, k=30"``, or the defaults.

    ``settings``: a report settings dataclass; the settings in :data:`NEUTRAL_REPORT_SETTINGS` are left out.
    """
    changed = [
        f"{f.name}={getattr(settings, f.name)!r}"
        for f in fields(settings)
        if f.name not in NEUTRAL_REPORT_SETTINGS and getattr(settings, f.name) != f.default
    ]
    return ", ".join(changed) or DEFAULT_REPORT_SETTINGS


def _scvi_settings(model: Any) -> dict[str, Any]:
    """An scvi-tools model's likelihood, prior, dispersion and architecture, from its module and constructor."""
    import inspect

    module = getattr(model, "module", None)
    given = (getattr(model, "init_params_", None) or {}).get("non_kwargs", {})
    defaults = {
        name: p.default
        for name, p in inspect.signature(type(model).__init__).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    latent = getattr(module, "latent_distribution", None)
    return {
        "likelihood": getattr(module, "gene_likelihood", None),
        # scvi-tools' "normal" latent is the N(0, I) prior of countvae's "normal"; "ln" is a logistic normal
        "prior": {"normal": "normal", "ln": "logistic normal"}.get(latent, latent),
        "dispersion": getattr(module, "dispersion", None),
        "n_hidden": given.get("n_hidden", defaults.get("n_hidden")),
        "n_layers": given.get("n_layers", defaults.get("n_layers")),
        "early_stopping": None,  # scvi-tools does not record it on the model
    }


def configuration_of_fits(
    fits: Sequence[Any],
    n_heldout_cells: int,
    *,
    fit_cells: bool = True,
    report_settings: str = DEFAULT_REPORT_SETTINGS,
    data: str = "real",
) -> dict[str, Any]:
    """:func:`report_configuration` of fitted models: countvae's (``CountVAEFit``) or scvi-tools' (``SCVIFit``).

    Every fit's settings are read; fits that differ from the first in a setting give ``None`` for it (not a
    configuration any regime records).
    """
    described = [_fit_configuration(fit) for fit in fits]
    first = described[0]
    settings = {k: (v if all(d[k] == v for d in described) else None) for k, v in first.items()}
    return report_configuration(
        n_latent=int(fits[0].n_latent),
        n_heldout_cells=n_heldout_cells,
        n_genes=len(fits[0].var_names),
        n_seeds=len(fits),
        fit_cells=fit_cells,
        report_settings=report_settings,
        data=data,
        **settings,
    )


def _fit_configuration(fit: Any) -> dict[str, Any]:
    model, kind = getattr(fit, "model", None), getattr(fit, "kind", None)
    if kind in ("scvi", "linearscvi"):  # SCVIFit: SCVI has an MLP decoder, LinearSCVI a linear one
        n_batch = getattr(getattr(model, "summary_stats", None), "n_batch", 1)
        return {
            "decoder": "mlp" if kind == "scvi" else "linear",
            "batch": n_batch > 1,
            "model": "scvi-tools",
            **_scvi_settings(model),
        }
    settings, registry = getattr(model, "settings", None), getattr(model, "registry", None)
    return {
        "decoder": getattr(settings, "decoder", None),
        "batch": getattr(registry, "n_batches", 1) > 1,
        "model": "countvae",
        **{key: getattr(settings, key, None) for key in ("likelihood", "prior", "dispersion", "n_hidden", "n_layers")},
        "early_stopping": (getattr(model, "training_summary", None) or {}).get("early_stopping"),
    }


@dataclass(frozen=True)
class RegimeChoice:
    """The regime nearest to a report's configuration, and whether the report is within its calibrated range.

    Attributes
    ----------
    name
        The nearest regime (``None`` when the record has none).
    calibrated
        Whether every setting is within :data:`TOLERANCE` of the regime's (decoder and batch equal).
    differences
        One clause per setting outside the range, e.g. ``"decoder mlp (calibrated: linear)"``.
    configuration
        The report's configuration.

    """

    name: str | None
    calibrated: bool
    differences: list[str] = field(default_factory=list)
    configuration: dict[str, Any] = field(default_factory=dict)


def _regimes(record: dict[str, Any]) -> dict[str, Any]:
    return record.get("regimes") or {}


def _regime(record: dict[str, Any], name: str) -> dict[str, Any]:
    regimes = _regimes(record)
    if name not in regimes:
        raise KeyError(f"No calibration regime {name!r}; the record has {sorted(regimes)}.")
    return regimes[name]


def _differences(configuration: dict[str, Any], regime: dict[str, Any]) -> tuple[float, float, list[str]]:
    """A distance (exact settings 10, numeric ones ``|log2 ratio|``), preferences missed, settings out of range."""
    distance, out = 0.0, []
    for key in CONFIGURATION_KEYS:
        mine, theirs = configuration.get(key, _RECORDED_BEFORE.get(key)), regime.get(key, _RECORDED_BEFORE.get(key))
        if key in TOLERANCE:
            ratio = max(mine, theirs) / max(min(mine, theirs), 1)
            distance += abs(math.log2(ratio))
            if ratio > TOLERANCE[key]:
                out.append(f"{_LABELS[key]} {mine:,} (calibrated: {theirs:,})")
        elif mine != theirs:
            distance += 10.0
            out.append(f"{_LABELS.get(key, key)} {_shown(mine)} (calibrated: {_shown(theirs)})")
    missed = sum(configuration.get(key) != regime.get(key) for key in PREFERENCE_KEYS)
    return distance, float(missed), out


def _shown(value: Any) -> str:
    return "not recorded" if value is None else str(value)


def nearest_regime(record: dict[str, Any], configuration: dict[str, Any]) -> RegimeChoice:
    """The regime of ``record["regimes"]`` nearest to ``configuration`` (:func:`report_configuration`).

    Nearest: the smallest distance, where each mismatched exact setting (package, decoder, likelihood, batch, ...)
    counts 10 and each numeric one ``|log2 ratio|`` (so a mismatched decoder or batch outweighs any size difference
    below a factor of about 2^10 per setting); among equally near regimes, the one whose data are of the report's
    kind (:data:`PREFERENCE_KEYS`: real or simulated cells), then the regime recorded first.
    """
    missing = [k for k in CONFIGURATION_KEYS if k not in configuration and k not in _RECORDED_BEFORE]
    if missing:
        raise KeyError(f"The configuration lacks {missing}; build it with report_configuration().")
    scored = [(*_differences(configuration, entry["configuration"]), name) for name, entry in _regimes(record).items()]
    if not scored:
        return RegimeChoice(None, False, ["no regime is recorded"], dict(configuration))
    _, _, differences, name = min(scored, key=lambda t: (t[0], t[1]))
    return RegimeChoice(name, not differences, differences, dict(configuration))


def regime_sentence(record: dict[str, Any], choice: RegimeChoice) -> str:
    """Which regime's rates the report shows, or plainly that its configuration is not calibrated."""
    c = choice.configuration
    mine = (
        f"{c.get('model', 'countvae')} fits, {c.get('decoder') or 'unknown'} decoder, "
        f"{c.get('likelihood') or 'unknown'} likelihood, {c.get('n_latent')} latent dimensions, "
        f"{c.get('n_heldout_cells', 0):,} held-out cells, {c.get('n_genes', 0):,} genes, "
        f"{'with' if c.get('batch') else 'without'} batch, {c.get('n_seeds', '?')} seeds, "
        f"{c.get('data', 'real')} cells"
    )
    if choice.name is None:
        return f"This report's configuration ({mine}) is not calibrated: the calibration record has no regimes."
    entry = _regime(record, choice.name)
    if choice.calibrated:
        return (
            f"Calibrated in the regime '{choice.name}' ({entry['description']}), the nearest to this report's "
            f"configuration ({mine})."
        )
    return (
        f"This report's configuration ({mine}) is not calibrated: the nearest calibrated regime, '{choice.name}' "
        f"({entry['description']}), differs in {'; '.join(choice.differences)}. Its rates are shown for reference "
        "only."
    )


def _regime_truth(entry: dict[str, Any]) -> str:
    """What a regime scores verdicts against: its ``truth`` text, else the same fits on its pool of cells."""
    if "truth" in entry:
        return entry["truth"]
    return f"the verdict of the same fits on {entry['oracle_cells']:,} independent cells of the same distribution"


def _regime_sentences(record: dict[str, Any], regime: str, quantities: list[str] | None) -> list[str]:
    entry = _regime(record, regime)
    lines = []
    for quantity, c in entry["rows"].items():
        if quantities is not None and quantity not in quantities:
            continue
        confident = c["correct"] + c["wrong"]
        short = []
        if confident and c["correct"] < GOAL_CORRECT * confident:
            verb = "was" if c["wrong"] == 1 else "were"
            short.append(f"{c['wrong']} of its {confident} confident verdicts {verb} contradicted by the oracle")
        if c["undetermined"] > GOAL_UNDETERMINED * c["runs"]:
            short.append(f"it was undetermined in {c['undetermined']} of {c['runs']} replicates")
        if short:
            lines.append(f"{quantity}: in the regime '{regime}' {' and '.join(short)}.")
    return lines
