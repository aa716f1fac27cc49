"""Turning results into text and JSON: numbers, Markdown tables and JSON-ready values, one way each."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import torch

#: Shown for a missing or non-finite number.
MISSING = "–"


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, singular for 1 and plural otherwise: ``1 epoch``, ``2,000 epochs``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def format_value(value: Any) -> str:
    """A value as a short string: 4 significant digits, ``yes``/``no`` for booleans, :data:`MISSING` for NaN/None."""
    if value is None or value is pd.NA:
        return MISSING
    if isinstance(value, bool | np.bool_):
        return "yes" if value else "no"
    if isinstance(value, float | np.floating):
        v = float(value)
        return f"{v:.4g}" if math.isfinite(v) else MISSING
    if isinstance(value, list | tuple):
        return ", ".join(format_value(v) for v in value)
    return str(value)


def markdown_table(frame: pd.DataFrame, max_rows: int | None = None, note: str = "") -> str:
    """A GitHub-flavoured Markdown table of a DataFrame (its columns, not its index).

    Parameters
    ----------
    frame
        The table.
    max_rows
        Show at most this many rows; a line then says how many there are, then ``note`` (where the others are).
    note
        Text appended to the truncation line.

    """

    def cell(value: Any) -> str:
        return format_value(value).replace("|", "\\|").replace("\n", " ")

    columns = [str(c) for c in frame.columns]
    shown = frame if max_rows is None else frame.head(max_rows)
    lines = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in shown.itertuples(index=False)]
    if len(shown) < len(frame):
        lines.append(f"\n_First {len(shown)} of {len(frame)} rows{'; ' + note if note else ''}._")
    return "\n".join(lines)


def _plain(value: Any, strict: bool) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v, strict) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v, strict) for v in value]
    if isinstance(value, np.ndarray):
        return [_plain(v, strict) for v in value.tolist()]
    if isinstance(value, pd.DataFrame):
        return [_plain(r, strict) for r in value.to_dict(orient="records")]
    if isinstance(value, pd.Series):
        return {str(k): _plain(v, strict) for k, v in value.items()}
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        if strict:
            raise ValueError(f"{value} is not a finite number")
        return None
    if value is None or isinstance(value, bool | int | str):
        return value
    if value is pd.NA or value is pd.NaT:
        if strict:
            raise ValueError("a missing value (NA)")
        return None
    if strict:
        raise TypeError(f"a {type(value).__name__}")
    return str(value)


def json_ready(value: Any, strict: bool = False) -> Any:
    """A copy of ``value`` made of JSON types only (dicts, lists, str, int, float, bool, None).

    numpy and pandas values become plain ones, tables lists of records, torch dtypes their names. With
    ``strict=False`` non-finite numbers and missing values become ``None`` and other objects their ``str``; with
    ``strict=True`` (records from which a run must be reproducible) they raise ``ValueError`` or ``TypeError``.
    """
    return _plain(value, strict)
