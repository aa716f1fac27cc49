"""``countvae select``: compare candidate models by held-out fit and cross-seed stability, and recommend one."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from countvae._io import explained_write_errors, refuse_foreign_entries
from countvae.cli.common import (
    Subcommands,
    add_data_arguments,
    add_output_arguments,
    emit,
    exit_codes,
    importance_samples,
    progress_enabled,
    read_h5ad,
    refuse_existing_output,
    refuse_inputs_in_output,
    say,
)
from countvae.cli.first_contact import (
    add_gene_selection_argument,
    counted,
    describe_genes,
    duration,
    estimate,
    learning_rate,
    lpd_seconds_per_cell,
    n_jobs_value,
    selection_summary,
    workers_start_seconds,
    workers_starting,
)
from countvae.data import GeneChoice
from countvae.data.registry import setup_anndata
from countvae.diagnostics import DIAGNOSE_N_TOP_GENES, FitSeedsSettings, compare_models, plan_parallelism
from countvae.diagnostics.analyses.model_comparison import MAX_HELDOUT_CELLS
from countvae.diagnostics.fitting.backends import DEFAULT_TORCH_THREADS, available_cores
from countvae.diagnostics.fitting.heldout import heldout_split
from countvae.diagnostics.fitting.run_lock import locked
from countvae.diagnostics.reporting.heldout_lpd import WORKER_START_SECONDS, auto_workers
from countvae.diagnostics.reporting.model_comparison_report import COMPARISON_FOLDER
from countvae.errors import InvalidArgumentError

logger = logging.getLogger("countvae.cli")

EXAMPLES = """examples:
  countvae select pbmc.h5ad --n-latent 2,5,10 --decoder linear,mlp --seeds 3 --out sel
  countvae select pbmc.h5ad --layer counts --n-latent 5,10 --max-epochs 200 --json
  countvae select raw_10x.h5ad --n-top-genes 4000 --n-latent 5,10 --seeds 2

Every candidate and seed is fitted on the same genes: the 2,000 most variable (as diagnose keeps them) when the
file has more. Before fitting, the command prints the data size, the candidates and the time it expects (from a
few timed training steps), with the options that shorten it. The fits are kept in OUT/fits (one folder per
candidate; a rerun resumes, and refuses fits made on other genes or settings), the comparison in OUT/comparison
(comparison.html, comparison.json, comparison.md).
"""


def _list_of(kind: type, choices: tuple[str, ...] | None = None) -> Any:
    def parse(text: str) -> list:
        try:
            values = [kind(v.strip()) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {kind.__name__}, got {text!r}"
            ) from None
        if not values:
            raise argparse.ArgumentTypeError("expected at least one value")
        unknown = [v for v in values if choices is not None and v not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown value(s) {', '.join(unknown)}; choose from {', '.join(choices)}")
        return values

    return parse


def register(sub: Subcommands) -> None:
    """Add the ``select`` subcommand."""
    p = sub.add_parser(
        "select",
        help="compare candidate models by held-out fit and stability across seeds, and recommend one",
        description=(
            "Fit every combination of the candidate settings from the same seeds on the same cells, compare their "
            "held-out log p(x) with the best (nats/cell, simultaneous intervals, the report's equivalence margin) "
            "and the agreement of their rotation-invariant outputs across seeds, and recommend the smallest "
            "candidate that fits within the margin and is stable (or none: undetermined)."
        ),
        epilog=EXAMPLES + "\n" + exit_codes(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_data_arguments(p, required=True)
    p.add_argument("--n-latent", type=_list_of(int), default=[2, 5, 10], help="latent sizes (default: 2,5,10)")
    p.add_argument(
        "--decoder", type=_list_of(str, ("linear", "mlp")), default=["linear", "mlp"], help="default: linear,mlp"
    )
    p.add_argument("--n-hidden", type=_list_of(int), default=None, help="hidden widths (default: CountVAE's)")
    p.add_argument(
        "--likelihood", type=_list_of(str, ("poisson", "nb", "zinb")), default=["nb"], help="e.g. nb,zinb (default: nb)"
    )
    p.add_argument(
        "--prior",
        type=_list_of(str, ("normal", "laplace", "diagonal")),
        default=["normal"],
        help="latent priors, e.g. normal,laplace (default: normal, N(0, I))",
    )
    add_gene_selection_argument(p, DIAGNOSE_N_TOP_GENES)
    p.add_argument("--seeds", type=int, default=3, help="seeds per candidate (default: 3)")
    p.add_argument("--heldout-fraction", type=float, default=0.1, help="cells kept out of training (default 0.1)")
    p.add_argument(
        "--max-epochs", type=int, default=None, help="default: 600,000 cell passes, 20 to 400 epochs (as diagnose)"
    )
    p.add_argument(
        "--early-stopping",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="stop each fit when its validation loss stalls, keeping its best epoch (default: off)",
    )
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument(
        "--lr",
        type=float,
        default=None,
        help="Adam learning rate (default: 1e-3; with --early-stopping 1e-2, cut to 1e-3 when the validation stalls)",
    )
    p.add_argument(
        "--n-samples", type=importance_samples, default=100, help="importance samples per held-out cell (default 100)"
    )
    p.add_argument(
        "--max-heldout-cells",
        type=int,
        default=MAX_HELDOUT_CELLS,
        help=(
            f"held-out cells the comparison uses at most (default {MAX_HELDOUT_CELLS:,}; at least 39): beyond, a "
            "random subset, the same for every candidate and seed; the intervals are those of this many cells, and the "
            "held-out log p(x) costs about 30 ms per cell and fit at 100 samples on 2,000 genes"
        ),
    )
    p.add_argument(
        "--n-jobs",
        type=n_jobs_value,
        default="auto",
        help="seeds fitted at once (default auto: one per usable core, at most the seeds; 1: in this process)",
    )
    p.add_argument(
        "--backend",
        choices=["local", "ray"],
        default="local",
        help="local worker processes, or one Ray task per seed of each candidate (the [ray] extra)",
    )
    add_output_arguments(p, "countvae_select")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Execute ``countvae select``."""
    out = Path(args.out)
    refuse_inputs_in_output(args.out, {"the data file": args.data}, replaced=("fits", "comparison"))
    refuse_existing_output(str(out / "comparison"), args.overwrite)
    refuse_foreign_entries(out / "comparison", args.overwrite, COMPARISON_FOLDER)
    if args.seeds < 2:
        raise InvalidArgumentError(f"--seeds {args.seeds}: stability needs at least 2 seeds; e.g. --seeds 3.")
    adata = read_h5ad(args.data)
    setup_anndata(adata, layer=args.layer, batch_key=args.batch_key, labels_key=args.labels_key, use_raw=args.use_raw)
    grid: dict[str, list] = {"n_latent": args.n_latent, "decoder": args.decoder, "likelihood": args.likelihood}
    if args.prior != ["normal"]:
        grid["prior"] = args.prior
    if args.n_hidden:
        grid["n_hidden"] = args.n_hidden
    train_kwargs = {name: getattr(args, name) for name in ("max_epochs", "early_stopping", "batch_size", "lr")}
    before_fitting = _BeforeFitting(args, grid)
    with locked(out):  # one writer from the first fit to the saved comparison (the fits' locks end with the fits)
        comparison = compare_models(
            adata,
            grid,
            seeds=range(args.seeds),
            heldout_fraction=args.heldout_fraction,
            train_kwargs=train_kwargs,
            out_dir=out / "fits",
            n_jobs=args.n_jobs,
            backend=args.backend,
            n_lpd_samples=args.n_samples,
            max_heldout_cells=args.max_heldout_cells,
            n_top_genes=args.n_top_genes,
            progress_bar=progress_enabled(args),
            overwrite=args.overwrite,
            before_fitting=before_fitting,
        )
        with explained_write_errors(out / "comparison", reused=True):  # the fits stored are reused by a rerun
            comparison.save(out / "comparison", overwrite=args.overwrite)
    result = {
        "recommended": comparison.recommended,
        "rule": comparison.rule,
        "margin_nats_per_cell": comparison.margin,
        "n_genes": comparison.n_genes,
        "gene_selection": selection_summary(before_fitting.genes.record()),
        "out": str(out / "comparison"),
    }
    if not args.json and not args.quiet:
        say(comparison.summary())
    emit(result, args.json)
    return 0


class _BeforeFitting:
    """compare_models' ``before_fitting``: keeps the chosen genes for the result and logs the block before fitting."""

    def __init__(self, args: argparse.Namespace, grid: dict[str, list]):
        self.args, self.grid = args, grid
        self.genes: GeneChoice | None = None

    def __call__(self, genes: GeneChoice, runs: list[FitSeedsSettings]) -> None:
        """Keep ``genes``; with log messages on, time the candidates and log the block."""
        self.genes = genes
        if logger.isEnabledFor(logging.INFO):  # --quiet: no block, and no time spent on the warm-ups
            _announce(self.args, self.grid, genes, runs)


def _announce(args: argparse.Namespace, grid: dict[str, list], genes: GeneChoice, runs: list[FitSeedsSettings]) -> None:
    """Log data size, candidates, fits, the time expected and how to shorten it (as ``announce`` for one model).

    The training time is timed once per decoder, latent size and hidden width (on the first candidate with them: the
    likelihood and the prior are not timed apart), ten training steps each as for ``diagnose``, and extrapolated to
    all fits, as many at a time as run at once and the usable cores fit at full speed (``Parallelism.at_full_speed``).
    The held-out ``log p(x)`` of each fit on the compared cells follows the ratio to the timed steps that ``fit``
    uses, on one torch thread per fit, in as many workers as the report's estimate will use
    (:func:`~countvae.diagnostics.reporting.heldout_lpd.auto_workers`).
    """
    first, n_seeds = runs[0], len(runs[0].seeds)
    fit_idx, held_idx = heldout_split(genes.adata.n_obs, first.heldout_fraction, first.split_seed)
    adata_fit = genes.adata[fit_idx].copy()
    n_fits, compared, cores = len(runs) * n_seeds, min(len(held_idx), args.max_heldout_cells), available_cores()
    threads = first.torch_threads or DEFAULT_TORCH_THREADS
    # with the training arguments, as fit_models decides: short fits run one at a time (the fits warn of memory)
    jobs = plan_parallelism(
        first.n_jobs, n_fits, adata_fit, threads, first.backend, train_kwargs=first.train_kwargs, warn=False
    )
    keys = [tuple(run.model_kwargs.get(k) for k in ("decoder", "n_latent", "n_hidden")) for run in runs]
    timed = {}
    for key, run in zip(keys, runs, strict=True):
        if key not in timed:  # each warm-up trains 20 minibatches
            timed[key] = estimate(adata_fit, dict(run.model_kwargs), first.train_kwargs, threads)
    timings = [timed[key] for key in keys]
    per_fit = [t.seconds_per_fit for t in timings]
    spread = " to ".join(dict.fromkeys(duration(s) for s in (min(per_fit), max(per_fit))))
    fitting = max(max(per_fit), sum(per_fit) * n_seeds / jobs.at_full_speed())  # --n-jobs above the cores: no faster
    fitting += workers_start_seconds(jobs.n_jobs)  # not timed by the warm-up in this process
    per_cell = [lpd_seconds_per_cell(t, len(fit_idx), args.n_samples) for t in timings]
    # as the report's heldout_lpd decides: the first fit's estimate here, then workers only where they save time
    first_lpd = per_cell[0] * compared
    lpd_jobs = auto_workers(first_lpd, n_fits - 1, cores)
    lpd = first_lpd + (sum(per_cell) * n_seeds * compared - first_lpd) / lpd_jobs
    lpd += WORKER_START_SECONDS if lpd_jobs > 1 else 0.0
    train = first.train_kwargs
    stopping = "on (at most that many epochs)" if train.get("early_stopping") else "off"
    values = " x ".join(f"{name} {', '.join(map(str, v))}" for name, v in grid.items())
    lines = [
        "countvae select: before fitting",
        f"  data        {args.data}: {genes.adata.n_obs:,} cells x {genes.n_genes_before:,} genes; {len(fit_idx):,} "
        f"cells fitted, {len(held_idx):,} held out ({compared:,} compared, --max-heldout-cells)",
        f"  genes       {describe_genes(genes)}; the same for every candidate and seed",
        f"  candidates  {len(runs)} ({values}) x {n_seeds} seeds = {n_fits} fits",
        f"  training    {counted(train['max_epochs'], 'epoch')} per fit, batch size {train['batch_size']}, "
        f"{learning_rate(train)}, early stopping {stopping}, {jobs.describe()}",
        f"  estimate    about {duration(fitting)} for the {n_fits} fits ({spread} per fit, from "
        f"{counted(timings[0].warmup_steps, 'timed training step')} per decoder, latent size and width)"
        f"{workers_starting(jobs.n_jobs)}",
        f"{' ' * 14}then about {duration(lpd)} for the held-out log p(x) of {compared:,} cells x {n_fits} fits "
        f"({1000 * sum(per_cell) / len(per_cell):.0f} ms per cell and fit on average at {args.n_samples} samples, "
        f"{counted(lpd_jobs, 'fit')} at a time; within about a factor 5)",
        f"{' ' * 14}not counted: reading the data, the stability measures and the no-latent baseline "
        "(under 1% of a run in benchmarks/RESULTS.md, select-cost); it counts the fits stored in OUT/fits, which a "
        "resumed run reuses",
        f"  shorter     --seeds N fits fewer seeds of each candidate (now {n_seeds}; at least 2)",
        f"{' ' * 14}fewer candidates: fewer values of --n-latent, --decoder, --likelihood or --prior (now {len(runs)})",
        f"{' ' * 14}--max-epochs N (time is proportional to epochs)",
        f"{' ' * 14}--n-top-genes N keeps only the N most variable genes (time grows with the genes)",
        f"{' ' * 14}--n-jobs N fits N at once (now {args.n_jobs}; this machine has {counted(cores, 'usable core')})",
        f"{' ' * 14}--max-heldout-cells N and --n-samples N shorten the held-out log p(x) (now {compared:,} cells, "
        f"{args.n_samples} samples per cell)",
    ]
    for line in lines:
        logger.info("%s", line)
