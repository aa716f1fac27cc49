"""benchmarks/lpd_package.py: its --quick run writes the lpd-package section, and its error summary is right."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _bench_module():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("lpd_package_under_test", BENCH / "lpd_package.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def test_summarize_against_hand_computed_errors():
    bench = _bench_module()
    gold = pd.DataFrame({"lpd": [-10.0, -20.0, -30.0, -40.0]})
    frame = pd.DataFrame(
        {
            "lpd": [-9.9, -20.5, -30.0, -35.0],
            "mc_se": [0.1, 0.1, np.nan, 0.1],
            "ess": [100.0, 200.0, 300.0, 400.0],
            "reliable": [True, True, False, True],
        }
    )
    row = bench.summarize(frame, gold, gold_se=np.array([0.0, 0.0, 0.0, 0.0]))
    assert row["mean(est - gold)"] == pytest.approx((0.1 - 0.5 + 0.0 + 5.0) / 4)
    assert row["mean abs(est - gold)"] == pytest.approx((0.1 + 0.5 + 0.0 + 5.0) / 4)
    assert row["max abs(est - gold)"] == pytest.approx(5.0)
    # cell 0 is within 3 SE (0.1 <= 0.3), cell 1 is not (0.5 > 0.3), cell 2 has no SE (unreliable: outside),
    # cell 3 is far outside
    assert row["within 3 SE"] == pytest.approx(0.25)
    assert row["unreliable (k-hat>0.7)"] == pytest.approx(0.25)
    assert row["median ESS"] == pytest.approx(250.0)
    # the gold's own SE widens the band: with gold SE 1, cell 1 (|diff| 0.5 <= 3 * hypot(0.1, 1)) is inside
    wide = bench.summarize(frame, gold, gold_se=np.ones(4))
    assert wide["within 3 SE"] == pytest.approx(0.5)


def test_gold_settings_are_ten_times_the_default_draws():
    bench = _bench_module()
    assert bench.GOLD.n_draws == 10 * bench.DEFAULT.n_draws
    assert bench.GOLD.escalation_draws == 10 * bench.DEFAULT.escalation_draws
    assert bench.GOLD.n_restarts > bench.DEFAULT.n_restarts


def test_quick_run_writes_the_section(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\n<!-- section: other -->\nkept as is\n<!-- end: other -->\n")
    env = dict(os.environ, PYTHONPATH=str(BENCH.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(BENCH / "lpd_package.py"), "--quick", "--repeats", "1", "--out", str(results)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = results.read_text()
    assert "<!-- section: other -->\nkept as is\n<!-- end: other -->" in text
    section = text[text.index("<!-- section: lpd-package -->") : text.index("<!-- end: lpd-package -->")]
    assert "Not finished" not in section
    for column in ("mean(est - gold)", "mean abs(est - gold)", "within 3 SE", "unreliable (k-hat>0.7)", "median ESS"):
        assert column in section
    for row in ("package default", "guide, 1000 draws", "gold seed 2 vs seed 1"):
        assert row in section
    assert "scvi-tools SCVI.get_marginal_ll(n_mc_samples=1000)" in section
    assert "ratio to scvi (median)" in section
    assert "lpd_package.py --quick" in section
    tables = [line for line in section.splitlines() if line.startswith("|")]
    assert len(tables) >= 9
    for line in tables:  # a '|' inside a column name or cell would break the markdown table
        assert line.count("|") in (11, 8), line
