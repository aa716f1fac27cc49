"""report.html: one self-contained page, verdict first, then each section's evidence (figures before tables).

The page is the jinja2 templates in ``templates/`` (shipped with the package) over the sections' layouts
(:mod:`.sections.base`): the templates know the kinds of blocks, not the sections. The style sheet is inline, figures
are inline PNG images, nothing is fetched, and every string from the data or the fits (gene names, obs categories, fit
names) is HTML-escaped (autoescaping; only a paragraph's ``markup``, written by a section, is trusted).
"""

from __future__ import annotations

from countvae._report_files import html_page, template_environment
from countvae.diagnostics.reporting.report_content import ReportContent
from countvae.diagnostics.reporting.sections.base import HTML, Section
from countvae.diagnostics.reporting.sections.registry import known_sections

TITLE = "Multi-seed diagnostics: what these fits identify"

#: The report's own style rules, added to :data:`countvae._report_files.STYLE`.
_STYLE = """
.verdict{background:#f4f8fb;border-left:5px solid #2171b5;padding:.6em 1.2em}
.verdict li{margin:.35em 0}
.glance{display:grid;grid-template-columns:repeat(auto-fit,minmax(250px,1fr));gap:.8em;margin:1em 0}
.glance div{border:1px solid #ddd;border-top:5px solid;padding:.5em .8em;font-size:.9em}
.glance .g-agree{border-top-color:#1b7837}.glance .g-aligned{border-top-color:#e08214}
.glance .g-differ{border-top-color:#b2182b}.glance .g-undetermined{border-top-color:#6a51a3}
.glance .g-unmeasured{border-top-color:#999}
.glance b{display:block;margin-bottom:.2em}.glance span{color:#555;font-size:.9em}
.glance ul{margin:.3em 0 0 1.1em;padding:0}
.v-agree{color:#1b7837;font-weight:bold}.v-aligned{color:#e08214;font-weight:bold}
.v-differ{color:#b2182b;font-weight:bold}.v-undetermined{color:#6a51a3;font-weight:bold}
"""


def sections_of(rep: ReportContent) -> tuple[Section, ...]:
    """The sections the report was made with.

    A report loaded from a file has the known sections named in its settings (``sections``); a file that does
    not name them (an older version) has every known one, shown if it has tables.
    """
    if rep.sections is not None:
        return rep.sections
    names = rep.settings.get("sections")
    if isinstance(names, list):
        return tuple(section for section in known_sections() if section.name in names)
    return known_sections()


def summary_html(rep: ReportContent) -> str:
    """The verdict and the sections' notebook blocks as an HTML fragment (for notebooks)."""
    blocks = [b for s in sections_of(rep) for b in s.notebook_blocks(rep) if HTML in b.formats]
    template = template_environment(__package__).get_template("summary.html.j2")
    return template.render(title="Multi-seed diagnostics", headline=rep.headline, blocks=blocks)


def render_html(rep: ReportContent) -> str:
    """The self-contained HTML report: verdict first, then every section that has something to show."""
    shown = []
    for section in sections_of(rep):
        blocks = [b for b in section.layout(rep) if HTML in b.formats] if section.title else []
        if blocks:
            shown.append({"name": section.name, "title": section.title, "level": section.level, "blocks": blocks})
    fits = [f"{f['name']} ({f['kind']})" for f in rep.provenance.get("fits", [])]
    body = (
        template_environment(__package__)
        .get_template("report.html.j2")
        .render(
            title=TITLE,
            fits=fits,
            heldout_cells=rep.provenance.get("heldout_cells"),
            genes=rep.provenance.get("genes"),
            headline=rep.headline,
            summary_blocks=[b for s in sections_of(rep) for b in s.summary_blocks(rep) if HTML in b.formats],
            sections=shown,
        )
    )
    return html_page("countvae multi-seed diagnostics", [body], extra_style=_STYLE)
