"""Writing a report: a self-contained HTML page, tables, inline figures, and the report folder.

Every countvae report (:class:`countvae.diagnostics.DiagnosticReport`, :class:`countvae.invariance.InvarianceReport`)
is saved the same way, as a folder holding ``report.json`` (every number, JSON-ready), ``report.md`` (tables) and
``report.html`` (one self-contained page, from a jinja2 template in the report's package, :func:`template_environment`).
This module is that shared plumbing; what a report says stays with the report.

The HTML page fetches nothing: the style sheet and the figures (base64 PNG) are inline. All text that can come from
the data (gene names, obs categories, fit names, file names) goes through :func:`escape` (in table cells, headings,
captions and key-value lists alike), so a gene named ``<script>`` shows as text.
"""

from __future__ import annotations

import base64
import functools
import html
import io
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import jinja2
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from countvae._checks import check_bool
from countvae._formatting import format_value
from countvae._io import FolderLayout, atomic_directory, refuse_foreign_entries, write_json_atomic, write_text_atomic

#: The files of a report folder, in the order :func:`write_report_folder` writes them.
REPORT_FILES = ("report.html", "report.json", "report.md")

#: What a report folder holds (every release has written these files, and only these: figures are inline).
REPORT_FOLDER = FolderLayout("a report folder", frozenset(REPORT_FILES))

#: Shown under a table cut at ``max_rows``.
ALL_ROWS_NOTE = "all rows are in report.json"

#: The style sheet every report page starts from (a report may append its own rules).
STYLE = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.8em}
h3{font-size:1.05em;margin:1.2em 0 .3em}
nav{font-size:.9em;color:#444;margin:1em 0}nav a{color:#2171b5;text-decoration:none;margin-right:.9em}
.scroll{overflow-x:auto}
table{border-collapse:collapse;font-size:.82em;margin:.6em 0}
th,td{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f0f0f0}th.num,td.num{text-align:right;font-variant-numeric:tabular-nums}.nw{white-space:nowrap}
.figrow{display:grid;grid-template-columns:repeat(auto-fit,minmax(460px,1fr));gap:1em;align-items:start}
figure{margin:1em 0}figcaption{font-size:.88em;color:#444;max-width:900px}
img{max-width:100%;height:auto}
details{margin:.8em 0}summary{cursor:pointer;color:#2171b5}
.small{font-size:.85em;color:#555}
"""


# ----- text -------------------------------------------------------------------------------------------
def escape(value: Any) -> str:
    """``str(value)`` with ``&``, ``<``, ``>`` and quotes escaped for HTML."""
    return html.escape(str(value))


def html_page(title: str, body: Iterable[str], extra_style: str = "") -> str:
    """A complete, self-contained HTML page.

    Parameters
    ----------
    title
        The page title (escaped).
    body
        HTML fragments, in order; empty ones are dropped. They are trusted: build them with the helpers here, which
        escape what they are given.
    extra_style
        CSS rules appended to :data:`STYLE`.

    """
    head = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title>",
        f"<style>{STYLE}{extra_style}</style></head><body>",
    ]
    return "\n".join(part for part in (*head, *body, "</body></html>") if part)


def _is_numeric(column: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)


def _cell(text: str, numeric: bool) -> str:
    """A table cell; numbers and short labels (``seed 0``) are kept on one line."""
    classes = [c for c, wanted in (("num", numeric), ("nw", numeric or len(text) <= 16)) if wanted]
    attribute = f' class="{" ".join(classes)}"' if classes else ""
    return f"<td{attribute}>{escape(text)}</td>"


def html_table(frame: pd.DataFrame, max_rows: int | None = 60, note: str = ALL_ROWS_NOTE) -> str:
    """A table of a DataFrame's columns (not its index), cells escaped and formatted by ``format_value``.

    Numeric columns are right-aligned. Beyond ``max_rows`` rows, only the first ``max_rows`` are shown, followed by a
    line saying so and ``note``.
    """
    numeric = [_is_numeric(frame[c]) for c in frame.columns]
    head = "".join(
        f"<th{' class=num' if num else ''}>{escape(c)}</th>" for c, num in zip(frame.columns, numeric, strict=True)
    )
    shown = frame if max_rows is None else frame.head(max_rows)
    rows = []
    for row in shown.itertuples(index=False):
        cells = "".join(_cell(format_value(v), num) for v, num in zip(row, numeric, strict=True))
        rows.append(f"<tr>{cells}</tr>")
    out = f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'
    if len(shown) < len(frame):
        out += f'<p class="small">First {len(shown)} of {len(frame)} rows; {escape(note)}.</p>'
    return out


def html_key_values(mapping: Mapping[Any, Any]) -> str:
    """A two-column table of keys and values (nested dicts shown as their ``str``)."""
    shown = {str(k): str(v) if isinstance(v, dict) else format_value(v) for k, v in mapping.items()}
    rows = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in shown.items())
    return f"<table><tbody>{rows}</tbody></table>"


# ----- templates --------------------------------------------------------------------------------------
@functools.cache
def template_environment(package: str) -> jinja2.Environment:
    """The jinja2 templates in ``package``'s ``templates/`` folder (shipped with the package).

    Autoescaped (text from the data is escaped; only what a template marks ``safe`` is not), with the
    filters ``table`` (a data frame, :func:`html_table`), ``key_values`` (a mapping, :func:`html_key_values`)
    and ``png`` (a function drawing a figure, :func:`figure_png_base64`).
    """
    env = jinja2.Environment(
        loader=jinja2.PackageLoader(package, "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["table"] = lambda frame, max_rows: jinja2.utils.markupsafe.Markup(html_table(frame, max_rows=max_rows))
    env.filters["key_values"] = lambda mapping: jinja2.utils.markupsafe.Markup(html_key_values(mapping))
    env.filters["png"] = lambda draw: figure_png_base64(draw())
    env.globals["zip"] = zip
    return env


# ----- figures ----------------------------------------------------------------------------------------
def figure_png_base64(plot: Any, dpi: int = 110) -> str:
    """Encode the figure of ``plot`` as a base64 PNG and close it.

    Parameters
    ----------
    plot
        A matplotlib ``Figure``, ``Axes``, or an array of axes (as :mod:`countvae.plotting` returns).
    dpi
        Resolution of the PNG.

    """
    first = np.asarray(plot).ravel()[0] if isinstance(plot, np.ndarray) else plot
    figure = first if isinstance(first, Figure) else first.figure
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


# ----- the folder -------------------------------------------------------------------------------------
def check_report_folder(path: str | Path, overwrite: bool) -> None:
    """Fail, before a report is rendered, where :func:`write_report_folder` would refuse ``path``.

    Raises
    ------
    InvalidArgumentError
        If ``overwrite`` is not a bool (a truthy string such as ``"no"`` must not replace a folder).
    OutputExistsError
        If ``path`` is a file or a symbolic link (whatever ``overwrite`` says), or ``overwrite`` is True and ``path``
        holds anything but a report's files, which replacing it would delete.

    """
    check_bool("overwrite", overwrite)
    refuse_foreign_entries(path, overwrite, REPORT_FOLDER)


def write_report_folder(
    path: str | Path,
    *,
    html_text: str,
    record: Mapping[str, Any],
    markdown: str,
    overwrite: bool = False,
    on_file_written: Callable[[str], None] | None = None,
) -> Path:
    """Write ``report.html``, ``report.json`` and ``report.md`` into a new folder, atomically.

    Built under a temporary name beside ``path`` and renamed into place when all three files are complete
    (:func:`countvae._io.atomic_directory`), so a reader sees the whole report or none of it.

    Parameters
    ----------
    path
        The report folder.
    html_text
        The page, e.g. from :func:`html_page`.
    record
        JSON-ready content (see :func:`countvae._formatting.json_ready`); NaN and infinities are refused.
    markdown
        The Markdown text.
    overwrite
        Replace an existing report folder; otherwise it is an error (:class:`countvae.errors.OutputExistsError`). A
        folder holding anything but :data:`REPORT_FILES`, a file or a symbolic link is refused whatever ``overwrite``
        says: the folder is replaced whole.
    on_file_written
        Called with each file's name (in the order of :data:`REPORT_FILES`) once it is complete inside the temporary
        folder, before the folder is renamed into place.

    Returns
    -------
    Path
        The folder.

    """
    path = Path(path)
    writers: dict[str, Callable[[Path], Any]] = {
        "report.html": lambda p: write_text_atomic(p, html_text),
        "report.json": lambda p: write_json_atomic(p, record),
        "report.md": lambda p: write_text_atomic(p, markdown),
    }
    with atomic_directory(path, overwrite=overwrite, layout=REPORT_FOLDER) as tmp:
        for name in REPORT_FILES:
            writers[name](tmp / name)
            if on_file_written is not None:
                on_file_written(name)
    return path
