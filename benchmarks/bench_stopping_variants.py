"""The shared stopping rule against the former one, on model and data variants beyond ``--versus-full``.

The shared rule (:data:`countvae.model.training.DEFAULT_STOPPING`) trains at a learning rate of 1e-2 and, the
first time the validation loss stalls, goes back to its best epoch and cuts the rate to 1e-3; the former rule
trained at 1e-3 throughout and stopped at the first stall. ``bench_stopping.py --versus-full`` compares both with
the full 400-epoch schedule on the data sets of ``countvae diagnose``; this script asks whether the higher starting
rate is safe and no worse on what analysts also fit: other likelihoods, decoders and priors, 2 and 30 latent
dimensions, two hidden layers, small files (540 and 1,260 fit cells), deep sequencing, 10,000 cells and a
72-cell file. Each variant is fitted both ways from the same seed, split and initial parameters in one worker
process; held-out log p(x) per cell by the package's accurate estimator on the same held-out cells (paired), and
the epochs and seconds of each fit.

    python benchmarks/bench_stopping_variants.py                    # every variant (~15 min on 2 cores)
    python benchmarks/bench_stopping_variants.py --shard 0/2        # half of them (run 0/2 and 1/2 side by side)
    python benchmarks/bench_stopping_variants.py --reuse            # write the section from the stored results
"""

from __future__ import annotations

import argparse
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

#: (name, data, seed, model settings): data as in ``_data``; the model settings replace the defaults.
VARIANTS = (
    ("embedded", "embedded", 2, {}),
    ("embedded, linear decoder", "embedded", 0, {"decoder": "linear"}),
    ("embedded, Poisson", "embedded", 0, {"likelihood": "poisson"}),
    ("embedded, ZINB", "embedded", 0, {"likelihood": "zinb"}),
    ("embedded, linear, Laplace prior", "embedded", 0, {"decoder": "linear", "prior": "laplace"}),
    ("embedded, linear, horseshoe loadings", "embedded", 0, {"decoder": "linear", "loadings_prior": "horseshoe"}),
    ("embedded, 2-d", "embedded", 1, {"n_latent": 2}),
    ("600 simulated cells", "sim600", 0, {}),
    ("600 simulated cells", "sim600", 1, {}),
    ("600 simulated cells", "sim600", 2, {}),
    ("Kang, 1,400 cells, 500 genes", "kang1400", 0, {}),
    ("Kang, 1,400 cells, 500 genes", "kang1400", 1, {}),
    ("Kang, all cells", "kang", 0, {}),
    ("Kang, 3,000 cells, 30-d", "kang3000", 0, {"n_latent": 30}),
    ("pbmc_3tech, 2 hidden layers", "pbmc_3tech", 1, {"n_layers": 2}),
    ("pbmc_3tech, ZINB, 20-d", "pbmc_3tech", 0, {"likelihood": "zinb", "n_latent": 20}),
    ("simulated 3,000 cells, depth 20,000", "deep3000", 0, {}),
    ("simulated 10,000 cells", "sim10000", 0, {}),
    ("pbmc_small (80 cells)", "pbmc_small", 0, {}),
)
#: The former shared rule: 1e-3 throughout, stop at the first stall.
FORMER_RULE = (2, 10, 1e-3, 1e-3, 0)
#: Held-out cells scored per variant (fewer where fewer are held out).
LPD_CELLS = 150


# ----- worker side --------------------------------------------------------------------------------
def _data(name: str):
    """Cells and genes as ``countvae diagnose`` would fit them, and the default number of latent dimensions."""
    import countvae as cv
    from countvae.cli.diagnose import EMBEDDED_N_LATENT, default_data
    from countvae.data.gene_selection import choose_genes

    if name == "embedded":
        adata, n_latent, top = default_data(), EMBEDDED_N_LATENT, 2000
    elif name.startswith(("sim", "deep")):
        n_cells = int(name.removeprefix("sim").removeprefix("deep"))
        small = n_cells < 1000
        adata = cv.data.simulate(
            n_cells=n_cells,
            n_genes=300 if small else 2000,
            n_latent=3 if small else 10,
            n_batches=1 if small else 2,
            library_size=20_000.0 if name.startswith("deep") else 2000.0,
            seed=0,
        )
        n_latent, top = (3 if small else 10), 2000
    else:
        dataset = "kang2018" if name.startswith("kang") else name
        adata, n_latent = cv.data.load_dataset(dataset), 10
        n_cells = {"kang1400": 1400, "kang3000": 3000}.get(name)
        if n_cells:
            keep = np.sort(np.random.default_rng(0).choice(adata.n_obs, n_cells, replace=False))
            adata = adata[keep].copy()
        top = 500 if name == "kang1400" else 2000
    cv.CountVAE.setup_anndata(adata, batch_key="batch" if "batch" in adata.obs else None)
    return choose_genes(adata, None, top, n_latent).adata, n_latent


def worker(spec: dict) -> dict:
    """One variant: the shared rule and the former rule from the same seed, with held-out log p(x) of both."""
    import warnings

    import torch

    import countvae as cv
    from countvae.diagnostics.fitting.heldout import cells_at, heldout_split
    from countvae.errors import UnreliableEstimateWarning
    from countvae.model.training import DEFAULT_STOPPING, StoppingRule

    torch.set_num_threads(1)
    adata, n_latent = _data(spec["data"])
    fit_idx, held_idx = heldout_split(adata.n_obs, 0.1, 0)
    fit, held = cells_at(adata, fit_idx), cells_at(adata, held_idx)[:LPD_CELLS].copy()
    every, patience, delta, lr, cuts = FORMER_RULE
    rules = {
        "shared": DEFAULT_STOPPING.train_kwargs(),
        "former": StoppingRule(every, patience, delta, lr, cuts).train_kwargs(),
    }
    out = {**spec, "n_fit": int(fit.n_obs), "n_genes": int(fit.n_vars), "n_heldout": int(held.n_obs)}
    for name, kwargs in rules.items():
        model = cv.CountVAE(fit, **{"n_latent": n_latent, **spec["model"]})
        started = time.perf_counter()
        model.train(max_epochs=400, seed=spec["seed"], progress_bar=False, **kwargs)
        seconds = time.perf_counter() - started
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnreliableEstimateWarning)
            frame = model.get_log_predictive_density(held, seed=0)
        out[name] = {
            "seconds": seconds,
            "epochs": int(model.training_summary["epochs_trained"]),
            "kept": int(model.training_summary["kept_epoch"]),
            "lpd": frame["lpd"].tolist(),
            "unreliable": float(1.0 - frame["reliable"].mean()),
        }
    out["load"] = load_average()
    return out


# ----- driver -------------------------------------------------------------------------------------
def row(result: dict) -> dict:
    """One variant's line of the table."""
    shared, former = result["shared"], result["former"]
    diff = np.asarray(shared["lpd"]) - np.asarray(former["lpd"])
    return {
        "variant": result["name"],
        "seed": result["seed"],
        "cells fit x genes": f"{result['n_fit']} x {result['n_genes']}",
        "shared rule: stop / kept, s": f"{shared['epochs']} / {shared['kept']}, {shared['seconds']:.1f}",
        "former rule: stop / kept, s": f"{former['epochs']} / {former['kept']}, {former['seconds']:.1f}",
        "log p(x) shared": float(np.mean(shared["lpd"])),
        "log p(x) former": float(np.mean(former["lpd"])),
        "shared minus former (paired SE)": f"{diff.mean():+.2f} ({diff.std(ddof=1) / np.sqrt(diff.size):.2f})",
        "unreliable cells shared / former": f"{shared['unreliable']:.3f} / {former['unreliable']:.3f}",
    }


def body(results: list[dict], started: str, minutes: float) -> str:
    """The RESULTS.md section."""
    diffs = np.array([np.mean(np.asarray(r["shared"]["lpd"]) - np.asarray(r["former"]["lpd"])) for r in results])
    ses = np.array(
        [
            np.std(np.asarray(r["shared"]["lpd"]) - np.asarray(r["former"]["lpd"]), ddof=1)
            / np.sqrt(len(r["shared"]["lpd"]))
            for r in results
        ]
    )
    epochs = np.array([r["shared"]["epochs"] / r["former"]["epochs"] for r in results])
    seconds = sum(r["shared"]["seconds"] for r in results) / sum(r["former"]["seconds"] for r in results)
    loads = "; ".join(f"{r['name']} ({r['seed']}): {r['load']}" for r in results)
    return f"""## The shared stopping rule on model and data variants (`bench_stopping_variants.py`)

Command: `{command_line()}` ({started}; {minutes:.0f} min)

Machine: {machine_line(1)}. Load average (1/5/15 min) after each variant: {loads}.

Shared rule (`DEFAULT_STOPPING`): learning rate 1e-2, validation every 2 epochs, patience 10, relative delta 1e-3,
one cut of the rate to 1e-3 from the best epoch's parameters at the first stall, stop at the second. Former rule:
1e-3 throughout, stop at the first stall. Both allow 400 epochs and keep the best validation epoch; same seed,
split and initial parameters. Data as `countvae diagnose` fits it (the 2,000 most variable genes where there are
more; 500 on the 1,400-cell Kang file; 10% held out with split seed 0), the package's defaults otherwise (NB, MLP
decoder, 1 x 128, n_latent 10, 5 on the embedded data, 3 on the 600 simulated cells) with the variant's changes.
Held-out log p(x) per cell (nats, higher is better) on the first {LPD_CELLS} held-out cells (fewer where fewer),
by the package's accurate estimator (`get_log_predictive_density`, seed 0), paired over the same cells.

{markdown_table(pd.DataFrame([row(r) for r in results]))}

Shared minus former rule: {int((diffs - 2 * ses > 0).sum())} of {len(results)} variants better by more than two
paired standard errors, {int((diffs + 2 * ses < 0).sum())} worse by more than two, the rest within two (median
{np.median(diffs):+.2f} nats per cell, range {diffs.min():+.2f} to {diffs.max():+.2f}). Epochs, shared / former
rule: median {np.median(epochs):.2f} (range {epochs.min():.2f}-{epochs.max():.2f}); seconds of all fits together:
{seconds:.2f}x. No fit diverged.
"""


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--shard", default="0/1", help="i/n: fit every n-th variant from the i-th")
    parser.add_argument("--reuse", action="store_true", help="write the section from the stored results only")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR))
    parser.add_argument("--results", default=str(DEFAULT_RESULTS))
    parser.add_argument("--section", default="stopping-variants")
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    index, count = (int(v) for v in args.shard.split("/"))
    data_dir = Path(args.data_dir)
    started, t0 = time.strftime("%Y-%m-%d %H:%M"), time.perf_counter()
    if not args.reuse:
        done = []
        for k, (name, data, seed, model) in enumerate(VARIANTS):
            if k % count == index:
                done.append(run_worker(Path(__file__), {"name": name, "data": data, "seed": seed, "model": model}))
                data_dir.mkdir(parents=True, exist_ok=True)
                (data_dir / f"stopping_variants_{index}of{count}.json").write_text(json.dumps(done))  # one per shard
                print(row(done[-1]), flush=True)
    stored = {
        (r["name"], r["seed"]): r
        for path in sorted(data_dir.glob("stopping_variants_*.json"))
        for r in json.loads(path.read_text())
    }
    results = [stored[(name, seed)] for name, _, seed, _ in VARIANTS if (name, seed) in stored]
    if len(results) == len(VARIANTS):
        write_section(Path(args.results), args.section, body(results, started, (time.perf_counter() - t0) / 60))


if __name__ == "__main__":
    main()
