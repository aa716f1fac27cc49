"""One page of blocks in HTML and Markdown: the renderer every countvae report shares.

A page is a title, blocks shown before the first heading (the verdict), and parts, each a heading over its blocks
(:mod:`.sections.base`). The multi-seed report lays its sections out this way (:mod:`.render_html`,
:mod:`.render_markdown`), and so do the restriction and model comparisons: their pages are the same block kinds through
the same templates, and nothing here knows what any part is about.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from countvae._formatting import format_value, markdown_table
from countvae._report_files import ALL_ROWS_NOTE, html_page, template_environment
from countvae.diagnostics.reporting.sections.base import HTML, MARKDOWN, Block

__all__ = ["Part", "blocks_html", "markdown_blocks", "page_html", "page_markdown"]


@dataclass(frozen=True)
class Part:
    """A heading over its blocks; ``level`` 2 is a section, 3 one shown inside the part before it."""

    name: str
    title: str
    blocks: tuple[Block, ...]
    level: int = 2
    markdown_title: str | None = None


def _in(blocks: Iterable[Block], fmt: str) -> list[Block]:
    return [b for b in blocks if fmt in b.formats]


def blocks_html(blocks: Sequence[Block]) -> str:
    """Blocks as an HTML fragment (for a notebook's rich display)."""
    template = template_environment(__package__).get_template("page.html.j2")
    return template.render(title=None, intro=_in(blocks, HTML), parts=[])


def page_html(title: str, intro: Sequence[Block], parts: Sequence[Part], *, extra_style: str = "") -> str:
    """A self-contained HTML page: the title, the blocks before any heading, then every part with blocks."""
    shown = [p for p in parts if _in(p.blocks, HTML)]
    body = (
        template_environment(__package__)
        .get_template("page.html.j2")
        .render(
            title=title,
            intro=_in(intro, HTML),
            parts=[{"name": p.name, "title": p.title, "level": p.level, "blocks": _in(p.blocks, HTML)} for p in shown],
        )
    )
    return html_page(title, [body], extra_style=extra_style)


def markdown_blocks(b: Block) -> list[str]:
    """One block as Markdown paragraphs (figures and boxes have no Markdown form)."""
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
        return [text for inner in _in(b.blocks, MARKDOWN) for text in markdown_blocks(inner)]
    return []


def page_markdown(title: str, intro: Sequence[Block], parts: Sequence[Part]) -> str:
    """The page as Markdown: ``# title``, the blocks before any heading, then ``## part`` and its blocks."""
    out = [f"# {title}"] + [text for b in _in(intro, MARKDOWN) for text in markdown_blocks(b)]
    for part in parts:
        blocks = _in(part.blocks, MARKDOWN)
        if blocks:
            out.append(f"## {part.markdown_title or part.title}")
            out += [text for b in blocks for text in markdown_blocks(b)]
    return "\n\n".join(out) + "\n"
