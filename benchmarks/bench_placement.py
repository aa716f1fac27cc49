"""Do cells a fit never saw land among the cells it was trained on, and how does that move with training?

The report's placement section scores, per fit, the held-out cells' rows of the k-NN graph on
the held-out and fit cells with :func:`countvae.metrics.batch_mixing`, the two "batches" being
held-out and fit (1: unseen cells land among the training cells as if at random). This script
reads the latent means ``bench_stopping_latent.py`` stored (the default model on Kang and
pbmc_3tech as ``countvae diagnose`` fits them, 10% held out; every schedule stored there, e.g.
train()'s early stopping, scvi-tools' 400 epochs at 1e-3 and the named schedules of
``--schedules``; run it first with the same ``--data-dir``) and computes the section's table
(:func:`placement_table`, every fit cell as a neighbour, k = 15) per fit, with a control
whose answer is known: a PCA of the normalized counts fitted on all cells together treats
held-out and fit cells alike, so it must score 1 up to sampling. The intervals are checked against a
known answer: over random choices of which cells are "held out" (as many as the split holds) on
a fixed embedding, a cell's other-kind share has expectation ``(n - n_held) / (n - 1)``
exactly, so the placement's expectation is 1; the share of ``--draws`` such relabellings whose
interval covers 1 is the coverage (nominal 90%), for the first seed of each schedule and the PCA.

    python benchmarks/bench_placement.py --data-dir <bench_stopping_latent's --data-dir>
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEFAULT_DATA_DIR, DEFAULT_RESULTS, command_line, machine_line, markdown_table, write_section  # noqa: E402
from bench_batch_mixing import no_model_pca, stored_fits  # noqa: E402
from bench_stopping import _diagnose_data, _split  # noqa: E402
from bench_stopping_latent import SCHEDULES  # noqa: E402

from countvae.diagnostics.analyses.subspace import knn_sets_among  # noqa: E402
from countvae.diagnostics.reporting.sections.batch_mixing import mean_with_interval  # noqa: E402
from countvae.diagnostics.reporting.sections.placement import placement_table  # noqa: E402
from countvae.diagnostics.reporting.settings import ReportSettings  # noqa: E402
from countvae.metrics import batch_mixing  # noqa: E402

K = 15


def relabelled_coverage(z_held: np.ndarray, z_fit: np.ndarray, draws: int, s: ReportSettings) -> dict:
    """Share of random held-out/fit relabellings of one embedding whose placement interval covers 1, with the mean."""
    z_all, n_held = np.vstack([z_held, z_fit]), len(z_held)
    rng = np.random.default_rng(0)
    kinds = np.repeat(["held-out", "fit"], [n_held, len(z_fit)])
    rows, alone = [], []
    for _ in range(draws):
        order = rng.permutation(len(z_all))
        held, fit = z_all[order[:n_held]], z_all[order[n_held:]]
        rows.append(placement_table({"f": held}, {"f": fit}, {}, K, s).iloc[0])
        # The same mean with the bootstrap over cells alone (no pair of cells counted as correlated).
        scores = batch_mixing(knn_sets_among(held, fit, K), kinds)
        alone.append(mean_with_interval(scores, np.ones(n_held), np.empty((n_held, 0), dtype=int), s))
    table = pd.DataFrame(rows)
    covered = (table["low"] <= 1.0) & (1.0 <= table["high"])
    return {
        "relabelled: mean placement": table["placement"].mean(),
        "relabelled: coverage of 1": covered.mean(),
        "relabelled: coverage, bootstrap alone": np.mean([low <= 1.0 <= high for _, low, high in alone]),
    }


def schedule_keys(stored: dict) -> list[str]:
    """The stored fits' keys ("<schedule> <seed>") in the order of ``SCHEDULES``, then by seed."""
    order = {name: i for i, name in enumerate(SCHEDULES)}
    return sorted(
        (k for k in stored if k != "n_cells"),
        key=lambda k: (order.get(k.rsplit(" ", 1)[0], len(order)), int(k.rsplit(" ", 1)[1])),
    )


def dataset_rows(name: str, stored: dict, s: ReportSettings, draws: int) -> list[dict]:
    """The placement of every stored fit of one data set, and of the PCA control."""
    rows = []
    for key in schedule_keys(stored):
        result = stored[key]
        held, fit = {key: np.asarray(result["latent_held"])}, {key: np.asarray(result["latent_fit"])}
        row = placement_table(held, fit, {key: result["seed"]}, K, s).iloc[0].to_dict()
        schedule = key.rsplit(" ", 1)[0]
        if draws and all(r["schedule"] != schedule for r in rows):
            row |= relabelled_coverage(held[key], fit[key], draws, s)
        rows.append({"data": name, "schedule": schedule, "epochs trained": str(result["epochs_trained"])} | row)
    adata, n_latent = _diagnose_data({"dataset": name, "n_cells": stored["n_cells"]})
    fit_cells, held_cells = _split(adata)
    pca_fit, pca_held = no_model_pca(fit_cells, held_cells, n_latent, s)
    row = placement_table({"PCA": pca_held}, {"PCA": pca_fit}, {}, K, s).iloc[0].to_dict()
    row |= relabelled_coverage(pca_held, pca_fit, draws, s) if draws else {}
    rows.append({"data": name, "schedule": "PCA of all cells (control)", "epochs trained": "-"} | row)
    return rows


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per data set and schedule: the fits' placement (mean, range) and the held-out share of neighbours."""
    out = []
    for (name, schedule), group in frame.groupby(["data", "schedule"], sort=False):
        out.append(
            {
                "data": name,
                "schedule": schedule,
                "fits": len(group),
                "epochs trained": ", ".join(group["epochs trained"]),
                "placement (mean)": group["placement"].mean(),
                "placement (range)": f"{group['placement'].min():.3f} to {group['placement'].max():.3f}",
                "held-out share of held-out cells' neighbours": group["heldout_neighbours"].mean(),
                "random share": group["expected_share"].iloc[0],
            }
            | {column: group[column].iloc[0] for column in group.columns if column.startswith("relabelled")}
        )
    return pd.DataFrame(out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="kang2018,pbmc_3tech")
    parser.add_argument("--section", default="heldout-placement")
    parser.add_argument("--draws", type=int, default=100, help="random relabellings per embedding (0: none)")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    parser.add_argument("--results", default=str(DEFAULT_RESULTS))
    args = parser.parse_args(argv)
    s = ReportSettings()
    started, t_start = time.strftime("%Y-%m-%d %H:%M"), time.perf_counter()
    rows = []
    for name in args.datasets.split(","):
        rows += dataset_rows(name, stored_fits(args.data_dir, name), s, args.draws)
    frame = summary(pd.DataFrame(rows))
    print(frame.to_string())
    minutes = (time.perf_counter() - t_start) / 60
    level = f"{100 * (1 - 2 * s.alpha):g}%"
    body = f"""## Where unseen cells land: the report's placement row per training schedule (`bench_placement.py`)

Command: `{command_line()}` ({started}; {minutes:.1f} min)

Machine: {machine_line(1)}.

The fits are the latent means `bench_stopping_latent.py` stored (sections stopping-latent and
stopping-latent-schedules: the default model on the cells and genes `countvae diagnose` fits, 10% held out by
split seed 0, 5 seeds per schedule). Placement: the report's placement table (`placement_table`) with every fit cell
as a neighbour and k = {K}: the mean over held-out cells of the share of their neighbours that are fit cells, over
the share expected at random (1: unseen cells land among the training cells as if at random). The control is a PCA
of the normalized counts fitted on all cells together, which treats held-out and fit cells alike. Relabelled: on
the first seed of each schedule and the PCA, {args.draws} random choices of which cells count as held out (as many
as the split holds); the placement's expectation is then exactly 1, and the coverage is the share of those choices
whose {level} interval covers 1, as the report gives it (the bootstrap over held-out cells widened for the
correlation of cells whose neighbourhoods overlap, `neighbour_inflation`) and from the bootstrap alone.

{markdown_table(frame, "{:.3f}")}

Per fit ({level} intervals over the held-out cells):

{markdown_table(pd.DataFrame(rows), "{:.3f}")}
"""
    write_section(Path(args.results), args.section, body)


if __name__ == "__main__":
    main()
