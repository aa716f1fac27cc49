"""How the renderers show numbers that are stored apart: a threshold and its comparison as one text."""

from __future__ import annotations

import pandas as pd


def threshold_text(threshold: float, comparison: str) -> str:
    """A threshold as the tables show it, e.g. ``">= 0.9"`` or ``"< 2"``."""
    return f"{comparison} {float(threshold):g}"


def invariants_for_display(invariants: pd.DataFrame) -> pd.DataFrame:
    """The invariants table with ``threshold`` and ``comparison`` shown as one text column (``">= 0.9"``)."""
    out = invariants.drop(columns=["comparison"])
    out["threshold"] = [threshold_text(t, c) for t, c in zip(out["threshold"], invariants["comparison"], strict=True)]
    return out
