"""Every tutorial runs top to bottom, and what it claims is what the code produces now, on any processor.

The notebooks are kept executed in the repository so that readers (on the repository and on the
documentation site) see their tables and figures. Each test re-runs one notebook the way
``tutorials/build_all.py`` stored it and compares its claims with the stored ones
(``tutorials/_outputs.py``; its own tests are in ``test_notebook_outputs.py``): every word, figure and
output exactly; every number exactly unless the notebook's rules in ``tutorials/checks.py`` give it a
tolerance, each derived from the notebook's Monte Carlo error or seed-to-seed spread and stated there;
cluster labels and gene sets by agreement (ARI, Jaccard) with the stored run above a stated bound.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest

TUTORIALS = Path(__file__).resolve().parents[2] / "tutorials"
sys.path.insert(0, str(TUTORIALS))
from _execute import execute  # noqa: E402
from _outputs import agreement_differences, differences  # noqa: E402
from checks import CHECKS, claims_path  # noqa: E402

NOTEBOOKS = sorted(TUTORIALS.glob("*.ipynb"))


def test_tutorials_exist_and_each_has_its_checks_and_stored_claims():
    assert NOTEBOOKS, f"no notebooks found in {TUTORIALS}"
    assert sorted(CHECKS) == [p.stem for p in NOTEBOOKS]
    for path in NOTEBOOKS:
        if CHECKS[path.stem].agreements:
            stored = json.loads(claims_path(path).read_text())
            assert sorted(stored) == sorted(a.name for a in CHECKS[path.stem].agreements), path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_tutorial_runs_and_matches_its_stored_outputs(path):
    rebuild = f"python tutorials/build_all.py {path.name[:2]}"
    stored = nbformat.read(path, as_version=4)
    code = [c for c in stored.cells if c.cell_type == "code"]
    unexecuted = [n for n, c in enumerate(code, start=1) if c.get("execution_count") is None]
    assert not unexecuted, f"{path.name} is stored without running code cells {unexecuted}; run `{rebuild}`"
    stored_errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not stored_errors, f"{path.name} is stored with an error; fix it and run `{rebuild}`"

    checks = CHECKS[path.stem]
    probe = checks.probe_source() if checks.agreements else None
    fresh, claims = execute(path, probe_source=probe)  # raises CellExecutionError on the first failing cell

    problems = differences(stored, fresh, checks)
    if checks.agreements:
        problems += agreement_differences(checks, json.loads(claims_path(path).read_text()), claims)
    assert not problems, (
        f"{path.name}: what the notebook claims is not what the code produces now. If the change is intended, "
        f"run `{rebuild}` and commit the notebook (and its claims file).\n" + "\n".join(problems[:8])
    )
