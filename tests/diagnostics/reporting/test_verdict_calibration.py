"""The report states its own calibration: the suite's measured rates, bundled, shown in HTML and JSON."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path

import pytest

from countvae.diagnostics.reporting.verdict_calibration import (
    CALIBRATION_FILE,
    calibration_sentences,
    calibration_table,
    load_calibration,
)

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "RESULTS.md"


def _results_tables(caption: str = ": verdict counts per row against the truth") -> dict[str, dict[str, list[str]]]:
    """Scenario -> row -> its cells, from the confusion tables of RESULTS.md's calibration section."""
    text = RESULTS.read_text(encoding="utf-8")
    section = text.split("<!-- section: calibration -->", 1)[1].split("<!-- end: calibration -->", 1)[0]
    tables: dict[str, dict[str, list[str]]] = {}
    for scenario, body in re.findall(rf"Scenario \*\*([^*\n]+)\*\*{re.escape(caption)}\.\n\n(.+?)\n\n", section, re.S):
        lines = body.strip().splitlines()
        header = [c.strip() for c in lines[0].strip("|").split("|")]
        rows = {}
        for line in lines[2:]:
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = dict(zip(header, cells, strict=True))
        tables[scenario] = rows
    return tables


def test_bundled_numbers_are_those_of_the_results_section():
    """Both are written by one run of ``calibration.py``; a hand edit or a stale copy of either fails here."""
    assert CALIBRATION_FILE.is_file()
    record = load_calibration()
    for key, caption in (
        ("rows", ": verdict counts per row against the truth"),
        ("oracle_rows", ", truth conditioned on the oracle"),
    ):
        results = _results_tables(caption)
        bundled = {scenario: entry[key] for scenario, entry in record["scenarios"].items() if key in entry}
        assert set(results) == set(bundled), key
        for scenario, rows in bundled.items():
            assert set(rows) == set(results[scenario]), scenario
            for row, counts in rows.items():
                cells = results[scenario][row]
                assert int(cells["runs"]) == counts["runs"]
                assert int(cells["correct"]) == counts["correct"]
                assert int(cells["undetermined (not the truth)"]) == counts["undetermined"]
                assert int(cells["wrong"]) == counts["wrong"]
                assert cells["truth"] == counts["truth"]
    command = RESULTS.read_text(encoding="utf-8").split("<!-- section: calibration -->", 1)[1]
    assert f"Command: `{record['command']}`" in command


def _record() -> dict:
    def counts(correct, undetermined, wrong, truth="agree"):
        return {"truth": truth, "runs": correct + undetermined + wrong, "correct": correct} | {
            "undetermined": undetermined,
            "wrong": wrong,
        }

    return {
        "command": "python benchmarks/calibration.py",
        "written": "today",
        "replicates": 6,
        "data": "tiny",
        "scenarios": {
            "seeds": {
                "description": "seeds on Laplace sources",
                "adequate": True,
                "rows": {"decoded means": counts(5, 0, 1), "k-NN graph": counts(6, 0, 0)},
                "notes": {"decoded means": "the seeds reached different solutions"},
            },
            "few cells": {
                "description": "40 held-out cells",
                "adequate": False,
                "rows": {"decoded means": counts(2, 4, 0), "k-NN graph": counts(3, 2, 1)},
            },
        },
    }


def test_rows_short_of_the_goal_say_so_plainly_and_the_others_are_silent():
    lines = calibration_sentences(_record())
    # 5 of 6 right (83.3%) on adequate data: below 95%, said with the share wrong and the note.
    assert lines[0] == (
        "decoded means: on seeds on Laplace sources it was wrong in 16.7% of 6 replicates (truth: agree), "
        "the seeds reached different solutions."
    )
    # On too few cells, undetermined is the right answer: only a wrong verdict is reported.
    assert lines[1] == "k-NN graph: on 40 held-out cells it was wrong in 16.7% of 6 replicates (truth: agree)."
    assert len(lines) == 2
    table = calibration_table(_record(), ["k-NN graph"])
    assert table["scenario"].tolist() == ["seeds", "few cells"]
    assert table["wrong %"].tolist() == pytest.approx([0.0, 100 / 6])


def test_the_report_shows_how_often_its_verdicts_are_right(copies_report):
    record = load_calibration()
    table = copies_report.tables["calibration"]
    assert set(table["quantity"]) <= set(copies_report.invariants["quantity"])
    seeds = table[(table["scenario"] == "seeds") & (table["quantity"] == "decoded means")].iloc[0]
    counts = record["scenarios"]["seeds"]["rows"]["decoded means"]
    assert seeds["wrong %"] == pytest.approx(100 * counts["wrong"] / counts["runs"])
    html = copies_report.to_html()
    assert "How often these verdicts are right" in html
    below = copies_report.settings["calibration"]["below_goal"]
    assert below == calibration_sentences(record, copies_report.invariants["quantity"].tolist())
    assert below  # the suite has rows below 95% (seeds on Laplace sources): the report must say which
    shown = unescape(html)  # whichever way the page escapes quotes
    for line in below:
        assert line in shown
    oracle = copies_report.tables["calibration_oracle"]
    assert set(oracle["scenario"]) == {s for s, e in record["scenarios"].items() if "oracle_rows" in e}
    markdown = copies_report.to_markdown()
    assert "## How often these verdicts are right" in markdown
    assert all(f"- {line}" in markdown for line in below)
    data = copies_report.to_dict()
    assert data["settings"]["calibration"]["below_goal"] == below
    assert len(data["tables"]["calibration"]) == len(table)
