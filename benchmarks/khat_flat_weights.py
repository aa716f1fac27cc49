"""When k-hat alone misjudges: flat importance weights, against exact quadrature and simulated Pareto tails.

Two measurements of the rule in :attr:`countvae.module.importance.ImportanceSummary.reliable` (k-hat at most 0.7,
or flat weights: at least 200 draws, none above 2.5 times the mean):

* **(a) Pareto tails are never flat.** Weights of the proposal ``N(0, s^2)`` for the target ``N(0, 1)`` have a
  Pareto tail of shape ``k = 1 - s^2``; for k = 0.70, 0.80, 0.91 and 100 to 3,200 draws, the share of 20,000
  simulated cells whose largest weight is at most 2.5 (and 2) times the mean, and the smallest such ratio.
* **(b) Small models against exact quadrature.** Count VAEs with one or two latent dimensions on simulated counts,
  every other cell estimated by ``CountVAE.get_log_predictive_density`` (the default estimator, and the guide
  alone as a proposal: an estimator known to fail) with the rule and with k-hat alone (the flat rule switched off,
  everything else the same, so flagged cells are redrawn and estimated again as before), in the same run; each
  against grid quadrature of the model's own log joint. scvi-tools'
  ``get_marginal_ll`` reports no reliability per cell, so the peer here is the k-hat-only rule.

Run (about 5 minutes on 2 shared cores):
    PYTHONPATH=$PWD python benchmarks/khat_flat_weights.py
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
import warnings

import numpy as np
import pandas as pd
import torch
from _common import DEFAULT_RESULTS, command_line, load_average, machine_line, markdown_table, write_section

import countvae as cv
from countvae.module import importance

MODELS = [  # (likelihood, decoder, float type, n_latent, simulation seed)
    ("nb", "mlp", "float64", 1, 0),
    ("nb", "mlp", "float32", 1, 1),
    ("poisson", "mlp", "float32", 1, 2),
    ("zinb", "mlp", "float32", 1, 3),
    ("nb", "linear", "float32", 1, 4),
    ("nb", "mlp", "float32", 2, 5),
]


def pareto_tail_table(n_cells: int = 20_000) -> pd.DataFrame:
    """Share of cells with flat weights when the weights have a Pareto tail of known shape."""
    rows = []
    for s in (0.3, 0.45, 0.55):
        for n_draws in (100, 200, 1000, 3200):
            gen = torch.Generator().manual_seed(5)
            z = s * torch.randn((n_draws, n_cells), generator=gen, dtype=torch.float64)
            log_w = -0.5 * z**2 + 0.5 * (z / s) ** 2 + math.log(s)
            w = torch.exp(log_w - log_w.max(0).values)
            ratio = (w.max(0).values / w.mean(0)).numpy()
            rows.append(
                {
                    "k = 1 - s^2": round(1 - s * s, 2),
                    "draws": n_draws,
                    "share largest <= 2.5 x mean": float(np.mean(ratio <= 2.5)),
                    "share largest <= 2 x mean": float(np.mean(ratio <= 2.0)),
                    "smallest largest/mean": float(ratio.min()),
                }
            )
    return pd.DataFrame(rows)


def grid_log_marginal(model: cv.CountVAE, counts: np.ndarray, n_latent: int) -> np.ndarray:
    """Exact ``log p(x)`` per cell by the trapezoid rule on a grid over the latent space (one batch)."""
    module = model.module.eval()
    dtype = next(module.parameters()).dtype
    if n_latent == 1:
        axis = torch.linspace(-20.0, 20.0, 200_001, dtype=torch.float64)
        points, volume = axis[:, None], float(axis[1] - axis[0])
    else:
        axis = torch.linspace(-8.0, 8.0, 801, dtype=torch.float64)
        points = torch.cartesian_prod(axis, axis)
        volume = float(axis[1] - axis[0]) ** 2
    exact = []
    for row in counts:
        x = torch.as_tensor(row[None, :], dtype=dtype)
        with torch.no_grad():
            values = torch.cat(
                [
                    module.log_joint(chunk[:, None, :].to(dtype), x, torch.zeros(1, dtype=torch.long)).double()[:, 0]
                    for chunk in points.split(50_000)
                ]
            )
        exact.append(float(torch.logsumexp(values, 0)) + math.log(volume))
    return np.asarray(exact)


def model_rows() -> list[dict]:
    """Each small model's held-out estimates under both rules, against grid quadrature."""
    rows = []
    for likelihood, decoder, dtype, n_latent, seed in MODELS:
        adata = cv.data.simulate(
            n_cells=300, n_genes=40, n_latent=n_latent, likelihood="nb", decoder="linear", seed=seed
        )
        cv.CountVAE.setup_anndata(adata)
        model = cv.CountVAE(adata, n_latent=n_latent, likelihood=likelihood, decoder=decoder, n_hidden=16, dtype=dtype)
        model.train(seed=0, max_epochs=30, early_stopping=False, progress_bar=False)
        cells = np.arange(0, 300, 2)
        exact = grid_log_marginal(model, adata.X[cells].toarray(), n_latent)
        for method, rule in itertools.product(("mixture", "guide"), ("k-hat or flat weights", "k-hat alone")):
            saved = importance.FLAT_WEIGHT_RATIO
            importance.FLAT_WEIGHT_RATIO = saved if rule == "k-hat or flat weights" else 0.0
            try:
                start = time.perf_counter()
                frame = model.get_log_predictive_density(indices=cells, seed=0, method=method)
                seconds = time.perf_counter() - start
            finally:
                importance.FLAT_WEIGHT_RATIO = saved
            err = frame["lpd"].to_numpy() - exact
            above = frame["khat"].to_numpy() > importance.KHAT_THRESHOLD
            wrong = np.abs(err) > 0.1
            rows.append(
                {
                    "model": f"{likelihood}/{decoder}/{dtype}, n_latent {n_latent}",
                    "estimator": method,
                    "rule": rule,
                    "cells": len(cells),
                    "k-hat > 0.7": int(above.sum()),
                    "unreliable": int((~frame["reliable"]).sum()),
                    "max abs err, k-hat > 0.7": float(np.abs(err[above]).max()) if above.any() else float("nan"),
                    "mean abs err": float(np.abs(err).mean()),
                    "max abs err": float(np.abs(err).max()),
                    "within 3 SE": float(np.mean(np.abs(err) <= 3 * frame["mc_se"].to_numpy())),
                    "abs err > 0.1": int(wrong.sum()),
                    "of those, unreliable": int((wrong & ~frame["reliable"].to_numpy()).sum()),
                    "seconds": seconds,
                }
            )
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=str(DEFAULT_RESULTS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    start, load_start = time.perf_counter(), load_average()
    tails = pareto_tail_table()
    models = pd.DataFrame(model_rows())
    minutes = (time.perf_counter() - start) / 60
    body = f"""## Reliability of held-out log p(x) when the weights are flat (`khat_flat_weights.py`)

Command: `{command_line()}` ({minutes:.1f} min). Machine: {machine_line(1)}; load average {load_start} at the start,
{load_average()} at the end.

The rule: a cell's estimate is reliable when the Pareto k-hat of its importance weights is at most 0.7, or when its
weights are flat (at least {importance.FLAT_MIN_DRAWS} draws, none above {importance.FLAT_WEIGHT_RATIO:g} times the \
mean weight), where the generalized-Pareto fit is not valid.

### (a) Pareto tails are never flat

Weights of the proposal N(0, s^2) for the target N(0, 1) (a Pareto tail of shape k = 1 - s^2), 20,000 cells per row.

{markdown_table(tails, "{:.4g}")}

### (b) Small models against exact quadrature, both rules in the same run

Simulated counts (300 cells x 40 genes, `cv.data.simulate(..., decoder="linear")`), 30 epochs, 16 hidden units;
150 cells (every other) estimated by `get_log_predictive_density` (`method="mixture"`, the default, and
`method="guide"`, 1,000 draws from the amortized guide), against the trapezoid rule
on a grid of the model's log joint (200,001 points for one latent dimension, 801 x 801 on [-8, 8]^2 for two).
'within 3 SE' counts an unreliable cell (no SE) as outside; 'abs err > 0.1': cells more than 0.1 nats from
quadrature, and how many of them the rule marks unreliable. "k-hat alone" switches the flat rule off.

{markdown_table(models, "{:.4g}")}
"""
    write_section(args.results, "khat-flat-weights", body)


if __name__ == "__main__":
    main()
