"""Every example in a docstring runs as written, in a fresh interpreter, and prints what it shows.

Each docstring's examples run in a process of their own that imports only what the example imports (the module that
holds the docstring is not imported first), so an example relying on an import it does not make fails here as it
would for a reader: ``cv.diagnostics.fit_seeds`` after ``import countvae as cv`` did. Outputs are compared as
doctest compares them (``ELLIPSIS``, ``NORMALIZE_WHITESPACE``). What this cannot catch: an example whose output is
not shown (a line without expected output only has to run).
"""

from __future__ import annotations

import doctest
import importlib
import json
import os
import pkgutil
import subprocess
import sys

import pytest

import countvae

RUNNER = """
import doctest, json, sys, warnings
import torch
torch.set_num_threads(1)
warnings.simplefilter("ignore")
name, text = json.loads(sys.stdin.read())
test = doctest.DocTestParser().get_doctest(text, {}, name, name, 0)
runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
runner.run(test)
sys.exit(1 if runner.failures else 0)
"""


def _docstrings_with_examples() -> list[tuple[str, str]]:
    """(qualified name, docstring) of every docstring of the package that holds examples, each once."""
    finder = doctest.DocTestFinder()
    found = []
    for info in pkgutil.walk_packages(countvae.__path__, "countvae."):
        if info.name.endswith("__main__"):  # importing it runs the command line
            continue
        for test in finder.find(importlib.import_module(info.name)):
            if test.examples and test.docstring and test.name.startswith(info.name):
                found.append((test.name, test.docstring))
    return found


EXAMPLES = _docstrings_with_examples()


def test_the_search_finds_the_packages_examples():
    names = {name for name, _ in EXAMPLES}
    assert {"countvae.model.countvae.CountVAE", "countvae.diagnostics.fitting.fit_seeds.fit_seeds"} <= names


@pytest.mark.parametrize(("name", "text"), EXAMPLES, ids=[name for name, _ in EXAMPLES])
def test_docstring_example_runs_in_a_fresh_interpreter(name, text, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps([name, text]),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,  # an example that writes files writes them here
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, f"{name}:\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}"
