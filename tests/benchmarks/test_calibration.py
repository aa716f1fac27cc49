"""The calibration suite of the report's verdicts (``benchmarks/calibration.py``), reduced to what a test can afford.

The full suite (RESULTS.md, section calibration) replicates every scenario on
larger data. Here one replicate of the scenarios whose truth does not depend on
the seeds converging (exact copies of one fit, on all held-out cells and on 40
of them, and an under-trained fit against two copies) runs on tiny data, and
the counting of verdicts against the truth is checked on a hand-made table.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _calibration():
    spec = importlib.util.spec_from_file_location("calibration_under_test", BENCH / "calibration.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


calibration = _calibration()


def test_confusion_counts_correct_undetermined_and_wrong():
    runs = pd.DataFrame(
        {
            "scenario": ["different"] * 4 + ["gaussian"] * 2,
            "replicate": [0, 1, 0, 1, 0, 1],
            "row": ["held-out log p(x)"] * 2 + ["decoded means"] * 2 + ["ICA coordinates"] * 2,
            "verdict": ["differ", "undetermined", "agree", "differ", "undetermined", "agree"],
        }
    )
    tables = calibration.confusion(runs)
    different = tables["different"].set_index("row")
    assert different.loc["held-out log p(x)", ["correct", "undetermined (not the truth)", "wrong"]].tolist() == [
        1,
        1,
        0,
    ]
    assert different.loc["decoded means", ["correct", "undetermined (not the truth)", "wrong"]].tolist() == [1, 0, 1]
    # Where undetermined is part of the truth (ICA on Gaussian sources) it counts as correct, not as undetermined.
    gaussian = tables["gaussian"].set_index("row").loc["ICA coordinates"]
    assert (gaussian["correct"], gaussian["undetermined (not the truth)"], gaussian["wrong"]) == (1, 0, 1)
    summary = calibration.summary(tables).set_index("scenario")
    assert not any("," in name for name in calibration.TRUTH)  # --scenarios is a comma-separated list
    assert summary.loc["different", "correct %"] == pytest.approx(50.0)
    assert summary.loc["different", "wrong %"] == pytest.approx(25.0)


def test_reduced_calibration_reaches_the_known_truth():
    """Exact copies agree on every row; an under-trained fit is caught; 40 cells never give a wrong verdict."""
    cfg = replace(calibration.QUICK, n_seeds=3, epochs=30)
    runs = pd.DataFrame(calibration.run_replicate(0, cfg, scenarios=("copies", "copies on few cells", "different")))
    tables = calibration.confusion(runs)
    assert set(tables) == {"copies", "copies on few cells", "different"}
    for scenario, table in tables.items():
        assert (table["wrong"] == 0).all(), (scenario, table)
        assert (table["runs"] == 1).all(), (scenario, table)
    copies = tables["copies"].set_index("row")
    # Every row of exact copies is decided, and decided right (ICA may be undetermined on data this small), except
    # the row that needs more held-out cells than these 120 (verdicts.MIN_CELLS): undetermined, with the reason.
    # The k-NN row counts its graph's cells, which include the fit cells, so it is decided here.
    few = ["posterior predictive statistics"]
    decided = copies.drop(index=["ICA coordinates", *few])
    assert "k-NN graph" in decided.index
    assert (decided["correct"] == 1).all(), decided
    assert (copies.loc[few, "undetermined"] == 1).all(), copies.loc[few]
    reasons = runs.loc[(runs["scenario"] == "copies") & runs["row"].isin(few), "reason"]
    assert reasons.str.startswith("too few held-out cells (n = 120 <").all(), reasons
    different = tables["different"].set_index("row")
    assert (different["correct"] == 1).all(), different


def test_source_recovery_is_rotation_invariant_and_catches_a_missed_source():
    rng = np.random.default_rng(0)
    truth = rng.laplace(size=(2000, 3))
    rotation, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    rotated = truth @ rotation * 2.0 + 5.0  # another basis, scale and offset: still every source
    assert calibration.source_recovery([rotated], truth) == pytest.approx(1.0)
    noisy = truth + 0.1 * rng.normal(size=truth.shape)
    assert 0.98 < calibration.source_recovery([noisy], truth) < 1.0
    # One seed's latent space carries the first two sources and noise instead of the third: R^2 about 0.
    missed = np.column_stack([truth[:, :2], rng.normal(size=2000)]) @ rotation
    assert calibration.source_recovery([rotated, missed], truth) < 0.01


def test_recovery_is_shown_per_replicate_next_to_the_verdicts_and_scoring_ignores_it():
    runs = pd.DataFrame(
        {
            "scenario": ["seeds", "seeds", "copies", "gaussian"],
            "replicate": [0, 1, 1, 1],
            "row": ["decoded means"] * 4,
            "verdict": ["agree", "differ", "agree", "agree"],
            "recovery": [0.97, 0.5, np.nan, 0.9],
        }
    )
    table = calibration.recovery_table(runs)
    assert table[["scenario", "replicate"]].values.tolist() == [["seeds", 0], ["seeds", 1], ["gaussian", 1]]
    assert table["smallest R^2 (oracle)"].tolist() == [0.97, 0.5, 0.9]
    assert table["decoded means"].tolist() == ["agree", "differ", "agree"]
    # The theory's truth is scored for every replicate: the seeds that missed a source count as wrong.
    seeds = calibration.confusion(runs)["seeds"].set_index("row").loc["decoded means"]
    assert (seeds["runs"], seeds["correct"], seeds["wrong"]) == (2, 1, 1)


def test_rescore_applies_the_minimum_cells_rule_exactly_where_it_bites():
    """Runs made before the precondition: re-scored from the row and its held-out cells (implied by the sizes)."""
    runs = pd.DataFrame(
        {
            "scenario": ["few cells", "few cells", "few cells", "seeds", "seeds"],
            "replicate": [2, 1, 1, 2, 1],
            "row": ["posterior predictive statistics", "k-NN graph", "k-NN graph"]
            + ["posterior predictive statistics", "k-NN graph"],
            "verdict": ["differ", "agree", "differ", "agree", "differ"],
            "reason": [""] * 5,
        }
    )
    runs.loc[2, "scenario"] = "copies on few cells"
    rescored, changed = calibration.rescore(runs, calibration.Config())
    # 40 held-out cells: the PPC "differ" and the k-NN "agree" become undetermined; a k-NN "differ" stands.
    assert rescored["verdict"].tolist() == ["undetermined", "undetermined", "differ", "agree", "differ"]
    assert changed == 2
    # The cells behind each verdict: 40 on few cells; on 1,000 held-out cells the PPC row uses max_ppc_cells.
    assert rescored["n_cells"].tolist() == [40, 40, 40, 300, 1000]
    assert rescored.loc[0, "reason"].startswith("too few held-out cells (n = 40 < 150)")


def test_summarize_writes_the_bundled_record_from_the_same_tables_as_the_section(tmp_path):
    runs = pd.DataFrame(
        {
            "scenario": ["seeds", "seeds", "different"],
            "replicate": [0, 1, 0],
            "row": ["decoded means", "decoded means", "held-out log p(x)"],
            "verdict": ["agree", "differ", "differ"],
            "reason": ["", "", ""],
            "agreement": [0.95, 0.7, 2.0],
            "low": [0.94, 0.6, 1.5],
            "seconds": [1.0, 1.0, 1.0],
            "fit_seconds_per_seed": [1.0, 1.0, 1.0],
        }
    )
    csv, results, record_path = tmp_path / "runs.csv", tmp_path / "RESULTS.md", tmp_path / "calibration.json"
    runs.to_csv(csv, index=False)
    assert (
        calibration.main(["--summarize", str(csv), "--results", str(results), "--calibration-file", str(record_path)])
        == 0
    )
    record = json.loads(record_path.read_text())
    assert record["replicates"] == 2
    assert record["scenarios"]["seeds"]["rows"]["decoded means"] == {
        "truth": "agree",
        "runs": 2,
        "correct": 1,
        "undetermined": 0,
        "wrong": 1,
    }
    assert record["scenarios"]["seeds"]["adequate"] is True
    section = results.read_text()
    assert "| decoded means | agree | 1 | 0 | 1 | 0 | 2 | 1 | 0 | 1 |" in section
    assert f"Command: `{record['command']}`" in section


def test_a_smoke_run_or_some_scenarios_leave_the_bundled_record_and_its_section_alone(tmp_path, monkeypatch):
    # The documented smoke command (--quick) and --scenarios wrote the bundled record every report shows, replacing
    # the 20-replicate scenarios with the run's own (1 replicate, "100% wrong"), and the section of record.
    bundled = tmp_path / "bundled.json"
    bundled.write_text('{"kept": true}\n')
    monkeypatch.setattr(calibration, "CALIBRATION_FILE", bundled)
    runs = pd.DataFrame(
        {
            "scenario": ["seeds"],
            "replicate": [0],
            "row": ["decoded means"],
            "verdict": ["differ"],
            "reason": [""],
            "agreement": [0.7],
            "low": [0.6],
            "seconds": [1.0],
            "fit_seconds_per_seed": [1.0],
        }
    )
    csv, results = tmp_path / "runs.csv", tmp_path / "RESULTS.md"
    runs.to_csv(csv, index=False)
    for extra, section in ((["--quick"], "calibration-quick"), (["--scenarios", "seeds"], "calibration-partial")):
        assert calibration.main(["--summarize", str(csv), "--results", str(results), *extra]) == 0
        assert bundled.read_text() == '{"kept": true}\n'
        assert f"<!-- section: {section} -->" in results.read_text()
    assert "<!-- section: calibration -->" not in results.read_text()
    # a full run writes the record it names, or the bundled one
    assert calibration.main(["--summarize", str(csv), "--results", str(results)]) == 0
    assert json.loads(bundled.read_text())["scenarios"]["seeds"]["rows"]["decoded means"]["wrong"] == 1
