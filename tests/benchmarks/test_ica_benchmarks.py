"""The ICA benchmark scripts run end to end at smoke-test sizes and write only their own RESULTS.md sections."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import real_dataset

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _run(script: str, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(BENCH.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, str(BENCH / f"{script}.py"), "--quick", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture
def results(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# Results\n\n<!-- section: other -->\nkept as is\n<!-- end: other -->\n")
    return path


def _section(results: Path, name: str) -> str:
    text = results.read_text()
    assert "kept as is" in text
    assert text.count(f"<!-- section: {name} -->") == 1
    start = text.index(f"<!-- section: {name} -->")
    return text[start : text.index(f"<!-- end: {name} -->", start)]


def test_table2_quick(results):
    _run("ica_table2_simulated", "--results", str(results))
    body = _section(results, "ica-table2")
    assert "QUICK" in body
    for row in ("CountVAE + ICA", "CountVAE + random rotation", "SCVI + ICA", "PCA + ICA"):
        assert f"| {row}" in body


def test_gaussian_failure_quick(results):
    _run("ica_gaussian_failure", "--results", str(results))
    body = _section(results, "ica-gaussian-failure")
    assert "Gaussian x3" in body and "oracle" in body


def test_figure2_quick(results, tmp_path):
    figure = tmp_path / "figure2.png"
    _run("ica_figure2_bilipschitz", "--results", str(results), "--figure", str(figure))
    body = _section(results, "ica-figure2")
    assert "MLP slope 0" in body and figure.stat().st_size > 1000


def test_tables34_quick(results):
    real_dataset("pbmc_3tech")  # skips (or fails under CI) when the file is missing
    _run("ica_tables34_real", "--dataset", "pbmc_3tech", "--results", str(results))
    body = _section(results, "ica-tables34-pbmc_3tech")
    for row in ("Base", "PCA-whitened", "PCA + ICA", "PCA + Rand"):
        assert f"| {row}" in body


def test_table1_quick_resumes_from_saved_fits(results, tmp_path):
    real_dataset("kang2018")
    fits = tmp_path / "fits"
    first = _run("ica_table1_alignment", "--results", str(results), "--fits-dir", str(fits))
    body = _section(results, "ica-table1")
    assert "QUICK" in body
    for row in ("CountVAE (MLP decoder)", "scvi-tools SCVI", "CountVAE (linear decoder)", "scvi-tools LinearSCVI"):
        assert body.count(f"| {row} |") == 3, row  # Table 1a, Table 1b and the details
    assert "| identity | permutation | orthogonal | linear | ica | ICA efficiency per pair |" in body
    assert "reused seeds []" in first
    # A rerun reuses every saved fit and writes the same table.
    second = _run("ica_table1_alignment", "--results", str(results), "--fits-dir", str(fits))
    assert second.count("reused seeds [0, 1, 2]") == 4
    again = _section(results, "ica-table1")
    table = body[body.index("Table 1a") : body.index("Table 1b")]
    assert table == again[again.index("Table 1a") : again.index("Table 1b")]
