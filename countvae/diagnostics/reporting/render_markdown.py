"""report.md: the report's verdict and each section's Markdown blocks (the figures are in report.html)."""

from __future__ import annotations

from countvae.diagnostics.reporting.page import Part, page_markdown
from countvae.diagnostics.reporting.render_html import TITLE, sections_of
from countvae.diagnostics.reporting.report_content import ReportContent
from countvae.diagnostics.reporting.sections.base import Bullets


def render_markdown(rep: ReportContent) -> str:
    """The report as Markdown (tables only; the figures are in report.html)."""
    verdict = Part("verdict", "Verdict", (Bullets(tuple(rep.headline)),))
    parts = [
        Part(s.name, s.title, tuple(s.layout(rep)), markdown_title=s.markdown_title)
        for s in sections_of(rep)
        if s.title
    ]
    return page_markdown(TITLE, [], [verdict, *parts])
