"""Fit time of each restricted model against the unrestricted one and against scvi-tools' LinearSCVI.

Every model is the linear-decoder count VAE on the same cells and genes: NB
likelihood with gene-wise dispersion, batch as a covariate, one hidden layer of
128 units in the encoder, 10 latent dimensions, Adam at lr 1e-3, batch size 128,
90% of the cells trained on, the same number of epochs:

``unrestricted``
    ``CountVAE(decoder="linear")``: N(0, I) prior, point-estimated loadings;
``laplace``
    the same with a Laplace prior on ``z``;
``horseshoe``
    the same with a regularized horseshoe prior on the loadings (three more
    global latent sites, each with its guide);
``programs``
    gene programs built from well-known PBMC marker sets (one latent dimension
    per program, so 5 rather than 10 dimensions);
``linearscvi``
    ``scvi.model.LinearSCVI`` (LDVAE) with the same settings.

Each fit runs in a fresh worker process on one thread; the runners are
interleaved over the repeats so that a change of machine load hits them alike.
The table gives the median over repeats of the training wall time divided by the
number of epochs (validation included for both packages), and its ratio to the
unrestricted countvae model.

    python benchmarks/bench_restrictions.py             # Kang PBMC, 2,000 cells, 40 epochs, 2 repeats
    python benchmarks/bench_restrictions.py --quick     # small simulated data, a smoke run
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from _common import (
    DEFAULT_RESULTS,
    command_line,
    load_average,
    machine_line,
    markdown_table,
    run_worker,
    write_section,
)

SECTION = "restrictions"
RUNNERS = ("unrestricted", "laplace", "horseshoe", "programs", "linearscvi")
#: Marker gene programs of PBMC cell types and of the interferon response (the marker sets of tutorial 06).
PBMC_PROGRAMS = {
    "T cell": ["CD3D", "CD3E", "IL7R", "CD2", "LTB"],
    "B cell": ["MS4A1", "CD79A"],
    "monocyte": ["CD14", "LYZ", "S100A9", "S100A8", "FCN1"],
    "NK": ["GNLY", "NKG7", "GZMB", "PRF1", "KLRD1"],
    "interferon": ["ISG15", "IFI6", "MX1", "ISG20", "IFITM3"],
}
#: Cells and most variable genes of the Kang data the benchmark keeps.
N_CELLS, N_GENES = 2000, 1000
COUNTVAE_SETTINGS = {"decoder": "linear", "likelihood": "nb", "n_hidden": 128, "n_layers": 1}
RESTRICTION_SETTINGS = {
    "unrestricted": {},
    "laplace": {"prior": "laplace"},
    "horseshoe": {"loadings_prior": "horseshoe"},
}


def load_data(quick: bool):
    """The cells and genes every runner fits: 2,000 Kang cells, the 1,000 most variable genes and the markers."""
    import countvae as cv

    if quick:
        adata = cv.data.simulate(n_cells=300, n_genes=60, n_latent=3, n_batches=2, seed=0, loading_sparsity=0.5)
        adata.obs["batch"] = adata.obs["batch"].astype(str).astype("category")
        return adata, {"first": [f"gene{i}" for i in range(0, 12)], "second": [f"gene{i}" for i in range(12, 24)]}
    adata = cv.data.load_dataset("kang2018")
    adata = adata[np.sort(np.random.default_rng(0).choice(adata.n_obs, N_CELLS, replace=False))].copy()
    x = adata.X.tocsr()
    share = x.multiply(1.0 / np.asarray(x.sum(1))).tocsr()
    share.data = np.log1p(1e4 * share.data)
    mean = np.asarray(share.mean(0)).ravel()
    variance = np.asarray(share.multiply(share).mean(0)).ravel() - mean**2
    markers = {g for genes in PBMC_PROGRAMS.values() for g in genes}
    keep = set(adata.var_names[np.argsort(-variance)[:N_GENES]]) | markers
    adata = adata[:, [g for g in adata.var_names if g in keep]].copy()
    return adata, PBMC_PROGRAMS


def _fit_countvae(spec: dict, adata, programs) -> float:
    import countvae as cv

    cv.CountVAE.setup_anndata(adata, batch_key="batch")
    kwargs = dict(COUNTVAE_SETTINGS)
    if spec["runner"] == "programs":
        kwargs["gene_programs"] = programs
    else:
        kwargs.update(n_latent=spec["n_latent"], **RESTRICTION_SETTINGS[spec["runner"]])
    model = cv.CountVAE(adata, **kwargs)
    started = time.perf_counter()
    model.train(
        early_stopping=False,
        max_epochs=spec["epochs"],
        batch_size=128,
        lr=1e-3,
        train_size=0.9,
        seed=0,
        progress_bar=False,
    )
    return time.perf_counter() - started


def _fit_linearscvi(spec: dict, adata) -> float:
    import scvi

    for name in ("scvi", "lightning", "lightning.pytorch"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    scvi.settings.seed = 0
    scvi.model.LinearSCVI.setup_anndata(adata, batch_key="batch")
    model = scvi.model.LinearSCVI(
        adata, n_latent=spec["n_latent"], n_hidden=128, n_layers=1, gene_likelihood="nb", dispersion="gene"
    )
    started = time.perf_counter()
    model.train(
        max_epochs=spec["epochs"],
        batch_size=128,
        train_size=0.9,
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        plan_kwargs={"lr": 1e-3},
    )
    return time.perf_counter() - started


def worker(spec: dict) -> dict:
    """Fit one runner once; return its training seconds."""
    import torch

    torch.set_num_threads(1)
    adata, programs = load_data(spec["quick"])
    seconds = _fit_linearscvi(spec, adata) if spec["runner"] == "linearscvi" else _fit_countvae(spec, adata, programs)
    return {"runner": spec["runner"], "seconds": seconds, "epochs": spec["epochs"], "shape": list(adata.shape)}


def summarise(rows: list[dict]) -> pd.DataFrame:
    """Median seconds per epoch of each runner over repeats, and its ratio to the unrestricted model."""
    frame = pd.DataFrame(rows)
    frame["seconds_per_epoch"] = frame["seconds"] / frame["epochs"]
    table = frame.groupby("runner", sort=False)["seconds_per_epoch"].agg(["median", "min", "max", "count"])
    table.columns = ["s/epoch (median)", "s/epoch (min)", "s/epoch (max)", "repeats"]
    table["x unrestricted"] = table["s/epoch (median)"] / table.loc["unrestricted", "s/epoch (median)"]
    return table.reset_index().rename(columns={"runner": "model"})


def main(argv: list[str] | None = None) -> None:
    """Run every runner ``--repeats`` times, interleaved, and write the RESULTS.md section."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="small simulated data, 2 epochs, 1 repeat")
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    epochs, repeats = (2, 1) if args.quick else (args.epochs, args.repeats)
    started = time.perf_counter()
    load_before = load_average()
    rows = []
    for repeat in range(repeats):
        order = RUNNERS if repeat % 2 == 0 else RUNNERS[::-1]
        for runner in order:
            spec = {"runner": runner, "epochs": epochs, "quick": args.quick, "n_latent": 10, "threads": 1}
            # the smoke run fits in this process; timed runs each in a fresh one
            rows.append(worker(spec) if args.quick else run_worker(Path(__file__), spec))
            print(f"{runner} repeat {repeat}: {rows[-1]['seconds']:.1f} s", flush=True)
    table = summarise(rows)
    shape = rows[0]["shape"]
    data = "small simulated counts (QUICK smoke run)" if args.quick else f"kang2018, {N_CELLS} random cells"
    body = f"""## Fit time of restricted models, unrestricted model and LinearSCVI (`bench_restrictions.py`)

Command: `{command_line()}`

Data: {data}, {shape[0]} cells x {shape[1]} genes (the {N_GENES} most variable genes and the marker genes of
the programs), batch (donor) as a covariate. Every model: linear decoder, NB with gene-wise dispersion, 1 x 128 hidden
encoder, 10 latent dimensions (gene programs: one per program, {len(PBMC_PROGRAMS)}), Adam lr 1e-3, batch 128,
90% of cells trained on, {epochs} epochs; each fit in its own process on one thread, runners interleaved over
{repeats} repeat(s). Seconds per epoch = training wall time / epochs (validation included for both packages).

Machine: {machine_line(1)}; load average before {load_before}, after {load_average()} (a shared machine: the
ratios within this run are the comparison, not the absolute seconds). Total {time.perf_counter() - started:.0f} s.

{markdown_table(table, floatfmt="{:.3g}")}
"""
    write_section(args.results, SECTION, body)
    print(table.to_string())


if __name__ == "__main__":
    main()
