"""Held-out log p(x) of scvi-tools LinearSCVI fits: scvi's ``get_marginal_ll`` vs countvae's estimate vs quadrature.

For each model (LinearSCVI with 2 latent dimensions on the most variable genes of a
shared real data set, trained on 90% of the cells), on held-out cells:

* ``get_marginal_ll(n_mc_samples=1000)``: scvi-tools' importance sampling from its guide;
* ``SCVIFit.log_predictive_density(n_samples=800)``: countvae's estimator on the scvi
  module's log joint (float64);
* exact ``log p(x)`` by adaptive Gauss-Hermite quadrature written from the decoder's
  weights (`benchmarks/scvi_quadrature.py`), converged to the
  reported node-doubling difference.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/scvi_lpd.py [--quick] [--cells 200] [--epochs 100] [--models 0,2] [--out FILE]

It prints a markdown section (and writes it to ``--out``) for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import load_average, machine_line  # noqa: E402
from lpd_accuracy import top_variable_genes  # noqa: E402
from scvi_quadrature import linear_scvi_log_marginal  # noqa: E402

from countvae._io import write_text_atomic  # noqa: E402
from countvae.diagnostics import SCVIFit  # noqa: E402
from countvae.diagnostics.fitting.scvi_log_joint import SCVICells, float64_copy  # noqa: E402

#: (label, data set, genes, LinearSCVI settings, epochs)
MODELS = (
    ("pbmc_3tech, NB, observed library", "pbmc_3tech", 300, {"gene_likelihood": "nb", "use_observed_lib_size": True}),
    (
        "pbmc_3tech, Poisson, observed library",
        "pbmc_3tech",
        300,
        {"gene_likelihood": "poisson", "use_observed_lib_size": True},
    ),
    ("pbmc_3tech, NB, latent library (LinearSCVI default)", "pbmc_3tech", 300, {}),
    ("kang2018, NB, observed library", "kang2018", 300, {"gene_likelihood": "nb", "use_observed_lib_size": True}),
)


def load(name: str, n_genes: int):
    import scvi

    import countvae as cv

    adata = cv.data.load_dataset(name)
    adata = adata[:, top_variable_genes(adata.X.tocsr(), n_genes)].copy()
    adata = adata[np.asarray(adata.X.sum(1)).ravel() > 0].copy()
    order = np.random.default_rng(0).permutation(adata.n_obs)
    n_train = int(0.9 * adata.n_obs)
    train, held = adata[np.sort(order[:n_train])].copy(), adata[np.sort(order[n_train:])].copy()
    scvi.model.LinearSCVI.setup_anndata(train, batch_key="batch")
    return train, held


def run_model(label: str, data: str, n_genes: int, settings: dict, epochs: int, n_cells: int) -> dict:
    import scvi

    train, held = load(data, n_genes)
    held = held[:n_cells].copy()
    scvi.settings.seed = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = scvi.model.LinearSCVI(train, n_latent=2, **settings)
        start = time.perf_counter()
        model.train(max_epochs=epochs, accelerator="cpu", enable_progress_bar=False)
        train_s = time.perf_counter() - start
    fit = SCVIFit(model, seed=0)
    prepared = fit._prepared(held)

    torch.manual_seed(0)
    start = time.perf_counter()
    theirs = model.get_marginal_ll(prepared, n_mc_samples=1000, return_mean=False).numpy().astype(np.float64)
    scvi_s = time.perf_counter() - start

    start = time.perf_counter()
    ours = fit.log_predictive_density(held, n_samples=800, seed=0)
    ours_s = time.perf_counter() - start

    tensors = next(iter(model._make_data_loader(adata=prepared, batch_size=held.n_obs, shuffle=False)))
    cells = SCVICells.from_tensors(float64_copy(model.module), tensors)
    loc, _ = cells.guide()
    nodes = 20 if cells.n_latent == 3 else 40
    start = time.perf_counter()
    exact = linear_scvi_log_marginal(model.module, tensors["X"], tensors["batch"], loc, n_nodes=nodes).numpy()
    quad_s = time.perf_counter() - start
    few = slice(0, 20)
    finer = linear_scvi_log_marginal(
        model.module, tensors["X"][few], tensors["batch"][few], loc[few], n_nodes=2 * nodes
    ).numpy()

    err = ours["lpd"].to_numpy() - exact
    scvi_err = theirs - exact
    return {
        "model": label,
        "quantity": fit.lpd_quantity.replace("|", "given"),
        "epochs": epochs,
        "cells": held.n_obs,
        "exact lpd/cell": exact.mean(),
        "quad node-doubling max diff": float(np.abs(finer - exact[few]).max()),
        "countvae mean err": err.mean(),
        "countvae mean abs err": np.abs(err).mean(),
        "countvae max abs err": np.abs(err).max(),
        "countvae within 3 SE": np.mean(np.abs(err) <= 3 * ours["mc_se"].to_numpy()),
        "countvae reliable": ours["reliable"].mean(),
        "scvi mean err": scvi_err.mean(),
        "scvi max abs err": np.abs(scvi_err).max(),
        "train s": train_s,
        "scvi s": scvi_s,
        "countvae s": ours_s,
        "quadrature s": quad_s,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="first model only, 20 cells, 20 epochs")
    parser.add_argument("--cells", type=int, default=200, help="held-out cells per model")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--models", default="", help="comma-separated positions in MODELS (default: all)")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown section here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    chosen = [MODELS[int(i)] for i in args.models.split(",")] if args.models else list(MODELS)
    models = chosen[:1] if args.quick else chosen
    n_cells, epochs = (20, 20) if args.quick else (args.cells, args.epochs)
    started = time.perf_counter()
    rows = [run_model(*m, epochs, n_cells) for m in models]
    table = pd.DataFrame(rows)
    command = "OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python benchmarks/scvi_lpd.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    text = "\n".join(
        [
            "## scvi-lpd: held-out log p(x) of LinearSCVI fits (get_marginal_ll vs countvae vs quadrature)",
            "",
            f"Command: `{command}` ({time.perf_counter() - started:.0f} s; load average {load_average()}).",
            f"Machine: {machine_line(1)}.",
            "",
            "Errors are estimate minus exact quadrature, nats per cell (negative: too low).",
            "",
            table.to_markdown(index=False, floatfmt=".4g"),
            "",
        ]
    )
    print(text)
    if args.out is not None:
        write_text_atomic(args.out, text)


if __name__ == "__main__":
    main()
