"""Warnings name the analyst's line, whatever countvae (or torch, scikit-learn) frames lie between."""

from __future__ import annotations

import warnings
from pathlib import Path

import countvae
from countvae._warnings import warn_at_caller
from countvae.errors import CountVAEWarning

PACKAGE = Path(countvae.__file__).resolve().parent


def _function_in(filename: Path, body: str):
    """A function ``f(callee)`` whose frames carry ``filename``, as if it were defined in that file."""
    namespace: dict = {"warn_at_caller": warn_at_caller, "CountVAEWarning": CountVAEWarning}
    exec(compile(f"def f(callee):\n    {body}\n", str(filename), "exec"), namespace)
    return namespace["f"]


def _warned_from(call) -> tuple[str, int]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    assert len(caught) == 1 and caught[0].category is CountVAEWarning
    return caught[0].filename, caught[0].lineno


def test_the_warning_names_the_first_line_outside_the_package():
    inner = _function_in(PACKAGE / "model" / "fake_inner.py", 'warn_at_caller("careful", CountVAEWarning)')
    outer = _function_in(PACKAGE / "fake_outer.py", "callee(None)")  # a second countvae frame in between
    filename, lineno = _warned_from(lambda: outer(inner))
    assert filename == __file__
    assert lineno == test_the_warning_names_the_first_line_outside_the_package.__code__.co_firstlineno + 3


def test_a_folder_whose_name_only_starts_like_the_package_is_the_analysts():
    # e.g. a script in countvae_diagnose/ next to the package: a prefix of the name is not the package
    analyst = PACKAGE.parent / f"{PACKAGE.name}_diagnose" / "script.py"
    inner = _function_in(PACKAGE / "fake_inner.py", 'warn_at_caller("careful", CountVAEWarning)')
    script = _function_in(analyst, "callee(None)")
    filename, _ = _warned_from(lambda: script(inner))
    assert filename == str(analyst)


def test_torch_and_sklearn_wrappers_are_skipped_too():
    import sklearn
    import torch

    inner = _function_in(PACKAGE / "fake_inner.py", 'warn_at_caller("careful", CountVAEWarning)')
    for package in (torch, sklearn):
        wrapper = _function_in(Path(package.__file__).resolve().parent / "fake_wrapper.py", "callee(None)")
        filename, _ = _warned_from(lambda wrapper=wrapper: wrapper(inner))
        assert filename == __file__
