"""The result of :func:`countvae.diagnostics.compare_models`: the table, the recommendation, its rule, the files."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from countvae import plotting
from countvae._formatting import json_ready
from countvae._io import FolderLayout, atomic_directory, refuse_foreign_entries, write_json_atomic, write_text_atomic
from countvae.diagnostics.analyses.model_comparison import rule_text
from countvae.diagnostics.reporting.page import Part, page_html, page_markdown
from countvae.diagnostics.reporting.sections.base import Bullets, Figure, Table

__all__ = ["COMPARISON_FILES", "ModelComparison"]

#: The files :meth:`ModelComparison.save` writes.
COMPARISON_FILES = ("comparison.html", "comparison.json", "comparison.md")
#: What ``overwrite`` may replace: a folder holding these files only.
COMPARISON_FOLDER = FolderLayout("a model-comparison folder", frozenset(COMPARISON_FILES))
TITLE = "Model comparison"
FRONTIER = "Fit against stability"


def _nats(mean: float, low: float, high: float) -> str:
    return f"{mean:+.4f} nats/cell [{low:+.4f}, {high:+.4f}]"


def _score(row: pd.Series) -> str:
    return f"{row['stability']:.3f} [{row['stability_low']:.3f}, {row['stability_high']:.3f}]"


@dataclass
class ModelComparison:
    """Candidate models compared by held-out fit and cross-seed stability, with the recommendation of the rule.

    Attributes
    ----------
    table
        One row per candidate: its settings; ``lpd_per_cell`` (mean held-out ``log p(x)``, nats); ``diff_vs_best``
        with its simultaneous interval ``diff_low``/``diff_high`` and ``margin`` (nats/cell); ``reliable`` (k-hat
        rule), ``fit_verdict``; the stability scores (worst pair of seeds, with the cell-bootstrap 95% interval
        of the worst pair ``*_low``/``*_high``) and ``stable``; ``seed_spread`` (nats/cell), ``fit_seconds``;
        ``seed_groups`` (which seeds reached the same solution, best group first, e.g. ``"0, 1 | 2"``, then the
        pairs in separate groups the evidence did not settle, ``"0 | 1 (undetermined: 0-1)"``);
        ``<score>_within_seed`` (each stability score between two draws of one fit's guide, averaged over seeds:
        its within-seed baseline); ``subspace`` (the gene-space subspace overlap of the decoders, worst pair; shown,
        not judged); with a recommendation, ``gain`` over it with ``gain_low``/``gain_high``; and ``verdict``.
    recommended
        The recommended candidate's settings, or ``None`` (undetermined).
    recommended_name
        Its label in ``table``.
    best
        The best-fitting reliable candidate, or ``None``.
    margin
        The equivalence margin, nats per cell (NaN when it cannot be stated).
    gain_over_baseline
        The best candidate's mean per-cell gain over the no-latent baseline (the margin is a share of it).
    margin_share, alpha
        The share and the error rate the comparison used.
    n_heldout
        Held-out cells every candidate was evaluated on.
    seeds
        Seeds of every candidate.
    n_heldout_total
        Cells the fits held out (``None``: not recorded); more than ``n_heldout`` when ``max_heldout_cells`` kept a
        random subset.
    n_genes
        Genes every candidate was fitted on (``None``: not recorded).
    """

    table: pd.DataFrame
    recommended: dict[str, Any] | None
    recommended_name: str | None
    best: str | None
    margin: float
    gain_over_baseline: float
    margin_share: float
    alpha: float
    n_heldout: int
    seeds: list[int] = field(default_factory=list)
    n_heldout_total: int | None = None
    n_genes: int | None = None

    @property
    def rule(self) -> str:
        """The recommendation rule in words."""
        return rule_text()

    @property
    def noise_floor(self) -> float:
        """The seed noise floor of the fit in nats/cell, the median over candidates of the spread between seeds."""
        spread = self.table["seed_spread"].to_numpy(dtype=float)
        return float(np.nanmedian(spread)) if np.isfinite(spread).any() else np.nan

    @property
    def frontier(self) -> pd.DataFrame:
        """The frontier figure's data, fit against stability per candidate, with intervals.

        ``stability`` is the lower of the decoded-means and latent-distance concordances on the worst pair of seeds
        (``stability_low``/``stability_high``: the lower of their bootstrap interval bounds); ``fit`` is
        ``diff_vs_best`` with its interval.
        """
        t = self.table
        return pd.DataFrame(
            {
                "candidate": t["candidate"],
                "fit": t["diff_vs_best"],
                "fit_low": t["diff_low"],
                "fit_high": t["diff_high"],
                "stability": np.minimum(t["decoded_means"], t["distances"]),
                "stability_low": np.minimum(t["decoded_means_low"], t["distances_low"]),
                "stability_high": np.minimum(t["decoded_means_high"], t["distances_high"]),
                "knn": t["knn"],
                "stable": t["stable"],
                "reliable": t["reliable"],
                "margin": t["margin"],
                "fit_seconds": t["fit_seconds"],
                "recommended": t["candidate"] == self.recommended_name,
            }
        )

    def plot_frontier(self, ax: Axes | None = None) -> Axes:
        """Fit (nats/cell vs the best, simultaneous intervals) against stability; the seed noise floor as a band."""
        return plotting.model_frontier(self.frontier, ax=ax, noise_floor=self.noise_floor)

    def _margin_line(self) -> str:
        gain = f"the best candidate's gain of {self.gain_over_baseline:.4f} nats/cell over the no-latent baseline"
        if not np.isfinite(self.margin):
            return (
                f"Equivalence margin: none can be stated ({gain}; only a positive gain gives one), so no candidate "
                "is recommended."
            )
        return f"Equivalence margin: {self.margin:.4f} nats/cell ({self.margin_share:g} of {gain})."

    def summary(self) -> str:
        """The recommendation and what each larger candidate buys and costs, in sentences."""
        n = len(self.table)
        cells = f"{self.n_heldout} held-out cells"
        if self.n_heldout_total is not None and self.n_heldout_total > self.n_heldout:
            cells = (
                f"{self.n_heldout} of the {self.n_heldout_total} held-out cells (a random subset: max_heldout_cells)"
            )
        lines = [
            f"{n} candidate{'s' if n != 1 else ''}, each fitted from seeds {self.seeds}, evaluated on the same "
            f"{cells}.",
            self._margin_line(),
        ]
        unreliable = self.table.loc[~self.table["reliable"], "candidate"].tolist()
        if unreliable:
            lines.append(f"Unreliable estimates (not ranked): {'; '.join(unreliable)}.")  # names hold commas
        if self.recommended_name is None:
            lines.append("Recommendation: undetermined (no candidate meets the rule, or no margin can be stated).")
        else:
            lines.append(f"Recommendation: {self.recommended_name}.")
            frontier = self.frontier.set_index("candidate")
            rec = frontier.loc[self.recommended_name]
            for row in self.table.itertuples():
                if row.candidate == self.recommended_name:
                    continue
                other = frontier.loc[row.candidate]
                lines.append(
                    f"{row.candidate} against the recommendation: held-out log p(x) "
                    f"{_nats(row.gain, row.gain_low, row.gain_high)}; "
                    f"stability (worst pair) {_score(other)} vs {_score(rec)}; k-NN overlap "
                    f"{row.knn:.3f} [{row.knn_low:.3f}, {row.knn_high:.3f}]; fit time {row.fit_seconds:.1f} s vs "
                    f"{rec['fit_seconds']:.1f} s ({row.verdict})."
                )
        lines.append("Rule: " + self.rule)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready content (non-finite numbers become ``None``)."""
        return json_ready(
            {
                "format": "countvae-model-comparison",
                "version": 1,
                "recommended": self.recommended,
                "recommended_name": self.recommended_name,
                "best": self.best,
                "rule": self.rule,
                "margin": self.margin,
                "margin_share": self.margin_share,
                "gain_over_baseline": self.gain_over_baseline,
                "alpha": self.alpha,
                "n_heldout": self.n_heldout,
                "n_heldout_total": self.n_heldout_total,
                "n_genes": self.n_genes,
                "seeds": self.seeds,
                "noise_floor": self.noise_floor,
                "table": self.table,
                "frontier": self.frontier,
            }
        )

    def _parts(self) -> list[Part]:
        """The page: the summary, the frontier figure (HTML only) and the table of candidates."""
        return [
            Part("summary", "Summary", (Bullets(tuple(self.summary().splitlines())),)),
            Part("frontier", FRONTIER, (Figure(FRONTIER, self.rule, self.plot_frontier),)),
            Part("candidates", "Candidates", (Table(self.table),)),
        ]

    def to_markdown(self) -> str:
        """The comparison as Markdown (the figure is in the HTML page)."""
        return page_markdown(TITLE, [], self._parts())

    def to_html(self) -> str:
        """The comparison as one HTML page, with the frontier figure inline."""
        return page_html(TITLE, [], self._parts())

    def save(self, dir_path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write ``comparison.json``, ``comparison.md`` and ``comparison.html`` into a new folder, atomically.

        Raises
        ------
        OutputExistsError
            The folder exists and ``overwrite`` is not given, it holds files other than the three ``comparison.*``
            (replaced whole, they would be deleted), or ``dir_path`` is a file or a symbolic link.
        """
        refuse_foreign_entries(dir_path, overwrite, COMPARISON_FOLDER)  # before rendering
        html, record, markdown = self.to_html(), self.to_dict(), self.to_markdown()
        with atomic_directory(dir_path, overwrite=overwrite, layout=COMPARISON_FOLDER) as tmp:
            write_text_atomic(tmp / "comparison.html", html)
            write_json_atomic(tmp / "comparison.json", record)
            write_text_atomic(tmp / "comparison.md", markdown)
        return Path(dir_path)
