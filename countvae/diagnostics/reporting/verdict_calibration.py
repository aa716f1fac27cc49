"""How often the report's verdicts are right: the calibration suite's measured rates, bundled with the package.

``benchmarks/calibration.py`` runs the whole report on simulations whose truth
is known and writes, next to its RESULTS.md section, the per-scenario and
per-row counts of correct, undetermined and wrong verdicts to
:data:`CALIBRATION_FILE` (one JSON file, written atomically). This module reads
that file and turns it into the report's section "How often these verdicts are
right": a table, and one plain sentence for every row that is right in fewer
than :data:`GOAL_CORRECT` of the replicates of a scenario.

The numbers describe the suite's simulations (linear NB data with 3 sources,
5,000 cells), not the data at hand: they say how far each row's verdict can be
trusted where its assumptions hold, and where it is known to fail.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

#: The bundled calibration record (written by ``benchmarks/calibration.py``).
CALIBRATION_FILE = Path(__file__).with_name("verdict_calibration.json")
#: Share of correct verdicts the suite aims at in every scenario.
GOAL_CORRECT = 0.95
#: Columns of :func:`calibration_table`.
CALIBRATION_COLUMNS = (
    "scenario",
    "quantity",
    "truth",
    "replicates",
    "correct %",
    "undetermined %",
    "wrong %",
    "adequate data",
)


@cache
def _read(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def load_calibration(path: str | Path | None = None) -> dict[str, Any]:
    """The calibration record: ``scenarios`` (description, adequate, rows with counts) and how it was made."""
    return _read(str(path or CALIBRATION_FILE))


def calibration_table(
    record: dict[str, Any], quantities: list[str] | None = None, truth: str = "theory"
) -> pd.DataFrame:
    """One row per scenario and report row: the truth and the shares of correct, undetermined and wrong verdicts.

    Parameters
    ----------
    record
        :func:`load_calibration`.
    quantities
        Keep only these report rows (default: all), in this order within a scenario.
    truth
        ``"theory"`` (the truth the scenario's theory states) or ``"oracle"``
        (the truth conditioned on what the simulation's oracle shows the fits
        reached; only the scenarios that have one).

    """
    rows = []
    for scenario, entry in record["scenarios"].items():
        counts = entry.get("rows" if truth == "theory" else "oracle_rows") or {}
        names = list(counts) if quantities is None else [q for q in quantities if q in counts]
        for quantity in names:
            c = counts[quantity]
            n = c["runs"]
            rows.append(
                {
                    "scenario": scenario,
                    "quantity": quantity,
                    "truth": c["truth"],
                    "replicates": n,
                    "correct %": 100.0 * c["correct"] / n,
                    "undetermined %": 100.0 * c["undetermined"] / n,
                    "wrong %": 100.0 * c["wrong"] / n,
                    "adequate data": bool(entry["adequate"]),
                }
            )
    return pd.DataFrame(rows, columns=list(CALIBRATION_COLUMNS))


def calibration_sentences(record: dict[str, Any], quantities: list[str] | None = None) -> list[str]:
    """One plain sentence per report row that falls short anywhere in the calibration suite.

    A row falls short in a scenario with adequate data when it is right in
    fewer than :data:`GOAL_CORRECT` of the replicates, and in a scenario with
    too few cells when it gives any wrong verdict (there "undetermined" is the
    right answer whenever the truth is not reached).
    """
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


def calibration_summary(record: dict[str, Any]) -> str:
    """Where the numbers come from: the command, the date and the number of replicates."""
    return (
        f"Measured by `{record['command']}` ({record['written']}): {record['replicates']} replicates per scenario "
        f"of simulated data ({record['data']}). A verdict is correct when it is the scenario's truth, wrong when it "
        "is another decision, undetermined otherwise (not counted as wrong, but against the goal where the data "
        f"are adequate). Goal: at least {100 * GOAL_CORRECT:g}% correct in every scenario."
    )
