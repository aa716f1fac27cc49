"""The result of fitting one model from several seeds on a shared held-out split."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd

from countvae.diagnostics.fitting.fitted_model import FittedModel


@dataclass
class SeedFits:
    """Fits of the same model from several seeds, with the cells they share.

    Made by :func:`countvae.diagnostics.fit_seeds` for :func:`countvae.diagnostics.report`. Every fit was trained on
    ``adata_fit`` and none saw ``adata_heldout``.

    Attributes
    ----------
    fits
        One :class:`FittedModel` per seed, in the order of the seeds given.
    adata_fit
        Cells the models were trained on (set up with the model class's ``setup_anndata`` for scvi-tools models).
    adata_heldout
        Cells held out from every fit (the same split for all seeds).
    settings
        What reproduces the fits: model class and arguments, training arguments, seeds, held-out fraction and split
        seed, data checksum, package versions.
    seconds
        Wall time of each fit, by seed (0 for a fit reused from ``out_dir``).
    out_dir
        Folder holding the saved fits, or ``None``.
    reused_seeds
        Seeds read from ``out_dir``, completed by an earlier (possibly interrupted) run, not fitted by this call.
    records
        Each seed's ``fit.json`` record: seconds, torch threads, host (and Ray node), and its ``training`` summary
        (``CountVAE.training_summary``).
    """

    fits: list[FittedModel]
    adata_fit: ad.AnnData
    adata_heldout: ad.AnnData
    settings: dict[str, Any] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)
    out_dir: Path | None = None
    reused_seeds: list[int] = field(default_factory=list)
    records: dict[int, dict[str, Any]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.fits)

    def __iter__(self) -> Iterator[FittedModel]:
        return iter(self.fits)

    def __getitem__(self, i: int) -> FittedModel:
        return self.fits[i]

    @property
    def seeds(self) -> list[int]:
        """Seeds of the fits, in order."""
        return [f.seed for f in self.fits]

    @property
    def training(self) -> pd.DataFrame:
        """A table with one row per seed (epochs trained, the most it could have trained, early stop, the epoch kept).

        Columns ``seed``, ``epochs_trained``, ``max_epochs``, ``stopped_early``, ``kept_epoch``, ``fit_seconds`` (of
        the run that made the fit) and ``reused`` (read from ``out_dir`` by this call); NaN where missing (scvi-tools
        fits record only the epochs trained).
        """
        rows = []
        for seed in self.seeds:
            record = self.records.get(seed, {})
            training = record.get("training", {})
            rows.append(
                {
                    "seed": seed,
                    "epochs_trained": training.get("epochs_trained", np.nan),
                    "max_epochs": training.get("max_epochs", np.nan),
                    "stopped_early": training.get("stopped_early", np.nan),
                    "kept_epoch": training.get("kept_epoch", np.nan),
                    "fit_seconds": record.get("seconds", np.nan),
                    "reused": seed in self.reused_seeds,
                }
            )
        return pd.DataFrame(rows)
