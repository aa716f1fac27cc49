"""``countvae diagnose``: fit several seeds, compare them, and write the multi-seed report.

The output folder holds ``fits/`` (the resumable :func:`fit_seeds` folder: an
interrupted run started again with the same command refits only the seeds that
had not finished) and ``report/`` (report.html, report.json, report.md), written
at the end in one atomic step. A folder that already holds a finished report is
refused unless ``--overwrite`` is given, which also refits every seed.

Per-seed progress messages come from ``fit_seeds``' progress events
(:mod:`countvae.diagnostics.fitting.progress`), not from its log text.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd

from countvae._io import remove_interrupted_writes
from countvae.cli.common import (
    Subcommands,
    add_data_arguments,
    add_model_arguments,
    add_output_arguments,
    emit,
    exit_codes,
    progress_enabled,
    read_h5ad,
)
from countvae.data.registry import get_registry, get_var_names, setup_anndata
from countvae.data.simulate import simulate
from countvae.diagnostics import fit_seeds, report
from countvae.diagnostics.analyses.markers import marker_matrix
from countvae.diagnostics.fitting.progress import SEED_REUSED, SEED_STORED, Progress, ProgressEvent
from countvae.errors import InvalidArgumentError, OutputExistsError

logger = logging.getLogger("countvae.cli")

EXAMPLES = """examples:
  countvae diagnose                                  # embedded simulated data with known sources
  countvae diagnose pbmc.h5ad --batch-key donor --labels-key cell_type --seeds 5 --out diag_pbmc
  countvae diagnose pbmc.h5ad --layer counts --markers CD14,MS4A1,NKG7 --n-jobs 5 --json
  countvae diagnose pbmc.h5ad --decoder linear --likelihood poisson --no-ica --max-epochs 100

An interrupted run resumes when started again with the same command (completed seeds are reused).
"""

#: Latent dimensions and training epochs of the embedded default when not given on the command line.
EMBEDDED_N_LATENT = 5
EMBEDDED_MAX_EPOCHS = 100
#: Cells visited per seed by default (epochs x training cells): about 2.5 minutes per seed for data
#: like Kang (7,800 cells x 2,500 genes, ~1.3 s per epoch on one core), so 5 seeds fit in 15 minutes.
CELL_PASSES_PER_SEED = 600_000
#: Convergence-based stopping, on by default in ``diagnose`` (``--no-early-stopping`` turns it off), chosen in
#: benchmarks/bench_stopping.py (section "stopping" of benchmarks/RESULTS.md): on Kang it stopped 3 seeds after
#: 52-54 of the 77 default epochs, with a held-out ELBO no worse than training all 77 epochs.
DEFAULT_STOPPING = {
    "check_val_every_n_epoch": 2,
    "early_stopping_patience": 10,
    "early_stopping_relative_delta": 1e-3,
}


def default_epochs(n_fit_cells: int) -> int:
    """Epochs per seed when ``--max-epochs`` is not given: 600,000 cell passes, between 20 and 400.

    scvi-tools' default (``min(20000 / n * 400, 400)``, 400 epochs below 20,000 cells)
    is made for one fit; ``diagnose`` fits several, so it trains each for a fixed
    number of cell passes instead (77 epochs on 7,800 cells). The number is fixed
    rather than a time budget, so that a resumed run reproduces the same fits.
    """
    return int(min(400, max(20, round(CELL_PASSES_PER_SEED / max(n_fit_cells, 1)))))


def register(sub: Subcommands) -> None:
    """Add the ``diagnose`` subcommand."""
    p = sub.add_parser(
        "diagnose",
        help="fit several seeds and report which results survive a re-run",
        description=(
            "Fit the same count VAE from several seeds on one shared held-out split, then compare the fits "
            "on the held-out cells: predictive equivalence, alignment of the latent spaces under five classes "
            "of map, rotation-invariant geometry, cross-seed R-hat, the marker pitfall and posterior predictive "
            "checks. Writes OUT/report/report.html (self-contained), report.json and report.md."
        ),
        epilog=EXAMPLES + "\n" + exit_codes(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_data_arguments(p)
    add_model_arguments(
        p,
        help_text={
            "max_epochs": "epochs per seed (default: 600,000 cell passes, 20 to 400 epochs; 100 on the embedded data)",
            "n_latent": "latent dimensions (default: 10; 5 on the embedded data)",
            "early_stopping": "stop a seed when its validation loss stalls, keeping its best epoch (default: on; "
            "validation every 2 epochs, patience 10 epochs, improvements under 0.1%% do not count)",
        },
    )
    p.set_defaults(n_latent=None, max_epochs=None, early_stopping=True)
    p.add_argument("--seeds", type=int, default=5, help="number of seeds, fitted as seeds 0..N-1 (default: 5)")
    p.add_argument("--heldout-fraction", type=float, default=0.1, help="cells held out from every fit (default 0.1)")
    p.add_argument("--split-seed", type=int, default=0, help="seed of the held-out split (default 0)")
    p.add_argument("--n-jobs", type=int, default=1, help="seeds fitted at once in worker processes (-1: all cores)")
    p.add_argument(
        "--markers",
        default=None,
        help="comma-separated genes or obs columns for the marker analysis "
        "(default: the most variable genes, plus --labels-key)",
    )
    p.add_argument(
        "--ica",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="add the ICA map class, ICA efficiency, ICA coordinates and the per-component stability of ICA "
        "across seeds to the report (default: on)",
    )
    p.add_argument("--n-lpd-samples", type=int, default=100, help="importance samples per held-out cell (default 100)")
    add_output_arguments(p, "countvae_diagnose")
    p.set_defaults(run=run)


def default_data():
    """The embedded default: 3,000 cells x 300 genes, NB counts from 5 Laplace sources, 2 batches.

    The true sources are added as ``obs`` columns ``true_source_0`` ... so that the
    report's marker analysis shows each one's rotation-invariant R^2 next to its
    per-dimension correlations.
    """
    adata = simulate(n_cells=3000, n_genes=300, n_latent=5, decoder="linear", sources="laplace", n_batches=2, seed=0)
    for k in range(adata.obsm["z_true"].shape[1]):
        adata.obs[f"true_source_{k}"] = adata.obsm["z_true"][:, k]
    return adata


class SeedProgressMessages:
    """Turns fit_seeds' progress events into 'k of n seeds done, about T left' messages.

    Counts the seeds stored or reused (events of the calling process); the
    estimate of the time left is wall time so far per fitted seed times the
    seeds left, so it accounts for seeds fitted in parallel. Picklable, as
    ``fit_seeds`` requires of a ``progress`` sent to worker processes (where it
    ignores the events it receives).
    """

    def __init__(self, n_seeds: int):
        self.n_seeds = n_seeds
        self.done = 0
        self.fitted = 0
        self.started = time.perf_counter()

    def __call__(self, event: ProgressEvent) -> None:
        """Log a message when a seed is done (stored or reused)."""
        if event.kind not in (SEED_STORED, SEED_REUSED):
            return
        self.done += 1
        self.fitted += event.kind == SEED_STORED
        left = self.n_seeds - self.done
        elapsed = time.perf_counter() - self.started
        estimate = f"; about {_duration(elapsed / self.fitted * left)} left" if self.fitted and left else ""
        logger.info("%d of %d seeds done (%s elapsed%s).", self.done, self.n_seeds, _duration(elapsed), estimate)


class _Both:
    """Calls two progress callables in turn (picklable, unlike a closure over them)."""

    def __init__(self, first: Progress, second: Progress | None):
        self.first, self.second = first, second

    def __call__(self, event: ProgressEvent) -> None:
        self.first(event)
        if self.second is not None:
            self.second(event)


def _duration(seconds: float) -> str:
    seconds = max(0.0, float(seconds))
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def _markers(text: str | None) -> list[str] | None:
    if text is None:
        return None
    markers = [m.strip() for m in text.split(",") if m.strip()]
    if not markers:
        raise InvalidArgumentError("--markers is empty; give comma-separated genes or obs columns.")
    return markers


def run(args: argparse.Namespace, progress: Progress | None = None) -> int:
    """Execute ``countvae diagnose``.

    Parameters
    ----------
    args
        The parsed command line.
    progress
        Also called with every progress event of the run (the seeds' from
        ``fit_seeds`` and the report files' from ``DiagnosticReport.save``),
        after the command's own messages; see :mod:`countvae.diagnostics.fitting.progress`.

    """
    started = time.perf_counter()
    out = Path(args.out)
    report_dir = out / "report"
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"{out} exists and is not a folder; choose another --out.")
    if report_dir.exists() and not args.overwrite:
        raise OutputExistsError(
            f"{report_dir} already holds a finished report; pass --overwrite to refit and replace it, "
            "or choose another --out."
        )
    if args.seeds < 2:
        raise InvalidArgumentError(f"--seeds must be at least 2 to compare fits, got {args.seeds}.")
    markers = _markers(args.markers)
    embedded = args.data is None
    adata = default_data() if embedded else read_h5ad(args.data)
    batch_key = "batch" if embedded and args.batch_key is None else args.batch_key
    setup_anndata(adata, layer=args.layer, batch_key=batch_key, labels_key=args.labels_key, use_raw=args.use_raw)
    n_latent = args.n_latent if args.n_latent is not None else (EMBEDDED_N_LATENT if embedded else 10)
    n_fit_cells = int(round((1.0 - args.heldout_fraction) * adata.n_obs))
    if args.max_epochs is not None:
        max_epochs = args.max_epochs
    else:
        max_epochs = EMBEDDED_MAX_EPOCHS if embedded else default_epochs(n_fit_cells)
    if embedded and markers is None:
        markers = [f"true_source_{k}" for k in range(adata.obsm["z_true"].shape[1])]
    if markers is not None:  # fail before hours of fitting, not after
        marker_matrix(adata, markers, get_var_names(adata, get_registry(adata)))
    show = progress_enabled(args)
    model_kwargs = {
        "n_latent": n_latent,
        "likelihood": args.likelihood,
        "decoder": args.decoder,
        "n_hidden": args.n_hidden,
        "n_layers": args.n_layers,
    }
    train_kwargs = {
        "max_epochs": max_epochs,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "early_stopping": args.early_stopping,
        **(DEFAULT_STOPPING if args.early_stopping else {}),
        "progress_bar": False,
    }
    logger.info(
        "Fitting %d seeds of a %s/%s model with %d latent dimensions, %d epochs each, on %s (%d cells x %d genes).",
        args.seeds,
        args.likelihood,
        args.decoder,
        n_latent,
        max_epochs,
        "the embedded simulated data" if embedded else args.data,
        adata.n_obs,
        adata.n_vars,
    )
    fits = fit_seeds(
        adata,
        seeds=range(args.seeds),
        model_kwargs=model_kwargs,
        train_kwargs=train_kwargs,
        heldout_fraction=args.heldout_fraction,
        split_seed=args.split_seed,
        n_jobs=args.n_jobs,
        out_dir=out / "fits",
        overwrite=args.overwrite,
        progress_bar=show,
        progress=_Both(SeedProgressMessages(args.seeds), progress),
    )
    fitted = time.perf_counter()
    logger.info("Comparing the %d fits on %d held-out cells.", len(fits), fits.adata_heldout.n_obs)
    rep = report(fits, markers=markers, ica=args.ica, n_lpd_samples=args.n_lpd_samples, progress_bar=show)
    for path in remove_interrupted_writes(report_dir.parent, report_dir.name):
        logger.info("Removed %s, left by a run interrupted while writing its report.", path)
    rep.save(report_dir, overwrite=args.overwrite, progress=progress)
    finished = time.perf_counter()
    table = rep.invariants.set_index("quantity")["verdict"]
    result = {
        "report": str(report_dir / "report.html"),
        "data": args.data or "embedded simulation (5 Laplace sources)",
        "seeds": fits.seeds,
        "reused_seeds": list(fits.reused_seeds),
        "heldout_cells": int(fits.adata_heldout.n_obs),
        "predictively_equivalent": rep.settings["predictively_equivalent"],
        "stable": [q for q, v in table.items() if v == "stable"],
        "stable_up_to_rotation": [q for q, v in table.items() if v == "stable up to rotation"],
        "unstable": [q for q, v in table.items() if v == "unstable"],
        "seconds_fitting": round(fitted - started, 1),
        "seconds_analysis": round(finished - fitted, 1),
        "seconds_fit_per_seed": {int(k): round(float(v), 1) for k, v in fits.seconds.items()},
        "alignment_error_by_map": _alignment_summary(rep.tables["alignment_summary"]),
    }
    if args.ica:
        reproducible = rep.ica["reproducible"].astype(bool)
        result["ica_components"] = {
            "reproducible": rep.ica.loc[reproducible, "component"].tolist(),
            "not_reproducible": rep.ica.loc[~reproducible, "component"].tolist(),
            "flagged_gaussian": rep.ica.loc[rep.ica["gaussian"].astype(bool), "component"].tolist(),
        }
    emit(result, args.json)
    if not args.json and not args.quiet:
        print("\n" + rep.summary())
        print(f"\nReport: {report_dir / 'report.html'}")
    return 0


def _alignment_summary(summary: pd.DataFrame) -> dict[str, float]:
    return {str(m): float(np.round(v, 4)) for m, v in zip(summary["map"], summary["error_diameter_mean"], strict=True)}
