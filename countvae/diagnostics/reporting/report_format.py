"""The format of report.json: its name and version, its JSON Schema, and how its tables are recorded.

``report.json`` declares ``"format": "countvae-diagnostic-report"`` and an integer ``"format_version"``
(:data:`FORMAT_VERSION`). Its structure is described by a JSON Schema (draft 2020-12), ``report.schema.json`` beside
this module (:func:`report_schema`). The version changes, with the schema, whenever a reader of the previous version
could misread a file of the new one: a key removed or renamed, a value whose type or meaning changes. Adding a key that
readers may ignore does not change it.

Versions:

1. ``"format": 1``; tables as lists of records only.
2. ``"format"`` names the format and ``"format_version"`` holds the version; ``table_columns`` records each table's
   columns and dtypes, so a table without rows keeps its columns and every column its dtype when the file is read back
   (:func:`countvae.diagnostics.load_report`).

Tables are stored as lists of records (one JSON object per row; the row index
is not stored: every report table has a default ``RangeIndex``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

#: ``format`` of every report.json of a multi-seed diagnostic report.
FORMAT_NAME = "countvae-diagnostic-report"
#: ``format_version`` written by this release (see the module docstring for what each version means).
FORMAT_VERSION = 2
#: The versions this release can read.
READABLE_VERSIONS = (1, 2)
#: The JSON Schema of report.json, version :data:`FORMAT_VERSION` (package data).
SCHEMA_FILE = Path(__file__).with_name("report.schema.json")


def report_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of report.json, as a dict."""
    return json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))


def table_columns(tables: Mapping[str, pd.DataFrame]) -> dict[str, list[dict[str, str]]]:
    """Per table, its columns in order, each as ``{"name": ..., "dtype": ...}`` (the pandas dtype's name)."""
    return {
        str(name): [{"name": str(column), "dtype": str(frame[column].dtype)} for column in frame.columns]
        for name, frame in tables.items()
    }


def table_from_records(
    records: Sequence[Mapping[str, Any]], columns: Sequence[Mapping[str, str]] | None
) -> pd.DataFrame:
    """A table read back from its records and, when recorded, its columns (:func:`table_columns`).

    With ``columns`` the table has exactly those columns, in that order, with those dtypes (a missing number, stored as
    ``null``, becomes NaN again); without (format version 1) pandas infers them, and a table without rows has none.
    """
    if columns is None:
        return pd.DataFrame.from_records(list(records))
    frame = pd.DataFrame.from_records(list(records), columns=[c["name"] for c in columns])
    return frame.astype({c["name"]: c["dtype"] for c in columns})
