"""The report picks the calibration regime nearest to its own configuration, or says it is not calibrated."""

from __future__ import annotations

import pytest

from countvae.diagnostics import CountVAEFit
from countvae.diagnostics.reporting.verdict_calibration import (
    calibration_sentences,
    calibration_summary,
    calibration_table,
    configuration_of_fits,
    nearest_regime,
    regime_sentence,
    report_configuration,
)


def _counts(correct: int, wrong: int, undetermined: int, oracle_undecided: int = 0) -> dict:
    runs = correct + wrong + undetermined + oracle_undecided
    return {"runs": runs, "correct": correct, "wrong": wrong, "undetermined": undetermined} | {
        "oracle_undecided": oracle_undecided
    }


def _record(regimes: bool = True) -> dict:
    record = {"command": "c", "written": "w", "replicates": 1, "data": "d", "scenarios": {}}
    if regimes:
        record["regimes"] = {
            "linear-toy": {
                "description": "simulated linear NB data",
                "configuration": report_configuration("linear", 3, 1000, 300, False),
                "command": "python benchmarks/calibration.py",
                "written": "then",
                "replicates": 20,
                "oracle_cells": 4000,
                "rows": {"decoded means": _counts(20, 0, 0)},
            },
            "semi-synthetic": {
                "description": "counts from a default model fitted to Kang",
                "configuration": report_configuration("mlp", 10, 300, 500, True),
                "command": "python benchmarks/calibration_regimes.py",
                "written": "now",
                "replicates": 10,
                "oracle_cells": 4000,
                "rows": {
                    "decoded means": _counts(9, 1, 0),
                    "k-NN graph": _counts(10, 0, 0),
                    "held-out log p(x)": _counts(4, 0, 5, 1),
                },
            },
        }
    return record


def test_a_report_in_a_regime_is_calibrated_by_it():
    choice = nearest_regime(_record(), report_configuration("mlp", 10, 300, 500, True))
    assert (choice.name, choice.calibrated, choice.differences) == ("semi-synthetic", True, [])
    assert regime_sentence(_record(), choice).startswith("Calibrated in the regime 'semi-synthetic'")
    choice = nearest_regime(_record(), report_configuration("linear", 3, 800, 250, False))
    assert (choice.name, choice.calibrated) == ("linear-toy", True)


def test_settings_outside_the_range_are_named_and_the_report_says_it_is_not_calibrated():
    # 141 held-out cells: more than a factor 2 below 300; 2,000 genes: exactly the factor 4 allowed.
    choice = nearest_regime(_record(), report_configuration("mlp", 10, 141, 2000, True))
    assert choice.name == "semi-synthetic" and not choice.calibrated
    assert choice.differences == ["held-out cells 141 (calibrated: 300)"]
    sentence = regime_sentence(_record(), choice)
    assert sentence.startswith(
        "This report's configuration (countvae fits, mlp decoder, nb likelihood, 10 latent dimensions, 141 held-out "
        "cells"
    )
    assert "is not calibrated" in sentence and "held-out cells 141 (calibrated: 300)" in sentence


def test_a_mismatched_decoder_outweighs_sizes():
    choice = nearest_regime(_record(), report_configuration("linear", 10, 300, 500, True))
    assert choice.name == "semi-synthetic" and choice.differences == ["decoder linear (calibrated: mlp)"]
    choice = nearest_regime(_record(), report_configuration(None, 10, 300, 500, True))
    assert not choice.calibrated and choice.differences == ["decoder not recorded (calibrated: mlp)"]


def test_no_regime_recorded_says_so():
    choice = nearest_regime(_record(regimes=False), report_configuration("mlp", 10, 300, 500, True))
    assert choice.name is None and not choice.calibrated
    assert "has no regimes" in regime_sentence(_record(regimes=False), choice)
    with pytest.raises(KeyError, match="report_configuration"):
        nearest_regime(_record(), {"decoder": "mlp"})


def test_the_regime_table_and_sentences_count_against_the_oracle():
    table = calibration_table(_record(), ["decoded means", "held-out log p(x)"], regime="semi-synthetic")
    assert table["quantity"].tolist() == ["decoded means", "held-out log p(x)"]
    assert table["correct %"].tolist() == pytest.approx([90.0, 40.0])
    assert table["undetermined %"].tolist() == pytest.approx([0.0, 50.0])
    # the runs the oracle left undecided, so that the shares add up to 100%, and the share of confident verdicts
    assert table["oracle undecided %"].tolist() == pytest.approx([0.0, 10.0])
    assert table["correct % of confident"].tolist() == pytest.approx([90.0, 100.0])
    shares = table[["correct %", "undetermined %", "wrong %", "oracle undecided %"]].sum(axis=1)
    assert shares.tolist() == pytest.approx([100.0, 100.0])
    assert table["truth"].iloc[0] == "the verdict of the same fits on 4,000 independent cells of the same distribution"
    lines = calibration_sentences(_record(), regime="semi-synthetic")
    assert lines == [
        "decoded means: in the regime 'semi-synthetic' 1 of its 10 confident verdicts was contradicted by the oracle.",
        "held-out log p(x): in the regime 'semi-synthetic' it was undetermined in 5 of 10 replicates.",
    ]
    assert calibration_sentences(_record(), ["k-NN graph"], regime="semi-synthetic") == []
    two_wrong = _record()
    two_wrong["regimes"]["semi-synthetic"]["rows"]["decoded means"] = _counts(8, 2, 0)
    assert calibration_sentences(two_wrong, ["decoded means"], regime="semi-synthetic") == [
        "decoded means: in the regime 'semi-synthetic' 2 of its 10 confident verdicts were contradicted by the oracle."
    ]
    assert "10 replicates of counts from a default model" in calibration_summary(_record(), "semi-synthetic")
    with pytest.raises(KeyError, match="No calibration regime"):
        calibration_table(_record(), regime="scvi")


def test_configuration_of_real_fits(trained_linear, trained_mlp):
    configuration = configuration_of_fits([CountVAEFit(trained_linear, 0)], 240)
    assert configuration == {"model": "countvae", "decoder": "linear", "n_latent": 2, "n_heldout_cells": 240} | {
        "n_genes": 60,
        "batch": True,
        "likelihood": "nb",
        "prior": "normal",
        "dispersion": "gene",
        "n_hidden": 128,
        "n_layers": 1,
        "n_seeds": 1,
        "early_stopping": True,
        "fit_cells": True,
        "report_settings": "defaults",
        "data": "real",
    }
    # fits that differ in a setting leave it unknown, which no regime records
    mixed = configuration_of_fits([CountVAEFit(trained_linear, 0), CountVAEFit(trained_mlp, 1)], 240)
    assert mixed["likelihood"] is None and mixed["n_hidden"] is None and mixed["n_seeds"] == 2


def test_settings_no_regime_measured_make_a_report_uncalibrated():
    # Only the package, decoder, sizes and batch were compared: ZINB, Poisson, other priors and architectures,
    # any number of seeds, no early stopping, no fit cells and changed report settings all read "Calibrated".
    cases = {
        "likelihood": ("zinb", "likelihood zinb (calibrated: nb)"),
        "prior": ("laplace", "prior laplace (calibrated: normal)"),
        "dispersion": ("gene-batch", "dispersion gene-batch (calibrated: gene)"),
        "n_hidden": (512, "hidden width 512 (calibrated: 128)"),
        "n_layers": (3, "hidden layers 3 (calibrated: 1)"),
        "n_seeds": (7, "seeds 7 (calibrated: 3)"),
        "early_stopping": (False, "early stopping False (calibrated: True)"),
        "fit_cells": (False, "fit cells given to the report False (calibrated: True)"),
        "report_settings": ("alpha=0.45", "report settings alpha=0.45 (calibrated: defaults)"),
    }
    for key, (value, clause) in cases.items():
        choice = nearest_regime(_record(), report_configuration("mlp", 10, 300, 500, True, **{key: value}))
        assert (choice.name, choice.calibrated, choice.differences) == ("semi-synthetic", False, [clause]), key
    # seeds are a size: diagnose's default 5 (and 2) are within the factor 2 of the regimes' 3
    for seeds in (2, 5, 6):
        assert nearest_regime(_record(), report_configuration("mlp", 10, 300, 500, True, n_seeds=seeds)).calibrated
    unknown = nearest_regime(_record(), report_configuration("mlp", 10, 300, 500, True, early_stopping=None))
    assert unknown.differences == ["early stopping not recorded (calibrated: True)"]


def test_real_cells_prefer_the_regime_of_real_cells_among_equally_near_ones():
    # semi-synthetic and kang-small-300 record the same settings; ties went to the first recorded, so real cells
    # were shown the simulated regime's rates.
    record = _record()
    simulated = record["regimes"]["semi-synthetic"]
    simulated["configuration"] = report_configuration("mlp", 10, 300, 500, True, data="simulated")
    record["regimes"]["kang-small-300"] = simulated | {"configuration": report_configuration("mlp", 10, 300, 500, True)}
    real = nearest_regime(record, report_configuration("mlp", 10, 300, 500, True))
    assert (real.name, real.calibrated) == ("kang-small-300", True)
    sim = nearest_regime(record, report_configuration("mlp", 10, 300, 500, True, data="simulated"))
    assert (sim.name, sim.calibrated) == ("semi-synthetic", True)
    # a preference, not a limit: a size nearer by any margin still wins, and the kind is not a difference
    record["regimes"]["kang-small-300"]["configuration"]["n_heldout_cells"] = 350
    assert nearest_regime(record, report_configuration("mlp", 10, 300, 500, True)).name == "semi-synthetic"
    assert nearest_regime(record, report_configuration("mlp", 10, 300, 500, True)).calibrated


def test_changed_report_settings_names_the_verdict_affecting_ones():
    from countvae.diagnostics.reporting.settings import ReportSettings
    from countvae.diagnostics.reporting.verdict_calibration import changed_report_settings

    assert changed_report_settings(ReportSettings()) == "defaults"
    assert changed_report_settings(ReportSettings(seed=5, ica=False, lpd_threads=2)) == "defaults"
    assert changed_report_settings(ReportSettings(alpha=0.45, n_bootstrap=50)) == "alpha=0.45, n_bootstrap=50"


def test_the_package_must_match_and_regimes_recorded_before_it_are_countvaes():
    record = _record()
    # The regimes of _record() predate the "model" key: they count as countvae's fits.
    for entry in record["regimes"].values():
        del entry["configuration"]["model"]
    assert nearest_regime(record, report_configuration("mlp", 10, 300, 500, True)).calibrated
    choice = nearest_regime(record, report_configuration("mlp", 10, 300, 500, True, model="scvi-tools"))
    assert choice.name == "semi-synthetic" and not choice.calibrated
    assert choice.differences == ["model scvi-tools (calibrated: countvae)"]
    record["regimes"]["scvi"] = {
        **record["regimes"]["semi-synthetic"],
        "configuration": report_configuration("mlp", 10, 300, 500, True, model="scvi-tools"),
    }
    choice = nearest_regime(record, report_configuration("mlp", 10, 250, 500, True, model="scvi-tools"))
    assert (choice.name, choice.calibrated) == ("scvi", True)
    assert nearest_regime(record, report_configuration("mlp", 10, 250, 500, True)).name == "semi-synthetic"


def test_bundled_regimes_are_those_of_the_results_section():
    """Both are written by one run of ``calibration_regimes.py --summarize``; a stale copy of either fails here."""
    import re
    from pathlib import Path

    from countvae.diagnostics.reporting.verdict_calibration import load_calibration

    results = (Path(__file__).resolve().parents[3] / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")

    def results_section(name: str) -> str:
        return results.split(f"<!-- section: {name} -->", 1)[1].split(f"<!-- end: {name} -->", 1)[0]

    record = load_calibration()
    regimes = record.get("regimes", {})
    assert {"semi-synthetic", "kang-small-140", "kang-small-300", "linear-toy"} <= set(regimes)
    assert "linear toy" not in regimes  # the seeds scenario's old oracle, replaced by the linear-toy regime
    for name, entry in regimes.items():
        section = results_section(entry.get("section", "calibration-regimes"))
        assert f"Command: `{entry['command']}`" in section
        body = re.search(rf"### Regime \*\*{re.escape(name)}\*\*.*?\n\n.*?\n\n(\|.+?)\n\n", section, re.S).group(1)
        lines = body.strip().splitlines()
        header = [c.strip() for c in lines[0].strip("|").split("|")]
        table = {}
        for line in lines[2:]:
            cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
            table[cells["row"]] = cells
        assert set(table) == set(entry["rows"])
        for row, counts in entry["rows"].items():
            cells = table[row]
            assert int(cells["replicates"]) == counts["runs"]
            assert int(cells["correct"]) == counts["correct"]
            assert int(cells["wrong"]) == counts["wrong"]
            assert int(cells["undetermined"]) == counts["undetermined"]
            assert int(cells["oracle undecided"]) == counts["oracle_undecided"]


def test_the_concepts_page_shows_the_bundled_record():
    """docs/concepts/multi-seed.md tabulates the record per regime; a rerun that leaves the page stale fails here."""
    import re
    from pathlib import Path

    from countvae.diagnostics.reporting.verdict_calibration import load_calibration

    page = (Path(__file__).resolve().parents[3] / "docs" / "concepts" / "multi-seed.md").read_text(encoding="utf-8")
    row = re.compile(r"\| ([a-z0-9-]+) \| ([\d,]+) \| (\d+) \| (\d+) of (\d+) \| (\d+) of (\d+) \(.*\) \| ([a-z-]+) \|")
    shown = {}
    for line in page.splitlines():
        match = row.fullmatch(line)
        if match:
            shown[match.group(1)] = match.groups()[1:]
    regimes = load_calibration()["regimes"]
    assert set(shown) == set(regimes)
    for name, entry in regimes.items():
        rows = entry["rows"].values()
        expected = (
            f"{entry['configuration']['n_heldout_cells']:,}",
            str(entry["replicates"]),
            str(sum(r["wrong"] for r in rows)),
            str(sum(r["correct"] + r["wrong"] for r in rows)),
            str(sum(r["undetermined"] for r in rows)),
            str(sum(r["runs"] for r in rows)),
            entry["section"],
        )
        assert shown[name] == expected, name


def test_rates_exactly_at_the_goals_are_silent():
    """95% correct (19 of 20) and 20% undetermined (2 of 10) meet the goals: no sentence."""
    record = _record()
    record["regimes"]["semi-synthetic"]["rows"] = {"decoded means": _counts(19, 1, 0), "k-NN graph": _counts(8, 0, 2)}
    assert calibration_sentences(record, regime="semi-synthetic") == []
    scenario = {"truth": "agree", "runs": 20, "correct": 19, "undetermined": 1, "wrong": 0}
    record["scenarios"] = {"s": {"description": "d", "adequate": True, "rows": {"decoded means": scenario}}}
    assert calibration_sentences(record) == []


def test_nearest_regime_weighs_exact_settings_10_and_sizes_by_log2_ratio():
    """Hand distances. Linear, 10, 300, 500, no batch against linear-toy (linear, 3, 1000, 300, no batch):
    log2(10/3) + log2(1000/300) + log2(500/300) = 4.21; against semi-synthetic (mlp, ..., batch): 10 + 10 = 20."""
    assert nearest_regime(_record(), report_configuration("linear", 10, 300, 500, False)).name == "linear-toy"
    # One setting 8 times off (log2 8 = 3) is nearer than three 2.2 times off (3 x log2 2.2 = 3.41).
    record = _record()
    regime = record["regimes"]["semi-synthetic"]
    record["regimes"] = {
        "eightfold": regime | {"configuration": report_configuration("mlp", 80, 300, 500, True)},
        "three": regime | {"configuration": report_configuration("mlp", 22, 660, 1100, True)},
    }
    assert nearest_regime(record, report_configuration("mlp", 10, 300, 500, True)).name == "eightfold"
    # ties go to the regime recorded first
    record["regimes"] = {name: regime for name in ("first", "second")}
    assert nearest_regime(record, report_configuration("mlp", 10, 300, 500, True)).name == "first"


def test_the_scenario_table_keeps_each_rows_truth_and_the_order_asked():
    record = {
        "scenarios": {
            "s": {
                "adequate": True,
                "rows": {
                    "decoded means": {"truth": "differ", "runs": 4, "correct": 1, "undetermined": 2, "wrong": 1},
                    "k-NN graph": {"truth": "agree", "runs": 4, "correct": 4, "undetermined": 0, "wrong": 0},
                },
            }
        }
    }
    table = calibration_table(record, ["k-NN graph", "decoded means"])
    assert table["quantity"].tolist() == ["k-NN graph", "decoded means"]
    assert table["truth"].tolist() == ["agree", "differ"]
    assert table.iloc[1][["correct %", "undetermined %", "wrong %"]].tolist() == pytest.approx([25.0, 50.0, 25.0])


def test_the_oracle_table_reads_the_oracle_rows():
    rows = {"decoded means": {"truth": "agree", "runs": 2, "correct": 2, "undetermined": 0, "wrong": 0}}
    oracle = {"decoded means": {"truth": "differ", "runs": 2, "correct": 0, "undetermined": 0, "wrong": 2}}
    record = {"scenarios": {"s": {"adequate": True, "rows": rows, "oracle_rows": oracle}, "t": {"adequate": True}}}
    table = calibration_table(record, truth="oracle")
    assert table["scenario"].tolist() == ["s"] and table["wrong %"].tolist() == [100.0]
