"""Time the default ``countvae diagnose`` on a raw file of 1,408 cells x 11,533 genes (issue 16, first contact).

No file of that shape is in ../shared/data, so one is built from real counts: 1,408 cells
drawn (seed 0) from ``pbmc_3tech_savercat`` (2,000 PBMCs x 8,513 genes, raw UMI counts),
its genes with counts in those cells, and as many more genes as make 11,533, each a copy
of a real gene with its counts shuffled across the cells (same count distribution and
sparsity, no structure; named ``<gene>-shuffled``). Fitting time depends on the shape
and the kept genes, not on which genes they are.

The command runs ``countvae diagnose FILE`` at its defaults in a subprocess, with one
BLAS/OpenMP thread (as the fits use), and prints the wall time, the load average of the
machine before and after, the CPU time of the command (user + system, all its processes:
on a machine of its own, with ``--n-jobs 1``, the wall time would be about this), and what
the command printed (the block before fitting, the time per seed).

Run from the repository root::

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python benchmarks/bench_first_contact.py --work /tmp/fc_bench
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import anndata as ad
import numpy as np
import scipy.sparse as sp

from countvae.data import find_dataset

SHAPE = (1_408, 11_533)


def build_file(path: Path, seed: int = 0) -> ad.AnnData:
    """Write the 1,408 x 11,533 raw-count file described in the module docstring."""
    full = ad.read_h5ad(find_dataset("pbmc_3tech"))
    rng = np.random.default_rng(seed)
    cells = np.sort(rng.choice(full.n_obs, SHAPE[0], replace=False))
    counts = sp.csc_matrix(full.X[cells])
    expressed = np.flatnonzero(np.asarray(counts.sum(axis=0)).ravel() > 0)
    counts = counts[:, expressed]
    names = list(full.var_names[expressed])
    n_extra = SHAPE[1] - counts.shape[1]
    copies = rng.choice(counts.shape[1], n_extra, replace=False)
    shuffled = [counts[:, [j]].toarray().ravel()[rng.permutation(SHAPE[0])] for j in copies]
    extra = sp.csc_matrix(np.column_stack(shuffled).astype(np.float32))
    adata = ad.AnnData(
        X=sp.csr_matrix(sp.hstack([counts, extra]), dtype=np.float32),
        obs=full.obs.iloc[cells].copy(),
    )
    adata.var_names = names + [f"{names[j]}-shuffled" for j in copies]
    adata.write_h5ad(path, compression="gzip")
    return adata


def cpu_estimates(data: Path) -> None:
    """Print the warm-up estimate of one default seed in CPU seconds (not inflated by other users of the cores).

    On the fit cells of the default split, for 2,000 and 1,000 most variable genes and for all genes
    with counts in the fit cells.
    """
    import torch

    from countvae.data import select_top_genes, setup_anndata
    from countvae.diagnostics.fitting.heldout import heldout_split
    from countvae.model import warmup

    torch.set_num_threads(1)
    warmup.perf_counter = time.process_time  # this process's CPU seconds instead of wall time
    adata = ad.read_h5ad(data)
    setup_anndata(adata)
    fit_idx, _ = heldout_split(adata.n_obs, 0.1, 0)
    model = {"n_latent": 10, "likelihood": "nb", "decoder": "mlp", "n_hidden": 128, "n_layers": 1}
    train = {"max_epochs": 400, "batch_size": 128, "lr": 1e-3}
    for n_top in (2000, 1000, None):
        chosen = adata if n_top is None else select_top_genes(adata, n_top)
        fit = chosen[fit_idx].copy()
        fit = fit[:, np.asarray(fit.X.sum(axis=0)).ravel() > 0].copy()
        setup_anndata(fit)
        est = warmup.estimate_training_time(fit, model, train, n_steps=20, torch_threads=1)
        print(
            f"{fit.n_vars} genes: {est.seconds_per_epoch:.3f} CPU-s per epoch, "
            f"{est.seconds_per_fit:.1f} CPU-s per seed of {est.epochs} epochs"
        )


def main() -> int:
    """Build the file (once) and time ``countvae diagnose`` on it."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", required=True, help="folder for the data file and the diagnose output")
    parser.add_argument(
        "--cpu-estimates", action="store_true", help="print warm-up estimates in CPU seconds instead of running"
    )
    parser.add_argument("diagnose_args", nargs="*", help="extra options for countvae diagnose (after --)")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    data = work / "raw_1408x11533.h5ad"
    if not data.exists():
        adata = build_file(data)
        print(
            f"wrote {data}: {adata.n_obs} cells x {adata.n_vars} genes, "
            f"density {adata.X.nnz / np.prod(adata.shape):.3f}"
        )
    if args.cpu_estimates:
        cpu_estimates(data)
        return 0
    out = work / "diagnose"
    if out.exists():
        shutil.rmtree(out)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "countvae", "diagnose", str(data), "--out", str(out), *args.diagnose_args]
    load_before = os.getloadavg()
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    load_after = os.getloadavg()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    print(done.stderr[-6000:])
    print(done.stdout[-3000:])
    print(f"command: {' '.join(command[1:])}")
    print(f"exit code {done.returncode}; wall time {seconds:.0f} s ({seconds / 60:.1f} min)")
    print(f"CPU time of the command (user + system, all its processes) {cpu:.0f} s ({cpu / 60:.1f} min)")
    print(f"load average (1, 5, 15 min) before {load_before}, after {load_after}; cores {os.cpu_count()}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
