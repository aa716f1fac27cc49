"""Does ``train()``'s early-stopping default give a latent space as good, and as reproducible, as the full schedule?

``train()`` stops early by default (the shared rule, ``DEFAULT_STOPPING``: lr 1e-2, one cut to
1e-3, the best validation epoch kept), chosen because it fits held-out cells better than
scvi-tools' 400 epochs at 1e-3 (section stopping-vs-full). Held-out log p(x) is not what most
analysts read off a fit, though: they cluster and label cells in its latent space. This script
measures, per seed and for both schedules, what the latent space gives an analyst, on the cells
and genes ``countvae diagnose`` fits (2,000 most variable genes, the batch covariate, 10% of the
cells held out by split seed 0, as ``fit_seeds`` does), against the labels the data ship with:

- **k-NN label accuracy**: each held-out cell labelled by the majority of its 15 nearest fit
  cells in latent space (posterior means); accuracy and balanced accuracy against ``cell_type``.
- **cell-type silhouette**: silhouette of ``cell_type`` on all cells (Euclidean, latent means).
- **batch mixing**: over all cells, the share of each cell's 15 neighbours from another batch,
  divided by the share expected if batches were mixed at random (1 for perfect mixing). Batch and
  cell type are not confounded in these files (each batch holds every type), so lower mixing is
  batch structure the model kept.
- **Leiden clusters**: scanpy's default graph (15 neighbours) and Leiden at resolution 1.0, as an
  analyst runs them (and as the report's downstream section does: ``scanpy_graph``,
  ``scanpy_leiden``): ARI and NMI against ``cell_type``, and the number of clusters; and the best
  ARI over resolutions 0.02-1.0, with its number of clusters (the files have 3-4 types).
- **across seeds** (per schedule, over all pairs of seeds): the mean Jaccard overlap of each
  cell's 15 nearest neighbours, and the ARI between the seeds' Leiden clusters (resolution 1.0).

    python benchmarks/bench_stopping_latent.py                        # Kang (all cells), pbmc_3tech; seeds 0-2
    python benchmarks/bench_stopping_latent.py --quick                # small simulated data: a smoke run
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    DEFAULT_DATA_DIR,
    DEFAULT_RESULTS,
    command_line,
    load_average,
    machine_line,
    markdown_table,
    run_worker,
    write_section,
)
from bench_stopping import _diagnose_data, _split  # noqa: E402

from countvae.diagnostics.analyses.subspace import knn_jaccard_per_cell, knn_sets  # noqa: E402
from countvae.metrics import batch_mixing  # noqa: E402

#: Neighbours of the k-NN metrics and of scanpy's graph (scanpy's default).
N_NEIGHBORS = 15
#: Leiden resolutions scanned for the best ARI; 1.0 is scanpy's default. The files have 3-4 cell types, which
#: resolutions well below 1 resolve.
RESOLUTIONS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)
#: Named training schedules: "stopped" is the shared rule (``DEFAULT_STOPPING``) and "full" scvi-tools' schedule, the
#: two compared by default; the others ask whether what differs between those two comes from the learning rate or from
#: the amount of training.
SCHEDULES = (
    "stopped",
    "full",
    "rule at 1e-3",
    "50 epochs at 1e-3",
    "100 epochs at 1e-3",
    "200 epochs at 1e-3",
    "400 epochs at 1e-2",
)


def schedule_kwargs(name: str, max_epochs: int = 400) -> dict:
    """Keywords of ``CountVAE.train`` for the schedule ``name``, with at most ``max_epochs`` epochs."""
    from countvae.model.training import DEFAULT_STOPPING

    stopping = DEFAULT_STOPPING.train_kwargs()
    fixed = {"early_stopping": False}
    kwargs = {
        "stopped": stopping,
        "full": fixed,
        "rule at 1e-3": {**stopping, "lr": 1e-3, "early_stopping_lr_reductions": 0},
        "50 epochs at 1e-3": {**fixed, "max_epochs": 50},
        "100 epochs at 1e-3": {**fixed, "max_epochs": 100},
        "200 epochs at 1e-3": {**fixed, "max_epochs": 200},
        "400 epochs at 1e-2": {**fixed, "lr": 1e-2},
    }[name]
    return {**kwargs, "max_epochs": min(kwargs.get("max_epochs", 400), max_epochs)}


# ----- worker side --------------------------------------------------------------------------------
def fit_worker(spec: dict) -> dict:
    """One seed, one schedule: fit and return the latent means of the fit and held-out cells."""
    import torch

    import countvae as cv

    torch.set_num_threads(spec["threads"])
    adata, n_latent = _diagnose_data(spec)
    fit, held = _split(adata)
    kwargs = schedule_kwargs(spec["schedule"], spec["epochs"])
    model = cv.CountVAE(fit, n_latent=n_latent)
    t0 = time.perf_counter()
    model.train(seed=spec["seed"], progress_bar=False, **kwargs)
    seconds = time.perf_counter() - t0
    return {
        **spec,
        "seconds": seconds,
        "epochs_trained": int(model.training_summary["epochs_trained"]),
        "kept_epoch": int(model.training_summary["kept_epoch"]),
        "latent_fit": model.get_latent_representation(fit).tolist(),
        "latent_held": model.get_latent_representation(held).tolist(),
        "load": load_average(),
    }


# ----- metrics ------------------------------------------------------------------------------------
def knn_label_accuracy(fit_latent, fit_labels, held_latent, held_labels) -> tuple[float, float]:
    """Accuracy and balanced accuracy of held-out labels predicted by their nearest fit cells."""
    from sklearn.metrics import accuracy_score, balanced_accuracy_score
    from sklearn.neighbors import KNeighborsClassifier

    predicted = KNeighborsClassifier(N_NEIGHBORS).fit(fit_latent, fit_labels).predict(held_latent)
    return accuracy_score(held_labels, predicted), balanced_accuracy_score(held_labels, predicted)


def leiden_labels(latent: np.ndarray, resolutions=RESOLUTIONS) -> dict[float, np.ndarray]:
    """Leiden clusters of ``latent`` as the report's downstream section makes them, per resolution (seed 0)."""
    from countvae.diagnostics.analyses.downstream import scanpy_graph, scanpy_leiden

    graph = scanpy_graph(latent, N_NEIGHBORS)
    return {resolution: scanpy_leiden(graph, resolution, seed=0) for resolution in resolutions}


def fit_metrics(result: dict, labels: np.ndarray, batches: np.ndarray, n_fit: int) -> dict:
    """The per-fit metrics of one fit's latent space (cells ordered fit cells first, then held-out)."""
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score, silhouette_score

    fit_latent, held_latent = np.asarray(result["latent_fit"]), np.asarray(result["latent_held"])
    latent = np.vstack([fit_latent, held_latent])
    accuracy, balanced = knn_label_accuracy(fit_latent, labels[:n_fit], held_latent, labels[n_fit:])
    neighbours = knn_sets(latent, N_NEIGHBORS)
    clusters = leiden_labels(latent)
    aris = {r: adjusted_rand_score(labels, c) for r, c in clusters.items()}
    best = max(aris, key=aris.get)
    return {
        "knn_accuracy": accuracy,
        "knn_balanced_accuracy": balanced,
        "silhouette": float(silhouette_score(latent, labels)),
        "batch_mixing": float(batch_mixing(neighbours, batches).mean()),
        "leiden_ari": aris[1.0],
        "leiden_nmi": normalized_mutual_info_score(labels, clusters[1.0]),
        "leiden_clusters": len(np.unique(clusters[1.0])),
        "best_ari": aris[best],
        "best_resolution": best,
        "best_clusters": len(np.unique(clusters[best])),
        "neighbours": neighbours,
        "clusters": clusters[1.0],
    }


def across_seeds(metrics: list[dict]) -> tuple[float, float]:
    """Mean k-NN Jaccard overlap and mean Leiden ARI (resolution 1.0) over all pairs of seeds."""
    from sklearn.metrics import adjusted_rand_score

    overlaps, aris = [], []
    for a, b in itertools.combinations(metrics, 2):
        overlaps.append(float(knn_jaccard_per_cell(a["neighbours"], b["neighbours"]).mean()))
        aris.append(adjusted_rand_score(a["clusters"], b["clusters"]))
    return float(np.mean(overlaps)), float(np.mean(aris))


# ----- driver -------------------------------------------------------------------------------------
PER_FIT_COLUMNS = {
    "knn_accuracy": "k-NN accuracy",
    "knn_balanced_accuracy": "k-NN balanced accuracy",
    "silhouette": "cell-type silhouette",
    "batch_mixing": "batch mixing",
    "leiden_ari": "Leiden ARI (res 1.0)",
    "leiden_nmi": "Leiden NMI (res 1.0)",
    "leiden_clusters": "clusters (res 1.0)",
    "best_ari": "best ARI",
}


def _labels(spec: dict) -> tuple[np.ndarray, np.ndarray, int]:
    """``cell_type`` and ``batch`` of the fit cells then the held-out cells, and the number of fit cells."""
    adata, _ = _diagnose_data(spec)
    fit, held = _split(adata)
    label_key = "cell_type" if "cell_type" in adata.obs else "batch"  # the simulated smoke data has no types
    labels = np.concatenate([fit.obs[label_key].astype(str).to_numpy(), held.obs[label_key].astype(str).to_numpy()])
    batches = np.concatenate([fit.obs["batch"].astype(str).to_numpy(), held.obs["batch"].astype(str).to_numpy()])
    return labels, batches, fit.n_obs


def dataset_rows(name: str, results: dict, seeds: list[int], schedules: list[str]) -> tuple[list[dict], list[dict]]:
    """Per-fit rows and per-schedule summary rows (means over seeds and the across-seed columns) of one data set."""
    labels, batches, n_fit = _labels({"dataset": name, "n_cells": results["n_cells"]})
    rows, summary = [], []
    for schedule in schedules:
        metrics = []
        for seed in seeds:
            result = results[f"{schedule} {seed}"]
            m = fit_metrics(result, labels, batches, n_fit)
            metrics.append(m)
            row = {"data": name, "schedule": schedule, "seed": seed}
            row["epochs trained / kept"] = f"{result['epochs_trained']} / {result['kept_epoch']}"
            row["s"] = f"{result['seconds']:.0f}"
            for key, title in PER_FIT_COLUMNS.items():
                row[title] = m[key]
            row["best ARI: resolution, clusters"] = f"{m['best_resolution']:g}, {m['best_clusters']}"
            rows.append(row)
        overlap, ari = across_seeds(metrics)
        mean = {"data": name, "schedule": schedule, "seeds": len(seeds)}
        for key in ("knn_accuracy", "knn_balanced_accuracy", "silhouette", "batch_mixing", "leiden_ari", "best_ari"):
            values = np.array([m[key] for m in metrics])
            mean[PER_FIT_COLUMNS[key]] = f"{values.mean():.3f} ({values.std(ddof=1) / np.sqrt(values.size):.3f})"
        mean["k-NN overlap across seeds"] = overlap
        mean["Leiden ARI across seeds"] = ari
        summary.append(mean)
    return rows, summary


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="small simulated data, 30 epochs: a smoke run")
    parser.add_argument("--datasets", default="kang2018,pbmc_3tech")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kang-cells", type=int, default=0, help="a random subset of Kang (0: all its cells)")
    parser.add_argument("--schedules", default="stopped,full", help=f"comma-separated, of: {', '.join(SCHEDULES)}")
    parser.add_argument("--reuse", action="store_true", help="keep the fits stored by an earlier run")
    parser.add_argument("--section", default="stopping-latent")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    parser.add_argument("--results", default=str(DEFAULT_RESULTS))
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(fit_worker(json.loads(args.worker))))
        return
    datasets = ["quick"] if args.quick else args.datasets.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    schedules = args.schedules.split(",")
    unknown = sorted(set(schedules) - set(SCHEDULES))
    if unknown:
        parser.error(f"unknown schedules {unknown}; known: {list(SCHEDULES)}")
    started, t_start = time.strftime("%Y-%m-%d %H:%M"), time.perf_counter()
    rows, summary, loads = [], [], []
    for name in datasets:
        n_cells = args.kang_cells if name == "kang2018" else 0
        store = Path(args.data_dir) / f"stopping_latent_{name}_{n_cells}.json"
        results = json.loads(store.read_text()) if args.reuse and store.exists() else {"n_cells": n_cells}
        for seed in seeds:
            order = schedules if seed % 2 == 0 else schedules[::-1]  # interleaved across seeds
            for schedule in order:
                if f"{schedule} {seed}" in results:
                    continue
                spec = {
                    "dataset": name,
                    "n_cells": n_cells,
                    "seed": seed,
                    "schedule": schedule,
                    "epochs": 30 if args.quick else 400,
                    "threads": args.threads,
                }
                result = run_worker(Path(__file__), spec)
                results[f"{schedule} {seed}"] = result
                print(f"{name} {schedule} seed {seed}: {result['epochs_trained']} epochs, {result['seconds']:.0f} s")
                store.parent.mkdir(parents=True, exist_ok=True)
                store.write_text(json.dumps(results))
        loads += [
            f"{name} {schedule} {seed}: {results[f'{schedule} {seed}']['load']}"
            for seed in seeds
            for schedule in schedules
        ]
        data_rows, data_summary = dataset_rows(name, results, seeds, schedules)
        rows += data_rows
        summary += data_summary
    minutes = (time.perf_counter() - t_start) / 60
    summary_frame = pd.DataFrame(summary)
    print(summary_frame.to_string())
    write_section(Path(args.results), args.section, _body(args, started, minutes, rows, summary_frame, loads))


def _body(args, started: str, minutes: float, rows: list[dict], summary: pd.DataFrame, loads: list[str]) -> str:
    from countvae.model.training import DEFAULT_STOPPING

    kang = f"a random {args.kang_cells:,} of its cells (seed 0)" if args.kang_cells else "all its 8,684 cells"
    names = {"kang2018": f"Kang ({kang})", "pbmc_3tech": "pbmc_3tech", "quick": "a small simulation (smoke run)"}
    data = " and ".join(names[d] for d in (["quick"] if args.quick else args.datasets.split(",")))
    reuse = (
        " Fits stored by earlier runs of this script were kept (`--reuse`); the minutes above are this run's."
        if args.reuse
        else ""
    )
    return f"""## The latent space with early stopping and with the full schedule (`bench_stopping_latent.py`)

Command: `{command_line()}` ({started}{", QUICK smoke run" if args.quick else ""}; {minutes:.0f} min)

Machine: {machine_line(args.threads)}. Load average (1/5/15 min) after each fit: {"; ".join(loads)}.{reuse}

Schedules: **stopped** is `train()`'s default (`DEFAULT_STOPPING`: lr {DEFAULT_STOPPING.lr:g}, one cut to
{DEFAULT_STOPPING.lr * DEFAULT_STOPPING.lr_factor:g}, patience {DEFAULT_STOPPING.patience} epochs, the best validation
epoch kept); **full** is scvi-tools' schedule (`early_stopping=False`: 400 epochs at 1e-3); any other is named by
what it does ("rule at 1e-3": the same rule without its higher rate and cut). Data as `countvae
diagnose` fits them: {data}, the 2,000 most variable genes, the batch covariate, 10% of the
cells held out (split seed 0); the package's default model otherwise (NB, MLP decoder, 10 latent dimensions). Metrics
on the posterior means of all cells (fit and held-out) against the shipped `cell_type` and `batch`, as the script's
docstring defines them; k-NN accuracy is of the held-out cells, labelled by their 15 nearest fit cells.

Mean over seeds (standard error over seeds), and the agreement between seeds of one schedule (mean over pairs):

{markdown_table(summary, "{:.3f}")}

Per fit:

{markdown_table(pd.DataFrame(rows), "{:.3f}")}
"""


if __name__ == "__main__":
    main()
