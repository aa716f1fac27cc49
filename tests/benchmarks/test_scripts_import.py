"""Every benchmark script imports against the current package (a script that cannot is a RESULTS.md section nobody can
reproduce: bench_training_cells.py once imported a name the package had removed, and failed even on ``--help``)."""

from __future__ import annotations

import pytest
from bench_modules import BENCH, benchmark_module

SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py"))


def test_the_benchmarks_folder_holds_the_scripts():
    assert len(SCRIPTS) > 40 and "calibration" in SCRIPTS and "bench_training_cells" in SCRIPTS


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_benchmark_script_imports(name):
    module = benchmark_module(name)
    assert module.__file__.endswith(f"{name}.py")
