"""The sizes and seeds of a diagnostics report (all recorded in the report)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from countvae._checks import check_bool, check_int, check_number
from countvae._settings import documents_settings, setting
from countvae.diagnostics.analyses.invariants import ICA_THRESHOLD
from countvae.diagnostics.analyses.predictive import EQUIVALENCE_MARGIN
from countvae.diagnostics.analyses.resampling import MAX_CELLS, N_REPLICATES
from countvae.errors import InvalidArgumentError

#: The smallest value of each integer size that can work.
MINIMUM = {
    "n_lpd_samples": 2,
    "max_lpd_cells": 2,
    "max_expression_cells": 2,
    "max_genes": 1,
    "max_jacobian_cells": 1,
    "max_ppc_cells": 2,
    "n_ppc_samples": 4,
    "n_rhat_cells": 2,
    "n_rhat_draws": 4,
    "n_rhat_genes": 0,
    "max_distance_cells": 3,
    "max_knn_cells": 3,
    "k": 1,
    "n_markers": 1,
    "n_bootstrap": 20,
    "max_bootstrap_cells": 10,
    "max_fit_cells": 20,
    "max_baseline_cells": 10,
    "lpd_threads": 1,
    "seed": 0,
}


@documents_settings()
@dataclass
class ReportSettings:
    """Sizes and seeds of the diagnostics (all recorded in the report).

    Each field is declared once here, with its description; :func:`countvae.diagnostics.report` takes the fields as
    keywords (or all as ``settings=ReportSettings(...)``), and its signature and "Parameters" section, and the
    attributes below, are generated from them (``countvae._settings``).

    Attributes
    ----------
    {settings}

    """

    n_lpd_samples: int = setting(100, "Importance samples per cell for the held-out log predictive density.")
    max_lpd_cells: int = setting(500, "Held-out cells whose log predictive density is estimated at most.")
    max_expression_cells: int = setting(
        1_000, "Cells on which decoded means, normalized expression and the decoder Gram are compared."
    )
    max_genes: int = setting(
        500,
        """Genes (largest variance of log1p-normalized counts) on which decoded means, normalized expression and the
        decoder Gram are compared.""",
    )
    max_jacobian_cells: int = setting(200, "Cells whose decoder Jacobians span the gene-space subspace.")
    max_ppc_cells: int = setting(300, "Cells of the posterior predictive checks.")
    n_ppc_samples: int = setting(10, "Draws of the posterior predictive checks.")
    n_rhat_cells: int = setting(20, "Cells of the cross-seed R-hat.")
    n_rhat_draws: int = setting(100, "Guide draws per seed of the cross-seed R-hat.")
    n_rhat_genes: int = setting(10, "Genes of the cross-seed R-hat.")
    max_distance_cells: int = setting(1_000, "Cells whose pairwise distances are compared.")
    max_knn_cells: int = setting(5_000, "Cells whose k-NN graphs (``k`` neighbours) are compared.")
    k: int = setting(15, "Neighbours in the compared k-NN graphs.")
    knn_graph_cells: int | None = setting(
        None,
        """Cells of the graph the k-NN row speaks about (``None``: the held-out and fit cells together, the graph an
        analyst builds on all of their cells). The held-out cells' neighbours are found among every held-out and fit
        cell the report has; where that graph has another number of cells than this (a report on held-out cells only),
        ``k`` is scaled so that a neighbourhood keeps its share of the cells.""",
    )
    n_markers: int = setting(8, "Default markers (genes of largest variance) when none are given.")
    ica: bool = setting(
        True,
        """Add the ICA map class, the ICA efficiency, the ICA coordinates row and the per-component stability of ICA
        across seeds (``DiagnosticReport.ica``).""",
    )
    ica_threshold: float = setting(
        ICA_THRESHOLD,
        """An ICA component agrees across seeds when its worst best-match |correlation| with another seed's
        components, corrected for the ICA's estimation error, is at least this, with confidence (see
        :mod:`countvae.diagnostics.analyses.components`).""",
    )
    max_fit_cells: int = setting(
        10_000,
        """Fit cells (when known) whose latent means each seed gives: each seed's ICA is estimated on them, in two
        disjoint halves, and they get the per-cell columns. The k-NN row finds the held-out cells' neighbours among
        every fit cell whatever this is; the within-seed baseline, batch mixing and placement among these.""",
    )
    alpha: float = setting(
        0.05,
        """Each side of every interval, and each one-sided test of predictive equivalence, errs with this
        probability (intervals at level ``1 - 2 alpha``).""",
    )
    n_bootstrap: int = setting(
        N_REPLICATES, "Replicates of the paired bootstrap over cells behind each row's interval."
    )
    max_bootstrap_cells: int = setting(
        MAX_CELLS,
        """Cells the bootstrap resamples at most (beyond, an m-out-of-n bootstrap; see
        :mod:`countvae.diagnostics.analyses.resampling`).""",
    )
    equivalence_margin: float = setting(
        EQUIVALENCE_MARGIN,
        """Margin of the predictive equivalence test, as a share of the mean per-cell gain of the fits' held-out
        log p(x) over a model without latent variables (see :mod:`countvae.diagnostics.analyses.predictive`).""",
    )
    max_baseline_cells: int = setting(5_000, "Cells the no-latent baseline is estimated on at most.")
    seed: int = setting(0, "Seed of every subset and Monte Carlo draw.")
    blas_threads: int | None = setting(
        1,
        """BLAS threads during the analysis (``None``: leave as set). The matrices here are small (cells x latent
        dims), so extra threads gain little, while on a busy machine spin-waiting BLAS threads made single calls up
        to 100x slower in our measurements; hence 1.""",
    )
    lpd_jobs: int | str = setting(
        "auto",
        """Worker processes that estimate the fits' held-out log p(x), one fit per task (the most expensive output
        of the report). ``"auto"``: the first fit is estimated in this process and timed, and the others go to one
        worker per usable core when that saves more than the workers take to start (on small data it does not);
        1: all in this process. Every estimate runs on ``lpd_threads`` torch threads wherever it runs, so the
        numbers do not depend on it (:mod:`countvae.diagnostics.reporting.heldout_lpd`).""",
    )
    lpd_threads: int = setting(
        1,
        """Torch threads of each held-out log p(x) estimate. On CPU the estimates depend on the thread count (up to
        0.84 nats on a Kang cell between 1 and 2 threads), so a fixed count gives the same numbers on machines with
        other cores, and workers of one thread each do not oversubscribe the cores.""",
    )

    def validate(self) -> None:
        """Raise :class:`InvalidArgumentError` for sizes that cannot work, or a switch that is not True or False."""
        # the checked values are kept: a numpy integer reached torch's manual_seed, which refuses it
        check_bool("ica", self.ica)
        self.ica_threshold = check_number("ica_threshold", self.ica_threshold, 0.0, 1.0, low_open=True)
        self.alpha = check_number("alpha", self.alpha, 0.0, 0.5, low_open=True, high_open=True)
        self.equivalence_margin = check_number("equivalence_margin", self.equivalence_margin, 0.0, 1.0, low_open=True)
        if self.blas_threads is not None:
            self.blas_threads = check_int("blas_threads (or None)", self.blas_threads, minimum=1)
        if self.knn_graph_cells is not None:
            self.knn_graph_cells = check_int("knn_graph_cells (or None)", self.knn_graph_cells, minimum=2)
        for name, low in MINIMUM.items():
            setattr(self, name, check_int(name, getattr(self, name), minimum=low))
        if self.lpd_jobs != "auto":
            self.lpd_jobs = check_int('lpd_jobs (or "auto")', self.lpd_jobs, minimum=1)

    def replace(self, **overrides: Any) -> ReportSettings:
        """A validated copy with some fields replaced.

        Raises
        ------
        InvalidArgumentError
            For a name that is not a field, or a value :meth:`validate` refuses.

        """
        unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise InvalidArgumentError(f"Unknown report settings {unknown}; see ReportSettings.")
        out = dataclasses.replace(self, **overrides)
        out.validate()
        return out

    def to_dict(self) -> dict[str, Any]:
        """The settings by name."""
        return dataclasses.asdict(self)
