"""Small files: scvi-tools' full schedule against the shared stopping rule, and a patience counted in steps.

On a file of a few hundred cells an epoch is one to three minibatches, so the shared rule's patience of 10
epochs (:data:`countvae.model.training.DEFAULT_STOPPING`, ``train()``'s default) is 10 to 30 optimiser steps, and
scvi-tools' schedule (400 epochs at a learning rate of 1e-3, ``early_stopping=False``; ``train()``'s default until
2026-12-05) is 400 to 1,200. This
script asks which of them an analyst with such a file should use, and whether a patience of at least
``S`` optimiser steps (``max(10, ceil(S / steps per epoch))`` epochs) would serve better than 10 epochs.

Each replicate is a file of ``n`` Kang cells (disjoint across replicates and sizes, drawn with a fixed seed),
500 genes of largest total count in Kang (those without a count in the file dropped), the batch covariate;
every variant fits the package's default model (MLP decoder, NB, 10 latent dimensions) from the same seed,
split and initial parameters. All are scored on the same held-out Kang cells, outside every file, by the
package's accurate estimator of held-out log p(x) (``get_log_predictive_density``, seed 0), paired per cell.

    python benchmarks/bench_stopping_small_files.py                       # 80, 200, 400 cells x 5 (~25 min)
    python benchmarks/bench_stopping_small_files.py --reuse               # the section from the stored fits
    python benchmarks/bench_stopping_small_files.py --quick               # simulated counts, a smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
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
    write_section,
)

#: The variant every other one is compared with.
REFERENCE = "shared rule"
#: scvi-tools' schedule: every epoch at 1e-3 (the section of 2026-12-05 calls it "train() default").
FULL_SCHEDULE = "400 epochs at 1e-3"
#: Genes kept (largest total count in the source).
N_GENES = 500


def _cells_and_genes(quick: bool):
    """The source of the files and of the held-out cells: Kang (500 genes), or small simulated counts."""
    import countvae as cv

    if quick:
        return cv.data.simulate(n_cells=400, n_genes=60, n_latent=3, n_batches=2, seed=0)
    kang = cv.data.load_dataset("kang2018")
    totals = np.asarray(kang.X.sum(axis=0)).ravel()
    return kang[:, np.sort(np.argsort(-totals)[:N_GENES])].copy()


def _variants(n_train: int, floors: list[int], max_epochs: int) -> dict[str, dict]:
    """Keywords of ``CountVAE.train`` for each variant, on a file with ``n_train`` training cells."""
    from countvae.model.training import DEFAULT_STOPPING

    steps = math.ceil(n_train / 128)
    variants = {REFERENCE: DEFAULT_STOPPING.train_kwargs()}
    for floor in floors:
        patience = max(DEFAULT_STOPPING.patience, math.ceil(floor / steps))
        variants[f"patience >= {floor} steps"] = {
            **DEFAULT_STOPPING.train_kwargs(),
            "early_stopping_patience": patience,
        }
    variants[FULL_SCHEDULE] = {"early_stopping": False}
    return {name: {"max_epochs": max_epochs, **kwargs} for name, kwargs in variants.items()}


def fit_replicate(source, heldout, cells: np.ndarray, replicate: int, floors: list[int], max_epochs: int) -> list[dict]:
    """Every variant on one file (``source[cells]``), scored on ``heldout``; one record per variant."""
    import countvae as cv
    from countvae.errors import UnreliableEstimateWarning

    file = source[cells].copy()
    expressed = np.asarray(file.X.sum(axis=0)).ravel() > 0
    file, held = file[:, expressed].copy(), heldout[:, expressed].copy()
    cv.CountVAE.setup_anndata(file, batch_key="batch")
    records = []
    for name, kwargs in _variants(math.floor(0.9 * file.n_obs), floors, max_epochs).items():
        model = cv.CountVAE(file, n_latent=10)
        t0 = time.perf_counter()
        model.train(seed=replicate, progress_bar=False, **kwargs)
        seconds = time.perf_counter() - t0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnreliableEstimateWarning)
            frame = model.get_log_predictive_density(held, seed=0)
        lpd = frame["lpd"].where(frame["reliable"])  # unreliable estimates left out of the paired means
        records.append(
            {
                "n_cells": int(file.n_obs),
                "n_genes": int(file.n_vars),
                "replicate": replicate,
                "variant": name,
                "epochs": int(model.training_summary["epochs_trained"]),
                "kept_epoch": int(model.training_summary["kept_epoch"]),
                "seconds": seconds,
                "lpd": [None if math.isnan(v) else float(v) for v in lpd],
            }
        )
    return records


def paired_table(records: list[dict]) -> pd.DataFrame:
    """Per file size and variant: epochs, seconds, mean log p(x) and the paired difference from the reference.

    The difference is, per replicate, the mean over the held-out cells reliable under both fits of (variant
    minus reference); its mean over replicates with the standard error over replicates, and the
    replicates' values.
    """
    frame = pd.DataFrame(records)
    rows = []
    for (n, name), group in frame.groupby(["n_cells", "variant"], sort=False):
        diffs, means = [], []
        for record in group.itertuples():
            mine = np.array(record.lpd, dtype=float)
            base = frame[(frame.n_cells == n) & (frame.variant == REFERENCE) & (frame.replicate == record.replicate)]
            other = np.array(base.iloc[0].lpd, dtype=float)
            both = np.isfinite(mine) & np.isfinite(other)
            diffs.append(float(np.mean(mine[both] - other[both])))
            means.append(float(np.mean(mine[both])))
        se = float(np.std(diffs, ddof=1) / math.sqrt(len(diffs))) if len(diffs) > 1 else math.nan
        rows.append(
            {
                "cells in the file": n,
                "variant": name,
                "epochs (mean)": float(group.epochs.mean()),
                "s per fit (mean)": float(group.seconds.mean()),
                "log p(x) per cell (mean)": float(np.mean(means)),
                "minus shared rule (SE over replicates)": f"{np.mean(diffs):+.2f} ({se:.2f})",
                "per replicate": ", ".join(f"{d:+.2f}" for d in diffs),
            }
        )
    return pd.DataFrame(rows)


def _body(args, records: list[dict], started: str, minutes: float, loads: list[str]) -> str:
    table = paired_table(records)
    title = "## Small files: scvi-tools' full schedule against the shared stopping rule"
    title += " (`bench_stopping_small_files.py`)"
    if args.quick:
        title += " (QUICK: simulated counts, a smoke run)"
    held = len(records[0]["lpd"]) if records else 0
    return f"""{title}

Command: `{command_line()}` ({started}; {minutes:.0f} min)

Machine: {machine_line(1)}. Load average (1/5/15 min) before and after: {loads[0]}; {loads[-1]}.

Files of {args.sizes} {"simulated" if args.quick else "Kang"} cells ({args.replicates} disjoint files per size, their
{N_GENES if not args.quick else 60} genes of largest total count less those without a count in the file, batch
covariate), the default model (MLP, NB, 10-d), one torch thread. Variants: the shared rule (`DEFAULT_STOPPING`:
lr 1e-2, patience 10 epochs, one cut to 1e-3); the same with a patience of at least the given number of optimiser
steps; scvi-tools' schedule (`early_stopping=False`, lr 1e-3, {args.max_epochs} epochs). Held-out log p(x) per cell
(nats, higher is better) on the same {held} cells outside every file, by `get_log_predictive_density`; the
difference is paired per cell (cells reliable under both fits), averaged per file, then over files.

{markdown_table(table)}
"""


def main(argv=None) -> None:
    """Fit every file size, replicate and variant (stored as each file finishes) and write the section."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="simulated counts, one small file, 30 epochs")
    parser.add_argument("--sizes", default="80,200,400", help="cells per file")
    parser.add_argument("--replicates", type=int, default=5, help="files per size")
    parser.add_argument("--floors", default="40,80", help="least patience in optimiser steps, one variant each")
    parser.add_argument("--heldout-cells", type=int, default=1000)
    parser.add_argument("--max-epochs", type=int, default=400)
    parser.add_argument("--reuse", action="store_true", help="keep the stored fits, fit only what is missing")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    parser.add_argument("--section", default=None)
    parser.add_argument("--results", default=str(DEFAULT_RESULTS))
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.replicates, args.floors, args.heldout_cells, args.max_epochs = "80", 1, "40", 100, 30
    import torch

    torch.set_num_threads(1)
    sizes, floors = [int(s) for s in args.sizes.split(",")], [int(f) for f in args.floors.split(",") if f]
    store = Path(args.data_dir) / f"stopping_small_files{'_quick' if args.quick else ''}.json"
    records = json.loads(store.read_text()) if args.reuse and store.exists() else []
    done = {(r["n_cells"], r["replicate"]) for r in records}
    source = _cells_and_genes(args.quick)
    order = np.random.default_rng(7).permutation(source.n_obs)
    heldout = source[order[: args.heldout_cells]].copy()
    started, t0, loads, offset = time.strftime("%Y-%m-%d %H:%M"), time.perf_counter(), [load_average()], 0
    for n in sizes:
        for replicate in range(args.replicates):
            cells = order[args.heldout_cells + offset : args.heldout_cells + offset + n]
            offset += n
            if len(cells) < n:
                raise SystemExit(f"the source has too few cells for {args.replicates} files of {args.sizes} cells")
            if (n, replicate) in done:
                continue
            records += fit_replicate(source, heldout, np.sort(cells), replicate, floors, args.max_epochs)
            store.parent.mkdir(parents=True, exist_ok=True)
            store.write_text(json.dumps(records))
            print(f"{n} cells, replicate {replicate}: done", flush=True)
    loads.append(load_average())
    write_section(
        Path(args.results),
        args.section or "stopping-small-files",
        _body(args, records, started, (time.perf_counter() - t0) / 60, loads),
    )


if __name__ == "__main__":
    main()
