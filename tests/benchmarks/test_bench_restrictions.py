"""benchmarks/bench_restrictions.py: its summary against a known answer, and its --quick smoke run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    if str(BENCH) not in sys.path:  # the scripts import their shared module as `_common`
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_restrictions_under_test", BENCH / "bench_restrictions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_summary_is_the_median_seconds_per_epoch_and_its_ratio(bench):
    rows = [
        {"runner": "unrestricted", "seconds": 20.0, "epochs": 10},
        {"runner": "unrestricted", "seconds": 40.0, "epochs": 10},
        {"runner": "unrestricted", "seconds": 30.0, "epochs": 10},
        {"runner": "horseshoe", "seconds": 90.0, "epochs": 10},
    ]
    table = bench.summarise(rows).set_index("model")
    assert table.loc["unrestricted", "s/epoch (median)"] == 3.0 and table.loc["unrestricted", "repeats"] == 3
    assert table.loc["horseshoe", "x unrestricted"] == pytest.approx(3.0)


def test_quick_run_writes_its_section(bench, tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\n<!-- section: other -->\nkept\n<!-- end: other -->\n")
    bench.main(["--quick", "--results", str(results)])
    text = results.read_text()
    section = text[text.index("<!-- section: restrictions -->") :]
    assert "QUICK" in section and "Command:" in section and "kept" in text
    for model in ("unrestricted", "laplace", "horseshoe", "programs", "linearscvi"):
        assert f"| {model} |" in section
