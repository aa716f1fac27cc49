"""When fitting seeds in worker processes pays off: serial against two workers, by steps per seed.

``fit_seeds(n_jobs="auto")`` fits in the calling process when each seed takes fewer
than ``MIN_STEPS_FOR_WORKERS`` minibatch steps, because two loky workers must each
start and import torch and countvae before they fit anything. This script measures
where that crossover lies: on one simulated dataset (1,000 cells x 200 genes, default
MLP model; 900 fit cells, 8 minibatches per epoch) it fits 3 seeds serially (``n_jobs=1``) and in two
workers (``n_jobs=2``) at several epoch counts, interleaved, each run in a fresh driver
process, and times one scvi-tools SCVI fit of the same cells, epochs and batch size as
the peer (the fit the diagnosis audits). It also times two bare workers starting and
importing countvae's fitting code.

    python benchmarks/bench_worker_start.py           # 25 to 500 epochs (200 to 4,000 steps per seed)
    python benchmarks/bench_worker_start.py --quick   # 5 and 25 epochs
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    DEFAULT_RESULTS,
    command_line,
    load_average,
    machine_line,
    markdown_table,
    run_worker,
    write_section,
)

N_CELLS, N_GENES, BATCH_SIZE, SEEDS = 1_000, 200, 128, (0, 1, 2)
#: Cells each seed is fitted on: fit_seeds holds out 10% by default.
FIT_CELLS = 900


def _import_fitting(_: int) -> float:
    start = time.perf_counter()
    import countvae.diagnostics.fitting.seed_job  # noqa: F401  (what a worker imports before its first fit)

    return time.perf_counter() - start


def worker(spec: dict) -> dict:
    """One driver process: a timed ``fit_seeds`` run, an SCVI fit, or two bare workers starting."""
    import joblib
    import torch

    torch.set_num_threads(1)
    if spec["kind"] == "start":
        start = time.perf_counter()
        imports = joblib.Parallel(n_jobs=2, backend="loky")(joblib.delayed(_import_fitting)(i) for i in range(2))
        return {"seconds": time.perf_counter() - start, "import_seconds": max(imports)}
    import countvae as cv

    adata = cv.data.simulate(n_cells=N_CELLS, n_genes=N_GENES, n_latent=5, seed=0)
    if spec["kind"] == "scvi":
        import scvi

        scvi.model.SCVI.setup_anndata(adata)
        model = scvi.model.SCVI(adata, n_latent=10)
        start = time.perf_counter()
        model.train(
            max_epochs=spec["epochs"],
            batch_size=BATCH_SIZE,
            train_size=1.0,
            accelerator="cpu",
            enable_progress_bar=False,
        )
        return {"seconds": time.perf_counter() - start}
    from countvae.diagnostics import fit_seeds

    cv.CountVAE.setup_anndata(adata)
    start = time.perf_counter()
    fits = fit_seeds(
        adata,
        seeds=list(SEEDS),
        train_kwargs={"max_epochs": spec["epochs"], "batch_size": BATCH_SIZE, "early_stopping": False},
        n_jobs=spec["n_jobs"],
        progress_bar=False,
    )
    return {"seconds": time.perf_counter() - start, "n_jobs": fits.settings["n_jobs"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--epochs", type=int, nargs="+", default=[25, 125, 250, 500])
    parser.add_argument("--results", default=str(DEFAULT_RESULTS))
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    from countvae.diagnostics.fitting.parallelism import MIN_STEPS_FOR_WORKERS, steps_per_seed

    epochs_list = [5, 25] if args.quick else args.epochs
    started, t_start = time.strftime("%Y-%m-%d %H:%M"), time.perf_counter()
    loads = [load_average()]
    starts = [run_worker(Path(__file__), {"kind": "start"}) for _ in range(2)]
    rows = []
    for epochs in epochs_list:
        serial = run_worker(Path(__file__), {"kind": "seeds", "epochs": epochs, "n_jobs": 1})
        parallel = run_worker(Path(__file__), {"kind": "seeds", "epochs": epochs, "n_jobs": 2})
        peer = run_worker(Path(__file__), {"kind": "scvi", "epochs": epochs})
        loads.append(load_average())
        steps = steps_per_seed(FIT_CELLS, {"max_epochs": epochs, "batch_size": BATCH_SIZE})
        rows.append(
            {
                "epochs": epochs,
                "steps per seed": steps,
                "3 seeds, n_jobs=1 (s)": serial["seconds"],
                "3 seeds, n_jobs=2 (s)": parallel["seconds"],
                "two workers / serial": parallel["seconds"] / serial["seconds"],
                '"auto" chooses': "workers" if steps >= MIN_STEPS_FOR_WORKERS else "in process",
                "one SCVI fit (s)": peer["seconds"],
            }
        )
        print(rows[-1], flush=True)
    start_line = "; ".join(f"{s['seconds']:.1f} s (import {s['import_seconds']:.1f} s)" for s in starts)
    body = f"""## When fit workers pay off: serial against parallel seeds, by steps per seed (`bench_worker_start.py`)

Command: `{command_line()}` ({started}{", QUICK smoke run" if args.quick else ""}; \
{(time.perf_counter() - t_start) / 60:.1f} min)

Machine: {machine_line(1)}. Load average (1/5/15 min) at the start and after each epoch count: {"; ".join(loads)}.

Two bare loky workers starting and importing countvae's fitting code: {start_line}.

{N_CELLS:,} simulated cells x {N_GENES} genes, default countvae model (MLP, NB, 10-d), batch size {BATCH_SIZE},
3 seeds; each run in a fresh driver process, serial and parallel interleaved. `"auto"` fits in process below
`MIN_STEPS_FOR_WORKERS` = {MIN_STEPS_FOR_WORKERS:,} steps per seed. Peer: one scvi-tools SCVI fit of the same
cells with the same epochs and batch size, in its own process.

{markdown_table(pd.DataFrame(rows), floatfmt="{:.3g}")}
"""
    write_section(Path(args.results), "worker-start-quick" if args.quick else "worker-start", body)


if __name__ == "__main__":
    main()
