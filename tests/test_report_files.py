"""countvae._report_files: the page, tables and figures every report shares, and the atomic report folder."""

from __future__ import annotations

import base64
import json

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from countvae._report_files import (
    REPORT_FILES,
    escape,
    figure_png_base64,
    html_key_values,
    html_page,
    html_table,
    template_environment,
    write_report_folder,
)
from countvae.errors import InvalidArgumentError, OutputExistsError

EVIL = "<script>alert(1)</script>"


def test_every_helper_escapes_what_it_is_given():
    frame = pd.DataFrame({EVIL: [EVIL], "x": [1.5]})
    for fragment in (
        html_table(frame),
        html_key_values({EVIL: EVIL}),
        html_page(EVIL, ["<p>trusted</p>"]),
        template_environment("countvae.invariance")
        .from_string("<h2>{{ text }}</h2>{{ frame | table(none) }}{{ mapping | key_values }}")
        .render(text=EVIL, frame=frame, mapping={EVIL: EVIL}),
    ):
        assert "<script" not in fragment and "&lt;script&gt;" in fragment
    assert escape('"a" & <b>') == "&quot;a&quot; &amp; &lt;b&gt;"


def test_table_aligns_numbers_formats_them_and_says_when_it_is_cut():
    frame = pd.DataFrame({"fit": ["seed 0", "seed 1", "seed 2"], "value": [0.123456, np.nan, 3.0], "ok": [True] * 3})
    text = html_table(frame, max_rows=2)
    assert "<th class=num>value</th>" in text and "<th>ok</th>" in text
    assert '<td class="num nw">0.1235</td>' in text and "–" in text and ">yes<" in text
    assert "seed 2" not in text and "First 2 of 3 rows; all rows are in report.json." in text
    assert "First" not in html_table(frame)


def test_page_is_self_contained():
    page = html_page("A report", ["<h1>A report</h1>", "", "<p>text</p>"], extra_style=".mine{color:red}")
    assert page.startswith("<!DOCTYPE html>") and page.endswith("</body></html>")
    assert "<title>A report</title>" in page and ".mine{color:red}" in page and "table{" in page
    assert "http" not in page and "\n\n" not in page  # empty fragments are dropped


def test_figure_becomes_an_inline_png_and_is_closed():
    _, axes = plt.subplots(1, 2)
    axes[0].plot([0, 1], [1, 0])
    figure = axes[0].figure
    png = base64.b64decode(figure_png_base64(axes))
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert figure.number not in plt.get_fignums()


def test_report_folder_is_written_in_order_atomically_and_never_silently_replaced(tmp_path):
    written = []
    folder = write_report_folder(
        tmp_path / "rep", html_text="<p>one</p>", record={"a": 1}, markdown="# one", on_file_written=written.append
    )
    assert written == list(REPORT_FILES)
    assert sorted(p.name for p in folder.iterdir()) == sorted(REPORT_FILES)
    assert json.loads((folder / "report.json").read_text()) == {"a": 1}
    with pytest.raises(OutputExistsError):
        write_report_folder(folder, html_text="<p>two</p>", record={"a": 2}, markdown="# two")
    assert (folder / "report.md").read_text() == "# one"
    for truthy in ("no", 1):  # only True replaces: a truthy string or number is refused, the folder kept
        with pytest.raises(InvalidArgumentError, match="overwrite must be True or False"):
            write_report_folder(folder, html_text="<p>two</p>", record={"a": 2}, markdown="# two", overwrite=truthy)
        assert (folder / "report.md").read_text() == "# one"
    write_report_folder(folder, html_text="<p>two</p>", record={"a": 2}, markdown="# two", overwrite=True)
    assert (folder / "report.md").read_text() == "# two"
    # A record that JSON cannot hold (NaN) fails the write: no folder appears, nothing is left behind.
    with pytest.raises(ValueError):
        write_report_folder(tmp_path / "bad", html_text="", record={"a": float("nan")}, markdown="")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]


def test_overwrite_replaces_only_a_folder_holding_a_report(tmp_path):
    """overwrite=True replaced the folder whole: a data file or a subfolder kept in it was deleted."""
    folder = tmp_path / "rep"
    write_report_folder(folder, html_text="<p>one</p>", record={"a": 1}, markdown="# one")
    (folder / "data.h5ad").write_bytes(b"the analyst's data")
    (folder / "figures").mkdir()
    with pytest.raises(OutputExistsError, match=r"holds data\.h5ad, figures/, which a report folder does not hold"):
        write_report_folder(folder, html_text="<p>two</p>", record={"a": 2}, markdown="# two", overwrite=True)
    from countvae._report_files import check_report_folder  # the check before rendering

    with pytest.raises(OutputExistsError, match="Move them out of"):
        check_report_folder(folder, overwrite=True)
    check_report_folder(folder, overwrite=False)  # without overwrite, the writer's own refusal says what to do
    assert (folder / "data.h5ad").read_bytes() == b"the analyst's data"
    assert (folder / "report.md").read_text() == "# one"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]


def test_a_file_where_a_report_folder_goes_is_refused_even_with_overwrite(tmp_path):
    """save(path, overwrite=True) on a file moved it aside as a hidden .NAME.*.old and put the folder in its place
    (DiagnosticReport, InvarianceReport, ModelComparison: one writer)."""
    data = tmp_path / "mydata.h5ad"
    data.write_bytes(b"the analyst's data")
    for overwrite in (False, True):
        with pytest.raises(OutputExistsError, match="exists and is not a folder"):
            write_report_folder(data, html_text="", record={}, markdown="", overwrite=overwrite)
    assert data.read_bytes() == b"the analyst's data" and sorted(p.name for p in tmp_path.iterdir()) == ["mydata.h5ad"]
