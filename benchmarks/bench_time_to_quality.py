"""Time to a given quality against scvi-tools: how long countvae takes to fit as well as SCVI does.

Per-epoch speed is what a benchmark usually reports; what an analyst waits for is a fit
that is good enough. For each data set this script, in one run and on the same cells:

1. trains scvi-tools' SCVI at its default settings (``SCVI.train()`` without arguments
   other than the batch size and split; its default number of epochs,
   ``min(round(20000 / n * 400), 400)``, and its 400-epoch KL warm-up), unless
   ``--scvi-epochs`` caps the epochs for time (the section says so); times every epoch;
   then estimates its held-out log p(x) (``get_marginal_ll``) -- the *target quality*;
2. trains countvae for the same number of epochs and, every ``--eval-every`` epochs,
   estimates its held-out log p(x) (``get_log_predictive_density``, same importance
   samples, same cells). The evaluation runs between epochs, from its own seeded
   generator and with its time left out of the clock, so it does not change the fit;
3. reports countvae's *time to quality*: its training time (a validation pass every
   ``--check-every`` epochs included, as its early-stopping rule validates) at the first
   evaluation where its held-out log p(x) is at least SCVI's final one, against SCVI's
   whole training time; and the per-epoch time of both (mean after the first epochs);
4. replays countvae's early-stopping rule (``--rules``) on the validation losses of the
   same fit, online: the parameters of the best validation loss are kept in memory and
   their held-out log p(x) is estimated when the rule stops, so the rule's saving (time
   to its stop) and its cost (held-out log p(x) against the full run's) come from one fit.

Data sets ``--per-epoch-only`` (e.g. sim100k) get a few timed epochs of each tool and no
log p(x). Every (data set, tool) runs in its own process; tools alternate.

Both estimators are importance sampling from the encoder (the importance-weighted bound
with S samples), the same estimator on both sides; issue 13's more accurate estimator
(Newton-started t proposals) is not used here because the difference between the two
tools' fits, not the absolute log p(x), is measured, and the guide-proposal bound is the
one scvi-tools offers.

    python benchmarks/bench_time_to_quality.py                   # sim1k, sim10k (+ sim100k per epoch)
    python benchmarks/bench_time_to_quality.py --quick           # tiny data, a smoke run
"""

from __future__ import annotations

import argparse
import copy
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
    peak_rss_mb,
    run_worker,
    simulate_h5ad,
    write_section,
)

#: Early-stopping rules replayed online: (validate every k epochs, patience in epochs, relative delta).
DEFAULT_RULES = "2:10:0.001,2:5:0.001,1:20:0"
SIZES = {"sim1k": 1_000, "sim10k": 10_000, "sim100k": 100_000}


# ----- worker side --------------------------------------------------------------------------------
def _load_split(spec: dict):
    import anndata as ad

    import countvae as cv
    from countvae.data.split import split_indices

    if spec["dataset"] in ("kang2018", "pbmc_3tech"):
        adata = cv.data.load_dataset(spec["dataset"])
    else:
        adata = ad.read_h5ad(spec["path"])
    fit_idx, held_idx = split_indices(adata.n_obs, 0.9, seed=12345)
    # Both tools get the genes with a count among the fit cells (countvae refuses a gene without counts, SCVI
    # accepts it; a few of 2,000 simulated genes have none among 900 cells).
    totals = np.asarray(adata[fit_idx].X.sum(axis=0)).ravel()
    genes = np.flatnonzero(totals > 0)
    return adata[fit_idx][:, genes].copy(), adata[held_idx[: spec["lpd_cells"]]][:, genes].copy()


def _scvi_worker(spec: dict, train, held) -> dict:
    import logging

    import scvi
    from lightning.pytorch.callbacks import Callback

    for name in ("scvi", "lightning", "lightning.pytorch"):
        logging.getLogger(name).setLevel(logging.WARNING)
    scvi.settings.seed = 0
    scvi.model.SCVI.setup_anndata(train, batch_key="batch")
    model = scvi.model.SCVI(
        train, n_latent=10, n_hidden=128, n_layers=1, gene_likelihood="nb", dispersion="gene", encode_covariates=True
    )
    marks: list[float] = []

    class EpochTimer(Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            marks.append(time.perf_counter())

        def on_train_epoch_end(self, trainer, pl_module):
            marks.append(time.perf_counter())

    extra = {} if spec["epochs"] is None else {"max_epochs": spec["epochs"]}
    t0 = time.perf_counter()
    model.train(
        batch_size=128,
        train_size=0.9,
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        callbacks=[EpochTimer()],
        **extra,
    )
    seconds = time.perf_counter() - t0
    out = {"train_seconds": seconds, "epoch_seconds": [b - a for a, b in zip(marks[::2], marks[1::2], strict=False)]}
    out["epochs"] = len(out["epoch_seconds"])
    if spec["lpd"]:
        t0 = time.perf_counter()
        ll = model.get_marginal_ll(held, n_mc_samples=spec["lpd_samples"], return_mean=False)
        values = np.asarray(ll.detach().cpu().numpy() if hasattr(ll, "detach") else ll, dtype=float)
        out.update(lpd=float(values.mean()), lpd_seconds=time.perf_counter() - t0)
    return out


class _OnlineRule:
    """One early-stopping rule replayed on a running fit; keeps its best parameters in memory."""

    def __init__(self, every: int, patience: int, relative_delta: float):
        from countvae.model.training import ConvergenceRule

        self.every, self.patience, self.relative_delta = every, patience, relative_delta
        self.rule = ConvergenceRule(patience, relative_delta)
        self.best_state: dict | None = None
        self.result: dict | None = None

    def observe(self, epoch: int, loss: float, module, last_epoch: bool) -> bool:
        """Feed the validation loss of ``epoch``; True when the rule stops here (first time only)."""
        if self.result is not None or (epoch % self.every and not last_epoch):
            return False
        is_best, stop = self.rule.update(epoch, loss)
        if is_best:
            self.best_state = copy.deepcopy(module.state_dict())
        return stop or last_epoch


def _countvae_worker(spec: dict, train, held) -> dict:
    import countvae as cv
    from countvae.data.loader import CountSource
    from countvae.data.registry import batch_codes, get_count_matrix, get_registry
    from countvae.model import inference, training

    cv.CountVAE.setup_anndata(train, batch_key="batch")
    model = cv.CountVAE(train, n_latent=10, n_hidden=128, n_layers=1, likelihood="nb", decoder="mlp")
    registry = get_registry(train)  # the held-out cells under the training data's registry (genes, batches)
    held_source = CountSource(get_count_matrix(held, registry), batch_codes(held, registry))
    held_idx = np.arange(held.n_obs)
    rules = [_OnlineRule(*r) for r in spec["rules"]]
    n_epochs = spec["epochs"]
    rows: list[dict] = []
    checkpoints: list[dict] = []
    clock = {"val": 0.0, "evaluation": 0.0}

    def lpd_of(module) -> float:
        if not spec["lpd"]:
            return float("nan")
        t0 = time.perf_counter()
        frame = inference.log_predictive_density(module, held_source, held_idx, spec["lpd_samples"], seed=0)
        clock["evaluation"] += time.perf_counter() - t0
        return float(frame["lpd"].mean())

    original_evaluate, original_tqdm = training.evaluate_loss, training.tqdm

    def evaluate_timed(module, source, indices, batch_size, seed):
        t0 = time.perf_counter()
        value = original_evaluate(module, source, indices, batch_size, seed)
        clock["val"] = time.perf_counter() - t0
        clock["loss"] = value
        return value

    def epochs_observed(iterable):
        for item in iterable:
            clock["val"], clock["loss"] = 0.0, float("nan")
            t0 = time.perf_counter()
            yield item  # the loop trains epoch `item` (and validates it) before asking for the next
            elapsed = time.perf_counter() - t0
            epoch = item + 1
            rows.append({"epoch": epoch, "train_s": elapsed - clock["val"], "val_s": clock["val"]})
            rows[-1]["loss_validation"] = clock["loss"]
            for rule in rules:
                if rule.observe(epoch, clock["loss"], model.module, epoch == n_epochs):
                    live = copy.deepcopy(model.module)
                    live.load_state_dict(rule.best_state)
                    rule.result = {"stop_epoch": epoch, "kept_epoch": rule.rule.best_epoch, "lpd": lpd_of(live)}
            if spec["lpd"] and (epoch % spec["eval_every"] == 0 or epoch == n_epochs):
                checkpoints.append({"epoch": epoch, "lpd": lpd_of(model.module)})

    training.evaluate_loss = evaluate_timed
    training.tqdm = lambda iterable, *args, **kwargs: original_tqdm(epochs_observed(iterable), *args, **kwargs)
    t0 = time.perf_counter()
    try:
        model.train(max_epochs=n_epochs, batch_size=128, train_size=0.9, seed=0, progress_bar=False)
    finally:
        training.evaluate_loss, training.tqdm = original_evaluate, original_tqdm
    wall = time.perf_counter() - t0
    epochs_s = sum(r["train_s"] + r["val_s"] for r in rows)
    return {
        "setup_seconds": wall - epochs_s - clock["evaluation"],  # split, optimiser, restoring the kept epoch
        "rows": rows,
        "checkpoints": checkpoints,
        "rules": [
            {"every": r.every, "patience": r.patience, "relative_delta": r.relative_delta, **(r.result or {})}
            for r in rules
        ],
        "epochs": len(rows),
    }


def worker(spec: dict) -> dict:
    """Train one tool on one data set; return its timings and held-out log p(x)."""
    import torch

    torch.set_num_threads(spec["threads"])
    train, held = _load_split(spec)
    run = _scvi_worker if spec["tool"] == "scvi" else _countvae_worker
    out = run(spec, train, held)
    out.update(tool=spec["tool"], n_train=int(train.n_obs), n_genes=int(train.n_vars), n_heldout=int(held.n_obs))
    out.update(threads=torch.get_num_threads(), peak_rss_mb=peak_rss_mb())
    return out


# ----- driver side --------------------------------------------------------------------------------
def scvi_default_epochs(n_cells: int) -> int:
    """scvi-tools' default ``max_epochs`` for ``n_cells`` cells (before its own train/validation split)."""
    return int(min(round(20000 / n_cells * 400), 400))


def time_to_quality(cv_run: dict, target: float, check_every: int) -> tuple[float, int | None]:
    """countvae's training seconds to the first checkpoint whose log p(x) reaches ``target`` (NaN if none).

    Validation passes count at epochs that are multiples of ``check_every`` (as training with
    ``check_val_every_n_epoch=check_every`` would run them).
    """
    rows = pd.DataFrame(cv_run["rows"])
    validated = (rows["epoch"] % check_every == 0) | (rows["epoch"] == rows["epoch"].max())
    seconds = cv_run["setup_seconds"] + (rows["train_s"] + rows["val_s"] * validated).cumsum().to_numpy()
    for cp in cv_run["checkpoints"]:
        if cp["lpd"] >= target:
            return float(seconds[cp["epoch"] - 1]), int(cp["epoch"])
    return float("nan"), None


def _mean_epoch(seconds: list[float], warmup: int) -> float:
    return float(np.mean(seconds[warmup:] if len(seconds) > warmup else seconds))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="tiny simulated data: a smoke run")
    parser.add_argument("--datasets", default="sim1k,sim10k", help="comma list of " + ", ".join(SIZES))
    parser.add_argument("--per-epoch-only", default="sim100k", help="data sets timed for a few epochs, no log p(x)")
    parser.add_argument("--scvi-epochs", default="sim10k:60", help="caps DATASET:EPOCHS on SCVI's default epochs")
    parser.add_argument("--per-epoch-epochs", type=int, default=3)
    parser.add_argument("--eval-every", default="sim1k:20,sim10k:5", help="DATASET:EPOCHS between log p(x) checks")
    parser.add_argument("--check-every", type=int, default=2, help="validation every k epochs in the countvae clock")
    parser.add_argument("--rules", default=DEFAULT_RULES, help="early-stopping rules every:patience:delta")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lpd-samples", type=int, default=100)
    parser.add_argument("--lpd-cells", type=int, default=300)
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    parser.add_argument("--results", default=str(DEFAULT_RESULTS))
    parser.add_argument("--section", default="time-to-quality", help="section name in RESULTS.md")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return

    t_start = time.perf_counter()
    started = time.strftime("%Y-%m-%d %H:%M")
    rules = [(int(e), int(p), float(d)) for e, p, d in (r.split(":") for r in args.rules.split(","))]
    caps = {k: int(v) for k, v in (x.split(":") for x in args.scvi_epochs.split(",") if x)}
    eval_every = {k: int(v) for k, v in (x.split(":") for x in args.eval_every.split(",") if x)}
    data_dir = Path(args.data_dir)
    if args.quick:
        jobs = [("sim600", data_dir / "sim_quick_600x120.h5ad", 600, 120, False)]
        caps, eval_every = {"sim600": 12}, {"sim600": 3}
        args.lpd_samples, args.lpd_cells = 20, 50
    else:
        jobs = [(n, data_dir / f"sim_{SIZES[n]}x2000.h5ad", SIZES[n], 2000, False) for n in args.datasets.split(",")]
        jobs += [
            (n, data_dir / f"sim_{SIZES[n]}x2000.h5ad", SIZES[n], 2000, True)
            for n in args.per_epoch_only.split(",")
            if n
        ]
    loads, quality, speed, stopping = [load_average()], [], [], []
    for name, path, n_cells, n_genes, per_epoch_only in jobs:
        simulate_h5ad(path, n_cells, n_genes, seed=1 if args.quick else 0, chunk_cells=10_000)
        n_fit = int(round(0.9 * n_cells))
        default = scvi_default_epochs(n_fit)
        epochs = args.per_epoch_epochs if per_epoch_only else min(default, caps.get(name, default))
        base = {"dataset": name, "path": str(path), "threads": args.threads, "lpd": not per_epoch_only}
        base.update(lpd_samples=args.lpd_samples, lpd_cells=args.lpd_cells)
        scvi_spec = {**base, "tool": "scvi", "epochs": epochs if (per_epoch_only or epochs != default) else None}
        cv_spec = {**base, "tool": "countvae", "epochs": epochs, "rules": rules, "eval_every": eval_every.get(name, 5)}
        runs = {}
        for spec in (scvi_spec, cv_spec) if len(quality) % 2 == 0 else (cv_spec, scvi_spec):
            runs[spec["tool"]] = run_worker(Path(__file__), spec)
            loads.append(load_average())
            print(f"{name} {spec['tool']}: {runs[spec['tool']]['epochs']} epochs", flush=True)
        scvi_run, cv_run = runs["scvi"], runs["countvae"]
        warmup = 1 if epochs <= 5 else 2
        cv_epoch = _mean_epoch([r["train_s"] + r["val_s"] for r in cv_run["rows"]], warmup)
        cv_epoch_noval = _mean_epoch([r["train_s"] for r in cv_run["rows"]], warmup)
        scvi_epoch = _mean_epoch(scvi_run["epoch_seconds"], warmup)
        speed.append(
            {
                "data": name,
                "cells x genes (train)": f"{scvi_run['n_train']} x {scvi_run['n_genes']}",
                "epochs": epochs,
                "SCVI s/epoch": scvi_epoch,
                "countvae s/epoch (validation every epoch)": cv_epoch,
                "countvae s/epoch (no validation)": cv_epoch_noval,
                "ratio (every epoch)": cv_epoch / scvi_epoch,
                "ratio (no validation)": cv_epoch_noval / scvi_epoch,
                "peak RSS MiB SCVI / countvae": f"{scvi_run['peak_rss_mb']:.0f} / {cv_run['peak_rss_mb']:.0f}",
            }
        )
        if per_epoch_only:
            _write(args, started, t_start, loads, quality, speed, stopping)
            continue
        target = scvi_run["lpd"]
        seconds, epoch = time_to_quality(cv_run, target, args.check_every)
        final = cv_run["checkpoints"][-1]
        full_seconds = cv_run["setup_seconds"] + float(sum(r["train_s"] for r in cv_run["rows"]))
        quality.append(
            {
                "data": name,
                "held-out cells": cv_run["n_heldout"],
                "SCVI epochs": scvi_run["epochs"] if epochs == default else f"{scvi_run['epochs']} (default {default})",
                "SCVI train s": scvi_run["train_seconds"],
                "SCVI held-out LPD": target,
                "countvae LPD at the same epochs": final["lpd"],
                "countvae epochs to SCVI's LPD": "not reached" if epoch is None else epoch,
                "countvae s to SCVI's LPD": seconds,
                "time-to-quality ratio": seconds / scvi_run["train_seconds"],
                "countvae train s, all epochs": full_seconds,
            }
        )
        for rule in cv_run["rules"]:
            rows = pd.DataFrame(cv_run["rows"])
            stop = rule["stop_epoch"]
            validated = (rows["epoch"] % rule["every"] == 0) | (rows["epoch"] == len(rows))
            rule_s = cv_run["setup_seconds"] + float((rows["train_s"] + rows["val_s"] * validated).iloc[:stop].sum())
            stopping.append(
                {
                    "data": name,
                    "rule (every, patience, rel. delta)": (
                        f"{rule['every']}, {rule['patience']}, {rule['relative_delta']:g}"
                    ),
                    "stop / kept epoch": f"{stop} / {rule['kept_epoch']} of {len(rows)}",
                    "seconds (rule) / (all epochs, no validation)": f"{rule_s:.1f} / {full_seconds:.1f}",
                    "time share": rule_s / full_seconds,
                    "held-out LPD kept": rule["lpd"],
                    "LPD lost vs all epochs": final["lpd"] - rule["lpd"],
                }
            )
        trajectory = ", ".join(f"{c['epoch']}: {c['lpd']:.1f}" for c in cv_run["checkpoints"])
        print(f"{name}: SCVI {target:.2f}; countvae {trajectory}", flush=True)
        _write(args, started, t_start, loads, quality, speed, stopping)


def _write(args, started, t_start, loads, quality_rows, speed_rows, stopping_rows) -> None:
    """Write the section with the data sets done so far (a long run leaves its finished part behind)."""
    minutes = (time.perf_counter() - t_start) / 60
    every_text = args.eval_every.replace(":", ": ")
    quality, speed, stopping = (pd.DataFrame(r) for r in (quality_rows, speed_rows, stopping_rows))
    for frame in (quality, speed, stopping):
        print(frame.to_string(), flush=True)
    body = f"""## Time to SCVI's held-out fit, and time per epoch, at 1k-100k cells (`bench_time_to_quality.py`)

Command: `{command_line()}` ({started}{", QUICK smoke run" if args.quick else ""}; {minutes:.1f} min)

Machine: {machine_line(args.threads)}. Load average (1/5/15 min) at the start and after each fit: {"; ".join(loads)}.

Same architecture on both sides (n_latent 10, 1 x 128 hidden, NB with gene dispersion, batch one-hot in encoder
and decoder, batch 128, train_size 0.9, Adam lr 1e-3). Simulated NB counts (`simulate_h5ad`, seed 0), 10% of the
cells held out from both tools; held-out log p(x) per cell on {args.lpd_cells} of them (fewer where fewer are
held out), {args.lpd_samples} importance samples from the encoder (SCVI `get_marginal_ll`, countvae
`get_log_predictive_density`).

### Time to SCVI's quality

SCVI at its default settings (default epochs and 400-epoch KL warm-up; where capped for time, its quality after
the capped epochs is the target). countvae (no KL warm-up) trained for the same epochs; its held-out log p(x) is
checked every {every_text} epochs (time to quality is resolved to that grid, so it is an upper bound); its clock
counts a validation pass every {args.check_every} epochs and the set-up inside `train` (split, optimiser) and
excludes the log p(x) checks; SCVI's is the wall time of `SCVI.train` (set-up included), without validation.

{markdown_table(quality)}

### Time per epoch (the same fits; {args.per_epoch_only or "none"}: {args.per_epoch_epochs} epochs of each, timing only)

Mean over epochs after the first (two, or one for short runs). countvae's default validates every epoch; the
early-stopping rule in `diagnose` validates less often, so both are shown.

{markdown_table(speed)}

### Early stopping on the same countvae fits

Each rule replayed on the fit's validation losses as training ran; the parameters of its best validation loss
were kept and their held-out log p(x) estimated. LPD lost: full-run held-out log p(x) minus the kept one
(positive = the rule loses fit; negative = stopping early fit the held-out cells better).

{markdown_table(stopping)}

Not measured here: GPU (no GPU on this machine; `bench_gpu.py` runs where one is lent); time to quality on
100k cells (SCVI's default 89 epochs at 13 s each, about 20 min on 2 quiet cores, section training-sim100k).
"""
    write_section(Path(args.results), f"{args.section}-quick" if args.quick else args.section, body)


if __name__ == "__main__":
    main()
