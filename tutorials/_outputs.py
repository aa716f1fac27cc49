"""What of a notebook's outputs must be reproduced exactly, and what may change from run to run.

:func:`comparable_outputs` reduces each code cell's outputs to normalised text: figures (images) are
left out, and so are timings, progress bars, memory addresses, temporary and installation paths,
line numbers in warnings and dates. Everything else, every number printed or displayed in a table,
must match between the stored notebook and a new run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import nbformat

#: Text formats of a display that are compared (images and widget views are not).
TEXT_MIME = ("text/plain", "text/html", "text/markdown", "text/latex", "application/json")

_TIME_UNIT = r"(?:ms|us|µs|s|sec|secs|seconds?|min|mins|minutes?|h|hours?)"
_SUBSTITUTIONS = [
    # embedded images inside HTML (a figure in a report summary) are figures too
    (re.compile(r"data:image/[a-z+]+;base64,[A-Za-z0-9+/=\s]+"), "data:image;base64,<figure>"),
    (re.compile(r"0x[0-9a-fA-F]{6,}"), "0x<address>"),
    # dates and clock times, then durations: "12.3 s", "4 min", "0:01:02", "3.2 it/s"
    (re.compile(r"\b\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?\b"), "<date>"),
    (re.compile(r"\b\d+(:\d{2}){1,2}(\.\d+)?\b"), "<clock>"),
    (re.compile(rf"\b\d+(\.\d+)?(e[+-]?\d+)?\s?{_TIME_UNIT}\b(?!\w)"), "<duration>"),
    (re.compile(r"\b\d+(\.\d+)?\s?(it/s|s/it)"), "<rate>"),
    # paths that depend on where the repository, the environment or a temporary folder is
    (re.compile(r"/tmp/[^\s'\"<>)]+"), "<tmp>"),
    (re.compile(r"(?:/[^\s'\"<>:]+)?/site-packages/"), "<site-packages>/"),
    (re.compile(r"\S*/countvae/(?=[\w/]+\.py)"), "<countvae>/"),
    (re.compile(r"(\.py):\d+"), r"\1:<line>"),
]
#: A progress bar line (tqdm and Lightning draw them on stderr): "42%|████      | 21/50".
_PROGRESS = re.compile(r"\d+%\|.*\|")


def normalise(text: str) -> str:
    """``text`` with every volatile part replaced by a placeholder and progress bars removed."""
    lines = []
    for line in text.replace("\r\n", "\n").split("\n"):
        line = line.rsplit("\r", 1)[-1]  # a carriage return redraws the line: keep what was drawn last
        if _PROGRESS.search(line):
            continue
        for pattern, placeholder in _SUBSTITUTIONS:
            line = pattern.sub(placeholder, line)
        lines.append(line.rstrip())
    return "\n".join(lines).strip("\n")


def _rich_text(output: nbformat.NotebookNode) -> Iterable[str]:
    data = output.get("data", {})
    # a figure must still be there, but its pixels may differ (fonts, renderer versions)
    yield from (f"{mime}: <figure>" for mime in sorted(data) if mime.startswith("image/"))
    for mime in TEXT_MIME:
        if mime in data:
            value = data[mime]
            value = "".join(value) if isinstance(value, list) else str(value)
            yield f"{mime}: {normalise(value)}"


def comparable_outputs(notebook: nbformat.NotebookNode) -> list[list[str]]:
    """Per code cell: its stdout, its stderr, then each display and error in order, as normalised text.

    Each stream is joined over the cell: the kernel may split one print into several messages, and
    stdout and stderr are flushed independently, so only each stream's whole text is stable.
    """
    cells = []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        streams = {"stdout": "", "stderr": ""}
        rich = []
        for output in cell.get("outputs", []):
            kind = output.get("output_type")
            if kind == "stream":
                streams[output.get("name", "stdout")] = streams.get(output.get("name", "stdout"), "") + output.text
            elif kind in ("execute_result", "display_data"):
                rich.extend(_rich_text(output))
            elif kind == "error":
                rich.append(f"error: {output.get('ename')}: {normalise(output.get('evalue', ''))}")
        texts = [f"{name}: {normalise(text)}" for name, text in streams.items() if normalise(text)]
        cells.append(texts + rich)
    return cells


def differences(stored: nbformat.NotebookNode, fresh: nbformat.NotebookNode) -> list[str]:
    """Human-readable differences between the comparable outputs of two runs of one notebook (empty: same)."""
    a, b = comparable_outputs(stored), comparable_outputs(fresh)
    if len(a) != len(b):
        return [f"the notebooks have {len(a)} and {len(b)} code cells"]
    problems = []
    for number, (old, new) in enumerate(zip(a, b, strict=True), start=1):
        if old != new:
            problems.append(f"code cell {number}:\n  stored: {old!r}\n  now:    {new!r}")
    return problems
