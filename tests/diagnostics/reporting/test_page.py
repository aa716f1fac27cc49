"""reporting/page.py: one renderer of blocks for every report (multi-seed, restrictions, model comparison)."""

from __future__ import annotations

import pandas as pd

from countvae import plotting
from countvae.diagnostics.reporting.page import Part, blocks_html, page_html, page_markdown
from countvae.diagnostics.reporting.sections.base import (
    HTML,
    MARKDOWN,
    Bullets,
    Figure,
    Heading,
    KeyValues,
    Paragraph,
    Table,
)


def _parts() -> list[Part]:
    frame = pd.DataFrame({"gene": ["<script>", "b"], "value": [0.5, 0.25]})
    return [
        Part("verdict", "Verdict", (Bullets(("first & foremost", "second"), boxed=True),)),
        Part("empty", "Nothing in Markdown", (Paragraph("html only", formats=frozenset({HTML})),)),
        Part("table", "A table", (Table(frame), Heading("md only", formats=frozenset({MARKDOWN})))),
        Part("inner", "Inside", (KeyValues({"k": 1}),), level=3, markdown_title="Inside (md)"),
    ]


def test_markdown_lists_each_part_with_blocks_of_its_format():
    text = page_markdown("Title", [Paragraph("before")], _parts())
    assert text.startswith("# Title\n\nbefore\n\n## Verdict\n\n- first & foremost\n- second")
    assert "| <script> | 0.5 |" in text and "### md only" in text
    assert "## Inside (md)\n\n- k: 1" in text
    # a part with nothing to show in Markdown has no heading there either
    assert "html only" not in text and "Nothing in Markdown" not in text


def test_html_escapes_data_and_skips_parts_without_html_blocks():
    page = page_html("T & co", [], _parts())
    assert "<title>T &amp; co</title>" in page and "<h1>T &amp; co</h1>" in page
    assert '<div class="verdict"><ul><li>first &amp; foremost</li>' in page
    assert "&lt;script&gt;" in page and "<script>" not in page
    assert '<h3 id="inner">Inside</h3>' in page and "md only" not in page
    assert '<h2 id="empty">' in page  # its paragraph is HTML


def test_fragment_has_no_page_around_it():
    fragment = blocks_html([Bullets(("a",)), Paragraph("md", formats=frozenset({MARKDOWN}))])
    assert fragment.strip() == "<ul><li>a</li></ul>"


def test_a_figure_draws_names_with_dollar_signs_as_written():
    # a category such as "$\nocommand$" is not valid TeX: read as mathtext it failed the whole page
    name = "$\\nocommand$"
    frame = pd.DataFrame({"fit": ["seed 0", "seed 1"], "marker": [name, name], "r2": [0.1, 0.2]})
    page = page_html("T", [], [Part("fig", "Figure", (Figure("R2", "caption", lambda: plotting.marker_r2(frame)),))])
    assert 'src="data:image/png;base64,' in page
