"""report.md: the report's verdict and each section's Markdown blocks (the figures are in report.html)."""

from __future__ import annotations

from countvae._formatting import format_value, markdown_table
from countvae._report_files import ALL_ROWS_NOTE
from countvae.diagnostics.reporting.render_html import TITLE, sections_of
from countvae.diagnostics.reporting.report_content import ReportContent
from countvae.diagnostics.reporting.sections.base import MARKDOWN, Block


def _block(b: Block) -> list[str]:
    """One block as Markdown paragraphs (blocks of other kinds than these have no Markdown form)."""
    if b.kind == "heading":
        return [f"### {b.text}"]
    if b.kind == "paragraph":
        return [b.text] if b.text else []
    if b.kind == "bullets":
        return ["\n".join(f"- {item}" for item in b.items)]
    if b.kind == "definitions":
        return ["\n".join(f"- **{k}**: {v}" for k, v in b.terms.items())]
    if b.kind == "table":
        return [markdown_table(b.frame, max_rows=60, note=ALL_ROWS_NOTE)]
    if b.kind == "key_values":
        return ["\n".join(f"- {k}: {format_value(v)}" for k, v in b.mapping.items())]
    if b.kind == "details":
        return [text for inner in b.blocks if MARKDOWN in inner.formats for text in _block(inner)]
    return []


def render_markdown(rep: ReportContent) -> str:
    """The report as Markdown (tables only; the figures are in report.html)."""
    parts = [f"# {TITLE}", "## Verdict", "\n".join(f"- {line}" for line in rep.headline)]
    for section in sections_of(rep):
        blocks = [b for b in section.layout(rep) if MARKDOWN in b.formats] if section.title else []
        if blocks:
            parts.append(f"## {section.markdown_title or section.title}")
            parts += [text for b in blocks for text in _block(b)]
    return "\n\n".join(parts) + "\n"
