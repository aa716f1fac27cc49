"""Run fit_seeds from the command line, for the interruption tests (tests/test_resume.py).

Usage: python tests/seedrun.py DATA.h5ad OUT_DIR|- RESULTS.npz SEED [SEED ...]

Fits a small countvae model for each seed (one torch thread, in this process),
then writes each fit's held-out posterior means and log predictive densities to
RESULTS.npz and the seeds reused from OUT_DIR to stdout as JSON.
"""

from __future__ import annotations

import json
import logging
import sys

import torch


def main(argv: list[str]) -> None:
    data_path, out_dir, results_path, *seeds = argv
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")

    import anndata as ad
    import numpy as np

    from countvae.diagnostics import fit_seeds

    adata = ad.read_h5ad(data_path)
    fits = fit_seeds(
        adata,
        seeds=[int(s) for s in seeds],
        model_kwargs={"n_latent": 2, "n_hidden": 16, "decoder": "mlp"},
        train_kwargs={"max_epochs": 25, "batch_size": 64},
        out_dir=None if out_dir == "-" else out_dir,
        torch_threads=1,
        progress_bar=False,
    )
    results = {}
    for fit in fits:
        results[f"latent_{fit.seed}"] = fit.latent(fits.adata_heldout)
        results[f"lpd_{fit.seed}"] = fit.log_predictive_density(fits.adata_heldout, n_samples=20, seed=0).to_numpy()
    np.savez(results_path, **results)
    print(json.dumps({"reused": fits.reused_seeds, "seconds": {str(k): v for k, v in fits.seconds.items()}}))


if __name__ == "__main__":
    main(sys.argv[1:])
