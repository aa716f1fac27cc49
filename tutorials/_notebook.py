"""Shared by the ``make_*.py`` scripts: turn a list of cells into a tutorial notebook with empty outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from countvae._io import write_text_atomic

TUTORIALS = Path(__file__).resolve().parent


def build(cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    """A notebook from ``(kind, source)`` pairs, ``kind`` being ``"md"`` or ``"code"``; outputs empty."""
    notebook = new_notebook(
        cells=[new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in cells]
    )
    for number, cell in enumerate(notebook.cells):
        cell["id"] = f"cell-{number:02d}"  # fixed ids: rebuilding a notebook changes only what its cells say
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return notebook


def write(cells: list[tuple[str, str]], name: str) -> Path:
    """Build the notebook and write it (atomically) as ``tutorials/<name>``; then run ``ruff format tutorials``."""
    out = TUTORIALS / name
    write_text_atomic(out, nbformat.writes(build(cells)), overwrite=True)
    print(f"wrote {out}")
    return out
