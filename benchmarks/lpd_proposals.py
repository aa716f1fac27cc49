"""Held-out log p(x): amortized-guide importance sampling vs the default per-cell t-mixture estimator.

Both are compared with exact adaptive Gauss-Hermite quadrature on simulated linear Poisson/NB data
(the fits of tests/model/test_lpd.py). Run from the repository root:

    PYTHONPATH=. .venv/bin/python benchmarks/lpd_proposals.py
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import torch

import countvae as cv
from countvae import invariance as inv


def fit(likelihood: str, n_latent: int, library_size: float) -> cv.CountVAE:
    """The model of tests/model/test_lpd.py::_fit."""
    adata = cv.data.simulate(
        n_cells=1000,
        n_genes=30,
        n_latent=n_latent,
        decoder="linear",
        likelihood=likelihood,
        library_size=library_size,
        seed=1,
    )
    cv.CountVAE.setup_anndata(adata)
    model = cv.CountVAE(
        adata,
        n_latent=n_latent,
        decoder="linear",
        likelihood=likelihood,
        dtype=torch.float64,
        dropout_rate=0.0,
        batch_norm=False,
        n_hidden=64,
        n_layers=2,
    )
    model.train(early_stopping=False, max_epochs=150, lr=3e-3, progress_bar=False, seed=0)
    return model


def main() -> None:
    torch.set_num_threads(1)
    rows = []
    for likelihood, n_latent, library_size in [("poisson", 1, 300), ("poisson", 2, 2000), ("nb", 2, 500)]:
        model = fit(likelihood, n_latent, library_size)
        idx = model.validation_indices[:40]
        exact = inv.quadrature_log_marginal(model, indices=idx)
        for name, estimate in [
            (
                "amortized guide",
                lambda m=model, i=idx: m.get_log_predictive_density(indices=i, n_samples=1000, seed=3, method="guide"),
            ),
            (
                "default (t mixture at the modes)",
                lambda m=model, i=idx: m.get_log_predictive_density(indices=i, seed=3),
            ),
        ]:
            started = time.perf_counter()
            frame = estimate()
            seconds = time.perf_counter() - started
            error = frame["lpd"].to_numpy() - exact
            rows.append(
                {
                    "model": f"{likelihood}, L={n_latent}, library {library_size:g}",
                    "proposal": name,
                    "mean error": error.mean(),
                    "max |error|": np.abs(error).max(),
                    "median ESS of 1000": np.median(frame["ess"]),
                    "within 4 MC se": np.mean(np.abs(error) <= 4 * frame["mc_se"].to_numpy() + 1e-3),
                    "seconds (40 cells)": seconds,
                }
            )
    print(pd.DataFrame(rows).round(4).to_string(index=False))


if __name__ == "__main__":
    main()
