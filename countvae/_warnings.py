"""Warnings that name the analyst's line: :func:`warn_at_caller`, through which countvae issues every warning."""

from __future__ import annotations

import inspect
import os
import sys
import warnings
from pathlib import Path

#: The package's folder, with the separator (a folder such as countvae_diagnose/ beside it is not countvae).
_PACKAGE_DIR = str(Path(__file__).resolve().parent) + os.sep

#: Packages whose wrappers call into countvae on the analyst's behalf; their frames are not the analyst's line.
WRAPPER_PACKAGES = ("torch", "sklearn")


def warn_at_caller(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` attributed to the first frame outside countvae: the analyst's own line.

    A fixed ``stacklevel`` is right for one call path only: reached through a method or a wrapper, the warning would
    point into countvae, or past the analyst's line. Frames of ``WRAPPER_PACKAGES`` are skipped too: their decorators
    and mixins sit between the analyst's call and countvae's code (torch's ``no_grad`` around a method, scikit-learn's
    ``fit_transform`` calling ``fit``). Python 3.12's ``skip_file_prefixes`` does this; the package supports 3.11.
    """
    skipped = (_PACKAGE_DIR, *(_package_dir(name) for name in WRAPPER_PACKAGES if name in sys.modules))
    level, frame = 2, inspect.currentframe().f_back
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(skipped):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def _package_dir(name: str) -> str:
    """The folder of an imported package, by name, with the separator."""
    return str(Path(sys.modules[name].__file__).resolve().parent) + os.sep
