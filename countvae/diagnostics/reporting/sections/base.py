"""What a report section is: its name, title, needs, settings, a pure ``compute`` and its layout.

A section is the unit of the multi-seed report. It declares

* ``name`` (the HTML anchor) and ``title`` (its heading; ``""``: no heading, as for the
  per-cell columns, which only feed :meth:`DiagnosticReport.write`);
* ``needs``: the :class:`~countvae.diagnostics.reporting.collect.FitArrays` fields it reads,
  so that :func:`~countvae.diagnostics.reporting.collect.collect` asks each fit once for the
  union of the needs of the sections that run;
* ``requires``: the sections whose results its ``compute`` reads (in ``shared.results``; the about section, computed
  last, also reads which of the others ran, without requiring them);
* ``compute(collected, shared, settings) -> SectionResult``: a pure function of the collected arrays (``settings`` is
  the :class:`ReportSettings`; a section with settings of its own carries them as attributes);
* ``layout(report) -> list[Block]``: what the renderers show, built from the finished report's tables and records only
  (so a report loaded back from report.json renders the same page).

The renderers (:mod:`..render_html`, :mod:`..render_markdown`) loop over the sections and
their blocks and know nothing specific to any section.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import matplotlib
import pandas as pd

from countvae.diagnostics.analyses.maps import PairMaps
from countvae.diagnostics.reporting.verdicts import Judgement

if TYPE_CHECKING:
    from countvae.diagnostics.reporting.collect import Collected
    from countvae.diagnostics.reporting.report_content import ReportContent
    from countvae.diagnostics.reporting.settings import ReportSettings

#: The output formats a block can appear in.
HTML, MARKDOWN = "html", "markdown"
BOTH = frozenset({HTML, MARKDOWN})


# ----- what a section shows ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Block:
    """One element of a section's layout; ``formats`` says where it appears (HTML, Markdown or both)."""

    formats: frozenset[str] = field(default=BOTH, kw_only=True)
    kind: ClassVar[str] = ""


@dataclass(frozen=True)
class Heading(Block):
    """A sub-heading (``<h3>``, ``###``)."""

    text: str
    kind: ClassVar[str] = "heading"


@dataclass(frozen=True)
class Paragraph(Block):
    """A paragraph of plain text (escaped in HTML); ``markup`` is its trusted HTML form when it has emphasis."""

    text: str
    markup: str | None = None
    kind: ClassVar[str] = "paragraph"


@dataclass(frozen=True)
class Bullets(Block):
    """A bulleted list of plain sentences (``boxed``: the verdict box of the report's first lines)."""

    items: tuple[str, ...]
    boxed: bool = False
    kind: ClassVar[str] = "bullets"


@dataclass(frozen=True)
class Definitions(Block):
    """Terms and what they mean, one per line."""

    terms: Mapping[str, str]
    kind: ClassVar[str] = "definitions"


@dataclass(frozen=True)
class Table(Block):
    """A table; ``max_rows`` rows at most (``None``: all), the rest being in report.json.

    ``numeric`` names the right-aligned columns of a table of preformatted text (default: the numeric
    columns, formatted by the renderer); ``css`` maps a column to the CSS class of each of its values.
    """

    frame: pd.DataFrame
    max_rows: int | None = 60
    numeric: tuple[str, ...] | None = None
    css: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    kind: ClassVar[str] = "table"


@dataclass(frozen=True)
class KeyValues(Block):
    """A two-column list of names and values."""

    mapping: Mapping[str, Any]
    kind: ClassVar[str] = "key_values"


@dataclass(frozen=True)
class Figure(Block):
    """A figure drawn by ``draw`` (a :mod:`countvae.plotting` call returning axes), with its title and caption.

    Its text is drawn as written: a gene, group or category name with a pair of ``$`` is not read as
    matplotlib mathtext (which fails on what is not valid TeX, and would lose the page).
    """

    title: str
    caption: str
    draw: Callable[[], Any]
    formats: frozenset[str] = field(default=frozenset({HTML}), kw_only=True)
    kind: ClassVar[str] = "figure"

    def __post_init__(self) -> None:
        draw = self.draw

        def literal() -> Any:
            with matplotlib.rc_context({"text.parse_math": False}):
                return draw()

        object.__setattr__(self, "draw", literal)


@dataclass(frozen=True)
class FigureRow(Block):
    """Figures side by side."""

    figures: tuple[Figure, ...]
    formats: frozenset[str] = field(default=frozenset({HTML}), kw_only=True)
    kind: ClassVar[str] = "figure_row"


@dataclass(frozen=True)
class Details(Block):
    """Blocks folded under a summary line (``<details>`` in HTML; shown as they are in Markdown)."""

    summary: str
    blocks: tuple[Block, ...]
    kind: ClassVar[str] = "details"


@dataclass(frozen=True)
class Box:
    """One box of a :class:`Boxes` block: its CSS class, heading, what it means, and the names it lists."""

    css: str
    heading: str
    meaning: str
    items: tuple[str, ...]


@dataclass(frozen=True)
class Boxes(Block):
    """Boxes side by side, each listing names (the verdicts at a glance)."""

    boxes: tuple[Box, ...]
    formats: frozenset[str] = field(default=frozenset({HTML}), kw_only=True)
    kind: ClassVar[str] = "boxes"


def folded_table(summary: str, frame: pd.DataFrame) -> Details:
    """Every row of ``frame``, folded under ``summary`` (in HTML only)."""
    return Details(summary, (Table(frame, max_rows=None),), formats=frozenset({HTML}))


# ----- what a section computes ----------------------------------------------------------------------------
@dataclass
class SectionResult:
    """What one section's ``compute`` returns.

    Attributes
    ----------
    tables
        Table name -> table (they join ``DiagnosticReport.tables``).
    verdict_rows
        Invariants-table quantity -> the verdict this section decides for that row
        (e.g. the predictive section decides the held-out log p(x) row).
    headline
        Sentences for the report's verdict, in this section's place (:attr:`Section.headline_rank`).
    records
        Entries of ``DiagnosticReport.settings`` (JSON-ready values).
    subsampling
        Entries of ``DiagnosticReport.subsampling``.
    attributes
        Other fields of the report this section fills (e.g. ``cells``, ``downstream``).
    values
        Anything the sections that require this one read (not part of the report).

    """

    tables: dict[str, pd.DataFrame | None] = field(default_factory=dict)
    verdict_rows: dict[str, Judgement] = field(default_factory=dict)
    headline: list[str] = field(default_factory=list)
    records: dict[str, Any] = field(default_factory=dict)
    subsampling: dict[str, Any] = field(default_factory=dict)
    attributes: dict[str, Any] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)


@dataclass
class Shared:
    """What sections share: things fitted once (e.g. the maps between fits) and the results of earlier sections."""

    cache: dict[str, Any] = field(default_factory=dict)
    results: dict[str, SectionResult] = field(default_factory=dict)

    def get(self, key: str, make: Callable[[], Any]) -> Any:
        """The value under ``key``, made by ``make()`` the first time it is asked for."""
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]


def heldout_maps(collected: Collected, shared: Shared, settings: ReportSettings) -> PairMaps:
    """The maps between every pair of fits on all held-out cells, fitted once and shared by the sections."""
    return shared.get("heldout_maps", lambda: PairMaps(collected.per_fit("latent"), seed=settings.seed))


def level(report: ReportContent) -> str:
    """The level of the report's intervals as a percentage, e.g. ``"90%"``."""
    alpha = float(report.settings.get("report", {}).get("alpha", 0.05))
    return f"{100 * (1 - 2 * alpha):g}%"


class Section:
    """Base class of a report section (see the module docstring); subclasses set the class attributes.

    Attributes
    ----------
    name
        Unique name, also the HTML anchor.
    title
        Heading (``""``: the section shows nothing of its own).
    markdown_title
        Heading in report.md (default: ``title``).
    level
        2 for a section, 3 for one shown inside the section before it (no entry in the page's navigation).
    needs
        The ``FitArrays`` fields ``compute`` reads.
    requires
        Names of the sections whose results ``compute`` reads.
    headline_rank
        Where this section's headline sentences go (lower first; ties in report order).
    figures
        Figure name -> (title, tables it shows, caption): the figures of report.json's ``figures``.

    """

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    markdown_title: ClassVar[str | None] = None
    level: ClassVar[int] = 2
    needs: ClassVar[frozenset[str]] = frozenset()
    requires: ClassVar[tuple[str, ...]] = ()
    headline_rank: ClassVar[float] = 100.0
    figures: ClassVar[dict[str, tuple[str, tuple[str, ...], str]]] = {}

    def compute(self, collected: Collected, shared: Shared, settings: ReportSettings) -> SectionResult:
        """The tables, verdict rows, sentences and records of the section, from the collected arrays alone."""
        return SectionResult()

    def layout(self, report: ReportContent) -> list[Block]:
        """What the renderers show for this section, from the report's tables and records."""
        return []

    def summary_blocks(self, report: ReportContent) -> list[Block]:
        """Blocks shown with the verdict at the top of the page (default: none)."""
        return []

    def notebook_blocks(self, report: ReportContent) -> list[Block]:
        """Blocks shown after the verdict in a notebook (``DiagnosticReport._repr_html_``; default: none)."""
        return []

    def figure(self, name: str, draw: Callable[[], Any]) -> Figure:
        """The figure ``name`` of :attr:`figures`, drawn by ``draw``."""
        title, _, caption = self.figures[name]
        return Figure(title, caption, draw)

    def __repr__(self) -> str:
        return f"<report section {self.name!r}>"
