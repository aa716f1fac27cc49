"""Import a module of ``benchmarks/`` by its plain name, as the benchmark scripts themselves do.

Code that only the benchmarks use (and the tests that check it) lives beside the
benchmark scripts, not in the package. The folder is appended to ``sys.path``,
so it never shadows a module of the package or of the tests.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def benchmark_module(name: str) -> ModuleType:
    """The module ``benchmarks/<name>.py``, imported as ``name``."""
    if str(BENCH) not in sys.path:
        sys.path.append(str(BENCH))
    return importlib.import_module(name)
