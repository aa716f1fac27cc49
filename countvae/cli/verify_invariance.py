"""``countvae verify-invariance``: verify numerically on held-out cells that orthogonal maps leave p(x) unchanged."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from countvae._io import FolderLayout, atomic_directory, check_writable, refuse_foreign_entries
from countvae._report_files import REPORT_FOLDER
from countvae.cli.common import (
    MODEL_OPTIONS,
    TRAINING_OPTIONS,
    Subcommands,
    add_data_arguments,
    add_model_arguments,
    add_output_arguments,
    emit,
    exit_codes,
    in_option_terms,
    model_kwargs_of,
    progress_enabled,
    read_h5ad,
    refuse_existing_output,
    refuse_inputs_in_output,
    say,
    tell,
    train_kwargs_of,
)
from countvae.data.registry import setup_anndata
from countvae.data.simulate import simulate
from countvae.data.split import split_indices
from countvae.errors import InvalidArgumentError
from countvae.invariance import verify
from countvae.model import CountVAE, ModelSettings, TrainingPlan
from countvae.model.persistence import MODEL_FOLDER

logger = logging.getLogger("countvae.cli")

#: What ``--out`` holds (earlier releases wrote invariance.json and invariance.md instead of report/); ``--overwrite``
#: replaces it whole, so only a folder holding nothing else.
VERIFY_OUTPUT = FolderLayout(
    "a `countvae verify-invariance` output folder",
    frozenset({"invariance.json", "invariance.md"}),
    {"report": REPORT_FOLDER, "model": MODEL_FOLDER},
)

EXAMPLES = """examples:
  countvae verify-invariance                      # embedded simulated data, 2-d linear Poisson model
  countvae verify-invariance pbmc.h5ad --batch-key donor --n-latent 3 --out inv_pbmc
  countvae verify-invariance pbmc.h5ad --model countvae_fit/model --out inv_fit   # a model from `countvae fit`

The report is OUT/report/report.html (one self-contained page); report.json holds
every number, with this run's data, model and timing under settings.run.

With --model, the held-out cells are chosen exactly as `countvae fit` chose them
(same --heldout-fraction and --seed), so pass the values used for the fit. The model's
genes are taken from the file by name (from adata.raw with --use-raw, as for `fit --use-raw`),
and its layer unless --layer or --use-raw is given.
"""

#: This command fits a small model by default, so that the exact quadrature reference applies.
MODEL_DEFAULTS = {"n_latent": 2, "likelihood": "poisson", "decoder": "linear", "max_epochs": 100}


def register(sub: Subcommands) -> None:
    """Add the ``verify-invariance`` subcommand."""
    p = sub.add_parser(
        "verify-invariance",
        help="check that orthogonal latent maps leave the held-out log predictive density unchanged",
        description=(
            "Fit a count VAE (or load one with --model), then, on held-out cells, rewrite it in rotated, "
            "reflected and permuted latent coordinates and measure that log p(x), decoded expression and "
            "latent distances are unchanged while coordinates and loadings change; controls (non-orthogonal "
            "maps, non-Gaussian priors) must change log p(x) beyond the estimators' error. The evidence: "
            "independent estimates of both models, an estimate from the rotated model's own proposal, and "
            "exact quadrature on grids along each model's axes (linear Poisson or NB models with a normal "
            "or diagonal prior, up to 3 dimensions); the "
            "result is 'not verified' when the estimator is unreliable, or when a control changes log p(x) too "
            "little to be seen (inconclusive, as on a briefly trained NB model). Writes OUT/report/report.html "
            "(self-contained), report.json and report.md, and OUT/model when it fits the model."
        ),
        epilog=EXAMPLES
        + "\n"
        + exit_codes("; also when a measurement disagrees with the theory or the result is not verified"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_data_arguments(p)
    p.add_argument("--model", default=None, metavar="DIR", help="a saved model folder instead of fitting one")
    add_model_arguments(p, defaults=MODEL_DEFAULTS, unset_when_absent=True)
    p.add_argument("--heldout-fraction", type=float, default=0.1, help="cells kept out of training (default 0.1)")
    p.add_argument("--max-cells", type=int, default=500, help="held-out cells evaluated at most (default 500)")
    p.add_argument("--n-samples", type=int, default=500, help="importance draws per cell (default 500)")
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64", help="evaluation precision")
    p.add_argument("--no-controls", action="store_true", help="skip the non-orthogonal control maps")
    p.add_argument("--no-prior-controls", action="store_true", help="skip the Laplace / diagonal prior controls")
    p.add_argument("--elbo-refit-steps", type=int, default=200, help="steps of the per-cell mean-field refit (0: skip)")
    p.add_argument("--seed", type=int, default=0)
    add_output_arguments(p, "countvae_invariance")
    p.set_defaults(run=run)


def default_data():
    """The embedded default: 1,200 cells x 100 genes from a 2-d log-linear Poisson model with 2 batches."""
    return simulate(n_cells=1200, n_genes=100, n_latent=2, likelihood="poisson", library_size=500, n_batches=2, seed=0)


def _fit_settings(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model and training settings of the model fitted without ``--model``.

    The options given, else :data:`MODEL_DEFAULTS`, else the settings' own defaults (the options parse to ``None``
    when absent, so that ``--model`` can refuse every one given).
    """

    def filled(values: dict[str, Any], cls: type) -> dict[str, Any]:
        defaults = {field.name: field.default for field in dataclasses.fields(cls)}
        return {name: MODEL_DEFAULTS.get(name, defaults[name]) if v is None else v for name, v in values.items()}

    return filled(model_kwargs_of(args), ModelSettings), filled(train_kwargs_of(args), TrainingPlan)


def _check_arguments(args: argparse.Namespace) -> None:
    if not 0.0 < args.heldout_fraction < 1.0:
        raise InvalidArgumentError(f"--heldout-fraction must lie in (0, 1), got {args.heldout_fraction}.")
    for name in ("max_cells", "n_samples"):
        if getattr(args, name) < 2:
            raise InvalidArgumentError(f"--{name.replace('_', '-')} must be at least 2.")
    if args.elbo_refit_steps < 0:
        raise InvalidArgumentError("--elbo-refit-steps must not be negative.")
    if args.model is not None:
        set_here = [name for name in (*MODEL_OPTIONS, *TRAINING_OPTIONS) if getattr(args, name) is not None]
        if set_here:
            # a switch given as its --no- form parses to False: name it as typed
            options = ", ".join(
                f"--{'no-' if getattr(args, name) is False else ''}{name.replace('_', '-')}" for name in set_here
            )
            raise InvalidArgumentError(
                f"{options} set the model this command fits without --model; with --model DIR the trained model is "
                "checked as it is, so leave them out."
            )


def run(args: argparse.Namespace) -> int:
    """Execute ``countvae verify-invariance``."""
    started = time.perf_counter()
    _check_arguments(args)
    refuse_inputs_in_output(args.out, {"the data file": args.data, "the --model folder": args.model})
    refuse_existing_output(args.out, args.overwrite)
    refuse_foreign_entries(args.out, args.overwrite, VERIFY_OUTPUT)
    show = progress_enabled(args)
    adata = read_h5ad(args.data) if args.data else default_data()
    model = CountVAE.load(args.model) if args.model else None
    layer, use_raw = args.layer, args.use_raw
    batch_key = args.batch_key if args.data or args.batch_key else "batch"  # the embedded data's batches
    if model is not None:
        layer = layer if layer is not None or use_raw else model.registry.layer
        batch_key = batch_key if batch_key is not None else model.registry.batch_key
        if use_raw and layer is None and adata.raw is not None:  # with --layer too, setup_anndata refuses the pair
            # .raw's counts as X, so that the model's genes are taken from them below: `fit --use-raw` stores the
            # raw counts of the genes it kept as its X (its model records use_raw=False)
            adata, use_raw = adata.raw.to_adata(), False
        genes = model.var_names
        if not use_raw and not adata.var_names.equals(genes) and genes.isin(adata.var_names).all():
            adata = adata[:, model.var_names].copy()  # e.g. the genes `countvae fit --n-top-genes` kept, in order
    setup_anndata(adata, layer=layer, batch_key=batch_key, labels_key=args.labels_key, use_raw=use_raw)
    fit_idx, held_idx = split_indices(adata.n_obs, 1.0 - args.heldout_fraction, args.seed)
    if len(held_idx) < 2:
        raise InvalidArgumentError(f"Only {len(held_idx)} held-out cells; raise --heldout-fraction.")
    if len(held_idx) > args.max_cells:
        held_idx = np.sort(np.random.default_rng(args.seed).choice(held_idx, args.max_cells, replace=False))
    check_writable(args.out)  # learnt after training and the checks, an unwritable --out would lose them
    if model is None:
        model_kwargs, train_kwargs = _fit_settings(args)
        model = CountVAE(adata[fit_idx].copy(), **model_kwargs)
        logger.info("Training %r on %d cells", model, len(fit_idx))
        model.train(**train_kwargs, seed=args.seed, progress_bar=show)
    held = adata[held_idx].copy()
    logger.info("Checking invariance of %r on %d held-out cells", model, len(held_idx))
    report = verify(
        model,
        held,
        n_samples=args.n_samples,
        seed=args.seed,
        dtype=torch.float64 if args.dtype == "float64" else torch.float32,
        controls=not args.no_controls,
        prior_controls=not args.no_prior_controls,
        elbo_refit_steps=args.elbo_refit_steps,
        progress_bar=show,
    )
    report.settings["run"] = {
        "data": args.data or "embedded simulation",
        "model": args.model or "fitted by this command",
        "n_cells": int(adata.n_obs),
        "n_heldout_evaluated": int(len(held_idx)),
        "seconds": round(time.perf_counter() - started, 2),
    }
    report_dir = Path(args.out) / "report"
    with atomic_directory(args.out, overwrite=args.overwrite, layout=VERIFY_OUTPUT) as out:
        report.save(out / report_dir.name)
        if args.model is None:
            model.save(out / "model")
    if args.json:
        emit({"passed": report.passed, "out": str(args.out), "verdicts": report.to_dict()["verdicts"]}, as_json=True)
    else:
        say(in_option_terms(report.summary(), vars(args)))
        say(f"\nReport: {report_dir / 'report.html'} (also report.json, report.md)")
    if not report.passed:
        if report.status == "failed":
            problem = f"{len(report.disagreements)} checks disagree with the theory"
        else:
            reasons = report.reasons()
            more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
            problem = f"not verified: {reasons[0]}{more}"
        problem = in_option_terms(problem, vars(args))  # the report's remedies name verify()'s arguments
        tell(f"countvae verify-invariance: error: {problem}; see {report_dir / 'report.md'}")
        return 1
    return 0
