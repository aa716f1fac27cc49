"""Convergence-based stopping for ``countvae diagnose``: which rule, and what it costs in held-out fit.

``countvae diagnose`` used to train every seed for a fixed number of cell passes
(600,000: 77 epochs on Kang, 333 on pbmc_3tech). This script measures what stopping
on a held-back validation ELBO saves, and what it loses, on real data.

Phase 1 (trajectories): for each data set and seed, one fit exactly as ``diagnose``
makes it (``fit_seeds`` split: 10% of the cells held out with split seed 0; the fit
cells split 90/10 into training and validation by the fit's seed), trained for the
old default number of epochs. After every epoch it records the validation loss (the
stopping signal), the ELBO of the held-out cells (the quality, never used for
stopping; one reparameterized draw per cell with fixed noise, common to all epochs),
and the seconds spent training, validating and evaluating. Validation and held-out
evaluation draw their noise from a separate, fixed generator, so they do not change
the fit: the trajectory of one long fit is the trajectory of every stopped fit.

Phase 2 (rules): each stopping rule is replayed on the recorded validation losses:
validate every ``k`` epochs; an improvement counts when the validation loss falls
below the reference by more than ``relative_delta`` times the reference's magnitude;
stop when ``patience`` epochs have passed since the last improvement that counted;
keep the parameters of the best validation loss seen. A rule's cost is the training
time up to its stop plus its validation passes; its loss is the held-out ELBO of the
kept epoch against the held-out ELBO of the old default (the last epoch).

Phase 3 (verification): the chosen rule is run through ``CountVAE.train`` itself
and its stop epoch and held-out ELBO are compared with the replay.

    python benchmarks/bench_stopping.py                      # Kang and pbmc_3tech, seeds 0-2 (~45 min)
    python benchmarks/bench_stopping.py --reuse              # phases 2-3 on the stored trajectories
    python benchmarks/bench_stopping.py --quick              # small simulated data, a smoke run

Versus the full schedule (``--versus-full``): the shared stopping rule
(:data:`countvae.model.training.DEFAULT_STOPPING`) against ``train()``'s full 400-epoch
schedule, per seed, on the embedded data of ``countvae diagnose``, pbmc_3tech and Kang
(genes as ``diagnose`` keeps them: the 2,000 most variable when there are more). Each
pair of fits is compared by held-out log p(x) per cell with the package's accurate
estimator (``get_log_predictive_density``, paired on the same held-out cells); the
warm-up time estimate printed by ``countvae diagnose`` is recorded beside the actual
time of the stopped fit (``--section stopping-vs-full``). The rules of ``VERSUS_FULL_REPLAYS`` (some judging the
mean of the last few validation losses) are then replayed on the full fits' validation curves, each kept epoch judged
by the validation loss averaged around it.

    python benchmarks/bench_stopping.py --versus-full        # 3 data sets x 2 seeds (~30 min on 2 quiet cores)
"""

from __future__ import annotations

import argparse
import itertools
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
    run_worker,
    write_section,
)

#: The rules replayed in phase 2: validate every k epochs, patience (epochs), relative min delta.
CHECK_EVERY = (1, 2, 5)
PATIENCE = (5, 10, 15, 20, 30)
RELATIVE_DELTA = (0.0, 1e-4, 3e-4, 1e-3)
#: Rules replayed in ``--versus-full`` on the full fits' validation curves (learning rate 1e-3 throughout): (every,
#: patience, relative delta, window); window > 1 judges the mean of the last ``window`` validation losses. The first is
#: the former shared rule (before its learning-rate cut), the alternative of ``--versus-full`` by default.
VERSUS_FULL_REPLAYS = (
    (2, 10, 1e-3, 1),
    (2, 20, 1e-4, 1),
    (2, 10, 1e-3, 5),
    (2, 20, 1e-3, 5),
    (2, 20, 5e-4, 5),
    (2, 30, 0.0, 5),
)
#: Half-width (epochs) of the window of validation losses averaged to judge a replayed rule's kept epoch.
SMOOTHING_HALF_WIDTH = 10
#: Genes kept: detected in at least this many cells of the whole data set.
MIN_CELLS = 10


# ----- worker side --------------------------------------------------------------------------------
def _data(spec: dict):
    import countvae as cv

    if spec["dataset"] == "quick":
        adata = cv.data.simulate(n_cells=600, n_genes=150, n_latent=3, n_batches=2, seed=0)
    else:
        adata = cv.data.load_dataset(spec["dataset"])
        # genes detected in at least MIN_CELLS cells (pbmc_3tech ships genes seen in 2 cells, some of which
        # only the held-out cells have; a model cannot fit a gene without counts)
        detected = np.asarray((adata.X > 0).sum(axis=0)).ravel()
        adata = adata[:, detected >= MIN_CELLS].copy()
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    return adata


def _split(adata):
    from countvae.diagnostics.fitting.heldout import cells_at, heldout_split

    fit_idx, held_idx = heldout_split(adata.n_obs, 0.1, 0)
    return cells_at(adata, fit_idx), cells_at(adata, held_idx)


def trajectory_worker(spec: dict) -> dict:
    """Phase 1: train one seed for ``spec['epochs']`` epochs, recording every epoch."""
    import torch

    import countvae as cv
    from countvae.data.loader import CountSource
    from countvae.data.registry import batch_codes, get_count_matrix, get_registry
    from countvae.model import training

    torch.set_num_threads(spec["threads"])
    fit, held = _split(_data(spec))
    held_source = CountSource(get_count_matrix(held, get_registry(held)), batch_codes(held, get_registry(held)))
    held_idx = np.arange(held.n_obs)
    model = cv.CountVAE(fit, n_latent=10, n_hidden=128, n_layers=1, likelihood="nb", decoder="mlp")
    rows: list[dict] = []
    original = training.evaluate_loss
    clock = {"last": 0.0}

    def evaluate_and_record(module, source, indices, batch_size, seed, *rest):
        # *rest: what train_module passes beyond these (the number of training cells), passed on unchanged
        t_train_end = time.perf_counter()
        value = original(module, source, indices, batch_size, seed, *rest)
        t_validated = time.perf_counter()
        heldout_loss = original(module, held_source, held_idx, 512, 12345, *rest)
        t_done = time.perf_counter()
        rows.append(
            {
                "epoch": len(rows) + 1,
                "train_seconds": t_train_end - clock["last"],
                "validation_seconds": t_validated - t_train_end,
                "loss_validation": value,
                "heldout_elbo": -heldout_loss,
            }
        )
        clock["last"] = t_done
        return value

    training.evaluate_loss = evaluate_and_record
    try:
        clock["last"] = time.perf_counter()
        model.train(early_stopping=False, max_epochs=spec["epochs"], seed=spec["seed"], progress_bar=False)
    finally:
        training.evaluate_loss = original
    return {**spec, "n_fit": int(fit.n_obs), "n_heldout": int(held.n_obs), "n_genes": int(fit.n_vars), "rows": rows}


def verify_worker(spec: dict) -> dict:
    """Phase 3: the chosen rule through ``CountVAE.train``; held-out ELBO of the kept parameters."""
    import torch

    import countvae as cv
    from countvae.data.loader import CountSource
    from countvae.data.registry import batch_codes, get_count_matrix, get_registry
    from countvae.model.training import evaluate_loss

    torch.set_num_threads(spec["threads"])
    fit, held = _split(_data(spec))
    model = cv.CountVAE(fit, n_latent=10, n_hidden=128, n_layers=1, likelihood="nb", decoder="mlp")
    t0 = time.perf_counter()
    model.train(max_epochs=spec["epochs"], seed=spec["seed"], progress_bar=False, **spec["rule"])
    seconds = time.perf_counter() - t0
    source = CountSource(get_count_matrix(held, get_registry(held)), batch_codes(held, get_registry(held)))
    heldout = -evaluate_loss(model.module, source, np.arange(held.n_obs), 512, 12345)
    summary = model.training_summary
    return {**spec, "seconds": seconds, "heldout_elbo": heldout, **summary}


def _diagnose_data(spec: dict):
    """The cells and genes ``countvae diagnose`` would fit: embedded simulation, or a real set, top genes kept."""
    import countvae as cv
    from countvae.cli.diagnose import EMBEDDED_N_LATENT, default_data
    from countvae.data.gene_selection import choose_genes
    from countvae.diagnostics.diagnosis import DIAGNOSE_N_LATENT, DIAGNOSE_N_TOP_GENES

    if spec["dataset"] == "embedded":
        adata, n_latent = default_data(), EMBEDDED_N_LATENT
    elif spec["dataset"] == "quick":
        adata, n_latent = cv.data.simulate(n_cells=600, n_genes=150, n_latent=3, n_batches=2, seed=0), 3
    else:
        adata, n_latent = cv.data.load_dataset(spec["dataset"]), DIAGNOSE_N_LATENT
        if spec.get("n_cells") and spec["n_cells"] < adata.n_obs:
            keep = np.sort(np.random.default_rng(0).choice(adata.n_obs, spec["n_cells"], replace=False))
            adata = adata[keep].copy()
    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    return choose_genes(adata, None, DIAGNOSE_N_TOP_GENES, n_latent).adata, n_latent


def versus_full_worker(spec: dict) -> dict:
    """One seed: the shared stopping rule and the full schedule, with held-out log p(x) of both."""
    import warnings

    import torch

    import countvae as cv
    from countvae.errors import UnreliableEstimateWarning
    from countvae.model.training import DEFAULT_STOPPING, StoppingRule
    from countvae.model.warmup import estimate_training_time

    torch.set_num_threads(spec["threads"])
    adata, n_latent = _diagnose_data(spec)
    fit, held = _split(adata)
    held = held[: spec["lpd_cells"]].copy()
    model_kwargs = {"n_latent": n_latent}
    stopping = DEFAULT_STOPPING.train_kwargs()
    warmup = estimate_training_time(fit, model_kwargs, {"max_epochs": spec["epochs"], **stopping})
    out = {
        **spec,
        "n_fit": int(fit.n_obs),
        "n_heldout": int(held.n_obs),
        "n_genes": int(fit.n_vars),
        "warmup_seconds_per_epoch": warmup.seconds_per_epoch,
        "warmup_seconds": warmup.warmup_seconds,
        "loads": [load_average()],
    }
    modes = {"stopped": stopping, "full": {"early_stopping": False}}
    if spec.get("alternative_rule"):  # another rule beside the shared one
        every, patience, delta, lr, cuts = spec["alternative_rule"]
        rule = StoppingRule(int(every), int(patience), float(delta), float(lr), int(cuts))
        modes["alternative"] = rule.train_kwargs()
    order = list(modes) if spec["seed"] % 2 == 0 else list(modes)[::-1]  # interleaved across seeds
    kept = spec.get("kept_modes") or {}
    out.update(kept)
    for mode in [m for m in order if m not in kept]:
        model = cv.CountVAE(fit, **model_kwargs)
        t0 = time.perf_counter()
        model.train(max_epochs=spec["epochs"], seed=spec["seed"], progress_bar=False, **modes[mode])
        seconds = time.perf_counter() - t0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnreliableEstimateWarning)
            frame = model.get_log_predictive_density(held, seed=0)
        out[mode] = {
            "seconds": seconds,
            "epochs_trained": int(model.training_summary["epochs_trained"]),
            "kept_epoch": int(model.training_summary["kept_epoch"]),
            "lpd": frame["lpd"].tolist(),
            "unreliable": float(1.0 - frame["reliable"].mean()),
            "loss_validation": model.history["loss_validation"].tolist(),
        }
        out["loads"].append(load_average())
    return out


# ----- replaying rules ----------------------------------------------------------------------------
def replay(
    losses: np.ndarray, every: int, patience: int, relative_delta: float, max_epochs: int, window: int = 1
) -> tuple[int, int]:
    """Stop epoch and kept (best) epoch of a rule on validation losses ``losses[e - 1]`` of epochs ``e``.

    With ``window`` 1 this is the rule of ``countvae.model.training`` (tests/benchmarks/test_benchmarks.py checks
    the two against each other). A larger ``window`` judges improvements on the mean of the last ``window``
    validation losses (from the ``window``-th validation on), a smoothed signal compared in ``--versus-full``; the
    kept epoch is still the one of the best single validation loss, as the package keeps it.
    """
    reference, best, best_epoch, last_improvement = np.inf, np.inf, 0, 0
    checks = list(range(every, max_epochs + 1, every))
    if not checks or checks[-1] != max_epochs:
        checks.append(max_epochs)  # training always validates at its last epoch
    seen: list[float] = []
    for epoch in checks:
        loss = float(losses[epoch - 1])
        seen.append(loss)
        if loss < best:
            best, best_epoch = loss, epoch
        if len(seen) < window:
            continue
        signal = float(np.mean(seen[-window:]))
        if signal < reference - relative_delta * abs(reference) or not np.isfinite(reference):
            reference, last_improvement = signal, epoch
        elif epoch - last_improvement >= patience:
            return epoch, best_epoch
    return max_epochs, best_epoch if best_epoch else max_epochs


def evaluate_rules(trajectories: list[dict]) -> pd.DataFrame:
    """Every rule of the grid on every trajectory: epochs, time share and held-out ELBO gap."""
    out = []
    for traj in trajectories:
        frame = pd.DataFrame(traj["rows"])
        losses = frame["loss_validation"].to_numpy()
        elbo = frame["heldout_elbo"].to_numpy()
        train_s = frame["train_seconds"].to_numpy()
        val_s = float(frame["validation_seconds"].median())
        n = len(frame)
        full_seconds = float(train_s.sum())  # the old default: no validation needed
        for every, patience, delta in itertools.product(CHECK_EVERY, PATIENCE, RELATIVE_DELTA):
            stop, kept = replay(losses, every, patience, delta, n)
            seconds = float(train_s[:stop].sum()) + val_s * (stop // every + (stop % every > 0))
            out.append(
                {
                    "dataset": traj["dataset"],
                    "seed": traj["seed"],
                    "every": every,
                    "patience": patience,
                    "relative_delta": delta,
                    "stop_epoch": stop,
                    "kept_epoch": kept,
                    "max_epochs": n,
                    "time_share": seconds / full_seconds,
                    "elbo_gap": float(elbo[kept - 1] - elbo[n - 1]),
                }
            )
    return pd.DataFrame(out)


def choose_rule(rules: pd.DataFrame, tolerance: float) -> pd.DataFrame:
    """Per rule: worst held-out gap and mean time share over all fits; rules within ``tolerance`` first."""
    keys = ["every", "patience", "relative_delta"]
    summary = rules.groupby(keys).agg(
        worst_gap=("elbo_gap", "min"),
        mean_gap=("elbo_gap", "mean"),
        mean_time_share=("time_share", "mean"),
        max_time_share=("time_share", "max"),
    )
    summary["within_tolerance"] = summary["worst_gap"] >= -tolerance
    return summary.reset_index().sort_values(["within_tolerance", "mean_time_share"], ascending=[False, True])


# ----- driver -------------------------------------------------------------------------------------
def _old_default_epochs(n_cells: int) -> int:
    from countvae.diagnostics.fitting.default_training import CELL_PASSES_PER_SEED

    n_fit = int(round(0.9 * n_cells))
    return int(min(400, max(20, round(CELL_PASSES_PER_SEED / n_fit))))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="small simulated data, 30 epochs: a smoke run")
    parser.add_argument("--datasets", default="kang2018,pbmc_3tech")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tolerance", type=float, default=0.5, help="largest held-out ELBO loss, nats per cell")
    parser.add_argument("--reuse", action="store_true", help="replay the stored trajectories, do not refit them")
    parser.add_argument("--no-verify", action="store_true", help="skip phase 3")
    parser.add_argument("--versus-full", action="store_true", help="the shared rule against 400 epochs, by log p(x)")
    parser.add_argument("--kang-cells", type=int, default=0, help="--versus-full: a random subset of Kang (0: all)")
    parser.add_argument("--lpd-cells", type=int, default=300, help="--versus-full: held-out cells for log p(x)")
    parser.add_argument("--section", default=None, help="RESULTS.md section (default: by mode)")
    parser.add_argument(
        "--alternative",
        default="2,10,1e-3,1e-3,0",
        help="--versus-full: also this rule, 'every,patience,delta,lr,lr_cuts' ('' none; default: the former rule, "
        "lr 1e-3 throughout)",
    )
    parser.add_argument(
        "--refit-stopped",
        action="store_true",
        help="--versus-full --reuse: keep the stored full fits, refit the stopped and alternative ones",
    )
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    parser.add_argument("--results", default=str(DEFAULT_RESULTS))
    args = parser.parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        if spec.get("versus_full"):
            result = versus_full_worker(spec)
        else:
            result = verify_worker(spec) if spec.get("rule") else trajectory_worker(spec)
        print(json.dumps(result))
        return
    if args.versus_full:
        versus_full(args)
        return

    datasets = ["quick"] if args.quick else args.datasets.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    store = Path(args.data_dir) / ("stopping_trajectories_quick.json" if args.quick else "stopping_trajectories.json")
    started = time.strftime("%Y-%m-%d %H:%M")
    loads = [load_average()]
    t_start = time.perf_counter()
    # Trajectories are stored as each finishes; --reuse keeps those stored and fits only the missing ones.
    stored = json.loads(store.read_text()) if args.reuse and store.exists() else []
    done = {(t["dataset"], t["seed"]): t for t in stored}
    trajectories = []
    for name in datasets:
        epochs = 30 if name == "quick" else _old_default_epochs(2000 if name == "pbmc_3tech" else 8684)
        for seed in seeds:
            if (name, seed) in done:
                trajectories.append(done[(name, seed)])
                continue
            spec = {"dataset": name, "seed": seed, "epochs": epochs, "threads": args.threads}
            result = run_worker(Path(__file__), spec)
            loads.append(load_average())
            frame = pd.DataFrame(result["rows"])
            print(
                f"{name} seed {seed}: {len(frame)} epochs, {frame['train_seconds'].sum():.0f} s training, "
                f"held-out ELBO {frame['heldout_elbo'].iloc[-1]:.2f} (best {frame['heldout_elbo'].max():.2f} "
                f"at epoch {int(frame['heldout_elbo'].idxmax()) + 1})",
                flush=True,
            )
            trajectories.append(result)
            done[(name, seed)] = result
            store.parent.mkdir(parents=True, exist_ok=True)
            store.write_text(json.dumps(list(done.values())))
    rules = evaluate_rules(trajectories)
    ranking = choose_rule(rules, args.tolerance)
    print(ranking.head(15).to_string())
    best = ranking.iloc[0]
    chosen = {"every": int(best["every"]), "patience": int(best["patience"]), "relative_delta": best["relative_delta"]}
    verify_rows = []
    if not args.no_verify:
        for traj in trajectories:
            rule = {
                "early_stopping": True,
                "check_val_every_n_epoch": chosen["every"],
                "early_stopping_patience": chosen["patience"],
                "early_stopping_relative_delta": float(chosen["relative_delta"]),
            }
            spec = {k: traj[k] for k in ("dataset", "seed", "epochs", "threads")} | {"rule": rule}
            result = run_worker(Path(__file__), spec)
            loads.append(load_average())
            replayed = rules[
                (rules["dataset"] == traj["dataset"])
                & (rules["seed"] == traj["seed"])
                & (rules["every"] == chosen["every"])
                & (rules["patience"] == chosen["patience"])
                & (rules["relative_delta"] == chosen["relative_delta"])
            ].iloc[0]
            full = pd.DataFrame(traj["rows"])
            verify_rows.append(
                {
                    "dataset": traj["dataset"],
                    "seed": traj["seed"],
                    "old default epochs": traj["epochs"],
                    "epochs trained": result["epochs_trained"],
                    "kept epoch": result["best_epoch"],
                    "replayed stop / kept": f"{int(replayed['stop_epoch'])} / {int(replayed['kept_epoch'])}",
                    "seconds (stopped)": result["seconds"],
                    "seconds (old default, training only)": float(full["train_seconds"].sum()),
                    "held-out ELBO (stopped)": result["heldout_elbo"],
                    "held-out ELBO (old default)": float(full["heldout_elbo"].iloc[-1]),
                    "gap": result["heldout_elbo"] - float(full["heldout_elbo"].iloc[-1]),
                }
            )
            print(verify_rows[-1], flush=True)
    minutes = (time.perf_counter() - t_start) / 60
    _write(args, trajectories, rules, ranking, chosen, verify_rows, started, loads, minutes)


def _trajectory_table(trajectories: list[dict]) -> pd.DataFrame:
    rows = []
    for traj in trajectories:
        f = pd.DataFrame(traj["rows"])
        best = int(f["heldout_elbo"].idxmax())
        rows.append(
            {
                "dataset": traj["dataset"],
                "cells fit / held out x genes": f"{traj['n_fit']} / {traj['n_heldout']} x {traj['n_genes']}",
                "seed": traj["seed"],
                "old default epochs": len(f),
                "s/epoch (training)": float(f["train_seconds"].iloc[1:].median()),
                "validation s": float(f["validation_seconds"].median()),
                "held-out ELBO at the end": float(f["heldout_elbo"].iloc[-1]),
                "best held-out ELBO (epoch)": f"{f['heldout_elbo'].max():.2f} ({best + 1})",
                "epoch of best validation loss": int(f["loss_validation"].idxmin()) + 1,
            }
        )
    return pd.DataFrame(rows)


def _reuse_note(args) -> str:
    """Where reused trajectories came from: their fits ran in an earlier run, under that run's load."""
    if not args.reuse:
        return ""
    store = Path(args.data_dir) / ("stopping_trajectories_quick.json" if args.quick else "stopping_trajectories.json")
    written = time.strftime("%Y-%m-%d %H:%M", time.localtime(store.stat().st_mtime))
    return (
        f"The trajectories were reused (`--reuse`) from `{store.name}`, last written {written} by an earlier run of "
        "phase 1 (its load averages were not stored; its seconds per epoch show the load it ran under).\n"
    )


def _write(args, trajectories, rules, ranking, chosen, verify_rows, started, loads, minutes) -> None:
    keys = ["every", "patience", "relative_delta"]
    chosen_rows = rules.merge(pd.DataFrame([chosen]), on=keys)
    chosen_rows = chosen_rows[["dataset", "seed", "stop_epoch", "kept_epoch", "max_epochs", "time_share", "elbo_gap"]]
    top = ranking.head(12)
    body = f"""## Convergence-based stopping for `diagnose` (`bench_stopping.py`)

Command: `{command_line()}` ({started}{", QUICK smoke run" if args.quick else ""}; {minutes:.0f} min)

Machine: {machine_line(args.threads)}. Load average (1/5/15 min) before and after each fit: {"; ".join(loads)}.
{_reuse_note(args)}

Each fit is made as `countvae diagnose` makes it: n_latent 10, 1 x 128 hidden, NB, batch 128, lr 1e-3; 10% of
the cells held out (split seed 0, as `fit_seeds`), the fit cells split 90/10 into training and validation by the
fit's seed; trained for the old default of 600,000 cell passes. Held-out ELBO: mean over all held-out cells of
the single-draw ELBO with fixed noise (nats per cell, higher is better); the quality criterion here until the
accurate log p(x) estimator of issue 13 is in place.

### The fits, trained to the old default

{markdown_table(_trajectory_table(trajectories))}

### Rules replayed on these trajectories

Validate every `every` epochs; an improvement counts when the validation loss falls below the reference by more
than `relative_delta` x |reference|; stop after `patience` epochs without one; keep the parameters of the best
validation loss seen. Gap: held-out ELBO of the kept parameters minus that of the old default (negative = worse).
Time share: training time to the stop plus the validation passes, over the old default's training time.
Tolerance: a gap of at most {args.tolerance} nats per cell on every fit. Best 12 of
{len(ranking)} rules (within tolerance first, then by mean time share):

{markdown_table(top)}

Chosen: validate every {chosen["every"]} epochs, patience {chosen["patience"]} epochs, relative delta
{chosen["relative_delta"]:g}. Per fit:

{markdown_table(chosen_rows)}
"""
    if verify_rows:
        body += f"""
### The chosen rule run through `CountVAE.train`

The stop and kept epochs must equal the replay's (the rule in the training loop is the replayed rule); seconds
are wall time of the whole `train` call, validation included, against the old default's training time.

{markdown_table(pd.DataFrame(verify_rows))}
"""
    write_section(Path(args.results), "stopping-quick" if args.quick else "stopping", body)


# ----- the shared rule against the full schedule ---------------------------------------------------
def versus_full(args) -> None:
    """Fit every data set and seed both ways (stored as each finishes; ``--reuse`` keeps them) and write the section."""
    datasets = ["quick"] if args.quick else args.datasets.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    store = Path(args.data_dir) / f"stopping_vs_full{'_quick' if args.quick else ''}.json"
    stored = json.loads(store.read_text()) if args.reuse and store.exists() else []
    done = {(r["dataset"], r["seed"]): r for r in stored}
    started, t_start = time.strftime("%Y-%m-%d %H:%M"), time.perf_counter()
    for name in datasets:
        for seed in seeds:
            if (name, seed) in done and not args.refit_stopped:
                continue
            previous = done.get((name, seed))
            spec = {
                "versus_full": True,
                "dataset": name,
                "seed": seed,
                "epochs": 30 if args.quick else 400,
                "threads": args.threads,
                "lpd_cells": 40 if args.quick else args.lpd_cells,
                "n_cells": args.kang_cells if name == "kang2018" else 0,
                "alternative_rule": [float(v) for v in args.alternative.split(",")] if args.alternative else None,
                # the full schedule does not depend on the stopping rule: a stored one is kept as it ran
                "kept_modes": {"full": previous["full"], "full_reused": True} if previous else None,
            }
            result = run_worker(Path(__file__), spec)
            done[(name, seed)] = result
            store.parent.mkdir(parents=True, exist_ok=True)
            store.write_text(json.dumps(list(done.values())))
            print(versus_full_row(result), flush=True)
    results = [done[(n, s)] for n in datasets for s in seeds]
    minutes = (time.perf_counter() - t_start) / 60
    name = args.section or ("stopping-vs-full-quick" if args.quick else "stopping-vs-full")
    write_section(Path(args.results), name, versus_full_body(results, args, started, minutes))


def versus_full_row(result: dict) -> dict:
    """One seed's comparison: epochs, seconds, mean held-out log p(x) both ways and the paired difference."""
    stopped, full = result["stopped"], result["full"]
    diff = np.asarray(stopped["lpd"]) - np.asarray(full["lpd"])
    row = {
        "data": result["dataset"],
        "cells fit x genes": f"{result['n_fit']} x {result['n_genes']}",
        "seed": result["seed"],
        "stopped at / kept": f"{stopped['epochs_trained']} / {stopped['kept_epoch']}",
        "s stopped / 400 epochs": f"{stopped['seconds']:.0f} / {full['seconds']:.0f}",
        "log p(x) stopped": float(np.mean(stopped["lpd"])),
        "log p(x) 400 epochs": float(np.mean(full["lpd"])),
        "difference (paired SE)": f"{diff.mean():+.2f} ({diff.std(ddof=1) / np.sqrt(diff.size):.2f})",
        "unreliable cells stopped / full": f"{stopped['unreliable']:.3f} / {full['unreliable']:.3f}",
    }
    alternative = result.get("alternative")
    if alternative:
        alt = np.asarray(alternative["lpd"]) - np.asarray(full["lpd"])
        row["alternative rule: stopped at / kept, s"] = (
            f"{alternative['epochs_trained']} / {alternative['kept_epoch']}, {alternative['seconds']:.0f}"
        )
        row["alternative minus full (SE)"] = f"{alt.mean():+.2f} ({alt.std(ddof=1) / np.sqrt(alt.size):.2f})"
    return row


def versus_full_body(results: list[dict], args, started: str, minutes: float) -> str:
    """The RESULTS.md section of ``--versus-full``."""
    from countvae.model.training import DEFAULT_STOPPING

    rule = DEFAULT_STOPPING
    table = pd.DataFrame([versus_full_row(r) for r in results])
    diffs = [np.mean(np.asarray(r["stopped"]["lpd"]) - np.asarray(r["full"]["lpd"])) for r in results]
    loads = "; ".join(f"{r['dataset']} seed {r['seed']}: " + ", ".join(r["loads"]) for r in results)
    kang = f"a random {args.kang_cells:,} of its cells (seed 0)" if args.kang_cells else "all its cells"
    return f"""## The shared stopping rule against the full 400-epoch schedule (`bench_stopping.py --versus-full`)

Command: `{command_line()}` ({started}{", QUICK smoke run" if args.quick else ""}; {minutes:.0f} min)

Machine: {machine_line(args.threads)}. Load average (1/5/15 min) before the seed and after each fit: {loads}.

Rule (`countvae.model.training.DEFAULT_STOPPING`): learning rate {rule.lr:g}, validate every
{rule.check_val_every_n_epoch} epochs, patience {rule.patience} epochs, relative delta {rule.relative_delta:g}; when it
fires, {rule.lr_reductions} time(s) back to the best epoch's parameters with the rate times {rule.lr_factor:g} and a
fresh patience, then stop; keep the best validation epoch. The full fit trains at scvi-tools' 1e-3 without stopping
(`early_stopping=False`; `train()`'s default until 2026-12-05); all fits of a seed allow 400 epochs (scvi-tools'
schedule below 20,000 cells). Data as
`countvae diagnose` fits it: the embedded simulation (n_latent 5), pbmc_3tech and Kang ({kang}; n_latent 10),
the 2,000 most variable genes where there are more; 10% of the cells held out (split seed 0, as `fit_seeds`),
the first {args.lpd_cells} of them scored. Model: the package defaults otherwise (NB, MLP decoder, 1 x 128, batch
128). Held-out log p(x) per cell (nats, higher is better) by the package's accurate estimator
(`get_log_predictive_density`, seed 0); the difference is stopped minus full, paired over the same cells, with its
standard error over cells. Each seed's fits ran in one worker, in alternating order across
seeds.{_reuse_full_note(results)}

{markdown_table(table)}

Difference stopped minus full, per fit: {", ".join(f"{d:+.2f}" for d in diffs)} nats per cell (worst
{min(diffs):+.2f}).{_alternative_note(results)}

### The time estimate printed before fitting, against the stopped fit's time

The warm-up estimate (`countvae.model.warmup.estimate_training_time`, 10 timed minibatches, run in the same
worker just before the fits, so under the same load) times the epochs expected by `expected_stop_epoch`
(a power law in the genes and training cells), against the wall time of the stopped fit's `train` call. Within a factor
1.5 is the target.

{markdown_table(estimate_table(results))}

{replayed_rules_section(results)}
"""


def smoothed_validation(losses: np.ndarray, epoch: int, half_width: int = SMOOTHING_HALF_WIDTH) -> float:
    """Mean of the recorded validation losses within ``half_width`` epochs of ``epoch`` (NaN epochs skipped)."""
    lo, hi = max(epoch - half_width, 1), min(epoch + half_width, len(losses))
    return float(np.nanmean(losses[lo - 1 : hi]))


def replay_on_full(result: dict, rule: tuple[int, int, float, int]) -> tuple[int, int, float]:
    """A rule's stop and kept epoch on a seed's full-fit validation curve, and the smoothed validation loss at
    the last epoch minus at the kept one (positive when the kept epoch is better)."""
    losses = np.asarray(result["full"]["loss_validation"], dtype=float)
    every, patience, delta, window = rule
    stop, kept = replay(losses, every, patience, delta, len(losses), window)
    return stop, kept, smoothed_validation(losses, len(losses)) - smoothed_validation(losses, kept)


def replayed_rules_table(results: list[dict]) -> tuple[pd.DataFrame, list[tuple[int, int, float]], int]:
    """Every rule of ``VERSUS_FULL_REPLAYS`` on every full fit's validation curve.

    Returns the table (a row per rule, a column per fit: stop / kept epoch and ``replay_on_full``'s gap), the
    former rule's replay per fit, and the number of fits whose alternative fit (the former rule, by default) that
    replay reproduces (its stop and kept epoch; 0 without alternative fits).
    """
    shared = [replay_on_full(r, VERSUS_FULL_REPLAYS[0]) for r in results]
    reproduced = sum(
        "alternative" in r and (stop, kept) == (r["alternative"]["epochs_trained"], r["alternative"]["kept_epoch"])
        for (stop, kept, _), r in zip(shared, results, strict=True)
    )
    rows = []
    for rule in VERSUS_FULL_REPLAYS:
        row = {"rule: every / patience / delta / window": " / ".join(f"{v:g}" for v in rule)}
        replays = [replay_on_full(r, rule) for r in results]
        for (stop, kept, gap), r in zip(replays, results, strict=True):
            row[f"{r['dataset']} {r['seed']}"] = f"{stop} / {kept}, {gap:+.1f}"
        ratios = [stop / shared_stop for (stop, _, _), (shared_stop, _, _) in zip(replays, shared, strict=True)]
        row["epochs / former rule's (mean)"] = float(np.mean(ratios))
        rows.append(row)
    return pd.DataFrame(rows), shared, reproduced


def replayed_rules_section(results: list[dict]) -> str:
    """The subsection of rules replayed on the full fits' validation curves."""
    if not results or "loss_validation" not in results[0]["full"]:
        return ""
    table, shared, reproduced = replayed_rules_table(results)
    proxy = ", ".join(
        f"{r['dataset']} {r['seed']}: "
        f"{np.mean(np.asarray(r['alternative']['lpd']) - np.asarray(r['full']['lpd'])):+.1f} against {gap:+.1f}"
        for r, (_, _, gap) in zip(results, shared, strict=True)
        if "alternative" in r
    )
    return f"""### Rules at a constant learning rate, replayed on the 400-epoch fits' validation curves

A fit stopped by a rule at 1e-3 and the full fit of a seed follow one trajectory up to the stop (same seed, split and
minibatch order; the validation pass draws its own fixed noise), so such a rule's stop can be read off the full fit's
validation losses; the shared rule, whose rate differs from the full fit's, cannot be replayed there. The first row is
the former shared rule; its replay reproduces the alternative fit's stop and kept epoch in {reproduced} of
{len(results)} fits.
Held-out log p(x) exists only for fits actually trained; here a rule's kept epoch is judged by the validation loss
(negative ELBO per validation cell, 10% of the fit cells) averaged over the validations within
{SMOOTHING_HALF_WIDTH} epochs of it, at 400 epochs minus at the kept epoch (positive: the kept epoch is better).
For the former rule, the measured log p(x) difference above (alternative minus full) against this proxy: {proxy}
nats per cell. A window
above 1 judges each improvement on the mean of the last validation losses instead of the last one alone. Each cell
of the table: stop epoch / kept epoch, proxy.

{markdown_table(table)}
"""


def estimate_table(results: list[dict]) -> pd.DataFrame:
    """Per fit: expected and actual stop epoch, estimated and actual seconds, and their ratio."""
    from countvae.model.warmup import expected_stop_epoch

    rows = []
    for r in results:
        n_train = int(round(0.9 * r["n_fit"]))
        expected = expected_stop_epoch(r["n_genes"], n_train, r["epochs"])
        estimated = expected * r["warmup_seconds_per_epoch"]
        actual = r["stopped"]["seconds"]
        rows.append(
            {
                "data": r["dataset"],
                "seed": r["seed"],
                "training cells x genes": f"{n_train} x {r['n_genes']}",
                "expected stop epoch": expected,
                "actual stop epoch": r["stopped"]["epochs_trained"],
                "warm-up s/epoch": r["warmup_seconds_per_epoch"],
                "estimated s": estimated,
                "actual s": actual,
                "estimated / actual": estimated / actual,
                "within 1.5x": bool(1 / 1.5 <= estimated / actual <= 1.5),
            }
        )
    return pd.DataFrame(rows)


def _reuse_full_note(results: list[dict]) -> str:
    reused = [f"{r['dataset']} {r['seed']}" for r in results if r.get("full_reused")]
    if not reused:
        return ""
    return (
        f" The full fits of {', '.join(reused)} were kept from the store of an earlier run (`--refit-stopped`: the"
        " full schedule does not depend on the stopping rule), so their seconds come from that run's load."
    )


def _alternative_note(results: list[dict]) -> str:
    spec = results[0].get("alternative_rule") if results else None
    if not spec:
        return ""
    every, patience, delta, lr, cuts = spec
    return (
        f" The alternative rule (columns on the right): learning rate {lr:g}, cut {int(cuts)} time(s), validate every "
        f"{int(every)} epochs, patience {int(patience)}, relative delta {delta:g}, the same seed, split and order of "
        "minibatches otherwise."
    )


if __name__ == "__main__":
    main()
