"""Validation of scalar arguments at the boundary, with one wording for every error.

Each check returns the value as a plain Python number (numpy scalars are accepted) or raises
:class:`countvae.errors.InvalidArgumentError` naming the argument, what it must be and what it was.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

import numpy as np

from countvae.errors import InvalidArgumentError


def check_int(name: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer (not a bool) within ``[minimum, maximum]`` (either bound may be omitted)."""
    ok = isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)
    ok = ok and (minimum is None or value >= minimum) and (maximum is None or value <= maximum)
    if not ok:
        raise InvalidArgumentError(f"{name} must be {_int_range(minimum, maximum)}, got {value!r}.")
    return int(value)


def check_number(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """A finite real number (not a bool) in the interval from ``low`` to ``high`` (open ends as asked)."""
    ok = isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool | np.bool_)
    ok = ok and math.isfinite(float(value))
    if ok:
        v = float(value)
        ok = (low is None or (v > low if low_open else v >= low)) and (
            high is None or (v < high if high_open else v <= high)
        )
    if not ok:
        raise InvalidArgumentError(f"{name} must be {_interval(low, high, low_open, high_open)}, got {value!r}.")
    return float(value)


def check_bool(name: str, value: Any) -> bool:
    """``True`` or ``False`` (a numpy bool is accepted; 0, 1 and strings are not)."""
    if not isinstance(value, bool | np.bool_):
        raise InvalidArgumentError(f"{name} must be True or False, got {value!r}.")
    return bool(value)


def check_choice(name: str, value: Any, allowed: Collection[Any]) -> Any:
    """One of ``allowed``."""
    if value not in allowed:
        raise InvalidArgumentError(f"{name} must be one of {tuple(allowed)}, got {value!r}.")
    return value


def _int_range(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"an integer in [{minimum}, {maximum}]"
    if minimum == 1:
        return "a positive integer"
    if minimum is not None:
        return f"an integer >= {minimum}"
    if maximum is not None:
        return f"an integer <= {maximum}"
    return "an integer"


def _interval(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if low is None and high is None:
        return "a finite number"
    if high is None:
        return f"a number {'>' if low_open else '>='} {low:g}" if low != 0 or not low_open else "a positive number"
    if low is None:
        return f"a number {'<' if high_open else '<='} {high:g}"
    return f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
