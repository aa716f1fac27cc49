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
    python benchmarks/bench_worker_memory.py --counts-in-layer --cells 250000 --section worker-memory-layer
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp

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

#: Cells per chunk when the counts-in-layer file is built from the counts file.
LAYER_CHUNK_CELLS = 20_000


def layer_h5ad(counts_path: Path, path: Path) -> Path:
    """Write ``counts_path``'s counts to ``layers["counts"]`` of ``path`` with X = log1p(counts per 10k), both CSR.

    Read and written ``LAYER_CHUNK_CELLS`` cells at a time; obs, var and uns are copied. Built under a temporary
    name and renamed; an existing file is kept.
    """
    import anndata as ad
    import h5py
    from anndata.io import read_elem, sparse_dataset, write_elem

    from countvae._io import atomic_file_path

    path = Path(path)
    if path.exists():
        return path
    with h5py.File(counts_path, "r") as src, atomic_file_path(path, overwrite=False) as tmp, h5py.File(tmp, "w") as f:
        f.attrs["encoding-type"] = "anndata"
        f.attrs["encoding-version"] = "0.1.0"
        for key in ("obs", "var", "uns"):
            write_elem(f, key, read_elem(src[key]))
        for key in ("obsm", "varm", "layers", "obsp", "varp"):
            write_elem(f, key, {})
        counts = sparse_dataset(src["X"])
        shape = counts.shape
        for lo in range(0, counts.shape[0], LAYER_CHUNK_CELLS):
            block = counts[lo : lo + LAYER_CHUNK_CELLS]
            size = np.asarray(block.sum(axis=1), dtype=np.float64).ravel()
            normalized = sp.csr_matrix(sp.diags(1e4 / size) @ block, dtype=np.float32)
            normalized.data = np.log1p(normalized.data)
            if lo == 0:
                write_elem(f, "X", normalized)
                write_elem(f["layers"], "counts", block)
            else:
                sparse_dataset(f["X"]).append(normalized)
                sparse_dataset(f["layers"]["counts"]).append(block)
    check = ad.read_h5ad(path, backed="r")
    assert check.shape == shape and "counts" in check.layers, (check.shape, shape)
    check.file.close()
    return path


class SharedDumpWatch:
    """Largest total size, sampled every ``interval`` s, of this process's joblib memmapping folders in /dev/shm."""

    def __init__(self, interval: float = 0.2):
        self.interval, self.peak, self._stop = interval, 0, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _size(self) -> int:
        total = 0
        for folder in Path("/dev/shm").glob(f"joblib_memmapping_folder_{os.getpid()}_*"):
            for file in folder.rglob("*"):
                try:
                    total += file.stat().st_size if file.is_file() else 0
                except OSError:  # removed while listed
                    pass
        return total

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self._size())

    def __enter__(self) -> SharedDumpWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def worker(spec: dict) -> dict:
    """One driver: open the file (backed or into memory), fit two seeds in two workers, read their records."""
    import anndata as ad

    import countvae as cv
    from countvae.data.file_cells import FileCells
    from countvae.data.registry import get_registry
    from countvae.diagnostics import fit_seeds

    adata = ad.read_h5ad(spec["path"], backed="r" if spec["mode"] == "backed" else None)
    cv.CountVAE.setup_anndata(adata, batch_key="batch", layer=spec.get("layer"))
    with tempfile.TemporaryDirectory() as tmp, SharedDumpWatch() as dump:
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
    from countvae.diagnostics.fitting.parallelism import (
        WORKER_BASE_BYTES,
        _backed_spares,
        counts_nbytes,
        worker_memory_estimate,
    )

    # What fit_seeds' memory check is given (fit_cells in heldout.py): the file's cells by path, or an in-memory copy.
    fit_idx, _ = heldout_split(adata.n_obs, 0.1, 0)
    fit_cells = FileCells.of(adata, fit_idx, get_registry(adata)) if adata.isbacked else cells_at(adata, fit_idx)
    spared = _backed_spares(fit_cells)
    return {
        "counts_mib": counts_nbytes(fit_cells) / 1024**2,
        "estimate_mib": worker_memory_estimate(fit_cells) / 1024**2,
        "spared_mib": spared / 1024**2,
        "advice": bool(spared > WORKER_BASE_BYTES),  # _within_memory's condition (a countvae model: remedy on)
        "shm_peak_mib": dump.peak / 1024**2,
        "mode": spec["mode"],
        "seconds": seconds,
        "worker_peak_mib": [r["peak_rss_mib"] for r in records],
        "driver_peak_mib": peak_rss_mb(),
    }


def main(argv=None) -> None:
    from countvae.diagnostics.fitting.parallelism import WORKER_BASE_BYTES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cells", type=int, default=100_000)
    parser.add_argument("--genes", type=int, default=2_000, help="simulated genes (fewer: a smaller file, faster fits)")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    parser.add_argument("--results", default=str(DEFAULT_RESULTS))
    parser.add_argument(
        "--section", default=None, help="RESULTS.md section (default: worker-memory, or worker-memory-layer)"
    )
    parser.add_argument(
        "--counts-in-layer",
        action="store_true",
        help='counts in layers["counts"] beside a sparse normalized X (log1p per 10k), registered with layer="counts"',
    )
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    n_cells, n_genes = (3_000, 200) if args.quick else (args.cells, args.genes)
    started, t_start = time.strftime("%Y-%m-%d %H:%M"), time.perf_counter()
    path = simulate_h5ad(Path(args.data_dir) / f"sim_{n_cells}x{n_genes}.h5ad", n_cells, n_genes, seed=0)
    layer = "counts" if args.counts_in_layer else None
    if layer:
        path = layer_h5ad(path, Path(args.data_dir) / f"sim_{n_cells}x{n_genes}_layer.h5ad")
    data_minutes = (time.perf_counter() - t_start) / 60
    loads, rows = [load_average()], []
    for mode in ("backed", "in memory"):
        result = run_worker(Path(__file__), {"path": str(path), "mode": mode, "threads": 1, "layer": layer})
        loads.append(load_average())
        rows.append(
            {
                "AnnData": mode,
                "worker peak RSS MiB (seed 0, seed 1)": ", ".join(f"{v:.0f}" for v in result["worker_peak_mib"]),
                "counts counted MiB": result["counts_mib"],
                "worker estimate MiB (fit_seeds' memory check)": result["estimate_mib"],
                "backed would spare MiB (package)": result["spared_mib"],
                "backed advice": "yes" if result["advice"] else "no",
                "joblib dump in /dev/shm, peak MiB": result["shm_peak_mib"],
                "driver peak RSS MiB": result["driver_peak_mib"],
                "seconds (2 seeds, 1 epoch, 2 workers)": result["seconds"],
            }
        )
        print(rows[-1], flush=True)
    size_gib = path.stat().st_size / 1024**3
    dense_gib = n_cells * n_genes * 4 / 1024**3
    layout = (
        'the counts in `layers["counts"]` (CSR) beside a sparse normalized X (log1p of counts per 10k, CSR float32; '
        'registered with `layer="counts"`)'
        if layer
        else "the counts in X (CSR)"
    )
    body = f"""## Memory per `fit_seeds` worker: backed file by path, or an in-memory copy (`bench_worker_memory.py`)

Command: `{command_line()}` ({started}{", QUICK smoke run" if args.quick else ""}; \
{(time.perf_counter() - t_start) / 60:.1f} min, of which {data_minutes:.1f} min writing or finding the data file)

Machine: {machine_line(1)}. Load average (1/5/15 min) at the start and after each driver: {"; ".join(loads)}.

{n_cells:,} simulated cells x {n_genes:,} genes, {layout} (file {size_gib:.2f} GiB; the counts \
{dense_gib:.2f} GiB dense); two seeds fitted in two joblib workers (one torch thread each), one epoch each, default
model. Peak RSS: `VmHWM` of each worker at the end of its fit (recorded in its `fit.json`), and `VmHWM` of the driver
at the end. "Counts counted": what `counts_nbytes` counts for a worker (the fit cells' registered counts in
memory; a backed file's layers, read whole). "Worker estimate": `worker_memory_estimate`; "backed would spare":
`_backed_spares`; "backed advice": whether the memory warning, were it logged, would advise a backed file (spared >
`WORKER_BASE_BYTES`, {WORKER_BASE_BYTES / 1024**2:.0f} MiB). "joblib dump": the largest size of the driver's joblib
memmapping folders in /dev/shm (sampled every 0.2 s), memory the workers share.

{markdown_table(pd.DataFrame(rows))}
"""
    default = "worker-memory-layer" if layer else "worker-memory"
    section = args.section or (f"{default}-quick" if args.quick else default)
    write_section(Path(args.results), section, body)


if __name__ == "__main__":
    main()
