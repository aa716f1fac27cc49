"""Does the report's batch-mixing row estimate the mixing of the analyst's graph on all of their cells?

The report's batch-mixing section scores the held-out cells and up to ``max_fit_cells`` fit
cells in their own k-NN graph (``k`` scaled when they are fewer than all cells, to keep a
neighbourhood's share of the cells), each kind of cell weighted by the cells it stands for,
with a bootstrap interval over the scored cells. An analyst reads the mixing of the k-NN
graph on all of their cells. This script takes the latent means that ``bench_stopping_latent.py``
stored (the default model on Kang and pbmc_3tech as ``countvae diagnose`` fits them, 5 seeds,
early stopping and the full schedule; run it first with the same ``--data-dir``) and compares,
per fit:

- **truth**: the mean batch mixing (:func:`countvae.metrics.batch_mixing`) over every cell of the
  15-NN graph on all cells (fit and held-out), the figure of section stopping-latent;
- **held-out rows**: the mean over the held-out cells' rows of that graph alone (what a section
  scoring held-out cells only would report, whatever its number of cells);
- **report, all fit cells**: the section's estimate (:func:`embedding_mixing`) with every fit cell
  (the report's default on these files, which have fewer than 10,000 fit cells): the truth itself,
  up to rounding;
- **report, 1,000 fit cells**: the same with a random 1,000 of the fit cells (the case of a file
  ten times larger, where ``k`` is scaled down), and the coverage of its interval over 100 draws
  of those 1,000 cells (nominal 90%), as the report gives it (the bootstrap over cells widened for
  the correlation of neighbouring cells' scores) and from the bootstrap alone;
- **a quarter of the cells**: the same two coverages when the report's cells are a random quarter
  of all cells, held-out and fit alike (another sample of cells of the same kind, as the
  interval's reading "from the sampling of cells" means), over 100 draws;
- the same for the **no-model reference**: the PCA of the normalized counts (as many components as
  latent dimensions), fitted on the scored cells together as the section does.

    python benchmarks/bench_batch_mixing.py --data-dir <bench_stopping_latent's --data-dir>
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEFAULT_DATA_DIR, DEFAULT_RESULTS, command_line, machine_line, markdown_table, write_section  # noqa: E402
from bench_stopping import _diagnose_data, _split  # noqa: E402

from countvae.diagnostics.analyses.baseline import normalized_counts_pca  # noqa: E402
from countvae.diagnostics.analyses.heldout_data import observed_counts  # noqa: E402
from countvae.diagnostics.analyses.invariants import KnnGraph  # noqa: E402
from countvae.diagnostics.analyses.subspace import knn_sets, knn_sets_among  # noqa: E402
from countvae.diagnostics.reporting.sections.batch_mixing import embedding_mixing, mean_with_interval  # noqa: E402
from countvae.diagnostics.reporting.settings import ReportSettings  # noqa: E402
from countvae.metrics import batch_mixing  # noqa: E402

K = 15
SUBSET_FIT_CELLS = 1_000
SUBSET_SHARE = 0.25
DRAWS = 100


def section_estimate(z_fit, z_held, b_fit, b_held, keep: np.ndarray, s: ReportSettings) -> tuple[float, float, float]:
    """The section's estimate from every held-out cell and the fit cells at ``keep``, with its interval."""
    n_fit, n_held = len(z_fit), len(z_held)
    graph = KnnGraph.of(n_held, n_held, len(keep), K, n_fit + n_held)
    weights = np.concatenate([np.ones(n_held), np.full(len(keep), n_fit / len(keep))])
    pool = np.concatenate([b_held, b_fit[keep]])
    _, interval = embedding_mixing(np.vstack([z_held, z_fit[keep]]), pool, weights, graph.k, s)
    return interval


def both_intervals(cells, pool, weights, k: int, s: ReportSettings) -> tuple[tuple, tuple]:
    """The section's interval (widened for neighbouring cells) and the bootstrap's alone (no pair of neighbours)."""
    neighbours = knn_sets_among(cells, cells[:0], k)
    scores = batch_mixing(neighbours, pool)
    alone = np.empty((len(scores), 0), dtype=int)
    return mean_with_interval(scores, weights, neighbours, s), mean_with_interval(scores, weights, alone, s)


def coverage(draws: list[tuple[tuple, tuple]], truth: float) -> dict:
    """Mean error of the estimates, and the share of draws whose interval covers ``truth``, widened and alone."""
    widened, alone = np.array([d[0] for d in draws]), np.array([d[1] for d in draws])
    return {
        "mean error": float(widened[:, 0].mean()) - truth,
        "coverage": float(np.mean((widened[:, 1] <= truth) & (truth <= widened[:, 2]))),
        "coverage, bootstrap alone": float(np.mean((alone[:, 1] <= truth) & (truth <= alone[:, 2]))),
    }


def embedding_row(name, label, z_fit, z_held, b_fit, b_held, s) -> dict:
    """Truth, the held-out rows, the report's two estimates and the coverage over draws for one embedding."""
    truth_scores = batch_mixing(knn_sets(np.vstack([z_fit, z_held]), K), np.concatenate([b_fit, b_held]))
    truth = float(truth_scores.mean())
    row = {"data": name, "embedding": label, "truth (all cells)": truth}
    row["held-out rows"] = float(truth_scores[len(z_fit) :].mean())
    value, _, _ = section_estimate(z_fit, z_held, b_fit, b_held, np.arange(len(z_fit)), s)
    row["error, all fit cells"] = value - truth
    rng = np.random.default_rng(0)
    n_fit, n_held = len(z_fit), len(z_held)
    subset = min(SUBSET_FIT_CELLS, n_fit)  # small files have fewer fit cells than the subset
    graph = KnnGraph.of(n_held, n_held, subset, K, n_fit + n_held)
    weights = np.concatenate([np.ones(n_held), np.full(subset, n_fit / subset)])
    draws = []
    for _ in range(DRAWS):
        keep = np.sort(rng.choice(n_fit, subset, replace=False))
        cells, pool = np.vstack([z_held, z_fit[keep]]), np.concatenate([b_held, b_fit[keep]])
        draws.append(both_intervals(cells, pool, weights, graph.k, s))
    value, low, high = draws[0][0]
    row["subset fit cells"] = subset
    row[f"report, {SUBSET_FIT_CELLS:,} fit cells (first draw)"] = f"{value:.3f} [{low:.3f}, {high:.3f}] (k={graph.k})"
    row |= {f"{key} over draws": v for key, v in coverage(draws, truth).items()}
    z_all, b_all = np.vstack([z_fit, z_held]), np.concatenate([b_fit, b_held])
    m = int(round(SUBSET_SHARE * len(z_all)))
    quarter = KnnGraph.of(len(z_all), m, 0, K, len(z_all))
    draws = []
    for _ in range(DRAWS):
        keep = np.sort(rng.choice(len(z_all), m, replace=False))
        draws.append(both_intervals(z_all[keep], b_all[keep], np.ones(m), quarter.k, s))
    row |= {f"quarter of cells (k={quarter.k}): {key}": v for key, v in coverage(draws, truth).items()}
    return row


def no_model_pca(fit, held, n_latent: int, s: ReportSettings):
    """The section's no-model embedding of the fit and held-out cells, fitted on them together."""
    import scipy.sparse as sp

    counts = sp.vstack([observed_counts(fit, fit.var_names), observed_counts(held, fit.var_names)], format="csr")
    pcs = normalized_counts_pca(counts, n_latent, s.seed + 7)
    return pcs[: fit.n_obs], pcs[fit.n_obs :]


def dataset_rows(name: str, stored: dict, schedules: list[str], seeds: list[int], s: ReportSettings) -> list[dict]:
    """Rows of every stored fit of one data set, and of the no-model PCA."""
    adata, n_latent = _diagnose_data({"dataset": name, "n_cells": stored["n_cells"]})
    fit, held = _split(adata)
    b_fit, b_held = fit.obs["batch"].astype(str).to_numpy(), held.obs["batch"].astype(str).to_numpy()
    rows = []
    for schedule in schedules:
        for seed in seeds:
            result = stored[f"{schedule} {seed}"]
            z_fit, z_held = np.asarray(result["latent_fit"]), np.asarray(result["latent_held"])
            rows.append(embedding_row(name, f"{schedule}, seed {seed}", z_fit, z_held, b_fit, b_held, s))
    pca_fit, pca_held = no_model_pca(fit, held, n_latent, s)
    rows.append(embedding_row(name, "PCA without a model", pca_fit, pca_held, b_fit, b_held, s))
    return rows


def stored_fits(data_dir: str, name: str) -> dict:
    """The latent means ``bench_stopping_latent.py`` stored for data set ``name`` in ``data_dir``."""
    store = Path(data_dir) / f"stopping_latent_{name}_0.json"
    if not store.exists():
        raise SystemExit(f"{store} is missing: run bench_stopping_latent.py --data-dir {data_dir} first")
    return json.loads(store.read_text())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="kang2018,pbmc_3tech")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--schedules", default="stopped,full")
    parser.add_argument("--section", default="batch-mixing-estimate")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    parser.add_argument("--results", default=str(DEFAULT_RESULTS))
    args = parser.parse_args(argv)
    s = ReportSettings()
    started, t_start = time.strftime("%Y-%m-%d %H:%M"), time.perf_counter()
    rows = []
    seeds = [int(x) for x in args.seeds.split(",")]
    for name in args.datasets.split(","):
        rows += dataset_rows(name, stored_fits(args.data_dir, name), args.schedules.split(","), seeds, s)
    frame = pd.DataFrame(rows)
    print(frame.to_string())
    minutes = (time.perf_counter() - t_start) / 60
    write_section(Path(args.results), args.section, _body(frame, started, minutes, s))


def _summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per data set and schedule: the held-out rows' error, the report's errors and its coverage over draws."""
    out = []
    for (name, schedule), group in frame.groupby(["data", frame["embedding"].str.split(",").str[0]], sort=False):
        held_error = group["held-out rows"] - group["truth (all cells)"]
        out.append(
            {
                "data": name,
                "embedding": schedule,
                "fits": len(group),
                "truth (mean)": group["truth (all cells)"].mean(),
                "held-out rows: mean error": held_error.mean(),
                "held-out rows: largest |error|": held_error.abs().max(),
                "report, all fit cells: largest |error|": group["error, all fit cells"].abs().max(),
                f"report, {SUBSET_FIT_CELLS:,} fit cells: mean error": group["mean error over draws"].mean(),
                "coverage over draws (mean)": group["coverage over draws"].mean(),
                "coverage, bootstrap alone": group["coverage, bootstrap alone over draws"].mean(),
                **{
                    f"{column.split(':')[0]}: {label}": group[column].mean()
                    for column, label in (
                        (c, "coverage" if c.endswith(": coverage") else "coverage, bootstrap alone")
                        for c in group.columns
                        if c.startswith("quarter of cells") and "coverage" in c
                    )
                },
            }
        )
    return pd.DataFrame(out)


def _body(frame: pd.DataFrame, started: str, minutes: float, s: ReportSettings) -> str:
    level = f"{100 * (1 - 2 * s.alpha):g}%"
    return f"""## The report's batch-mixing estimate against the mixing of the whole graph (`bench_batch_mixing.py`)

Command: `{command_line()}` ({started}; {minutes:.1f} min)

Machine: {machine_line(1)}.

The fits are the latent means `bench_stopping_latent.py` stored (section stopping-latent: the default model on the
cells and genes `countvae diagnose` fits, 10% held out by split seed 0). Truth: the mean batch mixing of every cell
in the {K}-NN graph on all cells. Held-out rows: the mean over the held-out cells' rows of that graph. Report: the
batch-mixing section's estimate (`embedding_mixing`, the report's default settings: {s.n_bootstrap} bootstrap
replicates, {level} intervals) from every held-out cell and every fit cell, or {SUBSET_FIT_CELLS:,} of the fit cells
(every fit cell of a file with fewer: column `subset fit cells` of the per-fit table; k scaled to keep a
neighbourhood's share of the cells, fit cells weighted by the cells they stand for); errors are estimate minus truth.
Coverage over draws: the share of {DRAWS} random draws of the {SUBSET_FIT_CELLS:,} fit cells whose interval covers
the truth (nominal {level}), as the report gives it (the bootstrap over cells widened for the correlation of
neighbouring cells' scores, `neighbour_inflation`) and from the bootstrap alone. Quarter of cells: the report's cells
are a random {SUBSET_SHARE:.0%} of all cells, held-out and fit alike, {DRAWS} draws (k scaled).

{markdown_table(_summary(frame), "{:.3f}")}

Per fit, and the PCA of the normalized counts without a model:

{markdown_table(frame, "{:.3f}")}
"""


if __name__ == "__main__":
    main()
