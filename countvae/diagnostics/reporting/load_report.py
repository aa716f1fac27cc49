"""``load_report(path)``: a saved multi-seed report (report.json) read back into a :class:`DiagnosticReport`.

The inverse of :meth:`DiagnosticReport.save` for everything ``report.json`` holds (format: :mod:`.report_format`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from jsonschema import Draft202012Validator, ValidationError

from countvae.diagnostics.reporting.diagnostic_report import DiagnosticReport
from countvae.diagnostics.reporting.downstream_section import DownstreamSection
from countvae.diagnostics.reporting.report_format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    READABLE_VERSIONS,
    report_schema,
    table_from_records,
)
from countvae.errors import ReportFileError

#: The file of a report folder that :func:`load_report` reads.
REPORT_JSON = "report.json"
#: Keys every readable report.json has, with the JSON type each must be.
_REQUIRED = {
    "headline": list,
    "tables": dict,
    "settings": dict,
    "subsampling": dict,
    "provenance": dict,
    "timings_seconds": dict,
}
_DOWNSTREAM_TABLES = ("summary", "pairs", "de_per_fit")


def load_report(path: str | Path) -> DiagnosticReport:
    """Read a saved multi-seed report back into a :class:`~countvae.diagnostics.DiagnosticReport`.

    The tables, headline, settings (verdicts and the predictive-equivalence decision included), subsampling,
    provenance, timings and the downstream section come back as saved: ``load_report(p).to_dict()`` equals the saved
    report's ``to_dict()`` and ``summary()`` is the same text. What JSON cannot hold comes back in its JSON form:

    * a non-finite number (NaN, infinity) in a table is NaN (saved as ``null``);
    * a tuple or array inside a table cell or a setting is a list, a numpy scalar a Python number, and a setting that
      was an object other than a dict, list, number or string is its ``str``;
    * figures are not stored in report.json: :meth:`~DiagnosticReport.to_html` redraws them from the tables.

    Each table has the columns and dtypes it was saved with (files of format version 1, which did not record them, get
    the dtypes pandas infers, and a table without rows gets no columns).

    Parameters
    ----------
    path
        The report folder written by :meth:`~countvae.diagnostics.DiagnosticReport.save`, its ``report.json``, or
        the ``--out`` folder of ``countvae diagnose`` (whose ``report/`` holds it).

    Returns
    -------
    DiagnosticReport

    Raises
    ------
    ReportFileError
        If the file is missing, is not valid JSON, is not a countvae multi-seed diagnostic report, has a format version
        this countvae cannot read (a newer one: upgrade countvae), or does not match the JSON Schema of its version
        (:func:`~countvae.diagnostics.reporting.report_format.report_schema`: a file edited by hand or cut short), with
        where it does not.

    """
    file = _report_file(Path(path))
    record = _read_record(file)
    version = _version(record, file)
    if version == FORMAT_VERSION:
        _check_against_schema(record, file)
    else:
        _check_structure(record, file)
    columns = record.get("table_columns", {}) if version >= 2 else {}
    tables = {name: _table(name, rows, columns.get(name), file) for name, rows in record["tables"].items()}
    downstream = record.get("downstream")
    return DiagnosticReport(
        headline=list(record["headline"]),
        tables=tables,
        settings=record["settings"],
        subsampling=record["subsampling"],
        provenance=record["provenance"],
        timings=record["timings_seconds"],
        downstream=_downstream(downstream, version, file) if downstream is not None else None,
    )


def _report_file(path: Path) -> Path:
    """``path`` itself, ``path/report.json``, or ``path/report/report.json`` (``countvae diagnose --out path``)."""
    file = path / REPORT_JSON if path.is_dir() else path
    if path.is_dir() and not file.is_file() and (path / "report" / REPORT_JSON).is_file():
        file = path / "report" / REPORT_JSON
    if not file.is_file():
        raise ReportFileError(
            f"{file} does not exist. Give the folder that DiagnosticReport.save wrote (it holds {REPORT_JSON}), "
            f"the --out folder of `countvae diagnose` (its report/ holds it), or {REPORT_JSON} itself."
        )
    return file


def _read_record(file: Path) -> dict[str, Any]:
    try:
        record = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReportFileError(
            f"{file} is not valid JSON (truncated or corrupted: {exc}); save the report again."
        ) from None
    if not isinstance(record, dict) or not _declares_this_format(record):
        what = f"a {type(record).__name__}" if not isinstance(record, dict) else f"format {record.get('format')!r}"
        other = f" (it looks like another countvae report: {record['title']!r})" if _titled(record) else ""
        raise ReportFileError(
            f"{file} is not a countvae multi-seed diagnostic report ({what}){other}. load_report reads the "
            f"report.json that DiagnosticReport.save writes, which declares format {FORMAT_NAME!r}."
        )
    return record


def _declares_this_format(record: Mapping[str, Any]) -> bool:
    # version 1 declared only its number, as "format": 1
    return record.get("format") == FORMAT_NAME or (record.get("format") == 1 and "format_version" not in record)


def _titled(record: Any) -> bool:
    return isinstance(record, dict) and isinstance(record.get("title"), str)


def _version(record: Mapping[str, Any], file: Path) -> int:
    version = 1 if record.get("format") == 1 else record.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ReportFileError(
            f"{file} has an unknown format version {version!r}; this countvae reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}. The file was altered, or written by another program."
        )
    if version not in READABLE_VERSIONS:
        raise ReportFileError(
            f"{file} has format version {version}, newer than this countvae reads (up to {FORMAT_VERSION}); "
            "upgrade countvae (pip install --upgrade countvae) to read it."
        )
    return version


def _check_against_schema(record: Mapping[str, Any], file: Path) -> None:
    errors = list(Draft202012Validator(report_schema()).iter_errors(record))
    if errors:
        where = "; ".join(f"at {'/'.join(map(str, e.absolute_path)) or 'the top'}: {_short(e)}" for e in errors[:3])
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        raise ReportFileError(
            f"{file} does not match the format of report.json version {FORMAT_VERSION} (report.schema.json): "
            f"{where}{more}. The file is incomplete or was altered; save the report again."
        )


def _short(error: ValidationError) -> str:
    # jsonschema's message starts with the offending value, which can be a whole table
    if len(error.message) <= 160:
        return error.message
    return f"the value breaks the rule {error.validator!r}: {error.validator_value!r}"[:160]


def _check_structure(record: Mapping[str, Any], file: Path) -> None:
    # files of format version 1, which has no schema: the keys the reader needs, with their types
    for key, kind in _REQUIRED.items():
        if not isinstance(record.get(key), kind):
            raise ReportFileError(
                f"{file} has no {key!r} {kind.__name__} (found {type(record.get(key)).__name__}): the file is "
                "incomplete or was altered; save the report again."
            )
    if not isinstance(record.get("table_columns", {}), dict):
        raise ReportFileError(
            f"{file}: its 'table_columns' is not an object; the file was altered; save the report again."
        )
    downstream = record.get("downstream")
    if downstream is not None and not (
        isinstance(downstream, dict) and all(isinstance(downstream.get(t), list) for t in _DOWNSTREAM_TABLES)
    ):
        raise ReportFileError(f"{file}: its 'downstream' section is incomplete or was altered; save the report again.")


def _table(name: str, rows: Any, columns: Any, file: Path) -> pd.DataFrame:
    try:
        return table_from_records(rows, columns)
    except (KeyError, TypeError, ValueError) as exc:
        raise ReportFileError(
            f"{file}: table {name!r} cannot be read back ({type(exc).__name__}: {exc}); the file is corrupted or "
            "was altered; save the report again."
        ) from None


def _downstream(record: Mapping[str, Any], version: int, file: Path) -> DownstreamSection:
    columns = record.get("table_columns", {}) if version >= 2 else {}
    tables = {name: _table(f"downstream.{name}", record[name], columns.get(name), file) for name in _DOWNSTREAM_TABLES}
    return DownstreamSection(
        **tables,
        status=dict(record.get("status", {})),
        statements=list(record.get("statements", [])),
        settings=dict(record.get("settings", {})),
        timings=dict(record.get("timings_seconds", {})),
    )
