"""Do the tutorials' stored claims hold on another processor? Re-run each one under other CPU kernels.

    python benchmarks/tutorials_any_cpu.py                      # every tutorial, the default profile below
    python benchmarks/tutorials_any_cpu.py --only 05 06         # some of them
    python benchmarks/tutorials_any_cpu.py --env ATEN_CPU_CAPABILITY=avx2 --env OPENBLAS_CORETYPE=Zen

A processor of another family runs other torch and BLAS kernels, whose sums round differently; that is what
breaks a bitwise comparison of a fit. This script imitates it on one machine: the kernels' environment
(torch's ``ATEN_CPU_CAPABILITY=default`` swaps its vectorised CPU kernels for portable ones, and
``OPENBLAS_CORETYPE`` picks another OpenBLAS core) is passed to each notebook's kernel, the notebook runs top
to bottom as ``tests/tutorials/test_tutorials.py`` runs it, and its outputs and claims are compared with the stored
ones by the same rules (``tutorials/checks.py``). It writes section tutorials-any-cpu of RESULTS.md: per
tutorial, the time and what differed beyond the rules (nothing, for the claims to hold), with the
agreement of each discrete output with the stored run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import nbformat
from _common import DEFAULT_RESULTS, REPO_ROOT, command_line, cpu_model, load_average, write_section

sys.path.insert(0, str(REPO_ROOT / "tutorials"))
from _execute import execute  # noqa: E402
from _outputs import agreement_differences, agreement_score, differences  # noqa: E402
from checks import CHECKS, claims_path  # noqa: E402

#: Another CPU's kernels, as far as one machine can imitate them.
DEFAULT_PROFILE = ("ATEN_CPU_CAPABILITY=default", "OPENBLAS_CORETYPE=Sandybridge")


def compare_one(path: Path) -> dict:
    """Run one tutorial under the current environment and compare it with its stored outputs and claims."""
    checks = CHECKS[path.stem]
    started = time.perf_counter()
    fresh, claims = execute(path, probe_source=checks.probe_source() if checks.agreements else None)
    seconds = time.perf_counter() - started
    problems = differences(nbformat.read(path, as_version=4), fresh, checks)
    scores = {}
    if checks.agreements:
        stored = json.loads(claims_path(path).read_text())
        problems += agreement_differences(checks, stored, claims)
        scores = {a.name: agreement_score(a.metric, stored[a.name], claims[a.name]) for a in checks.agreements}
    return {"notebook": path.name, "seconds": seconds, "problems": problems, "agreements": scores}


def main(argv: list[str] | None = None) -> int:
    """Run the chosen tutorials under the profile and write the section."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=[], help="name prefixes of the tutorials (default: all)")
    parser.add_argument("--env", action="append", default=None, help="NAME=VALUE for the kernels (repeatable)")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--note", default="", help="a paragraph added to the section (e.g. earlier builds compared)")
    args = parser.parse_args(argv)
    profile = tuple(args.env) if args.env else DEFAULT_PROFILE
    os.environ.update(dict(item.split("=", 1) for item in profile))  # the kernels inherit this environment
    notebooks = sorted((REPO_ROOT / "tutorials").glob("*.ipynb"))
    notebooks = [p for p in notebooks if not args.only or any(p.name.startswith(x) for x in args.only)]
    rows = []
    for path in notebooks:
        row = compare_one(path)
        rows.append(row)
        verdict = "claims hold" if not row["problems"] else f"{len(row['problems'])} differences"
        print(f"{row['notebook']}: {verdict} ({row['seconds']:.0f} s)", flush=True)
        for problem in row["problems"][:10]:
            print("   ", problem[:400])
    lines = [
        "## Tutorials on other CPU kernels (`tutorials_any_cpu.py`)",
        "",
        f"Command: `{command_line()}`; kernels' environment `{' '.join(profile)}`; {cpu_model()}, "
        f"load average {load_average()} at the end.",
        "",
        "Each tutorial re-run top to bottom under that environment and compared with its stored outputs by "
        "the rules of `tutorials/checks.py` (what `tests/tutorials/test_tutorials.py` checks): words, figures and "
        "verdicts exactly, numbers within each rule's stated tolerance, discrete outputs by agreement.",
        "",
        "| tutorial | time (s) | differences beyond the rules | agreements with the stored run |",
        "|---|---|---|---|",
    ]
    if args.note:
        lines[4:4] = [args.note, ""]
    for row in rows:
        scores = "; ".join(f"{name} {score:.3f}" for name, score in row["agreements"].items()) or "-"
        shown = "none" if not row["problems"] else "<br>".join(p[:200].replace("|", "/") for p in row["problems"][:3])
        lines.append(f"| {row['notebook']} | {row['seconds']:.0f} | {shown} | {scores} |")
    if not args.no_write:
        write_section(args.results, "tutorials-any-cpu", "\n".join(lines))
    return 0 if all(not r["problems"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
