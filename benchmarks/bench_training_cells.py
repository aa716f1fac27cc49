"""Do the report's held-out agreement rows speak for the cells the fits were trained on?

The report measures how well seeds agree on held-out cells; an analyst reads the latent
space of the training cells. This script takes the latent means ``bench_stopping_latent.py``
stored (the default model on Kang and pbmc_3tech as ``countvae diagnose`` fits them, 5 seeds
per schedule: train()'s early stopping, scvi-tools' 400 epochs at 1e-3 and the named
schedules; run it first with the same ``--data-dir``) and, per schedule, computes the rows of
the invariants table that read only latent means (latent distances, k-NN graph,
per-dimension coordinates after alignment) as the report does:

- **held-out**: the invariants table on every held-out cell, the fit cells as the k-NN graph's
  other cells (the report's k-NN row);
- **training**: the training-cells section's own rows (:func:`training_cell_rows`) on as many
  fit cells as there are held-out cells, for ``--draws`` seeds of the subset of fit cells;
- with ``--coverage-draws N``, the same rows against the same fits on **all** of their fit cells
  (the analyst's cells: the truth the section estimates), over N subsets per schedule of
  ``--coverage-schedules``: how often the interval covers it and the verdict is the one the truth
  implies.

    python benchmarks/bench_training_cells.py --data-dir <bench_stopping_latent's --data-dir>
"""

from __future__ import annotations

import argparse
import sys
import time
from itertools import combinations
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
from scipy.spatial.distance import pdist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEFAULT_DATA_DIR, DEFAULT_RESULTS, command_line, machine_line, markdown_table, write_section  # noqa: E402
from bench_batch_mixing import stored_fits  # noqa: E402
from bench_placement import schedule_keys  # noqa: E402

from countvae.diagnostics.analyses.invariants import (  # noqa: E402
    AGREEMENT_THRESHOLD,
    KNN_THRESHOLD,
    InvariantInputs,
    ResamplingSettings,
    concordance,
    invariants_table,
    per_column_concordance,
)
from countvae.diagnostics.analyses.maps import fit_map  # noqa: E402
from countvae.diagnostics.analyses.subspace import knn_jaccard_per_cell, knn_sets  # noqa: E402
from countvae.diagnostics.reporting.sections.training_cells import training_cell_rows  # noqa: E402
from countvae.diagnostics.reporting.settings import ReportSettings  # noqa: E402
from countvae.diagnostics.reporting.verdicts import judge_invariants  # noqa: E402


def value_of(table: pd.DataFrame, quantity: str) -> float:
    """The worst pair's agreement the verdict reads (after alignment for the coordinates)."""
    column = "aligned_agreement" if quantity == "per-dimension coordinates" else "agreement"
    return float(table.loc[quantity, column])


def training_truth(fit: dict[str, np.ndarray], held: dict[str, np.ndarray], k: int) -> dict[str, tuple[float, str]]:
    """Per latent row, the worst pair's value on every fit cell and the verdict it implies: what the
    training-cells rows estimate from a subset.

    Latent distances: the concordance over every pair of fit cells; k-NN graph: the mean Jaccard over every fit
    cell's row of the k-NN graph on all cells (both against their threshold); per-dimension coordinates: the
    concordance on every fit cell after the orthogonal map fitted on all of them (the aligned coordinates the
    analyst would read), judged by the report's rule with its interval shrunk to the values (no sampling left).
    """
    names = list(fit)
    distances = {name: pdist(z) for name, z in fit.items()}
    graphs = {name: knn_sets(np.vstack([fit[name], held[name]]), k)[: len(fit[name])] for name in names}
    pairs = list(combinations(names, 2))
    distance = min(concordance(distances[a], distances[b]) for a, b in pairs)
    knn = min(float(knn_jaccard_per_cell(graphs[a], graphs[b]).mean()) for a, b in pairs)
    numbers, _ = invariants_table(  # only its coordinates row is read: small subsets for the other rows
        InvariantInputs(latents=fit),
        k=k,
        max_knn_cells=50,
        max_distance_cells=50,
        resampling=ResamplingSettings(n_replicates=20),
    )
    exact = numbers[numbers["quantity"] == "per-dimension coordinates"].copy()
    exact["low"] = exact["high"] = exact["agreement"]
    aligned = min(per_column_concordance(fit_map("orthogonal", fit[a], fit[b])(fit[a]), fit[b]) for a, b in pairs)
    exact["aligned_agreement"] = exact["aligned_low"] = exact["aligned_high"] = aligned
    coordinates = judge_invariants(exact).iloc[0]
    return {
        "latent distances": (distance, "agree" if distance >= AGREEMENT_THRESHOLD else "differ"),
        "k-NN graph": (knn, "agree" if knn >= KNN_THRESHOLD else "differ"),
        "per-dimension coordinates": (float(coordinates["aligned_agreement"]), str(coordinates["verdict"])),
    }


def training_tables(c: SimpleNamespace, draws: int) -> list[pd.DataFrame]:
    """The training-cells rows, judged, for subsets of fit cells drawn with report seeds 0 to ``draws - 1``."""
    return [
        judge_invariants(training_cell_rows(c, ReportSettings(seed=d))[0]).set_index("quantity") for d in range(draws)
    ]


def calibration_rows(name: str, schedule: str, tables: list[pd.DataFrame], truth: dict) -> list[dict]:
    """How often the training-cells rows' intervals cover the truth on all fit cells, and their verdicts' accuracy."""
    rows = []
    for quantity, (value, right) in truth.items():
        table = pd.DataFrame([t.loc[quantity] for t in tables])
        prefix = "aligned_" if quantity == "per-dimension coordinates" else ""
        decided = table["verdict"] != "undetermined"
        rows.append(
            {
                "data": name,
                "schedule": schedule,
                "row": quantity,
                "truth (all fit cells, worst pair)": value,
                "estimate (mean)": table[f"{prefix}agreement"].mean(),
                "coverage of the truth": float(
                    ((table[f"{prefix}low"] <= value) & (value <= table[f"{prefix}high"])).mean()
                ),
                "verdict on all fit cells": right,
                "correct": int((table["verdict"] == right).sum()),
                "wrong": int((decided & (table["verdict"] != right)).sum()),
                "undetermined": int((~decided).sum()),
            }
        )
    return rows


def collected_latents(fits: dict) -> SimpleNamespace:
    """What the training-cells section reads of a report's collected arrays, from one schedule's stored fits."""
    held = {key: np.asarray(r["latent_held"]) for key, r in fits.items()}
    fit = {key: np.asarray(r["latent_fit"]) for key, r in fits.items()}
    # the stored fits' latent_fit holds every fit cell, so the report's separate read of all fit cells is absent (None)
    latents = {"latent": held, "latent_fit": fit, "latent_fit_all": dict.fromkeys(fit)}
    return SimpleNamespace(
        per_fit=latents.__getitem__,
        n_cells=len(next(iter(held.values()))),
        n_fit_cells=len(next(iter(fit.values()))),
        symmetry="orthogonal",
    )


def schedule_rows(name: str, schedule: str, c: SimpleNamespace, training: list[pd.DataFrame]) -> list[dict]:
    """Held-out and training-cell rows of one schedule's fits (one report's worth of seeds)."""
    held, fit = c.per_fit("latent"), c.per_fit("latent_fit")
    n_held, n_fit = c.n_cells, c.n_fit_cells
    s = ReportSettings()
    numbers, _ = invariants_table(
        InvariantInputs(latents=held, reference_latents=fit, graph_cells=n_held + n_fit),
        k=s.k,
        max_knn_cells=s.max_knn_cells,
        max_distance_cells=s.max_distance_cells,
        seed=s.seed,
        resampling=ResamplingSettings(s.alpha, s.n_bootstrap, s.seed, s.max_bootstrap_cells),
    )
    heldout = judge_invariants(numbers).set_index("quantity")
    rows = []
    for quantity in training[0].index:  # the rows the section measures on training cells, in its order
        values = [value_of(t, quantity) for t in training]
        held_value = value_of(heldout, quantity)
        verdicts = pd.Series([t.loc[quantity, "verdict"] for t in training]).value_counts()
        rows.append(
            {
                "data": name,
                "schedule": schedule,
                "row": quantity,
                "held-out (worst pair)": held_value,
                "held-out verdict": heldout.loc[quantity, "verdict"],
                "training (worst pair, mean over draws)": float(np.mean(values)),
                "training (range)": f"{min(values):.3f} to {max(values):.3f}",
                "held-out minus training": held_value - float(np.mean(values)),
                "training verdicts": ", ".join(f"{v} {n}/{len(training)}" for v, n in verdicts.items()),
                "cells each": n_held,
            }
        )
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="kang2018,pbmc_3tech")
    parser.add_argument("--draws", type=int, default=5, help="seeds of the subset of fit cells per schedule")
    parser.add_argument(
        "--coverage-draws",
        type=int,
        default=0,
        help="subsets per schedule against the truth on all fit cells (0: none)",
    )
    parser.add_argument("--coverage-schedules", default="all", help='comma-separated schedules, or "all"')
    parser.add_argument("--section", default="training-cells")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    parser.add_argument("--results", default=str(DEFAULT_RESULTS))
    args = parser.parse_args(argv)
    started, t_start = time.strftime("%Y-%m-%d %H:%M"), time.perf_counter()
    rows, calibration = [], []
    for name in args.datasets.split(","):
        stored = stored_fits(args.data_dir, name)
        by_schedule: dict[str, dict] = {}
        for key in schedule_keys(stored):
            by_schedule.setdefault(key.rsplit(" ", 1)[0], {})[key] = stored[key]
        for schedule, fits in by_schedule.items():
            c = collected_latents(fits)
            listed = args.coverage_schedules == "all" or schedule in args.coverage_schedules.split(",")
            checked = args.coverage_draws if listed else 0
            tables = training_tables(c, max(args.draws, checked))
            rows += schedule_rows(name, schedule, c, tables[: args.draws])
            print(pd.DataFrame(rows[-3:]).to_string(), flush=True)
            if checked:
                truth = training_truth(c.per_fit("latent_fit"), c.per_fit("latent"), ReportSettings().k)
                calibration += calibration_rows(name, schedule, tables[:checked], truth)
                print(pd.DataFrame(calibration[-2:]).to_string(), flush=True)
    frame = pd.DataFrame(rows)
    minutes = (time.perf_counter() - t_start) / 60
    s = ReportSettings()
    body = f"""## Held-out rows against the same rows on the training cells (`bench_training_cells.py`)

Command: `{command_line()}` ({started}; {minutes:.1f} min)

Machine: {machine_line(1)}.

The fits are the latent means `bench_stopping_latent.py` stored (sections stopping-latent and
stopping-latent-schedules: the default model on the cells and genes `countvae diagnose` fits, 10% held out by
split seed 0, 5 seeds per schedule, read together as one report's fits). Held-out: the invariants table's rows that
read only latent means, on every held-out cell (distances on up to {s.max_distance_cells:,} of them; the k-NN row's
graph on the held-out and fit cells). Training: the training-cells section's rows (`training_cell_rows`) on as
many fit cells as there are held-out cells, over {args.draws} seeds of that subset. Worst pair of seeds, as the
verdicts read it (per-dimension coordinates after orthogonal alignment); verdicts by the report's rule
(`judge_invariants`, 90% intervals, thresholds 0.9 for distances and coordinates, 0.5 for the k-NN graph).

{markdown_table(frame, "{:.3f}")}
{_calibration_text(pd.DataFrame(calibration), args.coverage_draws)}"""
    write_section(Path(args.results), args.section, body)


def _calibration_text(calibration: pd.DataFrame, draws: int) -> str:
    if calibration.empty:
        return ""
    return f"""
### The training-cells rows against the same fits on all of their fit cells

Truth: the worst pair's value on every fit cell (the concordance over all pairs of fit cells; the mean Jaccard
over every fit cell's row of the 15-NN graph on all cells; the aligned coordinates), and the verdict it implies.
Each of {draws} subsets of fit cells (as many as held-out cells, seeds 0 to {draws - 1}) gives the section's
estimate, its 90% interval and its verdict; coverage is the share of intervals containing the truth, and the
verdict counts are over the subsets. Per-dimension coordinates: after orthogonal alignment, the truth from the
maps fitted on every fit cell and its verdict by the report's rule on those exact values.

{markdown_table(calibration, "{:.3f}")}
"""


if __name__ == "__main__":
    main()
