"""Regenerate the tutorial notebooks and store them executed, with every output and figure.

    python tutorials/build_all.py            # every notebook
    python tutorials/build_all.py 02 05      # only the notebooks whose names start with 02 or 05

For each notebook: ``make_<name>.py`` writes its cells (where there is one; ``05_quickstart.ipynb``
is edited as a notebook), ``ruff format`` formats them, and the notebook runs top to bottom in a
fresh kernel on one thread (``_execute.py``) and is written back with its outputs; the objects its
agreements compare (``checks.py``: cluster labels, gene sets) are stored in ``claims/<name>.json``. Run it after a
change that alters what the tutorials print; ``tests/tutorials/test_tutorials.py`` fails until then.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import nbformat
from _execute import ROOT, TUTORIALS, execute, strip_volatile
from checks import CHECKS, claims_path

from countvae._io import write_text_atomic


def notebooks(prefixes: list[str]) -> list:
    """The tutorial notebooks whose names start with one of ``prefixes`` (all when empty)."""
    found = sorted(TUTORIALS.glob("*.ipynb"))
    chosen = [p for p in found if not prefixes or any(p.name.startswith(x) for x in prefixes)]
    if not chosen:
        raise SystemExit(f"no notebook in {TUTORIALS} starts with {prefixes}")
    return chosen


def build(path, timeout: int) -> None:
    """Write, format, execute and store one notebook (``timeout``: seconds per cell)."""
    maker = TUTORIALS / f"make_{path.stem}.py"
    if maker.exists():
        subprocess.run([sys.executable, str(maker)], check=True, cwd=ROOT)
    subprocess.run([sys.executable, "-m", "ruff", "format", "--quiet", str(path)], check=True, cwd=ROOT)
    started = time.perf_counter()
    checks = CHECKS[path.stem]
    notebook, claims = execute(path, timeout=timeout, probe_source=checks.probe_source() if checks.agreements else None)
    write_text_atomic(path, nbformat.writes(strip_volatile(notebook)) + "\n", overwrite=True)
    if checks.agreements:
        write_text_atomic(claims_path(path), json.dumps(claims, indent=1, sort_keys=True) + "\n", overwrite=True)
    print(f"executed {path.name} in {time.perf_counter() - started:.0f} s")


def main(argv: list[str] | None = None) -> int:
    """Build the chosen notebooks, one after the other."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prefixes", nargs="*", help="name prefixes of the notebooks to build (default: all)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell at most (default 1800)")
    args = parser.parse_args(argv)
    for path in notebooks(args.prefixes):
        build(path, args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
