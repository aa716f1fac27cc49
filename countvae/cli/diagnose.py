"""``countvae diagnose``: fit several seeds, compare them, and write the multi-seed report.

The output folder holds ``fits/`` (the resumable :func:`fit_seeds` folder: an
interrupted run started again with the same command refits only the seeds that
had not finished) and ``report/`` (report.html, report.json, report.md), written
at the end in one atomic step. A folder that already holds a finished report is
refused unless ``--overwrite`` is given, which also refits every seed. With
``--write-h5ad PATH`` the analysed data (its cells and fitted genes) is also written
to an .h5ad file with the report's per-cell and per-gene columns, the consensus
latent and the first seed's latent (``obsm["X_countvae"]``), for scanpy. A
damaged seed folder stops the run with its name; ``--refit-broken`` moves it
aside and refits only that seed.

Per-seed progress messages come from ``fit_seeds``' progress events
(:mod:`countvae.diagnostics.fitting.progress`), not from its log text.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd

from countvae._checks import check_number
from countvae._io import atomic_file_path, remove_interrupted_writes
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
from countvae.cli.diagnose_restrictions import add_restriction_arguments, run_restrictions
from countvae.cli.first_contact import (
    add_gene_selection_argument,
    announce,
    choose_genes,
    estimate,
    missing_marker_genes,
)
from countvae.data.registry import get_registry, get_var_names, setup_anndata
from countvae.data.simulate import simulate
from countvae.diagnostics import DiagnosticReport, ReportSettings, SeedFits, fit_seeds, report
from countvae.diagnostics.analyses.markers import marker_matrix
from countvae.diagnostics.analyses.predictive import EQUIVALENCE_MARGIN
from countvae.diagnostics.fitting.backends import DEFAULT_TORCH_THREADS, available_cores
from countvae.diagnostics.fitting.fit_seeds import check_fit_genes
from countvae.diagnostics.fitting.heldout import cells_at, heldout_split
from countvae.diagnostics.fitting.progress import SEED_REUSED, SEED_STORED, Progress, ProgressEvent
from countvae.diagnostics.reporting.downstream_section import DownstreamRequest, de_groups
from countvae.errors import InvalidArgumentError, OutputExistsError

logger = logging.getLogger("countvae.cli")

EXAMPLES = """examples:
  countvae diagnose                                  # embedded simulated data with known sources
  countvae diagnose pbmc.h5ad --batch-key donor --labels-key cell_type --seeds 5 --out diag_pbmc
  countvae diagnose pbmc.h5ad --layer counts --markers CD14,MS4A1,NKG7 --n-jobs 5 --json
  countvae diagnose pbmc.h5ad --decoder linear --likelihood poisson --no-ica --max-epochs 100
  countvae diagnose pbmc.h5ad --labels-key cell_type --de cell_type --de-groups "CD14+ Monocytes" "NK cells"
  countvae diagnose raw_10x.h5ad --n-top-genes 4000 --n-jobs 2 --early-stopping
  countvae diagnose pbmc.h5ad --write-h5ad pbmc_countvae.h5ad   # the findings as obs/var columns, for scanpy

Before fitting, the command prints the data size, the settings and the time it expects per seed
(from a few timed training steps), with the options that shorten it.
  countvae diagnose --decoder linear --restrictions laplace,horseshoe,ica   # what each restriction buys

An interrupted run resumes when started again with the same command (completed seeds are reused).
"""

#: Keys of the JSON result -> verdict of the invariants table.
VERDICT_KEYS = {
    "agree": "agree",
    "agree_after_alignment": "agree after alignment",
    "differ": "differ",
    "undetermined": "undetermined",
}
#: Latent dimensions and training epochs of the embedded default when not given on the command line.
EMBEDDED_N_LATENT = 5
EMBEDDED_MAX_EPOCHS = 100
#: Cells visited per seed by default (epochs x training cells): about 2.5 minutes per seed for data
#: like Kang (7,800 cells x 2,500 genes, ~1.3 s per epoch on one core), so 5 seeds fit in 15 minutes.
CELL_PASSES_PER_SEED = 600_000
#: Genes kept by default (the most variable, on the raw counts) when the data has more: fitting time
#: grows with the genes, and a raw file of 11,533 genes took 6 minutes per seed with all of them
#: (benchmarks/RESULTS.md, first-contact). scvi-tools' tutorials keep 1,200 to 4,000.
DEFAULT_N_TOP_GENES = 2_000
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
    add_gene_selection_argument(p, DEFAULT_N_TOP_GENES)
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
    p.add_argument(
        "--equivalence-margin",
        type=float,
        default=EQUIVALENCE_MARGIN,
        help="margin of the predictive equivalence test, as a share of the held-out log p(x) per cell that the "
        f"latent variables add over a model without them (default {EQUIVALENCE_MARGIN:g})",
    )
    p.add_argument(
        "--de",
        metavar="GROUPBY",
        default=None,
        help="add the downstream section: DE calls between two groups of this obs column on the held-out cells, "
        "Leiden clusters and UMAP neighbourhoods, each compared across seeds against a baseline that re-runs "
        "only the downstream step on one fit (Leiden and UMAP need `pip install 'countvae[downstream]'`)",
    )
    p.add_argument(
        "--de-groups",
        nargs="+",
        metavar="G",
        default=None,
        help="the groups --de compares: G1 G2, or G1 alone for G1 against all other cells "
        "(default: the column's two groups; required when it has more)",
    )
    p.add_argument(
        "--write-h5ad",
        metavar="PATH",
        default=None,
        help="also write the analysed data to this .h5ad file with the report's per-cell columns (obs "
        "countvae_knn_agreement, countvae_lpd_mean, ...), per-gene columns (var countvae_decoded_agreement, ...), "
        "the consensus latent (obsm X_countvae_consensus), the first seed's latent (obsm X_countvae) and a summary "
        "(uns countvae_report); NaN for cells the report did not evaluate (the fit cells)",
    )
    add_restriction_arguments(p)
    add_output_arguments(p, "countvae_diagnose")
    p.add_argument(
        "--refit-broken",
        action="store_true",
        help="when a stored seed folder under OUT/fits is damaged (a file truncated, empty, altered or swapped), "
        "move it to OUT/fits/broken/ and refit only that seed, keeping the intact ones",
    )
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
    h5ad_out = _h5ad_destination(args.write_h5ad, args.overwrite)
    markers = _markers(args.markers)
    embedded = args.data is None
    adata = default_data() if embedded else read_h5ad(args.data)
    batch_key = "batch" if embedded and args.batch_key is None else args.batch_key
    setup_anndata(adata, layer=args.layer, batch_key=batch_key, labels_key=args.labels_key, use_raw=args.use_raw)
    n_latent = args.n_latent if args.n_latent is not None else (EMBEDDED_N_LATENT if embedded else 10)
    genes = choose_genes(adata, args.n_top_genes, DEFAULT_N_TOP_GENES, n_latent)
    if markers is not None and genes.selected:
        dropped = missing_marker_genes(markers, adata, genes.adata)
        if dropped:
            raise InvalidArgumentError(
                f"Marker genes {dropped} are not among the {genes.adata.n_vars:,} most variable genes kept for "
                "fitting; pass a larger --n-top-genes, --n-top-genes all, or other --markers."
            )
    adata = genes.adata
    n_fit_cells = int(round((1.0 - args.heldout_fraction) * adata.n_obs))
    if args.max_epochs is not None:
        max_epochs = args.max_epochs
    else:
        max_epochs = EMBEDDED_MAX_EPOCHS if embedded else default_epochs(n_fit_cells)
    if embedded and markers is None:
        markers = [f"true_source_{k}" for k in range(adata.obsm["z_true"].shape[1])]
    if markers is not None:  # fail before hours of fitting, not after
        marker_matrix(adata, markers, get_var_names(adata, get_registry(adata)))
    ReportSettings().replace(n_lpd_samples=args.n_lpd_samples, equivalence_margin=args.equivalence_margin)
    downstream = _downstream_request(args, adata)
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
    if args.restrictions is not None:
        if args.refit_broken:
            raise InvalidArgumentError(
                "--refit-broken applies to the seeds of a plain diagnose, not to --restrictions; remove the damaged "
                "seed folder that the error named and rerun."
            )
        return run_restrictions(args, adata, model_kwargs, train_kwargs, markers, show)
    check_number("--heldout-fraction", args.heldout_fraction, 0.0, 1.0, low_open=True, high_open=True)
    fit_idx, heldout_idx = heldout_split(adata.n_obs, args.heldout_fraction, args.split_seed)
    adata_fit = cells_at(adata, fit_idx)
    check_fit_genes(adata_fit, get_registry(adata_fit))  # before the warm-up, which would fail less clearly
    announce(
        "diagnose",
        data="the embedded simulated data" if embedded else args.data,
        adata=adata,
        n_fit=len(fit_idx),
        n_heldout=len(heldout_idx),
        genes=genes,
        model_kwargs=model_kwargs,
        train_kwargs=train_kwargs,
        epochs=max_epochs,
        timing=estimate(adata_fit, model_kwargs, train_kwargs, DEFAULT_TORCH_THREADS),
        seeds=args.seeds,
        n_jobs=args.n_jobs if args.n_jobs != -1 else available_cores(),
        cores=available_cores(),
        torch_threads=DEFAULT_TORCH_THREADS,
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
        refit_broken=args.refit_broken,
        progress=_Both(SeedProgressMessages(args.seeds), progress),
    )
    fitted = time.perf_counter()
    logger.info("Comparing the %d fits on %d held-out cells.", len(fits), fits.adata_heldout.n_obs)
    rep = report(
        fits,
        markers=markers,
        ica=args.ica,
        n_lpd_samples=args.n_lpd_samples,
        equivalence_margin=args.equivalence_margin,
        progress_bar=show,
        downstream=downstream,
    )
    for path in remove_interrupted_writes(report_dir.parent, report_dir.name):
        logger.info("Removed %s, left by a run interrupted while writing its report.", path)
    rep.save(report_dir, overwrite=args.overwrite, progress=progress)
    if h5ad_out is not None:
        write_analysed_h5ad(rep, fits, adata, h5ad_out, args.overwrite)
    finished = time.perf_counter()
    table = rep.invariants.set_index("quantity")["verdict"]
    result = {
        "report": str(report_dir / "report.html"),
        "data": args.data or "embedded simulation (5 Laplace sources)",
        "seeds": fits.seeds,
        "reused_seeds": list(fits.reused_seeds),
        "heldout_cells": int(fits.adata_heldout.n_obs),
        "predictive_equivalence": rep.settings["predictive_equivalence"]["state"],
        **{key: [q for q, v in table.items() if v == verdict] for key, verdict in VERDICT_KEYS.items()},
        "n_genes": int(adata.n_vars),
        "gene_selection": _selection_summary(genes.record()),
        "seconds_fitting": round(fitted - started, 1),
        "seconds_analysis": round(finished - fitted, 1),
        "seconds_fit_per_seed": {int(k): round(float(v), 1) for k, v in fits.seconds.items()},
        "alignment_error_by_map": _alignment_summary(rep.tables["alignment_summary"]),
    }
    if args.ica:
        result["ica_components"] = {
            key: rep.ica.loc[rep.ica["verdict"] == verdict, "component"].tolist()
            for key, verdict in VERDICT_KEYS.items()
            if verdict != "agree after alignment"
        } | {"flagged_gaussian": rep.ica.loc[rep.ica["gaussian"].astype(bool), "component"].tolist()}
    if h5ad_out is not None:
        result["h5ad"] = str(h5ad_out)
    if rep.downstream is not None:
        result["downstream"] = _downstream_summary(rep.downstream.summary, rep.downstream.status)
    emit(result, args.json)
    if not args.json and not args.quiet:
        print("\n" + rep.summary())
        print(f"\nReport: {report_dir / 'report.html'}")
    return 0


def _h5ad_destination(path: str | None, overwrite: bool) -> Path | None:
    """The --write-h5ad file, refused before any fitting when it exists without --overwrite."""
    if path is None:
        return None
    out = Path(path)
    if out.suffix != ".h5ad":
        raise InvalidArgumentError(f"--write-h5ad {path}: give a file name ending in .h5ad.")
    if out.exists() and not overwrite:
        raise OutputExistsError(f"{out} exists; pass --overwrite to replace it, or choose another --write-h5ad.")
    return out


def write_analysed_h5ad(
    rep: DiagnosticReport, fits: SeedFits, adata: ad.AnnData, path: Path, overwrite: bool = False
) -> Path:
    """Write ``adata`` (in memory) with the first seed's latent and the report's columns to ``path``, atomically."""
    adata = adata.to_memory() if adata.isbacked else adata.copy()
    fits.fits[0].model.write_results(adata, layer=None, overwrite=True)
    rep.write(adata, overwrite=True)
    with atomic_file_path(path, overwrite=overwrite) as tmp:
        adata.write_h5ad(tmp)
    logger.info("Wrote %s (%d cells, %d genes) with the report's columns.", path, adata.n_obs, adata.n_vars)
    return path


def _selection_summary(record: dict | None) -> dict | None:
    # The chosen genes themselves are in report.json (settings.fits.gene_selection).
    return None if record is None else {k: v for k, v in record.items() if k != "genes"}


def _alignment_summary(summary: pd.DataFrame) -> dict[str, float]:
    return {str(m): float(np.round(v, 4)) for m, v in zip(summary["map"], summary["error_diameter_mean"], strict=True)}


def _downstream_request(args: argparse.Namespace, adata: ad.AnnData) -> DownstreamRequest | None:
    """The downstream section asked for by ``--de``/``--de-groups``, checked against the data before any fitting."""
    if args.de is None:
        if args.de_groups is not None:
            raise InvalidArgumentError("--de-groups needs --de GROUPBY (the obs column the groups are in).")
        return None
    groups = list(args.de_groups or [])
    if len(groups) > 2:
        raise InvalidArgumentError(f"--de-groups takes one or two groups (G1 [G2]), got {len(groups)}: {groups}.")
    group1 = groups[0] if groups else None
    group2 = groups[1] if len(groups) == 2 else None
    try:
        de_groups(adata.obs, args.de, group1, group2)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"--de {args.de}: {exc}") from None
    return DownstreamRequest(groupby=args.de, group1=group1, group2=group2)


def _downstream_summary(summary: pd.DataFrame, status: dict[str, str]) -> dict[str, object]:
    out: dict[str, object] = {
        f"{r.output} {r.metric}": {
            "between_mean": round(float(r.between_mean), 4),
            "within_mean": None if np.isnan(r.within_mean) else round(float(r.within_mean), 4),
            "n_between": int(r.n_between),
            "n_within": int(r.n_within),
            "model_share": None if np.isnan(r.model_share) else round(float(r.model_share), 4),
        }
        for r in summary.itertuples()
    }
    out["not_computed"] = {k: v for k, v in status.items() if v.startswith("not computed")}
    return out
