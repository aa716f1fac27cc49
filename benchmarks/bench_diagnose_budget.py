"""How many epochs of the Kang data fit in a per-seed time budget, and what held-out fit they buy.

``countvae diagnose`` fits 5 seeds and must finish within 15 minutes on 2 cores,
so each seed gets about 2.5 minutes of training. This script trains the default
model (n_latent 10, 1 x 128 hidden, NB) on 90% of the Kang cells and records, at
checkpoints, the cumulative training time and the held-out log predictive
density (500 held-out cells, 100 importance samples), for batch sizes 128 and
256, plus one fit with early stopping. From these it reports the epochs that fit
in the budget and the held-out fit reached there, relative to the longest fit.

    python benchmarks/bench_diagnose_budget.py                  # checkpoints up to 200 epochs
    python benchmarks/bench_diagnose_budget.py --max-epochs 60  # shorter, on a busy machine
    python benchmarks/bench_diagnose_budget.py --quick
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    DEFAULT_RESULTS,
    command_line,
    load_average,
    machine_line,
    markdown_table,
    write_section,
)

CHECKPOINTS = (5, 10, 20, 40, 60, 80, 120, 160, 200)


def _fit_with_checkpoints(train, held, batch_size: int, checkpoints: list[int], lpd_samples: int) -> list[dict]:
    import countvae as cv

    model = cv.CountVAE(train, n_latent=10, n_hidden=128, n_layers=1, likelihood="nb", decoder="mlp")
    rows, done, seconds = [], 0, 0.0
    for k, epoch in enumerate(checkpoints):
        t0 = time.perf_counter()
        # each call continues training; a new seed per call gives new minibatch orders
        model.train(early_stopping=False, max_epochs=epoch - done, batch_size=batch_size, seed=k, progress_bar=False)
        seconds += time.perf_counter() - t0
        done = epoch
        lpd = model.get_log_predictive_density(held, n_samples=lpd_samples, seed=0, method="guide")["lpd"].mean()
        rows.append(
            {
                "fit": f"batch {batch_size}",
                "epochs": epoch,
                "train seconds": seconds,
                "s/epoch": seconds / epoch,
                "held-out LPD/cell": float(lpd),
                "validation loss": float(model.history["loss_validation"].iloc[-1]),
            }
        )
        print(rows[-1], flush=True)
    return rows


def _fit_early_stopping(train, held, max_epochs: int, patience: int, lpd_samples: int) -> dict:
    import countvae as cv

    model = cv.CountVAE(train, n_latent=10, n_hidden=128, n_layers=1, likelihood="nb", decoder="mlp")
    t0 = time.perf_counter()
    model.train(max_epochs=max_epochs, early_stopping=True, early_stopping_patience=patience, progress_bar=False)
    seconds = time.perf_counter() - t0
    lpd = model.get_log_predictive_density(held, n_samples=lpd_samples, seed=0, method="guide")["lpd"].mean()
    row = {
        "fit": f"batch 128, early stopping (patience {patience}, max {max_epochs})",
        "epochs": len(model.history),
        "train seconds": seconds,
        "s/epoch": seconds / len(model.history),
        "held-out LPD/cell": float(lpd),
        "validation loss": float(model.history["loss_validation"].min()),
    }
    print(row, flush=True)
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--max-epochs", type=int, default=200)
    parser.add_argument("--budget-seconds", type=float, default=150.0, help="training time per seed")
    parser.add_argument("--patience", type=int, default=10)
    parser.add_argument("--lpd-samples", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--results", default=str(DEFAULT_RESULTS))
    parser.add_argument("--section", default="diagnose-budget")
    args = parser.parse_args(argv)

    import torch

    import countvae as cv
    from countvae.data.split import split_indices

    torch.set_num_threads(args.threads)
    if args.quick:
        adata = cv.data.simulate(n_cells=600, n_genes=100, n_latent=3, n_batches=2, seed=0)
        checkpoints, args.lpd_samples = [1, 2], 10
        args.max_epochs = 3
    else:
        adata = cv.data.load_dataset("kang2018")
        checkpoints = [c for c in CHECKPOINTS if c <= args.max_epochs]
    fit_idx, held_idx = split_indices(adata.n_obs, 0.9, seed=12345)
    train, held = adata[fit_idx].copy(), adata[held_idx[:500]].copy()
    cv.CountVAE.setup_anndata(train, batch_key="batch")
    loads = [load_average()]
    rows = []
    for batch_size in (128, 256):
        rows += _fit_with_checkpoints(train, held, batch_size, checkpoints, args.lpd_samples)
        loads.append(load_average())
    rows.append(_fit_early_stopping(train, held, args.max_epochs, args.patience, args.lpd_samples))
    loads.append(load_average())
    table = pd.DataFrame(rows)
    best = table["held-out LPD/cell"].max()
    table["gap to best LPD"] = table["held-out LPD/cell"] - best
    print(table.to_string())

    lines = []
    for fit, g in table[table["fit"].str.startswith("batch") & ~table["fit"].str.contains("early")].groupby("fit"):
        rate = float(np.median(g["s/epoch"]))
        n_budget = int(args.budget_seconds / rate)
        reached = g[g["epochs"] <= n_budget]
        gap = float(reached["gap to best LPD"].iloc[-1]) if len(reached) else float("nan")
        at = int(reached["epochs"].iloc[-1]) if len(reached) else 0
        lines.append(
            f"- {fit}: {rate:.2f} s/epoch here, so {n_budget} epochs fit in {args.budget_seconds:.0f} s; the last "
            f"checkpoint inside the budget ({at} epochs) is {gap:.2f} nats/cell from the best held-out LPD measured."
        )
    body = f"""## Time budget of `countvae diagnose` on Kang (`bench_diagnose_budget.py`)

Command: `{command_line()}` ({time.strftime("%Y-%m-%d %H:%M")}{", QUICK smoke run" if args.quick else ""})

Machine: {machine_line(args.threads)}. Load average at the start and after each fit: {"; ".join(loads)}.

Training on {train.n_obs} cells (90% of the data; train_size 0.9 inside), held-out LPD on {held.n_obs} other
cells with {args.lpd_samples} importance samples. Train seconds are cumulative and exclude the LPD evaluations.

{markdown_table(table)}

{chr(10).join(lines)}
"""
    write_section(Path(args.results), args.section, body)


if __name__ == "__main__":
    main()
