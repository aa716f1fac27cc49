"""``countvae diagnose``: fit several seeds, compare them, and write the multi-seed report.

The command parses its options, reads and registers the data, prints progress and leaves the work to
:func:`countvae.diagnostics.diagnose`. The output folder holds ``fits/`` (the resumable :func:`fit_seeds` folder: the
same command started again after an interruption refits only the unfinished seeds) and ``report/`` (report.html,
report.json, report.md), written at the end in one atomic step. A folder holding a finished report is refused unless
``--overwrite`` is given, which also refits every seed. ``--write-h5ad PATH`` also writes the analysed data (its cells
and fitted genes) to an .h5ad file for scanpy, with the report's per-cell and per-gene columns, the consensus latent
and the first seed's latent (``obsm["X_countvae"]``). A damaged seed folder stops the run with its name;
``--refit-broken`` moves it aside and refits only that seed.

Per-seed progress messages come from ``fit_seeds``' progress events (:class:`countvae.diagnostics.ProgressEvent`),
not its log text.
"""

from __future__ import annotations

import argparse
import functools
import logging
import time
from collections.abc import Callable

import anndata as ad
import numpy as np
import pandas as pd

from countvae.cli.common import (
    MODEL_OPTIONS,
    TRAINING_OPTIONS,
    Subcommands,
    add_data_arguments,
    add_model_arguments,
    add_output_arguments,
    emit,
    exit_codes,
    model_kwargs_of,
    progress_enabled,
    read_h5ad,
    refuse_data_file_as_h5ad_output,
    refuse_inputs_in_output,
    say,
    train_kwargs_of,
)
from countvae.cli.diagnose_restrictions import (
    ONLY_WITH_RESTRICTIONS,
    add_restriction_arguments,
    programs_file_of,
    run_restrictions,
)
from countvae.cli.first_contact import (
    HeldoutLpd,
    add_gene_selection_argument,
    announce,
    duration,
    estimate,
    expected_seconds,
    n_jobs_value,
    selection_summary,
)
from countvae.cli.settings_options import add_setting_option, setting_values
from countvae.data import setup_anndata, simulate
from countvae.diagnostics import (
    DIAGNOSE_N_LATENT,
    DIAGNOSE_N_TOP_GENES,
    DIAGNOSE_STOPPING,
    DiagnosePlan,
    DiagnoseSettings,
    DiagnosticReport,
    DownstreamRequest,
    ProgressEvent,
    ProgressKind,
    ReportSettings,
    SeedFits,
    diagnose,
    plan_diagnose,
)
from countvae.errors import InvalidArgumentError

__all__ = ["EXAMPLES", "SeedProgressMessages", "default_data", "diagnose_settings", "register", "run"]

logger = logging.getLogger("countvae.cli")

Progress = Callable[[ProgressEvent], None]

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
#: ``--heldout-fraction``: what it sets, and its default (``default_heldout_cells``) in words.
_HELDOUT_HELP = "share of the cells held out from every fit"
_HELDOUT = "10%, raised to 300 cells on a small file while that is at most 25% of it"
#: Latent dimensions and training epochs of the embedded default when not given on the command line.
EMBEDDED_N_LATENT = 5
EMBEDDED_MAX_EPOCHS = 100
#: The fields of DiagnoseSettings that are options of their own, read back by name.
OWN_OPTIONS = (
    "seeds",
    "n_top_genes",
    "heldout_fraction",
    "split_seed",
    "n_jobs",
    "overwrite",
    "refit_broken",
    "write_h5ad",
)
#: Options of the multi-seed report that --restrictions would otherwise ignore, by their ``dest``.
NOT_WITH_RESTRICTIONS = {
    "write_h5ad": "--write-h5ad",
    "de": "--de",
    "ica": "--ica/--no-ica (the ICA comparison is --restrictions ica)",
    "equivalence_margin": "--equivalence-margin (the comparison's margin is --margin, in nats/cell)",
    "max_fit_cells": "--max-fit-cells",
}
#: The fields of ReportSettings that are options, given to diagnose as its report_kwargs.
REPORT_OPTIONS = ("ica", "n_lpd_samples", "equivalence_margin", "max_fit_cells")
#: The other fields of DiagnoseSettings, and the options each is made from (:func:`diagnose_settings`).
BUILT_FROM = {
    "model_kwargs": tuple(MODEL_OPTIONS),
    "train_kwargs": tuple(TRAINING_OPTIONS),
    "report_kwargs": REPORT_OPTIONS,
    "markers": ("markers",),
    "downstream": ("de", "de_groups"),
    "out_dir": ("out",),
    "progress_bar": ("quiet",),
}


def _stopping_help() -> str:
    s = DIAGNOSE_STOPPING
    return (
        "stop a seed when its validation loss stalls, keeping its best epoch (learning rate "
        f"{s['lr']:g}, cut to {s['lr'] * s['early_stopping_lr_factor']:g} when it first stalls; validation every "
        f"{s['check_val_every_n_epoch']} epochs, patience {s['early_stopping_patience']} epochs, improvements under "
        f"{100 * s['early_stopping_relative_delta']:g}% do not count)"
    )


def _add_report_options(p: argparse.ArgumentParser) -> None:
    """The options that set fields of :class:`ReportSettings` (:data:`REPORT_OPTIONS`)."""
    report_option = functools.partial(add_setting_option, p, ReportSettings)
    # unset when absent, so that --restrictions can refuse those it would ignore (NOT_WITH_RESTRICTIONS)
    unset_option = functools.partial(report_option, unset_when_absent=True)
    unset_option(
        "ica",
        "add the ICA map class, ICA efficiency, ICA coordinates and the per-component stability of ICA "
        "across seeds to the report",
    )
    report_option("n_lpd_samples", "importance samples per held-out cell")
    unset_option(
        "max_fit_cells",
        "fit cells the report reads: each seed's ICA is estimated on them, the within-seed baseline, batch-mixing "
        "and placement graphs hold them (the k-NN row holds every fit cell whatever N is), and they get the "
        "per-cell columns of --write-h5ad (NaN beyond); raise it to the number of cells to measure every cell "
        "of a larger file, at the cost of a longer report",
        type=int,
        metavar="N",
    )
    unset_option(
        "equivalence_margin",
        "margin of the predictive equivalence test, as a share of the held-out log p(x) per cell that the "
        "latent variables add over a model without them",
    )


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
    diagnose_option = functools.partial(add_setting_option, p, DiagnoseSettings)
    add_data_arguments(p)
    add_model_arguments(
        p,
        defaults={"n_latent": None, "early_stopping": True},
        default_text={
            "n_latent": f"{DIAGNOSE_N_LATENT}; {EMBEDDED_N_LATENT} on the embedded data",
            "max_epochs": f"600,000 cell passes, 20 to 400 epochs; {EMBEDDED_MAX_EPOCHS} on the embedded data",
        },
        help_text={"max_epochs": "epochs per seed", "early_stopping": _stopping_help()},
    )
    add_gene_selection_argument(p, DIAGNOSE_N_TOP_GENES)
    diagnose_option("seeds", "number of seeds, fitted as seeds 0..N-1", type=int)
    diagnose_option("heldout_fraction", _HELDOUT_HELP, type=float, default_text=_HELDOUT)
    diagnose_option("split_seed", "seed of the held-out split")
    diagnose_option(
        "n_jobs",
        "seeds fitted at once in worker processes (auto: one per usable core, at most the seeds; -1: all cores; "
        "1: in this process; the fits are the same whatever the number)",
        type=n_jobs_value,
    )
    diagnose_option(
        "markers",
        "comma-separated genes or obs columns for the marker analysis",
        type=str,
        default_text="the most variable genes, plus --labels-key",
    )
    _add_report_options(p)
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
    diagnose_option(
        "write_h5ad",
        "also write the analysed data to this .h5ad file with the report's per-cell columns (obs "
        "countvae_knn_agreement, countvae_lpd_mean, ...), per-gene columns (var countvae_decoded_agreement, ...), "
        "the consensus latent (obsm X_countvae_consensus), the first seed's latent (obsm X_countvae) and a summary "
        "(uns countvae_report), for the held-out cells and the fit cells the report read (--max-fit-cells); NaN for "
        "other cells",
        metavar="PATH",
        default_text="not written",
    )
    add_restriction_arguments(p)
    add_output_arguments(p, "countvae_diagnose")
    diagnose_option(
        "refit_broken",
        "when a stored seed folder under OUT/fits is damaged (a file truncated, empty, altered or swapped), "
        "move it to OUT/fits/broken/ and refit only that seed, keeping the intact ones",
        action="store_true",
    )
    p.set_defaults(run=run)


def default_data():
    """The embedded default: 3,000 cells x 300 genes, NB counts from 5 Laplace sources, 2 batches.

    The true sources become ``obs`` columns ``true_source_0`` ..., so the report's marker analysis shows each one's
    rotation-invariant R^2 next to its per-dimension correlations.
    """
    adata = simulate(n_cells=3000, n_genes=300, n_latent=5, decoder="linear", sources="laplace", n_batches=2, seed=0)
    for k in range(adata.obsm["z_true"].shape[1]):
        adata.obs[f"true_source_{k}"] = adata.obsm["z_true"][:, k]
    return adata


class SeedProgressMessages:
    """Turns fit_seeds' progress events into 'k of n seeds done, about T left' messages.

    Counts the seeds stored or reused (events of the calling process); the time left is the wall time so far per
    fitted seed times the seeds left, which accounts for seeds fitted in parallel. The clock runs from
    :meth:`start` (from construction until then): a run calls it when the fitting starts, so that the gene selection,
    the checks and the warm-up before it are not counted as if each seed spent them. Picklable, as ``fit_seeds``
    requires of a ``progress`` sent to worker processes (where it ignores its events).
    """

    def __init__(self, n_seeds: int):
        self.n_seeds = n_seeds
        self.done = 0
        self.fitted = 0
        self.start()

    def start(self) -> None:
        """Start (or restart) the clock: call it when the first seed starts fitting."""
        self.started = time.perf_counter()

    def __call__(self, event: ProgressEvent) -> None:
        """Log a message when a seed is done (stored or reused)."""
        if event.kind not in (ProgressKind.SEED_STORED, ProgressKind.SEED_REUSED):
            return
        self.done += 1
        self.fitted += event.kind == ProgressKind.SEED_STORED
        left = self.n_seeds - self.done
        elapsed = time.perf_counter() - self.started
        estimate = f"; about {duration(elapsed / self.fitted * left)} left" if self.fitted and left else ""
        logger.info("%d of %d seeds done (%s elapsed%s).", self.done, self.n_seeds, duration(elapsed), estimate)


class _Both:
    """Calls two progress callables in turn (picklable, unlike a closure over them)."""

    def __init__(self, first: Progress, second: Progress | None):
        self.first, self.second = first, second

    def __call__(self, event: ProgressEvent) -> None:
        self.first(event)
        if self.second is not None:
            self.second(event)


def _markers(text: str | None) -> list[str] | None:
    if text is None:
        return None
    markers = [m.strip() for m in text.split(",") if m.strip()]
    if not markers:
        raise InvalidArgumentError("--markers is empty; give comma-separated genes or obs columns.")
    return markers


def diagnose_settings(args: argparse.Namespace) -> tuple[ad.AnnData, DiagnoseSettings]:
    """The registered data and the :class:`DiagnoseSettings` of a parsed ``countvae diagnose`` command line.

    Without a data file, the embedded data and its defaults (:data:`EMBEDDED_N_LATENT`,
    :data:`EMBEDDED_MAX_EPOCHS`, its true sources as markers, its batches).
    """
    embedded = args.data is None
    adata = default_data() if embedded else read_h5ad(args.data)
    batch_key = "batch" if embedded and args.batch_key is None else args.batch_key
    setup_anndata(adata, layer=args.layer, batch_key=batch_key, labels_key=args.labels_key, use_raw=args.use_raw)
    model_kwargs, train_kwargs, markers = model_kwargs_of(args), train_kwargs_of(args), _markers(args.markers)
    if embedded:
        model_kwargs["n_latent"] = model_kwargs["n_latent"] or EMBEDDED_N_LATENT
        train_kwargs["max_epochs"] = train_kwargs["max_epochs"] or EMBEDDED_MAX_EPOCHS
        markers = markers or [f"true_source_{k}" for k in range(adata.obsm["z_true"].shape[1])]
    settings = DiagnoseSettings(
        **setting_values(args, DiagnoseSettings, OWN_OPTIONS),
        model_kwargs=model_kwargs,
        train_kwargs=train_kwargs,
        report_kwargs={
            name: getattr(ReportSettings(), name) if value is None else value  # an option left unset
            for name, value in setting_values(args, ReportSettings, REPORT_OPTIONS).items()
        },
        markers=markers,
        downstream=_downstream_request(args),
        out_dir=args.out,
        progress_bar=progress_enabled(args),
    )
    return adata, settings


def run(args: argparse.Namespace, progress: Progress | None = None) -> int:
    """Execute ``countvae diagnose``: read and register the data, then :func:`countvae.diagnostics.diagnose`.

    Parameters
    ----------
    args
        The parsed command line.
    progress
        Also called, after the command's own messages, with every progress event of the run (the seeds' from
        ``fit_seeds``, the report files' from ``DiagnosticReport.save``; :class:`countvae.diagnostics.ProgressEvent`).

    """
    started = time.perf_counter()
    inputs = {"the data file": args.data, "the gene programs file": programs_file_of(args.restrictions)}
    refuse_inputs_in_output(args.out, inputs, replaced=("report", "fits"))
    refuse_data_file_as_h5ad_output(args.write_h5ad, args.data)
    adata, settings = diagnose_settings(args)
    if args.restrictions is not None:
        if args.refit_broken:
            raise InvalidArgumentError(
                "--refit-broken applies to the seeds of a plain diagnose, not to --restrictions; remove the damaged "
                "seed folder that the error named and rerun."
            )
        given = [option for dest, option in NOT_WITH_RESTRICTIONS.items() if getattr(args, dest) is not None]
        if given:
            raise InvalidArgumentError(
                f"{' and '.join(given)} {'set' if len(given) > 1 else 'sets'} the multi-seed report, which "
                "--restrictions replaces by the comparison of restrictions; leave "
                f"{'them' if len(given) > 1 else 'it'} out, or run without --restrictions."
            )
        # the comparison of restrictions makes no multi-seed report, so the report's ICA map class is not checked
        plan = plan_diagnose(adata, settings=settings, report_kwargs={**settings.report_kwargs, "ica": False})
        return run_restrictions(args, plan, adata)
    given = [option for dest, option in ONLY_WITH_RESTRICTIONS.items() if getattr(args, dest) is not None]
    if given:
        raise InvalidArgumentError(
            f"{' and '.join(given)} {'set' if len(given) > 1 else 'sets'} the comparison of restrictions; add "
            f"--restrictions, or leave {'them' if len(given) > 1 else 'it'} out."
        )
    messages = SeedProgressMessages(args.seeds)
    observer = _Observer(args.data, messages)
    rep = diagnose(
        adata,
        settings=settings,
        progress=_Both(messages, progress),
        before_fitting=observer.before_fitting,
        after_fitting=observer.after_fitting,
    )
    emit(_result(args, rep, observer, started), args.json)
    if not args.json and not args.quiet:
        say("\n" + rep.summary())
        say(f"\nReport: {observer.plan.report_dir / 'report.html'}")
    return 0


class _Observer:
    """The command's part in a run: the block printed before fitting, and the fits and their end time for the result."""

    def __init__(self, data: str | None, messages: SeedProgressMessages):
        self.data, self.messages = data, messages
        self.plan: DiagnosePlan | None = None
        self.fits: SeedFits | None = None
        self.fitted = float("nan")
        self.expected_fitting: float | None = None
        self.fitting_started = float("nan")

    def before_fitting(self, plan: DiagnosePlan) -> None:
        """Log the data size, the settings and the time expected for the seeds left to fit and the held-out log p(x)."""
        self.plan, s = plan, plan.settings
        timing = estimate(plan.adata_fit, s.model_kwargs, s.train_kwargs, plan.torch_threads)
        # the seeds a resumed run fits, with the training arguments and the data the workers hold, as the fits decide
        todo, jobs, report = len(plan.seeds_to_fit()), plan.parallelism(), plan.report_settings()
        if timing is not None:
            self.expected_fitting = expected_seconds(timing, todo, jobs)
        announce(
            "diagnose",
            data="the embedded simulated data" if self.data is None else self.data,
            adata=plan.adata,
            n_fit=plan.adata_fit.n_obs,
            n_heldout=plan.n_heldout,
            genes=plan.genes,
            model_kwargs=s.model_kwargs,
            train_kwargs=s.train_kwargs,
            epochs=s.train_kwargs["max_epochs"],
            timing=timing,
            seeds=todo,
            reused=len(s.seeds) - todo,
            n_jobs=jobs.n_jobs,
            cores=plan.cores,
            torch_threads=plan.torch_threads,
            # every seed's, the reused ones' too, on the report's cells (CellSubsets.lpd)
            heldout_lpd=HeldoutLpd(
                min(plan.n_heldout, report.max_lpd_cells),
                report.n_lpd_samples,
                "--n-lpd-samples",
                ReportSettings().n_lpd_samples,
                len(s.seeds),
            ),
        )
        self.fitting_started = time.perf_counter()
        self.messages.start()

    def after_fitting(self, fits: SeedFits) -> None:
        """Keep the fits and the time, and say what comes next."""
        self.fits, self.fitted = fits, time.perf_counter()
        logger.info("Comparing the %d fits on %d held-out cells.", len(fits), fits.adata_heldout.n_obs)


def _result(args: argparse.Namespace, rep: DiagnosticReport, observer: _Observer, started: float) -> dict:
    """The command's result (printed as JSON with ``--json``)."""
    finished = time.perf_counter()
    plan, fits, expected = observer.plan, observer.fits, observer.expected_fitting
    table = rep.invariants.set_index("quantity")["verdict"]
    result = {
        "report": str(plan.report_dir / "report.html"),
        "data": args.data or "embedded simulation (5 Laplace sources)",
        "seeds": fits.seeds,
        "reused_seeds": list(fits.reused_seeds),
        "heldout_cells": int(fits.adata_heldout.n_obs),
        "predictive_equivalence": rep.settings["predictive_equivalence"]["state"],
        **{key: [q for q, v in table.items() if v == verdict] for key, verdict in VERDICT_KEYS.items()},
        "n_genes": int(plan.adata.n_vars),
        "gene_selection": selection_summary(plan.genes.record()),
        "seconds_fitting": round(observer.fitted - started, 1),
        "seconds_seed_fits": round(observer.fitted - observer.fitting_started, 1),
        "seconds_seed_fits_estimated": None if expected is None else round(expected, 1),
        "seconds_analysis": round(finished - observer.fitted, 1),
        "seconds_fit_per_seed": {int(k): round(float(v), 1) for k, v in fits.seconds.items()},
        "alignment_error_by_map": _alignment_summary(rep.tables["alignment_summary"]),
    }
    if plan.settings.report_kwargs["ica"]:
        result["ica_components"] = {
            key: rep.ica.loc[rep.ica["verdict"] == verdict, "component"].tolist()
            for key, verdict in VERDICT_KEYS.items()
            if verdict != "agree after alignment"
        } | {"flagged_gaussian": rep.ica.loc[rep.ica["gaussian"].astype(bool), "component"].tolist()}
    if plan.h5ad_path is not None:
        result["h5ad"] = str(plan.h5ad_path)
    if rep.downstream is not None:
        result["downstream"] = _downstream_summary(rep.downstream.summary, rep.downstream.status)
    return result


def _alignment_summary(summary: pd.DataFrame) -> dict[str, float]:
    return {str(m): float(np.round(v, 4)) for m, v in zip(summary["map"], summary["error_diameter_mean"], strict=True)}


def _downstream_request(args: argparse.Namespace) -> DownstreamRequest | None:
    """The downstream section asked for by ``--de``/``--de-groups`` (checked against the data by ``diagnose``)."""
    if args.de is None:
        if args.de_groups is not None:
            raise InvalidArgumentError("--de-groups needs --de GROUPBY (the obs column the groups are in).")
        return None
    groups = list(args.de_groups or [])
    if len(groups) > 2:
        raise InvalidArgumentError(f"--de-groups takes one or two groups (G1 [G2]), got {len(groups)}: {groups}.")
    return DownstreamRequest(args.de, *groups)  # group1 and group2 where given


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
