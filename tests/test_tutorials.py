"""Every tutorial notebook runs from top to bottom without error."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

TUTORIALS = Path(__file__).resolve().parent.parent / "tutorials"
NOTEBOOKS = sorted(TUTORIALS.glob("*.ipynb"))
CELL_TIMEOUT_S = 600


def test_tutorials_exist():
    assert NOTEBOOKS, f"no notebooks found in {TUTORIALS}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_tutorial_runs(path, monkeypatch):
    # the kernel must import this checkout's countvae and draw without a display
    root = str(TUTORIALS.parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(TUTORIALS)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    errors = [
        o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"
    ]
    assert not errors
