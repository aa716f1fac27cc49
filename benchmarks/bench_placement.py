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
held-out and fit cells alike, so it must score 1 up to sampling.

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

from countvae.diagnostics.reporting.sections.placement import placement_table  # noqa: E402
from countvae.diagnostics.reporting.settings import ReportSettings  # noqa: E402

K = 15


def dataset_rows(name: str, stored: dict, s: ReportSettings) -> list[dict]:
    """The placement of every stored fit of one data set, and of the PCA control."""
    rows = []
    order = {name: i for i, name in enumerate(SCHEDULES)}
    keys = sorted(
        (k for k in stored if k != "n_cells"),
        key=lambda k: (order.get(k.rsplit(" ", 1)[0], len(order)), int(k.rsplit(" ", 1)[1])),
    )
    for key in keys:
        result = stored[key]
        held, fit = {key: np.asarray(result["latent_held"])}, {key: np.asarray(result["latent_fit"])}
        row = placement_table(held, fit, {key: result["seed"]}, K, s).iloc[0].to_dict()
        schedule = key.rsplit(" ", 1)[0]
        rows.append({"data": name, "schedule": schedule, "epochs trained": str(result["epochs_trained"])} | row)
    adata, n_latent = _diagnose_data({"dataset": name, "n_cells": stored["n_cells"]})
    fit_cells, held_cells = _split(adata)
    pca_fit, pca_held = no_model_pca(fit_cells, held_cells, n_latent, s)
    row = placement_table({"PCA": pca_held}, {"PCA": pca_fit}, {}, K, s).iloc[0].to_dict()
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
        )
    return pd.DataFrame(out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="kang2018,pbmc_3tech")
    parser.add_argument("--section", default="heldout-placement")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    parser.add_argument("--results", default=str(DEFAULT_RESULTS))
    args = parser.parse_args(argv)
    s = ReportSettings()
    started, t_start = time.strftime("%Y-%m-%d %H:%M"), time.perf_counter()
    rows = []
    for name in args.datasets.split(","):
        rows += dataset_rows(name, stored_fits(args.data_dir, name), s)
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
of the normalized counts fitted on all cells together, which treats held-out and fit cells alike.

{markdown_table(frame, "{:.3f}")}

Per fit ({level} intervals over the held-out cells):

{markdown_table(pd.DataFrame(rows), "{:.3f}")}
"""
    write_section(Path(args.results), args.section, body)


if __name__ == "__main__":
    main()
