"""What ``fit`` and ``diagnose`` do before fitting: choose genes, and say what will run and for how long."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anndata as ad

from countvae._formatting import counted
from countvae.data import ALL_GENES, GeneChoice, choose_genes
from countvae.data.gene_selection import FLAVOR
from countvae.diagnostics.fitting.parallelism import AUTO, Parallelism
from countvae.diagnostics.reporting.heldout_lpd import WORKER_START_SECONDS, auto_workers
from countvae.model import TrainingPlan, TrainingTimeEstimate, estimate_training_time
from countvae.module.marginal import MarginalSettings

logger = logging.getLogger("countvae.cli")

__all__ = [
    "ALL_GENES",
    "GeneChoice",
    "HeldoutLpd",
    "add_gene_selection_argument",
    "announce",
    "choose_genes",
    "counted",
    "describe_genes",
    "duration",
    "estimate",
    "learning_rate",
    "lpd_seconds_per_cell",
    "n_jobs_value",
    "n_top_genes_value",
    "selection_summary",
]


def _word_or_integer(text: str, word: str, allowed: Callable[[int], bool], expected: str) -> int | str:
    """``word`` (in any case), or the integer ``text`` if ``allowed``; else argparse's error naming ``expected``."""
    if text.strip().lower() == word:
        return word
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not allowed(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
    return value


def n_top_genes_value(text: str) -> int | str:
    """Parse ``--n-top-genes``: a positive integer, or ``all``."""
    return _word_or_integer(text, ALL_GENES, lambda value: value >= 1, "a positive integer or 'all'")


def n_jobs_value(text: str) -> int | str:
    """Parse ``--n-jobs``: ``auto``, ``-1`` or a positive integer."""
    return _word_or_integer(text, AUTO, lambda value: value >= 1 or value == -1, "'auto', -1 or a positive integer")


def add_gene_selection_argument(parser: argparse.ArgumentParser, default: int | None) -> None:
    """``--n-top-genes N|all``; ``default`` genes are kept when the data has more (``None``: all genes)."""
    when = "default: all genes" if default is None else f"default: {default:,} when the data has more genes, else all"
    parser.add_argument(
        "--n-top-genes",
        type=n_top_genes_value,
        default=None,
        metavar="N|all",
        help=f"keep the N most variable genes, chosen on the raw counts before fitting (Seurat v3 / scanpy "
        f"'{FLAVOR}', per batch with --batch-key) and recorded in the outputs; 'all' keeps every gene ({when})",
    )


def describe_genes(genes: GeneChoice) -> str:
    """One line for the block printed before fitting."""
    n = genes.adata.n_vars
    if genes.selected:
        how = "--n-top-genes" if genes.explicit else "the default --n-top-genes; 'all' keeps every gene"
        return f"the {n:,} most variable of {genes.n_genes_before:,}, chosen on the raw counts ({FLAVOR}; {how})"
    return f"all {n:,} (--n-top-genes N keeps the N most variable)"


def selection_summary(record: dict | None) -> dict | None:
    """A gene selection's record for a command's JSON result, without the chosen genes (the outputs record them)."""
    return None if record is None else {k: v for k, v in record.items() if k != "genes"}


def duration(seconds: float) -> str:
    """Seconds as a person reads them: ``42 s``, ``3.5 min``, ``2.1 h``."""
    seconds = max(0.0, float(seconds))
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _expected_epochs(timing: TrainingTimeEstimate) -> str:
    if timing.expected_epochs < timing.epochs:
        return f"about {counted(timing.expected_epochs, 'epoch')}, where early stopping is expected to end a fit"
    return counted(timing.epochs, "epoch")


def estimate(
    adata_fit: ad.AnnData, model_kwargs: dict[str, Any], train_kwargs: dict[str, Any], torch_threads: int | None
) -> TrainingTimeEstimate | None:
    """The warm-up estimate, or ``None`` when messages are off (``--quiet``: no time is spent on it)."""
    if not logger.isEnabledFor(logging.INFO):
        return None
    return estimate_training_time(adata_fit, model_kwargs, train_kwargs, torch_threads=torch_threads)


#: A held-out cell's log p(x) at the default draws takes about this many times a cell's share of a training epoch,
#: on the same machine: 171-429 times (geometric mean 330) on 3,000 simulated cells of 100 genes (MLP decoder), 300
#: (MLP, the embedded data) and 1,500 (linear), and on 30,000 cells x 2,000 genes (MLP); 176 for a linear decoder on
#: 2,000 pbmc_3tech cells x 300 genes. Within about a factor 2 for MLP decoders, but from 0.2x to 2x the measured time
#: for linear ones (their training steps are cheap and vary more with the genes), so the message says a factor 5.
#: A ratio to the timed warm-up, not a timed chunk: a few cells of the untrained model took 3-5x the trained time.
LPD_CELL_EPOCHS = 330
#: Importance draws per held-out cell when ``--n-samples`` is not given (the estimator's default).
DEFAULT_DRAWS = MarginalSettings.n_draws
#: A cell's log p(x) costs about as much as this many draws besides its own (the Newton modes and the 200-draw pilot
#: cost the same at any number of draws), so its time is the time at the default draws times
#: ``(LPD_FIXED_DRAWS + draws) / (LPD_FIXED_DRAWS + DEFAULT_DRAWS)``. One thread's time per cell at 100, 800, 3,200
#: (and 6,400) draws: 7, 17, 54 (80) ms on 300 genes (MLP decoder, 2,000 pbmc_3tech cells), 37, 92, 286 ms on 2,000
#: simulated genes (MLP); 0.37-0.44x, 1x, 3.1-3.3x (5.0x) the time at 800, where the rule gives 0.36x, 3.2x (6.1x).
LPD_FIXED_DRAWS = 300


def lpd_seconds_per_cell(timing: TrainingTimeEstimate, n_fit: int, draws: int) -> float:
    """A held-out cell's expected ``log p(x)`` time at ``draws`` draws, from the warm-up of a fit on ``n_fit`` cells.

    The file reads of a fit on a backed AnnData are left out: the report's held-out cells are in memory.
    """
    computing = timing.seconds_per_epoch - timing.read_seconds_per_epoch
    per_cell = LPD_CELL_EPOCHS * computing / max(n_fit, 1)
    return per_cell * (LPD_FIXED_DRAWS + draws) / (LPD_FIXED_DRAWS + DEFAULT_DRAWS)


def expected_seconds(timing: TrainingTimeEstimate, seeds: int, jobs: Parallelism | None) -> float:
    """The fitting time the estimate expects for ``seeds`` fits run as ``jobs`` plans (``None``: one at a time).

    One fit's time, times the rounds of ``n_jobs`` seeds at once, but no fewer fit times than the seeds shared among
    the fits the cores run at full speed (``n_jobs`` above the cores is no faster), plus the workers' start-up
    (:data:`WORKER_START_SECONDS`, which the warm-up in this process does not time) when seeds run in workers.
    """
    if jobs is None or min(jobs.n_jobs, seeds) <= 1:
        return timing.seconds_per_fit * seeds
    at_once = min(jobs.n_jobs, seeds)
    fit_times = max(-(-seeds // at_once), seeds / min(at_once, jobs.at_full_speed()))
    return timing.seconds_per_fit * fit_times + workers_start_seconds(at_once)


def workers_start_seconds(at_once: int) -> float:
    """Seconds the estimate adds for the workers' start-up where ``at_once`` fits run in workers (else none)."""
    return WORKER_START_SECONDS if at_once > 1 else 0.0


def workers_starting(at_once: int) -> str:
    """The estimate's words for the workers' start-up it adds where ``at_once`` fits run in workers (else none)."""
    return f", about {WORKER_START_SECONDS:.0f} s of it starting the workers" if at_once > 1 else ""


def learning_rate(train_kwargs: dict[str, Any]) -> str:
    """The learning rate as the fits will use it (``TrainingPlan`` resolves its default and its cuts)."""
    plan = TrainingPlan(**{k: v for k, v in train_kwargs.items() if k in TrainingPlan.__dataclass_fields__})
    cuts = plan.early_stopping_lr_reductions if plan.early_stopping else 0
    if not cuts:
        return f"lr {plan.learning_rate:g}"
    return f"lr {plan.learning_rate:g} (x{plan.early_stopping_lr_factor:g} when the validation loss stalls, {cuts}x)"


@dataclass(frozen=True)
class HeldoutLpd:
    """The held-out ``log p(x)`` a command estimates after fitting, for the block printed before it.

    Attributes
    ----------
    cells
        Held-out cells estimated per fit.
    draws
        Importance draws per cell.
    option, default
        The option that sets ``draws``, and its default.
    fits
        Fits estimated, one torch thread each, as the report's ``lpd_jobs="auto"`` runs them: the first in this
        process, the others in one worker per usable core when they save more than the workers' start
        (:func:`~countvae.diagnostics.reporting.heldout_lpd.auto_workers`).

    """

    cells: int
    draws: int = DEFAULT_DRAWS
    option: str = "--n-samples"
    default: int = DEFAULT_DRAWS
    fits: int = 1


def announce(
    command: str,
    *,
    data: str,
    adata: ad.AnnData,
    n_fit: int,
    n_heldout: int,
    genes: GeneChoice,
    model_kwargs: dict[str, Any],
    train_kwargs: dict[str, Any],
    epochs: int,
    timing: TrainingTimeEstimate | None,
    seeds: int = 1,
    reused: int = 0,
    n_jobs: int | None = None,
    cores: int | None = None,
    torch_threads: int | None = None,
    heldout_lpd: HeldoutLpd | None = None,
) -> None:
    """Log the block printed before fitting: data size, settings, time estimate, and how to shorten it.

    ``n_jobs`` is ``None`` for a command that fits one model (it has no ``--n-jobs``). ``seeds``: the seeds to fit,
    besides ``reused`` ones stored by an earlier run. ``heldout_lpd``: the command estimates ``log p(x)`` on held-out
    cells after training (its time, :data:`LPD_CELL_EPOCHS`, joins the estimate, scaled to its draws per cell by
    :data:`LPD_FIXED_DRAWS`).
    """
    hidden = f", {counted(model_kwargs['n_layers'], 'hidden layer')} of {model_kwargs['n_hidden']}"
    fits = f"{counted(seeds, 'seed') if n_jobs is not None else '1 fit'} x {counted(epochs, 'epoch')}"
    if reused:
        # stored seeds of other settings or data were refused before this block (check_stored_fits)
        fits += f" ({counted(reused, 'seed')} stored by an earlier run, reused if made with these settings and data)"
    stopping = "on (at most that many epochs)" if train_kwargs.get("early_stopping") else "off"
    parallel = ""
    if n_jobs is not None:
        parallel = ", " + Parallelism(n_jobs, torch_threads or 1, "").describe()
    elif torch_threads is not None:
        parallel = f", {counted(torch_threads, 'torch thread')} per fit"
    lines = [
        f"countvae {command}: before fitting",
        f"  data      {data}: {adata.n_obs:,} cells x {genes.n_genes_before:,} genes; "
        f"{n_fit:,} cells fitted, {n_heldout:,} held out",
        f"  genes     {describe_genes(genes)}",
        f"  model     {model_kwargs['likelihood']} likelihood, {model_kwargs['decoder']} decoder, "
        + counted(model_kwargs["n_latent"], "latent dimension")
        + (hidden if model_kwargs["decoder"] == "mlp" else ""),
        f"  training  {fits}, batch size {train_kwargs['batch_size']}, {learning_rate(train_kwargs)}, "
        f"early stopping {stopping}{parallel}",
    ]
    if timing is None:
        lines.append("  estimate  (skipped)")
    else:
        per_fit = timing.seconds_per_fit
        total = starting = ""
        if n_jobs is not None:
            jobs = Parallelism(n_jobs, torch_threads or 1, "")
            total = f", about {duration(expected_seconds(timing, seeds, jobs))} for {counted(seeds, 'seed')}"
            starting = workers_starting(min(n_jobs, seeds))
        lines.append(
            f"  estimate  about {duration(per_fit)} per {'seed' if n_jobs is not None else 'fit'}{total} "
            f"({timing.seconds_per_epoch:.2f} s per epoch x {_expected_epochs(timing)}, from "
            f"{counted(timing.warmup_steps, 'timed training step')}){starting}"
        )
    shorter = []
    if n_jobs is not None:
        usable = counted(cores or 1, "usable core")
        shorter.append(f"--n-jobs N fits N seeds at once (now {n_jobs}; this machine has {usable})")
    shorter += [
        "--max-epochs N (time is proportional to epochs)",
        "--n-top-genes N keeps only the N most variable genes (time grows with the genes above a few thousand)",
        "early stopping is on: a fit stops when its validation loss stalls"
        if train_kwargs.get("early_stopping")
        else "--early-stopping stops when the validation loss stalls",
    ]
    if heldout_lpd is not None:
        lines += _lpd_estimate(heldout_lpd, timing, n_fit, cores or 1)
        shorter.append(_lpd_shorter(heldout_lpd, n_heldout))
    if reused:
        shorter.append("(changing a fit's settings or data refuses the stored seeds; --overwrite refits them all)")
    lines.append("  shorter   " + shorter[0])
    lines += [" " * 12 + option for option in shorter[1:]]
    for line in lines:
        logger.info("%s", line)


def _lpd_estimate(lpd: HeldoutLpd, timing: TrainingTimeEstimate | None, n_fit: int, cores: int) -> list[str]:
    """The block's line for the held-out ``log p(x)`` after the fits (none without a warm-up or cells)."""
    if timing is None or not lpd.cells:
        return []
    per_cell = lpd_seconds_per_cell(timing, n_fit, lpd.draws)
    first = per_cell * lpd.cells
    jobs = auto_workers(first, lpd.fits - 1, cores)
    seconds = first + first * (lpd.fits - 1) / jobs + (WORKER_START_SECONDS if jobs > 1 else 0.0)
    cells, each, at_a_time = counted(lpd.cells, "cell"), "", ""
    if lpd.fits > 1:
        cells, each, at_a_time = f"{cells} x {lpd.fits} fits", " and fit", f", {counted(jobs, 'fit')} at a time"
    default = " (the default)" if lpd.draws == lpd.default else ""
    return [
        f"{' ' * 12}then about {duration(seconds)} for the held-out log p(x) of {cells} ({per_cell * 1000:.0f} ms "
        f"per cell{each} at {lpd.draws} draws{default}{at_a_time}, within about a factor 5)"
    ]


def _lpd_shorter(lpd: HeldoutLpd, n_heldout: int) -> str:
    """How to shorten the held-out ``log p(x)``: fewer draws, and fewer held-out cells where every one is estimated."""
    now = f"{lpd.draws}, the default" if lpd.draws == lpd.default else f"{lpd.draws}; default {lpd.default}"
    draws = f"{lpd.option} N draws fewer per cell (now {now})"
    if lpd.cells < n_heldout:  # a subset of the held-out cells: holding out fewer does not shorten it
        return draws
    fewer = "--heldout-fraction F holds out fewer cells (the held-out log p(x) takes time in proportion to them)"
    return f"{fewer}; {draws}"
