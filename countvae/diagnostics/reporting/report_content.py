"""What a diagnostics report holds: the headline, every table by name, and the record of how it was made.

:class:`ReportContent` is the data the renderers (:mod:`.render_html`, :mod:`.render_markdown`, :mod:`.render_json`)
read; :class:`~countvae.diagnostics.reporting.diagnostic_report.DiagnosticReport` adds the verbs (``summary``,
``to_frame``, ``to_dict``, ``to_markdown``, ``to_html``, ``save``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from countvae.diagnostics.reporting.downstream_section import DownstreamSection
from countvae.errors import InvalidArgumentError

#: The main tables, in the order of the report's sections; every report has them (``ica`` may have no rows).
MAIN_TABLES = ("invariants", "alignment", "predictive", "subspace", "rhat", "markers", "ppc", "ica")


@dataclass
class ReportContent:
    """The multi-seed diagnostics of one model on shared held-out cells: the fields and main tables.

    The fields are described in the docstring of
    :class:`~countvae.diagnostics.reporting.diagnostic_report.DiagnosticReport`, the class users see; the main tables
    are :data:`MAIN_TABLES`. ``cells``, ``genes``, ``consensus_latent``, ``cells_knn_k`` and ``cells_within_seed_k``
    are kept in memory for :meth:`~countvae.diagnostics.reporting.diagnostic_report.DiagnosticReport.write`, not in the
    report files.
    """

    headline: list[str]
    tables: dict[str, pd.DataFrame]
    settings: dict[str, Any] = field(default_factory=dict)
    subsampling: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    downstream: DownstreamSection | None = None  # optional: DE, clusters, UMAP across seeds
    cells: pd.DataFrame | None = field(default=None, repr=False)
    genes: pd.DataFrame | None = field(default=None, repr=False)
    consensus_latent: np.ndarray | None = field(default=None, repr=False)
    cells_knn_k: int | None = field(default=None, repr=False)  # the k of the cross-seed k-NN column of ``cells``
    cells_within_seed_k: int | None = field(default=None, repr=False)  # the k of its within-seed baseline
    sections: tuple[Any, ...] | None = field(default=None, repr=False)  # the sections run (None: the registered ones)

    def _table(self, name: str) -> pd.DataFrame:
        """Main table ``name``, refused with the section to add when the report was made without that section."""
        if name not in self.tables:
            raise InvalidArgumentError(
                f"This report was made with sections={self.settings.get('sections')}, without the {name!r} section "
                f"that makes this table; add {name!r} to report(..., sections=[...]) to have it."
            )
        return self.tables[name]

    @property
    def invariants(self) -> pd.DataFrame:
        """A table with one row per quantity (invariant in theory, agreement across seeds, interval, verdict, why).

        Columns ``quantity``, ``invariant_in_theory``, ``metric``, ``agreement`` (worst pair) with its interval
        ``low``-``high``, ``agreement_mean``, ``aligned_agreement`` with ``aligned_low``-``aligned_high``,
        ``threshold``, ``comparison`` (``">="`` or ``"<"``: how the agreement must compare with the threshold),
        ``interval`` (how the interval was made), ``n_cells``, ``cells_setting``, ``verdict``
        (``agree``, ``agree after alignment``, ``differ``, ``undetermined`` or ``not measured``), ``reason`` and
        ``remedy`` (why it is undetermined and what would decide it), ``report_instead``. See
        :mod:`countvae.diagnostics.reporting.verdicts` for the decision rule.
        """
        return self._table("invariants")

    @property
    def alignment(self) -> pd.DataFrame:
        """Seed-pair alignment errors per map class (see :mod:`countvae.diagnostics.analyses.alignment`)."""
        return self._table("alignment")

    @property
    def predictive(self) -> pd.DataFrame:
        """Held-out log predictive density per seed."""
        return self._table("predictive")

    @property
    def subspace(self) -> pd.DataFrame:
        """Rotation-invariant geometry per seed pair (CKA, k-NN overlap, spectra distance, principal angles)."""
        return self._table("subspace")

    @property
    def rhat(self) -> pd.DataFrame:
        """Spread of guide draws across seeds (R-hat, seeds as chains) per quantity, with its within-seed baseline."""
        return self._table("rhat")

    @property
    def markers(self) -> pd.DataFrame:
        """Per marker, the invariant R^2 across seeds against the per-dimension story."""
        return self._table("markers")

    @property
    def ppc(self) -> pd.DataFrame:
        """Posterior predictive checks per seed."""
        return self._table("ppc")

    @property
    def ica(self) -> pd.DataFrame:
        """For each ICA component of the first fit, whether it agrees across seeds, and why not.

        Its worst best-match |correlation| with the other fits' ICA components (``worst_match`` with its interval
        ``low``-``high``, and ``mean_match``; ICAs estimated on disjoint halves of the fit cells, or of the held-out
        cells without them), the same comparison within the first fit (``same_fit_match``), their ratio
        (``corrected_match``, capped at 1, with its interval ``corrected_low``-``corrected_high``: what the verdict
        reads), excess kurtosis, negentropy, the Gaussian flag, and the ``verdict`` with its ``reason`` and ``remedy``
        (see :mod:`countvae.diagnostics.analyses.components`). No rows with ``ica=False``.
        """
        return self._table("ica")
