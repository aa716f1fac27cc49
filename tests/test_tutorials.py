"""Every tutorial runs top to bottom, and the outputs stored in it are what the code produces now.

The notebooks are kept executed in the repository so that readers (on the repository and on the
documentation site) see their tables and figures. Each test re-runs one notebook the way
``tutorials/build_all.py`` stored it and compares every output except figures, timings, progress bars,
memory addresses and paths (``tutorials/_outputs.py``; its own tests are in ``test_notebook_outputs.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

TUTORIALS = Path(__file__).resolve().parent.parent / "tutorials"
sys.path.insert(0, str(TUTORIALS))
from _execute import execute  # noqa: E402
from _outputs import differences  # noqa: E402

NOTEBOOKS = sorted(TUTORIALS.glob("*.ipynb"))


def test_tutorials_exist():
    assert NOTEBOOKS, f"no notebooks found in {TUTORIALS}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_tutorial_runs_and_matches_its_stored_outputs(path):
    rebuild = f"python tutorials/build_all.py {path.name[:2]}"
    stored = nbformat.read(path, as_version=4)
    code = [c for c in stored.cells if c.cell_type == "code"]
    unexecuted = [n for n, c in enumerate(code, start=1) if c.get("execution_count") is None]
    assert not unexecuted, f"{path.name} is stored without running code cells {unexecuted}; run `{rebuild}`"
    stored_errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not stored_errors, f"{path.name} is stored with an error; fix it and run `{rebuild}`"

    fresh = execute(path)  # raises CellExecutionError on the first failing cell

    problems = differences(stored, fresh)
    assert not problems, (
        f"{path.name}: the stored outputs are not what the code produces now. If the change is intended, "
        f"run `{rebuild}` and commit the notebook.\n" + "\n".join(problems[:5])
    )
