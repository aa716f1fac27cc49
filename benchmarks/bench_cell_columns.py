"""The report's per-cell columns on the cells an analyst reads: held-out and fit cells of real data.

``countvae diagnose DATA --write-h5ad FILE`` writes each cell's cross-seed k-NN agreement, its
within-seed baseline, its batch mixing and the consensus latent into the analysed data. The
fit cells (the cells the fits were trained on, 90% of a file) get them too, on one k-NN graph
with the held-out cells. This script runs the command as an analyst would (default settings,
``--batch-key batch --labels-key cell_type``) on Kang and pbmc_3tech, reads the written file
back and states, per kind of cell and per cell type: how many cells got a value, and the mean
of each column. The means are descriptive (a cell's value shares neighbours with others'); the
report's training-cells section gives the calibrated interval of the k-NN row on fit cells.
It also states the time of the section that makes the columns (``per_cell``) and of the
report.

    python benchmarks/bench_cell_columns.py            # Kang and pbmc_3tech, 5 seeds each
    python benchmarks/bench_cell_columns.py --quick    # 2 seeds, 2 epochs (a check that it runs)
    python benchmarks/bench_cell_columns.py --scale 30000   # the cost of measuring every fit cell

Writes the section ``cell-columns`` of RESULTS.md (``--results``). With ``--scale N``: N simulated
cells (``cv.data.simulate``, 1,000 genes, 10 latent dimensions, 2 batches), 3 seeds trained 5 epochs
(report() reads latent means, so its time hardly depends on the training), 10% held out, and
``report()`` timed per step with the default ``max_fit_cells`` and with every fit cell
(``--max-fit-cells``), in that order and again in the other order; section ``cell-columns-scale``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEFAULT_RESULTS, command_line, cpu_model, markdown_table, write_section  # noqa: E402

from countvae.cli import main as cli_main  # noqa: E402
from countvae.data import find_dataset  # noqa: E402

DATASETS = ("kang2018", "pbmc_3tech")
COLUMNS = {
    "countvae_knn_agreement": "k-NN agreement",
    "countvae_knn_agreement_within_seed": "within-seed baseline",
    "countvae_batch_mixing": "batch mixing",
}


def column_summary(obs: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per group of ``by``: cells, cells with a k-NN agreement, and the mean of each per-cell column."""
    grouped = obs.groupby(by, observed=True)
    table = pd.DataFrame({"cells": grouped.size(), "measured": grouped["countvae_knn_agreement"].count()})
    for column, label in COLUMNS.items():
        if column in obs:
            table[label] = grouped[column].mean().round(3)
    return table.reset_index()


def roles(obs: pd.DataFrame) -> pd.Series:
    """Each cell's kind: held-out, or fit (trained on)."""
    return obs["countvae_heldout"].map({True: "held-out", False: "fit"}).rename("cells of")


def run_one(name: str, quick: bool) -> tuple[list[str], dict[str, float]]:
    """Run the command on one data set and describe its written columns."""
    data = find_dataset(name)
    extra = ["--max-epochs", "2", "--seeds", "2"] if quick else []
    with tempfile.TemporaryDirectory() as tmp:
        written = Path(tmp) / "analysed.h5ad"
        argv = ["diagnose", str(data), "--batch-key", "batch", "--labels-key", "cell_type", *extra]
        started = time.perf_counter()
        code = cli_main([*argv, "--out", str(Path(tmp) / "diag"), "--write-h5ad", str(written), "--quiet"])
        wall = time.perf_counter() - started
        if code != 0:
            raise RuntimeError(f"countvae diagnose exited with {code} on {data}")
        record = json.loads((Path(tmp) / "diag" / "report" / "report.json").read_text())
        back = ad.read_h5ad(written)
    obs = back.obs.assign(**{"cells of": roles(back.obs)})
    consensus = np.isfinite(back.obsm["X_countvae_consensus"]).all(axis=1)
    timings = record["timings_seconds"]
    training = next((line for line in record["headline"] if line.startswith("Training cells")), "")
    heldout = obs["countvae_heldout"].to_numpy(dtype=bool)
    measured = obs["countvae_knn_agreement"].notna().to_numpy()
    lines = [
        f"**{name}** (`{' '.join(['countvae', *argv[:1], data.name, *argv[2:]])} --write-h5ad FILE`): "
        f"{back.n_obs:,} cells, {wall / 60:.1f} min wall time; {heldout.sum():,} held-out and {(~heldout).sum():,} "
        f"fit cells, of which {measured[heldout].sum():,} and {measured[~heldout].sum():,} have a k-NN agreement and "
        f"{consensus.sum():,} in all a consensus latent. The section that makes the columns took "
        f"{timings.get('per_cell', float('nan')):.2f} s of report()'s {timings['total']:.1f} s.",
        "",
        f"The report's training-cells line: {training}",
        "",
        markdown_table(column_summary(obs, ["cells of"])),
        "",
        markdown_table(column_summary(obs, ["cell_type", "cells of"])),
    ]
    return lines, {"per_cell": float(timings.get("per_cell", np.nan)), "report": float(timings["total"])}


def scale_cost(n_cells: int) -> list[str]:
    """report() on N simulated cells with the default max_fit_cells and with every fit cell, interleaved."""
    import countvae as cv
    from countvae.diagnostics import fit_seeds, report
    from countvae.diagnostics.reporting.settings import ReportSettings

    adata = cv.data.simulate(n_cells=n_cells, n_genes=1000, n_latent=10, n_batches=2, seed=0)
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    started = time.perf_counter()
    fits = fit_seeds(
        adata,
        seeds=range(3),
        model_kwargs={"n_latent": 10},
        train_kwargs={"max_epochs": 5, "early_stopping": False},
        heldout_fraction=0.1,
        progress_bar=False,
    )
    fitting = time.perf_counter() - started
    n_fit = fits.adata_fit.n_obs
    default = ReportSettings().max_fit_cells
    runs = []
    for max_fit_cells in (default, n_fit, n_fit, default):
        started = time.perf_counter()
        rep = report(fits, max_fit_cells=max_fit_cells)
        wall = time.perf_counter() - started
        measured = int(rep.cells["knn_agreement"].notna().sum())
        steps = {k: rep.timings.get(k, float("nan")) for k in ("per-fit outputs", "ica", "batch_mixing", "per_cell")}
        runs.append({"max_fit_cells": max_fit_cells, "cells measured": measured, "report() s": round(wall, 1)} | steps)
    table = pd.DataFrame(runs)
    return [
        f"{n_cells:,} simulated cells x 1,000 genes, {fits.adata_heldout.n_obs:,} held out, {n_fit:,} fit cells; "
        f"3 seeds trained 5 epochs ({fitting:.0f} s). report() with the default max_fit_cells ({default:,}) and "
        "with every fit cell, interleaved (seconds per step):",
        "",
        markdown_table(table),
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    parser.add_argument("--quick", action="store_true", help="2 seeds, 2 epochs")
    parser.add_argument("--scale", type=int, default=None, metavar="N", help="the cost of measuring every fit cell")
    parser.add_argument("--results", default=str(DEFAULT_RESULTS), help="RESULTS.md to write the section into")
    args = parser.parse_args(argv)
    body = [
        "## Per-cell columns on held-out and fit cells (`bench_cell_columns.py`)",
        "",
        f"Command: `{command_line()}` ({time.strftime('%Y-%m-%d %H:%M')}{', QUICK smoke run' if args.quick else ''})",
        "",
        f"Machine: {cpu_model()}, {len(os.sched_getaffinity(0))} cores available (diagnose's default workers).",
        "",
    ]
    if args.scale:
        body[0] = "## The cost of measuring every fit cell (`bench_cell_columns.py --scale`)"
        body[4] = f"Machine: {cpu_model()}, {len(os.sched_getaffinity(0))} cores available."
        body += scale_cost(args.scale)
        print("\n".join(body), flush=True)
        write_section(Path(args.results), "cell-columns-scale", "\n".join(body))
        return 0
    for name in args.datasets:
        lines, _ = run_one(name, args.quick)
        body += [*lines, ""]
        print("\n".join(lines), flush=True)
    write_section(Path(args.results), "cell-columns", "\n".join(body))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
