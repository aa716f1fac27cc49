"""Peak memory of each ``fit_seeds`` worker: a backed file read by path against an in-memory AnnData.

``fit_seeds`` on a backed AnnData sends each worker the file's path and the fit
cells' positions; the worker streams its minibatches from the file. On an in-memory
AnnData each worker receives a pickled copy of the fit cells' counts. This script fits
two seeds in two joblib workers (one epoch each, default model) both ways, on the same
simulated file, each way from its own driver process, and reports the peak resident
memory of every worker (``VmHWM`` at the end of its fit, as ``fit.json`` records it)
and of the driver.

    python benchmarks/bench_worker_memory.py                  # 100,000 cells x 2,000 genes
    python benchmarks/bench_worker_memory.py --cells 1000000  # writes a 3.9 GB file first (~10 min)
    python benchmarks/bench_worker_memory.py --cells 1000000 --genes 200   # the same cells, 10x fewer genes
    python benchmarks/bench_worker_memory.py --quick          # 3,000 cells x 200 genes
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    DEFAULT_DATA_DIR,
    DEFAULT_RESULTS,
    command_line,
    load_average,
    machine_line,
    markdown_table,
    peak_rss_mb,
    run_worker,
    simulate_h5ad,
    write_section,
)


def worker(spec: dict) -> dict:
    """One driver: open the file (backed or into memory), fit two seeds in two workers, read their records."""
    import anndata as ad

    import countvae as cv
    from countvae.data.file_cells import FileCells
    from countvae.data.registry import get_registry
    from countvae.diagnostics import fit_seeds

    adata = ad.read_h5ad(spec["path"], backed="r" if spec["mode"] == "backed" else None)
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        fits = fit_seeds(
            adata,
            seeds=[0, 1],
            train_kwargs={"max_epochs": 1, "early_stopping": False, "progress_bar": False},  # as measured
            n_jobs=2,
            out_dir=Path(tmp) / "fits",
            progress_bar=False,
        )
        seconds = time.perf_counter() - t0
        records = [fits.records[s] for s in (0, 1)]
    from countvae.diagnostics.fitting.heldout import cells_at, heldout_split
    from countvae.diagnostics.fitting.parallelism import worker_memory_estimate

    fit_idx, _ = heldout_split(adata.n_obs, 0.1, 0)
    fit_cells = FileCells.of(adata, fit_idx, get_registry(adata)) if adata.isbacked else cells_at(adata, fit_idx)
    return {
        "estimate_mib": worker_memory_estimate(fit_cells) / 1024**2,
        "mode": spec["mode"],
        "seconds": seconds,
        "worker_peak_mib": [r["peak_rss_mib"] for r in records],
        "driver_peak_mib": peak_rss_mb(),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cells", type=int, default=100_000)
    parser.add_argument("--genes", type=int, default=2_000, help="simulated genes (fewer: a smaller file, faster fits)")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    parser.add_argument("--results", default=str(DEFAULT_RESULTS))
    parser.add_argument("--section", default=None, help="RESULTS.md section (default: worker-memory)")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    n_cells, n_genes = (3_000, 200) if args.quick else (args.cells, args.genes)
    path = simulate_h5ad(Path(args.data_dir) / f"sim_{n_cells}x{n_genes}.h5ad", n_cells, n_genes, seed=0)
    started, t_start = time.strftime("%Y-%m-%d %H:%M"), time.perf_counter()
    loads, rows = [load_average()], []
    for mode in ("backed", "in memory"):
        result = run_worker(Path(__file__), {"path": str(path), "mode": mode, "threads": 1})
        loads.append(load_average())
        rows.append(
            {
                "AnnData": mode,
                "worker peak RSS MiB (seed 0, seed 1)": ", ".join(f"{v:.0f}" for v in result["worker_peak_mib"]),
                "worker estimate MiB (fit_seeds' memory check)": result["estimate_mib"],
                "driver peak RSS MiB": result["driver_peak_mib"],
                "seconds (2 seeds, 1 epoch, 2 workers)": result["seconds"],
            }
        )
        print(rows[-1], flush=True)
    size_gib = path.stat().st_size / 1024**3
    dense_gib = n_cells * n_genes * 4 / 1024**3
    body = f"""## Memory per `fit_seeds` worker: backed file by path, or an in-memory copy (`bench_worker_memory.py`)

Command: `{command_line()}` ({started}{", QUICK smoke run" if args.quick else ""}; \
{(time.perf_counter() - t_start) / 60:.1f} min)

Machine: {machine_line(1)}. Load average (1/5/15 min) at the start and after each driver: {"; ".join(loads)}.

{n_cells:,} simulated cells x {n_genes:,} genes (file {size_gib:.2f} GiB as CSR float32; {dense_gib:.2f} GiB dense);
two seeds fitted in two joblib workers (one torch thread each), one epoch each, default model. Peak RSS:
`VmHWM` of each worker at the end of its fit (recorded in its `fit.json`), and `ru_maxrss` of the driver at the end.

{markdown_table(pd.DataFrame(rows))}
"""
    section = args.section or ("worker-memory-quick" if args.quick else "worker-memory")
    write_section(Path(args.results), section, body)


if __name__ == "__main__":
    main()
