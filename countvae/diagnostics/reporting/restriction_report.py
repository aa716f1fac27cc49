""":class:`RestrictionReport`: what each restriction buys in identified coordinates and costs in fit.

Made by :func:`countvae.diagnostics.compare_restrictions`; its words and tables are those of the multi-seed report's
restrictions section (:mod:`.sections.restrictions`). It has the verbs every countvae report shares (``summary``,
``to_frame``, ``tables``, ``to_dict``, ``to_markdown``, ``to_html``, ``save``) and is saved the same way
(:mod:`countvae._report_files`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from countvae._formatting import json_ready
from countvae._report_files import check_report_folder, write_report_folder
from countvae.diagnostics.reporting.page import Part, blocks_html, page_html, page_markdown
from countvae.diagnostics.reporting.sections.base import (
    HTML,
    MARKDOWN,
    Block,
    Bullets,
    Details,
    Heading,
    KeyValues,
    Paragraph,
    Table,
)
from countvae.diagnostics.reporting.sections.restrictions import INTRODUCTION, TABLE_HEADINGS, TITLE


def _folded(title: str, mapping: dict[str, Any]) -> tuple[Block, ...]:
    """``mapping`` folded under ``title`` in HTML, under a sub-heading in Markdown."""
    return (
        Details(title, (KeyValues(mapping),), formats=frozenset({HTML})),
        Heading(title, formats=frozenset({MARKDOWN})),
        KeyValues(mapping, formats=frozenset({MARKDOWN})),
    )


@dataclass
class RestrictionReport:
    """The comparison of restricted models with the unrestricted one.

    Attributes
    ----------
    headline
        Sentences an analyst can paste into a methods section, most important first.
    tables
        ``restrictions`` (the main table: one row per model), ``symmetry``, ``programs`` (with gene programs),
        ``agreement_pairs``, ``split_half``, ``predictive_seeds``.
    settings
        The run's settings (seeds, models, margins, thresholds).
    provenance
        Versions and data checksums.
    timings
        Seconds per step.

    """

    headline: list[str]
    tables: dict[str, pd.DataFrame]
    settings: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def restrictions(self) -> pd.DataFrame:
        """The main table, with one row per model (the unrestricted one first)."""
        return self.tables["restrictions"]

    @property
    def programs(self) -> pd.DataFrame | None:
        """For each gene program, whether its dimension is used, on its genes, explained by them (or ``None``)."""
        return self.tables.get("programs")

    def summary(self) -> str:
        """The headline, one sentence per line."""
        return "\n".join(f"- {line}" for line in self.headline)

    def to_frame(self) -> pd.DataFrame:
        """The main table (a copy)."""
        return self.restrictions.copy()

    def to_dict(self) -> dict[str, Any]:
        """Every table and setting as JSON-safe Python objects (NaN and infinities become ``None``)."""
        return json_ready(
            {
                "title": TITLE,
                "headline": self.headline,
                "tables": {name: frame for name, frame in self.tables.items()},
                "settings": self.settings,
                "provenance": self.provenance,
                "timings": self.timings,
            }
        )

    def _parts(self) -> list[Part]:
        """The page: the verdict and how to read it, each table, then the settings (HTML and Markdown alike)."""
        verdict = Part("verdict", "Verdict", (Bullets(tuple(self.headline), boxed=True), Paragraph(INTRODUCTION)))
        tables = [
            Part(name, heading, (Table(self.tables[name], max_rows=80),))
            for name, heading in TABLE_HEADINGS.items()
            if len(self.tables.get(name, ()))
        ]
        settings = Part(
            "settings",
            "Settings and provenance",
            (
                KeyValues(self.settings),
                *_folded("Provenance", self.provenance),
                *_folded("Timings (seconds)", self.timings),
            ),
        )
        return [verdict, *tables, settings]

    def to_markdown(self) -> str:
        """The report as Markdown (the text of report.md)."""
        return page_markdown(TITLE, [], self._parts())

    def to_html(self) -> str:
        """The report as one self-contained HTML page (the text of report.html)."""
        return page_html(TITLE, [], self._parts())

    def save(self, dir_path: str | Path, overwrite: bool = False) -> Path:
        """Write ``report.html`` (self-contained), ``report.json`` and ``report.md`` into a new folder, atomically.

        ``overwrite`` replaces only a folder holding nothing but these files (it is replaced whole).
        """
        check_report_folder(dir_path, overwrite)
        return write_report_folder(
            dir_path, html_text=self.to_html(), record=self.to_dict(), markdown=self.to_markdown(), overwrite=overwrite
        )

    def __repr__(self) -> str:
        return f"RestrictionReport({len(self.restrictions)} models)\n{self.summary()}"

    def _repr_html_(self) -> str:
        """The verdict and the main table, for notebooks."""
        return blocks_html([Bullets(tuple(self.headline)), Table(self.restrictions)])
