"""Training speed and held-out fit: countvae (both loss engines) against scvi-tools' SCVI, from 1k to 100k cells.

Same architecture on both sides: n_latent 10, one hidden layer of 128 units, NB
likelihood with gene-wise dispersion, batch one-hot into encoder and decoder
(SCVI with ``encode_covariates=True``), observed library size, batch size 128,
``train_size=0.9``, Adam at lr 1e-3, each package's default KL schedule (SCVI
warms the KL weight up over 400 epochs; countvae trains the plain ELBO). SCVI
runs with its default of no validation pass per epoch; countvae computes its
validation loss at its default frequency (``check_val_every_n_epoch``), included in
its time.

10% of the cells (fixed seed) are held out from both models; the held-out log
predictive density per cell is countvae's ``get_log_predictive_density(method="guide")`` and
scvi's ``get_marginal_ll``, the same estimator (the guide as proposal) with the
same number of importance samples on the same cells (only for the data sets in
``LPD_DATASETS``: elsewhere the runs time epochs only). Each (dataset, runner,
repeat) runs in its own process, in an interleaved order; time per epoch is the
mean over the epochs after the warm-up epochs (so epochs with a validation pass count in proportion).
Runners: ``countvae-direct`` and ``countvae-pyro`` (the two loss engines, in a process with glibc's
default malloc, as a notebook's ``model.train()``), ``countvae-workers`` (the direct engine in a process
where ``countvae._allocator.keep_freed_memory`` applies, as ``countvae diagnose`` and its fit workers
train) and ``scvi``.

Data sets: ``kang2018`` (8,684 x 2,511), ``kang1k`` (1,000 of its cells),
``kang100k`` (100,000 cells drawn from it with replacement), ``pbmc_3tech``
(2,000 x 8,513), ``sim1k``, ``sim10k``, ``sim100k`` (simulated NB counts, 2,000 genes).
``--summary`` adds a section with the ratio to SCVI at every size run.

    python benchmarks/bench_training.py            # Kang and simulated 100k x 2k; writes RESULTS.md
    python benchmarks/bench_training.py --datasets sim1k,kang1k,sim10k,kang2018,sim100k,kang100k \
        --runners countvae-direct,scvi --threads 1 --summary
    python benchmarks/bench_training.py --quick    # tiny simulated data, a smoke run
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    DEFAULT_DATA_DIR,
    DEFAULT_RESULTS,
    Stopwatch,
    command_line,
    load_average,
    machine_line,
    markdown_table,
    peak_rss_mb,
    run_worker,
    simulate_h5ad,
    write_section,
)

RUNNERS = ("countvae-direct", "scvi", "countvae-workers", "countvae-pyro")
#: Data sets whose sections also report the held-out fit after the timed epochs.
LPD_DATASETS = ("kang2018", "sim100k", "sim600x120")
#: Default (epochs, warm-up epochs left out of the mean) per data set: more epochs where they are short.
EPOCHS = {
    "sim1k": (30, 3),
    "kang1k": (30, 3),
    "pbmc_3tech": (20, 2),
    "sim10k": (10, 2),
    "kang2018": (12, 2),
    "sim100k": (4, 1),
    "kang100k": (4, 1),
}


# ----- worker side --------------------------------------------------------------------------------
def _load(spec: dict):
    import anndata as ad

    import countvae as cv

    name = spec["dataset"]
    if name in ("kang2018", "pbmc_3tech"):
        return cv.data.load_dataset(name)
    if name in ("kang1k", "kang100k"):
        kang = cv.data.load_dataset("kang2018")
        n = 1000 if name == "kang1k" else 100_000
        rng = np.random.default_rng(0)
        cells = np.sort(rng.choice(kang.n_obs, n, replace=n > kang.n_obs))
        out = kang[cells].copy()
        out.obs_names = [f"cell{i}" for i in range(n)]
        return out
    return ad.read_h5ad(spec["path"])


def _split(adata, heldout_fraction: float, lpd_cells: int):
    from countvae.data.split import split_indices

    fit_idx, held_idx = split_indices(adata.n_obs, 1.0 - heldout_fraction, seed=12345)
    held_idx = held_idx[:lpd_cells]
    # genes without a count in the fit cells (a few at 1,000 simulated cells) are refused by setup_anndata;
    # both packages get the same remaining genes
    expressed = np.asarray(adata[fit_idx].X.sum(axis=0)).ravel() > 0
    return adata[fit_idx][:, expressed].copy(), adata[held_idx][:, expressed].copy()


def _train_countvae(spec: dict, train, held) -> dict:
    import countvae as cv
    from countvae.model import training

    if spec["runner"] == "countvae-workers":  # as diagnose's fit workers and the command line run
        from countvae._allocator import keep_freed_memory

        keep_freed_memory()
    cv.CountVAE.setup_anndata(train, batch_key="batch")
    model = cv.CountVAE(train, n_latent=10, n_hidden=128, n_layers=1, likelihood="nb", decoder="mlp")
    marks: list[float] = []
    original = training.tqdm

    def epochs_marked(iterable):  # a mark as each epoch starts and once after the last
        for item in iterable:
            marks.append(time.perf_counter())
            yield item
        marks.append(time.perf_counter())

    training.tqdm = lambda iterable, *args, **kwargs: original(epochs_marked(iterable), *args, **kwargs)
    try:
        model.train(
            early_stopping=False,
            max_epochs=spec["epochs"],
            batch_size=128,
            train_size=0.9,
            seed=0,
            progress_bar=False,
            engine="pyro" if spec["runner"] == "countvae-pyro" else "direct",
        )
    finally:
        training.tqdm = original
    validated = model.history["loss_validation"].notna()
    out = {
        "epoch_seconds": list(np.diff(marks)),
        "validated_epochs": int(validated.sum()),
        "loss_validation_last": float(model.history["loss_validation"][validated].iloc[-1]),
    }
    if spec["lpd"]:
        t0 = time.perf_counter()
        lpd = model.get_log_predictive_density(held, n_samples=spec["lpd_samples"], seed=0, method="guide")
        out.update(lpd_mean=float(lpd["lpd"].mean()), lpd_mc_se=float(lpd["mc_se"].mean()))
        out["lpd_seconds"] = time.perf_counter() - t0
    return out


def _train_scvi(spec: dict, train, held) -> dict:
    import logging

    import scvi
    from lightning.pytorch.callbacks import Callback

    logging.getLogger("scvi").setLevel(logging.WARNING)
    logging.getLogger("lightning").setLevel(logging.WARNING)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    scvi.settings.seed = 0
    scvi.model.SCVI.setup_anndata(train, batch_key="batch")
    model = scvi.model.SCVI(
        train, n_latent=10, n_hidden=128, n_layers=1, gene_likelihood="nb", dispersion="gene", encode_covariates=True
    )
    watch = Stopwatch()

    class EpochTimer(Callback):
        def on_train_start(self, trainer, pl_module):
            watch.t0 = time.perf_counter()

        def on_train_epoch_end(self, trainer, pl_module):
            watch.mark()

    model.train(
        max_epochs=spec["epochs"],
        batch_size=128,
        train_size=0.9,
        accelerator=spec.get("accelerator", "cpu"),
        devices=1,
        enable_progress_bar=False,
        callbacks=[EpochTimer()],
    )
    out = {"epoch_seconds": watch.intervals()}
    if spec["lpd"]:
        t0 = time.perf_counter()
        ll = model.get_marginal_ll(held, n_mc_samples=spec["lpd_samples"], return_mean=False)
        values = np.asarray(ll.detach().cpu().numpy() if hasattr(ll, "detach") else ll, dtype=float)
        out.update(lpd_mean=float(values.mean()), lpd_seconds=time.perf_counter() - t0)
    return out


def worker(spec: dict) -> dict:
    """Train one runner on one dataset; return timings, held-out LPD and peak memory."""
    import torch

    torch.set_num_threads(spec["threads"])
    adata = _load(spec)
    train, held = _split(adata, spec["heldout_fraction"], spec["lpd_cells"])
    del adata
    run = _train_scvi if spec["runner"] == "scvi" else _train_countvae
    out = run(spec, train, held)
    out.update(
        runner=spec["runner"],
        dataset=spec["dataset"],
        repeat=spec["repeat"],
        threads=torch.get_num_threads(),
        n_train_cells=int(train.n_obs),
        n_genes=int(train.n_vars),
        n_heldout=int(held.n_obs),
        peak_rss_mb=peak_rss_mb(),
    )
    return out


# ----- driver side --------------------------------------------------------------------------------
def _datasets(args) -> list[dict]:
    data_dir = Path(args.data_dir)
    if args.quick:
        path = simulate_h5ad(data_dir / "sim_quick_600x120.h5ad", 600, 120, seed=1, chunk_cells=250)
        return [{"dataset": "sim600x120", "path": str(path)}]
    out = []
    for name in args.datasets.split(","):
        sizes = {"sim1k": 1_000, "sim10k": 10_000, "sim100k": 100_000}
        if name in ("kang2018", "kang1k", "kang100k", "pbmc_3tech"):
            out.append({"dataset": name})
        elif name in sizes:
            n = sizes[name]
            path = simulate_h5ad(data_dir / f"sim_{n}x2000.h5ad", n, 2000, seed=0)
            out.append({"dataset": name, "path": str(path)})
        else:
            raise SystemExit(f"unknown dataset {name!r}; use {', '.join(EPOCHS)}")
    return out


def _summarise(rows: list[dict], warmup: int) -> pd.DataFrame:
    records = []
    for r in rows:
        per_epoch = np.asarray(r["epoch_seconds"][warmup:] or r["epoch_seconds"], dtype=float)
        records.append({**r, "s_per_epoch": float(np.mean(per_epoch))})
    frame = pd.DataFrame(records)
    table = []
    for (dataset, runner), g in frame.groupby(["dataset", "runner"], sort=False):
        lpd = g["lpd_mean"].dropna() if "lpd_mean" in g else pd.Series(dtype=float)
        lpd_s = g["lpd_seconds"].dropna() if "lpd_seconds" in g else pd.Series(dtype=float)
        table.append(
            {
                "dataset": dataset,
                "runner": runner,
                "cells x genes (train)": f"{int(g['n_train_cells'].iloc[0])} x {int(g['n_genes'].iloc[0])}",
                "s/epoch (mean per repeat)": ", ".join(f"{v:.3f}" for v in g["s_per_epoch"]),
                "s/epoch": float(g["s_per_epoch"].median()),
                "held-out LPD/cell": float(lpd.iloc[0]) if len(lpd) else float("nan"),
                "LPD seconds": float(lpd_s.iloc[0]) if len(lpd_s) else float("nan"),
                "peak RSS MiB": float(g["peak_rss_mb"].max()),
                "threads": int(g["threads"].iloc[0]),
            }
        )
    table = pd.DataFrame(table)
    scvi_time = table[table["runner"] == "scvi"].set_index("dataset")["s/epoch"]
    ratios = [row["s/epoch"] / scvi_time.get(row["dataset"], float("nan")) for _, row in table.iterrows()]
    table.insert(5, "ratio to SCVI", ratios)
    return table


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="tiny simulated data, 2 epochs: a smoke run")
    parser.add_argument("--datasets", default="kang2018,sim100k", help="comma list of " + ", ".join(EPOCHS))
    parser.add_argument("--epochs", type=int, default=None, help="epochs per fit (default: per data set, EPOCHS)")
    parser.add_argument("--warmup", type=int, default=None, help="epochs left out of the mean (default: EPOCHS)")
    parser.add_argument("--summary", action="store_true", help="also write the training-sizes section")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved repeats of every runner")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--lpd-samples", type=int, default=100, help="importance samples per held-out cell")
    parser.add_argument("--lpd-cells", type=int, default=500, help="held-out cells evaluated")
    parser.add_argument("--runners", default=",".join(RUNNERS), help="comma list of " + ", ".join(RUNNERS))
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR), help="where simulated h5ad files are cached")
    parser.add_argument("--results", default=str(DEFAULT_RESULTS), help="RESULTS.md to update")
    parser.add_argument("--section", default="training", help="section name in RESULTS.md")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return

    if args.quick:
        args.repeats, args.warmup, args.lpd_samples, args.lpd_cells = 1, 1, 10, 20
    runners = args.runners.split(",")
    tables = [_run_dataset(args, ds, runners) for ds in _datasets(args)]
    if args.summary:
        _write_summary(args, tables)


def _previous_times(results: Path, section: str) -> dict[str, float]:
    """Runner -> s/epoch in the section as last written (for the regression check)."""
    if not results.exists():
        return {}
    text = results.read_text()
    match = re.search(rf"<!-- section: {re.escape(section)} -->(.*?)<!-- end: {re.escape(section)} -->", text, re.S)
    if not match:
        return {}
    out = {}
    for line in match.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 4 and cells[1] in RUNNERS:
            try:
                out[cells[1]] = float(cells[4])
            except ValueError:
                pass
    return out


def _run_dataset(args, ds: dict, runners: list[str]) -> pd.DataFrame:
    rows, loads = [], []
    started = time.strftime("%Y-%m-%d %H:%M")
    default_epochs, default_warmup = (2, 1) if args.quick else EPOCHS[ds["dataset"]]
    epochs = args.epochs or default_epochs
    warmup = args.warmup if args.warmup is not None else default_warmup
    for repeat in range(args.repeats):
        order = runners[repeat % len(runners) :] + runners[: repeat % len(runners)]  # rotate: interleave
        for runner in order:
            spec = dict(
                ds,
                runner=runner,
                repeat=repeat,
                epochs=epochs,
                threads=args.threads,
                lpd=repeat == 0 and ds["dataset"] in LPD_DATASETS,
                lpd_samples=args.lpd_samples,
                lpd_cells=args.lpd_cells,
                heldout_fraction=0.1,
            )
            loads.append(load_average())
            result = run_worker(Path(__file__), spec)
            print(
                f"{ds['dataset']:>10} {runner:>16} repeat {repeat}: "
                f"{np.mean(result['epoch_seconds'][warmup:] or result['epoch_seconds']):.3f} s/epoch, "
                f"LPD {result.get('lpd_mean', float('nan')):.2f}, peak {result['peak_rss_mb']:.0f} MiB",
                flush=True,
            )
            rows.append(result)
    loads.append(load_average())
    table = _summarise(rows, warmup)
    section = f"{args.section}-{ds['dataset']}"
    previous = _previous_times(Path(args.results), section)
    notes = []
    for _, row in table.iterrows():
        before = previous.get(row["runner"])
        if before and row["s/epoch"] > 1.2 * before:
            notes.append(
                f"**Regression**: {row['runner']} took {row['s/epoch']:.3f} s/epoch, more than 20% above the "
                f"last recorded {before:.3f} s/epoch (check the load average before concluding)."
            )
    print(table.to_string())
    body = f"""## Training throughput and held-out fit against scvi-tools on {ds["dataset"]} (`bench_training.py`)

Command: `{command_line()}` ({started}{", QUICK smoke run" if args.quick else ""})

Machine: {machine_line(args.threads)}. Load average (1/5/15 min) before each run: {"; ".join(loads)}.

{epochs} epochs per fit; s/epoch is the mean over epochs after the first {warmup}, per repeat, then the
median over {args.repeats} interleaved repeats. Held-out LPD (when measured): mean over {args.lpd_cells} held-out
cells (10% of the data, never trained on) of log p(x) in nats with {args.lpd_samples} importance samples (countvae
`get_log_predictive_density`, scvi `get_marginal_ll`), after the same number of epochs. Peak RSS is the worker
process's high-water mark (data, model, training and LPD).

{markdown_table(table)}

{chr(10).join(notes) if notes else "No runner is more than 20% slower than the figures this section held before."}

Set-up: n_latent 10, 1 hidden layer of 128, NB with gene dispersion, batch one-hot in encoder and decoder,
batch size 128, train_size 0.9, lr 1e-3. SCVI: default KL warm-up (400 epochs) and no per-epoch validation;
countvae: no KL warm-up, its default validation passes ({_validation_note(rows)}; included in its time).
"""
    write_section(Path(args.results), section, body)
    table.insert(1, "warm-up epochs", warmup)
    table.insert(1, "epochs", epochs)
    table.insert(1, "loads", "; ".join(loads))
    return table


def _validation_note(rows: list[dict]) -> str:
    counts = sorted({(r["validated_epochs"], len(r["epoch_seconds"])) for r in rows if "validated_epochs" in r})
    return ", ".join(f"{v} of {n} epochs" for v, n in counts) or "none"


def _write_summary(args, tables: list[pd.DataFrame]) -> None:
    """The ratio of countvae's time per epoch to SCVI's at every size of this run, in one table."""
    frame = pd.concat(tables, ignore_index=True)
    keep = ["dataset", "cells x genes (train)", "runner", "epochs", "warm-up epochs", "s/epoch", "ratio to SCVI"]
    firsts = frame.drop_duplicates("dataset")
    loads = "; ".join(f"{d}: {x.split(';')[0]}" for d, x in zip(firsts["dataset"], firsts["loads"], strict=True))
    worst = {
        runner: frame.loc[frame["runner"] == runner, "ratio to SCVI"].max()
        for runner in ("countvae-direct", "countvae-workers")
        if (frame["runner"] == runner).any()
    }
    quick = " (QUICK smoke run: tiny data, not a measurement)" if args.quick else ""
    body = f"""## Time per epoch against scvi-tools at every size (`bench_training.py --summary`){quick}

Command: `{command_line()}` ({time.strftime("%Y-%m-%d %H:%M")})

Machine: {machine_line(args.threads)}. Load average (1/5/15 min) at the start of each data set: {loads}.
Each data set's own section (`training-<dataset>`) has every repeat and the load before each run.

{markdown_table(frame[keep].drop_duplicates())}

Largest ratio to SCVI: {", ".join(f"{k} {v:.3f}" for k, v in worst.items())}. countvae-direct trains in a
process with glibc's default malloc (a notebook's `model.train()`); countvae-workers in one with
`countvae._allocator.keep_freed_memory()` applied, as `countvae diagnose` and its fit workers train.
"""
    # a smoke run has its own section: it must not replace the measured one the docs cite
    write_section(Path(args.results), f"{args.section}-sizes" + ("-quick" if args.quick else ""), body)


if __name__ == "__main__":
    main()
