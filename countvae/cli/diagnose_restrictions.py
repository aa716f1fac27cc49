"""``countvae diagnose --restrictions ...``: what each restriction identifies, and what it costs in fit.

With ``--restrictions``, ``diagnose`` fits the unrestricted model and each restricted one over the same seeds and
held-out cells (:func:`countvae.diagnostics.compare_restrictions`) instead of making the multi-seed report. The output
folder holds ``fits/<model>/`` (each model's resumable :func:`countvae.diagnostics.fit_seeds` folder) and ``report/``
(report.html, report.json, report.md), written at the end in one atomic step.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import anndata as ad

from countvae._io import explained_write_errors
from countvae.cli.common import emit, say
from countvae.cli.first_contact import counted
from countvae.data.registry import get_registry, get_var_names
from countvae.diagnostics import DiagnosePlan, compare_restrictions
from countvae.diagnostics.analyses.restrictions import DEFAULT_MARGIN
from countvae.diagnostics.diagnosis import discard_replaced_report, remove_interrupted_report
from countvae.diagnostics.fitting.restrictions import SYNTAX, parse_restrictions, restriction_programs
from countvae.errors import InvalidArgumentError

__all__ = [
    "LOADINGS_RESTRICTIONS",
    "ONLY_WITH_RESTRICTIONS",
    "add_restriction_arguments",
    "programs_file_of",
    "run_restrictions",
]

logger = logging.getLogger("countvae.cli")

#: Restrictions that put a prior on the linear decoder's loadings.
LOADINGS_RESTRICTIONS = ("horseshoe", "programs")
#: Options of the comparison of restrictions that a plain diagnose would otherwise ignore, by their ``dest``.
ONLY_WITH_RESTRICTIONS = {
    "margin": "--margin (the multi-seed report's margin is --equivalence-margin, a share of the gain)",
    "unknown_genes": "--unknown-genes",
    "no_split_half": "--no-split-half",
}


def programs_file_of(restrictions: str | None) -> str | None:
    """The GMT file that ``--restrictions programs:FILE`` names (``None``: none), before the list is checked.

    An input the output folders must not hold; a malformed list is refused later, by :func:`parse_restrictions`.
    """
    for item in (restrictions or "").split(","):
        name, _, argument = item.partition(":")
        if name.strip().lower() == "programs" and argument.strip():
            return argument.strip()
    return None


def add_restriction_arguments(parser: argparse.ArgumentParser) -> None:
    """``--restrictions``, ``--margin``, ``--unknown-genes`` and ``--no-split-half``."""
    parser.add_argument(
        "--restrictions",
        default=None,
        metavar="LIST",
        help=f"compare restricted models with the unrestricted one instead of the multi-seed report: {SYNTAX} "
        "(e.g. laplace,horseshoe,programs:markers.gmt,ica; horseshoe and programs need --decoder linear)",
    )
    # unset when absent: a plain diagnose refuses them (ONLY_WITH_RESTRICTIONS) rather than ignore them
    parser.add_argument(
        "--margin",
        type=float,
        default=None,
        help=f"with --restrictions: equivalence margin of the held-out log p(x) cost, nats/cell "
        f"(default {DEFAULT_MARGIN:g})",
    )
    parser.add_argument(
        "--unknown-genes",
        choices=("error", "drop"),
        default=None,
        help="with --restrictions programs:FILE: genes of the programs that the data lack are an error, or are "
        "left out (drop; a gene set from a database lists many genes a filtered file does not have) "
        "(default: error)",
    )
    parser.add_argument(
        "--no-split-half",
        action="store_const",
        const=True,
        default=None,
        help="with --restrictions: do not fit each model again on two halves of the fit cells (then no restriction "
        "is credited with identifying the axes: the verdicts are at most undetermined)",
    )


def _refuse_program_genes_not_selected(chosen: list, adata: ad.AnnData, selected: ad.AnnData) -> None:
    """Refuse program genes that the data have but gene selection left out (the library would call them unknown)."""
    programs = [r for r in chosen if r.name == "programs" and r.gene_programs_file is not None]
    if not programs:
        return
    before = set(get_var_names(adata, get_registry(adata)))
    kept = set(get_var_names(selected, get_registry(selected)))
    dropped = {
        name: [g for g in genes if g in before and g not in kept]
        for name, genes in restriction_programs(programs[0], None).items()
    }
    listing = "; ".join(f"{name}: {', '.join(genes[:8])}" for name, genes in dropped.items() if genes)
    if listing:
        raise InvalidArgumentError(
            f"Gene programs name genes that are in the data but not among the {selected.n_vars:,} genes the gene "
            f"selection kept ({listing}); pass --n-top-genes all, or a larger --n-top-genes, so that they are "
            "fitted (--unknown-genes is for genes the data lack)."
        )


def _refuse_programs_arguments(chosen: list, n_latent: int | None) -> None:
    """Refuse, in the command's terms, ``programs`` without a GMT file and an ``--n-latent`` that is not their number.

    The library's own messages name ``gene_programs=`` and ``n_latent=``, which a command line cannot pass.
    """
    programs = [r for r in chosen if r.name == "programs"]
    if not programs:
        return
    if programs[0].gene_programs_file is None:
        raise InvalidArgumentError(
            "--restrictions programs needs a GMT file of gene programs: write programs:FILE.gmt (one program per line: "
            "name, description, then its genes, separated by tabs)."
        )
    n_programs = len(restriction_programs(programs[0], None))
    if n_latent is not None and n_latent != n_programs:
        raise InvalidArgumentError(
            f"--n-latent {n_latent} differs from the {n_programs} gene programs of {programs[0].gene_programs_file}: "
            "every model of the comparison has one latent dimension per program; leave --n-latent out."
        )


def run_restrictions(args: argparse.Namespace, plan: DiagnosePlan, adata_before_selection: ad.AnnData) -> int:
    """Run the comparison of restrictions on registered data and write ``OUT/report``.

    Parameters
    ----------
    args
        The parsed ``diagnose`` command line (``--restrictions`` given).
    plan
        What ``diagnose`` made of the command line: the registered data (``adata``) and the ``settings``: the
        model and training settings, the genes or ``obs`` columns for the marker agreement (``markers``, ``None``
        for the default), the held-out share of the cells and whether to show progress bars.
    adata_before_selection
        The registered data with every gene, before the gene selection.

    """
    started = time.perf_counter()
    adata, s = plan.adata, plan.settings
    model_kwargs, train_kwargs = s.model_kwargs, s.train_kwargs
    chosen = parse_restrictions(args.restrictions)
    if args.unknown_genes is not None and not any(r.name == "programs" for r in chosen):
        raise InvalidArgumentError(
            "--unknown-genes applies to the genes of --restrictions programs:FILE; leave it out, or add programs."
        )
    _refuse_programs_arguments(chosen, args.n_latent)
    _refuse_program_genes_not_selected(chosen, adata_before_selection, adata)
    needs_linear = [r.name for r in chosen if r.name in LOADINGS_RESTRICTIONS]
    if needs_linear and model_kwargs["decoder"] != "linear":
        raise InvalidArgumentError(
            f"--restrictions {','.join(needs_linear)} restrict the linear decoder's loadings; add --decoder linear."
        )
    if any(r.name == "programs" for r in chosen) and args.n_latent is None:
        # one dimension per program; a given --n-latent goes on, to be refused unless it is their number
        model_kwargs = {k: v for k, v in model_kwargs.items() if k != "n_latent"}
    out = Path(args.out)
    report_dir = out / "report"
    if args.overwrite:
        discard_replaced_report(report_dir)
    logger.info(
        "Comparing %s with the unrestricted model over %d seeds (%s each).",
        ", ".join(r.name for r in chosen),
        args.seeds,
        counted(train_kwargs["max_epochs"], "epoch"),
    )
    rep = compare_restrictions(
        adata,
        chosen,
        seeds=range(args.seeds),
        model_kwargs=model_kwargs,
        train_kwargs=train_kwargs,
        # the split diagnose makes of this file (a small file holds out more than 10%: default_heldout_cells)
        heldout_fraction=s.heldout_fraction,
        split_seed=args.split_seed,
        markers=s.markers,
        margin=DEFAULT_MARGIN if args.margin is None else args.margin,
        unknown_genes=args.unknown_genes or "error",
        split_half=not args.no_split_half,
        n_lpd_samples=args.n_lpd_samples,
        n_jobs=args.n_jobs,
        out_dir=str(out / "fits"),
        overwrite=args.overwrite,
        progress_bar=s.progress_bar,
    )
    remove_interrupted_report(report_dir)
    with explained_write_errors(report_dir, reused=True):  # the fits stored are reused by a rerun
        rep.save(report_dir, overwrite=args.overwrite)
    table = rep.restrictions
    result = {
        "report": str(report_dir / "report.html"),
        "data": args.data or "embedded simulation (5 Laplace sources)",
        "restrictions": [r.name for r in chosen],
        "seeds": rep.settings["seeds"],
        "heldout_cells": rep.settings["heldout_cells"],
        "identified": dict(zip(table["model"], table["identified"], strict=True)),
        "predictive": dict(zip(table["model"], table["predictive"], strict=True)),
        "headline": rep.headline,
        "seconds": round(time.perf_counter() - started, 1),
    }
    if rep.programs is not None:
        supported = rep.programs["supported"].astype(bool)
        result["programs_supported"] = rep.programs.loc[supported, "program"].tolist()
        result["programs_not_supported"] = rep.programs.loc[~supported, "program"].tolist()
    emit(result, args.json)
    if not args.json and not args.quiet:
        say("\n" + rep.summary())
        say(f"\nReport: {report_dir / 'report.html'}")
    return 0
