"""Accuracy of the held-out log p(x) that ``countvae diagnose`` reports, on its own stored Kang fits.

``countvae diagnose`` estimates each fit's ``log p(x)`` on a subset of the held-out cells
(``ReportSettings.max_lpd_cells``, 500) with ``ReportSettings.n_lpd_samples`` (100) final
draws. This script repeats that estimate for one stored fit at several estimator seeds and
compares it with a gold standard computed once (the package estimator with 10x the draws
and pilot and twice the restarts, ``_common.GOLD_MARGINAL``), for the default settings
and the variants in :data:`VARIANTS`. It writes the section ``lpd-diagnose-accuracy`` of RESULTS.md.

    python benchmarks/bench_report.py diagnose --keep kang_diag    # once: stores the fits in kang_diag/fits
    OMP_NUM_THREADS=1 python benchmarks/lpd_diagnose_accuracy.py --fits kang_diag/fits [--fit 0] \\
        [--seeds 1,2,3] [--variants "default,before (no pooling or snapping)"] [--cells 500]

Run it with the code whose estimator is measured; the gold standard is computed by the same
code (``--gold FILE`` reuses a saved one, e.g. from the code before a change).
"""

from __future__ import annotations

import argparse
import time
import warnings
from dataclasses import replace
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import torch
from _common import (
    DEFAULT_RESULTS,
    GOLD_MARGINAL,
    command_line,
    load_average,
    machine_line,
    markdown_table,
    write_section,
)

import countvae as cv
from countvae.data import choose_genes
from countvae.diagnostics import DIAGNOSE_N_TOP_GENES as DEFAULT_N_TOP_GENES
from countvae.diagnostics import ReportSettings
from countvae.diagnostics.analyses.subspace import subsample
from countvae.diagnostics.fitting.fit_seeds import load_seed_fits
from countvae.model.inference import default_marginal_settings

SECTION = "lpd-diagnose-accuracy"
GOLD = GOLD_MARGINAL
#: Settings compared with the default (each replaces fields of the model's default settings).
VARIANTS = {
    "default": {},
    "before (no pooling or snapping)": {"pool_pilot": False, "snap_radius": 0.0, "fixed_restart_metric": False},
    "no pooling": {"pool_pilot": False},
    "no snapping": {"snap_radius": 0.0},
    "curvature at every restart step": {"fixed_restart_metric": False},
}
GOLD_SEED = 12345


def heldout_cells(fits_dir: Path, data: Path, n_cells: int) -> tuple[object, ad.AnnData]:
    """The stored fits (genes chosen as ``countvae diagnose`` chose them) and the report's log p(x) cells."""
    adata = ad.read_h5ad(data)
    cv.CountVAE.setup_anndata(adata, batch_key="batch", labels_key="cell_type")
    adata = choose_genes(adata, None, DEFAULT_N_TOP_GENES, 10).adata
    fits = load_seed_fits(fits_dir, adata)
    held = fits.adata_heldout
    return fits, held[subsample(held.n_obs, n_cells, ReportSettings().seed)].copy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fits", required=True, type=Path, help="the fits folder of a kept diagnose run")
    parser.add_argument("--data", type=Path, default=None, help="the h5ad the fits were made on (default: Kang)")
    parser.add_argument("--fit", type=int, default=0, help="which stored fit (position)")
    parser.add_argument("--seeds", default="1,2,3", help="estimator seeds")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated names among {list(VARIANTS)}")
    parser.add_argument("--cells", type=int, default=ReportSettings().max_lpd_cells)
    parser.add_argument("--gold", type=Path, default=None, help="a saved gold standard (.npy) to reuse")
    parser.add_argument("--save-gold", type=Path, default=None, help="save the gold standard here (.npy)")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    started, load_start, t_start = time.strftime("%Y-%m-%d %H:%M"), load_average(), time.perf_counter()
    data = args.data if args.data is not None else cv.data.find_dataset("kang2018")
    fits, cells = heldout_cells(args.fits, data, args.cells)
    fit = fits[args.fit]
    draws = ReportSettings().n_lpd_samples
    if args.gold is not None:
        gold = np.load(args.gold)
        gold_line = f"Gold standard: loaded from {args.gold.name}."
    else:
        t0 = time.process_time()
        frame = fit.model.get_log_predictive_density(cells, seed=GOLD_SEED, method="mixture", settings=GOLD)
        gold = frame.lpd.to_numpy()
        gold_line = (
            f"Gold standard: the package estimator with 10x the draws and pilot and twice the restarts (seed "
            f"{GOLD_SEED}), {time.process_time() - t0:.0f} CPU-s; mean reported SE {frame.mc_se.mean():.4f} "
            f"nats/cell, {int((~frame.reliable).sum())} unreliable cells."
        )
        if args.save_gold is not None:
            np.save(args.save_gold, gold)
    base = default_marginal_settings(fit.model.module)
    rows = []
    names = [name.strip() for name in args.variants.split(",")]
    unknown = [name for name in names if name not in VARIANTS]
    if unknown:
        parser.error(f"unknown --variants {unknown}; choose among {list(VARIANTS)}")
    for name in names:
        settings = replace(base, n_draws=draws, **VARIANTS[name])
        for seed in [int(s) for s in args.seeds.split(",")]:
            t0 = time.process_time()
            frame = fit.model.get_log_predictive_density(cells, seed=seed, method="mixture", settings=settings)
            cpu = time.process_time() - t0
            err = frame.lpd.to_numpy() - gold
            rows.append(
                {
                    "settings": name,
                    "seed": seed,
                    "mean abs(est - gold)": float(np.abs(err).mean()),
                    "mean(est - gold)": float(err.mean()),
                    "max abs(est - gold)": float(np.abs(err).max()),
                    "unreliable": int((~frame.reliable).sum()),
                    "CPU s": cpu,
                }
            )
            print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    summary = table.groupby("settings", as_index=False, sort=False).agg(
        {
            "mean abs(est - gold)": "mean",
            "mean(est - gold)": "mean",
            "max abs(est - gold)": "max",
            "unreliable": "sum",
            "CPU s": "mean",
        }
    )
    minutes = (time.perf_counter() - t_start) / 60
    body = "\n\n".join(
        [
            "## Held-out log p(x) as `countvae diagnose` reports it: accuracy on its stored Kang fits "
            "(`lpd_diagnose_accuracy.py`)",
            f"Command: `{command_line()}` ({started}, {minutes:.1f} min). {machine_line(1)} Load average "
            f"{load_start} at the start, {load_average()} at the end (CPU seconds, not wall time, are shown: "
            "they depend less on the load).",
            f"Fit {args.fit} ({fit.name}) of `{args.fits}`; {cells.n_obs} held-out cells (the report's subset), "
            f"{draws} final draws per cell (the report's setting). {gold_line}",
            markdown_table(table),
            "Mean over seeds (max abs: the largest over seeds):",
            markdown_table(summary),
        ]
    )
    write_section(args.results, SECTION, body)
    print(body)


if __name__ == "__main__":
    main()
