"""Time to a given quality against scvi-tools: how long countvae takes to fit as well as SCVI does.

Per-epoch speed is what a benchmark usually reports; what an analyst waits for is a fit
that is good enough. For each data set (real: pbmc_3tech, kang2018; simulated: sim1k,
sim10k, sim100k) this script, in one run and on the same cells:

1. trains scvi-tools' SCVI at its default training settings (``SCVI.train()`` without
   arguments other than the batch size and split: its default number of epochs,
   ``min(round(20000 / n * 400), 400)``, and its 400-epoch KL warm-up), unless
   ``--scvi-epochs`` caps the epochs for time (the section says so); times every epoch;
   then estimates its held-out log p(x | observed library size) with countvae's accurate
   estimator on the scvi module's own log joint (``SCVIFit.log_predictive_density``) --
   the *target quality* -- and, for reference, scvi-tools' ``get_marginal_ll``;
2. trains countvae and, every ``--eval-every`` epochs, estimates its held-out log p(x)
   with the package default (``inference.log_predictive_density``, what
   ``get_log_predictive_density`` calls; same cells, same number of final draws). The
   evaluation runs between epochs, from its own seeded generator and with its time left
   out of the clock, so it does not change the fit. With ``--stop-at-target`` SCVI runs
   first and countvae stops at the first check that reaches SCVI's figure (or gives up:
   past ``--give-up-ratio`` times SCVI's training time, or ``--give-up-checks`` checks in
   a row below its own best); otherwise it trains for SCVI's epochs (tools alternating);
3. reports countvae's *time to quality*: its clock (training, a validation pass every
   ``--check-every`` epochs as its early-stopping rule validates, and the set-up inside
   ``train``) at the first check where its held-out log p(x) is at least SCVI's, against
   SCVI's whole training time. Resolved to the check grid, so an upper bound. Also the
   per-epoch time of both (mean after the first epochs);
4. without ``--stop-at-target``, replays countvae's early-stopping rules (``--rules``) on
   the validation losses of the same fit, online: the parameters of the best validation
   loss are kept in memory and their held-out log p(x) is estimated when the rule stops.

Data sets ``--per-epoch-only`` get a few timed epochs of each tool and no log p(x). Every
(data set, tool) runs in its own process; the section of RESULTS.md is rewritten after
each data set, so a long run that is stopped leaves its finished data sets behind.

    python benchmarks/bench_time_to_quality.py --stop-at-target    # pbmc_3tech, kang2018, sim100k
    python benchmarks/bench_time_to_quality.py --quick             # tiny data, a smoke run

countvae trains every epoch at 1e-3 (``early_stopping=False``, the stopping rules being replayed on that fit in
step 4) and at the package defaults otherwise, except ``--countvae-kl-warmup EPOCHS``,
``--countvae-adam-eps EPS`` and ``--countvae-weight-decay DECAY`` (its ``train`` arguments
``kl_warmup_epochs``, ``adam_eps``, ``weight_decay``; by default the package's own values),
applied to every data set of the run and named in the section.
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
#: Real data sets (read by ``countvae.data.load_dataset`` from the shared data folder).
REAL = ("pbmc_3tech", "kang2018")


# ----- worker side --------------------------------------------------------------------------------
def _load_split(spec: dict):
    import anndata as ad

    import countvae as cv
    from countvae.data.split import split_indices

    if spec["dataset"] in REAL:
        adata = cv.data.load_dataset(spec["dataset"])
        adata = adata[np.asarray(adata.X.sum(axis=1)).ravel() > 0].copy()  # countvae refuses an empty cell
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
        import warnings

        from countvae.diagnostics import SCVIFit
        from countvae.errors import UnreliableEstimateWarning

        fit = SCVIFit(model, seed=0)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnreliableEstimateWarning)  # the share of unreliable cells is reported
            frame = fit.log_predictive_density(held, n_samples=spec["lpd_draws"], seed=0)
        out.update(lpd=float(frame["lpd"].mean()), lpd_seconds=time.perf_counter() - t0)
        out.update(lpd_unreliable=float(1.0 - frame["reliable"].mean()), lpd_quantity=fit.lpd_quantity)
        if spec["marginal_ll_samples"]:
            t0 = time.perf_counter()
            ll = model.get_marginal_ll(fit._prepared(held), n_mc_samples=spec["marginal_ll_samples"], return_mean=False)
            values = np.asarray(ll.detach().cpu().numpy() if hasattr(ll, "detach") else ll, dtype=float)
            out.update(marginal_ll=float(values.mean()), marginal_ll_seconds=time.perf_counter() - t0)
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
    import warnings

    import countvae as cv
    from countvae.data.loader import CountSource
    from countvae.data.registry import batch_codes, get_count_matrix, get_registry
    from countvae.errors import UnreliableEstimateWarning
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
    clock = {"val": 0.0, "evaluation": 0.0, "unreliable": float("nan")}

    def lpd_of(module) -> float:
        if not spec["lpd"]:
            return float("nan")
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnreliableEstimateWarning)
            frame = inference.log_predictive_density(module, held_source, held_idx, spec["lpd_draws"], seed=0)
        clock["evaluation"] += time.perf_counter() - t0
        clock["unreliable"] = float(1.0 - frame["reliable"].mean())
        return float(frame["lpd"].mean())

    original_evaluate, original_tqdm = training.evaluate_loss, training.tqdm

    def evaluate_timed(*args, **kwargs):
        t0 = time.perf_counter()
        value = original_evaluate(*args, **kwargs)
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
                lpd = lpd_of(model.module)
                checkpoints.append({"epoch": epoch, "lpd": lpd, "unreliable": clock["unreliable"]})
                if target is not None and lpd >= target:
                    return  # SCVI's quality reached: the training loop ends as after its last epoch
                best = max(c["lpd"] for c in checkpoints)
                if target is not None and all(c["lpd"] < best for c in checkpoints[-spec["give_up_checks"] :]):
                    return  # the held-out fit has stopped improving below SCVI's: the target is not met
            if target is not None and time.perf_counter() - t_train - clock["evaluation"] > give_up_seconds:
                if not checkpoints or checkpoints[-1]["epoch"] != epoch:
                    checkpoints.append({"epoch": epoch, "lpd": lpd_of(model.module), "unreliable": clock["unreliable"]})
                return  # past the give-up bound on SCVI's time: the target is not met (the last check says so)

    target, give_up_seconds = spec.get("target"), spec.get("give_up_seconds", float("inf"))
    training.evaluate_loss = evaluate_timed
    training.tqdm = lambda iterable, *args, **kwargs: original_tqdm(epochs_observed(iterable), *args, **kwargs)
    t_train = time.perf_counter()
    try:
        model.train(
            early_stopping=False,
            max_epochs=n_epochs,
            batch_size=128,
            train_size=0.9,
            seed=0,
            progress_bar=False,
            kl_warmup_epochs=spec.get("kl_warmup_epochs", 0),
            weight_decay=spec.get("weight_decay", 0.0),
            adam_eps=spec.get("adam_eps", 1e-8),
        )
    finally:
        training.evaluate_loss, training.tqdm = original_evaluate, original_tqdm
    wall = time.perf_counter() - t_train
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
        "evaluation_seconds": clock["evaluation"],
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


def _jobs(args, data_dir: Path) -> list[tuple[str, Path | None, bool]]:
    """(name, simulated file or None for real data, per-epoch-only) for each data set asked for."""
    if args.quick:
        return [("sim600", data_dir / "sim_quick_600x120.h5ad", False)]
    known = (*REAL, *SIZES)
    per_epoch = [n for n in args.per_epoch_only.split(",") if n]
    for name in [*args.datasets.split(","), *per_epoch]:
        if name not in known:
            raise SystemExit(f"Unknown data set {name!r}; choose from {', '.join(known)}.")
    jobs = [(n, None if n in REAL else data_dir / f"sim_{SIZES[n]}x2000.h5ad", False) for n in args.datasets.split(",")]
    return jobs + [(n, None if n in REAL else data_dir / f"sim_{SIZES[n]}x2000.h5ad", True) for n in per_epoch]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="tiny simulated data: a smoke run")
    parser.add_argument(
        "--datasets", default="pbmc_3tech,kang2018,sim100k", help="comma list of " + ", ".join((*REAL, *SIZES))
    )
    parser.add_argument("--per-epoch-only", default="", help="data sets timed for a few epochs, no log p(x)")
    parser.add_argument("--scvi-epochs", default="", help="caps DATASET:EPOCHS on SCVI's default epochs")
    parser.add_argument("--per-epoch-epochs", type=int, default=3)
    parser.add_argument(
        "--eval-every",
        default="pbmc_3tech:20,kang2018:20,sim1k:20,sim10k:5,sim100k:5",
        help="DATASET:EPOCHS between countvae's log p(x) checks (default 5 for others)",
    )
    parser.add_argument("--check-every", type=int, default=2, help="validation every k epochs in the countvae clock")
    parser.add_argument(
        "--stop-at-target",
        action="store_true",
        help="SCVI first; countvae stops at the first check where its held-out log p(x) reaches SCVI's",
    )
    parser.add_argument(
        "--give-up-ratio",
        type=float,
        default=1.0,
        help="with --stop-at-target: countvae stops unreached once its clock passes this multiple of SCVI's time",
    )
    parser.add_argument(
        "--give-up-checks",
        type=int,
        default=3,
        help="with --stop-at-target: countvae stops unreached after this many checks below its best log p(x)",
    )
    parser.add_argument(
        "--countvae-kl-warmup",
        type=int,
        default=0,
        metavar="EPOCHS",
        help="countvae's kl_warmup_epochs on every data set of the run (default 0: countvae's own default, none)",
    )
    parser.add_argument(
        "--countvae-adam-eps",
        type=float,
        default=1e-8,
        metavar="EPS",
        help="countvae's adam_eps on every data set of the run (default 1e-8, the package's; SCVI's plan uses 0.01)",
    )
    parser.add_argument(
        "--countvae-weight-decay",
        type=float,
        default=0.0,
        metavar="DECAY",
        help="countvae's weight_decay on every data set of the run (default 0, the package's; SCVI's plan uses 1e-6)",
    )
    parser.add_argument("--rules", default=DEFAULT_RULES, help="early-stopping rules every:patience:delta")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lpd-draws", type=int, default=800, help="final draws per cell of the log p(x) estimator")
    parser.add_argument(
        "--marginal-ll-samples", type=int, default=100, help="SCVI get_marginal_ll samples (0: not computed)"
    )
    parser.add_argument("--lpd-cells", type=int, default=200)
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    parser.add_argument("--results", default=str(DEFAULT_RESULTS))
    parser.add_argument("--section", default="time-to-quality", help="section name in RESULTS.md")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return

    t_start = time.perf_counter()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rules = (
        []
        if args.stop_at_target or not args.rules
        else [(int(e), int(p), float(d)) for e, p, d in (r.split(":") for r in args.rules.split(","))]
    )
    caps = {k: int(v) for k, v in (x.split(":") for x in args.scvi_epochs.split(",") if x)}
    eval_every = {k: int(v) for k, v in (x.split(":") for x in args.eval_every.split(",") if x)}
    data_dir = Path(args.data_dir)
    if args.quick:
        caps, eval_every = {"sim600": 12}, {"sim600": 3}
        args.lpd_draws, args.lpd_cells, args.marginal_ll_samples = 50, 30, 20
    loads, quality, speed, stopping, trajectories = [load_average()], [], [], [], []
    for name, path, per_epoch_only in _jobs(args, data_dir):
        if path is not None:
            n_cells = 600 if args.quick else SIZES[name]
            simulate_h5ad(path, n_cells, 120 if args.quick else 2000, seed=1 if args.quick else 0, chunk_cells=10_000)
        base = {"dataset": name, "path": None if path is None else str(path), "threads": args.threads}
        base.update(lpd=not per_epoch_only, lpd_draws=args.lpd_draws, lpd_cells=args.lpd_cells)
        base.update(marginal_ll_samples=args.marginal_ll_samples)
        cv_extra = {"kl_warmup_epochs": args.countvae_kl_warmup, "adam_eps": args.countvae_adam_eps}
        cv_extra["weight_decay"] = args.countvae_weight_decay
        cap = args.per_epoch_epochs if per_epoch_only else caps.get(name)
        scvi_spec = {**base, "tool": "scvi", "epochs": cap}
        runs = {}
        if args.stop_at_target and not per_epoch_only:
            runs["scvi"] = run_worker(Path(__file__), scvi_spec)
            loads.append(load_average())
            print(f"{name} scvi: {runs['scvi']['epochs']} epochs, LPD {runs['scvi']['lpd']:.2f}", flush=True)
            cv_spec = {**base, **cv_extra, "tool": "countvae", "rules": rules, "eval_every": eval_every.get(name, 5)}
            # Room for countvae to run longer than SCVI in epochs; the give-up bound ends it in time.
            cv_spec.update(epochs=4 * runs["scvi"]["epochs"], target=runs["scvi"]["lpd"])
            cv_spec["give_up_seconds"] = args.give_up_ratio * runs["scvi"]["train_seconds"]
            cv_spec["give_up_checks"] = args.give_up_checks
            order = [cv_spec]
        else:
            cv_spec = {**base, **cv_extra, "tool": "countvae", "rules": rules, "eval_every": eval_every.get(name, 5)}
            order = [scvi_spec, cv_spec] if len(quality) % 2 == 0 else [cv_spec, scvi_spec]
        for spec in order:
            if spec["tool"] == "countvae" and spec.get("epochs") is None:
                spec["epochs"] = runs["scvi"]["epochs"] if "scvi" in runs else _countvae_epochs(spec, cap)
            runs[spec["tool"]] = run_worker(Path(__file__), spec)
            loads.append(load_average())
            print(f"{name} {spec['tool']}: {runs[spec['tool']]['epochs']} epochs", flush=True)
        scvi_run, cv_run = runs["scvi"], runs["countvae"]
        default = scvi_default_epochs(scvi_run["n_train"])
        speed.append(_speed_row(name, scvi_run, cv_run))
        if not per_epoch_only:
            quality.append(_quality_row(name, scvi_run, cv_run, default, args))
            trajectories.append(_trajectory_line(name, scvi_run, cv_run))
            stopping += _stopping_rows(name, cv_run)
            trajectory = ", ".join(f"{c['epoch']}: {c['lpd']:.2f}" for c in cv_run["checkpoints"])
            print(f"{name}: SCVI {scvi_run['lpd']:.2f}; countvae {trajectory}", flush=True)
        _write(args, started, t_start, loads, (quality, trajectories), speed, stopping)


def _countvae_epochs(spec: dict, cap: int | None) -> int:
    """countvae's epochs when it runs before SCVI: SCVI's cap, else its default for the fit cells."""
    if cap is not None:
        return cap
    train, _ = _load_split({**spec, "lpd_cells": 0})
    return scvi_default_epochs(train.n_obs)


def _speed_row(name: str, scvi_run: dict, cv_run: dict) -> dict:
    epochs = min(scvi_run["epochs"], cv_run["epochs"])
    warmup = 1 if epochs <= 5 else 2
    cv_epoch = _mean_epoch([r["train_s"] + r["val_s"] for r in cv_run["rows"]], warmup)
    cv_epoch_noval = _mean_epoch([r["train_s"] for r in cv_run["rows"]], warmup)
    scvi_epoch = _mean_epoch(scvi_run["epoch_seconds"], warmup)
    return {
        "data": name,
        "cells x genes (train)": f"{scvi_run['n_train']} x {scvi_run['n_genes']}",
        "epochs SCVI / countvae": f"{scvi_run['epochs']} / {cv_run['epochs']}",
        "SCVI s/epoch": scvi_epoch,
        "countvae s/epoch (validation every epoch)": cv_epoch,
        "countvae s/epoch (no validation)": cv_epoch_noval,
        "ratio (every epoch)": cv_epoch / scvi_epoch,
        "ratio (no validation)": cv_epoch_noval / scvi_epoch,
        "peak RSS MiB SCVI / countvae": f"{scvi_run['peak_rss_mb']:.0f} / {cv_run['peak_rss_mb']:.0f}",
    }


def _quality_row(name: str, scvi_run: dict, cv_run: dict, default: int, args) -> dict:
    target = scvi_run["lpd"]
    seconds, epoch = time_to_quality(cv_run, target, args.check_every)
    final = cv_run["checkpoints"][-1]
    clock = cv_run["setup_seconds"] + float(sum(r["train_s"] for r in cv_run["rows"]))
    scvi_epochs = scvi_run["epochs"]
    ratio = seconds / scvi_run["train_seconds"]
    return {
        "data": name,
        "held-out cells": cv_run["n_heldout"],
        "SCVI epochs": scvi_epochs if scvi_epochs == default else f"{scvi_epochs} (default {default})",
        "SCVI train s": scvi_run["train_seconds"],
        "SCVI held-out LPD (countvae estimator)": target,
        "SCVI unreliable cells": scvi_run["lpd_unreliable"],
        "SCVI get_marginal_ll": scvi_run.get("marginal_ll", float("nan")),
        "countvae epochs run": cv_run["epochs"],
        "countvae LPD at its last check": final["lpd"],
        "countvae best LPD (epoch)": "{lpd:.1f} ({epoch})".format(**max(cv_run["checkpoints"], key=lambda c: c["lpd"])),
        "countvae unreliable cells (last check)": final["unreliable"],
        "countvae epochs to SCVI's LPD": "not reached" if epoch is None else epoch,
        "countvae s to SCVI's LPD (upper bound)": seconds,
        "time-to-quality ratio": ratio,
        "<= 0.5x": "yes" if ratio <= 0.5 else "no",
        "countvae clock, epochs run": clock,
        "LPD s SCVI / countvae (all checks)": f"{scvi_run['lpd_seconds']:.0f} / {cv_run['evaluation_seconds']:.0f}",
    }


def _trajectory_line(name: str, scvi_run: dict, cv_run: dict) -> str:
    """One list item: countvae's held-out log p(x) at each check, against SCVI's."""
    checks = ", ".join(f"{c['epoch']}: {c['lpd']:.2f}" for c in cv_run["checkpoints"])
    return f"- {name}, SCVI {scvi_run['lpd']:.2f} after {scvi_run['epochs']} epochs; countvae {checks}"


def _stopping_rows(name: str, cv_run: dict) -> list[dict]:
    rows = pd.DataFrame(cv_run["rows"])
    full_seconds = cv_run["setup_seconds"] + float(rows["train_s"].sum())
    final = cv_run["checkpoints"][-1]
    out = []
    for rule in cv_run["rules"]:
        stop = rule["stop_epoch"]
        validated = (rows["epoch"] % rule["every"] == 0) | (rows["epoch"] == len(rows))
        rule_s = cv_run["setup_seconds"] + float((rows["train_s"] + rows["val_s"] * validated).iloc[:stop].sum())
        out.append(
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
    return out


def _write(args, started, t_start, loads, quality_done, speed_rows, stopping_rows) -> None:
    """Write the section with the data sets done so far (a long run leaves its finished part behind).

    ``quality_done`` is (quality rows, trajectory lines), one of each per data set with a log p(x).
    """
    quality_rows, trajectories = quality_done
    minutes = (time.perf_counter() - t_start) / 60
    every_text = args.eval_every.replace(":", ": ").replace(",", ", ")
    quality, speed, stopping = (pd.DataFrame(r) for r in (quality_rows, speed_rows, stopping_rows))
    for frame in (quality, speed, stopping):
        print(frame.to_string(), flush=True)
    mode = (
        f"countvae stopped at the first check where its held-out log p(x) reached SCVI's, or unreached once its "
        f"clock passed {args.give_up_ratio:g}x SCVI's training time or its log p(x) stayed below its best for "
        f"{args.give_up_checks} checks in a row (SCVI ran first)"
        if args.stop_at_target
        else "countvae trained for SCVI's epochs (tools alternating)"
    )
    stopping_text = (
        "Not run in this mode (--stop-at-target: the fits end at SCVI's quality)."
        if stopping.empty
        else markdown_table(stopping)
    )
    settings_text = (
        f"`train(kl_warmup_epochs={args.countvae_kl_warmup}, adam_eps={args.countvae_adam_eps:g}, "
        f"weight_decay={args.countvae_weight_decay:g})` (`--countvae-kl-warmup`, `--countvae-adam-eps`, "
        "`--countvae-weight-decay`; the package defaults are 0, 1e-8 and 0: no KL warm-up, torch's Adam epsilon, "
        "no weight decay; SCVI's training plan uses 400, 0.01 and 1e-6)"
    )
    per_epoch_text = (
        f"; {args.per_epoch_only}: {args.per_epoch_epochs} epochs of each, timing only" if args.per_epoch_only else ""
    )
    body = f"""## Time to SCVI's held-out fit, and time per epoch (`bench_time_to_quality.py`)

Command: `{command_line()}` (started {started}{", QUICK smoke run" if args.quick else ""}; {minutes:.1f} min so
far, data sets written as each finished)

Machine: {machine_line(args.threads)}. Load average (1/5/15 min) at the start and after each fit: {"; ".join(loads)}.

Same architecture on both sides (n_latent 10, 1 x 128 hidden, NB with gene dispersion, batch one-hot in encoder
and decoder, batch 128, train_size 0.9, Adam lr 1e-3). Real data (pbmc_3tech, kang2018) from
`countvae.data.load_dataset` (cells without counts dropped), simulated NB counts from `simulate_h5ad` (seed 0);
10% of the cells held out from both tools (split seed 12345), genes with a count among the fit cells. Held-out
log p(x | observed library size) per cell, mean over {args.lpd_cells} held-out cells (fewer where fewer are
held out), by countvae's accurate estimator (`estimate_log_marginal`: Newton modes, Student-t/guide mixture,
{args.lpd_draws} final draws, second pass for k-hat > 0.7) on both sides: for countvae
`inference.log_predictive_density` (the package default of `get_log_predictive_density`), for SCVI
`SCVIFit.log_predictive_density` (the same estimator on the scvi module's own log joint, float64). SCVI's own
`get_marginal_ll` ({args.marginal_ll_samples} guide samples, a lower bound that can be far too low) is shown
alongside for reference only; the target is the accurate-estimator figure.

### Time to SCVI's quality

SCVI at its default training settings (`SCVI.train()`: default epochs `min(round(20000 / n * 400), 400)` and
400-epoch KL warm-up, no cap unless the SCVI epochs column says so); its time is the wall time of `SCVI.train`
(set-up included, no validation). Mode: {mode}. countvae: {settings_text}. Its held-out
log p(x) is checked every {every_text} epochs (others 5): the time to quality is resolved to that grid, so it is
an upper bound. Its clock counts training, a validation pass every {args.check_every} epochs and the set-up inside
`train` (split, optimiser), and excludes the log p(x) checks. Target: time-to-quality ratio <= 0.5.

{markdown_table(quality) if not quality.empty else "No data set finished yet."}

countvae's held-out log p(x) at each check (epoch: nats/cell), against SCVI's:

{chr(10).join(trajectories) if trajectories else "No data set finished yet."}

### Time per epoch (the same fits{per_epoch_text})

Mean over epochs after the first two (one for short runs). countvae's default validates every epoch; the
early-stopping rule in `diagnose` validates less often, so both are shown.

{markdown_table(speed) if not speed.empty else "No data set finished yet."}

### Early stopping on the same countvae fits

Each rule replayed on the fit's validation losses as training ran; the parameters of its best validation loss
were kept and their held-out log p(x) estimated. LPD lost: full-run held-out log p(x) minus the kept one
(positive = the rule loses fit; negative = stopping early fit the held-out cells better).

{stopping_text}

Not measured here: GPU (no GPU on this machine; `bench_gpu.py` runs where one is lent).
"""
    write_section(Path(args.results), f"{args.section}-quick" if args.quick else args.section, body)


if __name__ == "__main__":
    main()
