"""Run a tutorial notebook the same way everywhere: this checkout's countvae, one thread, fixed hashing.

Used by ``build_all.py`` (to store the notebooks with their outputs) and by ``tests/tutorials/test_tutorials.py`` (to
re-run them and compare), so that both see the same numbers on CPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
from _outputs import claims_from_probe
from nbclient import NotebookClient

TUTORIALS = Path(__file__).resolve().parent
ROOT = TUTORIALS.parent
CELL_TIMEOUT_S = 900

#: The kernel's environment on top of the caller's: one BLAS/OpenMP thread (results depend on the
#: summation order), a fixed hash seed (set and dict orders of strings), figures drawn into the notebook
#: (the inline backend; a caller's MPLBACKEND=Agg would leave the notebook without figures), no progress bars.
KERNEL_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "PYTHONHASHSEED": "0",
    "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    "TQDM_DISABLE": "1",
}
#: Output types that only an interactive frontend can show; stored notebooks keep their text fallback.
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def kernel_env() -> dict[str, str]:
    """The caller's environment with :data:`KERNEL_ENV` and this checkout first on ``PYTHONPATH``."""
    env = {**os.environ, **KERNEL_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


def execute(
    path: Path, timeout: int = CELL_TIMEOUT_S, probe_source: str | None = None
) -> tuple[nbformat.NotebookNode, dict]:
    """Run the notebook at ``path`` top to bottom in ``tutorials/``; raises on the first failing cell.

    With ``probe_source`` (:meth:`_outputs.NotebookChecks.probe_source`) one more cell runs after the
    last, in the same kernel, and prints the objects the notebook's agreements compare; it is taken out
    of the returned notebook again. Returns the executed notebook and those objects (empty without a probe).
    """
    notebook = nbformat.read(path, as_version=4)
    if probe_source:
        notebook.cells.append(nbformat.v4.new_code_cell(probe_source))
    client = NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(TUTORIALS)}},
    )
    client.execute(env=kernel_env())
    if not probe_source:
        return notebook, {}
    claims = claims_from_probe(notebook)
    notebook.cells.pop()
    return notebook, claims


def strip_volatile(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop what differs on every run and means nothing on a page: widget views and their state."""
    notebook.metadata.pop("widgets", None)
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        for output in cell.get("outputs", []):
            output.get("data", {}).pop(WIDGET_MIME, None)
    return notebook
