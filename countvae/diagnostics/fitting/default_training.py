"""How the multi-seed diagnostics train each seed when ``train_kwargs`` leaves it open, and on how many genes.

``diagnose`` and ``compare_models`` fit several models where an analyst would fit one, so each seed gets a
fixed budget of cell passes (:func:`default_epochs`); ``diagnose`` also stops early with the one shared rule
(:data:`~countvae.model.training.DEFAULT_STOPPING`), as a single ``CountVAE.train`` does by default within
scvi-tools' epochs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from countvae.model.training import DEFAULT_STOPPING

#: Cells visited per seed by default (epochs x training cells): about 2.5 minutes per seed for data
#: like Kang (7,800 cells x 2,500 genes, ~1.3 s per epoch on one core), so 5 seeds fit in 15 minutes.
CELL_PASSES_PER_SEED = 600_000
#: The stopping rule of ``diagnose`` (on unless ``train_kwargs`` has ``early_stopping=False``), the shared
#: ``DEFAULT_STOPPING`` as keywords of ``CountVAE.train``, its learning rate and its cut included (sections
#: "stopping-vs-full" and "stopping-variants" of benchmarks/RESULTS.md), which are also the TrainingPlan
#: defaults of a single ``CountVAE.train``.
DIAGNOSE_STOPPING = DEFAULT_STOPPING.settings()
#: Genes kept by default (the most variable, on the raw counts) when the data has more, by ``diagnose`` and
#: ``compare_models``: fitting time grows with the genes, and a raw file of 11,533 genes took 6 minutes per seed with
#: all of them (benchmarks/RESULTS.md, first-contact). scvi-tools' tutorials keep 1,200 to 4,000.
DIAGNOSE_N_TOP_GENES = 2_000


def default_epochs(n_fit_cells: int) -> int:
    """Epochs per seed when ``max_epochs`` is not given: 600,000 cell passes, between 20 and 400.

    scvi-tools' default (``min(20000 / n * 400, 400)``, 400 epochs below 20,000 cells) is made for one fit;
    ``diagnose`` fits several, each for a fixed number of cell passes (77 epochs on 7,800 cells), not a time budget,
    so that a resumed run reproduces the same fits.
    """
    return int(min(400, max(20, round(CELL_PASSES_PER_SEED / max(n_fit_cells, 1)))))


def diagnose_train_kwargs(
    train_kwargs: Mapping[str, Any] | None, n_fit_cells: int, early_stopping: bool = True
) -> dict[str, Any]:
    """``train_kwargs`` with the defaults of :func:`diagnose` filled in.

    ``max_epochs``: ``default_epochs``; ``early_stopping``: the given default (on for ``diagnose``), and when on
    ``DIAGNOSE_STOPPING`` for the settings not given (none when off: the model's own defaults apply); no progress bar.
    """
    given = {k: v for k, v in (train_kwargs or {}).items() if v is not None}
    kwargs: dict[str, Any] = {"max_epochs": default_epochs(n_fit_cells), "early_stopping": early_stopping, **given}
    if kwargs["early_stopping"]:
        kwargs = {**DIAGNOSE_STOPPING, **kwargs}
    return {**kwargs, "progress_bar": False}
