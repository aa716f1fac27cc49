"""Training on on-disk (backed) AnnData: time per epoch and peak memory against the number of cells.

Simulated NB counts (2,000 genes, CSR float32) are written to h5ad files chunk by
chunk (never the dense matrix at once), opened with
``anndata.read_h5ad(path, backed="r")``, registered, and trained for one epoch with
countvae's default block-shuffled streaming (blocks of 1,024 consecutive cells,
8 blocks per shuffling buffer), n_latent 10, 1 x 128 hidden, NB, batch size 128,
train_size 0.9 (so an epoch also includes a validation pass over 10% of the cells).
Each size runs in its own process so that its peak resident memory is its own.

    python benchmarks/bench_scale.py                 # 10k, 100k, 1M cells; writes RESULTS.md and scale.png
    python benchmarks/bench_scale.py --quick         # 1k and 2k cells, 60 genes
    python benchmarks/bench_scale.py --max-steps 1500   # time 1,500 steps per size and extrapolate

With ``--max-steps`` the training part of the epoch is extrapolated from the first
steps (time x steps per epoch / steps timed; the validation pass over all
validation cells is always run and timed in full) and the table says so.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    BENCH_DIR,
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

from countvae._io import write_bytes_atomic  # noqa: E402


def worker(spec: dict) -> dict:
    """Open one file backed, set it up, train one (possibly truncated) epoch; report time and memory."""
    import anndata as ad
    import torch

    import countvae as cv
    from countvae.data import loader
    from countvae.model import training

    torch.set_num_threads(spec["threads"])
    out: dict = {"rss_after_import_mb": peak_rss_mb()}
    t0 = time.perf_counter()
    adata = ad.read_h5ad(spec["path"], backed="r")
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    out["setup_seconds"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = cv.CountVAE(adata, n_latent=10, n_hidden=128, n_layers=1, likelihood="nb", decoder="mlp")
    out["init_seconds"] = time.perf_counter() - t0

    max_steps = spec.get("max_steps")
    counter = {"train_steps": 0}
    original = loader.CountSource.iterate

    def counted(self, indices, batch_size, shuffle=False, **kwargs):
        for i, mb in enumerate(original(self, indices, batch_size, shuffle=shuffle, **kwargs)):
            if shuffle:
                if max_steps is not None and i >= max_steps:
                    return
                counter["train_steps"] += 1
            yield mb

    evaluate = training.evaluate_loss
    validation = {}

    def timed_evaluate(*a, **k):  # the validation pass at the end of the epoch, timed on its own
        t = time.perf_counter()
        value = evaluate(*a, **k)
        validation["seconds"] = time.perf_counter() - t
        return value

    loader.CountSource.iterate = counted
    training.evaluate_loss = timed_evaluate
    try:
        t0 = time.perf_counter()
        model.train(early_stopping=False, max_epochs=1, batch_size=128, train_size=0.9, seed=0, progress_bar=False)
        out["train_seconds"] = time.perf_counter() - t0 - validation["seconds"]
        out["validation_seconds"] = validation["seconds"]
    finally:
        loader.CountSource.iterate = original
        training.evaluate_loss = evaluate
    n_train = len(model.train_indices)
    steps_per_epoch = -(-n_train // 128)
    out.update(
        n_cells=int(adata.n_obs),
        n_genes=int(adata.n_vars),
        steps_timed=counter["train_steps"],
        steps_per_epoch=steps_per_epoch,
        loss_train=float(model.history["loss_train"].iloc[-1]),
        threads=torch.get_num_threads(),
        peak_rss_mb=peak_rss_mb(),
    )
    return out


def _plot(table: pd.DataFrame) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    cells = table["cells"].to_numpy(float)
    secs = table["s/epoch"].to_numpy(float)
    axes[0].loglog(cells, secs, "o-", label="measured")
    axes[0].loglog(cells, secs[-1] * cells / cells[-1], "k--", lw=0.8, label="linear through the largest")
    axes[0].set(xlabel="cells", ylabel="seconds per epoch", title="Time per epoch (backed h5ad)")
    axes[0].legend()
    axes[1].semilogx(cells, table["peak RSS MiB"].to_numpy(float) / 1024, "o-", label="peak RSS")
    axes[1].semilogx(cells, table["dense float32 GiB"].to_numpy(float), "r:", label="dense matrix size")
    axes[1].axhline(4.0, color="grey", lw=0.8, ls="--", label="4 GB target")
    axes[1].set(xlabel="cells", ylabel="GiB", title="Peak resident memory")
    axes[1].set_yscale("log")
    axes[1].legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="1k and 2k cells x 60 genes: a smoke run")
    parser.add_argument("--cells", default="10000,100000,1000000", help="comma list of dataset sizes")
    parser.add_argument("--genes", type=int, default=2000)
    parser.add_argument("--max-steps", type=int, default=None, help="time this many training steps and extrapolate")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    parser.add_argument("--results", default=str(DEFAULT_RESULTS))
    parser.add_argument("--plot", default=str(BENCH_DIR / "scale.png"))
    parser.add_argument("--section", default="scale")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    if args.quick:
        args.cells, args.genes = "1000,2000", 60
    rows, loads = [], []
    started = time.strftime("%Y-%m-%d %H:%M")
    for n in [int(c) for c in args.cells.split(",")]:
        t0 = time.perf_counter()
        path = simulate_h5ad(Path(args.data_dir) / f"sim_{n}x{args.genes}.h5ad", n, args.genes, seed=0)
        made = time.perf_counter() - t0
        loads.append(load_average())
        spec = {"path": str(path), "threads": args.threads, "max_steps": args.max_steps}
        r = run_worker(Path(__file__), spec)
        r["file_gib"] = path.stat().st_size / 2**30
        r["simulate_seconds"] = made
        truncated = r["steps_timed"] < r["steps_per_epoch"]
        scale = r["steps_per_epoch"] / r["steps_timed"] if truncated else 1.0
        r["s/epoch"] = r["train_seconds"] * scale + r["validation_seconds"]
        r["how"] = f"extrapolated from {r['steps_timed']} steps" if truncated else "full epoch"
        print(
            f"{n:>9} cells: {r['s/epoch']:.1f} s/epoch ({r['how']}), setup {r['setup_seconds']:.1f} s, "
            f"init {r['init_seconds']:.1f} s, peak RSS {r['peak_rss_mb']:.0f} MiB",
            flush=True,
        )
        rows.append(r)
    loads.append(load_average())
    frame = pd.DataFrame(rows)
    table = pd.DataFrame(
        {
            "cells": frame["n_cells"],
            "genes": frame["n_genes"],
            "file GiB": frame["file_gib"],
            "dense float32 GiB": frame["n_cells"] * frame["n_genes"] * 4 / 2**30,
            "setup_anndata s": frame["setup_seconds"],
            "CountVAE() s": frame["init_seconds"],
            "s/epoch": frame["s/epoch"],
            "ms/step": 1000 * frame["train_seconds"] / frame["steps_timed"],
            "validation s": frame["validation_seconds"],
            "how": frame["how"],
            "peak RSS MiB": frame["peak_rss_mb"],
        }
    )
    print(table.to_string())
    write_bytes_atomic(args.plot, _plot(table), overwrite=True)
    per_cell = table["s/epoch"] / table["cells"]
    body = f"""## Backed (on-disk) training at scale (`bench_scale.py`)

Command: `{command_line()}` ({started}{", QUICK smoke run" if args.quick else ""})

Machine: {machine_line(args.threads)}. Load average before each size: {"; ".join(loads)}.

One epoch per size on `anndata.read_h5ad(path, backed="r")`, default block-shuffled streaming, n_latent 10,
1 x 128 hidden, NB, batch size 128, train_size 0.9 (the epoch includes the validation pass). `setup_anndata s`
is the validation pass over the file, `CountVAE() s` the gene totals pass. Peak RSS is the worker process's
high-water mark, including Python, torch and the in-memory obs table.

{markdown_table(table)}

Seconds per epoch per 1,000 cells: {", ".join(f"{1000 * v:.3g}" for v in per_cell)} (constant = linear in cells; the
smallest size's one epoch also carries the first steps' warm-up, so compare ms/step).
Plot: `{Path(args.plot).name}` (left: time per epoch against cells with a line of slope 1; right: peak resident
memory against the dense matrix size and the 4 GB target).
"""
    write_section(Path(args.results), args.section, body)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
