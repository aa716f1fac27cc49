"""bench_report.py runs end to end in --quick mode and writes only its own RESULTS.md section."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_bench_report_scale_quick(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_report_under_test", BENCH / "bench_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\n<!-- section: other -->\nkept as is\n<!-- end: other -->\n")
    assert module.main(["scale", "--quick", "--results", str(results)]) == 0
    text = results.read_text()
    assert "kept as is" in text
    body = text[text.index("<!-- section: report-scale -->") : text.index("<!-- end: report-scale -->")]
    assert "QUICK" in body and "Command:" in body and "report() total" in body and "peak" in body
