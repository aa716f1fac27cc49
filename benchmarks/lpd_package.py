"""The package's default held-out log p(x) estimator, measured on the package code (issue 13, item 1).

Section lpd-accuracy of RESULTS.md measured the method on the research prototype
(``lpd_estimators.py``); this script measures what users call,
``CountVAE.get_log_predictive_density`` (``method="mixture"``, the default, built on
:func:`countvae.module.marginal.estimate_log_marginal`), in one run:

(a) accuracy on held-out Kang cells of a default NB/MLP CountVAE (float32) against a
    gold standard: the same package estimator with 10x the draws, 10x the pilot and
    twice the restarts (:data:`GOLD`), run at two seeds. The two gold runs' per-cell
    agreement and their mean reported SE are the gold standard's own error bar. The
    guide estimator (``method="guide"``, 1,000 draws) is shown for contrast.
(b) speed on the same cells: the package default against scvi-tools'
    ``SCVI.get_marginal_ll(n_mc_samples=1000)`` on an SCVI of the same size (n_latent 10,
    128 hidden, 1 layer, NB, gene dispersion, batch) trained on the same cells for the same
    epochs, timed back to back in one process with torch on 1 thread, interleaved.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/lpd_package.py [--quick] [--cells 200] [--epochs 20] [--repeats 2]
        [--out benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from _common import (
    DEFAULT_MARGINAL,
    DEFAULT_RESULTS,
    GOLD_MARGINAL,
    command_line,
    load_average,
    machine_line,
    markdown_table,
    write_section,
)

import countvae as cv

SECTION = "lpd-package"
DEFAULT, GOLD = DEFAULT_MARGINAL, GOLD_MARGINAL  # gold: 10x the draws and pilot, twice the restarts
SPLIT_SEED = 0
HELD_OUT = 0.1


def load_data(quick: bool):
    """Kang (all genes; shared data via ``find_dataset``) or, with ``quick``, small simulated NB/MLP counts."""
    if quick:
        adata = cv.data.simulate(n_cells=300, n_genes=60, n_latent=3, decoder="mlp", n_batches=2, seed=0)
        name = "simulated NB/MLP, 300 cells x 60 genes (quick)"
    else:
        path = cv.data.find_dataset("kang2018")
        adata = cv.data.load_dataset("kang2018", path=path)
        adata = adata[np.asarray(adata.X.sum(1)).ravel() > 0].copy()
        name = f"kang2018 ({path.name}), {adata.n_obs:,} cells x {adata.n_vars:,} genes"
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    return adata, name


def summarize(frame: pd.DataFrame, gold: pd.DataFrame, gold_se: np.ndarray) -> dict:
    """Error of ``frame['lpd']`` against the gold ``lpd`` per cell; 'within 3 SE' uses both SEs combined."""
    diff = frame["lpd"].to_numpy() - gold["lpd"].to_numpy()
    se = np.hypot(frame["mc_se"].to_numpy(), gold_se)
    return {
        "mean lpd (nats/cell)": float(frame["lpd"].mean()),
        "mean(est - gold)": float(diff.mean()),
        "mean abs(est - gold)": float(np.abs(diff).mean()),
        "max abs(est - gold)": float(np.abs(diff).max()),
        "within 3 SE": float(np.mean(np.abs(diff) <= 3 * se)),  # NaN SE (unreliable) counts as outside
        "mean reported SE": float(np.nanmean(frame["mc_se"])),
        "unreliable (k-hat>0.7)": float(1.0 - frame["reliable"].mean()),
        "median ESS": float(frame["ess"].median()),
    }


def estimate(model, cells: np.ndarray, **kwargs) -> tuple[pd.DataFrame, float]:
    """``get_log_predictive_density`` on ``cells`` and its seconds (the unreliable-cells warning is in the table)."""
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cv.errors.UnreliableEstimateWarning)
        frame = model.get_log_predictive_density(indices=cells, **kwargs)
    return frame, time.perf_counter() - t0


def accuracy_part(model, cells: np.ndarray, log) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Default and guide estimates against the gold standard at two seeds."""
    default, t_default = estimate(model, cells, seed=0)
    log(f"default: {t_default:.1f} s")
    guide, t_guide = estimate(model, cells, seed=0, method="guide", n_samples=1000)
    log(f"guide: {t_guide:.1f} s")
    golds, t_gold = [], []
    for seed in (1, 2):
        frame, seconds = estimate(model, cells, seed=seed, settings=GOLD)
        golds.append(frame)
        t_gold.append(seconds)
        log(f"gold seed {seed}: {seconds:.1f} s")
    gold = golds[0]
    gold_se = gold["mc_se"].to_numpy()
    rows = [
        {"estimator": "package default (mixture, 800 draws + 200 pilot)", **summarize(default, gold, gold_se)},
        {"estimator": "guide, 1000 draws (method='guide')", **summarize(guide, gold, gold_se)},
    ]
    for row, seconds in zip(rows, (t_default, t_guide), strict=True):
        row["seconds"] = seconds
    agreement = summarize(golds[1], gold, gold_se)
    gold_rows = [
        {"run": "gold seed 1 (the reference)", **summarize(gold, gold, np.zeros(len(gold))), "seconds": t_gold[0]},
        {"run": "gold seed 2 vs seed 1", **agreement, "seconds": t_gold[1]},
    ]
    gold_rows[0]["within 3 SE"] = float("nan")  # a run compared with itself says nothing
    facts = {
        "gold_mean_se": float(np.nanmean(np.concatenate([g["mc_se"].to_numpy() for g in golds]))),
        "gold_mean_abs_diff": agreement["mean abs(est - gold)"],
    }
    return pd.DataFrame(rows), pd.DataFrame(gold_rows), facts


def train_scvi(adata, train_idx: np.ndarray, epochs: int):
    """An SCVI of the countvae model's size, trained on the same cells for the same epochs."""
    import scvi

    for name in ("scvi", "lightning", "lightning.pytorch", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    scvi.settings.seed = 0
    train = adata[train_idx].copy()
    scvi.model.SCVI.setup_anndata(train, batch_key="batch")
    svae = scvi.model.SCVI(train, n_latent=10, n_hidden=128, n_layers=1, gene_likelihood="nb", dispersion="gene")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        svae.train(
            max_epochs=epochs, train_size=1.0, batch_size=128, accelerator="cpu", devices=1, enable_progress_bar=False
        )
    return svae


def speed_part(model, svae, adata, cells: np.ndarray, repeats: int, log) -> pd.DataFrame:
    """Seconds on the same held-out cells, the two runners interleaved ``repeats`` times."""
    held = adata[cells].copy()
    held.obs_names_make_unique()
    runners = {
        "countvae get_log_predictive_density() (default)": lambda: estimate(model, cells, seed=0),
        "scvi-tools SCVI.get_marginal_ll(n_mc_samples=1000)": lambda: svae.get_marginal_ll(
            held, n_mc_samples=1000, return_mean=False
        ),
    }
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for repeat in range(repeats):
            for name, run in runners.items():
                t0 = time.perf_counter()
                run()
                rows.append({"runner": name, "repeat": repeat, "seconds": time.perf_counter() - t0})
                log(f"{name} repeat {repeat}: {rows[-1]['seconds']:.1f} s (load {load_average()})")
    table = pd.DataFrame(rows).groupby("runner", sort=False)["seconds"].agg(["min", "median", "max"]).reset_index()
    base = float(table.loc[table["runner"].str.startswith("scvi"), "median"].iloc[0])
    table["ratio to scvi (median)"] = table["median"] / base
    table.insert(1, "cells", len(cells))
    table.insert(2, "repeats", repeats)
    return table


def render(meta: dict, acc: pd.DataFrame | None, gold: pd.DataFrame | None, facts: dict, speed) -> str:
    """The RESULTS.md section."""
    parts = [
        "## Held-out log p(x): the package's default estimator on Kang (`lpd_package.py`)",
        "",
        f"Command: `{meta['command']}` ({meta['minutes']:.1f} min). Machine: {meta['machine']}; load average "
        f"{meta['load_start']} at the start, {meta['load_end']} at the end (a shared machine: absolute seconds "
        "depend on the load; the interleaved ratio less so).",
        "",
        f"Data: {meta['data']}; {HELD_OUT:.0%} of cells held out by `CountVAE.train(train_size=0.9, seed="
        f"{SPLIT_SEED})` (its validation split, never trained on); the first {meta['cells']} held-out cells are "
        f"evaluated. Model: default CountVAE (NB, MLP, n_latent 10, float32), {meta['epochs']} epochs "
        f"({meta['train_seconds']:.0f} s). Estimates by `CountVAE.get_log_predictive_density` (package code).",
        "",
        "### (a) Accuracy against a gold standard",
        "",
        f"Gold standard: the same package estimator with `MarginalSettings({meta['gold']})` (10x the draws and "
        "pilot, twice the restarts), seed 1 = the reference, seed 2 = its error bar. 'within 3 SE' combines the "
        "estimate's reported SE with the gold's; an unreliable cell (no SE) counts as outside.",
        "",
    ]
    if acc is None:
        parts += ["Not finished in this run.", ""]
    else:
        parts += [
            markdown_table(acc),
            "",
            "'seconds' here: one run each, not interleaved (the comparison of speed is part (b)).",
            "",
            "Gold standard's own error bar (seed 2 against seed 1):",
            "",
            markdown_table(gold),
            "",
            f"Gold runs: mean abs(seed 2 - seed 1) {facts['gold_mean_abs_diff']:.4f} nats/cell, mean reported SE "
            f"{facts['gold_mean_se']:.4f} nats/cell. Target (issue 13): the default within 0.1 nats/cell of the "
            f"gold on average: mean abs(default - gold) = {acc['mean abs(est - gold)'].iloc[0]:.4f} "
            f"({'met' if acc['mean abs(est - gold)'].iloc[0] <= 0.1 else 'NOT met'}).",
            "",
        ]
    parts += [
        "### (b) Speed against scvi-tools on the same cells",
        "",
        f"SCVI(n_latent=10, n_hidden=128, n_layers=1, gene_likelihood='nb', dispersion='gene', batch) trained "
        f"{meta['epochs']} epochs on the same training cells (batch size 128). Both runners in one process, torch "
        "with 1 thread, interleaved; seconds for all evaluated cells.",
        "",
    ]
    if speed is None:
        parts += ["Not finished in this run."]
    else:
        ratio = float(speed["ratio to scvi (median)"].iloc[0])
        verdict = "no slower" if ratio <= 1.0 else "SLOWER"
        parts += [
            markdown_table(speed),
            "",
            f"The package default took {ratio:.2f}x the time of `get_marginal_ll(n_mc_samples=1000)` "
            f"({verdict} than scvi-tools; target: no slower).",
        ]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> None:
    """Train, measure accuracy, then speed; write the section after each part."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny simulated data, seconds (a smoke test)")
    parser.add_argument("--cells", type=int, default=None, help="held-out cells evaluated (default 200; quick 20)")
    parser.add_argument("--epochs", type=int, default=None, help="training epochs (default 20; quick 3)")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved timing repeats")
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS, help="RESULTS.md to write the section into")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    started = time.perf_counter()
    n_cells = args.cells or (20 if args.quick else 200)
    epochs = args.epochs or (3 if args.quick else 20)

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f} s] {message}", flush=True)

    adata, data_name = load_data(args.quick)
    meta = {
        "command": command_line(),
        "machine": machine_line(1),
        "load_start": load_average(),
        "data": data_name,
        "cells": n_cells,
        "epochs": epochs,
        "gold": ", ".join(
            f"{k}={getattr(GOLD, k)}"
            for k in ("n_draws", "n_pilot", "pilot_restarts", "prior_restarts", "restart_steps", "escalation_draws")
        ),
    }
    t0 = time.perf_counter()
    model = cv.CountVAE(adata, n_latent=10)
    model.train(early_stopping=False, max_epochs=epochs, train_size=1.0 - HELD_OUT, seed=SPLIT_SEED, progress_bar=False)
    meta["train_seconds"] = time.perf_counter() - t0
    log(f"countvae trained ({meta['train_seconds']:.0f} s)")
    cells = np.asarray(model.validation_indices[:n_cells])
    if len(cells) < n_cells:
        raise ValueError(f"only {len(cells)} held-out cells; ask for --cells <= {len(cells)}.")

    def write(acc, gold, facts, speed) -> None:
        meta.update(load_end=load_average(), minutes=(time.perf_counter() - started) / 60)
        write_section(args.out, SECTION, render(meta, acc, gold, facts, speed))

    acc, gold, facts = accuracy_part(model, cells, log)
    write(acc, gold, facts, None)
    print(markdown_table(acc), markdown_table(gold), sep="\n\n", flush=True)
    svae = train_scvi(adata, np.asarray(model.train_indices), epochs)
    log("scvi trained")
    speed = speed_part(model, svae, adata, cells, args.repeats, log)
    write(acc, gold, facts, speed)
    print(markdown_table(speed), flush=True)
    log("done")


if __name__ == "__main__":
    main()
