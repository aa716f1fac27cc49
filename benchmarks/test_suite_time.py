"""Run the whole test suite once and record whether it passed, how long it took, and where the time went.

    python benchmarks/test_suite_time.py                                  # this machine's CPU kernels
    python benchmarks/test_suite_time.py --env ATEN_CPU_CAPABILITY=default --env OPENBLAS_CORETYPE=Sandybridge

With ``--env`` the suite runs under other CPU kernels (torch's portable ones, another OpenBLAS core): the
nearest one machine comes to another processor family, and the check that the tests compare claims and
numbers within tolerances rather than the last bits of one machine. It runs ``scripts/test.sh`` (ruff, then
pytest) with a JUnit report, and writes section test-suite (or ``--section``) of RESULTS.md: the outcome,
the wall time, the machine, and the time per test file, largest first.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from _common import DEFAULT_RESULTS, REPO_ROOT, command_line, cpu_model, load_average, write_section


def per_file_seconds(junit: Path) -> tuple[dict[str, float], dict[str, int]]:
    """Seconds and outcome counts per test file from a pytest JUnit report."""
    seconds: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("classname", "").split(".")
        module = next((f"{part}.py" for part in name if part.startswith("test_")), ".".join(name))
        seconds[module] += float(case.get("time", 0.0))
        kind = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        counts[kind] += 1
    return dict(seconds), dict(counts)


def main(argv: list[str] | None = None) -> int:
    """Run the suite, then write the section."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the run (repeatable)")
    parser.add_argument("--section", default="test-suite")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--top", type=int, default=15, help="test files listed (default 15)")
    parser.add_argument("pytest_args", nargs="*", help="passed on to pytest (after --)")
    args = parser.parse_args(argv)
    env = {**os.environ, **dict(item.split("=", 1) for item in args.env)}
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        started = time.perf_counter()
        proc = subprocess.run(
            ["bash", str(REPO_ROOT / "scripts" / "test.sh"), f"--junitxml={junit}", *args.pytest_args],
            cwd=REPO_ROOT,
            env=env,
        )
        wall = time.perf_counter() - started
        seconds, counts = per_file_seconds(junit) if junit.exists() else ({}, {})
    outcome = "passed" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
    tally = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
    lines = [
        f"## The test suite: outcome and where its time goes (`test_suite_time.py`, {args.section})",
        "",
        f"Command: `{command_line()}`; environment `{' '.join(args.env) or 'as the machine sets it'}`; "
        f"{cpu_model()}, {os.cpu_count()} cores, load average {load_average()} at the end.",
        "",
        f"**{outcome}**: {tally}; wall time {wall / 60:.1f} min (ruff and pytest, as `scripts/test.sh` runs them).",
        "",
        "| test file | seconds | share |",
        "|---|---|---|",
    ]
    total = sum(seconds.values()) or 1.0
    for name, value in sorted(seconds.items(), key=lambda kv: -kv[1])[: args.top]:
        lines.append(f"| {name} | {value:.0f} | {value / total:.0%} |")
    rest = sorted(seconds.values(), reverse=True)[args.top :]
    if rest:
        lines.append(f"| {len(rest)} other files | {sum(rest):.0f} | {sum(rest) / total:.0%} |")
    write_section(args.results, args.section, "\n".join(lines))
    print("\n".join(lines))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
