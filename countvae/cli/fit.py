"""``countvae fit``: train one model, save it, and report its held-out log predictive density."""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np
import pandas as pd

from countvae._checks import check_number
from countvae._io import FolderLayout, atomic_directory, check_writable, refuse_foreign_entries, write_json_atomic
from countvae.cli.common import (
    Subcommands,
    add_data_arguments,
    add_model_arguments,
    add_output_arguments,
    emit,
    exit_codes,
    importance_samples,
    model_kwargs_of,
    progress_enabled,
    read_h5ad,
    refuse_existing_output,
    refuse_inputs_in_output,
    train_kwargs_of,
)
from countvae.cli.first_contact import (
    DEFAULT_DRAWS,
    HeldoutLpd,
    add_gene_selection_argument,
    announce,
    choose_genes,
    estimate,
)
from countvae.data.registry import get_registry, setup_anndata
from countvae.data.simulate import simulate
from countvae.data.split import split_indices
from countvae.diagnostics.fitting.fit_seeds import check_fit_batches, check_fit_genes
from countvae.errors import InvalidArgumentError
from countvae.model import CountVAE
from countvae.model.anndata_results import training_record
from countvae.model.persistence import MODEL_FOLDER
from countvae.model.training import default_max_epochs

logger = logging.getLogger("countvae.cli")

#: What ``--out`` holds; ``--overwrite`` replaces it whole, so only a folder holding nothing else.
FIT_OUTPUT = FolderLayout(
    "a `countvae fit` output folder",
    frozenset({"fit.json", "latent.csv", "heldout_lpd.csv"}),
    {"model": MODEL_FOLDER},
)

EXAMPLES = """examples:
  countvae fit                                   # embedded simulated data, writes ./countvae_fit
  countvae fit pbmc.h5ad --layer counts --batch-key donor --n-latent 10 --out fit_pbmc
  countvae fit pbmc.h5ad --decoder linear --likelihood poisson --max-epochs 100 --json
  countvae fit raw_10x.h5ad --n-top-genes 2000 --no-early-stopping   # every epoch, at 1e-3

Before fitting, the command prints the data size, the settings and the time it expects
(from a few timed training steps; the held-out log p(x) after training included), with the
options that shorten it.
"""


def register(sub: Subcommands) -> None:
    """Add the ``fit`` subcommand."""
    p = sub.add_parser(
        "fit",
        help="train one model and report its held-out log predictive density",
        description=(
            "Train a count VAE on the cells not held out, save it, and write the per-cell latent "
            "means and the held-out log predictive density (importance sampling with per-cell proposals, nats; "
            "heldout_lpd.csv has each cell's Monte Carlo SE, ESS, Pareto k-hat and reliable flag)."
        ),
        epilog=EXAMPLES + "\n" + exit_codes(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_data_arguments(p)
    add_model_arguments(p)
    add_gene_selection_argument(p, None)
    p.add_argument("--heldout-fraction", type=float, default=0.1, help="cells kept out of training (default 0.1)")
    p.add_argument(
        "--n-samples",
        type=importance_samples,
        default=None,
        help="importance draws per held-out cell entering the estimate (default 800, after a 200-draw pilot)",
    )
    p.add_argument("--seed", type=int, default=0)
    add_output_arguments(p, "countvae_fit")
    p.set_defaults(run=run)


def default_data():
    """The embedded default: 3,000 cells x 300 genes from a 5-source linear NB model with 2 batches."""
    return simulate(n_cells=3000, n_genes=300, n_latent=5, decoder="linear", sources="laplace", n_batches=2, seed=0)


def run(args: argparse.Namespace) -> int:
    """Execute ``countvae fit``."""
    started = time.perf_counter()
    check_number("heldout_fraction (--heldout-fraction)", args.heldout_fraction, 0.0, 1.0, high_open=True)
    refuse_inputs_in_output(args.out, {"the data file": args.data})
    refuse_existing_output(args.out, args.overwrite)
    refuse_foreign_entries(args.out, args.overwrite, FIT_OUTPUT)
    adata = read_h5ad(args.data) if args.data else default_data()
    batch_key = args.batch_key if args.data or args.batch_key else "batch"  # the embedded data's batches
    setup_anndata(adata, layer=args.layer, batch_key=batch_key, labels_key=args.labels_key, use_raw=args.use_raw)
    genes = choose_genes(adata, args.n_top_genes, None, args.n_latent)
    adata = genes.adata
    fit_idx, held_idx = split_indices(adata.n_obs, 1.0 - args.heldout_fraction, args.seed)
    if len(held_idx) == 1:  # no standard error of the held-out log p(x); refused before training
        raise InvalidArgumentError(
            f"--heldout-fraction {args.heldout_fraction} holds out 1 of {adata.n_obs} cells; hold out at least 2 "
            "(a larger --heldout-fraction), or none with --heldout-fraction 0."
        )
    fit_data = adata[fit_idx].copy()
    # refused as diagnose refuses them, naming the held-out split (the model's own error named only the genes' counts)
    check_fit_genes(fit_data, get_registry(fit_data))
    check_fit_batches(fit_data, get_registry(fit_data), adata)
    show = progress_enabled(args)
    model_kwargs, train_kwargs = model_kwargs_of(args), train_kwargs_of(args)
    model = CountVAE(fit_data, **model_kwargs)
    timing = estimate(fit_data, model_kwargs, train_kwargs, None)
    announce(
        "fit",
        data=args.data or "the embedded simulated data",
        adata=adata,
        n_fit=len(fit_idx),
        n_heldout=len(held_idx),
        genes=genes,
        model_kwargs=model_kwargs,
        train_kwargs=train_kwargs,
        epochs=default_max_epochs(int(round(0.9 * len(fit_idx)))) if args.max_epochs is None else args.max_epochs,
        timing=timing,
        heldout_lpd=HeldoutLpd(len(held_idx), DEFAULT_DRAWS if args.n_samples is None else args.n_samples),
    )
    check_writable(args.out)  # learnt after training, an unwritable --out would lose the fit
    model.train(**train_kwargs, seed=args.seed, progress_bar=show)
    result = {
        "data": args.data or "embedded simulation",
        "n_cells": int(adata.n_obs),
        "n_genes": int(adata.n_vars),
        "gene_selection": genes.record(),
        "n_heldout": int(len(held_idx)),
        "training": training_record(model),  # the kept epoch's losses, as write_results records them
    }
    with atomic_directory(args.out, overwrite=args.overwrite, layout=FIT_OUTPUT) as out:
        model.save(out / "model")
        latent = model.get_latent_representation(adata)
        pd.DataFrame(latent, index=adata.obs_names, columns=[f"z{i}" for i in range(latent.shape[1])]).assign(
            heldout=np.isin(np.arange(adata.n_obs), held_idx)
        ).to_csv(out / "latent.csv")
        if len(held_idx):
            held = adata[held_idx].copy()
            lpd = model.get_log_predictive_density(held, n_samples=args.n_samples, seed=args.seed, progress_bar=show)
            lpd.to_csv(out / "heldout_lpd.csv")
            result["heldout_lpd_per_cell"] = float(lpd["lpd"].mean())
            result["heldout_lpd_se"] = float(lpd["lpd"].std(ddof=1) / np.sqrt(len(lpd)))
            reliable = lpd["reliable"].to_numpy(dtype=bool)
            # no standard error exists for an unreliable cell (NaN); JSON has no NaN, so None when none is reliable
            result["heldout_lpd_max_mc_se"] = float(lpd["mc_se"][reliable].max()) if reliable.any() else None
            result["heldout_lpd_n_unreliable"] = int((~reliable).sum())
        result["seconds"] = round(time.perf_counter() - started, 2)
        write_json_atomic(out / "fit.json", result)
    result["out"] = str(args.out)
    emit(result, args.json)
    return 0
