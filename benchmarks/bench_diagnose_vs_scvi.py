"""The whole default diagnosis against the one SCVI fit it audits: `countvae diagnose` vs `SCVI().train()`.

    python benchmarks/bench_diagnose_vs_scvi.py                          # embedded default and Kang
    python benchmarks/bench_diagnose_vs_scvi.py --datasets pbmc_3tech
    python benchmarks/bench_diagnose_vs_scvi.py --quick                  # smoke run: embedded, 2 seeds, 3 epochs
    python benchmarks/bench_diagnose_vs_scvi.py --datasets sim100k --section diagnose-vs-scvi-100k

In one run and one process tree, one after the other (never two heavy jobs at once), for each data set:

1. `countvae diagnose` at its defaults (5 seeds, early stopping, the report included, log messages on;
   `--batch-key batch` where the data have batches), timed from the command's start to its exit, in a fresh
   process; its printed time estimate is set against the seed fits' actual time;
2. one scvi-tools SCVI fit at its defaults (`SCVI(adata).train()`: 400 epochs or fewer for large data, no
   early stopping) on the same fit cells and genes (read back from the report's settings: the genes the
   diagnosis kept, its held-out split), timed from `setup_anndata` to the end of `train`, in a fresh process.

The ratio of the two wall times is the question an analyst asks: does the audit cost more than the fit it
audits? Both run with their own default threading (the diagnosis fits its seeds on one torch thread each;
SCVI uses torch's default). Writes section diagnose-vs-scvi of RESULTS.md (``--section`` another).

``sim10k`` and ``sim100k`` are the simulated NB counts of ``bench_training.py`` (a random MLP decoder, 2,000
genes, 3 batches; :func:`_common.simulate_h5ad`, cached under ``--data-dir``); the others are
:func:`countvae.data.load_dataset` names or ``embedded``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import (
    DEFAULT_RESULTS,
    REPO_ROOT,
    command_line,
    cpu_model,
    load_average,
    simulate_h5ad,
    write_section,
)

WORKER = """
import json, sys, time
import numpy as np, scvi, torch
import countvae as cv
from countvae.diagnostics.fitting.heldout import heldout_split
spec = json.loads(sys.argv[1])
if spec["path"]:
    import anndata as ad
    adata = ad.read_h5ad(spec["path"])
elif spec["dataset"] != "embedded":
    adata = cv.data.load_dataset(spec["dataset"])
else:
    from countvae.cli.diagnose import default_data
    adata = default_data()
adata = adata[:, spec["genes"]].copy() if spec["genes"] else adata
fit_idx, _ = heldout_split(adata.n_obs, spec["heldout_fraction"], spec["split_seed"])
adata = adata[fit_idx].copy()
assert adata.n_obs == spec["n_fit"], (adata.n_obs, spec["n_fit"])
start = time.perf_counter()
scvi.model.SCVI.setup_anndata(adata, batch_key=spec["batch_key"] or None)
model = scvi.model.SCVI(adata)
kwargs = {"accelerator": "cpu", "enable_progress_bar": False}
if spec["max_epochs"]:
    kwargs["max_epochs"] = spec["max_epochs"]
model.train(**kwargs)
seconds = time.perf_counter() - start
epochs = len(model.history["elbo_train"])
print(json.dumps({"seconds": seconds, "epochs": epochs, "cells": adata.n_obs, "genes": adata.n_vars,
                  "threads": torch.get_num_threads()}))
"""


#: Simulated data sets (cells; 2,000 genes, as ``bench_training.py``'s of the same name).
SIMULATED = {"sim10k": 10_000, "sim100k": 100_000}


def data_file(dataset: str, folder: Path, data_dir: Path) -> Path | None:
    """The h5ad file the diagnosis reads (``None``: the embedded default, which needs none)."""
    if dataset == "embedded":
        return None
    if dataset in SIMULATED:
        return simulate_h5ad(data_dir / f"sim_{SIMULATED[dataset]}x2000.h5ad", SIMULATED[dataset], 2000, seed=0)
    import countvae as cv

    path = folder / f"{dataset}.h5ad"
    cv.data.load_dataset(dataset).write_h5ad(path)
    return path


def run_diagnose(path: Path | None, out: Path, quick: bool) -> tuple[float, dict, dict]:
    """Run `countvae diagnose` on the data set in a fresh process; its wall time, result and report settings.

    Run as an analyst runs it, log messages on (so the warm-up that times the estimate printed before fitting is
    part of the wall time); ``--json`` gives the command's result, with the estimate and the seed fits' actual time.
    """
    command = [sys.executable, "-m", "countvae", "diagnose"]
    if path is not None:
        command += [str(path), "--batch-key", "batch"]
    if quick:
        command += ["--seeds", "2", "--max-epochs", "3"]
    command += ["--out", str(out), "--json"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    proc = subprocess.run(command, check=True, env=env, stdout=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    report = json.loads((out / "report" / "report.json").read_text())
    return seconds, json.loads(proc.stdout), report


def run_scvi(dataset: str, path: Path | None, report: dict, quick: bool) -> dict:
    """One default SCVI fit on the diagnosis's fit cells and genes, in a fresh process."""
    fits = report["settings"]["fits"]
    selection = fits.get("gene_selection") or {}
    spec = {
        "dataset": dataset,
        "path": str(path) if path is not None else None,
        "genes": selection.get("genes"),
        "heldout_fraction": fits["heldout_fraction"],
        "split_seed": fits["split_seed"],
        "n_fit": fits["split"]["n_fit"],
        "batch_key": fits["registry"]["batch_key"],
        "max_epochs": 3 if quick else None,
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, json.dumps(spec)], check=True, env=env, capture_output=True, text=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    """Time both for each data set and write the section."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default="embedded,kang2018", help="comma-separated: embedded, kang2018, ...")
    parser.add_argument("--quick", action="store_true", help="smoke run: embedded only, 2 seeds, 3 epochs")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--section", default="diagnose-vs-scvi", help="the RESULTS.md section to write")
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/countvae_bench_data"), help="simulated data")
    args = parser.parse_args(argv)
    datasets = ["embedded"] if args.quick else args.datasets.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for dataset in datasets:
            out = Path(tmp) / dataset / "diag"
            out.parent.mkdir(parents=True)
            args.data_dir.mkdir(parents=True, exist_ok=True)
            path = data_file(dataset, out.parent, args.data_dir)
            loads = [load_average()]
            diagnose_s, result, report = run_diagnose(path, out, args.quick)
            loads.append(load_average())
            scvi_run = run_scvi(dataset, path, report, args.quick)
            loads.append(load_average())
            fits = report["settings"]["fits"]
            epochs = [t.get("epochs_trained") for t in fits.get("training", [])]
            scvi_run["loads"], scvi_run["parallelism"] = loads, fits.get("parallelism", f"n_jobs {fits.get('n_jobs')}")
            scvi_run["estimate"] = (result["seconds_seed_fits_estimated"], result["seconds_seed_fits"])
            rows.append((dataset, diagnose_s, epochs, scvi_run))
            print(f"{dataset}: diagnose {diagnose_s:.0f} s, SCVI {scvi_run['seconds']:.0f} s", flush=True)
    lines = [
        "## The default diagnosis against one default SCVI fit (`bench_diagnose_vs_scvi.py`)",
        "",
        f"Command: `{command_line()}`; {cpu_model()}, {os.cpu_count()} cores, load average {load_average()} at "
        "the end. One job at a time; each timed in a fresh process.",
        "",
        "| data | cells fitted x genes | `countvae diagnose` (5 seeds, report included) | seeds fitted | "
        "epochs per seed | SCVI default fit | SCVI epochs | ratio | "
        "load average before / after diagnose / after SCVI |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for dataset, diagnose_s, epochs, scvi_run in rows:
        lines.append(
            f"| {dataset} | {scvi_run['cells']} x {scvi_run['genes']} | {diagnose_s:.0f} s | "
            f"{scvi_run['parallelism']} | "
            f"{', '.join(str(e) for e in epochs) or '-'} | {scvi_run['seconds']:.0f} s ({scvi_run['threads']} threads) "
            f"| {scvi_run['epochs']} | {diagnose_s / scvi_run['seconds']:.2f} | {' / '.join(scvi_run['loads'])} |"
        )
    lines += [
        "",
        "The time estimate the diagnosis printed before fitting (its warm-up's seconds per epoch x the epochs the "
        "shared stopping rule is expected to take, x the rounds of seeds fitted at once; "
        "`seconds_seed_fits_estimated` of `--json`) against the seed fits' wall time (`seconds_seed_fits`). "
        "Within a factor 1.5 is the target.",
        "",
        "| data | estimated s | actual s | estimated / actual | within 1.5x |",
        "|---|---|---|---|---|",
    ]
    for dataset, _, _, scvi_run in rows:
        estimated, actual = scvi_run["estimate"]
        ratio = estimated / actual if estimated is not None and actual else float("nan")
        lines.append(f"| {dataset} | {estimated} | {actual} | {ratio:.2f} | {1 / 1.5 <= ratio <= 1.5} |")
    write_section(args.results, f"{args.section}-quick" if args.quick else args.section, "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
